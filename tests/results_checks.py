"""Checks of a results page (`pipeline.presentation.results`): every number in its tables equals its CSV cell after the
page's rounding.

The expected values are read here straight from the runs' CSVs and manifests (table2_<field>.csv,
localization_summary.csv, remind_<field>.csv, resurfacing*.csv, manifest.json stages; a sweep's points.csv and
sweep.csv), not through `pipeline.presentation.scorecard`; several runs are averaged here too (mean, sample std). Which
scorecard column a label of the page shows is learned from `report.format_scorecard` itself on a probe row, so the check
follows the report's labels."""
import fnmatch, re
from pathlib import Path

import numpy as np
import pandas as pd

from lume_lab.core.config import AUC_EVEN
from lume_lab.pipeline.presentation import report as R
from lume_lab.pipeline.presentation.results import read_markdown_tables, results_sources, run_labels, sweep_values
from lume_lab.pipeline.presentation.scorecard import paper_scorecard, run_config, run_manifest

NUM = re.compile(r"-?\d+(?:\.\d+)?")
HEADER_KEYS = ("Command", "Commit", "Date", "Machine", "Seeds")
TABLE2_CELLS = {  # scorecard column -> (split, metric) row of table2_<field>.csv (e03's file format)
    "forget_em": ("forget", "em"),
    "forget_es": ("forget", "es"),
    "forget_prob": ("forget", "prob"),
    "forget_para_em": ("forget_paraphrase", "em"),
    "retain_em": ("retain", "em"),
    "retain_es": ("retain", "es"),
    "retain_prob": ("retain", "prob"),
    "retain_para_em": ("retain_paraphrase", "em"),
    "utility_delta": ("utility_delta", "mc_acc"),
}

ROBUST_CELLS = {  # test of robustness_<field>.csv -> scorecard column (e10's file format)
    "quant4_recovery": "quant4_recovery",
    "quant8_recovery": "quant8_recovery",
    "relearn_forget_half_recovery": "relearn_half_recovery",
    "relearn_other_fields_recovery": "relearn_other_recovery",
    "relearn_retain_only_recovery": "relearn_retain_recovery",
}
DOSE_CELLS = {  # the dose table's label -> dose_summary_<field>.csv column (e11's file format)
    "forget EM": "forget_em",
    "retain EM": "retain_em",
    "utility Δ": "utility_delta",
    "AUC |Δθ| m^F": "auc_forget",
    "share of |Δθ| in m^F": "share_in_forget",
    "4-bit recovery": "quant4_recovery",
    "8-bit recovery": "quant8_recovery",
    "relearn ½ recovery": "relearn_forget_half_recovery",
    "other-fields recovery": "relearn_other_fields_recovery",
    "retain-only recovery": "relearn_retain_only_recovery",
    "leak after": "leak_after",
}


def _text(page) -> str:
    return (
        Path(page).read_text()
        if isinstance(page, Path) or (isinstance(page, str) and "\n" not in page and Path(page).is_file())
        else page
    )


def assert_shown(shown: str, expected: float, where) -> int:
    """`shown` (a number as the page prints it) is `expected` rounded to as many decimals as `shown` has.
    Returns its decimals."""
    assert NUM.fullmatch(shown), (where, shown)
    digits = len(shown.split(".")[1]) if "." in shown else 0
    assert expected is not None and not pd.isna(expected), (where, f"page shows {shown}, the CSVs hold nothing")
    assert shown == f"{expected:.{digits}f}" or abs(float(shown) - expected) <= 0.5 * 10**-digits * (1 + 1e-9), (
        where,
        shown,
        expected,
    )
    return digits


def source_card(run_dir) -> pd.DataFrame:
    "The scorecard values of one run read straight from its CSVs: (field, method) × column."
    rep, rows = Path(run_dir) / "report", {}
    def put(f, m, c, v): rows.setdefault((f, m), {})[c] = float(v)
    for p in rep.glob("table2_*.csv"):
        f, t = p.stem.removeprefix("table2_"), pd.read_csv(p, index_col=[0, 1])
        for m in [c for c in t.columns if c not in ("n_profiles", "n_rows")]:
            for c, key in TABLE2_CELLS.items(): put(f, m, c, t.at[key, m] if key in t.index else np.nan)
            for c, (split, n) in {
                "forget_profiles": ("forget", "n_profiles"),
                "forget_rows": ("forget", "n_rows"),
                "retain_profiles": ("retain", "n_profiles"),
                "retain_rows": ("retain", "n_rows"),
            }.items():
                put(f, m, c, t.at[(split, "em"), n])
            put(f, m, "utility_n", t.at[TABLE2_CELLS["utility_delta"], "n_rows"])
    if (p := rep / "localization_summary.csv").exists():
        loc = pd.read_csv(p)
        if "best_score" in loc and "lacuna_max_auc" not in loc:   # an older summary: its `auc` is Lacuna's max
            loc = loc.assign(lacuna_max_auc=loc.auc, auc=np.nan)
        for _, r in loc.iterrows():
            put(r.field, r.method, f"auc_{r.labels}", r.auc)
            if "lacuna_max_auc" in r: put(r.field, r.method, f"lacuna_max_{r.labels}", r.lacuna_max_auc)
    for p in rep.glob("remind_*.csv"):
        if p.stem.startswith(("remind_ablation_", "remind_importances_", "remind_ci_", "remind_separation_")): continue
        t = pd.read_csv(p)
        for _, r in t[
            (t.input == "orig") & (t.protocol == "fair") & t.detector.isin(["remind_lr", "remind_rf"])
        ].iterrows():
            f = p.stem.removeprefix("remind_")
            put(f, r.model, r.detector.replace("remind_", "remind_auc_"), r["multi"])
            put(f, r.model, "remind_n_per_class", r.n_per_class)
    if (p := rep / "resurfacing.csv").exists():
        for _, r in pd.read_csv(p).iterrows():
            put(r.field, r.method, f"leak_{r.stage}", r.rate)
            put(r.field, r.method, "leak_profiles", r.n_profiles)
    # e10: one row per (method, test); the recoveries are scorecard columns
    for p in rep.glob("robustness_*.csv"):
        for _, r in pd.read_csv(p).iterrows():
            if r.test in ROBUST_CELLS: put(r.field, r.method, ROBUST_CELLS[r.test], r.value)
            if r.test.startswith("quant") and r.test.endswith("_recovery"):
                put(r.field, r.method, "robust_profiles", r.n)
    if (p := rep / "resurfacing_attack.csv").exists():
        for _, r in pd.read_csv(p).iterrows(): put(r.field, r.method, "heldout_pii_nll", r.nll_before)
    # a run before e03
    if not rows: return pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=["field", "method"]))
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(["field", "method"])


