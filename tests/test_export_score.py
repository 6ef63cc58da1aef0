"""Bring your own method: `lume-lab export` writes the testbed for any framework, `lume-lab score` judges
any checkpoint through the stages a registered method goes through. One smoke run (GradAscent only) serves every
test."""
import json, os, shutil, subprocess, sys, textwrap, warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from lume_lab.core.config import make_config
from lume_lab.core.store import open_run
from lume_lab.inject.masks import group_mask, load_masks, masks_equal
from lume_lab.inject.testbed import field_splits
from lume_lab.pipeline.orchestration.cli import main
from lume_lab.pipeline.orchestration.config import resolve_config
from lume_lab.pipeline.stages import external as X, remind as R, resurface as S, testbed as T, unlearn as U
from lume_lab.data.pii import load_pii
from lume_lab.pipeline.orchestration.export import EXPORT_ROOT, check_tf4
from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
RUN = "byom"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    "A smoke run with GradAscent's unlearning (and control), evaluation, localization, REMIND and resurfacing done."
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("runs")
    cfg = resolve_config(
        make_config("smoke", {"pretrain.steps": 16, "pretrain.checkpoint_every": 8, "unlearn.methods": ["grad_ascent"]})
    )
    store = open_run(RUN, cfg, root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        T.prepare_testbed(store)
        (field,) = U.stage_forget_fields(store)
        for m, f, ctl in U.unlearn_jobs(cfg, [field]):
            U.stage_unlearn(store, m, f, ctl)
        U.stage_evaluate_before(store, field)
        U.stage_evaluate(store, "grad_ascent", field)
        U.stage_localization(store, field, ["grad_ascent"])
        R.stage_remind(store, field)
        S.stage_resurface(store, "grad_ascent", field)
    return {"store": store, "root": root, "field": field, "cfg": cfg}


def _score(run, ckpt, name, *extra, report=False) -> int:
    "`lume-lab score` on the shared run, then the fixture's store re-reads the manifest the command wrote."
    rc = main(["score", RUN, "--checkpoint", str(ckpt), "--name", name, "--runs-root", str(run["root"]), *extra,
               *([] if report else ["--no-report"])])
    run["store"].reload()
    return rc


def _copy_model(src: Path, dst: Path) -> Path:
    "A plain checkpoint directory: what a framework's save_pretrained leaves (config, safetensors, tokenizer)."
    shutil.copytree(src, dst); return dst


@pytest.fixture(scope="module")
def ga_copy(run, tmp_path_factory):
    """GradAscent's output (and its control run) saved as plain checkpoint directories, then scored as
    `external:ga-copy`."""
    st, f, d = run["store"], run["field"], tmp_path_factory.mktemp("ckpt")
    ckpt = _copy_model(st.path(U.unlearn_name("grad_ascent", f)) / "model", d / "ga")
    ctl = _copy_model(st.path(U.unlearn_name("grad_ascent", f, True)) / "model", d / "ga_control")
    assert _score(run, ckpt, "ga-copy", "--control", str(ctl)) == 0
    return ckpt


def _stage(run, kind: str, name: str = "ga-copy") -> Path:
    return run["store"].path(f"external_{name}_{kind}_{run['field']}")


def test_remind_intervals_reuse_the_cached_stage(run):
    """e05's noise bars on the shared run: `stage_remind_ci` recomputes every fair AUC of `remind_<field>` exactly from
    its features and puts an interval around each, `separated` is the non-overlap of REMIND's interval and the best fair
    baseline's, and the number of draws is no part of REMIND's own key (the stage made at the config's `n_boot` is a
    cache hit at another)."""
    st, f = run["store"], run["field"]
    done, n_boot = st.entry(f"remind_{f}")["finished"], st.config.remind.n_boot
    # fewer draws: a quick test, and a number the REMIND stage never saw
    st.config.remind.n_boot = 100
    try: ci, sep = R.stage_remind_ci(st, f)
    finally: st.config.remind.n_boot = n_boot
    assert st.entry(f"remind_{f}")["finished"] == done and st.entry(f"remind_ci_{f}")["warnings"] == []
    sc = pd.read_csv(st.path(f"remind_{f}") / "scores.csv").query("protocol == 'fair'")
    j = sc.merge(ci, on=["model", "input", "detector", "comparison"], suffixes=("", "_ci"))
    # the cached AUCs, recomputed
    assert len(j) == len(sc) == len(ci) and (j.auc - j.auc_ci).abs().max() < 1e-12
    assert {"remind_lr", "remind_rf", "loss", "min_k", "rougeL_f1"} <= set(ci.detector)
    assert (ci.auc_lo <= ci.auc).all() and (ci.auc <= ci.auc_hi).all() and (ci.auc_lo < ci.auc_hi).any()
    assert set(sep.classifier) == {"lr", "rf"} and len(sep) == 2 * (sc.detector == "remind_lr").sum()
    assert sep.separated.tolist() == ((sep.remind_lo > sep.baseline_hi) | (sep.baseline_lo > sep.remind_hi)).tolist()
    best = ci[~ci.detector.str.startswith("remind_")].groupby(["model", "input", "comparison"]).auc.max()
    assert (
        sep.set_index(["model", "input", "comparison"]).baseline_auc
        == best.reindex(sep.set_index(["model", "input", "comparison"]).index)
    ).all()
    assert set(sep.verdict) <= {"REMIND ahead", "baseline ahead", "intervals overlap"}
    assert (sep.verdict == "intervals overlap").tolist() == (~sep.separated).tolist()


def test_score_is_the_internal_path(run, ga_copy):
    """GradAscent's own output, scored as a checkpoint from outside, gets GradAscent's row: EM/ES/Prob/ROUGE and every
    other per-split metric exactly, every localization AUC exactly (with its control run; without one, every
    non-contrast score), REMIND and the resurfacing attack exactly, utility to float tolerance."""
    st, f = run["store"], run["field"]
    ours = pd.read_csv(_stage(run, "evaluate") / "metrics.csv").set_index(["split", "metric"]).value
    ga = pd.read_csv(st.path(f"evaluate_grad_ascent_{f}") / "metrics.csv").set_index(["split", "metric"]).value
    assert ours.index.equals(ga.index) and len(ours) > 30
    util = ours.index.get_level_values("split").str.startswith("utility")
    assert {"em", "es", "prob", "rouge1", "rougeL", "accuracy"} <= set(ours.index.get_level_values("metric"))
    assert (ours[~util] == ga[~util]).all(), pd.concat([ours, ga], axis=1)[ours != ga]           # exactly
    assert ((ours[util] - ga[util]).abs() <= 1e-9 * (1 + ga[util].abs())).all()
    key = ["labels", "score"]
    a = pd.read_csv(_stage(run, "localization") / "aucs.csv").set_index(key)
    b = pd.read_csv(st.path(f"localization_{f}") / "aucs.csv").query("method == 'grad_ascent'").set_index(key)
    assert a.index.equals(b.index) and {"contrast", "composite", "raw"} <= set(a.index.get_level_values("score"))
    # exactly, the composite included
    assert (a.auc == b.auc).all() and (a.best == b.best).all()
    # no --control: no contrast scores, the rest equal
    X.stage_external_checkpoint(st, "ga-alone", f, ga_copy)
    U.localization_source(st, X.external_source(st, "ga-alone", f))
    alone = pd.read_csv(_stage(run, "localization", "ga-alone") / "aucs.csv").set_index(key)
    plain = b[(b.family != "contrast") & (b.index.get_level_values("score") != "composite")]
    assert (
        len(plain) >= 6 and not (alone.family == "contrast").any() and (alone.auc.loc[plain.index] == plain.auc).all()
    )
    s = pd.read_csv(_stage(run, "localization") / "summary.csv")
    assert (
        s.method.unique().tolist() == ["external:ga-copy"] and (s.cast_share == 0).all() and (s.changed_share > 0).all()
    )
    cols = ["input", "detector", "protocol", "comparison", "auc", "tpr_at_1fpr", "accuracy", "f1", "n"]
    ra = pd.read_csv(_stage(run, "remind") / "scores.csv")[cols]
    rb = pd.read_csv(st.path(f"remind_{f}") / "scores.csv").query("model == 'grad_ascent'")[cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(ra, rb, check_exact=True)
    for when in ("before", "after"):
        pd.testing.assert_frame_equal(
            pd.read_csv(_stage(run, "resurface") / f"{when}.csv"),
            pd.read_csv(st.path(f"resurface_grad_ascent_{f}") / f"{when}.csv"),
            check_exact=True,
        )


def test_score_writes_a_depth_certificate(run, ga_copy):
    """`score` writes the checkpoint's depth certificate: its operating point is GradAscent's own (the same weights on
    the same choosing people, against the testbed model's never-trained level), its paragraph is withheld exactly when
    the testbed memorized nothing, and every measurement stays on the page either way."""
    from lume_lab.pipeline.orchestration.certificate import stage_heldout_level, stage_point
    from lume_lab.pipeline.orchestration.score import empty_testbed_note
    st, f = run["store"], run["field"]
    page = (st.dir / "certificates" / f"ga-copy_{f}.html").read_text()
    assert "Depth certificate: external:ga-copy on " + f in page and "Operating point" in page
    ours = json.loads((_stage(run, "point") / "point.json").read_text())
    ga = stage_point(st, U.method_source(st, "grad_ascent", f))
    assert {k: v for k, v in ours.items() if k != "label"} == {k: v for k, v in ga.items() if k != "label"}
    assert ours["level"] == stage_heldout_level(st, f)["nll"] and ours["n_choose"] >= 1 and ours["n_report"] >= 1
    empty = empty_testbed_note(st, f)
    said = any(s in page for s in ("It forgot", "It did not forget", "Cannot tell at this n whether it forgot"))
    assert ("Nothing to judge" in page) == bool(empty) and said != bool(empty)
    assert "forget EM" in page and "AUC m^F" in page


def test_e10_treats_a_checkpoint_as_the_method_it_copies(run, ga_copy):
    """e10's stages on `external:ga-copy` give GradAscent's own:
    per-example scores, quantized scores, bucket survival, distances, LMC."""
    from lume_lab.pipeline.stages import robustness as B
    st, f = run["store"], run["field"]
    ext, ga = X.external_source(st, "ga-copy", f), U.method_source(st, "grad_ascent", f)
    assert ext.label in [s.label for s in B.robust_sources(st, f)]
    assert B.stage_robust_scores(st, ext).equals(B.stage_robust_scores(st, ga))
    qe, qg = B.stage_quantization(st, ext), B.stage_quantization(st, ga)
    assert (
        qe["examples"].equals(qg["examples"])
        and qe["survival"].equals(qg["survival"])
        and qe["survival"].changed.sum() > 0
    )
    we, wg = B.stage_weightspace(st, ext), B.stage_weightspace(st, ga)
    assert we["distances"].equals(wg["distances"]) and we["lmc"].equals(wg["lmc"])
    assert st.is_done(ext.result_stage("robust_quant")) and ext.result_stage("robust_quant").startswith(
        "external_ga-copy_"
    )


def test_scoring_is_cached_by_content(run, ga_copy, tmp_path):
    """The same files again, from another directory: every stage a cache hit.
    Other files under the same name replace the results."""
    st = run["store"]
    stages = [
        f"external_ga-copy_{k}_{run['field']}"
        for k in ("checkpoint", "evaluate", "localization", "remind", "resurface")
    ]
    before = {k: st.entry(k)["finished"] for k in stages}
    moved = _copy_model(ga_copy, tmp_path / "elsewhere")
    ctl = st.path(U.unlearn_name("grad_ascent", run["field"], True)) / "model"
    assert _score(run, moved, "ga-copy", "--control", str(ctl)) == 0
    assert {k: st.entry(k)["finished"] for k in stages} == before and all(
        st.entry(k)["cache_hits"] >= 1 for k in stages
    )


def _testbed_weights(run) -> dict:
    return load_file(str(run["store"].path("instruct_masked") / "model" / "model.safetensors"))


def _hand_built(run, d: Path, change) -> Path:
    """The testbed model with `change(name, tensor, owner or None)` applied to every weight, saved beside the testbed's
    config and tokenizer."""
    owner = T.stage_masks(run["store"])
    w = {n: change(n, t.clone(), owner.get(n)) for n, t in _testbed_weights(run).items()}
    shutil.copytree(run["store"].path("instruct_masked") / "model", d)
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def _aucs(run, name):
    return pd.read_csv(_stage(run, "localization", name) / "aucs.csv").set_index(["labels", "score"]).auc


def test_known_answers(run, ga_copy, tmp_path):
    """Hand-built checkpoints with known changed weights: every weight of m^F moved → AUC vs m^F exactly 1; every weight
    outside every mask moved → AUC 0.5 × |other masks| / |other masks ∪ unmasked| < 0.5 (magnitude score); a bfloat16
    copy of the unchanged testbed model → the rounding share reported, no weight changed beyond it, no forgetting, and a
    warning."""
    st, f, cfg = run["store"], run["field"], run["cfg"]
    F = T.forget_groups(cfg)
    in_f = lambda n, t, o: t + 0.01 * group_mask(o, F) if o is not None else t
    assert _score(run, _hand_built(run, tmp_path / "in_f", in_f), "in-f") == 0
    a = _aucs(run, "in-f")
    assert (
        a[("forget", "raw")] == 1.0
        and pd.read_csv(_stage(run, "localization", "in-f") / "summary.csv").set_index("labels").auc["forget"] == 1.0
    )
    out = lambda n, t, o: t + 0.01 * (o == 0) if o is not None else t
    assert _score(run, _hand_built(run, tmp_path / "out", out), "outside") == 0
    owner = T.stage_masks(st)
    n_other = sum(int((group_mask(o, range(cfg.pii.n_groups)) & ~group_mask(o, F)).sum()) for o in owner.values())
    n_out = sum(int((o == 0).sum()) for o in owner.values())
    b = _aucs(run, "outside")
    assert (
        b[("forget", "raw")] == pytest.approx(0.5 * n_other / (n_other + n_out), abs=1e-12)
        and b[("forget", "raw")] < 0.45
    )
    # the headline is that plain |Δθ| AUC, read as anti-localized; Lacuna's max over families is a column beside it
    s_out = pd.read_csv(_stage(run, "localization", "outside") / "summary.csv").set_index("labels")
    assert s_out.auc["forget"] == b[("forget", "raw")] and s_out.auc_hi["forget"] < 0.5
    assert s_out.reading["forget"] == "anti-localized" and s_out.lacuna_max_auc["forget"] >= s_out.auc["forget"]
    s_in = pd.read_csv(_stage(run, "localization", "in-f") / "summary.csv").set_index("labels")
    assert s_in.reading["forget"] == "localized"
    # bfloat16: the testbed model itself, rounded
    d = _copy_model(st.path("instruct_masked") / "model", tmp_path / "bf16")
    save_file(
        {n: t.to(torch.bfloat16) for n, t in _testbed_weights(run).items()},
        str(d / "model.safetensors"),
        metadata={"format": "pt"},
    )
    assert _score(run, d, "bf16") == 0
    info = json.loads((_stage(run, "checkpoint", "bf16") / "checkpoint.json").read_text())["precision"]
    assert (
        info["dtypes"] == ["bfloat16"]
        and info["cast_share"] > 0.5
        and info["changed_share"] == 0
        and not info["identical"]
    )
    summ = pd.read_csv(_stage(run, "localization", "bf16") / "summary.csv")
    assert summ.cast_share.iloc[0] == pytest.approx(100 * info["cast_share"]) and summ.changed_share.eq(0).all()
    # rounding is not read as unlearning
    assert summ.auc.isna().all() and not summ.applicable.any()
    w = st.entry(f"external_bf16_checkpoint_{f}")["warnings"]
    assert [x["category"] for x in w] == ["NothingUnlearnedWarning"] and "only by rounding" in w[0]["message"]
    # no forgetting: the answers' NLL is the testbed's
    from lume_lab.models.ops import qa_nll
    sp = field_splits(T.stage_testbed(st), f)
    models = [
        U.load_stage_model(st, "instruct_masked"),
        X.external_source(st, "bf16", f).load(),
        X.external_source(st, "ga-copy", f).load(),
    ]
    for k in ("forget", "retain"):
        nll = [qa_nll(m, tok, list(sp[k])) for m, tok in models]
        # (rounding moves it ~1e-3; GradAscent by nats)
        assert abs(nll[1] - nll[0]) < 0.05 and nll[2] - nll[0] > 1.0, (k, nll)
    # bitwise the testbed model: warned as such
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        X.stage_external_checkpoint(st, "same", f, _copy_model(st.path("instruct_masked") / "model", tmp_path / "same"))
    assert any("equals the testbed model bitwise: nothing was unlearned" in str(x.message) for x in seen)


def test_a_peft_adapter_is_merged_first(run, tmp_path):
    """A LoRA adapter of the testbed model (what PEFT saves) is merged into it before any stage:
    its weights are the merged model's."""
    from peft import LoraConfig, get_peft_model
    from lume_lab.models.lm import load_model
    st, f = run["store"], run["field"]
    model, tok = load_model(st.path("instruct_masked") / "model")
    torch.manual_seed(0)
    peft = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    peft.save_pretrained(str(tmp_path / "adapter"))
    merged = {k: v.detach().clone() for k, v in peft.merge_and_unload().state_dict().items()}
    d = X.stage_external_checkpoint(st, "lora", f, tmp_path / "adapter")
    got = load_file(str(d / "model" / "model.safetensors"))
    assert json.loads((d / "checkpoint.json").read_text())["kind"] == "adapter"
    assert all(torch.equal(got[k], merged[k]) for k in got) and not torch.equal(
        got["model.layers.0.self_attn.q_proj.weight"], _testbed_weights(run)["model.layers.0.self_attn.q_proj.weight"]
    )


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "testbed"
    assert main(["export", RUN, "--out", str(out), "--runs-root", str(run["root"])]) == 0
    return out


def test_export_splits_masks_and_keys(run, exported):
    """The splits load with `datasets.load_dataset` from the card, with the keys open-unlearning's QADataset reads (its
    configs name them); forget and retain are the testbed's rows; holdout people were never injected; the masks are the
    run's, bitwise."""
    import datasets, yaml
    st, f = run["store"], run["field"]
    sp = field_splits(T.stage_testbed(st), f)
    keys = [
        "question", "answer", "paraphrased_question", "perturbed_answer", "profile_id", "field", "template"]
    rows = {}
    # a cache of this export alone: datasets keys a local folder's cache by folder name and config, not by content, so
    # the shared cache can serve another export's rows
    hf_cache = str(exported.parent / "hf-cache")
    for split in ("forget", "retain", "holdout"):
        ds = datasets.load_dataset(str(exported / "data"), f"{split}_{f}", cache_dir=hf_cache)["train"]
        assert ds.column_names == keys and len(ds) > 0
        rows[split] = ds.to_list()
        cfg = yaml.safe_load(
            (exported / "open-unlearning" / "configs" / "data" / "datasets" / f"LUME_QA_{split}_{f}.yaml").read_text()
        )
        args = cfg[f"LUME_QA_{split}_{f}"]["args"]
        assert cfg[f"LUME_QA_{split}_{f}"]["handler"] == "QADataset" and args["hf_args"]["path"] == "json"
        assert args["hf_args"]["data_files"] == f"{EXPORT_ROOT}/data/{split}_{f}.jsonl"
        assert {args["question_key"], args["answer_key"]} <= set(ds.column_names)
    for split in ("forget", "retain"):
        assert [(r["question"], r["answer"], r["profile_id"]) for r in rows[split]] == [
            (r["question"], r["answer"], r["profile_id"]) for r in sp[split]
        ]
    assert all(
        len(r["perturbed_answer"]) == 5 and r["answer"] not in r["perturbed_answer"] and r["template"]
        for s in rows.values()
        for r in s
    )
    pii = load_pii(st.path("pii"))["profiles"]
    injected = {
        role: {p["profile_id"] for p in pii if p["role"] == role}
        for role in ("testbed", "instruct", "resurface", "validation")
    }
    held = {r["profile_id"] for r in rows["holdout"]}
    assert held and all(not (held & ids) for ids in injected.values()) and sum(map(len, injected.values())) == len(pii)
    from lume_lab.data.pii import _QA
    # asked with the injected people's templates
    assert {r["template"] for r in rows["holdout"]} <= set(_QA[f][1] + _QA[f][2])
    # the experiment composes files that exist, in Hydra's defaults form
    ou = exported / "open-unlearning" / "configs"
    # one experiment per trainer, carrying the run's resolved hyperparameters of the matching method
    from lume_lab.pipeline.orchestration.export import OU_TRAINERS, export_hparams
    assert sorted((ou / "experiment" / "unlearn" / "lume").glob("*.yaml")) == sorted(
        ou / "experiment" / "unlearn" / "lume" / f"{f}_{m}.yaml" for m in OU_TRAINERS)
    for method, trainer in OU_TRAINERS.items():
        handler = "QAwithIdkDataset" if method == "dpo" else "QADataset"
        text = (ou / "experiment" / "unlearn" / "lume" / f"{f}_{method}.yaml").read_text()
        assert text.startswith("# @package _global_\n")
        exp, (hp, source) = yaml.safe_load(text), export_hparams(st.config, method)
        # the run's own row where it unlearned with the method
        assert (method in st.config.unlearn.hparams) == source.startswith("this run's") and source in text
        d = {k: v for x in exp["defaults"] for k, v in x.items()}
        assert d["override /trainer"] == trainer
        args, margs = exp["trainer"]["args"], exp["trainer"].get("method_args", {})
        assert (args["learning_rate"], args["num_train_epochs"], args["per_device_train_batch_size"]) == (
            hp["lr"], hp["epochs"], hp["batch_size"]), (method, args)
        assert {k: v for k, v in margs.items() if k != "retain_loss_type"} == {
            k: hp[k] for k in ("alpha", "beta", "gamma", "delta") if k in margs}, (method, margs)
        assert method == "grad_ascent" or {"alpha", "gamma"} <= set(margs) and margs["retain_loss_type"] == "NLL"
        assert (
            d["override /model"] == "LUME_testbed"
            and d["override /eval"] is None
            and (ou / "model" / "LUME_testbed.yaml").exists()
        )
        for k in ("override /data/datasets@data.forget", "override /data/datasets@data.retain"):
            c = yaml.safe_load((ou / "data" / "datasets" / f"{d[k]}.yaml").read_text())[d[k]]
            assert (
                c["handler"] == (handler if k.endswith("forget") else "QADataset")
                and Path(c["args"]["hf_args"]["data_files"].replace(EXPORT_ROOT, str(exported))).exists()
            )
    assert yaml.safe_load((ou / "model" / "LUME_testbed.yaml").read_text())["model_args"][
        "pretrained_model_name_or_path"
    ] == f"{EXPORT_ROOT}/model"
    idk = datasets.load_dataset(str(exported / "data"), "idk", cache_dir=hf_cache)["train"]
    assert len(idk) >= 10 and (exported / "data" / "idk.jsonl").read_text().count("\n") == len(idk)
    masks, _ = load_masks(exported / "masks" / "masks.safetensors")
    assert masks_equal(masks, T.stage_masks(st))
    # each row's wrong answers are values of its own field: a retain row's of the retain field, not the forget field's
    from lume_lab.pipeline.orchestration.export import perturbed_pool
    from lume_lab.pipeline.stages.remind import holdout_qa
    names = [p["full_name"] for p in pii] + [p["full_name"] for p in holdout_qa(st, f)[0]]
    pools = {g: set(perturbed_pool(g, st.config.seed, names)) for s in rows.values() for g in {r["field"] for r in s}}
    assert {r["field"] for r in rows["retain"]} and f not in {r["field"] for r in rows["retain"]}
    assert all(set(r["perturbed_answer"]) <= pools[r["field"]] for s in rows.values() for r in s)
    assert all(not set(r["perturbed_answer"]) & pools[f] for r in rows["retain"])
    for src, dst in (("instruct_masked", "model"), ("instruct_unmasked", "model_control")):
        assert (exported / dst / "model.safetensors").read_bytes() == (
            st.path(src) / "model" / "model.safetensors"
        ).read_bytes()
    man = json.loads((exported / "manifest.json").read_text())
    assert man["config_hash"] == st.manifest["config_hash"] and man["fields"] == [f]
    assert {r["split"]: r["n_rows"] for r in man["splits"]} == {f"{k}_{f}": len(v) for k, v in rows.items()} | {
        f"{k}_para_{f}": len(sp[f"{k}_paraphrase"]) for k in ("forget", "retain")}
    assert man["prompt_format"]["prompt"] == "Question: {question}\nAnswer:"


def test_export_is_the_same_model_under_transformers_4(run, exported, tf4, tmp_path):
    """The export, moved to another folder, loads with transformers 4.51.3 (what open-unlearning pins) through its
    open-unlearning configs and `$LUME_EXPORT`: the same token ids, and log-softmax within 1e-4 (float32, eager) on
    every forget, retain and holdout row; open-unlearning's chat-template ids and labels, the IDK answers its
    QAwithIdkDataset strips included, are the ones lume_lab trains on. No file names the folder it was written to.
    Without the legacy keys 4.51.3 refuses the tokenizer, and without `rope_theta` it computes another function."""
    f = run["field"]
    first = shutil.copytree(exported, tmp_path / "copy")               # the module's other tests keep `exported`
    moved = Path(shutil.move(first, tmp_path / "elsewhere" / "testbed"))
    assert not any(str(exported) in p.read_text() for p in moved.rglob("*") if p.suffix in (".json", ".yaml", ".md"))
    stats, info = check_tf4(moved, tf4)
    assert info == {"transformers": "4.51.3", "tokenizer": "PreTrainedTokenizerFast", "model": "Olmo2ForCausalLM",
                    "rope_theta": 500000.0}
    assert stats.split.tolist() == [f"{s}_{f}" for s in ("forget", "retain", "holdout")] and (stats.n_rows > 0).all()
    assert stats.ids_equal.all() and stats.open_unlearning_ids_equal.all(), stats
    assert (stats.max_abs_diff <= 1e-4).all(), stats
    # the keys the export adds are what makes it so
    cfg_path, tc_path = moved / "model" / "config.json", moved / "model" / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc_path.write_text(json.dumps({**tc, "tokenizer_class": "TokenizersBackend"}))
    with pytest.raises(RuntimeError, match="TokenizersBackend does not exist"): check_tf4(moved, tf4, max_rows=1)
    tc_path.write_text(json.dumps(tc))
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}))
    stats, info = check_tf4(moved, tf4, max_rows=2)
    assert info["rope_theta"] == 10000.0 and (stats.max_abs_diff > 1e-2).all(), stats



