"""Results pages (`pipeline.presentation.results`): every number in a page's tables equals its CSV cell after the page's
rounding, the header names command, commit, date, machine and seeds, runs without a scorecard say so, sweeps get one
table over their points, and the page is written atomically, by `python -m lume_lab.pipeline.presentation.results` and
`make results` too."""
import json, math, re, shutil, subprocess, sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from lume_lab.pipeline.presentation import results as RS
from lume_lab.pipeline.presentation.report import reproduce_command
from lume_lab.pipeline.orchestration.sweep import read_spec
from results_checks import assert_header, assert_results_match_csvs

HERE = Path(__file__).parent
REPO = HERE.parent
MINI = HERE / "data" / "mini_run"     # the CSVs, config and manifest of `make run`'s mini run (see test_report.py)


def _copy_run(dst: Path, seed: int = 0, shift: float = 0.0) -> Path:
    """The mini run under another name and seed, its table2 values moved by `shift` × a per-cell pattern.
    So seeds differ."""
    shutil.copytree(MINI, dst)
    cfg = json.loads((dst / "config.json").read_text()); cfg["seed"] = seed
    (dst / "config.json").write_text(json.dumps(cfg))
    man = json.loads((dst / "manifest.json").read_text()); man.update(seed=seed, run_id=dst.name)
    man["experiments"] = {
        "e02_inject": {"status": "done", "seconds": 992.4 + seed},
        "e03_unlearn": {"status": "done", "seconds": 557.05},
    }
    (dst / "manifest.json").write_text(json.dumps(man))
    for p in (dst / "report").glob("table2_*.csv"):
        t = pd.read_csv(p)
        methods = [c for c in t.columns if c not in ("split", "metric", "n_profiles", "n_rows")]
        t[methods] = t[methods] + shift * np.arange(t[methods].size).reshape(t[methods].shape) % 7 / 3
        t.to_csv(p, index=False)
    return dst


def _tables(page: str) -> dict:
    return {h: t for h, t in RS.read_markdown_tables(page)}


def test_mini_page_numbers_equal_the_csvs(tmp_path):
    """One real run (2 fields × 11 methods, e03–e06 files):
    every scorecard and stage-time number is its CSV cell, rounded as shown."""
    run = _copy_run(tmp_path / "mini")
    path = RS.write_results([run], "mini", tmp_path / "docs" / "results")
    assert path == tmp_path / "docs" / "results" / "mini.md"
    page = path.read_text()
    # 22 rows × (9 output + n + paper + AUC + REMIND + leak columns)
    assert assert_results_match_csvs(page, [run]) > 500
    t = _tables(page)
    assert list(t) == [("Headline",), ("Scorecard", "phone_number"), ("Scorecard", "email_address"),
                       ("Testbed", "Memorization and reach"),
                       # the config's field order
                       ("Testbed", "Utility around the injection"), ("Experiment times",), ("Stage times",)]
    # one cell by hand: phone_number, npo, forget EM is table2's (forget, em) cell at one decimal
    t2 = pd.read_csv(run / "report" / "table2_phone_number.csv", index_col=[0, 1])
    assert (
        t[("Scorecard", "phone_number")].set_index("method").at["npo", "forget EM"]
        == f"{t2.at[('forget', 'em'), 'npo']:.1f}"
    )
    assert path.read_text() == RS.results_page([run], "mini")      # regenerating gives the same page


