"""PISTOL's experiment (`lume_lab.pipeline.stages.pistol`): the fine-tuned smoke model reaches the stopping
criterion before unlearning, the tables' DS is the DS of the ROUGE-1 means they show, and bad config fails naming the
field."""
import json

import pandas as pd
import pytest

from lume_lab.core.config import ConfigError, make_config
from lume_lab.core.store import open_run
from lume_lab.metrics.rouge import deviation_score, rouge_scores
from lume_lab.pipeline.stages import pistol as P
from lume_lab.pipeline.orchestration.cli import main
from lume_lab.pipeline.orchestration.config import resolve_config
from lume_lab.pipeline.stages.base import load_stage_model

# a small PISTOL: one question per contract (20 QA rows on Dataset 1), so a 4-layer smoke model memorizes them all; the
# stopping rule trains until the target is reached, with ten times the epochs it needs (~40 of 400), on any CPU.
SMALL = {
    "pretrain.steps": 16, "pretrain.checkpoint_every": 8, "pistol.questions_per_contract": 1,
    "pistol.studies": ["degree"], "pistol.methods": ["grad_ascent", "npo"], "pistol.lrs": [1e-3, 1e-2],
    "pistol.seeds": 2, "pistol.unlearn_epochs": 1, "pistol.finetune_epochs": 400, "pistol.finetune_check_every": 20,
    "pistol.finetune_lr": 3e-3, "pistol.finetune_target": 0.8}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return open_run("pistol", resolve_config(make_config("smoke", SMALL)), tmp_path_factory.mktemp("runs"))


def test_finetune_reaches_criterion_before_unlearning(store):
    "The stage stops at the target, and the saved model's own ROUGE-1 on the QA (recomputed here) is at or above it."
    p = store.config.pistol
    log = P.finetune_log(store, "dataset1")
    assert log.reached.iloc[-1] and not log.reached.iloc[:-1].any()           # stops at the first check that reaches it
    assert log.epoch.iloc[-1] <= p.finetune_epochs
    model, tok = load_stage_model(store, "pistol_finetune_dataset1")
    rows = P.pistol_qa(store, "dataset1").to_list()
    assert len(rows) == 20 and {r["question_id"] for r in rows} == {1}
    r1 = rouge_scores(model, tok, rows, max_new_tokens=p.max_new_tokens).rouge1.mean()
    assert r1 == pytest.approx(log.rouge1_mean.iloc[-1]) and r1 >= p.finetune_target
    base, _ = load_stage_model(store, "base")                                  # the criterion is learned, not given
    assert rouge_scores(base, tok, rows, max_new_tokens=p.max_new_tokens).rouge1.mean() < p.finetune_target


def test_table_ds_is_ds_of_the_rouge1_it_shows(store):
    """Every row's DS is deviation_score of that row's forget / retain ROUGE-1 means.
    Those means are the runs' means at the chosen lr."""
    p = store.config.pistol
    runs = pd.concat([P.stage_pistol_degree(store, m) for m in p.methods], ignore_index=True)
    lrs = {m: P.chosen_lr(store, m) for m in p.methods}
    assert set(runs.lr) == set(p.lrs) and all(lrs[m]["lr"] in p.lrs for m in p.methods)
    chosen = runs[runs.chosen]
    assert (chosen.groupby(["method", "edge"]).size() == p.seeds).all()      # seed 0 of the sweep + the other seeds
    before = P.before_rows(store, "dataset1", [(e, {}) for e in P.DEGREE_EDGES])
    t = P.pistol_table(pd.concat([before, chosen], ignore_index=True), "edge", P.PAPER_TABLE2_DS, lrs)
    assert set(t.method) == {"none", *p.methods} and set(t.edge) == set(P.DEGREE_EDGES)
    for _, r in t.iterrows():
        assert r.ds == pytest.approx(deviation_score(r.forget_rouge1, r.retain_rouge1))
        src = (
            chosen[(chosen.method == r.method) & (chosen.edge == r.edge)]
            if r.method != "none"
            else before[before.edge == r.edge]
        )
        assert r.forget_rouge1 == pytest.approx(src.forget_rouge1.mean()) and r.retain_rouge1 == pytest.approx(
            src.retain_rouge1.mean()
        )
    assert t.set_index(["edge", "method"]).at[("A-B", "grad_ascent"), "ds Llama2-7B (paper)"] == 54.4
    # the learning rate kept is the sweep's most-forgetting one among those that keep the retain floor (or flagged)
    for m in p.methods:
        g = runs[(runs.method == m) & (runs.phase == "sweep")].groupby("lr")[["forget_rouge1", "retain_rouge1"]].mean()
        ok = g[g.retain_rouge1 >= p.retain_floor]
        assert lrs[m] == {
            **lrs[m],
            "lr": ok.forget_rouge1.idxmin() if len(ok) else g.retain_rouge1.idxmax(),
            "floor_met": bool(len(ok)),
        }
    # a rerun is a cache hit
    fin = store.entry("pistol_degree_npo")["finished"]; P.stage_pistol_degree(store, "npo")
    assert store.entry("pistol_degree_npo")["finished"] == fin


@pytest.mark.parametrize("override, field", [
    ({"pistol.methods": ["sgd"]}, "pistol.methods"), ({"pistol.studies": ["density"]}, "pistol.studies"),
    ({"pistol.lrs": [0.0]}, "pistol.lrs"), ({"pistol.seeds": 0}, "pistol.seeds"),
    ({"pistol.finetune_target": 0}, "pistol.finetune_target"),
    ({"pistol.questions_per_contract": 0}, "pistol.questions_per_contract"),
    ({"pistol.eval_retain_rows": -1}, "pistol.eval_retain_rows"),
    ({"pistol.max_new_tokens": 2.5}, "pistol.max_new_tokens")])
def test_bad_pistol_config_names_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")): make_config("smoke", override)


def test_bad_config_fails_before_compute(tmp_path, capsys):
    "`lume-lab run` refuses a bad pistol value, naming the field and what is allowed, before it creates the run."
    assert (
        main(
            [
                "run", "--preset", "smoke", "--run-id", "bad", "--runs-root", str(tmp_path), "--set",
                "pistol.retain_floor=2"]
        )
        == 2
    )
    assert "pistol.retain_floor must be a number >= 0 and <= 1, got 2" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
