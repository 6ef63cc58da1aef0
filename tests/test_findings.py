"""Findings page (`pipeline.presentation.findings`): one row per declared claim, verdicts only from the allowed set, a
claim whose experiment is missing says "not testable: no run" and names it, and each reader turns its CSV into the
verdict its interval implies; `python -m` and `make findings` write the page."""
import json, shutil, subprocess, sys
from pathlib import Path

import pandas as pd
import pytest

from lume_lab.pipeline.presentation import findings as F

HERE = Path(__file__).parent
REPO = HERE.parent
MINI = HERE / "data" / "mini_run"


def _verdicts(run_dirs) -> dict:
    t = F.findings_table(run_dirs)
    return dict(zip([c.id for c in F.CLAIMS], t.verdict))


def test_one_row_per_claim_on_the_mini_run(tmp_path):
    page = F.write_findings([MINI], tmp_path, command="make findings").read_text()
    table = [l for l in page.splitlines() if l.startswith("| ")]
    assert table[0].startswith("| claim | paper |") and len(table) == 1 + len(F.CLAIMS)
    t = F.findings_table([MINI])
    assert len(t) == len(F.CLAIMS) and set(t.verdict) <= set(F.VERDICTS)
    for h in ("- **Command**: `make findings`", "- **Commit**: `", "- **Date**: ", "- **Machine**: ", "- **Seeds**: 0"):
        assert h in page, h
    v = _verdicts([MINI])
    # the mini run has no e07, e08, e10, nor e05's separation table
    for cid, exp in (("pistol_degree", "e07"), ("lume_ga", "e08"), ("zhang_quant4", "e10"), ("hu_relearn", "e10"),
                     ("remind", "e05")):
        assert v[cid] == F.NO_RUN, cid
        row = t.iloc[[c.id for c in F.CLAIMS].index(cid)]
        assert row["to test it"].startswith(f"run {exp} (it writes ") and row["ours ± 95 % CI"] == "", cid
    assert v["lacuna_t2_oracle_grad"] == F.REPRODUCED


def test_readers_give_the_verdict_their_interval_implies(tmp_path):
    run = tmp_path / "run"; shutil.copytree(MINI, run); rep = run / "report"
    pd.DataFrame({"field": "phone_number", "method": ["grad_ascent", "npo", "grad_ascent", "alphaedit"],
                  "test": ["quant4_recovery", "quant4_recovery", "relearn_forget_half_recovery", "quant4_recovery"],
                  "value": [0.5, 0.4, 0.0, -0.9], "lo": [0.4, 0.3, -0.1, -1.0], "hi": [0.6, 0.5, 0.1, -0.8],
                  "n": 14, "note": ""}).to_csv(rep / "robustness_phone_number.csv", index=False)
    # both attacks fired on their positive control: their recoveries count (a claim reads none where they did not)
    pd.DataFrame({"attack": ["quant4", "relearn_forget_half"], "fired": [True, True]}).to_csv(
        rep / "attack_controls_phone_number.csv", index=False)
    pd.DataFrame({"model": ["none", "npo", "npo"], "input": "orig", "comparison": "multi", "classifier": "lr",
                  "remind_auc": [90.0, 60.0, 60.0], "remind_lo": [85.0, 55.0, 55.0], "remind_hi": [95.0, 65.0, 65.0],
                  "baseline": "loss", "baseline_auc": [50.0, 80.0, 80.0], "baseline_lo": [45.0, 75.0, 75.0],
                  "baseline_hi": [55.0, 85.0, 85.0]}).to_csv(rep / "remind_separation_phone_number.csv", index=False)
    pd.DataFrame({"method": ["npo", "dpo"], "ds_AB": [40.0, 30.0], "ds_AC": [20.0, 30.0]}).to_csv(
        rep / "pistol_degree_gap.csv", index=False)
    loc = pd.DataFrame({"field": "phone_number", "method": ["oracle_grad", "simnpo", "memflex", "alphaedit"],
                        "labels": "forget", "auc": [0.9, 0.51, 0.7, 0.52], "auc_lo": [0.85, 0.5, 0.65, 0.46],
                        "auc_hi": [0.95, 0.52, 0.75, 0.58], "n_profiles": 14, "lacuna_max_auc": 0.9})
    loc.to_csv(rep / "localization_summary.csv", index=False)
    v = _verdicts([run])
    assert v["zhang_quant4"] == F.REPRODUCED           # GA/NPO only: AlphaEdit's negative row is left out
    assert v["hu_relearn"] == F.NOT_TESTABLE           # [-0.1, 0.1] spans 0
    assert v["remind"] == F.REFUTED                    # npo: 60 vs 80, intervals 10 apart; `none` left out
    assert v["pistol_degree"] == F.NO_INTERVAL         # one DS per edge: a value, no interval
    assert (v["lacuna_f4b_oracle_grad"], v["lacuna_f4b_simnpo"], v["lacuna_f4b_memflex"], v["lacuna_f4b_alphaedit"]) \
        == (F.REPRODUCED, F.REPRODUCED, F.REFUTED, F.NOT_TESTABLE)
    t = F.findings_table([run]).set_index(pd.Index([c.id for c in F.CLAIMS]))
    assert t.at["pistol_degree", "ours ± 95 % CI"] == "10.0" and t.at["pistol_degree", "MDD"] == ""
    # MDD from the same standard error as the interval: (z.975 + z.8) / (2 z.975) of its width
    lo, hi = 0.85, 0.95
    assert t.at["lacuna_f4b_oracle_grad", "ours ± 95 % CI"] == f"0.900 [{lo:.3f}, {hi:.3f}]"
    assert t.at["lacuna_f4b_oracle_grad", "MDD"] == f"{F.mdd(F.se_from_interval(lo, hi)):.3f}"


