"""lume_lab.metrics.evaluate / utility end to end on the toy OLMo-2 problem of models.toy: the tidy table equals the
individual metric functions, memorization raises EM, Δ utility of a model vs itself is 0, one forward per batch for all
teacher-forced metrics together, and bad input fails before compute."""
import math

import matplotlib
matplotlib.use("Agg")
import pandas as pd
import pytest
import torch

from lume_lab.metrics.evaluate import METRICS, TEACHER_METRICS, evaluate, plot_unlearning, table2
from lume_lab.metrics.memorization import memorization_scores
from lume_lab.metrics.ranking import ranking_scores
from lume_lab.metrics.rouge import deviation_score, rouge_scores
from lume_lab.metrics.utility import (
    lm_eval_available, lm_eval_scores, mc_accuracy, perplexity, utility_delta, utility_scores)
from lume_lab.models.ops import greedy_generate, reveals
from lume_lab.models.toy import toy_problem

FACTS = [("France", "Paris"), ("Peru", "Lima"), ("Norway", "Oslo"), ("Italy", "Rome"), ("Chile", "Santiago")]
WORLD = {
    "mc": [
        dict(
            prompt=f"Question: What is the capital of {s}?\nAnswer:",
            options=[o for _, o in FACTS[:4]],
            answer_idx=i % 4,
        )
        for i, (s, _) in enumerate(FACTS)
    ],
    "heldout": [{"text": f"The capital of {s} is {o}."} for s, o in FACTS] + [{"text": "Where was Ada Moss born?"}],
}


@pytest.fixture(scope="module")
def untrained():
    return toy_problem(seed=0, finetune_steps=0)


@pytest.fixture(scope="module")
def trained():
    return toy_problem(seed=0, finetune_steps=60)


def _val(df, split, metric): return df[(df.split == split) & (df.metric == metric)].value.item()


def test_values_equal_individual_metric_functions(trained):
    model, tok, forget, retain = trained
    splits = {"forget": forget, "retain": retain[:5]}
    df = evaluate(model, tok, splits, world=WORLD, batch_size=3, max_new_tokens=12)
    assert list(df.columns) == ["split", "metric", "value", "n_profiles", "n_rows"]
    assert len(df) == len(df.drop_duplicates(["split", "metric"]))               # tidy: one row per (split, metric)
    for name, ex in splits.items():
        # same batch size as evaluate, so the same padding: the numbers must agree to the last bit, not just closely
        mem, rk = memorization_scores(model, tok, ex, batch_size=3), ranking_scores(model, tok, ex, batch_size=3)
        rg = rouge_scores(model, tok, ex, max_new_tokens=12, batch_size=3)
        texts = [g["text"] for g in greedy_generate(model, tok, [e["prompt"] for e in ex], 12, batch_size=3)]
        expect = {
            "em": mem.em.mean(), "es": mem.es.mean(), "prob": mem.prob.mean(), "mrr": rk.mrr.mean(),
            "thr": rk.thr.mean(), "rouge1": rg.rouge1.mean(), "rougeL": rg.rougeL.mean(),
            "accuracy": sum(reveals(t, e["answer"]) for t, e in zip(texts, ex)) / len(ex)}
        for k, v in expect.items(): assert _val(df, name, k) == v, (name, k)
        assert (df[df.split == name].n_rows == len(ex)).all()
        assert (df[df.split == name].n_profiles == len({e["profile_id"] for e in ex})).all()
    r1 = {s: rouge_scores(model, tok, ex, max_new_tokens=12, batch_size=3).rouge1.mean() for s, ex in splits.items()}
    assert _val(df, "forget/retain", "ds") == pytest.approx(deviation_score(r1["forget"], r1["retain"]))
    assert _val(df, "utility", "mc_acc") == mc_accuracy(model, tok, WORLD["mc"], batch_size=3)["acc"]
    assert (
        _val(df, "utility", "perplexity")
        == perplexity(model, tok, [r["text"] for r in WORLD["heldout"]], batch_size=3)["perplexity"]
    )
    assert "utility_delta" not in set(df.split)                                    # no reference given


def test_memorizing_model_scores_higher_em(trained, untrained):
    m1, tok, forget, _ = trained
    m0 = untrained[0]
    e1 = _val(evaluate(m1, tok, {"forget": forget}, metrics=["em", "accuracy"], max_new_tokens=12), "forget", "em")
    e0 = _val(evaluate(m0, tok, {"forget": forget}, metrics=["em", "accuracy"], max_new_tokens=12), "forget", "em")
    assert e1 > e0 + 0.3, (e1, e0)