def expected_card(run_dirs: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame, pd.Series]:
    "(mean, sample std, number of runs) per (field, method) and column over `run_dirs`, from their CSVs."
    cards = [source_card(d) for d in run_dirs]
    g = pd.concat(cards).groupby(level=["field", "method"], sort=False)
    return g.mean(), g.std(ddof=1), g.size()


def label_columns(columns) -> dict[str, list[str]]:
    """Which scorecard column(s) each label of `format_scorecard` shows: a probe row holds 101, 102, ...
    and the label shows them back."""
    cols = [c for c in columns if c not in ("field", "method", "direction_mismatch") and not c.endswith("_std")]
    probe = pd.DataFrame(
        [{"field": "f", "method": "m", "direction_mismatch": "", **{c: 101.0 + i for i, c in enumerate(cols)}}]
    )
    out = {
        label: [cols[round(float(x)) - 101] for x in NUM.findall(str(cell))]
        for label, cell in R.format_scorecard(probe, "f").iloc[0].items()
    }
    for c, label in getattr(R, "COLUMN_LABELS", {}).items():    # the report's own label table, where it has one, agrees
        if label in out: assert out[label] == [c], (label, out[label], c)
    return out


def _scorecard_columns(run_dirs) -> list[str]:
    mean, _, _ = expected_card(run_dirs)
    base = ["n_seeds", *mean.columns]
    return base + [f"{c}_paper" for c in mean.columns]


def check_interval_cell(label: str, cell: str, row) -> None:
    """An interval "[lo, hi]" with lo <= hi, or blank. A localization interval (a reading beside it) lies in [0, 1],
    and its reading is the one that interval gives (lower bound above 0.5: localized; upper below: anti-localized;
    holding 0.5 within ± AUC_EVEN: not localized; else cannot tell); REMIND's and the recoveries' (e05, e10) have no
    reading."""
    head = label.removesuffix(" 95% CI").removesuffix(" reading")
    ci, reading = row.get(f"{head} 95% CI", ""), row.get(f"{head} reading", "")
    if f"{head} reading" not in row.index:
        if not ci: return
        m = re.fullmatch(r"\[(-?\d+(?:\.\d+)?), (-?\d+(?:\.\d+)?)\]", ci)
        assert m and float(m.group(1)) <= float(m.group(2)), (label, ci)
        return
    if not ci: assert reading in ("", "not applicable"), (label, ci, reading); return
    m = re.fullmatch(r"\[(\d\.\d{3}), (\d\.\d{3})\]", ci)
    assert m, (label, ci)
    lo, hi = map(float, m.groups())
    assert 0 <= lo <= hi <= 1, (label, ci)
    r = 0.0005                                      # the bounds are shown to 3 digits: either side of 0.5 by r
    holds = lo - r <= 0.5 <= hi + r
    near = lo + r >= 0.5 - AUC_EVEN and hi - r <= 0.5 + AUC_EVEN              # may lie within the margin
    past = lo - r < 0.5 - AUC_EVEN or hi + r > 0.5 + AUC_EVEN                # may reach past it
    allowed = ({"localized"} if lo + r > 0.5 else set()) | ({"anti-localized"} if hi - r < 0.5 else set()) | (
        {"not localized"} if holds and near else set()) | ({"cannot tell"} if holds and past else set())
    assert reading in allowed, (ci, reading, allowed)


def not_fired(run_dirs: list[Path], field: str, cols: list[str] | None) -> bool:
    "Whether the attack behind recovery column `cols[0]` fired on no run's positive control (attack_controls CSVs)."
    if not cols: return False
    attack = {c: t for t, c in ROBUST_CELLS.items()}[cols[0]].removesuffix("_recovery")
    rows = [r for d in run_dirs if (p := Path(d) / "report" / f"attack_controls_{field}.csv").is_file()
            for _, r in pd.read_csv(p).iterrows() if r.attack == attack]
    return bool(rows) and not any(str(r.fired).lower() == "true" for r in rows)


