"""Checks shared by test_report.py and test_pipeline.py's smoke run: a report page shows the values of the CSVs it was
made from, and a renderer reads only the report files its section declares."""
import html, os, re
from contextlib import ExitStack, contextmanager
from fnmatch import fnmatchcase
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest

from lume_lab.pipeline.presentation.report import empty_testbeds, read_html_tables
from lume_lab.pipeline.presentation.scorecard import (
    SCORECARD_METRICS as METRICS, PAPER_METHODS, PAPER_TABLE2_OLMO2_1B, metric_sources, verdict_columns)

# an image from anywhere but a data URI, or a link to anything but a file beside the page (its CSVs)
EXTERNAL = re.compile(r"""\bsrc\s*=\s*(?!["']?data:)|\bhref\s*=\s*(?!"[A-Za-z0-9._-]+")""", re.I)


def _same(a, b):
    return (pd.isna(a) and pd.isna(b)) or a == pytest.approx(b, rel=1e-12)


def _fmt(v, digits):
    return "" if pd.isna(v) else f"{v:.{digits}f}"


def assert_self_contained(page: str, folder: Path | None = None):
    """Every image is a base64 PNG data URI; no src/href points anywhere else (no http(s), no path) but a link to a
    file beside the page (in `folder`, when given, where it must exist)."""
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    imgs = re.findall(r"<img\b[^>]*>", page)
    assert all('src="data:image/png;base64,' in i for i in imgs), [i[:80] for i in imgs if "data:" not in i]
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    assert "http://" not in page and "https://" not in page
    if folder is not None:
        for name in re.findall(r'href="([^"]+)"', page): assert (Path(folder) / name).is_file(), name
    return len(imgs)


def scorecard_tables(page: str) -> dict[str, pd.DataFrame]:
    "The page's scorecard tables, by field (the <h3> before each), indexed by method."
    fields = re.findall(r"<h3>([^<]+)</h3>", page)
    tables = [t for t in read_html_tables(page) if "method" in t.columns and "forget EM" in t.columns]
    assert len(fields) == len(tables)
    return {f: t.set_index("method") for f, t in zip(fields, tables)}


def h2_sections(page: str) -> dict[str, str]:
    "Each <h2> section of the page: its title -> its HTML up to the next <h2>."
    parts = re.split(r"<h2>([^<]+)</h2>", page)
    return dict(zip(parts[1::2], parts[2::2]))


SHARES = {"forget_em": "forget_profiles", "retain_em": "retain_profiles", "leak_after": "leak_profiles"}


def share_interval(p: float, n: float) -> tuple[float, float]:
    "The 95 % interval of a share p % over n profiles: Agresti–Caffo's standard error, normal, clipped to [0, 100]."
    q = (p / 100 * n + 1) / (n + 2)
    h = 1.959963984540054 * 100 * np.sqrt(q * (1 - q) / (n + 2))
    return max(p - h, 0.0), min(p + h, 100.0)


def assert_verdict_matches(card: pd.DataFrame, page: str):
    """The verdict table (the page's headline: at most 12 columns) shows each verdict column as 'ours [95 % interval]'
    at its display digits, the paper's value on the next line; a share's interval is binomial over its n profiles; a
    line per field under it gives the n and the MDD. It is the first table, in the first h2 section."""
    assert re.findall(r"<h2>([^<]+)</h2>", page)[0] == "Verdict"
    section, empty = h2_sections(page)["Verdict"], empty_testbeds(card.reset_index())
    for f, why in empty.items(): assert html.escape(why) in section, (f, why)   # withheld: said, not coloured
    card = card[~card.index.get_level_values("field").isin(list(empty))]
    if not len(card):
        assert "<table" not in section
        return len(empty)
    t = read_html_tables(section)[0]
    assert len(t.columns) <= 12, list(t.columns)
    for f in dict.fromkeys(t.field):
        assert re.search(rf'<p class="footer">{re.escape(f)}: n = [^<]*Minimum detectable', section), f
    t = t.set_index(["field", "method"])
    checked = 0
    for (f, m), r in card.iterrows():
        for c in verdict_columns():
            if c not in card or card[c].isna().all(): continue          # nothing to show: no column
            head = next(h for h in t.columns if h.startswith(METRICS[c].label + " "))
            fired = r.get(f"{c}_fired")         # e10's controls: a recovery whose attack fired on no positive control
            quiet = fired is not None and fired == 0 and not pd.isna(r[c])
            lines, k = t.at[(f, m), head].split("\n"), METRICS[c].digits
            want = "did not fire" if quiet else _fmt(r[c], k)
            if c in SHARES and not quiet and not pd.isna(r[c]) and r.get(SHARES[c], 0) > 0:
                want += " [{}, {}]".format(*(_fmt(v, k) for v in share_interval(r[c], r[SHARES[c]])))
            assert lines[0] == want or (c not in SHARES and lines[0].startswith(want)), (f, m, c, lines, want)
            if f"{c}_paper" in card and not pd.isna(r[f"{c}_paper"]):
                assert lines[1] == f"paper {_fmt(r[f'{c}_paper'], k)}", (f, m, c, lines)
            assert set(lines[1:]) <= {f"paper {_fmt(r.get(f'{c}_paper'), k)}", "not testable at this n"}, lines
            checked += 1
    return checked


