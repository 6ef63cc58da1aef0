"""The smoke run end to end through `lume-lab run` (every experiment notebook, the report page checked against its CSVs), then
cached. Its own file so that pytest-xdist (`--dist loadfile`) runs it beside the rest of the suite, not after test_pipeline.py."""
import json

from lume_lab.core.config import make_config
from lume_lab.pipeline.cli import main
from lume_lab.pipeline.runner import experiment_notebooks
from lume_lab.unlearn.registry import BUILTIN_METHODS, get_spec


def test_smoke_run_end_to_end_then_cached(tmp_path):
    "`lume-lab run --preset smoke` runs every experiment notebook into runs/<id>/; a rerun recomputes nothing."
    METHODS = BUILTIN_METHODS
    args = ["run", "--preset", "smoke", "--run-id", "e2e", "--runs-root", str(tmp_path),
            "--set", "pretrain.steps=16", "--set", "pretrain.checkpoint_every=8"]
    assert main(args) == 0
    run = tmp_path / "e2e"
    man = json.loads((run / "manifest.json").read_text())
    assert {"config", "config_hash", "seed", "versions", "git_commit", "stages"} <= set(man)
    assert json.loads((run / "config.json").read_text()) == man["config"]
    done = man["stages"]
    field = make_config("smoke").unlearn.forget_fields[0]
    expected = {"world", "tokenizer", "base", "utility_base", "pii", "pistol", "lume", "masks", "inject_masked",
                "inject_unmasked", "instruct_masked", "instruct_unmasked", "testbed", f"localization_{field}", "forget_fields",
                f"remind_inputs_{field}", f"remind_{field}", f"remind_ablation_{field}", "instruct_floor"}
    expected |= {f"resurface_{m}_{field}" for m in ("none", "floor", *METHODS)}
    expected |= {f"unlearn_{m}_{field}" for m in METHODS} | {f"evaluate_{m}_{field}" for m in ("none", *METHODS)}
    expected |= {f"unlearn_{m}_{field}_control" for m in METHODS if get_spec(m).has_control}
    assert expected <= set(done), sorted(expected - set(done))
    assert all(v["status"] == "done" for v in done.values())
    for nb in experiment_notebooks(): assert (run / "notebooks" / nb.name).exists()
    report = run / "report"
    assert "mc_acc" in (report / "utility_base.csv").read_text()
    import pandas as pd
    rates = pd.read_csv(report / "extraction_rates.csv")
    assert set(rates.model) == {"masked", "unmasked"} and set(rates.field) == set(make_config("smoke").pii.target_fields)
    metrics = pd.read_csv(report / "unlearning_metrics.csv")
    assert set(metrics.method) == {"none", *METHODS}
    loc = pd.read_csv(report / "localization_summary.csv")
    assert set(loc.method) == set(METHODS) and set(loc.labels) == {"forget", "unified"}
    assert not loc[loc.method == "uld"].applicable.any() and loc[loc.method != "uld"].applicable.all()
    assert loc[loc.method != "uld"].auc.between(0, 1).all()
    remind = pd.read_csv(report / f"remind_{field}.csv")
    assert set(remind.model) == {"none", "none_control", "base", *METHODS}
    assert {"remind_lr", "remind_rf", "loss", "zlib", "min_k", "min_k_pp", "spv_mean", "spv_max", "rougeL_f1"} <= set(remind.detector)
    assert remind["multi"].between(0, 100).all() and set(remind.input) == {"orig", "reph"}
    assert (report / f"remind_{field}.png").exists() and (report / f"remind_ablation_{field}.csv").exists()
    res = pd.read_csv(report / "resurfacing.csv")
    assert set(res.method) == {"none", "floor", *METHODS} and set(res.stage) == {"before", "after"}
    assert res.rate.between(0, 100).all() and (res.leaked <= res.n_profiles).all()
    assert (report / "resurfacing_leakage.png").exists() and (report / f"resurfacing_jaccard_{field}.png").exists()
    # e08: LUME, every method scored at every epoch, the figures and the summary beside the paper
    from lume_lab.core.config import LUME_METHODS
    assert {"lume_nonmembers", "lume_target", "lume_retain_only", "lume_eval_base", "lume_eval_target", "lume_eval_retain_only",
            *(f"lume_unlearn_{m}" for m in LUME_METHODS)} <= set(done)
    ep = pd.read_csv(report / "lume_epochs.csv")
    assert set(ep.label) == {"base", "target", "retain_only", *LUME_METHODS}
    assert set(ep[ep.label == "npo"].epoch) == set(range(make_config("smoke").lume_exp.epochs + 1))
    assert set(pd.read_csv(report / "lume_summary.csv").label) == set(ep.label)
    assert all((report / f"lume_{f}.png").exists() for f in ("fig2", "fig3_mia", "fig4_utility", "fig6_tasks"))
    # e99: the page shows every figure above inlined, and its tables hold the CSVs' values
    from report_checks import assert_fig3_table_matches, assert_report_matches_csvs, assert_self_contained
    assert assert_self_contained((report / "index.html").read_text()) >= 8
    assert assert_report_matches_csvs(run) > 0 and (report / "report.md").exists()
    assert_fig3_table_matches(run)
    # rerun: every stage is a cache hit, nothing recomputed
    assert main(args) == 0
    man2 = json.loads((run / "manifest.json").read_text())
    for k, v in man2["stages"].items():
        assert v["finished"] == done[k]["finished"], f"stage {k} reran"
        assert v["cache_hits"] >= 1, k