def test_seeds_combine_and_configs_do_not(tmp_path):
    runs = []
    for s, gap in ((0, 10.0), (1, 14.0)):
        runs.append(r := tmp_path / f"s{s}"); shutil.copytree(MINI, r)
        pd.DataFrame({"method": ["npo"], "ds_AB": [20.0 + gap], "ds_AC": [20.0]}).to_csv(
            r / "report" / "pistol_degree_gap.csv", index=False)
    t = F.findings_table(runs)
    assert set(t.loc[t.verdict != F.NO_RUN, "seeds"]) == {"2"} and set(t.loc[t.verdict == F.NO_RUN, "seeds"]) == {"0"}
    # no interval in the CSV: two seeds give the between-seed one, std 2 sqrt(2) / sqrt(2) = 2 around 12
    row = t.iloc[[c.id for c in F.CLAIMS].index("pistol_degree")]
    assert row["ours ± 95 % CI"] == f"12.0 [{12 - 1.959964 * 2:.1f}, {12 + 1.959964 * 2:.1f}]"
    assert row.verdict == F.REPRODUCED
    cfg = json.loads((runs[1] / "config.json").read_text()); cfg["inject"]["mask_fraction"] = 0.05
    (runs[1] / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="combines seeds of one config"): F.findings_page(runs)


def test_module_cli_and_make_target(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "lume_lab.pipeline.presentation.findings", str(MINI), "--out", str(out)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out / "findings.md") and (out / "findings.md").read_text().startswith("# Findings")
    r = subprocess.run([sys.executable, "-m", "lume_lab.pipeline.presentation.findings", str(tmp_path / "nope")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.startswith("findings: error: neither a run directory")
    r = subprocess.run(["make", "-n", "findings", f"RUNS={MINI}", f"OUT={out}"], capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == 0 and f"-m lume_lab.pipeline.presentation.findings {MINI} --out {out}" in r.stdout
    r = subprocess.run(["make", "-n", "findings", f"RUNS={MINI}"], capture_output=True, text=True, cwd=REPO)
    assert "--out docs/results" in r.stdout and "--name" not in r.stdout   # not gpu-check's OUT default
    r = subprocess.run(["make", "-n", "findings", f"RUNS={MINI}", "NAME=findings-mini"], capture_output=True, text=True,
                       cwd=REPO)
    assert f"-m lume_lab.pipeline.presentation.findings {MINI} --name findings-mini --out docs/results" in r.stdout
    r = subprocess.run(["make", "-n", "findings"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode != 0 and "usage: make findings" in r.stderr


@pytest.mark.parametrize("home", sorted((REPO / "docs" / "results" / "runs").glob("findings*")), ids=lambda p: p.name)
def test_committed_findings_page_is_what_its_run_records_give(home):
    "A findings page written with `--archive` is what the run records committed beside it give, made again."
    recs = sorted(p for p in home.iterdir() if p.is_dir())
    assert F.findings_page(recs) == (home.parents[1] / f"{home.name}.md").read_text()