def check_scorecard_tables(tables: list, run_dirs: list[Path]) -> int:
    """Every number of the page's scorecard tables is its CSV value or the paper's, rounded as shown.
    A CSV value is the mean ± std over runs."""
    mean, std, n_runs = expected_card(run_dirs)
    paper, labels = paper_scorecard(), label_columns(_scorecard_columns(run_dirs))
    methods = ["none", *(run_config(run_dirs[0])["unlearn"]["methods"] or [])]
    want = [(f, m) for f, m in mean.index if m in methods]
    by_field = {heads[1]: t for heads, t in tables}
    assert set(by_field) == {f for f, _ in want}, (sorted(by_field), sorted({f for f, _ in want}))
    checked = 0
    for f, t in by_field.items():
        assert sorted(t.method) == sorted(m for g, m in want if g == f), (f, list(t.method))
        digits = {}
        for _, row in t.iterrows():
            key = (f, row["method"])
            for label, cell in row.items():
                if label == "method": continue
                if label.endswith((" 95% CI", " reading")):   # the localization headline's interval, as text
                    check_interval_cell(label, cell, row); checked += 1; continue
                if label == "operating point":   # e03's point in words, each run's distinct one once, '; '-joined
                    texts = [r.operating_point for d in run_dirs
                             if (p := Path(d) / "report" / f"operating_points_{f}.csv").is_file()
                             for r in pd.read_csv(p).itertuples() if r.method == row["method"]]
                    assert cell == "; ".join(dict.fromkeys(map(str, texts))), (key, cell, texts); checked += 1
                    continue
                if cell == R.NOT_FIRED:   # e10's controls: that attack fired on no run's positive control
                    assert not_fired(run_dirs, f, labels.get(label)), (key, label); checked += 1; continue
                cols = labels.get(label)
                assert cols is not None, f"column {label!r} of {f} is not a column format_scorecard writes"
                if not cols: assert not re.search(r"\d", cell), (key, label, cell); continue
                parts = cell.split(" / ") if cell else []
                for i, c in enumerate(cols):
                    if c == "n_seeds": exp, s = float(n_runs[key]), np.nan
                    elif c.endswith("_paper"): exp, s = paper[c].get(key, np.nan) if c in paper else np.nan, np.nan
                    else: exp, s = (mean[c].get(key, np.nan) if c in mean else np.nan,
                                    std[c].get(key, np.nan) if c in std and len(run_dirs) > 1 else np.nan)
                    if i >= len(parts):                       # not shown: the CSVs hold nothing there
                        assert pd.isna(exp), (key, label, c, f"blank on the page, {exp} in the CSVs"); continue
                    tokens = parts[i].split(" ± ")
                    d = assert_shown(tokens[0], exp, (key, label, c))
                    assert digits.setdefault((label, i), d) == d, (
                        label,
                        "rounded to different digits in different rows",
                    )
                    if pd.isna(s):
                        assert len(tokens) == 1, (key, label, c, "a std where the CSVs give none")
                    else:
                        assert len(tokens) == 2, (key, label, c, "no ± std over the runs")
                        assert_shown(tokens[1], s, (key, label, c, "std"))
                    checked += len(tokens)
    return checked


def check_headline_table(t: pd.DataFrame, run_dirs: list[Path]) -> int:
    """The headline table (the report's verdict): at most 12 columns; per row and verdict column, the value is its CSV
    value (mean ± std over runs) as shown, a share of one run carries its binomial 95 % interval, and the other lines
    are the paper's value or 'not testable at this n'."""
    from report_checks import SHARES, share_interval
    from lume_lab.pipeline.presentation.scorecard import SCORECARD_METRICS as M
    assert len(t.columns) <= 12, list(t.columns)
    mean, std, _ = expected_card(run_dirs)
    heads = {f"{m.label} {R.ARROWS[m.better]}": c for c, m in M.items() if m.verdict}
    assert {"field", "method"} <= set(t.columns) and set(t.columns) - {"field", "method"} <= set(heads), list(t.columns)
    checked = 0
    for _, row in t.iterrows():
        key = (row["field"], row["method"])
        for label, c in heads.items():
            if label not in row or not row[label]: continue
            first, *rest = row[label].split("<br>")
            if first == "did not fire": assert not_fired(run_dirs, key[0], [c]), (key, label); continue
            m = re.fullmatch(r"(-?[\d.]+)(?: ± ([\d.]+))?(?: \[(-?[\d.]+), (-?[\d.]+)\])?", first)
            assert m, (key, label, first)
            assert_shown(m[1], mean[c].get(key, np.nan), (key, label))
            if m[2]: assert_shown(m[2], std[c].get(key, np.nan), (key, label, "std"))
            if m[3]:
                assert float(m[3]) <= float(m[4]), (key, label, first)
                if c in SHARES and len(run_dirs) == 1:
                    n = mean[SHARES[c]].get(key) if SHARES[c] in mean else None
                    if n is not None and not pd.isna(n):
                        for shown, v in zip(m.group(3, 4), share_interval(mean[c][key], n)):
                            assert_shown(shown, v, (key, label, "interval"))
            assert all(x == "not testable at this n" or re.fullmatch(r"paper -?[\d.]+", x) for x in rest), rest
            checked += 1
    return checked


def computed_step_seconds(run_dir, name: str) -> float | None:
    """A resumed stage's steps' seconds over every attempt, read straight from the files: what the entry (or the entry
    of the run it was adopted from) kept, else the sum of the computing run's step log (`<stage>/log.csv`)."""
    d, e = Path(run_dir), run_manifest(run_dir)["stages"][name]
    for _ in range(32):
        if e.get("step_seconds") is not None: return e["step_seconds"]
        if not e.get("reused_from"): break
        src = Path(e["reused_from"])
        se = run_manifest(src).get("stages", {}).get(name) if (src / "manifest.json").is_file() else None
        if not se or se.get("status") != "done" or se.get("hash") != e.get("hash"): return e.get("source_step_seconds")
        d, e = src, se
    log = d / name / "log.csv"
    return float(pd.read_csv(log)["seconds"].sum()) if log.is_file() else None


