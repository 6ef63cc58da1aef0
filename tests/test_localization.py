"""Localization precision (Lacuna §4.2, App. E).
Exact AUC vs scikit-learn, synthetic unlearning on real HF parameter names, bad input."""
import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from lume_lab.analysis.localization import (
    PAPER_PRECISION_OLMO2_1B, _seed_draws, cluster_auc_interval, composite_scores, default_groups, exact_auc,
    fake_state_dicts, group_mask, localization_aucs, localization_table, precision_summary, scored_parameter_names,
    tensor_rank_pieces)


# ---------------------------------------------------------------- exact AUC
@pytest.mark.parametrize("seed,n,pos_frac,levels",
                         [(0, 50_000, 0.15, 7), (1, 30_001, 0.5, 100), (2, 20_000, 0.9, 3), (3, 10_000, 0.01, 2000)])
def test_exact_auc_matches_sklearn_with_heavy_ties(seed, n, pos_frac, levels):
    g = torch.Generator().manual_seed(seed)
    y = torch.rand(n, generator=g) < pos_frac
    # ties within and across classes
    s = torch.randint(0, levels, (n,), generator=g).float() + (torch.rand(n, generator=g) < 0.3) * y
    ref = roc_auc_score(y.numpy(), s.numpy())
    assert abs(exact_auc(s, y) - ref) < 1e-9
    # uneven pieces, small chunks, both stream directions
    sizes = [1, 999, 4096, n - 1 - 999 - 4096]
    assert abs(exact_auc(list(s.split(sizes)), list(y.split(sizes)), chunk_size=1000) - ref) < 1e-9
    assert abs(exact_auc(s.numpy().astype(np.float64), y.numpy().astype(np.int64)) - ref) < 1e-9
    assert (
        abs(exact_auc(s.to(torch.bfloat16), y) - roc_auc_score(y.numpy(), s.to(torch.bfloat16).float().numpy())) < 1e-9
    )


def test_exact_auc_edge_cases():
    y = torch.arange(100) % 3 == 0
    assert exact_auc(torch.full((100,), 7.0), y) == 0.5                               # all tied
    # perfectly separated, both ways
    assert exact_auc(y.float(), y) == 1.0 and exact_auc(-y.float(), y) == 0.0
    assert exact_auc(torch.arange(10), torch.arange(10) >= 5) == 1.0                   # integer scores
    mixed = [torch.rand(50, dtype=torch.float64), torch.rand(50).to(torch.bfloat16)]
    labs = [torch.arange(50) < 20, torch.arange(50) >= 40]
    ref = roc_auc_score(torch.cat(labs).numpy(), torch.cat([m.double() for m in mixed]).numpy())
    assert abs(exact_auc(mixed, labs) - ref) < 1e-12                                   # mixed dtypes promote exactly


@pytest.mark.parametrize("scores,labels,msg", [
    (torch.rand(5), torch.ones(5), "needs both classes"),
    (torch.rand(5), torch.tensor([0, 1, 2, 0, 1]), "boolean or 0/1"),
    (torch.tensor([0.1, float("nan")]), torch.tensor([0, 1]), "NaN"),
    (torch.rand(5), torch.ones(4), "has 5 values but labels[0] has 4"),
    ([torch.rand(5)], [torch.ones(5), torch.ones(5)], "scores has 1 arrays but labels has 2"),
    (torch.rand(5), [torch.ones(5)], "both be single arrays"),
    (torch.ones(4, dtype=torch.bool), torch.tensor([0, 1, 0, 1]), "real numbers"),
    ([1.0, 2.0], [0, 1], "torch.Tensor or numpy array"),
])
def test_exact_auc_bad_input(scores, labels, msg):
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("]", r"\]")): exact_auc(scores, labels)
    if msg == "needs both classes":
        with pytest.raises(ValueError, match="chunk_size"): exact_auc(scores, labels, chunk_size=0)


# ---------------------------------------------------------------- real HF parameter names
def _tiny_state_dict(kind="olmo2"):
    from transformers import LlamaConfig, LlamaForCausalLM, Olmo2Config, Olmo2ForCausalLM
    cfg_cls, model_cls = (Olmo2Config, Olmo2ForCausalLM) if kind == "olmo2" else (LlamaConfig, LlamaForCausalLM)
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=32)
    return {n: p.detach().clone() for n, p in model_cls(cfg).state_dict().items()}


