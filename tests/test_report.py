"""The report page (`pipeline.presentation.report`): its tables equal the CSVs they come from, it is one offline file,
sections follow the stages present, seeds aggregate to mean ± std, and a failed write leaves the previous page
intact."""
import html, json, re, shutil
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from lume_lab.pipeline.presentation import report as R, scorecard as S
from lume_lab.pipeline.presentation.report import read_html_tables
from lume_lab.pipeline.orchestration.cli import main
from report_checks import (
    assert_fig3_table_matches, assert_report_matches_csvs, assert_self_contained, assert_verdict_matches, h2_sections,
    names_looked_at, scorecard_tables, undeclared)

HERE = Path(__file__).parent
# the CSVs, config and manifest (stage warnings dropped) of `make run`'s mini run, REMIND rows only
MINI = HERE / "data" / "mini_run"
FIGURES = [
    "extraction_rates.png", "utility_injection.png", "unlearning_phone_number.png", "localization_email_address.png",
    "remind_phone_number.png", "resurfacing_leakage.png", "resurfacing_jaccard_email_address.png"]


def _png(path: Path, label: str):
    fig, ax = plt.subplots(figsize=(1.5, 1)); ax.set_title(label, fontsize=6); fig.savefig(path, dpi=40); plt.close(fig)


def _copy_run(dst: Path, seed: int | None = None) -> Path:
    shutil.copytree(MINI, dst)
    for name in FIGURES: _png(dst / "report" / name, name)
    if seed is not None:
        cfg = json.loads((dst / "config.json").read_text()); cfg["seed"] = seed
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _h2(page: str) -> list[str]:
    return re.findall(r"<h2>([^<]+)</h2>", page)


def test_mini_page_tables_equal_the_csvs(tmp_path):
    """Every scorecard value on the page and in scorecard.csv is the value in the run's CSV; figures inline.
    Markdown twin written."""
    run = _copy_run(tmp_path / "mini")
    page_path = R.write_report([run])
    assert page_path == run / "report" / "index.html"
    page = page_path.read_text()
    assert assert_self_contained(page, run / "report") == len(FIGURES) + 1   # + the verdict figure, drawn by the report
    assert (run / "report" / "verdict.png").exists()
    # 2 fields × 11 methods × 9 output columns, AUCs, REMIND, leakage
    assert assert_report_matches_csvs(run) > 300
    assert_fig3_table_matches(run)
    assert _h2(page) == [
        "Verdict", "Scorecard", "Data and base model", "Injection and memorization (Fig. 3)", "Unlearning (Fig. 4a)",
        "Localization precision (Fig. 4b)", "REMIND: residual memorization", "Resurfacing attack (Fig. 5)", "The run"]
    card = pd.read_csv(run / "report" / "scorecard.csv")
    # the config's forget-field order
    assert list(card.field.unique()) == ["phone_number", "email_address"]
    assert card.method.tolist()[:3] == ["none", "grad_ascent", "grad_diff"] and (card.n_seeds == 1).all()
    assert not any(c.endswith("_std") for c in card.columns)                                 # one run: plain values
    # the markdown twin: same sections, figures by relative path to files that exist
    md = (run / "report" / "report.md").read_text()
    assert [l[3:] for l in md.splitlines() if l.startswith("## ")] == _h2(page)
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == len(FIGURES) + 1 and all((run / "report" / l).exists() for l in links)
    # run section: seed, commit and stage times from manifest.json, and the reproduce line
    man = json.loads((run / "manifest.json").read_text())
    assert man["git_commit"] in page and "lume-lab run --preset mini --seed 0 --run-id mini" in page
    times = R.stage_times(run).set_index("family").seconds
    assert times["unlearn"] == pytest.approx(
        sum(v["seconds"] for k, v in man["stages"].items() if k.startswith("unlearn_"))
    )


