"""The LUME experiment (e08, LUME §4) on a smoke run:
retain-only training set, MIA precondition, per-epoch rows, bad config."""
import pandas as pd
import pytest

from lume_lab.core.config import ConfigError, LUME_METHODS, make_config
from lume_lab.core.store import open_run
from lume_lab.metrics.mia import mia_auc, mia_scores
from lume_lab.pipeline.stages import lume as L
from lume_lab.pipeline.orchestration.config import resolve_config

SMOKE = {"pretrain.steps": 16, "pretrain.checkpoint_every": 8}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = resolve_config(make_config("smoke", SMOKE))
    store = open_run("lume", cfg, tmp_path_factory.mktemp("runs"))
    return store, L.lume_results(store)


def test_retain_only_never_saw_a_forget_document(run):
    store, _ = run
    train = pd.read_csv(store.path("lume_retain_only") / "train_rows.csv", keep_default_na=False)
    lume = L.stage_lume(store)
    forget_docs, forget_qa = list(lume["forget_docs"]), list(lume["forget_qa"])
    assert len(train) and set(train.split) == {"retain"}
    assert not set(train.doc_id) & {d["doc_id"] for d in forget_docs}
    # no forget document, whole or inside
    assert not any(d["text"] in t for d in forget_docs for t in train.text)
    assert not set(train.text) & {q["prompt"] + q["answer"] for q in forget_qa}       # no forget question
    # the target model's training set does hold them: the check above can fail
    target = pd.read_csv(store.path("lume_target") / "train_rows.csv", keep_default_na=False)
    assert {"forget", "retain"} == set(target.split)


def test_nonmembers_are_unseen_documents_of_every_task(run):
    store, _ = run
    nm = L.stage_lume_nonmembers(store)
    lume = L.stage_lume(store)
    assert set(nm.task) == set(store.config.lume.tasks)
    n, size = store.config.lume_exp.n_nonmembers, nm.groupby("task").size()
    # public: at most the world's held-out people
    assert size["creative"] == size["pii"] == n and 1 <= size["public"] <= n
    seen = {d["text"] for s in ("forget_docs", "retain_docs") for d in lume[s]}
    assert not set(nm.text) & seen


def test_target_separates_members_from_unseen_documents(run):
    """The MIA precondition with a wide margin:
    members' mean NLL is far below unseen documents', so the AUC > 0.5 is no float luck."""
    store, res = run
    cfg = store.config
    model, tok = L.load_lume_model(store, "target")
    members = L.lume_subset(L.stage_lume(store), cfg.lume_exp.docs_per_task)["forget_docs"]
    doc = lambda t: {"prompt": "", "answer": L._cut_right(tok, t, cfg.model.max_seq_len - 1)}
    sm = mia_scores(model, tok, [doc(d["text"]) for d in members], add_eos=False)
    sn = mia_scores(model, tok, [doc(t) for t in L.stage_lume_nonmembers(store).text], add_eos=False)
    assert sm.loss.mean() - sn.loss.mean() > 1.0, (sm.loss.mean(), sn.loss.mean())
    auc = res[(res.label == "target") & (res.metric == "mia_loss") & (res.task == "all")].value.item()
    assert auc == pytest.approx(mia_auc(sm.loss, sn.loss)) and auc > 0.5


def test_scores_for_every_method_and_epoch(run):
    store, res = run
    e = store.config.lume_exp
    assert set(e.methods) == set(LUME_METHODS)
    assert set(res.label) == {*L.REFERENCES, *LUME_METHODS}
    metrics = {"regurgitation", "knowledge", "mia_loss", "mc_acc", "perplexity"}
    for m in LUME_METHODS:
        r = res[res.label == m]
        assert set(r.epoch) == set(range(e.epochs + 1)), m
        for ep in range(e.epochs + 1):
            x = r[r.epoch == ep]
            assert metrics <= set(x.metric), (m, ep)
            got = set(map(tuple, x[x.metric.isin(["regurgitation", "knowledge"])][["task", "split"]].values))
            assert got == {(t, s) for t in store.config.lume.tasks for s in ("forget", "retain")}, (m, ep)
        assert (r[r.epoch > 0].train_seconds > 0).all()
    assert res.value[res.metric.isin(["regurgitation", "knowledge", "mia_loss", "mc_acc"])].between(0, 1).all()
    # epoch 0 of a method is the target model; a weight-changing method moves away from it by its last epoch
    t0 = res[(res.label == "target")].set_index(["task", "split", "metric"]).value
    ga = res[(res.label == "grad_ascent") & (res.epoch == 0)].set_index(["task", "split", "metric"]).value
    pd.testing.assert_series_equal(t0.sort_index(), ga.sort_index())
    s = L.lume_summary(res).set_index("label")
    assert s.loc["grad_ascent", "epoch"] == e.epochs and s.loc["target", "epoch"] == 0


def test_rerun_is_cached(run):
    store, res = run
    done = {k: v["finished"] for k, v in store.manifest["stages"].items() if k.startswith("lume_")}
    again = L.lume_results(store)
    pd.testing.assert_frame_equal(res, again)
    assert {k: v["finished"] for k, v in store.manifest["stages"].items() if k.startswith("lume_")} == done


@pytest.mark.parametrize("over, msg", [
    ({"lume_exp.methods": ["grad_ascent", "dpo"]}, "lume_exp.methods must be a non-empty list of distinct methods from "
                                                   "grad_ascent, grad_diff, ukl, npo, uld"),
    ({"lume_exp.finetune_epochs": 0}, "lume_exp.finetune_epochs must be a positive int"),
    ({"lume_exp.lr": -1}, "lume_exp.lr must be a positive number"),
    ({"lume_exp.docs_per_task": 0}, "lume_exp.docs_per_task must be None (all documents) or a positive int"),
    ({"lume_exp.hparams": {"npo": "fast"}}, "lume_exp.hparams must be a dict method -> {hyperparameter: value}"),
])
def test_bad_config_names_the_field(over, msg):
    with pytest.raises(ConfigError, match=None) as e: make_config("smoke", over)
    assert msg in str(e.value)


def test_bad_method_hparams_fail_before_compute(tmp_path):
    cfg = resolve_config(
        make_config("smoke", {**SMOKE, "lume_exp.hparams": {"npo": {"beta": -1}, "uld": {"bogus": 1}}})
    )
    store = open_run("bad", cfg, tmp_path)
    with pytest.raises(ConfigError) as e: L.lume_results(store)
    assert "lume_exp.hparams.npo: npo.beta must be a positive number" in str(e.value)
    assert "lume_exp.hparams.uld: unknown hyperparameter(s) 'bogus'" in str(e.value)
    assert not store.manifest["stages"]          # nothing ran
