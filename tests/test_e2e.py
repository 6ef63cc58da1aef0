"""README's quick start (`make run PRESET=smoke`), then the companions on the same run: every experiment notebook end to
end through `lume-lab run`, the report page checked against its CSVs, then cached. Its own file so that pytest-xdist
(`--dist loadfile`) runs it beside the rest of the suite, not after test_pipeline.py."""
import html, json, re, shlex, subprocess
from pathlib import Path

import pandas as pd

from lume_lab.core.config import make_config
from lume_lab.pipeline.orchestration.cli import main
from lume_lab.pipeline.orchestration.runner import experiment_notebooks
from lume_lab.unlearn.registry import BUILTIN_METHODS, get_spec
from conftest import HANG_TIMEOUT


ROOT = Path(__file__).resolve().parents[1]


def quick_start_args() -> tuple[list[str], str]:
    "The `lume-lab` arguments that README's first command (`make run PRESET=smoke`) runs, and the page README names."
    quick = re.search(r"^## Quick start\n(.*?)^## ", (ROOT / "README.md").read_text(), re.S | re.M).group(1)
    make_cmd = next(l.split("#")[0].split() for l in quick.splitlines() if l.startswith("make run PRESET="))
    page = re.search(r"runs/(\S+?/report/index\.html)", quick).group(1)
    dry = subprocess.run(["make", "-n", "-o", ".venv/.lume-lab-setup", *make_cmd[1:]], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout       # the recipe make would run, not run
    line = next(l for l in dry.splitlines() if "lume-lab run" in l)
    argv = shlex.split(line)
    return argv[argv.index(next(a for a in argv if a.endswith("lume-lab"))) + 1:], page


def make_recipe_args(target: str, *make_args: str) -> list[str]:
    """The `lume-lab` arguments of the `lume-lab run` line that `make <target> <make_args>` would run.
    A dry run: nothing runs."""
    dry = subprocess.run(["make", "-n", "-o", ".venv/.lume-lab-setup", target, *make_args], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    argv = shlex.split(next(l for l in dry.splitlines() if "lume-lab run" in l))
    return argv[argv.index(next(a for a in argv if a.endswith("lume-lab"))) + 1:]


def test_smoke_run_end_to_end_then_cached(tmp_path, monkeypatch):
    """README's quick start exits 0 and writes the page README names; `make run-companions`'s command then adds the
    companions to the same run, and a rerun of every experiment (`--only all`) recomputes nothing."""
    METHODS = BUILTIN_METHODS
    quick, page = quick_start_args()
    assert quick[:1] == ["run"] and "--preset" in quick and quick[quick.index("--preset") + 1] == "smoke", quick
    args = [*quick, "--runs-root", str(tmp_path)]
    # the page between experiments (run_pipeline's on_experiment): right after e03 it shows Table 2, later sections "not
    # yet run"
    from functools import partial
    from lume_lab.pipeline.orchestration import cli
    from report_checks import assert_report_matches_csvs, h2_sections

    after_e03 = {}

    def between(name, store):
        if name.startswith("e03") and not after_e03:
            after_e03.update(
                page=(store.dir / "report" / "index.html").read_text(), checked=assert_report_matches_csvs(store.dir)
            )

    monkeypatch.setattr(cli, "run_pipeline", partial(cli.run_pipeline, on_experiment=between))
    assert main(args) == 0  # the quick start: the main chain
    # the page README tells a newcomer to open, complete
    assert "not yet run" not in (tmp_path / page).read_text()
    run = tmp_path / page.split("/")[0]
    companions = make_recipe_args("run-companions", "PRESET=smoke", f"RUN_ID={run.name}")  # README's second command
    assert companions[companions.index("--only") + 1 :] == ["e07", "e08", "e11", "e99"], companions
    # the companions (e07, e08, e11) on the same run, the page again
    assert main([*companions, "--runs-root", str(tmp_path)]) == 0
    args += ["--only", "all"]
    secs = h2_sections(after_e03["page"])
    assert list(secs)[:2] == ["Verdict", "Scorecard"] and after_e03["checked"] > 0
    assert "not yet run" not in secs["Unlearning (Fig. 4a)"] and "<img" in secs["Unlearning (Fig. 4a)"]
    for title, exp in (
        ("Localization precision (Fig. 4b)", "e04_localization"), ("REMIND: residual memorization", "e05_remind"),
        ("Resurfacing attack (Fig. 5)", "e06_resurfacing"),
        ("Attribution against the ground truth (e09)", "e09_attribution"),
        ("Robustness: quantization, relearning, weight space (e10)", "e10_robustness")):
        assert f"{exp}: not yet run" in secs[title], title
    # e99's final page: nothing left to come; a test-size testbed that memorized nothing is not judged
    final = (run / "report" / "index.html").read_text()
    assert "not yet run" not in final and "Test-size preset: smoke" in final
    from lume_lab.pipeline.presentation.report import empty_testbeds
    empty = empty_testbeds(pd.read_csv(run / "report" / "scorecard.csv"))     # the rule, not what smoke memorized
    assert all(html.escape(why) in h2_sections(final)["Verdict"] for why in empty.values()) and (
        ("nothing to judge" in final) == bool(empty))
    man = json.loads((run / "manifest.json").read_text())
    assert {"config", "config_hash", "seed", "versions", "git_commit", "stages"} <= set(man)
    assert json.loads((run / "config.json").read_text()) == man["config"]
    done = man["stages"]
    field = make_config("smoke").unlearn.forget_fields[0]
    expected = {
        "world", "tokenizer", "base", "utility_base", "pii", "pistol", "lume", "masks", "inject_masked",
        "inject_unmasked", "instruct_masked", "instruct_unmasked", "testbed", f"localization_{field}", "forget_fields",
        f"remind_inputs_{field}", f"remind_{field}", f"remind_ablation_{field}", "instruct_floor"}
    expected |= {f"resurface_{m}_{field}" for m in ("none", "floor", *METHODS)}
    expected |= {f"unlearn_{m}_{field}" for m in METHODS} | {f"evaluate_{m}_{field}" for m in ("none", *METHODS)}
    expected |= {f"unlearn_{m}_{field}_control" for m in METHODS if get_spec(m).has_control}
    assert expected <= set(done), sorted(expected - set(done))
    assert all(v["status"] == "done" for v in done.values())
    for nb in experiment_notebooks(["all"]):
        assert (run / "notebooks" / nb.name).exists()
    report = run / "report"
    assert "mc_acc" in (report / "utility_base.csv").read_text()
    import numpy as np

    rates = pd.read_csv(report / "extraction_rates.csv")
    assert set(rates.model) == {"masked", "unmasked"} and set(rates.field) == set(
        make_config("smoke").pii.target_fields
    )
    expected_reach = {"reachability_instruct_masked", "reachability_instruct_unmasked"}
    assert expected_reach <= set(done), sorted(expected_reach - set(done))
    reach = pd.read_csv(report / "reachability.csv")
    assert set(reach.columns) >= {"model", "field", "kind", "profiles", "prompts", "accuracy", "vs_trained"}
    assert set(reach.kind) <= {"trained", "fresh", "paraphrase"} and reach.accuracy.between(0, 100).all()
    metrics = pd.read_csv(report / "unlearning_metrics.csv")
    assert set(metrics.method) == {"none", *METHODS}
    loc = pd.read_csv(report / "localization_summary.csv")
    assert set(loc.method) == set(METHODS) and set(loc.labels) == {"forget", "unified"}
    assert not loc[loc.method == "uld"].applicable.any() and loc[loc.method != "uld"].applicable.all()
    assert loc[loc.method != "uld"].auc.between(0, 1).all()
    remind = pd.read_csv(report / f"remind_{field}.csv")
    assert set(remind.model) == {"none", "none_control", "base", *METHODS}
    assert {"remind_lr", "remind_rf", "loss", "zlib", "min_k", "min_k_pp", "spv_mean", "spv_max", "rougeL_f1"} <= set(
        remind.detector
    )
    assert remind["multi"].between(0, 100).all() and set(remind.input) == {"orig", "reph"}
    assert (report / f"remind_{field}.png").exists() and (report / f"remind_ablation_{field}.csv").exists()
    res = pd.read_csv(report / "resurfacing.csv")
    assert set(res.method) == {"none", "floor", *METHODS} and set(res.stage) == {"before", "after"}
    assert res.rate.between(0, 100).all() and (res.leaked <= res.n_profiles).all()
    assert (report / "resurfacing_leakage.png").exists() and (report / f"resurfacing_jaccard_{field}.png").exists()
    # what the attack did: losses on its own data, per attacked model
    att = pd.read_csv(report / "resurfacing_attack.csv")
    assert (
        set(att.method) == {"none", "floor", *METHODS}
        and np.isfinite(att.nll_before).all()
        and (att.nll_before > 0).all()
    )
    assert (
        (att.kept_step <= att.steps).all()
        and (att.val_kept <= att.val_start + 1e-12).all()
        and (report / "resurfacing_attack.png").exists()
    )
    # e09: attribution scores against the masks, the mask-signature check, localized_graddiff beside its neighbours
    assert {
        f"attribution_{field}",
        "mask_signature",
        f"attribution_localization_{field}",
        f"unlearn_localized_graddiff_{field}",
        f"evaluate_localized_graddiff_{field}",
        f"resurface_localized_graddiff_{field}",
    } <= set(done)
    attr = pd.read_csv(report / f"attribution_{field}.csv")
    assert (
        set(attr["labels"]) == {"forget", "unified"}
        and attr.auc.between(0, 1).all()
        and attr.precision_at_k.between(0, 1).all()
    )
    assert set(attr["count"].astype(str)) == {str(c) for c in make_config("smoke").attribution.counts}
    sig = pd.read_csv(report / "mask_signature.csv")
    assert set(sig["labels"]) == {"forget", "any"} and sig.f1.between(0, 1).all() and sig.auc.between(0, 1).all()
    lg = pd.read_csv(report / "attribution_methods.csv")
    assert set(lg.method) == {"none", "grad_diff", "simnpo", "oracle_grad", "localized_graddiff"}
    assert lg[lg.method != "none"].auc_forget.between(0, 1).all() and lg[lg.method == "none"].auc_forget.isna().all()
    assert (report / "attribution.png").exists()
    # e10: every weight-changing method through quantization, the three relearning attacks and the weight-space
    # diagnostics
    robust = {m for m in METHODS if get_spec(m).changes_weights}
    assert {f"robust_{k}_{m}_{field}" for k in ("scores", "quant", "weights") for m in robust} <= set(done)
    rob = pd.read_csv(report / f"robustness_{field}.csv")
    assert set(rob.method) == robust | {"none"} and (report / "robustness_recovery.png").exists()
    # the quantized original, for reference
    assert {"forget_em", "quant4_forget_em", "quant8_forget_em"} <= set(rob[rob.method == "none"].test)
    rec = rob[rob.test.str.endswith("_recovery")]
    assert (rec.value.notna() | rec.note.notna()).all()  # a value, or the reason there is none
    card = pd.read_csv(report / "scorecard.csv")
    cols = [
        "quant4_recovery", "quant8_recovery", "relearn_half_recovery", "relearn_other_recovery",
        "relearn_retain_recovery", "robust_profiles"]
    assert set(cols) <= set(card.columns) and card[card.method.isin(robust)].robust_profiles.notna().all()
    # e07: PISTOL's fine-tuning, degree (Table 2) and density (Table 3) stages and tables; DS of the ROUGE-1 means shown
    from lume_lab.core.config import PISTOL_METHODS
    from lume_lab.data.pistol import DENSITIES
    from lume_lab.metrics.rouge import deviation_score

    pistol = {f"pistol_{k}_{d}" for k in ("finetune", "before") for d in ("dataset1", "dataset2")}
    pistol |= {f"pistol_{s}_{m}" for s in ("degree", "density") for m in PISTOL_METHODS}
    assert pistol <= set(done), sorted(pistol - set(done))
    for name, by, groups in (("pistol_table2", "edge", {"A-B", "A-C"}), ("pistol_table3", "density", set(DENSITIES))):
        t = pd.read_csv(report / f"{name}.csv")
        assert set(t.method) == {"none", *PISTOL_METHODS} and set(t[by]) == groups
        assert all(abs(ds - deviation_score(f, r)) < 1e-9 for ds, f, r in zip(t.ds, t.forget_rouge1, t.retain_rouge1))
    assert (report / "pistol_degree.png").exists() and (report / "pistol_density.png").exists()
    assert "PISTOL: structural unlearning" in (report / "index.html").read_text()
    # e08: LUME, every method scored at every epoch, the figures and the summary beside the paper
    from lume_lab.core.config import LUME_METHODS

    assert {
        "lume_nonmembers",
        "lume_target",
        "lume_retain_only",
        "lume_eval_base",
        "lume_eval_target",
        "lume_eval_retain_only",
        *(f"lume_unlearn_{m}" for m in LUME_METHODS),
    } <= set(done)
    ep = pd.read_csv(report / "lume_epochs.csv")
    assert set(ep.label) == {"base", "target", "retain_only", *LUME_METHODS}
    assert set(ep[ep.label == "npo"].epoch) == set(range(make_config("smoke").lume_exp.epochs + 1))
    assert set(pd.read_csv(report / "lume_summary.csv").label) == set(ep.label)
    assert all((report / f"lume_{f}.png").exists() for f in ("fig2", "fig3_mia", "fig4_utility", "fig6_tasks"))
    # e11: the dose-response grid's points beside the run's weight-changing methods, OracleGrad's bitwise twin at
    # (p, r) = (1, 1), each mask's realized size, precision and recall, the page section
    from lume_lab.pipeline.stages.dose import dose_points

    pts = dose_points(make_config("smoke"))
    assert {f"{p.label}_unlearn_{field}" for p in pts} <= set(done)
    dp, dm = pd.read_csv(report / f"dose_points_{field}.csv"), pd.read_csv(report / f"dose_methods_{field}.csv")
    assert set(dp.method) == {p.label for p in pts} and set(dm.method) == robust
    need = {
        "forget_em", "retain_em", "auc_forget", "share_in_forget", "leak_after", "quant4_recovery",
        "relearn_retain_only_recovery"}
    assert all(need <= set(g.measure) for _, g in dp.groupby("method")) and all(
        need <= set(g.measure) for _, g in dm.groupby("method")
    )
    q1 = dp[(dp.p == 1) & (dp.r == 1)].set_index("measure").value
    og = dm[dm.method == "oracle_grad"].set_index("measure").value
    # (1, 1), the run's seed: OracleGrad
    assert abs(q1["forget_em"] - og["forget_em"]) < 1e-9 and abs(q1["share_in_forget"] - 1) < 1e-9
    summ = pd.read_csv(report / f"dose_summary_{field}.csv")
    assert len(summ) == len({(p.p, p.r) for p in pts}) and {
        "p", "r", "size_over_mF", "precision", "recall", "forget_em", "forget_em_sd"} <= set(summ.columns)
    # realized precision and recall within rounding of the requested ones, the size r/p of |m^F|
    assert (summ.precision - summ.p).abs().max() < 1e-3 and (summ.recall - summ.r).abs().max() < 1e-3
    assert ((summ.size_over_mF - summ.r / summ.p).abs() < 1e-3).all()
    assert (report / f"dose_curves_{field}.png").exists() and (report / "dose_scatter.png").exists()
    assert "Dose-response over mask precision and recall (e11)" in (report / "index.html").read_text()
    # e99: the page shows every figure above inlined, and its tables hold the CSVs' values
    from report_checks import assert_fig3_table_matches, assert_report_matches_csvs, assert_self_contained

    assert assert_self_contained((report / "index.html").read_text()) >= 8
    assert assert_report_matches_csvs(run) > 0 and (report / "report.md").exists()
    assert_fig3_table_matches(run)
    # the results page of the run (`make results`): e10's recoveries in the scorecard, e02's testbed, e05's interval
    # verdicts and e11's dose table, every number its CSV cell
    from lume_lab.pipeline.presentation.results import read_markdown_tables, results_page
    from results_checks import assert_results_match_csvs

    page = results_page([run], "smoke")
    heads = [h for h, _ in read_markdown_tables(page)]
    # the headline table opens the page when the run has a headline (smoke's testbed may hold nothing to judge)
    assert heads[0] == ("Headline",) or "## Headline" not in page
    heads = [h for h in heads if h != ("Headline",)]
    assert [
        ("Scorecard", field),
        ("Testbed", "Memorization and reach"),
        ("Testbed", "Utility around the injection"),
        ("Quantized forget EM", field),
        ("Attack controls", field),
        ("REMIND intervals", field),
        ("Dose-response", field, run.name),
        ("Experiment times",),
        ("Stage times",),
    ] == heads, heads
    assert assert_results_match_csvs(page, [run]) > 300 and "4-bit recovery" in page
    # rerun: every stage is a cache hit, nothing recomputed
    assert main(args) == 0
    man2 = json.loads((run / "manifest.json").read_text())
    for k, v in man2["stages"].items():
        assert v["finished"] == done[k]["finished"], f"stage {k} reran"
        assert v["cache_hits"] >= 1, k
    # the resurfacing attack as a 2-process job (`lume-lab stage` under torch.distributed.run, gloo): on a copy of the
    # run whose floor model and two attacks are forgotten, the job recomputes them (instruct_floor inside the floor's
    # job); the prompts before the attack see the same model, and the attack's DDP fine-tune follows the one-process one
    import shutil, subprocess, sys
    from pathlib import Path
    from lume_lab.pipeline.orchestration.launch import launch_command, launch_env

    shutil.copytree(run, tmp_path / "e2e_copy")
    again = [f"resurface_floor_{field}", f"resurface_npo_{field}"]
    man3 = json.loads((tmp_path / "e2e_copy" / "manifest.json").read_text())
    for k in ["instruct_floor", *again]:
        man3["stages"].pop(k)
        shutil.rmtree(tmp_path / "e2e_copy" / k)
    (tmp_path / "e2e_copy" / "manifest.json").write_text(json.dumps(man3))
    for st in again:
        job = subprocess.run(
            launch_command(st, "e2e_copy", tmp_path, 2, "torchrun"), cwd=Path(__file__).resolve().parents[1],
            env=launch_env("torchrun"), capture_output=True, text=True, timeout=HANG_TIMEOUT)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        e = json.loads((tmp_path / "e2e_copy" / "manifest.json").read_text())["stages"][st]
        assert e["status"] == "done" and e["processes"] == 2 and e["hash"] == done[st]["hash"]
        one, two = run / st, tmp_path / "e2e_copy" / st
        assert pd.read_csv(one / "before.csv").equals(pd.read_csv(two / "before.csv"))
        a, b = pd.read_csv(one / "after.csv"), pd.read_csv(two / "after.csv")
        assert a.profile_id.tolist() == b.profile_id.tolist() and list(a.columns) == list(b.columns)
        la, lb = pd.read_csv(one / "attack_log.csv"), pd.read_csv(two / "attack_log.csv")
        assert la.step.tolist() == lb.step.tolist()
        pd.testing.assert_series_equal(lb.val_loss, la.val_loss, rtol=1e-3)
    # bring your own method: GradAscent's weights, saved as a plain checkpoint outside the run, scored as
    # external:outside; its depth certificate sits beside the run's report, with the registry's methods of the e99 page
    outside = shutil.copytree(run / f"unlearn_grad_ascent_{field}" / "model", tmp_path / "outside")
    assert main(["score", run.name, "--checkpoint", str(outside), "--name", "outside", "--field", field,
                 "--runs-root", str(tmp_path), "--no-report"]) == 0
    cert = (run / "certificates" / f"outside_{field}.html").read_text()
    assert f"Depth certificate: external:outside on {field}" in cert and "Operating point" in cert
    assert "The registry&#x27;s methods on this field" in cert or "The registry's methods on this field" in cert
    assert ("Nothing to judge" in cert) == (field in empty)   # a testbed that memorized nothing: no paragraph
    assert (run / "certificates" / f"outside_{field}.md").exists()
