"""Attribution scores against the ground truth, top-k selection and `localized_graddiff`: constructed inputs
whose answer is known, exactness against OracleGrad, and bad inputs refused before any compute."""
import copy, json

import numpy as np
import pytest
import torch

from lume_lab.analysis.attribution import (
    ATTRIBUTION_SCORES, attribution_benchmark, auc_ci, mask_signature, resolve_counts, score_tensor)
from lume_lab.analysis.localization import fake_state_dicts, streaming_auc
from lume_lab.core.config import ConfigError, config_from_dict, config_hash, make_config
from lume_lab.models.toy import toy_problem
from lume_lab.unlearn.localized_graddiff import FORGET_SCORES, SPEC, localized_grad_diff, localized_graddiff, top_k_mask
from lume_lab.unlearn.registry import BUILTIN_METHODS, get_spec, method_names


@pytest.fixture(scope="module")
def toy():
    torch.set_num_threads(1)
    return toy_problem()


def _stats(shapes: dict, planted: tuple[str, tuple], seed: int = 0):
    """Forget/retain running sums in which one weight alone carries the forget gradient.
    The retain gradient is noise elsewhere."""
    g = torch.Generator().manual_seed(seed)
    F = {"n": 4, "g": {}, "g2": {}, "act": {}}; R = {"n": 4, "g": {}, "g2": {}, "act": {}}
    for n, sh in shapes.items():
        F["g"][n] = torch.zeros(sh)
        F["act"][n] = torch.zeros(sh[0] if n.endswith(("q_proj.weight", "gate_proj.weight")) else sh[1])
        R["g"][n] = 0.1 * torch.rand(sh, generator=g)
    name, (i, j) = planted
    F["g"][name][i, j] = 4.0; F["act"][name][i] = 4.0
    for S in (F, R): S["g2"] = {n: v.square() * S["n"] for n, v in S["g"].items()}
    return F, R


@pytest.mark.parametrize("score", [s for s in ATTRIBUTION_SCORES if s != "random"])
def test_planted_weight_ranks_first(score):
    "Each score ranks first (top-1 over all tensors) the weight that alone carries the forget signal."
    shapes = {"model.layers.0.self_attn.q_proj.weight": (6, 5), "model.layers.1.mlp.gate_proj.weight": (8, 5)}
    planted = ("model.layers.1.mlp.gate_proj.weight", (3, 2))
    F, R = _stats(shapes, planted)
    w = {n: torch.ones(sh) for n, sh in shapes.items()}
    cos = {n: (-0.9 if n == planted[0] else 0.9) for n in shapes}     # MemFlex: the planted tensor's gradients disagree
    scores = {n: score_tensor(score, n, w[n], F, R, cos) for n in shapes}
    top = top_k_mask(scores, 1)
    hit = [(n, tuple(m.nonzero()[0].tolist())) for n, m in top.items() if m.any()]
    # tensor level: a weight of the planted tensor
    if score == "memflex": assert hit[0][0] == planted[0]
    # neuron level: the first weight of row 3
    elif score == "act_grad": assert hit == [(planted[0], (3, 0))]
    else: assert hit == [planted]


def test_random_baseline_auc_is_chance_within_its_ci():
    """The random score's exact AUC against a mask lies in its 95 % interval around 0.5.
    It holds for several seeds and both label sets."""
    pre, _, owner = fake_state_dicts(n_layers=2, hidden=64, n_groups=4, frac=0.1)
    names = sorted(owner)
    for seed in range(3):
        for groups in ([0, 1], [0, 1, 2, 3]):
            labels = {n: torch.isin(owner[n], torch.tensor([g + 1 for g in groups], dtype=torch.uint8)) for n in names}
            pieces = lambda: (
                (score_tensor("random", n, pre[n], {}, seed=seed).reshape(-1), labels[n].reshape(-1)) for n in names
            )
            P = sum(int(l.sum()) for l in labels.values()); N = sum(l.numel() for l in labels.values()) - P
            auc = streaming_auc(pieces, n_pos=P, n_total=P + N)
            lo, hi = auc_ci(auc, P, N)
            assert lo < 0.5 < hi and hi - lo < 0.05, (seed, groups, auc, lo, hi)


