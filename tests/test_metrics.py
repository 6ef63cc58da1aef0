"""Cross-module checks of lume_lab.metrics on a tiny random OLMo-2: batching invariance (left/right padding),
ES against real greedy generation, half-precision models, agreement with rouge-score / scikit-learn / HF loss,
edge cases (empty generation, single-token answers) and bad input."""
import math

import numpy as np
import pytest
import torch
from rouge_score import rouge_scorer
from sklearn.metrics import roc_auc_score
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Olmo2ForCausalLM, PreTrainedTokenizerFast

from lume_lab.metrics.knowledge import knowledge_scores, regurgitation_scores
from lume_lab.metrics.memorization import answer_token_stats, extraction_strength, memorization_scores
from lume_lab.metrics.mia import ATTACKS, mia_auc, mia_aucs, mia_scores, privleak
from lume_lab.metrics.ranking import ranking_scores
from lume_lab.metrics.rouge import deviation_score, rouge_scores
from lume_lab.models.lm import olmo2_config
from lume_lab.models.ops import encode_many, greedy_generate

CORPUS = ["Question: Where was Ann Lee born?\nAnswer: Paris", "Question: What is the email of Bob Stone?\nAnswer: "
                                                              "bob.stone@mail.com",
          "Question: What is the phone number of Cy?\nAnswer: 555-013-2741", "Jane Doe lives in Berlin and writes "
                                                                             "reviews."]


@pytest.fixture(scope="module")
def tok():
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tk.train_from_iterator(CORPUS * 10, tr)
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>")


def tiny_model(tok, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = olmo2_config(tokenizer=tok)
    return Olmo2ForCausalLM(cfg).eval().to(dtype)


@pytest.fixture(scope="module")
def model(tok): return tiny_model(tok)


# prompts and answers of very different lengths (so padding really varies), incl. a single-token answer and an empty
# prompt
QA = [{"prompt": "Question: Where was Ann Lee born?\nAnswer:", "answer": " Paris", "group": 0},
      {"prompt": "Question: What is the email of Bob Stone?\nAnswer:", "answer": " bob.stone@mail.com", "group": 1},
      {"prompt": "Q:", "answer": " 555-013-2741", "group": 2},
      {"prompt": "", "answer": "Jane Doe lives in Berlin and writes reviews.", "group": 3},
      {"prompt": "Question: What is the phone number of Cy?\nAnswer:", "answer": "P", "group": 4}]


def test_single_token_answer_is_single_token(tok):
    assert len(encode_many(tok, QA[4:], add_eos=False)[0][1]) == 1


@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_equals_one_at_a_time(tok, model, side):
    one = [answer_token_stats(model, tok, [e])[0] for e in QA]
    many = answer_token_stats(model, tok, QA, batch_size=len(QA), padding_side=side)
    # measured (torch 2.13 CPU, sdpa): log-probs differ by <= 5e-7 between a padded batch and single runs; ranks and
    # argmax are identical. Min-K%++'s z = (logp - mu)/sigma divides that noise by sigma (~0.02 for this random,
    # near-uniform model), measured <= 2.6e-5, hence its looser bound.
    for a, b in zip(one, many):
        assert (a["logprob"] - b["logprob"]).abs().max().item() < 1e-5
        assert (a["zscore"] - b["zscore"]).abs().max().item() < 1e-4
        assert torch.equal(a["rank"], b["rank"]) and torch.equal(a["correct"], b["correct"])
    m1 = memorization_scores(model, tok, QA, batch_size=1)
    m5 = memorization_scores(model, tok, QA, batch_size=5)
    assert (m1[["em", "es", "n_tokens"]] == m5[["em", "es", "n_tokens"]]).all().all()
    assert np.allclose(m1["prob"], m5["prob"], rtol=1e-5, atol=0)


def test_stats_match_unpadded_forward_and_hf_loss(tok, model):
    stats = answer_token_stats(model, tok, QA[:3], batch_size=3)
    for e, (p, a), s in zip(QA[:3], encode_many(tok, QA[:3], add_eos=False), stats):
        ids = torch.tensor([p + a])
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1:-1].float()
            hf_loss = model(ids, labels=torch.tensor([[-100] * len(p) + a])).loss.item()
        lp = torch.log_softmax(logits, -1)[torch.arange(len(a)), a]
        assert torch.allclose(lp, s["logprob"], atol=1e-5)
        assert torch.equal(logits.argmax(-1) == torch.tensor(a), s["correct"])
        order = torch.sort(logits, dim=-1, descending=True, stable=True).indices            # stable: ties by token id
        ranks = (order == torch.tensor(a)[:, None]).float().argmax(-1) + 1
        assert torch.equal(ranks, s["rank"])
        row = memorization_scores(model, tok, [e], stats=[s]).iloc[0]
        assert math.isclose(row["prob"], math.exp(-hf_loss), rel_tol=1e-5)   # Prob = exp(-mean answer NLL)