def test_direction_marks_on_mini(tmp_path):
    "The mark names exactly the checks whose signs differ, recomputed here from the scorecard's own columns."
    run = _copy_run(tmp_path / "mini")
    card = S.scorecard([run]).set_index(["field", "method"])
    paper_rows = card.forget_em_paper.notna()
    assert paper_rows.sum() == 8                              # 4 paper methods × 2 fields
    assert (card.loc[~paper_rows, "direction_mismatch"] == "").all()
    for key, r in card[paper_rows].iterrows():
        want = [
            name
            for name, (a, b, tol) in S.DIRECTION_CHECKS.items()
            if not pd.isna(r.get(a))
            and not pd.isna(r.get(f"{a}_paper"))
            and (not isinstance(b, str) or not (pd.isna(r.get(b)) or pd.isna(r.get(f"{b}_paper"))))
            and S.direction(r[a], r[b] if isinstance(b, str) else b, tol)
            != S.direction(r[f"{a}_paper"], r[f"{b}_paper"] if isinstance(b, str) else b, tol)
        ]
        assert r.direction_mismatch == ", ".join(want), key
    # AlphaEdit on email: the paper's forget EM 63.2 > retain EM 58.8 (no selective forgetting); ours keeps retain above
    # forget
    assert "EM" in card.at[("email_address", "alphaedit"), "direction_mismatch"].split(", ")


def test_seeds_mean_std_and_n(tmp_path):
    "Two seeds of one config: each cell the mean, `_std` the sample std, n_seeds 2; another config is refused."
    a, b = _copy_run(tmp_path / "s0"), _copy_run(tmp_path / "s1", seed=1)
    t2 = b / "report" / "table2_phone_number.csv"
    t = pd.read_csv(t2, index_col=[0, 1])
    t.loc[("forget", "em"), "npo"] += 6.0
    t.to_csv(t2)
    card = S.scorecard([a, b]).set_index(["field", "method"])
    ref = pd.read_csv(a / "report" / "table2_phone_number.csv", index_col=[0, 1]).at[("forget", "em"), "npo"]
    assert card.at[("phone_number", "npo"), "forget_em"] == pytest.approx(ref + 3.0)
    assert card.at[("phone_number", "npo"), "forget_em_std"] == pytest.approx(np.std([ref, ref + 6.0], ddof=1))
    assert card.at[("phone_number", "npo"), "retain_em_std"] == 0 and (card.n_seeds == 2).all()
    with pytest.raises(ValueError, match="pass out_dir"):
        R.write_report([a, b])
    page = R.write_report([a, b], tmp_path / "seeds").read_text()
    cell = scorecard_tables(page)["phone_number"].at["npo", "forget EM"]
    assert cell == f"{ref + 3.0:.1f} ± {np.std([ref, ref + 6.0], ddof=1):.1f}"
    assert "lume-lab run --preset mini --seed 1 --run-id s1" in page
    other = _copy_run(tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text())
    cfg["inject"]["lr"] *= 2
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="inject.lr"):
        S.scorecard([a, other])