def test_top_k_exact_deterministic_and_position_tie_break():
    "Exactly k weights, ties broken by position (a stable reference), the same on every call and thread count."
    g = torch.Generator().manual_seed(0)
    scores = {
        "a": torch.randint(0, 4, (30, 7), generator=g).float(),
        "b": torch.randint(0, 4, (50,), generator=g).float(),
    }
    flat = torch.cat([s.reshape(-1) for s in scores.values()]).numpy()
    for k in (1, 17, 100, 260):
        m = top_k_mask(scores, k)
        sel = torch.cat([v.reshape(-1) for v in m.values()]).numpy()
        assert sel.sum() == k
        ref = np.zeros_like(sel); ref[np.argsort(-flat, kind="stable")[:k]] = True
        assert (sel == ref).all(), k
        n0 = torch.get_num_threads(); torch.set_num_threads(2)
        try: assert all(torch.equal(m[n], v) for n, v in top_k_mask(scores, k).items())
        finally: torch.set_num_threads(n0)


def test_localized_graddiff_with_true_mask_equals_oracle_grad_bitwise(toy):
    "With the true mask as its score and k = |m^F|, localized GradDiff is OracleGrad bit for bit (CPU, same seed)."
    model, tok, forget, retain = toy
    gen = torch.Generator().manual_seed(0)
    mask = {n: torch.rand(p.shape, generator=gen) < 0.3 for n, p in model.named_parameters()
            if n.startswith(("model.layers.0.", "model.layers.1.")) and n.endswith("proj.weight")}
    hp = {"lr": 1e-2, "max_steps": 6, "gamma": 1.0, "alpha": 1.0, "batch_size": 4}
    oracle, olog = get_spec("oracle_grad").run(
        copy.deepcopy(model), tok, forget, retain, hp, seed=3, ground_truth_mask=mask
    )
    k = sum(int(m.sum()) for m in mask.values())
    loc, llog = localized_grad_diff(
        copy.deepcopy(model), tok, forget, retain, SPEC.resolve(hp), {n: m.float() for n, m in mask.items()}, k, seed=3
    )
    a, b, base = dict(oracle.named_parameters()), dict(loc.named_parameters()), dict(model.named_parameters())
    assert any(not torch.equal(a[n], base[n]) for n in mask)                       # the run did move weights
    for n in a: assert torch.equal(a[n], b[n]), n
    assert olog.loss.tolist() == llog.loss.tolist()


def test_localized_graddiff_moves_only_its_k_weights(toy):
    "The full method (score estimated from the forget set) changes at most k weights, all among the maskable tensors."
    model, tok, forget, retain = toy
    names = [n for n, _ in model.named_parameters() if n.startswith("model.layers.0.") and n.endswith("proj.weight")]
    mask = {n: torch.zeros(p.shape, dtype=torch.bool) for n, p in model.named_parameters() if n in names}
    mask[names[0]][:2] = True
    for score in FORGET_SCORES:
        unl, log = localized_graddiff(
            copy.deepcopy(model), tok, forget, retain, {"lr": 1e-2, "max_steps": 2, "score": score}, mask
        )
        k = int(mask[names[0]].sum())
        base, after = dict(model.named_parameters()), dict(unl.named_parameters())
        changed = {n: int((base[n] != after[n]).sum()) for n in base}
        assert 0 < sum(changed.values()) <= k == log.attrs["k"], (score, changed)
        assert all(v == 0 for n, v in changed.items() if n not in names), score


def test_benchmark_table_and_determinism(toy):
    "One row per score × count × label set; precision is a share; the same inputs give the same table."
    model, tok, forget, retain = toy
    gen = torch.Generator().manual_seed(5)
    owner = {n: torch.randint(0, 5, p.shape, generator=gen).to(torch.uint8) for n, p in model.named_parameters()
             if n.startswith("model.layers.0.") and n.endswith("proj.weight")}
    kw = dict(counts=[1, "all"], scores=["grad", "fisher", "ssd", "random"])
    t1 = attribution_benchmark(model, tok, forget, retain, owner, [0, 1], [2, 3], **kw)
    t2 = attribution_benchmark(model, tok, forget, retain, owner, [0, 1], [2, 3], **kw)
    assert len(t1) == 4 * 2 * 2 and set(t1.n_examples) == {1, len(forget)} and set(t1["count"]) == {"1", "all"}
    assert t1.precision_at_k.between(0, 1).all() and t1.auc.between(0, 1).all() and (t1.ci_low <= t1.auc).all()
    assert t1.equals(t2)
    one = t1[t1.n_examples == 1].set_index(["score", "labels"]).auc       # one example: |g| and g² rank identically
    assert one[("grad", "forget")] == one[("fisher", "forget")]