def test_extraction_strength_matches_greedy_generation(tok, model):
    # answers = 2 arbitrary tokens + the model's own greedy continuation, so ES >= (n-2)/n by construction -- when the
    # answer text re-tokenizes to the same ids (a random byte-level model also emits partial UTF-8 bytes; skip those)
    exs = []
    for p in [
        "Question: Where was Ann Lee born?\nAnswer:", "Q:", "Jane Doe", "Question: What is", "Bob", "Answer: 555"]:
        for h in (" Berlin", " x"):
            if len(exs) == 4:
                break
            head = tok(h, add_special_tokens=False)["input_ids"][:2]
            ids = head + greedy_generate(model, tok, [p + tok.decode(head)], max_new_tokens=4)[0]["ids"]
            if tok(tok.decode(ids), add_special_tokens=False)["input_ids"] == ids:
                exs.append({"prompt": p, "answer": tok.decode(ids)})
    assert len(exs) >= 3
    for e, s, (p, a) in zip(
        exs, answer_token_stats(model, tok, exs, batch_size=4), encode_many(tok, exs, add_eos=False)
    ):
        # reference ES: smallest k such that greedy decoding from prompt + a[:k] reproduces a[k:] (k = |a|: nothing
        # left)
        k_min = len(a)
        for k in range(len(a)):
            rest = a[k:]
            with torch.no_grad():
                out = model.generate(
                    torch.tensor([p + a[:k]]), attention_mask=torch.ones(1, len(p) + k, dtype=torch.long),
                    do_sample=False, max_new_tokens=len(rest), min_new_tokens=len(rest), pad_token_id=tok.pad_token_id,
                    eos_token_id=None)
            if out[0, len(p) + k :].tolist() == rest:
                k_min = k
                break
        assert extraction_strength(s["correct"]) == 1 - k_min / len(a)
        assert extraction_strength(s["correct"]) >= (len(a) - 2) / len(a) - 1e-12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_models_do_not_crash(tok, dtype):
    m = tiny_model(tok, dtype=dtype)
    mem = memorization_scores(m, tok, QA)
    assert mem[["em", "es", "prob"]].notna().all().all() and mem["prob"].between(0, 1).all()
    for prefix in ("teacher", "generated"):
        r = ranking_scores(m, tok, QA, prefix=prefix)
        assert r[["mrr", "thr"]].notna().all().all()
    mia = mia_scores(m, tok, QA, add_eos=False)
    assert np.isfinite(mia[list(ATTACKS)].to_numpy()).all()
    assert rouge_scores(m, tok, QA, max_new_tokens=3)["rouge1"].between(0, 1).all()
    st = answer_token_stats(m, tok, QA[:1])[0]
    assert st["logprob"].dtype == torch.float32