def assert_report_matches_csvs(run_dir: Path, out_dir: Path | None = None):
    "scorecard.csv and the page's scorecard tables hold exactly the run's CSV values (and the paper's typed table)."
    rep, out = Path(run_dir) / "report", Path(out_dir or Path(run_dir) / "report")
    card = pd.read_csv(out / "scorecard.csv").set_index(["field", "method"])
    page = (out / "index.html").read_text()
    html = scorecard_tables(page)
    checked = assert_verdict_matches(card, page) if len(card) else 0
    for p in sorted(rep.glob("table2_*.csv")):
        field, t = p.stem.removeprefix("table2_"), pd.read_csv(p, index_col=[0, 1])
        for m in [c for c in t.columns if c not in ("n_profiles", "n_rows")]:
            for col, key in metric_sources("table2").items():
                if key not in t.index: continue      # a row the run did not score (general English when off)
                assert _same(card.at[(field, m), col], t.at[key, m]), (field, m, col)
                assert html[field].at[m, METRICS[col].label] == _fmt(t.at[key, m], 1), (field, m, col)
                checked += 1
            assert card.at[(field, m), "forget_profiles"] == t.at[("forget", "em"), "n_profiles"]
            assert card.at[(field, m), "retain_rows"] == t.at[("retain", "em"), "n_rows"]
            assert (
                html[field].at[m, "n forget (profiles / rows)"]
                == f"{t.at[('forget', 'em'), 'n_profiles']:.0f} / {t.at[('forget', 'em'), 'n_rows']:.0f}"
            )
            if field in PAPER_TABLE2_OLMO2_1B and m in PAPER_METHODS:          # the paper's column: the typed Table 2
                v = PAPER_TABLE2_OLMO2_1B[field][("forget", "em")][PAPER_METHODS.index(m)]
                assert (
                    card.at[(field, m), "forget_em_paper"] == v and html[field].at[m, "forget EM (paper)"] == f"{v:.1f}"
                )
    if (rep / "localization_summary.csv").exists():
        loc = pd.read_csv(rep / "localization_summary.csv")
        if "best_score" in loc and "lacuna_max_auc" not in loc:   # an older summary: its `auc` is Lacuna's max
            loc = loc.assign(lacuna_max_auc=loc.auc, auc=np.nan)
        for _, r in loc.iterrows():
            assert _same(card.at[(r.field, r.method), f"auc_{r.labels}"], r.auc)
            label = {"forget": "AUC |Δθ| m^F", "unified": "AUC |Δθ| m^F∪m^R"}[r.labels]
            assert html[r.field].at[r.method, label] == _fmt(r.auc, 3)
            if "lacuna_max_auc" in r:  # Lacuna's max over families: a labelled column of its own
                assert _same(card.at[(r.field, r.method), f"lacuna_max_{r.labels}"], r.lacuna_max_auc)
                label = {"forget": "Lacuna max over families m^F", "unified": "Lacuna max over families m^F∪m^R"}
                assert html[r.field].at[r.method, label[r.labels]] == _fmt(r.lacuna_max_auc, 3)
            checked += 1
    for p in sorted(rep.glob("remind_*.csv")):
        if p.stem.startswith(("remind_ablation_", "remind_importances_", "remind_ci_", "remind_separation_")): continue
        field, t = p.stem.removeprefix("remind_"), pd.read_csv(p)
        for _, r in t[
            (t.input == "orig") & (t.protocol == "fair") & t.detector.isin(["remind_lr", "remind_rf"])
        ].iterrows():
            if (field, r.model) not in card.index:
                assert r.model in ("base", "none_control")
                continue
            assert _same(card.at[(field, r.model), r.detector.replace("remind_", "remind_auc_")], r["multi"])
            assert html[field].at[r.model, {"remind_lr": "REMIND LR", "remind_rf": "REMIND RF"}[r.detector]] == _fmt(
                r["multi"], 1
            )
            checked += 1
    if (rep / "resurfacing.csv").exists():
        for _, r in pd.read_csv(rep / "resurfacing.csv").iterrows():
            if (r.field, r.method) not in card.index: assert r.method == "floor"; continue
            assert _same(card.at[(r.field, r.method), f"leak_{r.stage}"], r.rate)
            assert html[r.field].at[r.method, f"leak {r.stage}"] == _fmt(r.rate, 1)
            assert card.at[(r.field, r.method), "leak_profiles"] == r.n_profiles
            checked += 1
    if (rep / "resurfacing_attack.csv").exists():      # the attack-summary table shows the CSV's values
        t = next(t for t in read_html_tables(page) if "nll_before" in t.columns).set_index(["field", "method"])
        for _, r in pd.read_csv(rep / "resurfacing_attack.csv").iterrows():
            for c in ("nll_before", "val_start", "val_kept"):
                assert float(t.at[(r.field, r.method), c]) == pytest.approx(round(r[c], 3), abs=1e-9), (
                    r.field,
                    r.method,
                    c,
                )
            assert int(t.at[(r.field, r.method), "kept_step"]) == r.kept_step
            # and the scorecard's held-out PII column (the floor has no row)
            if (r.field, r.method) in card.index:
                assert _same(card.at[(r.field, r.method), "heldout_pii_nll"], r.nll_before)
                assert html[r.field].at[r.method, "held-out PII NLL"] == _fmt(r.nll_before, 2)
            else: assert r.method == "floor"
            checked += 1
    return checked