@pytest.mark.parametrize("kind", ["olmo2", "llama"])
def test_scored_parameter_names_real_models(kind):
    sd = _tiny_state_dict(kind)
    names = scored_parameter_names(sd)
    assert len(names) == 7 * 4                                                      # q,k,v,o,gate,up,down × 4 layers
    assert not any(w in n for n in names for w in ("norm", "embed", "lm_head"))


@pytest.fixture(scope="module")
def testbed():
    """pre / inj / owner on a real tiny OLMo-2: 6 groups of 8 % of layers 0..L-3.
    Adam-like injection (all weights move, in-mask more)."""
    pre = _tiny_state_dict("olmo2")
    g = torch.Generator().manual_seed(1)
    owner = {}
    for n in scored_parameter_names(pre):
        layer = int(n.split(".")[2])
        ids = torch.randint(1, 7, pre[n].shape, generator=g).to(torch.uint8)
        owner[n] = (
            torch.where(torch.rand(pre[n].shape, generator=g) < 0.48, ids, 0).to(torch.uint8)
            if layer <= 1
            else torch.zeros_like(ids)
        )
    inj = {
        n: w + 1e-3 * torch.randn(w.shape, generator=g) + (owner[n] > 0) * 3e-3 * torch.randn(w.shape, generator=g)
        if n in owner
        else w.clone()
        for n, w in pre.items()
    }
    F, R = default_groups(6)
    mF = {n: group_mask(o, F) for n, o in owner.items()}
    return pre, inj, owner, F, R, mF


def _auc(df, score, labels="forget"):
    return df[(df.score == score) & (df.labels == labels)].auc.item()


def test_synthetic_unlearning_magnitude_and_reversal(testbed):
    pre, inj, owner, F, R, mF = testbed
    g = torch.Generator().manual_seed(2)
    noise = {n: 1e-3 * torch.randn(w.shape, generator=g) for n, w in inj.items()}
    only_in = {n: w + noise[n] * mF[n] if n in mF else w for n, w in inj.items()}
    uniform = {n: w + noise[n] for n, w in inj.items()}
    only_out = {n: w + noise[n] * ~mF[n] if n in mF else w for n, w in inj.items()}
    reverted = {n: torch.where(mF[n], pre[n], w) if n in mF else w for n, w in inj.items()}
    kw = dict(composite=False)
    for score in ("raw", "qtile", "layernorm"):
        assert _auc(localization_aucs(pre, inj, only_in, owner, F, R, scores=[score], **kw), score) > 0.99
    df = localization_aucs(pre, inj, uniform, owner, F, R, scores=["raw", "qtile", "layernorm"], **kw)
    assert all(abs(df[df.labels == "forget"].auc - 0.5) < 0.02)
    assert _auc(localization_aucs(pre, inj, only_out, owner, F, R, scores=["raw"], **kw), "raw") < 0.01
    df = localization_aucs(pre, inj, reverted, owner, F, R, scores=["signrev", "reversal", "dirreversal"], **kw)
    assert all(df[df.labels == "forget"].auc > 0.99)
    assert all(df[df.labels == "unified"].auc < 0.9)                            # the retain weights were not reverted


def test_uld_no_change_is_not_applicable(testbed):
    pre, inj, owner, F, R, _ = testbed
    uld = {n: w.clone() for n, w in inj.items()}
    df = localization_aucs(pre, inj, uld, owner, F, R)
    assert df.auc.isna().all() and not df.applicable.any() and "not applicable" in df.note.iloc[0]
    t = localization_table([dict(field="email_address", method="uld", unl=uld)], pre, inj, owner, n_groups=6)
    s = precision_summary(t)
    assert s.auc.isna().all() and not s.applicable.any() and not t.best.any()