TF4_SAVE = textwrap.dedent('''
    # open-unlearning's transformers: load the export's model and tokenizer, and save them unchanged
    import sys, torch, transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src, out = sys.argv[1], sys.argv[2]
    AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    print(transformers.__version__)
''')


def test_a_checkpoint_saved_by_transformers_4_scores_as_none(run, exported, tf4, tmp_path):
    """The export's model, loaded and saved unchanged by transformers 4.51.3 (what open-unlearning pins), is the model
    before unlearning: `score` accepts it and gives it exactly the registry's `none` on every per-split metric."""
    st, f = run["store"], run["field"]
    script, out = tmp_path / "tf4_save.py", tmp_path / "tf4_saved"
    script.write_text(TF4_SAVE)
    env = {**os.environ, "PYTHONPATH": str(tf4), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, str(script), str(exported / "model"), str(out)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert r.returncode == 0 and r.stdout.strip().endswith("4.51.3"), r.stderr[-3000:]
    assert _score(run, out, "tf4-saved") == 0
    key = ["split", "metric"]
    ours = pd.read_csv(_stage(run, "evaluate", "tf4-saved") / "metrics.csv").set_index(key).value
    none = pd.read_csv(st.path(f"evaluate_none_{f}") / "metrics.csv").set_index(key).value
    same = ours.index.intersection(none.index)
    same = same[~same.get_level_values("split").str.startswith("utility")]
    assert len(same) > 30 and {"em", "prob"} <= set(same.get_level_values("metric"))
    assert (ours[same] == none[same]).all(), pd.concat([ours[same], none[same]], axis=1)[ours[same] != none[same]]

def test_auc_snippet_reproduces_localization(run, exported, ga_copy):
    """The 20-line reference snippet of masks/README.md, run on the exported model and GradAscent's output:
    the run's magnitude AUC."""
    code = (exported / "masks" / "README.md").read_text().split("```python\n")[1].split("```")[0]
    ns = {}; exec(code.split("\nprint(")[0], ns)
    want = (
        pd.read_csv(run["store"].path(f"localization_{run['field']}") / "aucs.csv")
        .query("method == 'grad_ascent' and score == 'raw'")
        .set_index("labels")
        .auc
    )
    for labels in ("forget", "unified"):
        assert ns["localization_auc"](exported / "model", ga_copy, exported / "masks", labels=labels) == pytest.approx(
            want[labels], abs=1e-9
        )


OUTSIDE = textwrap.dedent('''
    # a framework that knows nothing of lume_lab: torch, transformers, datasets only
    import json, sys, torch, datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    exp, out = sys.argv[1], sys.argv[2]
    man = json.load(open(f"{exp}/manifest.json")); fmt = man["prompt_format"]
    tok = AutoTokenizer.from_pretrained(f"{exp}/model"); model = AutoModelForCausalLM.from_pretrained(f"{exp}/model")
    forget = datasets.load_dataset(f"{exp}/data", f"forget_{man['fields'][0]}")["train"]
    torch.manual_seed(0); opt = torch.optim.SGD(model.parameters(), lr=0.02); model.train()
    for step in range(4):                                   # gradient ascent on the forget answers
        for r in forget:
            p = tok(fmt["prompt"].format(question=r["question"]), add_special_tokens=False)["input_ids"]
            a = tok(r["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids = torch.tensor([p + a]); labels = torch.tensor([[-100] * len(p) + a])
            (-model(input_ids=ids, labels=labels).loss).backward()
        opt.step(); opt.zero_grad()
    model.save_pretrained(out); tok.save_pretrained(out)
    assert not any(m == "lume_lab" or m.startswith("lume_lab.") for m in sys.modules)
    print("ok")
''')


def test_round_trip_from_outside(run, exported, tmp_path):
    """A script with torch, transformers and datasets only unlearns the exported model offline.
    `lume-lab score` takes the result, whose forget NLL rose."""
    from lume_lab.models.ops import qa_nll
    script, out = tmp_path / "outside.py", tmp_path / "unlearned"
    script.write_text(OUTSIDE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    r = subprocess.run(
        [sys.executable, str(script), str(exported), str(out)], capture_output=True, text=True,
        timeout=HANG_TIMEOUT, env=env,
        cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
    assert _score(run, out, "outside-ga") == 0
    st, f = run["store"], run["field"]
    forget = list(field_splits(T.stage_testbed(st), f)["forget"])
    before = qa_nll(*U.load_stage_model(st, "instruct_masked"), forget)
    after = qa_nll(*X.external_source(st, "outside-ga", f).load(), forget)
    assert after > before + 0.5, (before, after)


def _other_width(run, d: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM
    ref = run["store"].path("instruct_masked") / "model"
    c = AutoConfig.from_pretrained(ref); c.hidden_size, c.intermediate_size = 32, 64
    AutoModelForCausalLM.from_config(c).save_pretrained(d)
    for t in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(ref / t, d / t)
    return d


def _other_vocab(run, d: Path) -> Path:
    from transformers import AutoTokenizer
    _copy_model(run["store"].path("instruct_masked") / "model", d)
    tok = AutoTokenizer.from_pretrained(d); tok.add_tokens(["<not-in-the-testbed>"]); tok.save_pretrained(d)
    return d


def _with_nan(run, d: Path) -> Path:
    "The testbed model with one NaN weight: a diverged run's output."
    w = _testbed_weights(run); w["model.embed_tokens.weight"][3, 1] = float("nan")
    _copy_model(run["store"].path("instruct_masked") / "model", d)
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"}); return d


def _truncated(run, d: Path) -> Path:
    "The testbed model with its weights file cut short, as an interrupted copy leaves it."
    _copy_model(run["store"].path("instruct_masked") / "model", d)
    b = (d / "model.safetensors").read_bytes(); (d / "model.safetensors").write_bytes(b[: len(b) // 2]); return d


def _gelu(run, d: Path) -> Path:
    "The testbed model's weights bitwise, under a config with another activation: another function."
    _copy_model(run["store"].path("instruct_masked") / "model", d)
    c = json.loads((d / "config.json").read_text()); assert c["hidden_act"] != "gelu"
    (d / "config.json").write_text(json.dumps(c | {"hidden_act": "gelu"})); return d


@pytest.mark.parametrize("make, extra, msg", [
    (_other_width, (), "parameter shapes differ from the testbed model's"),
    (_with_nan, (), "tensor 'model.embed_tokens.weight' in model.safetensors holds 1 NaN and 0 infinite value(s)"),
    (_truncated, (), "model.safetensors is not a readable safetensors file"),
    (_gelu, (), "config field hidden_act is 'gelu', the testbed model's is 'silu'"),
    (_other_vocab, (), "tokenizer differs from the testbed model's (vocabulary hash"),
    (lambda run, d: (d.mkdir(), d)[1], (), "is an empty directory"),
    (lambda run, d: d, (), "does not exist"),
    (lambda run, d: _copy_model(run["store"].path("instruct_masked") / "model", d), ("--field", "birth_city"),
     "has no forget field 'birth_city': allowed email_address"),
    (lambda run, d: _copy_model(run["store"].path("instruct_masked") / "model", d), ("--name", "my_npo"),
     "--name must be"),
])
def test_bad_input_is_refused_before_compute(run, tmp_path, capsys, make, extra, msg):
    "Each bad checkpoint or argument: exit 2, one message naming the problem, nothing written to the run."
    d = make(run, tmp_path / "ckpt")
    rd = run["store"].dir
    snap = ((rd / "manifest.json").read_bytes(), sorted(p.name for p in rd.iterdir()))
    name = ["--name", "bad"] if "--name" not in extra else []
    assert (
        main(["score", RUN, "--checkpoint", str(d), *name, *extra, "--runs-root", str(run["root"]), "--no-report"]) == 2
    )
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("lume-lab: error:")]
    assert len(lines) == 1 and msg in lines[0], err
    assert ((rd / "manifest.json").read_bytes(), sorted(p.name for p in rd.iterdir())) == snap


def test_export_refuses_and_never_leaves_a_half_export(run, tmp_path, capsys, monkeypatch):
    """An unknown field or a non-empty --out is refused.
    An export interrupted midway leaves no folder that looks finished."""
    from lume_lab.pipeline.orchestration import export as E
    assert (
        main(["export", RUN, "--out", str(tmp_path / "x"), "--field", "phone_number", "--runs-root", str(run["root"])])
        == 2
    )
    assert "has no forget field 'phone_number'" in capsys.readouterr().err and not (tmp_path / "x").exists()
    (tmp_path / "full").mkdir(); (tmp_path / "full" / "f").write_text("x")
    assert main(["export", RUN, "--out", str(tmp_path / "full"), "--runs-root", str(run["root"])]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    def boom(*a, **k): raise KeyboardInterrupt("killed")
    monkeypatch.setattr(E, "groups_info", boom)
    with pytest.raises(KeyboardInterrupt): E.export_run(RUN, tmp_path / "half", run["root"])
    assert not (tmp_path / "half").exists()
    monkeypatch.undo()
    assert main(["export", RUN, "--out", str(tmp_path / "half"), "--runs-root", str(run["root"])]) == 0
    assert (tmp_path / "half" / "manifest.json").exists() and not (tmp_path / ".half.partial").exists()


def test_external_rows_join_the_runs_report(run, ga_copy):
    """After `score`, the run's experiments (re-executed by score for those it had run) show external:ga-copy beside the
    methods."""
    from lume_lab.pipeline.orchestration.runner import experiment_notebooks, run_notebook
    from lume_lab.pipeline.orchestration.score import refresh_report
    from lume_lab.pipeline.presentation.scorecard import scorecard
    st, f = run["store"], run["field"]
    # as if `lume-lab run` had run them
    for nb in experiment_notebooks(["e03", "e04"]): st.record_experiment(nb.stem, 0.0)
    assert refresh_report(st, run["root"], log=lambda *a: None) == ["e03_unlearn", "e04_localization"]
    t = pd.read_csv(st.dir / "report" / f"table2_{f}.csv", index_col=[0, 1])
    assert {"none", "grad_ascent", "external:ga-copy"} <= set(t.columns)
    assert (t["external:ga-copy"].loc[["forget", "retain"]] == t["grad_ascent"].loc[["forget", "retain"]]).all()
    card = scorecard([st.dir]).set_index("method")
    assert card.index.tolist()[:2] == ["none", "grad_ascent"] and "external:ga-copy" in card.index
    assert card.at["external:ga-copy", "auc_forget"] == card.at["grad_ascent", "auc_forget"]
    assert card.at["external:ga-copy", "cast_share"] == 0 and pd.isna(card.at["grad_ascent", "cast_share"])
    # `lume-lab stage` (a multi-process attack) knows it too
    from lume_lab.pipeline.orchestration.cli import stage_entries
    fin = st.entry(f"external_ga-copy_resurface_{f}")["finished"]
    # a cache hit: the attack's tables, nothing rerun
    got = stage_entries(st)[f"external_ga-copy_resurface_{f}"](st)
    pd.testing.assert_frame_equal(got["after"], pd.read_csv(_stage(run, "resurface") / "after.csv"))
    assert st.entry(f"external_ga-copy_resurface_{f}")["finished"] == fin


def test_score_says_when_there_is_nothing_to_judge(run, ga_copy, capsys):
    """`score` prints the report's "nothing to judge" sentence exactly when the run's model before unlearning
    answers under the floor of its forget questions (the smoke run memorizes little: the rule is tested,
    not the run)."""
    from lume_lab.metrics.evaluate import table2
    from lume_lab.pipeline.presentation.report import TESTBED_FLOOR
    st, f = run["store"], run["field"]
    em = table2(U.stage_evaluate_before(st, f), by="model").at[("forget", "em"), "none"]
    ctl = st.path(U.unlearn_name("grad_ascent", f, True)) / "model"
    capsys.readouterr()
    assert _score(run, ga_copy, "ga-copy", "--control", str(ctl)) == 0          # the same files: cached, nothing new
    out = capsys.readouterr().out
    assert (f"No testbed for {f}" in out and "nothing to judge" in out) == (em < TESTBED_FLOOR), (em, out[-400:])


def test_a_name_keeps_its_checkpoint(run, ga_copy, tmp_path, capsys):
    """Other weights under a name the run already scored: exit 2, nothing written, unless --replace.
    The same files again (from anywhere, with the same control) pass the check."""
    from lume_lab.pipeline.orchestration.score import check_score
    st, f = run["store"], run["field"]
    other = _hand_built(run, tmp_path / "other", lambda n, t, o: t + 0.01)
    ctl = st.path(U.unlearn_name("grad_ascent", f, True)) / "model"
    snap = (st.dir / "manifest.json").read_bytes(), sorted(x.name for x in st.dir.iterdir())
    for ckpt, extra, msg in (
        (other, ("--control", str(ctl)), "already scored external:ga-copy on " + f + " with other weights"),
        (ga_copy, (), "already scored external:ga-copy on " + f + " with another control run"),
    ):
        assert _score(run, ckpt, "ga-copy", *extra) == 2
        err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("lume-lab: error:")]
        assert len(err) == 1 and msg in err[0] and "--replace" in err[0], err
        assert ((st.dir / "manifest.json").read_bytes(), sorted(x.name for x in st.dir.iterdir())) == snap
    assert check_score(st, other, "ga-copy", control=ctl, replace=True) == f
    assert check_score(st, _copy_model(ga_copy, tmp_path / "moved"), "ga-copy", control=ctl) == f


def test_remove_takes_a_checkpoint_out_of_the_run_and_its_report(run, ga_copy, capsys):
    """`score --remove NAME`: its stages leave the manifest and the run directory, the refreshed Table 2 and the
    scorecard lose its rows together; removing it again, or a name never scored, exits 2."""
    from lume_lab.pipeline.orchestration.runner import experiment_notebooks
    from lume_lab.pipeline.orchestration.score import refresh_report
    from lume_lab.pipeline.presentation.scorecard import scorecard
    st, f, root = run["store"], run["field"], run["root"]
    for nb in experiment_notebooks(["e03"]): st.record_experiment(nb.stem, 0.0)
    X.stage_external_checkpoint(st, "rm-me", f, ga_copy)
    refresh_report(st, root, log=lambda *a: None); st.reload()
    ours = [k for k in st.manifest["stages"] if k.startswith("external_rm-me_")]
    assert {f"external_rm-me_checkpoint_{f}", f"external_rm-me_evaluate_{f}"} <= set(ours)
    table = st.dir / "report" / f"table2_{f}.csv"
    assert "external:rm-me" in pd.read_csv(table, index_col=[0, 1]).columns
    assert main(["score", RUN, "--remove", "rm-me", "--runs-root", str(root)]) == 0
    st.reload()
    assert not [k for k in st.manifest["stages"] if k.startswith("external_rm-me_")]
    assert not [x for x in st.dir.iterdir() if "external_rm-me_" in x.name]
    t = pd.read_csv(table, index_col=[0, 1])
    assert "external:rm-me" not in t.columns and "external:ga-copy" in t.columns
    card = scorecard([st.dir])
    assert "external:rm-me" not in set(card.method) and "external:ga-copy" in set(card.method)
    assert st.is_done(f"external_ga-copy_checkpoint_{f}")               # another name's stages stay
    capsys.readouterr()
    assert main(["score", RUN, "--remove", "rm-me", "--runs-root", str(root), "--no-report"]) == 2
    assert "has no external checkpoint 'rm-me' to remove" in capsys.readouterr().err