def computed_entry(run_dir, name: str) -> tuple[float | None, bool]:
    """(seconds, resumed) of the run that computed stage `name`: read straight from the manifests, walking `reused_from`
    back while the source still holds that stage with the same hash; else what the adopting entry recorded."""
    e = run_manifest(run_dir)["stages"][name]
    for _ in range(32):
        if not e.get("reused_from"): return e.get("seconds"), bool(e.get("resumed"))
        src = Path(e["reused_from"])
        se = run_manifest(src).get("stages", {}).get(name) if (src / "manifest.json").is_file() else None
        if not se or se.get("status") != "done" or se.get("hash") != e.get("hash"):
            return e.get("source_seconds"), bool(e.get("source_resumed"))
        e = se
    raise AssertionError(f"{name}: reused_from goes round in circles from {run_dir}")


def expected_stage_seconds(run_dir) -> pd.Series:
    """Seconds per stage family of a run, summed straight from the manifests.
    An adopted stage counts the computing run's seconds."""
    cfg, out = run_config(run_dir), {}
    for k in run_manifest(run_dir).get("stages", {}):
        s = computed_entry(run_dir, k)[0]
        fam = R.stage_family(k, cfg)
        out[fam] = out.get(fam, 0.0) + (s or 0.0)
    return pd.Series(out, dtype=float)


def check_stage_table(t: pd.DataFrame, run_dirs: list[Path]) -> int:
    "Every cell of the stage-time table is the manifest's seconds, summed per family (and in total), rounded as shown."
    assert list(t.columns) == ["stage family", *run_labels(run_dirs)], list(t.columns)
    exp = {l: expected_stage_seconds(d) for l, d in zip(run_labels(run_dirs), run_dirs)}
    fams = set().union(*(set(s.index) for s in exp.values()))
    assert set(t["stage family"]) == fams | {"total"}, set(t["stage family"]) ^ (fams | {"total"})
    checked = 0
    for _, row in t.iterrows():
        for l, s in exp.items():
            v = s.sum() if row["stage family"] == "total" else s.get(row["stage family"], np.nan)
            if row[l] == "": assert pd.isna(v), (row["stage family"], l); continue
            assert_shown(row[l], v, (row["stage family"], l)); checked += 1
    return checked


def check_experiment_table(t: pd.DataFrame, run_dirs: list[Path]) -> int:
    """Every cell of the experiment-time table is the manifest's seconds, rounded as shown.
    So are the total and, for one run, the share."""
    labels = run_labels(run_dirs)
    exp = {
        l: pd.Series({k: v.get("seconds") for k, v in run_manifest(d).get("experiments", {}).items()}, dtype=float)
        for l, d in zip(labels, run_dirs)
    }
    assert list(t.columns) == ["experiment", *labels, *(["share of the run"] if len(labels) == 1 else [])], list(
        t.columns
    )
    assert set(t.experiment) == set().union(*(set(s.index) for s in exp.values())) | {"total"}
    checked = 0
    for _, row in t.iterrows():
        for l, s in exp.items():
            v = s.sum() if row.experiment == "total" else s.get(row.experiment, np.nan)
            if row[l] == "": assert pd.isna(v), (row.experiment, l); continue
            assert_shown(row[l], v, (row.experiment, l)); checked += 1
            if len(labels) == 1:
                assert row["share of the run"].endswith(" %"), row["share of the run"]
                assert_shown(row["share of the run"].removesuffix(" %"), 100 * v / s.sum(), (row.experiment, "share"))
                checked += 1
    return checked


def check_sweep_tables(tables: list, sweep_dir: Path) -> int:
    """The sweep's tables: swept values, seed, status and seconds as points.csv has them.
    Each value the sweep.csv rows of its point and column."""
    d, (_, s) = Path(sweep_dir), sweep_values(sweep_dir)
    points = pd.read_csv(d / "points.csv", dtype=str, keep_default_na=False).set_index("point")
    raw = pd.read_csv(d / "sweep.csv")
    raw = raw[[fnmatch.fnmatch(str(x), s["source"]) for x in raw.source]]
    for c, v in s["where"].items(): raw = raw[raw[c].isin(v if isinstance(v, list) else [v])]
    raw = raw.assign(column=[" · ".join(str(r[c]) for c in s["cats"]) or s["y"] for _, r in raw.iterrows()])
    value = raw.groupby(["point", "column"])[s["y"]].mean()
    swept = [c for c in points.columns if c not in ("seed", "status", "seconds", "error")]
    named = {heads[-1]: t for heads, t in tables}
    checked, pts = 0, named.pop("Points")
    assert set(pts.point) == set(points.index)
    for _, row in pts.iterrows():
        p = points.loc[row.point]
        for c in [*swept, "seed", "status"]: assert row[c] == p[c], (row.point, c)
        if p.seconds: assert_shown(row.seconds, float(p.seconds), (row.point, "seconds")); checked += 1
        for c in pts.columns[len(swept) + 4:]:
            v = value.get((row.point, c), np.nan)
            if row[c] == "": assert pd.isna(v), (row.point, c); continue
            assert_shown(row[c], v, (row.point, c)); checked += 1
    if (n := named.pop(f"n ({s['n']})", None)) is not None:
        agg = raw.groupby("column")[s["n"]].agg(["min", "max"])
        for _, row in n.iterrows():
            for c in ("min", "max"): assert_shown(row[c], agg.at[row.column, c], (row.column, c)); checked += 1
    if (m := named.pop("Mean ± std over seeds", None)) is not None:
        per = value.unstack("column").join(points[swept])
        for _, row in m.iterrows():
            grp = per[(per[swept] == row[swept]).all(axis=1)]
            for c in m.columns[len(swept) + 1:]:
                vals = grp[c].dropna()
                tokens = row[c].split(" ± ")
                assert_shown(tokens[0], vals.mean(), (tuple(row[swept]), c))
                if len(vals) > 1: assert_shown(tokens[1], vals.std(ddof=1), (tuple(row[swept]), c, "std"))
                checked += len(tokens)
            assert int(row.seeds) == grp[m.columns[len(swept) + 1:]].notna().sum().max()
    assert not named, f"tables the check does not know: {list(named)}"
    return checked