def test_composite_is_out_of_fold_and_seeded(testbed):
    pre, inj, owner, F, R, mF = testbed
    g = torch.Generator().manual_seed(3)
    unl = {n: w + 1e-3 * torch.randn(w.shape, generator=g) * (1 + 2 * mF[n]) if n in mF else w for n, w in inj.items()}
    a = localization_aucs(pre, inj, unl, owner, F, R, scores=["raw", "signrev"], composite_max_weights=3000, seed=5)
    b = localization_aucs(pre, inj, unl, owner, F, R, scores=["raw", "signrev"], composite_max_weights=3000, seed=5)
    comp = a[a.score == "composite"]
    assert (comp.n_pos + comp.n_neg == 3000).all() and "subsample of 3000" in comp.note.iloc[0]
    pd.testing.assert_frame_equal(a, b)
    assert _auc(a, "composite") > 0.7
    # pure-noise features: stratified folds of equal size, out-of-fold scores at chance
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 2)); y = rng.random(1000) < 0.3
    proba, folds = composite_scores(X, y, n_folds=5, seed=0)
    assert np.bincount(folds).tolist() == [200] * 5 and len(proba) == 1000
    # pure noise stays near chance out-of-fold
    assert abs(exact_auc(proba, y) - 0.5) < 0.1


def test_contrast_family_and_best_rule(testbed):
    pre, inj, owner, F, R, mF = testbed
    g = torch.Generator().manual_seed(4)
    inj_ctrl = {n: w + 3e-3 * torch.randn(w.shape, generator=g) for n, w in pre.items()}
    unl_ctrl = {n: w + 1e-3 * torch.randn(w.shape, generator=g) for n, w in inj_ctrl.items()}
    reverted = {n: torch.where(mF[n], pre[n], w) if n in mF else w for n, w in inj.items()}
    runs = [dict(field="email_address", method=m, unl=reverted, unl_ctrl=unl_ctrl) for m in ("oracle_grad", "simnpo")]
    t = localization_table(runs, pre, inj, owner, n_groups=6, inj_ctrl=inj_ctrl, composite_max_weights=2000,
                           no_contrast_methods=["oracle_grad"])
    assert set(t[t.method == "simnpo"].score) >= {"contrast", "contrastnorm", "compnorm", "eratio", "composite"}
    best = t[t.best]
    assert len(best) == 4 and not ((best.method == "oracle_grad") & (best.family == "contrast")).any()
    og = t[(t.method == "oracle_grad") & (t.labels == "forget")]
    assert (
        best[(best.method == "oracle_grad") & (best.labels == "forget")].auc.item()
        == og[og.family != "contrast"].auc.max()
    )
    s = precision_summary(t)
    assert (
        s.set_index(["method", "labels"]).loc[("oracle_grad", "forget"), "paper_auc"]
        == PAPER_PRECISION_OLMO2_1B["email_address"]["oracle_grad"][0]
    )


def test_packed_and_bf16_inputs_agree(testbed):
    pre, inj, owner, F, R, mF = testbed
    g = torch.Generator().manual_seed(6)
    unl = {n: w + 1e-3 * torch.randn(w.shape, generator=g) * (1 + mF[n]) if n in mF else w for n, w in inj.items()}
    ref = localization_aucs(pre, inj, unl, owner, F, R, composite=False)
    packed = {
        n: torch.where(o > 0, torch.ones_like(o, dtype=torch.int32) << (o.to(torch.int32) - 1).clamp(min=0), 0)
        for n, o in owner.items()
    }
    pd.testing.assert_frame_equal(ref, localization_aucs(pre, inj, unl, packed, F, R, composite=False))
    bf = [{n: w.to(torch.bfloat16) for n, w in sd.items()} for sd in (pre, inj, unl)]
    df = localization_aucs(*bf, owner, F, R, composite=False)
    assert df.auc.between(0, 1).all() and _auc(df, "raw") > 0.6


def test_bad_inputs(testbed):
    pre, inj, owner, F, R, _ = testbed
    name = scored_parameter_names(pre)[0]
    with pytest.raises(ValueError, match="lacks scored parameter"):
        localization_aucs(pre, inj, {k: v for k, v in inj.items() if k != name}, owner, F, R)
    with pytest.raises(ValueError, match=r"unl\[.*has shape"):
        localization_aucs(pre, inj, {**inj, name: inj[name][:1]}, owner, F, R)
    with pytest.raises(ValueError, match=r"owner\[.*has shape"):
        localization_aucs(pre, inj, inj, {**owner, name: owner[name][:1]}, F, R)
    with pytest.raises(ValueError, match="both inj_ctrl and unl_ctrl"):
        localization_aucs(pre, inj, inj, owner, F, R, unl_ctrl=inj)
    with pytest.raises(ValueError, match="unknown score"):
        localization_aucs(pre, inj, inj, owner, F, R, scores=["magic"])
    with pytest.raises(ValueError, match="contrast scores need"):
        localization_aucs(pre, inj, inj, owner, F, R, scores=["contrast"])
    with pytest.raises(ValueError, match="composite_max_weights"):
        localization_aucs(pre, inj, inj, owner, F, R, composite_max_weights=0)
    with pytest.raises(ValueError, match="uint8 owner ids or packed"):
        localization_aucs(pre, inj, inj, {n: o.float() for n, o in owner.items()}, F, R)
    with pytest.raises(ValueError, match="pass n_groups"):
        localization_table([dict(field="x", method="y", unl=inj)], pre, inj, owner)
    with pytest.raises(ValueError, match="lacks"):
        localization_table([dict(field="x", unl=inj)], pre, inj, owner, n_groups=6)
    with pytest.raises(ValueError, match="inj_ctrl .* is missing"):
        localization_table([dict(field="x", method="y", unl=inj, unl_ctrl=inj)], pre, inj, owner, n_groups=6)
    with pytest.raises(ValueError, match="n_groups must be an even"): default_groups(5)