def test_three_seeds_mean_std_and_n(tmp_path):
    """Three seeds of one config:
    each cell is mean ± sample std over the three CSVs, the n columns too, and a seeds column."""
    runs = [_copy_run(tmp_path / f"mini_s{s}", s, shift=s) for s in range(3)]
    page = RS.results_page(runs, "mini_seeds")
    assert assert_results_match_csvs(page, runs) > 1000
    card = _tables(page)[("Scorecard", "email_address")].set_index("method")
    vals = [
        pd.read_csv(r / "report" / "table2_email_address.csv", index_col=[0, 1]).at[("retain", "em"), "simnpo"]
        for r in runs
    ]
    assert np.std(vals) > 0.1                                      # the seeds differ there
    assert card.at["simnpo", "retain EM"] == f"{np.mean(vals):.1f} ± {np.std(vals, ddof=1):.1f}"
    assert card.at["simnpo", "seeds"] == "3" and " ± " in card.at["simnpo", "n forget (profiles / rows)"]
    st = _tables(page)[("Stage times",)]
    assert list(st.columns) == ["stage family", "mini_s0", "mini_s1", "mini_s2"]
    h = assert_header(page, runs)
    assert h["Seeds"] == "0, 1, 2" and h["Command"].startswith("one per run")
    for s in range(3): assert f"--seed {s} --run-id mini_s{s}" in page
    # another config is never averaged in: a scorecard refuses it, naming
    other = _copy_run(tmp_path / "other", 3)
    # the field,
    cfg = json.loads((other / "config.json").read_text()); cfg["unlearn"]["forget_fields"] = ["email_address"]
    (other / "config.json").write_text(json.dumps(cfg))            # and the page compares the two configs instead
    with pytest.raises(ValueError, match="unlearn.forget_fields"): RS.scorecard_lines([*runs, other])
    assert "unlearn.forget_fields" in _tables(RS.results_page([*runs, other], "x"))[("Configurations",)].field.tolist()


def test_header_names_command_commit_date_machine_seeds(tmp_path):
    """From the manifest: commit, creation date, software.
    The machine is the run's host when recorded, else this one, labelled."""
    run = _copy_run(tmp_path / "mini")
    man = json.loads((run / "manifest.json").read_text())
    page = RS.results_page([run], "mini")
    h = assert_header(page, [run])
    assert h["Command"] == f"`{reproduce_command(run)}`" and h["Command"].startswith("`lume-lab run --preset mini "
                                                                                     "--seed 0 --run-id mini")
    assert h["Commit"] == f"`{man['git_commit']}`"
    assert h["Date"].startswith(man["created"][:10]) and man["created"] in h["Date"]
    assert (
        "not recorded by the run; this page was generated on" in h["Machine"]
        and f"torch {man['versions']['torch']}" in h["Machine"]
    )
    man["host"] = {"cpu": "Test CPU 9000", "cores": 2}
    (run / "manifest.json").write_text(json.dumps(man))
    h = assert_header(RS.results_page([run], "mini", command="make run"), [run])
    assert h["Command"] == "`make run`" and h["Machine"].startswith("cpu Test CPU 9000, cores 2;")
    assert not re.search(r"/(work|home|scratch)/", page)           # no path of this machine in the page


def test_checker_catches_a_wrong_number(tmp_path):
    "The check fails on a page whose cell differs from the CSV by one shown digit, or that drops a row."
    run = _copy_run(tmp_path / "mini")
    page = RS.results_page([run], "mini")
    t2 = pd.read_csv(run / "report" / "table2_email_address.csv", index_col=[0, 1])
    v = f"{t2.at[('forget', 'em'), 'none']:.1f}"
    row = next(l for l in page.splitlines() if l.startswith("| none |") and f"| {v} |" in l)
    bad = page.replace(row, row.replace(f"| {v} |", f"| {float(v) + 0.1:.1f} |", 1))
    with pytest.raises(AssertionError): assert_results_match_csvs(bad, [run])
    with pytest.raises(AssertionError): assert_results_match_csvs(page.replace(row + "\n", ""), [run])
    lines = page.splitlines()
    stage = next(i for i, l in enumerate(lines) if l.startswith("| base |"))
    lines[stage] = "| base | 999.9 |"
    with pytest.raises(AssertionError): assert_results_match_csvs("\n".join(lines), [run])