def test_utility_delta_vs_itself_is_zero(untrained):
    model, tok, forget, _ = untrained
    ref = utility_scores(model, tok, WORLD)
    assert ref["n_mc"] == 5 and ref["n_heldout"] == 6 and not math.isnan(ref["perplexity"])
    df = evaluate(model, tok, {"forget": forget[:2]}, world=WORLD, reference_utility=ref, metrics="em")
    d = df[df.split == "utility_delta"]
    assert set(d.metric) == {"mc_acc", "mc_acc_norm", "perplexity", "nll"} and (d.value == 0).all()
    # a different reference gives a non-zero Δ of the right sign
    other = dict(ref, mc_acc=ref["mc_acc"] + 0.2)
    assert utility_delta(ref, other)["mc_acc"] == pytest.approx(-0.2)


def _count_forwards(model):
    calls = {"teacher": 0, "generate": 0}
    def hook(mod, args, kwargs):
        # generation steps carry a cache: `past_key_values` before transformers 5.24, `cache` since
        calls["generate" if any(kwargs.get(k) is not None for k in ("past_key_values", "cache")) else "teacher"] += 1
    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_one_forward_per_batch_for_teacher_forced_metrics(untrained):
    model, tok, forget, retain = untrained
    splits, bs = {"forget": forget, "retain": retain[:5]}, 3                     # 8 and 5 examples → 3 + 2 batches
    batches = sum(math.ceil(len(v) / bs) for v in splits.values())
    calls, h = _count_forwards(model)
    try:
        evaluate(model, tok, splits, batch_size=bs, metrics=TEACHER_METRICS)      # em, es, prob, mrr, thr together
        assert calls == {"teacher": batches, "generate": 0}, calls
        calls.update(teacher=0, generate=0)
        # + ROUGE and accuracy: one generation per split
        evaluate(model, tok, splits, batch_size=bs, max_new_tokens=4)
        assert calls["teacher"] == batches and 0 < calls["generate"] <= batches * 4, calls
    finally:
        h.remove()


def test_table2_and_plot(untrained):
    model, tok, forget, retain = untrained
    ref = utility_scores(model, tok, WORLD)
    runs = [evaluate(model, tok, {"forget": forget[:3], "retain": retain[:3]}, world=WORLD, reference_utility=ref,
                     metrics=["em", "rouge1"], max_new_tokens=4, model_name=n) for n in ("A", "B")]
    df = pd.concat(runs)
    t = table2(df)
    assert (
        list(t.columns) == ["n_profiles", "n_rows", "A", "B"]
        and t.loc[("forget", "em"), "n_rows"] == 3
        and t.loc[("forget", "em"), "A"] == pytest.approx(100 * _val(runs[0], "forget", "em"))
    )
    assert t.index[0] == ("forget", "em") and ("forget/retain", "ds") in t.index
    one = table2(runs[0].drop(columns="model"), percent=False)
    assert one.loc["utility", "mc_acc"] == ref["mc_acc"] and list(one.index[:2]) == ["forget", "retain"]
    fig = plot_unlearning(df)
    assert len(fig.axes[0].patches) >= 6
    with pytest.raises(ValueError, match="model"): plot_unlearning(runs[0].drop(columns="model"))


@pytest.mark.parametrize("splits, match", [
    ({"forgett": [{"prompt": "Q:", "answer": " a"}]}, "forgett"),
    ({"forget": []}, "'forget' is empty"),
    ({}, "non-empty dict"),
    ([{"prompt": "Q:", "answer": " a"}], "non-empty dict"),
    ({"retain": [{"prompt": "Q:"}]}, "row 0"),
    ({"retain": [{"prompt": "Q:", "answer": "  "}]}, "non-empty string 'answer'"),
])
def test_bad_splits_raise_before_compute(untrained, splits, match):
    model, tok, *_ = untrained
    calls, h = _count_forwards(model)
    try:
        with pytest.raises(ValueError, match=match): evaluate(model, tok, splits)
    finally:
        h.remove()
    assert calls == {"teacher": 0, "generate": 0}


def test_other_bad_input(untrained):
    model, tok, forget, _ = untrained
    with pytest.raises(ValueError, match="bleu"): evaluate(model, tok, {"forget": forget}, metrics=["em", "bleu"])
    with pytest.raises(ValueError, match="needs world"):
        evaluate(model, tok, {"forget": forget}, reference_utility={"mc_acc": 0.5})
    with pytest.raises(ValueError, match="'heldout'"): utility_scores(model, tok, {"mc": WORLD["mc"]})
    with pytest.raises(ValueError, match="n_mc"): utility_delta({"mc_acc": 0.5, "n_mc": 4}, {"mc_acc": 0.5, "n_mc": 5})
    with pytest.raises(ValueError, match="tasks"): lm_eval_scores(model, tok, [])
    if not lm_eval_available():   # not a dependency of lume_lab: the bridge must say so clearly
        with pytest.raises(ImportError, match="not installed"): lm_eval_scores(model, tok, ["arc_easy"])