def assert_fig3_table_matches(run_dir: Path, out_dir: Path | None = None):
    "The page's extraction-rate table (Fig. 3b) shows extraction_rates.csv."
    rep, out = Path(run_dir) / "report", Path(out_dir or Path(run_dir) / "report")
    rates = pd.read_csv(rep / "extraction_rates.csv")
    t = next(t for t in read_html_tables((out / "index.html").read_text()) if "masked rate %" in t.columns).set_index(
        "field"
    )
    for _, r in rates.iterrows():
        assert t.at[r.field, f"{r.model} rate %"] == str(np.round(r.rate, 1)), (r.field, r.model)
        assert t.at[r.field, f"{r.model} memorized"] == str(r.memorized)


@contextmanager
def names_looked_at(rep: Path):
    """Every name under `rep` that the block checks, opens, reads or globs, in order; yields the list.
    A glob gives its pattern."""
    rep, seen, real = (
        os.path.realpath(rep),
        [],
        {n: getattr(Path, n) for n in ("exists", "is_file", "open", "read_text", "read_bytes", "glob")},
    )
    def note(p):
        rel = os.path.relpath(os.path.realpath(p), rep)
        if rel != "." and not rel.startswith(".."): seen.append(Path(rel).as_posix())
    def traced(n):
        def f(self, *a, **k):
            note(self / a[0] if n == "glob" else self)
            return real[n](self, *a, **k)
        return f
    read_csv = pd.read_csv
    def read_csv_traced(p, *a, **k): note(p); return read_csv(p, *a, **k)
    with ExitStack() as stack:
        for n in real: stack.enter_context(mock.patch.object(Path, n, traced(n)))
        stack.enter_context(mock.patch.object(pd, "read_csv", read_csv_traced))
        yield seen


def undeclared(names, patterns) -> list[str]:
    "The names (or glob patterns) that no pattern of `patterns` covers."
    return sorted({n for n in names if "/" in n or not any(fnmatchcase(n, p) for p in patterns)})