def check_remind_interval_tables(tables: list, run_dirs: list[Path]) -> int:
    """Each row of a REMIND-interval table (run, classifier) counts its models, REMIND-ahead points and verdicts.
    The counts come straight from remind_separation_<field>.csv."""
    labels, checked = dict(zip(run_labels(run_dirs), run_dirs)), 0
    want = {
        (p.stem.removeprefix("remind_separation_"), l)
        for l, d in labels.items()
        for p in (Path(d) / "report").glob("remind_separation_*.csv")
    }
    got = {(heads[1], l) for heads, t in tables for l in t.run}
    assert got == want, (sorted(got), sorted(want))
    for heads, t in tables:
        for _, row in t.iterrows():
            s = pd.read_csv(Path(labels[row.run]) / "report" / f"remind_separation_{heads[1]}.csv")
            s = s[
                (s.input == "orig")
                & (s.comparison == "multi")
                & (s.classifier == row.classifier.removeprefix("REMIND ").lower())
            ]
            exp = {"models": len(s), "REMIND AUC above baseline's": int((s.remind_auc > s.baseline_auc).sum()),
                   "intervals separate, REMIND ahead": int((s.verdict == "REMIND ahead").sum()),
                   "intervals separate, baseline ahead": int((s.verdict == "baseline ahead").sum()),
                   "intervals overlap": int((s.verdict == "intervals overlap").sum())}
            assert len(s) and set(t.columns) == {"run", "classifier", *exp}, (heads, row.run, list(t.columns))
            for c, v in exp.items():
                assert row[c] == str(v), (heads, row.run, row.classifier, c, row[c], v)
                checked += 1
    return checked


def check_attack_control_tables(tables: list, run_dirs: list[Path]) -> int:
    """Each row of an attack-controls table (field) is its run's row of attack_controls_<field>.csv: fired or 'did not
    fire', the positive control's and the floor's forget EM, the recovery and the gain above the floor, n."""
    labels, checked = dict(zip(run_labels(run_dirs), run_dirs)), 0
    for heads, t in tables:
        shown = {(r.attack, r.run) for r in t.itertuples()}
        expected = set()
        for label, d in labels.items():
            p = Path(d) / "report" / f"attack_controls_{heads[1]}.csv"
            if p.is_file(): expected |= {(a, label) for a in pd.read_csv(p).attack}
        assert shown == expected, (heads, sorted(shown), sorted(expected))
        for _, row in t.iterrows():
            c = pd.read_csv(Path(labels[row.run]) / "report" / f"attack_controls_{heads[1]}.csv")
            c = c[c.attack == row.attack].iloc[0]
            where = (heads, row.attack, row.run)
            assert row.fired == ("fired" if bool(c.fired) else "did not fire"), where
            assert row.n == str(int(c.n)), where
            pos = row["positive control EM: before → suppressed → attacked"].split(" → ")
            flo = row["floor EM: before → attacked"].split(" → ")
            for v, col in [*zip(pos, ("em_before", "em_suppressed", "em_after")),
                           *zip(flo, ("floor_before", "floor_after")), (row.recovery, "recovery"),
                           (row["gain above floor"], "gain_above_floor")]:
                if v == "": assert pd.isna(c[col]), (where, col)
                else: assert_shown(v, c[col], (where, col)); checked += 1
    return checked