# ---------------------------------------------------------------- the headline: plain |Δθ| AUC and its reading
@pytest.mark.parametrize("where", ["outside", "inside_forget"])
def test_known_answer_headline(where):
    """Noise only outside every mask: the headline AUC is below 0.5 and reads anti-localized, against both label sets,
    whatever Lacuna's max over families says. Noise only inside m^F: AUC near 1, localized."""
    pre, inj, owner = fake_state_dicts(n_layers=2, hidden=16, seed=3)
    F, _ = default_groups(6)
    g = torch.Generator().manual_seed(11)
    keep = {n: (o == 0) if where == "outside" else group_mask(o, F) for n, o in owner.items()}
    unl = {n: w + (0.05 * torch.randn(w.shape, generator=g) * keep[n] if n in owner else 0) for n, w in inj.items()}
    t = localization_table([dict(field="email_address", method="m", unl=unl)], pre, inj, owner, n_groups=6,
                           composite_max_weights=3000)
    s = precision_summary(t).set_index("labels")
    raw = t[t.score == "raw"].set_index("labels").auc
    assert (s.auc == raw).all()                                  # the headline is the plain |Δθ| score's AUC
    assert (s.auc_lo <= s.auc).all() and (s.auc <= s.auc_hi).all()
    if where == "outside":
        assert (s.auc < 0.5).all() and (s.auc_hi < 0.5).all()
        assert s.reading.tolist() == ["anti-localized", "anti-localized"]
        assert (s.lacuna_max_auc > 0.7).all()                    # the max over families would call it precise
    else:
        assert s.at["forget", "auc"] > 0.99 and s.at["forget", "reading"] == "localized"
    assert s.lacuna_max_score.notna().all() and s.composite_oof_auc.notna().all()


def test_tensor_bootstrap_recombination_matches_resorting():
    """Each draw's AUC recombined from per-tensor rank pieces (no re-sorting) is close to the exact AUC of the drawn
    tensors, computed by re-sorting; the interval widens when the effect varies between tensors."""
    g = torch.Generator().manual_seed(0)
    labels = [torch.rand(300, generator=g) < 0.2 for _ in range(10)]
    shift = torch.randn(10, generator=g)                       # a per-tensor effect: clusters matter
    scores = [torch.randn(300, generator=g) + shift[t] * labels[t] for t in range(10)]
    pc = tensor_rank_pieces(scores, labels)
    auc, fast = _seed_draws(pc, 200, np.random.default_rng(1))
    W = np.random.default_rng(1).multinomial(10, np.full(10, 0.1), size=200)
    slow = [exact_auc([scores[t] for t in range(10) for _ in range(w[t])],
                      [labels[t] for t in range(10) for _ in range(w[t])]) for w in W]
    assert np.abs(fast - np.array(slow)).max() < 0.03
    lo, hi = np.quantile(fast, [0.025, 0.975]); lo_s, hi_s = np.quantile(slow, [0.025, 0.975])
    assert abs(lo - lo_s) < 0.02 and abs(hi - hi_s) < 0.02
    # the same weights without a per-tensor effect: a narrower interval
    flat = tensor_rank_pieces([torch.randn(300, generator=g) + shift.mean() * l for l in labels], labels)
    w_clustered = np.subtract(*cluster_auc_interval(pc)[:0:-1])
    w_flat = np.subtract(*cluster_auc_interval(flat)[:0:-1])
    assert w_clustered > 2 * w_flat
