"Cross-module tests of the localize-first / editing / inference-time methods: MemFlex, AlphaEdit, ULD."
import copy

import pytest
import torch

from lume_lab.core.config import PRESETS
from lume_lab.models.ops import qa_nll
from lume_lab.models.toy import toy_problem
from lume_lab.unlearn.registry import get_spec
from lume_lab.unlearn.dpo import with_idk_answers
from lume_lab.unlearn.memflex import memflex_select
from lume_lab.unlearn.alphaedit import preserved_keys, down_proj
from lume_lab.unlearn.uld import ULDModel

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def problem():
    return toy_problem(seed=0)


def _params(m): return {n: p.detach().clone() for n, p in m.named_parameters()}


def test_memflex_rule_and_frozen_tensors(problem):
    model, tok, forget, retain = problem
    names, table = memflex_select(model, tok, forget, retain, sim_threshold=0.92, grad_threshold=1e-5)
    rule = table[(table.cos < 0.92) & (table.mean_grad > 1e-5)].name.tolist()
    assert names == rule and 0 < len(names) < len(table)
    # stricter thresholds select a subset
    names2, _ = memflex_select(model, tok, forget, retain, sim_threshold=0.0, grad_threshold=2e-5)
    assert set(names2) <= set(names)
    before = _params(model)
    hp = {"lr": 1e-2, "max_steps": 6, "forget_factor": -1.0, "retain_factor": 3.0, "grad_threshold": 1e-5}
    unl, log = get_spec("memflex").run(copy.deepcopy(model), tok, forget, retain, hp)
    after = _params(unl)
    assert log.attrs["selected"] == names
    for n in before:
        if n not in names: assert torch.equal(before[n], after[n]), n
    assert all(not torch.equal(before[n], after[n]) for n in names)
    assert qa_nll(unl, tok, forget) > qa_nll(model, tok, forget) + 0.1


def test_memflex_refuses_empty_selection(problem):
    model, tok, forget, retain = problem
    with pytest.raises(ValueError, match="selected no tensor"):
        get_spec("memflex").run(copy.deepcopy(model), tok, forget, retain, {"grad_threshold": 1.0, "max_steps": 1})


def test_alphaedit_null_space_and_target(problem):
    model, tok, forget, retain = problem
    layers = [1, 2]
    edited, log = get_spec("alphaedit").run(copy.deepcopy(model), tok, forget, retain, {"layers": layers})
    texts = [e["prompt"] + e["answer"] for e in retain]          # mom2_data = ["retain"] (default)
    for l in layers:
        K0 = torch.cat([ks[l] for ks in preserved_keys(model, tok, texts, [l])]).T       # d_k × N
        W0, W1 = down_proj(model, l).weight.detach(), down_proj(edited, l).weight.detach()
        dW = W1 - W0
        assert dW.norm() > 1.0                                     # a real edit
        ratio = ((dW @ K0).norm() / (W0 @ K0).norm()).item()
        cut = log[(log.phase == "null_space") & (log.layer == l)].cut.item()       # nullspace_threshold · λ_max(C0)
        # ‖ΔK0‖² ≤ N ε ‖Δ‖² (null-space bound)
        assert (dW @ K0).norm() ** 2 <= cut * K0.shape[1] * dW.norm() ** 2 * (1 + 1e-4)
        logged = log[(log.phase == "edit") & (log.layer == l)].preserved_change.item()
        assert abs(logged - ratio) < 1e-3 * max(ratio, 1e-6) + 1e-6  # the log's second-moment formula agrees
    changed = {n for (n, p), q in zip(model.named_parameters(), edited.parameters()) if not torch.equal(p, q)}
    assert changed == {f"model.layers.{l}.mlp.down_proj.weight" for l in layers}
    idk = [{**e, "answer": e["idk_answer"]} for e in with_idk_answers(forget, 0)]
    assert qa_nll(edited, tok, idk) < qa_nll(model, tok, idk) - 0.1      # toward "I don't know"
    assert qa_nll(edited, tok, forget) > 3 * qa_nll(model, tok, forget)   # away from the answers


def test_alphaedit_intermediate_loss_layer_and_neutral_texts(problem):
    "v* read at an intermediate layer (final norm + lm_head on its output); preserved keys from neutral texts only."
    model, tok, forget, retain = problem
    neutral = ["Where was the city of Lyon founded?", "Oslo and Bergen are cities.", "mail.com is a domain."]
    edited, log = get_spec("alphaedit").run(
        copy.deepcopy(model), tok, forget, retain,
        {"layers": [0], "v_loss_layer": 1, "mom2_data": ["neutral"], "v_steps": 10}, neutral_texts=neutral)
    v = log[log.phase == "v"]
    assert v.target_nll.iloc[-1] < v.target_nll.iloc[0] and (v.layer == 0).all()
    changed = {n for (n, p), q in zip(model.named_parameters(), edited.parameters()) if not torch.equal(p, q)}
    assert changed == {"model.layers.0.mlp.down_proj.weight"}