def test_mean_against_median_rows_are_the_trajectories(tmp_path):
    """A run whose trajectories record the median NLL: its page shows, per method, where the mean and the median cross
    their own levels, and the independent check recomputes each cell from trajectory.csv and fails on a changed one.
    A trajectory with the mean alone is left out."""
    run = _copy_run(tmp_path / "mini")
    f, nan = "phone_number", math.nan
    pd.DataFrame({"field": f, "method": ["npo", "simnpo"], "operating_point": ["reached @ step 2", "reached @ step 2"],
                  "rule": "never_trained", "status": "reached", "step": [2, 2], "crossing_step": [2, 2],
                  "n_before": [1, 1], "coarse": True, "every": 1, "note": ""}).to_csv(
        run / "report" / f"operating_points_{f}.csv", index=False)
    traj = {"step": range(5), "report_em": [90.0, 61.0, 32.0, 20.0, 10.0], "retain_em": [95.0, 94.0, 93.0, 92.0, 91.0],
            "choose_nll": [0.1, 1.0, 3.0, 4.0, 5.0], "holdout_nll": [2.5, nan, nan, nan, nan]}
    both = {**traj, "choose_nll_median": [0.05, 0.5, 1.0, 2.6, 4.0], "holdout_nll_median": [2.4, nan, nan, nan, nan]}
    for m, t in (("npo", both), ("simnpo", traj)):
        (run / f"unlearn_{m}_{f}").mkdir()
        pd.DataFrame(t).to_csv(run / f"unlearn_{m}_{f}" / "trajectory.csv", index=False)
    page = RS.results_page([run], "mini")
    t = _tables(page)[("Operating point: mean against median", f)]
    assert t[["run", "method", "mean: crosses", "median: crosses", "median: forget EM"]].values.tolist() == [
        ["mini", "npo", "step 2", "step 3", "20.0"]]
    assert assert_results_match_csvs(page, [run]) > 0
    with pytest.raises(AssertionError): assert_results_match_csvs(page.replace("| step 3 |", "| step 4 |"), [run])
    with pytest.raises(AssertionError): assert_results_match_csvs(page.replace("| 20.0 |", "| 10.0 |"), [run])


def test_run_without_scorecard_says_so(tmp_path):
    """A run with no e03–e06 tables:
    a bold line under the title and in the scorecard section, the stage table still there."""
    run = _copy_run(tmp_path / "early")
    for p in (run / "report").glob("*.csv"):
        if p.stem.startswith(("table2_", "localization_", "remind_", "resurfacing")): p.unlink()
    page = RS.write_results([run], "early", tmp_path / "out").read_text()
    assert page.splitlines()[2] == RS.NO_SCORECARD_BANNER
    assert "**No scorecard.** early has no scorecard table yet" in page
    assert [h for h, _ in RS.read_markdown_tables(page)] == [
        ("Testbed", "Memorization and reach"),
        ("Testbed", "Utility around the injection"),
        # e02's testbed is there before any scorecard
        ("Experiment times",),
        ("Stage times",),
    ]
    assert_results_match_csvs(page, [run])


