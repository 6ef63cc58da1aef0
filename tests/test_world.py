"""End-to-end and bad-input tests of `lume_lab.data.world` (the corpus, the held-out split, MC items) and of their
scoring in `lume_lab.metrics.utility`."""
import dataclasses, math
from collections import Counter

import numpy as np
import pytest
import torch

from lume_lab.core.config import ConfigError, make_config
from lume_lab.data.world import build_world, corpus_texts, load_world, world_facts, world_stats
from lume_lab.metrics.utility import mc_accuracy, mc_scores, perplexity


@pytest.fixture(scope="module")
def smoke():
    return make_config("smoke")


@pytest.fixture(scope="module")
def world(smoke, tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    return build_world(smoke.world, smoke.seed, d), d


@pytest.fixture(scope="module")
def tiny_lm(world):
    "A BPE tokenizer trained on part of the corpus and a random 2-layer OLMo-2."
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Olmo2ForCausalLM, PreTrainedTokenizerFast
    from lume_lab.models.lm import olmo2_config
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus_texts(world[0])[:1500], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|pad|>")
    torch.manual_seed(0)
    cfg = olmo2_config(tokenizer=tok, max_positions=256)
    return Olmo2ForCausalLM(cfg).eval(), tok


def _rows(ds): return {k: ds[k].to_list() for k in ds}


def test_same_seed_same_world_other_seed_other_world(smoke, world):
    w, _ = world
    again = build_world(smoke.world, smoke.seed)
    assert _rows(again) == _rows(w)
    other = build_world(smoke.world, smoke.seed + 1)
    assert corpus_texts(other) != corpus_texts(w)
    assert list(other["mc"]["question"]) != list(w["mc"]["question"])


def test_save_and_load_roundtrip(world):
    w, d = world
    assert _rows(load_world(d)) == _rows(w)


def test_mc_items_well_formed_and_answerable(smoke, world):
    w, _ = world
    facts = {(f["subject"], f["relation"]): f for f in w["facts"]}
    assert len(w["mc"]) == smoke.world.n_mc_questions and len(w["mc_control"]) == smoke.world.n_mc_questions
    for split, seen in (("mc", True), ("mc_control", False)):
        for it in w[split]:
            assert len(it["options"]) == smoke.world.n_mc_options >= 4
            assert len(set(it["options"])) == len(it["options"])
            assert it["options"][it["answer_idx"]] == it["answer"]
            f = facts[it["subject"], it["relation"]]
            assert f["object"] == it["answer"] and f["seen"] is seen
            assert it["prompt"] == f"Question: {it['question']}\nAnswer:"
    # gold positions are spread over the options, not always the same slot
    assert len(set(w["mc"]["answer_idx"])) == smoke.world.n_mc_options


def test_heldout_forms_and_unseen_facts_never_in_training(world):
    w, _ = world
    corpus = corpus_texts(w)
    train, joined = set(corpus), "\n".join(corpus)
    assert not any(t in train for t in w["heldout"]["text"])
    # the MC-only phrasing never appears; a control item's training-form question never appears with its answer
    held_q = [
        p.removeprefix("Question: ").removesuffix("\nAnswer:")
        for p in list(w["mc"]["heldout_prompt"]) + list(w["mc_control"]["heldout_prompt"])
    ]
    assert not any(q in joined for q in held_q)
    assert not any(f"{it['prompt']} {it['answer']}" in joined for it in w["mc_control"])
    # an unseen fact's subject-object pair is never stated together in a list or table row
    for it in w["mc_control"].select(range(10)):
        assert f"- {it['subject']}: {it['answer']}\n" not in joined + "\n"
        assert f"| {it['subject']} | {it['answer']} |" not in joined
    # seen MC facts do appear in training, in other surface forms
    assert sum(it["subject"] in joined and it["answer"] in joined for it in w["mc"]) == len(w["mc"])
    kinds = set(w["heldout"]["kind"])
    assert kinds == {"heldout_form", "unseen_fact", "unseen_person"}
    assert set(w["train"]["source"]) == {"fact", "person"}


def test_mini_corpus_size():
    cfg = make_config("mini").world
    w = build_world(cfg, 0)
    chars = sum(map(len, corpus_texts(w)))
    # ~700 facts + 100 public people: ~180k tokens, 7 epochs of pretraining
    assert 300_000 <= chars <= 1_500_000, chars
    assert max(Counter(f["relation"] for f in w["facts"]).values()) <= cfg.facts_per_relation
    st = world_stats(w)
    assert st[st.split == "train"].docs.sum() == len(w["train"])
    assert len(w["mc"]) == 200


def _manual_ll(model, tok, prompt, option):
    "Log-likelihood of ' option' after prompt, from one unpadded forward pass."
    ctx = tok(prompt, add_special_tokens=False)["input_ids"]
    full = tok(prompt + " " + option, add_special_tokens=False)["input_ids"]
    assert full[:len(ctx)] == ctx
    with torch.no_grad(): logp = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
    return sum(logp[t - 1, full[t]].item() for t in range(len(ctx), len(full)))


def test_mc_accuracy_equals_manual_computation(world, tiny_lm):
    model, tok = tiny_lm
    items = [dict(it) for it in world[0]["mc"].select(range(2))]
    manual = [[_manual_ll(model, tok, it["prompt"], o) for o in it["options"]] for it in items]
    # make item 0 right and item 1 wrong under the manual scores
    items[0]["answer_idx"] = int(np.argmax(manual[0]))
    items[1]["answer_idx"] = int(np.argmin(manual[1]))
    got = mc_scores(model, tok, items, batch_size=8)
    np.testing.assert_allclose(np.array(got), np.array(manual), atol=1e-4)
    r = mc_accuracy(model, tok, items, batch_size=8)
    assert r["acc"] == 0.5 and r["n"] == 2 and r["chance"] == 0.25
    norm = [int(np.argmax(np.array(m) / np.array([len(o) for o in it["options"]]))) == it["answer_idx"]
            for m, it in zip(manual, items)]
    assert r["acc_norm"] == np.mean(norm)


def test_padding_does_not_change_scores(world, tiny_lm):
    model, tok = tiny_lm
    items = world[0]["mc"].select(range(12)).to_list()
    lens = {len(tok(it["prompt"] + " " + o)["input_ids"]) for it in items for o in it["options"]}
    assert len(lens) > 3  # different lengths, so batches are padded
    one = mc_scores(model, tok, items, batch_size=1)
    for bs in (5, 48):
        np.testing.assert_allclose(np.array(mc_scores(model, tok, items, batch_size=bs)), np.array(one), atol=1e-5)
    texts = list(world[0]["heldout"]["text"][:10])
    assert perplexity(model, tok, texts, batch_size=1)["nll"] == pytest.approx(
        perplexity(model, tok, texts, batch_size=7)["nll"], abs=1e-5
    )


def test_perplexity_matches_manual(world, tiny_lm):
    model, tok = tiny_lm
    texts = list(world[0]["heldout"]["text"][:3])
    tot, n = 0.0, 0
    for t in texts:
        ids = torch.tensor([[tok.eos_token_id] + tok(t)["input_ids"]])
        with torch.no_grad(): loss = model(input_ids=ids, labels=ids).loss.item()  # mean over ids[1:]
        tot += loss * (ids.shape[1] - 1); n += ids.shape[1] - 1
    p = perplexity(model, tok, texts, batch_size=2)
    assert p["n_tokens"] == n and p["n_texts"] == 3
    assert p["nll"] == pytest.approx(tot / n, abs=1e-5)
    assert p["perplexity"] == pytest.approx(math.exp(tot / n), rel=1e-5)


def test_scoring_leaves_model_mode(tiny_lm, world):
    model, tok = tiny_lm
    model.train()
    mc_accuracy(model, tok, world[0]["mc"].select(range(2)).to_list())
    assert model.training
    model.eval()


@pytest.mark.parametrize("field, value, msg", [
    ("n_mc_options", 3, "world.n_mc_options must be an int >= 4"),
    ("heldout_fraction", 0.0, "world.heldout_fraction must be a number in (0, 1)"),
    ("heldout_fraction", 1.0, "world.heldout_fraction must be a number in (0, 1)"),
    ("n_public_people", 0, "world.n_public_people must be a positive int"),
    ("n_mc_questions", 2.5, "world.n_mc_questions must be a positive int"),
])
def test_bad_world_config(smoke, field, value, msg):
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        build_world(dataclasses.replace(smoke.world, **{field: value}), 0)


def test_bad_inputs(smoke, tmp_path, tiny_lm):
    model, tok = tiny_lm
    with pytest.raises(ConfigError, match="world_cfg must be a WorldConfig"): build_world(smoke, 0)
    with pytest.raises(ValueError, match="content_types must be a non-empty subset of wiki"):
        build_world(smoke.world, 0, content_types=["blog"])
    with pytest.raises(ValueError, match="seed must be a non-negative int"): build_world(smoke.world, -1)
    with pytest.raises(FileNotFoundError, match="no world in"): load_world(tmp_path / "nothing")
    with pytest.raises(ValueError, match="items is empty"): mc_accuracy(model, tok, [])
    with pytest.raises(ValueError, match="need a 'prompt' field"):
        mc_accuracy(model, tok, [dict(question="q", options=["a", "b"], answer_idx=0)])
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        perplexity(model, tok, ["a b"], batch_size=0)
    with pytest.raises(ValueError, match="texts must be a list of strings"): perplexity(model, tok, "a b")
    with pytest.raises(ValueError, match="n_cities must be a non-negative int"): world_facts(-5)