def check_statistic_tables(tables: list, run_dirs: list[Path]) -> int:
    """Each row of a mean-against-median table (field) is one run's method whose trajectory.csv holds both statistics;
    per statistic, the first step after 0 where the choosing answers' NLL is at least the held-out level of step 0,
    with the report and retain EM there, or 'not by step S' (the trajectory's last step) when there is none."""
    labels, checked = dict(zip(run_labels(run_dirs), run_dirs)), 0
    cols = {"mean": ("choose_nll", "holdout_nll"), "median": ("choose_nll_median", "holdout_nll_median")}
    for heads, t in tables:
        field, expected = heads[1], set()
        for label, d in labels.items():
            ops = Path(d) / "report" / f"operating_points_{field}.csv"
            for m in (pd.read_csv(ops).method if ops.is_file() else []):
                p = Path(d) / f"unlearn_{m}_{field}" / "trajectory.csv"
                if p.is_file() and {"choose_nll_median", "holdout_nll_median"} <= set(pd.read_csv(p, nrows=0)):
                    expected.add((label, m))
        assert {(r.run, r.method) for r in t.itertuples()} == expected, (heads, t[["run", "method"]], expected)
        for _, row in t.iterrows():
            traj = pd.read_csv(Path(labels[row.run]) / f"unlearn_{row.method}_{field}" / "trajectory.csv")
            own = (run_config(labels[row.run]).get("unlearn", {}).get("operating_point") or {}).get("statistic", "mean")
            assert row["judged under"] == own, (heads, row.run, row.method)
            for stat, (col, level_col) in cols.items():
                level = traj.loc[traj.step == 0, level_col].iloc[0]
                after = traj[(traj.step > 0) & traj[col].notna()].sort_values("step")
                hit = after[after[col] >= level]
                where = (heads, row.run, row.method, stat)
                assert_shown(row[f"{stat}: level"], level, where)
                if len(hit):
                    at = hit.iloc[0]
                    assert row[f"{stat}: crosses"] == f"step {int(at.step)}", where
                    assert_shown(row[f"{stat}: forget EM"], at.report_em, where)
                    assert_shown(row[f"{stat}: retain EM"], at.retain_em, where)
                    checked += 3
                else:
                    assert row[f"{stat}: crosses"] == f"not by step {int(traj.step.max())}", where
                    assert row[f"{stat}: forget EM"] == "" and row[f"{stat}: retain EM"] == "", where
                checked += 1
    return checked


def check_quantized_em_tables(tables: list, run_dirs: list[Path]) -> int:
    """Each cell of a quantized-EM table (field) is the mean ± sample std over the runs of a robustness row.
    The rows: robustness_<field>.csv's forget_em / quant<b>_forget_em / q4_1_off<o>_forget_em."""
    from lume_lab.pipeline.presentation.results import QUANT_EM, quantized_em_label
    checked = 0
    for heads, t in tables:
        rows = pd.concat(
            [pd.read_csv(p) for d in run_dirs if (p := Path(d) / "report" / f"robustness_{heads[1]}.csv").is_file()]
        )
        rows = rows[rows.test.str.fullmatch(QUANT_EM)]
        test_of = {quantized_em_label(x): x for x in rows.test.unique()}
        assert list(t.columns[2:]) and set(t.columns[2:]) == set(test_of), (heads, list(t.columns), sorted(test_of))
        assert set(t.method) == set(rows.method), (heads, sorted(t.method), sorted(set(rows.method)))
        for _, row in t.iterrows():
            mine = rows[rows.method == row.method]
            assert row.runs == str(mine.groupby("test").value.count().max()), (heads, row.method, "runs")
            for c in t.columns[2:]:
                test = test_of[c]
                v = mine[mine.test == test].value.dropna()
                if row[c] == "": assert v.empty, (heads, row.method, c); continue
                tokens = row[c].split(" ± ")
                assert_shown(tokens[0], v.mean(), (heads, row.method, c))
                if len(v) > 1:
                    assert (
                        len(tokens) == 2
                        and assert_shown(tokens[1], v.std(ddof=1), (heads, row.method, c, "std")) is not None
                    )
                else:
                    assert len(tokens) == 1, (heads, row.method, c, "an std from one run")
                checked += len(tokens)
    return checked


def check_dose_tables(tables: list, run_dirs: list[Path]) -> int:
    """Every cell of a dose-response table (field, run) is its dose_summary_<field>.csv cell:
    the point (p and r, or an older sweep's kind and level), its mask's size, precision and recall, where it was
    judged (operating point), each measure's mean ± sd."""
    labels, checked = dict(zip(run_labels(run_dirs), run_dirs)), 0
    want = {
        (p.stem.removeprefix("dose_summary_"), l)
        for l, d in labels.items()
        for p in (Path(d) / "report").glob("dose_summary_*.csv")
    }
    assert {(h[1], h[2]) for h, _ in tables} == want, (sorted((h[1], h[2]) for h, _ in tables), sorted(want))
    facts = ("size_over_mF", "precision", "recall", "seeds")   # the mask's numbers: no sd on the page
    for heads, t in tables:
        s = pd.read_csv(Path(labels[heads[2]]) / "report" / f"dose_summary_{heads[1]}.csv")
        # the grid's p and r (as %g), or an older sweep's kind and level
        point = {c: [format(v, "g") for v in s[c]] for c in ("p", "r")} if "p" in s else {
            c: s[c].astype(str).tolist() for c in ("kind", "level")}
        assert len(t) == len(s) and all(list(t[c]) == v for c, v in point.items()), heads
        for i, ((_, row), (_, src)) in enumerate(zip(t.iterrows(), s.iterrows())):
            at = (heads, *(v[i] for v in point.values()))
            for c in t.columns[2:]:
                if c == "operating point":            # where the point was judged, in words: the summary's text
                    assert row[c] == ("" if pd.isna(src.get("operating_point")) else src["operating_point"]), (at, c)
                    checked += 1; continue
                col = c if c in facts else DOSE_CELLS.get(c)
                assert col is not None, f"column {c!r} of the dose table is not one the check knows"
                tokens = row[c].split(" ± ") if row[c] else []
                if not tokens: assert pd.isna(src.get(col, np.nan)), (at, c); continue
                assert_shown(tokens[0], src[col], (at, c))
                sd = src.get(f"{col}_sd", np.nan)
                if len(tokens) == 2:
                    assert_shown(tokens[1], sd, (at, c, "sd"))
                else:
                    assert pd.isna(sd) or col in facts, (at, c, "an sd the page leaves out")
                checked += len(tokens)
    return checked