def _sweep(root: Path, seeds=(0, 1), grid=True) -> Path:
    """A sweep directory as `lume-lab sweep` leaves it:
    points (copies of the mini run), sweep.yaml, points.csv, sweep.csv."""
    d, points, rows = root / ("lr" if grid else "mini_seeds"), [], []
    lrs = [1e-4, 3e-4] if grid else [None]
    for i, (lr, seed) in enumerate((lr, s) for lr in lrs for s in seeds):
        name = (f"unlearn.hparams.npo.lr={lr},seed={seed}" if grid else f"seed={seed}")
        run = _copy_run(d / name, seed, shift=i)
        points.append(
            {
                "point": name, **({"unlearn.hparams.npo.lr": json.dumps(lr)} if grid else {}), "seed": seed,
                "status": "done", "seconds": 12.25 + i, "error": ""}
        )
        m = pd.read_csv(run / "report" / "table2_email_address.csv")
        for _, r in m[m.split.isin(["forget", "retain"])].iterrows():
            rows += [
                {
                    "point": name, **({"unlearn.hparams.npo.lr": lr} if grid else {}), "seed": seed,
                    "source": "report/table2_email_address.csv", "split": r.split, "metric": r.metric,
                    "n_profiles": r.n_profiles + i, "npo": r.npo, "none": r["none"]}
            ]
    spec = {
        "name": d.name,
        "preset": "mini",
        "seeds": list(seeds),
        "collect": ["report/table2_*.csv"],
        **(
            {
                "grid": {"unlearn.hparams.npo.lr": lrs},
                "plot": {"y": "npo", "where": {"metric": "em", "split": ["forget", "retain"]}},
            }
            if grid
            else {}
        ),
    }
    (d / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    pd.DataFrame(points).to_csv(d / "points.csv", index=False)
    pd.DataFrame(rows).to_csv(d / "sweep.csv", index=False)
    return d


def test_sweep_page_one_table_over_points(tmp_path):
    """A grid sweep:
    one row per point, one column per category of the plotted value, n per column, mean ± std over seeds."""
    d = _sweep(tmp_path)
    page = RS.write_results(d, "npo_lr", tmp_path / "out").read_text()
    assert assert_results_match_csvs(page, d) > 10
    t = _tables(page)
    assert list(t) == [("Points",), ("Points", "n (n_profiles)"), ("Points", "Mean ± std over seeds")]
    pts = t[("Points",)]
    assert list(pts.columns) == ["point", "unlearn.hparams.npo.lr", "seed", "status", "seconds", "forget", "retain"]
    # points.csv's seconds, one decimal
    assert len(pts) == 4 and pts.seconds.tolist() == ["12.2", "13.2", "14.2", "15.2"]
    assert "`npo` of `report/table2_*.csv` where metric = em; split in forget, retain" in page and "## Spec" in page
    lines = page.splitlines()                                       # and the check would see a changed value
    i = next(i for i, l in enumerate(lines) if l.startswith("| unlearn.hparams.npo.lr=0.0001,seed=0 |"))
    cells = lines[i].split(" | "); cells[5] = f"{float(cells[5]) + 1:.1f}"
    lines[i] = " | ".join(cells)
    with pytest.raises(AssertionError): assert_results_match_csvs("\n".join(lines), d)


def test_seeds_sweep_is_a_scorecard_over_its_points(tmp_path):
    """`lume-lab run --seeds` leaves a sweep of seeds only:
    its page is the scorecard over the finished points, with the --seeds command."""
    d = _sweep(tmp_path, seeds=(0, 1, 2), grid=False)
    kind, runs = RS.results_sources([d])
    assert kind == "seeds" and [r.name for r in runs] == ["seed=0", "seed=1", "seed=2"]
    page = RS.results_page([d], "mini_seeds")
    assert assert_results_match_csvs(page, [d]) > 1000
    # then the --set of its config
    assert "- **Command**: `lume-lab run --preset mini --seeds 0,1,2 --run-id mini_seeds" in page


def test_bad_input_is_refused(tmp_path):
    "Not a run, a sweep mixed with runs, a bad name: a clear error, and nothing written."
    run, d = _copy_run(tmp_path / "mini"), _sweep(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a run directory"): RS.results_page([tmp_path / "nope"], "x")
    with pytest.raises(ValueError, match="a sweep gets a page of its own"): RS.results_page([run, d], "x")
    with pytest.raises(ValueError, match="name must be"): RS.write_results([run], "a/b", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_failed_write_keeps_the_previous_page(tmp_path, monkeypatch):
    "The page is rendered before anything is written and replaced in one rename: a failure leaves the old page intact."
    run, out = _copy_run(tmp_path / "mini"), tmp_path / "out"
    old = RS.write_results([run], "mini", out).read_text()
    monkeypatch.setattr(RS, "stage_lines", lambda dirs: 1 / 0)
    with pytest.raises(ZeroDivisionError): RS.write_results([run], "mini", out)
    # the page, its full scorecard beside it and the folder's index (written after it), nothing else
    assert (out / "mini.md").read_text() == old and sorted(p.name for p in out.iterdir()) == [
        "index.md", "mini.md", "mini_scorecard.csv"]


def test_module_cli_and_make_target(tmp_path):
    """`python -m lume_lab.pipeline.presentation.results` writes the page and prints its path; bad input exits 2.
    `make results` calls it."""
    run, out = _copy_run(tmp_path / "mini"), tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "lume_lab.pipeline.presentation.results", str(run), "--name", "mini", "--out", str(out)],
        capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out / "mini.md") and assert_results_match_csvs(out / "mini.md", [run]) > 500
    r = subprocess.run(
        [sys.executable, "-m", "lume_lab.pipeline.presentation.results", str(tmp_path / "nope"), "--name", "x"],
        capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.startswith("results: error: neither a run directory")
    r = subprocess.run(
        ["make", "-n", "results", f"RUNS={run}", "NAME=mini", f"RESULTS_OUT={out}"], capture_output=True, text=True,
        cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert f"-m lume_lab.pipeline.presentation.results {run} --name mini --out {out}" in r.stdout
    r = subprocess.run(["make", "-n", "results"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0 and "usage: make results" in r.stderr      # refused before anything runs


def test_sweep_command_names_the_repository_spec(tmp_path, monkeypatch):
    """A sweep that ran one of the repository's specs (sweeps/<name>.yaml, floats as the sweep reads them) names it.
    Another spec does not."""
    monkeypatch.chdir(REPO)
    for name in ("npo_lr", "mask_coverage"):
        d = tmp_path / name; d.mkdir()
        # as `lume-lab sweep` reads it
        spec = read_spec(REPO / "sweeps" / f"{name}.yaml")
        # and as run_sweep copies it
        (d / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        assert RS.sweep_command(d) == f"lume-lab sweep sweeps/{name}.yaml"
        (d / "sweep.yaml").write_text(yaml.safe_dump({**spec, "seeds": [7]}, sort_keys=False))
        assert RS.sweep_command(d).startswith("lume-lab sweep SPEC.yaml")


def test_lume_lab_results_subcommand(tmp_path, capsys):
    """`lume-lab results RUN --name N --out DIR` is the same entry: the page, its path printed.
    A missing run exits 2, nothing written."""
    from lume_lab.pipeline.orchestration.cli import main
    run, out = _copy_run(tmp_path / "mini"), tmp_path / "out"
    assert main(["results", str(run), "--name", "mini", "--out", str(out)]) == 0
    assert (
        capsys.readouterr().out.strip() == str(out / "mini.md")
        and assert_results_match_csvs(out / "mini.md", [run]) > 500
    )
    assert main(["results", str(tmp_path / "nope"), "--name", "x", "--out", str(out)]) == 2
    assert "neither a run directory" in capsys.readouterr().err and not (out / "x.md").exists()


def _add_stress_files(run: Path) -> None:
    """e10's recoveries, e05's interval verdicts and e11's dose summary for the email field, in their file formats.
    The values are made up."""
    rep, f = run / "report", "email_address"
    rows = [
        {"method": m, "test": t, "value": v, "lo": np.nan, "hi": np.nan, "n": 4, "note": "", "field": f}
        for m, v in (("npo", 0.62), ("oracle_grad", 0.04))
        for t in ("quant4_recovery", "quant8_recovery", "relearn_forget_half_recovery")
    ]
    rows.append(
        {
            "method": "npo", "test": "relearn_retain_only_recovery", "value": np.nan, "n": 4,
            "note": "unlearning removed < 5 EM points", "field": f}
    )
    rows += [
        {"method": m, "test": t, "value": v, "n": 4, "note": "forget EM (%)", "field": f}
        for m, t, v in (
            ("none", "forget_em", 91.25), ("none", "quant4_forget_em", 80.0), ("npo", "forget_em", 12.5),
            ("npo", "quant4_forget_em", 13.75), ("none", "q4_1_off16_forget_em", 66.25),
            ("npo", "q4_1_off16_forget_em", 21.25))
    ]
    pd.DataFrame(rows).to_csv(rep / f"robustness_{f}.csv", index=False)
    pd.DataFrame(
        {
            "model": ["npo", "npo", "oracle_grad", "oracle_grad"], "input": "orig", "comparison": "multi",
            "classifier": ["lr", "rf"] * 2, "remind_auc": [81.0, 70.0, 60.0, 55.0],
            "baseline_auc": [70.0, 71.0, 58.0, 56.0],
            "verdict": ["REMIND ahead", "intervals overlap", "intervals overlap", "baseline ahead"]}
    ).to_csv(rep / f"remind_separation_{f}.csv", index=False)
    pd.DataFrame(
        {
            "field": f, "p": [0.5, 1.0, 1.0], "r": [1.0, 1.0, 0.5], "size_over_mF": [2.0, 1.0, 0.5],
            "precision": [0.5, 1.0, 1.0], "recall": [1.0, 1.0, 0.5], "seeds": 3, "forget_em": [40.0, 10.04, 20.0],
            "forget_em_sd": [5.0, 1.0, 2.0], "quant4_recovery": [0.5, np.nan, 0.25],
            "quant4_recovery_sd": [0.1, np.nan, np.nan]}
    ).to_csv(rep / f"dose_summary_{f}.csv", index=False)


def test_stress_sections_match_their_csvs(tmp_path):
    """A run with e10, e05-interval and e11 files: the scorecard's recovery columns, the REMIND-interval counts and the
    dose table are their CSV cells; one changed count, dose cell or recovery fails the check."""
    run = _copy_run(tmp_path / "mini")
    _add_stress_files(run)
    page = RS.results_page([run], "mini")
    n = assert_results_match_csvs(page, [run])
    t = _tables(page)
    assert ("REMIND intervals", "email_address") in t and ("Dose-response", "email_address", "mini") in t
    q = t[("Quantized forget EM", "email_address")].set_index("method")
    assert (
        q.at["none", "forget EM, 4-bit"] == "80.0"
        and q.at["npo", "forget EM"] == "12.5"
        and q.at["npo", "forget EM, Q4_1 from column 16"] == "21.2"
    )
    card = t[("Scorecard", "email_address")].set_index("method")
    assert card.at["npo", "4-bit recovery"] == "0.62" and card.at["npo", "retain-only recovery"] == ""
    dose = t[("Dose-response", "email_address", "mini")]
    assert dose["forget EM"].tolist() == ["40.0 ± 5.0", "10.0 ± 1.0", "20.0 ± 2.0"] and dose[
        "4-bit recovery"
    ].tolist() == ["0.50 ± 0.10", "", "0.25"]
    for old, new in (
        ("| 20.0 ± 2.0 |", "| 21.0 ± 2.0 |"), ("| REMIND LR | 2 | 2 | 1 |", "| REMIND LR | 2 | 1 | 1 |"),
        ("| 0.62 |", "| 0.52 |"), ("| npo | 1 | 12.5 |", "| npo | 1 | 12.6 |"), ("| 13.8 | 21.2 |", "| 13.8 | 22.2 |"),
        ("| 0.5 | 1 | 2.000 |", "| 0.5 | 1 | 1.000 |")):
        assert old in page, old
        with pytest.raises(AssertionError):
            assert_results_match_csvs(page.replace(old, new, 1), [run])
    assert n > 500


def test_testbed_section_matches_its_files(tmp_path):
    """The testbed section: per run and field, memorized / profiles, the rate per hour of masked injection, the
    testbed's split sizes and the reach as % of trained accuracy are their files' values; a changed count, size or share
    fails the check."""
    run = _copy_run(tmp_path / "mini")
    pd.DataFrame(
        {
            "field": "phone_number", "kind": ["trained", "fresh", "paraphrase"], "profiles": 35, "prompts": 70,
            "accuracy": [75.0, 4.3, 1.4], "vs_trained": [1.0, 0.0573, 0.0187], "model": "masked"}
    ).to_csv(run / "report" / "reachability.csv", index=False)
    (run / "testbed").mkdir()
    (run / "testbed" / "testbed.json").write_text(
        json.dumps(
            {
                "counts": [
                    {"split": "forget_phone_number", "field": "phone_number", "profiles": 16},
                    {"split": "retain_phone_number", "field": "drivers_license", "profiles": 9},
                ]
            }
        )
    )
    man = json.loads((run / "manifest.json").read_text())
    man["stages"]["inject_masked"] = {"status": "done", "seconds": 720.0}
    (run / "manifest.json").write_text(json.dumps(man))
    page = RS.results_page([run], "mini")
    assert assert_results_match_csvs(page, [run]) > 500
    tb = _tables(page)[("Testbed", "Memorization and reach")].set_index("field")
    ext = pd.read_csv(run / "report" / "extraction_rates.csv").query("model == 'masked'").set_index("field")
    assert (
        tb.at["phone_number", "memorized / profiles"]
        == f"{ext.at['phone_number', 'memorized']} / {ext.at['phone_number', 'profiles']}"
    )
    # 720 s is a fifth of an hour
    assert tb.at["phone_number", "memorized per hour"] == f"{5 * ext.at['phone_number', 'memorized']:.0f}"
    assert tb.loc[
        "phone_number",
        ["forget profiles", "retain profiles", "trained EM", "fresh, % of trained", "paraphrase, % of trained"],
    ].tolist() == ["16", "9", "75.0", "6", "2"]
    assert tb.loc["email_address", ["forget profiles", "trained EM"]].tolist() == ["", ""]
    row = next(l for l in page.splitlines() if l.startswith("| mini | phone_number |"))
    for old, new in (
        ("| 16 | 9 |", "| 17 | 9 |"),
        ("| 75.0 | 6 | 2 |", "| 75.0 | 6 | 3 |"),
        (f"| {5 * ext.at['phone_number', 'memorized']:.0f} |", "| 1 |"),
    ):
        assert old in row, (old, row)
        with pytest.raises(AssertionError):
            assert_results_match_csvs(page.replace(row, row.replace(old, new, 1), 1), [run])


def test_runs_of_two_configs_get_one_scorecard_each(tmp_path):
    """Runs of two configs on one page: a table of the fields that differ, then each config's own scorecard (two seeds
    averaged, the third run alone), every number its CSV's; a scorecard over both configs is never written, and a
    swapped cell fails."""
    a0, a1 = _copy_run(tmp_path / "a_s0", 0), _copy_run(tmp_path / "a_s1", 1, shift=1)
    b = _copy_run(tmp_path / "b", 0, shift=2)
    cfg = json.loads((b / "config.json").read_text()); cfg["inject"]["mask_fraction"] = 0.05
    (b / "config.json").write_text(json.dumps(cfg))
    page = RS.results_page([a0, b, a1], "compare")
    assert assert_results_match_csvs(page, [a0, b, a1]) > 500
    t = _tables(page)
    assert t[("Configurations",)].values.tolist() == [["inject.mask_fraction", "0.2", "0.05"]]
    assert [h for h in t if h[0].startswith("Scorecard")] == [
        ("Scorecard: a_s0, a_s1", "phone_number"), ("Scorecard: a_s0, a_s1", "email_address"),
        ("Scorecard: b", "phone_number"), ("Scorecard: b", "email_address")]
    assert (
        t[("Scorecard: a_s0, a_s1", "phone_number")].seeds.eq("2").all()
        and "seeds" not in t[("Scorecard: b", "phone_number")]
    )  # b: one run
    with pytest.raises(ValueError, match="one config only"): RS.scorecard_lines([a0, b])
    sa, sb = page.index("## Scorecard: a_s0, a_s1"), page.index("## Scorecard: b")
    first, second = page[sa:sb], page[sb:page.index("\n## ", sb + 5)]
    row = lambda sec: next(l for l in sec.splitlines() if l.startswith("| npo |"))
    a_cells, b_cells = row(first).split(" | "), row(second).split(" | ")
    assert len(a_cells) == len(b_cells) + 1                       # a has a seeds column, b does not
    forged = " | ".join([b_cells[0], *[c.split(" ± ")[0] for c in a_cells[2:]]])   # b's row given a's means: caught
    assert forged != row(second)
    with pytest.raises(AssertionError): assert_results_match_csvs(page.replace(row(second), forged, 1), [a0, b, a1])
    # a seed without control runs (`unlearn.controls`, a scope field) is averaged with the others; the checker agrees
    c = _copy_run(tmp_path / "a_s2", 2, shift=1)
    cfg = json.loads((c / "config.json").read_text()); cfg.setdefault("unlearn", {})["controls"] = False
    (c / "config.json").write_text(json.dumps(cfg))
    page = RS.results_page([a0, a1, c], "scope")
    assert "## Configurations" not in page and "- **`unlearn.controls`**" in page
    assert assert_results_match_csvs(page, [a0, a1, c]) > 500


# records of results pages (a findings page's records, `runs/findings*/`, are checked in test_findings.py)
RECORDS = sorted(p for p in (REPO / "docs" / "results" / "runs").glob("*") if p.is_dir()
                 and not p.name.startswith("findings"))


@pytest.mark.parametrize("home", RECORDS, ids=lambda p: p.name)
def test_committed_page_is_what_its_run_records_give(home):
    """A page written with `--archive` is made from the run records committed beside it (`docs/results/runs/<name>/`):
    made again from them, it is the committed page, and every number in it is its record's CSV cell."""
    recs = sorted(p for p in home.iterdir() if p.is_dir())
    page = (home.parents[1] / f"{home.name}.md").read_text()
    assert RS.results_page(recs, home.name) == page
    assert assert_results_match_csvs(page, recs) > 0


def test_some_page_has_its_run_records():
    "The records above exist in the repository (`.gitignore` keeps out only the repository root's runs/)."
    assert RECORDS