def test_generation_batched_left_padding(tok, model):
    prompts = [e["prompt"] for e in QA]
    one = [greedy_generate(model, tok, [p], max_new_tokens=5, return_logits=True)[0] for p in prompts]
    many = greedy_generate(model, tok, prompts, max_new_tokens=5, batch_size=5, return_logits=True)
    for a, b in zip(one, many):
        assert a["ids"] == b["ids"] and a["text"] == b["text"]
        assert (a["logits"] - b["logits"]).abs().max().item() < 1e-5


def test_empty_generation(tok):
    m = tiny_model(tok, seed=1)
    head = torch.nn.Linear(m.lm_head.in_features, m.lm_head.out_features, bias=True)   # EOS always wins by a mile
    with torch.no_grad(): head.weight.copy_(m.lm_head.weight); head.bias.zero_(); head.bias[tok.eos_token_id] = 1e3
    m.lm_head = head
    gens = greedy_generate(m, tok, [e["prompt"] for e in QA], max_new_tokens=4, return_logits=True)
    assert all(g["ids"] == [] and g["text"] == "" and g["logits"].shape[0] == 1 for g in gens)
    r = rouge_scores(m, tok, QA, max_new_tokens=4)
    assert (r["rouge1"] == 0).all() and (r["rougeL"] == 0).all()
    assert not knowledge_scores(m, tok, QA, max_new_tokens=4)["correct"].any()
    assert (regurgitation_scores(m, tok, QA, max_new_tokens=4)["regurgitation"] == 0).all()
    # generated-prefix ranks: only the first gold token has a distribution (the EOS step); the rest count 0
    gen = ranking_scores(m, tok, QA, prefix="generated")
    n_tok = [len(a) for _, a in encode_many(tok, QA, add_eos=False)]
    first = [s["rank"][0].item() for s in answer_token_stats(m, tok, QA)]
    for mrr, n, r1 in zip(gen["mrr"], n_tok, first):
        assert math.isclose(mrr, 1 / r1 / n, rel_tol=1e-9)


def test_rouge_agrees_with_rouge_score(tok, model):
    df = rouge_scores(model, tok, QA, max_new_tokens=8, f1=True)
    sc = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    muse = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)     # MUSE's RougeEvalLogger: F1, no stemming
    for e, (_, row) in zip(QA, df.iterrows()):
        ref = sc.score(e["answer"], row["generation"])
        assert row["rouge1"] == ref["rouge1"].recall and row["rougeL"] == ref["rougeL"].recall
        assert row["rougeL_f1"] == muse.score(e["answer"], row["generation"])["rougeL"].fmeasure
    assert df["group"].tolist() == [0, 1, 2, 3, 4]
    assert deviation_score(df["rouge1"].mean(), 1.0) == pytest.approx(100 * df["rouge1"].mean())


def test_mia_aucs_agree_with_sklearn(tok, model):
    mem = [{"prompt": f"Question: Where was person {i} born?\nAnswer:", "answer": f" City{i}"} for i in range(10)]
    non = [
        {"prompt": f"Question: What is the email of person {i}?\nAnswer:", "answer": f" p{i}@mail.com"}
        for i in range(10)
    ]
    aucs = mia_aucs(model, tok, mem, non, batch_size=4, add_eos=True)
    sm, sn = mia_scores(model, tok, mem, add_eos=True), mia_scores(model, tok, non, add_eos=True)
    for a in ATTACKS:
        ref = roc_auc_score([1] * 10 + [0] * 10, np.r_[sm[a], sn[a]])
        assert aucs[a] == pytest.approx(ref, abs=1e-12)
    assert mia_auc(sm["loss"], sm["loss"]) == 0.5