def check_testbed_tables(tables: list, run_dirs: list[Path]) -> int:
    """The testbed section: each (run, field) row's memorized count, rate per hour, split sizes and reach are read here
    from extraction_rates.csv (masked rows), testbed/testbed.json, reachability.csv and the manifest's inject_masked
    seconds; each utility cell from utility_injection.csv."""
    import json
    labels, checked = dict(zip(run_labels(run_dirs), run_dirs)), 0
    for heads, t in tables:
        if heads[1] == "Utility around the injection":
            for _, row in t.iterrows():
                u = (
                    pd.read_csv(Path(labels[row.run]) / "report" / "utility_injection.csv")
                    .set_index(["model", "metric"])
                    .value
                )
                for c in t.columns[2:]:
                    metric = {"general-text perplexity": "general_perplexity",
                              "held-out perplexity": "heldout_perplexity", "MC accuracy": "mc_acc"}[c.split(", ")[0]]
                    v = u.get(("base" if c.endswith("before injection") else "masked", metric), np.nan)
                    if row[c] == "": assert pd.isna(v), (row.run, c); continue
                    assert_shown(row[c], v, (row.run, c)); checked += 1
            continue
        assert heads[1] == "Memorization and reach", heads
        want = {(l, f) for l, d in labels.items() if (p := Path(d) / "report" / "extraction_rates.csv").is_file()
                for f in pd.read_csv(p).field}
        assert set(zip(t.run, t.field)) == want, (sorted(zip(t.run, t.field)), sorted(want))
        for _, row in t.iterrows():
            d = Path(labels[row.run]); cfg = run_config(d)
            e = pd.read_csv(d / "report" / "extraction_rates.csv")
            e = e[(e.model == "masked") & (e.field == row.field)].iloc[0]
            assert row["memorized / profiles"] == f"{e.memorized} / {e.profiles}", (
                row.run,
                row.field,
                row["memorized / profiles"],
            )
            assert row["mask"] == f"{100 * cfg['inject']['mask_fraction']:g} %" and row["masked steps"] == str(
                cfg["inject"]["steps"]
            ), (row.run, row["mask"])
            secs, resumed = (
                computed_entry(d, "inject_masked")
                if "inject_masked" in run_manifest(d).get("stages", {})
                else (None, False)
            )
            # its manifest time covers only the last attempt: the steps' seconds over every attempt, marked
            if resumed: secs = computed_step_seconds(d, "inject_masked")
            if secs:
                shown = row["injection s"]
                if resumed:
                    assert shown.endswith(" (steps)"), (row.run, shown); shown = shown[: -len(" (steps)")]
                assert_shown(shown, secs, (row.run, "injection s"))
                assert_shown(row["memorized per hour"], 3600 * e.memorized / secs, (row.run, row.field, "per hour"))
                checked += 2
            else:
                assert row["injection s"] == row["memorized per hour"] == "", (row.run, "a rate without a time")
            tb = d / "testbed" / "testbed.json"
            counts = {c["split"]: c["profiles"] for c in json.loads(tb.read_text())["counts"]} if tb.is_file() else {}
            for side in ("forget", "retain"):
                assert row[f"{side} profiles"] == str(counts.get(f"{side}_{row.field}", "")), (row.run, row.field, side)
                checked += 1
            rp = d / "report" / "reachability.csv"
            r = (
                pd.read_csv(rp).query("field == @row.field and model == 'masked'").set_index("kind")
                if rp.is_file()
                else pd.DataFrame()
            )
            for c, kind, col, k in (
                ("trained EM", "trained", "accuracy", 1),
                ("fresh, % of trained", "fresh", "vs_trained", 100),
                ("paraphrase, % of trained", "paraphrase", "vs_trained", 100),
            ):
                if kind not in r.index:
                    assert row[c] == "", (row.run, row.field, c)
                    continue
                assert_shown(row[c], r.at[kind, col] * (k if k == 100 else 1), (row.run, row.field, c))
                checked += 1
            checked += 1
    return checked


def assert_header(page: str, run_dirs: list[Path]) -> dict[str, str]:
    """The header names command, commit, date, machine and seeds, with the runs' commit, creation date and seeds.
    Returns them."""
    head = page.split("\n## ")[0]
    found = dict(re.findall(r"^- \*\*(\w+)\*\*[:,] ?(.*)$", head, re.M))
    assert all(k in found for k in HEADER_KEYS), (sorted(found), HEADER_KEYS)
    for d in run_dirs:
        m = run_manifest(d)
        if m.get("git_commit"): assert m["git_commit"] in found["Commit"]
        if m.get("created"): assert m["created"][:10] in found["Date"]
    seeds = list(dict.fromkeys(str(run_config(d)["seed"]) for d in run_dirs))
    assert found["Seeds"].split(", ") == seeds, (found["Seeds"], seeds)
    assert found["Command"] and found["Machine"]
    assert "lume-lab" in head or "make" in head                    # a command a reader can run
    return found