def test_failed_render_leaves_previous_page(tmp_path, monkeypatch):
    """Everything is rendered before anything is written:
    a figure that cannot be read leaves the old page (or none), no temp file."""
    run = _copy_run(tmp_path / "mini")
    before = {
        p.name: p.read_bytes()
        for p in [R.write_report([run]), run / "report" / "report.md", run / "report" / "scorecard.csv"]
    }
    def boom(path): raise OSError(f"cannot read {path}")
    monkeypatch.setattr(R, "_data_uri", boom)
    with pytest.raises(OSError): R.write_report([run])
    assert {n: (run / "report" / n).read_bytes() for n in before} == before
    with pytest.raises(OSError): R.write_report([run], tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists() or not any((tmp_path / "fresh").iterdir())
    assert not [p for p in (run / "report").iterdir() if p.name.startswith(".")]


def test_partial_smoke_run_gives_valid_page(tmp_path, capfd, monkeypatch):
    """`lume-lab run --only e00 e01 e02 e99` on smoke: e99 writes a valid offline page with only the data, injection and
    run sections; the terminal shows the plan and one line per experiment, no kernel warning, no papermill bar, the
    page's path last; the page written after e00 marks the injection section (e02, still to come) "not yet run"."""
    from functools import partial
    from lume_lab.pipeline.orchestration import cli
    pages = {}
    def after(name, store): pages.setdefault(name, (store.dir / "report" / "index.html").read_text())
    monkeypatch.setattr(cli, "run_pipeline", partial(cli.run_pipeline, on_experiment=after))
    args = ["run", "--preset", "smoke", "--run-id", "part", "--runs-root", str(tmp_path),
            "--set", "pretrain.steps=24", "--set", "pretrain.checkpoint_every=8", "--only", "e00", "e01", "e02", "e99"]
    assert main(args) == 0
    run = tmp_path / "part"
    out, err = capfd.readouterr()
    assert "IPKernelApp" not in out + err and "Executing" not in out + err and "cell/s" not in out + err
    assert (
        "chain: e00_base → e01_data → e02_inject → e99_report" in out
        and "expected time, as measured for preset smoke" in out
    )
    done = [l.strip() for l in out.splitlines() if l.strip().startswith("✓ ")]
    assert [l.split()[1] for l in done] == ["e00_base", "e01_data", "e02_inject", "e99_report"]
    assert (
        all(" · elapsed " in l and "% of the run · ETA " in l for l in done)
        and done[-1].split(" · ")[2] == "100% of the run"
    )
    # a store stage, seen finishing in the manifest
    assert any(l.startswith("    · base in ") for l in out.splitlines())
    assert out.rstrip().splitlines()[-1] == f"report page: {run / 'report' / 'index.html'}"
    assert list(pages) == ["e00_base", "e01_data", "e02_inject", "e99_report"]
    early = h2_sections(pages["e00_base"])
    assert (
        "e02_inject: not yet run" in early["Injection and memorization (Fig. 3)"]
        and "not yet run" not in early["Data and base model"]
    )
    assert "not yet run" not in pages["e99_report"]
    assert (run / "notebooks" / "e99_report.ipynb").exists()
    # every file under report/ has its line in the registry
    files = [p.name for p in (run / "report").iterdir()]
    assert {"data_sizes.csv", "extraction_rates.csv", "index.html"} <= set(files) and not undeclared(
        files, R.report_patterns() + list(R.PAGE_FILES)
    )
    page = (run / "report" / "index.html").read_text()
    assert assert_self_contained(page) >= 2                                  # Fig. 3a and 3b at least
    assert _h2(page) == ["Data and base model", "Injection and memorization (Fig. 3)", "The run"]
    assert "Scorecard" not in page and "<h3>" not in page
    assert_fig3_table_matches(run)
    assert pd.read_csv(run / "report" / "scorecard.csv").empty
    assert (
        "lume-lab run --preset smoke --seed 0 --run-id part --set pretrain.checkpoint_every=8 --set pretrain.steps=24"
        in page
    )
    assert [l[3:] for l in (run / "report" / "report.md").read_text().splitlines() if l.startswith("## ")] == _h2(page)


def test_page_of_a_run_without_outputs_says_so(tmp_path):
    "e99 on a run that has no experiment outputs yet writes a page that says so, not one that looks finished."
    from lume_lab.pipeline.presentation.report import EMPTY_NOTE, write_report
    run = tmp_path / "empty"; run.mkdir()
    for name in ("config.json", "manifest.json"): shutil.copy(MINI / name, run / name)
    page = write_report([run]).read_text()
    assert _h2(page)[0] == "No results yet" and EMPTY_NOTE.split(":")[0] in page
    assert "Scorecard" not in page and pd.read_csv(run / "report" / "scorecard.csv").empty
    full = write_report([_copy_run(tmp_path / "full")], tmp_path / "full_page").read_text()
    assert "No results yet" not in full


def test_a_skipped_field_is_named_with_its_reason(tmp_path):
    """e03's skipped_fields.csv: each field it did not unlearn gets a banner saying so and why, in the Unlearning
    section and under the verdict's headline (the first screen); without the file (or with it empty) there is none."""
    run = _copy_run(tmp_path / "mini")
    why = "its forget set holds 1 memorized profile, under the 2 the operating-point rule needs"
    pd.DataFrame({"field": ["birth_city"], "forget": [1], "retain": [4], "why": [why]}).to_csv(
        run / "report" / "skipped_fields.csv", index=False)
    secs = h2_sections(R.write_report([run]).read_text())
    said = f"birth_city is not unlearned or judged: {why} (forget 1 / retain 4 memorized profiles)."
    for name in ("Unlearning (Fig. 4a)", "Verdict"):
        found = re.findall(r'<div class="banner"[^>]*>([^<]+)</div>', secs[name])
        assert said in [html.unescape(b) for b in found], name
    assert len(re.findall(r'<div class="banner"', secs["Unlearning (Fig. 4a)"])) == 1
    none = pd.DataFrame(columns=["field", "forget", "retain", "why"])
    none.to_csv(run / "report" / "skipped_fields.csv", index=False)
    secs = h2_sections(R.write_report([run]).read_text())
    assert 'class="banner"' not in secs["Unlearning (Fig. 4a)"] and "not unlearned or judged" not in secs["Verdict"]


def _set_split_sizes(run: Path, forget: int, retain: int):
    for p in (run / "report").glob("table2_*.csv"):
        t = pd.read_csv(p, index_col=[0, 1])
        t.loc[[k for k in t.index if k[0].startswith("forget")], "n_profiles"] = forget
        t.loc[[k for k in t.index if k[0].startswith("retain")], "n_profiles"] = retain
        t.to_csv(p)


def test_verdict_first_and_small_split_banner(tmp_path):
    """The first section is the verdict; a split under 10 people gets a banner above it naming field and n.
    None when all have >= 10."""
    run = _copy_run(tmp_path / "mini")
    page = R.write_report([run]).read_text()
    assert _h2(page)[0] == "Verdict"
    card = pd.read_csv(run / "report" / "scorecard.csv")
    # the copied mini run predates e10: its robustness columns are absent
    present = [c for c in S.verdict_columns() if c in card]
    shown_cols = [c for c in present if card[c].notna().any()]          # a column with no value takes no room
    checked = assert_verdict_matches(card.set_index(["field", "method"]), page)
    assert len(shown_cols) >= 5 and checked == len(card) * len(shown_cols)
    small = card.groupby("field", sort=False)[["forget_profiles", "retain_profiles"]].min()
    # the mini run's own split sizes: the precondition of the banner
    assert (small.forget_profiles < 10).any()
    banner = re.search(r'<div class="banner"[^>]*>([^<]+)</div>', page)
    assert banner and page.index(banner.group(0)) < page.index("<h2>Verdict</h2>")
    for f, r in small.iterrows():
        said = re.search(rf"{f} \(([^)]*) profiles\)", banner.group(1))
        assert bool(said) == (r.min() < 10), f
        for split in ("forget", "retain"):
            assert (said is not None and f"{split} n = {r[f'{split}_profiles']:.0f}" in said.group(1)) == (
                r[f"{split}_profiles"] < 10
            ), (f, split)
    # the verdict table colours one cell per mark: better / same / worse against `none` (AUC: chance); `none`'s own
    # cells", and a mark whose difference interval spans both outcomes reads 'not testable at this n', hatched
    marks, shown = (
        R.verdict_marks(S.scorecard([run])),
        re.findall(r'<td class="(better|worse|same|ref|untestable)">', h2_sections(page)["Verdict"]),
    )
    assert sum(shown.count(c) for c in ("better", "same", "worse", "untestable")) == int(marks.notna().sum().sum())
    for cls, v in (("better", 1), ("same", 0), ("worse", -1)):
        assert shown.count(cls) <= int((marks == v).sum().sum()), cls
    assert shown.count("better") > 0 and shown.count("untestable") > 0
    assert h2_sections(page)["Verdict"].count("<br>not testable at this n</td>") == shown.count("untestable")
    # cell by cell, in page order: a marked cell takes its mark's colour, or the hatching where its verdict is 'not
    # testable at this n'; `none`'s cells of a metric measured against `none` are the reference; the rest, no colour
    sc = S.scorecard([run])
    judged = sc[~sc.field.isin(list(R.empty_testbeds(sc)))]
    mk, vd = R.verdict_marks(judged), R.verdict_cells(judged).set_index(["row", "column"]).verdict
    want = []
    for i, r in judged.iterrows():
        for c in shown_cols:
            if pd.notna(mk.at[i, c]):
                want.append("untestable" if vd[(i, c)] == S.NOT_TESTABLE else
                            {1.0: "better", 0.0: "same", -1.0: "worse"}[mk.at[i, c]])
            elif r.method == "none" and S.SCORECARD_METRICS[c].reference == "none": want.append("ref")
    assert shown == want
    # every verdict column measured against `none` (not AUC: chance)
    n_ref = sum(S.SCORECARD_METRICS[c].reference == "none" for c in present)
    assert n_ref >= 5 and shown.count("ref") == (card.method == "none").sum() * n_ref
    # every split at 10 or more: no banner (constructed from the same run)
    _set_split_sizes(run, 10, 12)
    page = R.write_report([run]).read_text()
    assert 'class="banner"' not in page and _h2(page)[0] == "Verdict"
    _set_split_sizes(run, 10, 9)
    banner = re.search(r'<div class="banner"[^>]*>([^<]+)</div>', R.write_report([run]).read_text()).group(1)
    assert "(retain n = 9 profiles)" in banner and "forget n =" not in banner


def test_sections_still_to_come_say_not_yet_run(tmp_path):
    """A page written while a run is under way (after e03):
    later sections, the verdict's later columns say 'not yet run'; the rest shows."""
    run = _copy_run(tmp_path / "mini")
    for p in (run / "report").iterdir():
        if p.name.startswith(("localization_", "remind_", "resurfacing")): p.unlink()
    later = ["e04_localization", "e05_remind", "e06_resurfacing", "e09_attribution", "e99_report"]
    page = R.write_report([run], pending=later).read_text()
    secs = h2_sections(page)
    assert list(secs)[:2] == ["Verdict", "Scorecard"]
    for title, exp in (
        ("Localization precision (Fig. 4b)", "e04_localization"), ("REMIND: residual memorization", "e05_remind"),
        ("Resurfacing attack (Fig. 5)", "e06_resurfacing"),
        ("Attribution against the ground truth (e09)", "e09_attribution")):
        assert f"{exp}: not yet run" in secs[title], title
    for title in ("Data and base model", "Injection and memorization (Fig. 3)", "Unlearning (Fig. 4a)"):
        assert "not yet run" not in secs[title] and ("<img" in secs[title] or "<table" in secs[title]), title
    assert (
        "AUC |Δθ| m^F (e04_localization), REMIND RF (e05_remind), leak after (e06_resurfacing): not yet run"
        in secs["Verdict"]
    )
    assert "PISTOL" not in page                                       # e07 is neither done nor to come: no section
    assert_report_matches_csvs(run)                                   # Table 2 on the page is the CSV's
    final = R.write_report([run]).read_text()                          # the run's end: nothing pending, no placeholder
    assert "not yet run" not in final and "Localization precision (Fig. 4b)" not in _h2(final)


def test_section_registry_is_the_page_order(tmp_path):
    "Sections come from the registry, in order; a registration with a bad experiment id is refused by name."
    run = _copy_run(tmp_path / "mini")
    titles = [s.title for s in R.PAGE_SECTIONS]
    got = [h for h in _h2(R.write_report([run]).read_text()) if h in titles]
    assert got == [t for t in titles if t in got] and len(got) >= 5
    with pytest.raises(ValueError, match="experiments must be ids like 'e03'"):
        R.register_section("x", ("remind",), (), lambda rep: [])


def _looked_at(render, run: Path) -> list[str]:
    with names_looked_at(run / "report") as seen: render(run / "report")
    return seen


def test_renderers_read_only_their_declared_files(tmp_path):
    """Each section's renderer looks only at report files its own section declares (traced on the mini run, with its
    figures, and on a run without outputs); the scorecard reads only declared files; a renderer reading an undeclared
    file is caught."""
    full, empty = _copy_run(tmp_path / "mini"), tmp_path / "empty"
    (empty / "report").mkdir(parents=True); shutil.copy(MINI / "config.json", empty / "config.json")
    for s in R.PAGE_SECTIONS:
        seen = _looked_at(s.render, full) + _looked_at(s.render, empty)
        assert seen, s.title                                            # the tracer saw the renderer look for its files
        assert not undeclared(seen, s.files), (s.title, undeclared(seen, s.files), s.files)
    with names_looked_at(full / "report") as seen: S.scorecard([full])
    assert {"localization_summary.csv", "resurfacing.csv"} <= set(seen)
    assert not undeclared(seen, R.report_patterns()), undeclared(seen, R.report_patterns())
    sneaky = R.Section(
        "x", ("e10",), ("x.csv",), lambda rep: [R.table(pd.read_csv(rep / "data_sizes.csv"))] + R._fig(rep, "y.png", "")
    )
    assert undeclared(_looked_at(sneaky.render, full), sneaky.files) == ["data_sizes.csv", "y.png"]
    assert undeclared(["a/x.csv", "*.csv", "x.csv"], ["x.csv"]) == ["*.csv", "a/x.csv"]


def _written_names(code: str) -> list[str]:
    "The file names given to write_report_file in `code`, each `{...}` of an f-string as 'x'."
    return [re.sub(r"\{[^}]*\}", "x", q) for q in re.findall(r'write_report_file\(store, f?"([^"]+)"', code)]


def test_experiments_write_report_files_through_the_helper():
    """No experiment notebook writes a file itself (to_csv, savefig, write_text); each names its report files literally,
    and each name is declared by the section of the experiment that writes it (e99 writes the page through
    write_report)."""
    written = {}
    for nb in sorted((HERE.parent / "nbs" / "experiments").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        assert not re.search(r"\.(to_csv|to_parquet|savefig|write_text|write_bytes)\(|\bopen\(", code), nb.name
        # a literal name in every call
        assert code.count("write_report_file(") == len(_written_names(code)), nb.name
        written[nb.stem] = _written_names(code)
    assert _written_names('write_report_file(store, f"table2_{f}.csv", t, index=True)') == ["table2_x.csv"]
    assert written.pop("e99_report") == [] and all(written.values()), written
    for stem, names in written.items():
        own = [p for s in R.PAGE_SECTIONS if stem[:3] in s.experiments for p in s.files]
        assert not undeclared(names, own), (stem, undeclared(names, own))


def test_write_report_file(tmp_path):
    """CSV and PNG bytes as to_csv and savefig write them to a file; atomic (no temp file left).
    Undeclared and page names refused."""
    import seaborn as sns
    run = tmp_path / "run"
    t = pd.read_csv(MINI / "report" / "table2_email_address.csv", index_col=[0, 1])
    t.to_csv(tmp_path / "direct.csv")
    assert (
        R.write_report_file(run, "table2_email_address.csv", t, index=True).read_bytes()
        == (tmp_path / "direct.csv").read_bytes()
    )
    g = sns.relplot(
        data=pd.DataFrame({"step": [0, 1, 2], "loss": [3.0, 2.0, 2.5]}), x="step", y="loss", kind="line", height=2
    )
    g.savefig(tmp_path / "direct.png", dpi=60)
    assert (
        R.write_report_file(run, "unlearning_logs.png", g, dpi=60).read_bytes()
        == (tmp_path / "direct.png").read_bytes()
    )
    plt.close(g.figure)
    assert sorted(p.name for p in (run / "report").iterdir()) == ["table2_email_address.csv", "unlearning_logs.png"]
    for name in ("notes.csv", "index.html", "scorecard.csv", "../table2_email_address.csv"):
        with pytest.raises(ValueError, match=r"declared by no registered section.*table2_\*\.csv"):
            R.write_report_file(run, name, t)
    with pytest.raises(ValueError, match="write a DataFrame as .csv"): R.write_report_file(run, "utility_base.png", t)
    with pytest.raises(ValueError, match=r"with \['dpi'\]"): R.write_report_file(run, "data_sizes.csv", t, dpi=90)
    with pytest.raises(ValueError, match="the page's own files"):
        R.register_section("x", ("e10",), ("*.html",), lambda rep: [])
    assert "x" not in [s.title for s in R.PAGE_SECTIONS]


def _separation(remind: pd.DataFrame, half_width: float) -> pd.DataFrame:
    """A remind_separation_<field>.csv as e05 writes it: REMIND's fair multi-class AUCs of a remind_<field>.csv (the
    mini fixture keeps REMIND's rows only) against a made-up best baseline at 50, 53, 56, ... %, every interval ±
    `half_width`."""
    t = remind[(remind.input == "orig") & (remind.protocol == "fair")]
    rows = []
    for i, (m, d) in enumerate(t.groupby("model", sort=False)):
        b = 50.0 + 3 * i
        for k in ("lr", "rf"):
            r = d[d.detector == f"remind_{k}"].multi.iloc[0]
            sep = abs(r - b) > 2 * half_width
            rows.append(
                dict(
                    model=m, input="orig", classifier=k, comparison="multi", remind_auc=r, remind_lo=r - half_width,
                    remind_hi=r + half_width, baseline="min_k", baseline_auc=b, baseline_lo=b - half_width,
                    baseline_hi=b + half_width, separated=sep,
                    verdict="intervals overlap" if not sep else "REMIND ahead" if r > b else "baseline ahead")
            )
    return pd.DataFrame(rows)


def test_remind_intervals_on_the_page(tmp_path):
    """e05's separation file reaches the REMIND section: per model REMIND LR / RF and the best fair baseline as 'AUC
    [lo, hi]', the verdict per classifier, and how many models LR leads and separates on; the interval file gives the
    scorecard's REMIND RF its interval."""
    run = _copy_run(tmp_path / "mini")
    rep = run / "report"
    sep = _separation(pd.read_csv(rep / "remind_phone_number.csv"), 2.0)
    sep.to_csv(rep / "remind_separation_phone_number.csv", index=False)
    # the interval file as e05 writes it (here REMIND's two detectors only): not a Table 1 file
    ci = sep.assign(detector="remind_" + sep.classifier, auc=sep.remind_auc, auc_lo=sep.remind_lo, auc_hi=sep.remind_hi)
    ci[["model", "input", "detector", "comparison", "auc", "auc_lo", "auc_hi"]].to_csv(
        rep / "remind_ci_phone_number.csv", index=False)
    page = R.write_report([run]).read_text()
    assert assert_report_matches_csvs(run) > 300
    # the scorecard carries REMIND RF's interval from it, and its verdict cells are judged on it
    card = S.scorecard([run])
    rf = sep[sep.classifier == "rf"].set_index("model")
    got = card[card.field == "phone_number"].set_index("method").remind_auc_rf_ci
    both = [m for m in got.index if m in rf.index]          # the scorecard's methods (REMIND also scores `base`, ...)
    assert len(both) >= 3 and "none" in both
    bounds = {m: [float(x) for x in got[m].strip("[]").split(",")] for m in both}   # "[lo, hi]", plain decimals
    assert bounds == {m: pytest.approx([rf.remind_lo[m], rf.remind_hi[m]], abs=1e-4) for m in both}
    cells = R.verdict_cells(card).merge(card[["field", "method"]], left_on="row", right_index=True)
    judged = cells[(cells.column == "remind_auc_rf") & (cells.field == "phone_number") & (cells.method != "none")]
    assert len(judged) == len(both) - 1 and S.NO_INTERVAL not in set(judged.verdict) and (judged.se > 0).all()
    t = next(t for t in read_html_tables(page) if "REMIND LR % [95% CI]" in t.columns).set_index("model")
    assert list(t.index) == list(dict.fromkeys(sep.model))
    for _, r in sep.iterrows():
        assert (
            t.at[r.model, f"REMIND {r.classifier.upper()} % [95% CI]"]
            == f"{r.remind_auc:.1f} [{r.remind_lo:.1f}, {r.remind_hi:.1f}]"
        )
        assert t.at[r.model, f"{r.classifier.upper()} vs baseline"] == r.verdict
        assert (
            t.at[r.model, "best fair baseline % [95% CI]"]
            == f"{r.baseline} {r.baseline_auc:.1f} [{r.baseline_lo:.1f}, {r.baseline_hi:.1f}]"
        )
    lr = sep[sep.classifier == "lr"]
    assert 0 < lr.separated.sum() < len(lr)                                      # the fixture has both verdicts
    n = lambda v: (lr.verdict == v).sum()
    assert (
        f"REMIND LR is ahead of the best fair baseline on {(lr.remind_auc > lr.baseline_auc).sum()} of {len(lr)} "
        f"models; its 95 % interval (bootstrap over profiles) lies above the baseline's on {n('REMIND ahead')}, below "
        f"on {n('baseline ahead')}, and overlaps it (no reading either way) on {n('intervals overlap')}"
    ) in html.unescape(h2_sections(page)["REMIND: residual memorization"])
    # email_address has no intervals: no table
    assert sum("REMIND LR % [95% CI]" in t.columns for t in read_html_tables(page)) == 1


def test_headline_table_known_answer():
    """The verdict, the page's headline table: at most 12 columns, 'value [95 % interval]' per cell (binomial over the
    profiles for a share), 'not testable at this n' where the difference's interval spans both outcomes, and a line
    under it with the n and the minimum detectable difference."""
    card = pd.DataFrame({"field": "f", "method": ["none", "a", "b"], "forget_em": [90.0, 10.0, 85.0],
                         "forget_profiles": 100.0, "retain_em": [80.0, 79.0, 81.0], "retain_profiles": 10.0})
    t, cls = R.verdict_table(card)
    assert len(t.columns) <= 12
    # 90 % of 100 profiles: q = 91/102, se = 100·sqrt(q(1 − q)/102) = 3.071, ± 1.96·se = ± 6.02
    assert t["forget EM ↓"].tolist() == ["90.0 [84.0, 96.0]", "10.0 [4.0, 16.0]",
                                         "85.0 [77.9, 92.1]\nnot testable at this n"]
    assert cls["forget EM ↓"].tolist() == ["ref", "better", "untestable"]
    # 10 retain profiles: every difference of a point or two is not testable
    assert all(v.endswith("not testable at this n") for v in t["retain EM ↑"][1:])
    # the MDD of a difference to none: (1.96 + 0.84)·√2·3.071 = 12.2 for a; 13.3 for b (se 3.60 at 85 %)
    assert R.verdict_footer(card) == [
        "f: n = 100 forget profiles, 10 retain profiles. Minimum detectable difference to the reference (5 % "
        "two-sided, 80 % power): forget EM 12.2–13.3; retain EM 49.2–49.8."]
    html_ = R.render_html([R.table(t, "verdict", cls)])
    assert "85.0 [77.9, 92.1]<br>not testable at this n" in html_
    assert R.read_html_tables(html_)[0].equals(t)                              # the line break reads back


def test_long_table_collapsed_empty_figure_left_out_markdown_rendered(tmp_path):
    """A table over `LONG_TABLE` rows shows its headline rows, all of them one click away; the Jaccard heatmap with no
    leaked profile is left out with a sentence; the prose's `code` is rendered, no backtick left."""
    long = pd.DataFrame({"method": [f"m{i // 8}" for i in range(160)], "test": ["quant4_recovery", *"abcdefg"] * 20,
                         "value": np.arange(160) / 160})
    blocks = R.collapsed(long, long.test == "quant4_recovery", "the table", "robustness_f.csv")
    page = R.render_html(blocks)
    shown, full = R.read_html_tables(page)
    assert len(shown) == 20 and set(shown.test) == {"quant4_recovery"} and len(full) == 160
    assert re.search(r"<details><summary>All 160 rows of the table \(also in robustness_f.csv\)</summary><div", page)
    assert page.index("<details>") > page.index("</table>")                  # the headline rows first, unfolded
    assert len(R.collapsed(long.head(R.LONG_TABLE), long.head(R.LONG_TABLE).test == "x", "t")) == 1   # short: as is

    run = _copy_run(tmp_path / "mini")
    page = R.write_report([run]).read_text()
    assert "data:image/png" in page.split("Fig. 5b analogue, email_address")[0][-2000:]     # leaked: shown
    labels = ["none", "npo"]
    pd.DataFrame(np.nan, index=labels, columns=labels).to_csv(run / "report" / "resurfacing_jaccard_email_address.csv")
    page = R.write_report([run]).read_text()
    assert assert_self_contained(page, run / "report") == len(FIGURES)                   # one figure fewer
    assert re.search(r'<p class="omitted">Fig. 5b analogue, email_address: left out. No forget profile leaked', page)
    assert "Jaccard overlap of leaked profiles" not in page
    prose = re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)
    assert "`" not in prose and "<code>none</code>" in prose
    assert '<a href="scorecard.csv">scorecard.csv</a>' in page and (run / "report" / "scorecard.csv").is_file()