def test_privleak_matches_muse_construction(tok):
    # MUSE (swj0419/muse_bench, metrics/privleak.py + eval.py): forget texts labelled 0, holdout texts 1, ranked by -NLL
    # (higher = more likely), PrivLeak = (AUC - AUC_retrain) / AUC_retrain * 100. Our privleak takes our AUCs (members
    # positive, higher score = member) and must give the same number; a model that remembers its forget set is negative.
    qa = [{"prompt": f"Question: Where was person {i} born?\nAnswer:", "answer": f" City{i}"} for i in range(12)]
    # one template, interleaved: neither AUC is 0 or 1 by design
    members, holdout = qa[0::2], qa[1::2]
    def muse_auc(sf, sh): return roc_auc_score([0] * len(sf) + [1] * len(sh), np.r_[sf, sh])
    out = {}
    for seed in (0, 1):                                        # two random models: "unlearned" and "retrained"
        m = tiny_model(tok, seed=seed)
        sf, sh = mia_scores(m, tok, members, add_eos=True)["loss"], mia_scores(m, tok, holdout, add_eos=True)["loss"]
        out[seed] = (mia_auc(sf, sh), muse_auc(sf, sh))        # loss score = -mean NLL, MUSE's ranking key
    (ours_u, muse_u), (ours_r, muse_r) = out[0], out[1]
    assert ours_u == pytest.approx(1 - muse_u, abs=1e-12) and ours_r == pytest.approx(1 - muse_r, abs=1e-12)
    assert 0 < muse_r
    assert privleak(ours_u, ours_r) == pytest.approx((muse_u - muse_r) / muse_r * 100, abs=1e-9)
    assert privleak(1.0, 0.5) == -100 and privleak(0.95, 0.5) == pytest.approx(-90)   # remembering model: negative


def test_knowledge_exact_match_on_model_output(tok, model):
    gens = greedy_generate(model, tok, [e["prompt"] for e in QA], max_new_tokens=3)
    exs = [dict(e, answer=g["text"].upper() + " ") for e, g in zip(QA, gens)]   # the model's own answer, case changed
    k = knowledge_scores(model, tok, exs, max_new_tokens=3)
    assert k["correct"].all()


def test_bad_input(tok, model):
    with pytest.raises(ValueError, match="'prompt' and 'answer'"):
        memorization_scores(model, tok, [{"question": "a", "answer": "b"}])
    with pytest.raises(ValueError, match="has no tokens"):
        answer_token_stats(model, tok, [{"prompt": "Q", "answer": ""}])
    with pytest.raises(ValueError, match="batch_size"): answer_token_stats(model, tok, QA, batch_size=0)
    with pytest.raises(ValueError, match="max_new_tokens"): greedy_generate(model, tok, ["Q"], max_new_tokens=0)
    with pytest.raises(ValueError, match="list of strings"): greedy_generate(model, tok, "Q")
    with pytest.raises(ValueError, match="'teacher' or 'generated'"): ranking_scores(model, tok, QA, prefix="beam")
    with pytest.raises(ValueError, match="k must be"): mia_scores(model, tok, QA, k=1.5, add_eos=False)
    with pytest.raises(ValueError, match="rouge1_retain"): deviation_score(0.1, 80)
    nopad = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token="<eos>")
    # no pad token: EOS pads (never scored)
    for x, y in zip(answer_token_stats(model, nopad, QA), answer_token_stats(model, tok, QA)):
        torch.testing.assert_close(x["logprob"], y["logprob"], rtol=0, atol=1e-6)


def test_eval_mode_is_used_and_restored(tok):
    m = tiny_model(tok, seed=2)
    m.config.attention_dropout = 0.5
    # dropout on: train-mode results would be random
    for layer in m.model.layers: layer.self_attn.attention_dropout = 0.5
    m.train()
    a = answer_token_stats(m, tok, QA[:2])
    b = answer_token_stats(m, tok, QA[:2])
    assert m.training
    assert all(torch.equal(x["logprob"], y["logprob"]) for x, y in zip(a, b))
    greedy_generate(m, tok, ["Q:"], max_new_tokens=2)
    assert m.training