def assert_results_match_csvs(page, run_dirs) -> int:
    """A results page (its text or path) over `run_dirs` (runs of one or several configs, or one sweep directory): the
    header names command, commit, date, machine and seeds, every table is one this check knows, and every number in it
    equals its CSV cell after the page's rounding. Returns how many numbers were checked."""
    text, (kind, dirs) = _text(page), results_sources(run_dirs)
    tables = read_markdown_tables(text)
    if kind == "sweep":
        points = [
            dirs[0] / p
            for p in pd.read_csv(dirs[0] / "points.csv", dtype=str).point
            if (dirs[0] / p / "config.json").exists()
        ]
        if points: assert_header(text, points)
        return check_sweep_tables(tables, dirs[0])
    assert_header(text, dirs)
    # the page's grouping is checked against the configs below
    groups = config_groups(dirs)
    if len(groups) == 1: by_group = {"": (dirs, tables)}
    else:
        labels = dict(zip(run_labels(dirs), dirs))
        by_group = {", ".join(n for n, d in labels.items() if d in g): (g, []) for g in groups}
        conf = [t for heads, t in tables if heads == ("Configurations",)]
        assert len(conf) == 1, "a page over several configs names their differences once"
        checked_conf = check_config_table(conf[0], groups, by_group)
        for heads, t in tables:
            section, _, group = heads[0].partition(": ")
            if section in GROUPED:
                assert group in by_group, (heads, sorted(by_group))
                by_group[group][1].append(((section, *heads[1:]), t))
        tables = [x for x in tables if x[0][0].partition(": ")[0] not in GROUPED and x[0] != ("Configurations",)]
    checked = 0 if len(groups) == 1 else checked_conf
    for group, (g_dirs, g_tables) in by_group.items():
        card = [t for t in g_tables if t[0][0] == "Scorecard"]
        remind = [t for t in g_tables if t[0][0] == "REMIND intervals"]
        dose = [t for t in g_tables if t[0][0] == "Dose-response"]
        quant = [t for t in g_tables if t[0][0] == "Quantized forget EM"]
        checked += check_scorecard_tables(card, g_dirs) if card else 0
        if not card: assert "**No scorecard" in text, "a page without scorecard tables must say so"
        checked += (
            check_remind_interval_tables(remind, g_dirs)
            + check_dose_tables(dose, g_dirs)
            + check_quantized_em_tables(quant, g_dirs)
        )
        if len(groups) > 1:
            assert len(card) + len(remind) + len(dose) + len(quant) == len(g_tables), [h for h, _ in g_tables]
    if len(groups) == 1: tables = [t for t in tables if t[0][0] not in GROUPED]
    testbed = [t for t in tables if t[0][0] == "Testbed"]
    controls = [t for t in tables if t[0][0] == "Attack controls"]
    statistic = [t for t in tables if t[0][0] == "Operating point: mean against median"]
    stages = [t for heads, t in tables if heads == ("Stage times",)]
    experiments = [t for heads, t in tables if heads == ("Experiment times",)]
    headline = [t for heads, t in tables if heads == ("Headline",)]
    assert len(headline) <= 1 and (not headline or len(groups) == 1), "one headline table, over one config"
    assert len(headline) + len(testbed) + len(controls) + len(statistic) + len(experiments) + len(stages) == len(
        tables), [
        h for h, _ in tables
    ]
    checked += sum(check_headline_table(t, dirs) for t in headline) + check_attack_control_tables(controls, dirs)
    checked += check_testbed_tables(testbed, dirs) + check_statistic_tables(statistic, dirs)
    return (
        checked
        + sum(check_stage_table(t, dirs) for t in stages)
        + sum(check_experiment_table(t, dirs) for t in experiments)
    )


# sections a page over several configs repeats per config
GROUPED = ("Scorecard", "REMIND intervals", "Dose-response", "Quantized forget EM")


def config_groups(dirs: list[Path]) -> list[list[Path]]:
    """The runs grouped by config with the seed and the scope fields set aside: two runs are one config when the
    first's config.json, with the second's seed and scope fields (`core.config.SCOPE_FIELDS`: they only add runs of
    their own), would reopen as the second (`pipeline.orchestration.config.same_config`, the check `lume-lab run`
    makes)."""
    import copy
    from lume_lab.core.config import SCOPE_FIELDS, config_from_dict
    from lume_lab.pipeline.orchestration.config import same_config

    def as_b(a: dict, b: dict) -> dict:
        out = copy.deepcopy({**a, "seed": b["seed"]})
        for k in SCOPE_FIELDS:
            sec, name = k.split(".")
            if name in b.get(sec, {}): out.setdefault(sec, {})[name] = b[sec][name]
            else: out.get(sec, {}).pop(name, None)
        return out
    def one(a: Path, b: Path) -> bool:
        return same_config(config_from_dict(as_b(run_config(a), run_config(b))), config_from_dict(run_config(b)))
    groups: list[list[Path]] = []
    for d in dirs:
        for g in groups:
            if one(g[0], d) or one(d, g[0]): g.append(d); break
        else: groups.append([d])
    return groups


def check_config_table(t: pd.DataFrame, groups: list[list[Path]], by_group: dict) -> int:
    "The configurations table: one column per group, one row per differing field, each value its config.json's."
    import json
    from lume_lab.core.config import dotted_leaves
    assert list(t.columns) == ["field", *by_group], (list(t.columns), list(by_group))
    leaves = {label: dotted_leaves(run_config(g[0])) for label, (g, _) in by_group.items()}
    differing = {
        k
        for a in leaves.values()
        for b in leaves.values()
        for k in a.keys() | b.keys()
        if a.get(k, object) != b.get(k, object)
    } - {"seed"}
    assert set(t.field) == differing, sorted(set(t.field) ^ differing)
    for _, row in t.iterrows():
        for label, lv in leaves.items():
            v = lv.get(row.field, None) if row.field in lv else None
            exp = "" if row.field not in lv else (v if isinstance(v, str) else json.dumps(v))
            assert row[label] == exp, (row.field, label, row[label], exp)
    return len(t) * len(leaves)