def test_alphaedit_sequential_batches(problem):
    "Two edit batches: the second is solved with the first batch's keys in K_p (AlphaEdit's sequential editing)."
    model, tok, forget, retain = problem
    edited, log = get_spec("alphaedit").run(
        copy.deepcopy(model), tok, forget, retain, {"layers": [1, 2], "batch_size": 4, "v_steps": 10}
    )
    e = log[log.phase == "edit"]
    # toy, relative cut 1e-3: measured 0.08-0.11
    assert e.batch.tolist() == [0, 0, 1, 1] and (e.preserved_change < 0.2).all()
    assert qa_nll(edited, tok, forget) > qa_nll(model, tok, forget)


def test_alphaedit_needs_neutral_texts(problem):
    model, tok, forget, retain = problem
    with pytest.raises(ValueError, match="no neutral_texts"):
        get_spec("alphaedit").run(copy.deepcopy(model), tok, forget, retain, {"mom2_data": ["neutral", "retain"]})


def test_uld_base_unchanged_and_forget_nll_rises(problem, tmp_path):
    model, tok, forget, retain = problem
    before = _params(model)
    wrapped, log = get_spec("uld").run(model, tok, forget, retain, {"lr": 1e-2, "max_steps": 24})
    assert isinstance(wrapped, ULDModel) and len(log) == 24
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    f0, f1 = qa_nll(model, tok, forget), qa_nll(wrapped, tok, forget)
    r1 = qa_nll(wrapped, tok, retain)
    assert f1 > f0 + 1.0 and r1 < f1 / 3
    # generate: HF-style greedy output that starts with the prompt
    enc = tok([forget[0]["prompt"]], add_special_tokens=False, return_tensors="pt")
    g = wrapped.generate(
        input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=5, do_sample=False,
        num_beams=1, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, return_dict_in_generate=True,
        output_logits=True)
    n = enc["input_ids"].shape[1]
    assert (
        torch.equal(g.sequences[:, :n], enc["input_ids"])
        and 1 <= g.sequences.shape[1] - n <= 5
        and len(g.logits) == g.sequences.shape[1] - n
    )
    get_spec("uld").save(wrapped, tok, tmp_path)
    again = get_spec("uld").load(tmp_path, lambda: model, tok)
    assert isinstance(again, ULDModel) and (tmp_path / "assistant" / "uld_config.json").exists()
    x = enc["input_ids"]
    assert torch.allclose(again(x).logits, wrapped(x).logits, atol=1e-5)


def test_uld_seeded(problem):
    "Same seed → identical assistant (LoRA init and dropout draw from a forked, seeded RNG); global RNG untouched."
    model, tok, forget, retain = problem
    state = torch.random.get_rng_state()
    a, _ = get_spec("uld").run(model, tok, forget, retain, {"max_steps": 2}, seed=3)
    b, _ = get_spec("uld").run(model, tok, forget, retain, {"max_steps": 2}, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    pa, pb = dict(a.assistant.named_parameters()), dict(b.assistant.named_parameters())
    assert all(torch.equal(pa[n], pb[n]) for n in pa)


@pytest.mark.parametrize("size", ["olmo2-1b", "olmo3-7b"])
def test_paper_hparams_resolve(size):
    """Lacuna Table 5 rows of the model-size presets pass the specs' checks, and AlphaEdit's layers fit a model of the
    paper's depth."""
    from lume_lab.unlearn import alphaedit as ae
    hp = get_spec("memflex").resolve(PRESETS[size]["unlearn.hparams.memflex"])
    assert (hp["forget_factor"], hp["retain_factor"], hp["sim_threshold"]) == (-0.6, 2.0, 0.92)
    L = 16 if size == "olmo2-1b" else 32
    hp = ae._model_layers(get_spec("alphaedit").resolve(PRESETS[size]["unlearn.hparams.alphaedit"]), L)
    assert hp["layers"] == [4, 5, 6, 7, 8] and hp["v_loss_layer"] == L - 1
    with pytest.raises(ValueError, match="layers must be distinct layer indices in 0..2"): ae._model_layers(hp, 3)


@pytest.mark.parametrize("method,bad",
                         [("memflex", {"sim_thresh": 0.9}), ("alphaedit", {"layer": [1]}), ("uld", {"n_layer": 1})])
def test_unknown_hparams(problem, method, bad):
    model, tok, forget, retain = problem
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        get_spec(method).run(copy.deepcopy(model), tok, forget, retain, bad)


@pytest.mark.parametrize("method,bad,msg", [("memflex", {"forget_factor": 0.6}, "forget_factor must be a negative"),
                                            ("alphaedit", {"layers": [7]}, "layers must be distinct layer indices"),
                                            ("uld", {"top_logit_filter": 2.0}, "top_logit_filter must be in")])
def test_bad_hparam_values(problem, method, bad, msg):
    model, tok, forget, retain = problem
    with pytest.raises(ValueError, match=msg):
        get_spec(method).run(copy.deepcopy(model), tok, forget, retain, bad)