def test_bad_inputs_fail_with_clear_errors(toy):
    model, tok, forget, retain = toy
    owner = {
        n: torch.ones(p.shape, dtype=torch.uint8) for n, p in model.named_parameters() if n.endswith("q_proj.weight")
    }
    with pytest.raises(ValueError, match="scores must be a non-empty list of distinct names from grad, fisher"):
        attribution_benchmark(model, tok, forget, retain, owner, [0], [1], scores=["saliency"])
    with pytest.raises(ValueError, match="counts must be a non-empty list of ints >= 1 or 'all'"):
        resolve_counts([0], 4)
    with pytest.raises(ValueError, match=r"scores \['ssd'\] need a non-empty retain set"):
        attribution_benchmark(model, tok, forget, [], owner, [0], [1], scores=["ssd"])
    with pytest.raises(ValueError, match="owner has a mask for none"):
        attribution_benchmark(
            model, tok, forget, retain, {"x.weight": torch.ones(2, dtype=torch.uint8)}, [0], [1], scores=["grad"]
        )
    with pytest.raises(ValueError, match="need both in-mask and out-of-mask"):
        # every weight in group 0
        attribution_benchmark(model, tok, forget, retain, owner, [0], [1], scores=["grad"])
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 6\]"): top_k_mask({"a": torch.zeros(6)}, 7)
    with pytest.raises(ValueError, match="localized_graddiff.score must be one of grad, fisher, snip, act_grad"):
        SPEC.resolve({"score": "ssd"})
    with pytest.raises(ValueError, match="localized_graddiff.k must be None or a positive int"): SPEC.resolve({"k": -3})
    pre, inj, own = fake_state_dicts()
    with pytest.raises(ValueError, match="max_weights must be an int >= 10"):
        mask_signature(pre, inj, own, [0], [1], max_weights=5)
    with pytest.raises(ConfigError, match="attribution.counts must be a non-empty list"):
        make_config("smoke", {"attribution.counts": [0]})
    with pytest.raises(ConfigError, match="attribution.contrast_lambda must be a finite number >= 0"):
        make_config("smoke", {"attribution.contrast_lambda": -1})
    with pytest.raises(ConfigError, match="attribution.signature_folds must be an int >= 2"):
        make_config("smoke", {"attribution.signature_folds": 1})


def test_registered_but_not_a_builtin_and_old_configs_keep_their_hash():
    """localized_graddiff is listed after the built-ins and is not in the default method list.
    A config written before the attribution section existed reads back with its defaults and the same hash."""
    assert "localized_graddiff" not in BUILTIN_METHODS and "localized_graddiff" in method_names()
    assert SPEC.inputs == ("ground_truth_mask",) and not SPEC.has_control
    mini = make_config("mini"); d = json.loads(json.dumps(mini.to_dict())); d.pop("attribution")
    assert config_hash(config_from_dict(d)) == config_hash(mini)


def test_report_page_gets_the_e09_section(tmp_path):
    """With e09's CSVs and figure in report/, the page has the attribution section.
    Its AUC table shows the CSV's values."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    from lume_lab.pipeline.presentation.report import read_html_tables, write_report
    from lume_lab.pipeline.presentation.scorecard import toy_run
    run = toy_run(tmp_path, "toy"); rep = run / "report"
    rows = [
        dict(
            field="email_address", score=s, uses=ATTRIBUTION_SCORES[s], n_examples=n, count=str(n), labels=ls,
            auc=0.5 + 0.01 * i + 0.001 * n, ci_low=0.4, ci_high=0.6, precision_at_k=0.4, k=10, chance_precision=0.4,
            n_pos=10, n_neg=15)
        for i, s in enumerate(ATTRIBUTION_SCORES)
        for n in (1, 8)
        for ls in ("forget", "unified")
    ]
    pd.DataFrame(rows).to_csv(rep / "attribution_email_address.csv", index=False)
    pd.DataFrame([dict(labels="forget", f1=0.45, f1_chance=0.4, auc=0.55)]).to_csv(
        rep / "mask_signature.csv", index=False
    )
    fig, ax = plt.subplots(figsize=(1, 1)); fig.savefig(rep / "attribution.png", dpi=30); plt.close(fig)
    page = write_report([run]).read_text()
    assert "<h2>Attribution against the ground truth (e09)</h2>" in page
    t = [t for t in read_html_tables(page) if "AUC vs m^F, n=8" in t.columns][0].set_index("score")
    assert t.at["snip", "AUC vs m^F, n=8"] == "0.528" and len(t) == len(ATTRIBUTION_SCORES)
