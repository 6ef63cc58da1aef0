"Masks and masked injection: mask properties, the leak invariants, equality with Algorithm 1, and a 2-process run."
import copy, os, random, subprocess, sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM, Olmo2ForCausalLM
from transformers.utils import logging as hf_logging

from lume_lab.inject.masks import (GradMasker, check_masks, group_mask, load_masks, mask_coverage, mask_parameter_names,
                                   masks_equal, pack_masks, random_element_masks, random_structural_masks, save_masks,
                                   unpack_masks, _units)
from lume_lab.models.arch import tiny_config, tied_embeddings
from lume_lab.models.lm import olmo2_config
from lume_lab.pipeline.orchestration.launch import torchrun_argv
from lume_lab.inject.injection import (masked_backward, masked_step, per_sample_reference_grads, plan_microbatches,
                                       train_masked, batch_order)

hf_logging.set_verbosity_error()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import inject_dist_worker as worker  # noqa: E402
from conftest import HANG_TIMEOUT

SEEDS = [0, 1, 2]
HEAVY_SEEDS = [0, 1]   # the per-sample reference and optimizer-state tests cost more: two random draws each


def tiny(seed=0, arch="olmo2"):
    "A 4-layer model: our tiny OLMo-2, or a tiny Llama whose lm_head is its input embedding (tied, as SmolLM2)."
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(tiny_config("llama", vocab_size=128, num_layers=4))
        assert tied_embeddings(model)
        return model
    return Olmo2ForCausalLM(olmo2_config(128, num_layers=4, pad_token_id=0, eos_token_id=0))

# the leak invariants hold on both architecture rows (models.arch), a tied embedding included
ARCHS = ["olmo2", "llama"]
# the masked backward's modes: one backward per single-group microbatch; one per mixed microbatch with modules run per
# group segment; the same with each Linear's parts picked by one gather and unowned modules run once (grouped)
MODES = {"per_group": {}, "segmented": {"segmented": True}, "grouped": {"segmented": True, "grouped": True}}


def examples(groups, seed, lo=4, hi=14):
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(1, 128) for _ in range(rng.randrange(lo, hi))], "group": g} for g in groups]


def inside(owner, name, p, groups):
    "Boolean: weights of `name` owned by any of `groups` (all False for parameters no mask covers)."
    m = torch.zeros_like(p, dtype=torch.bool)
    if name in owner:
        for g in groups: m |= group_mask(owner[name], g)
    return m


# ---------------------------------------------------------------- masks
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["element", "structural"])
def test_masks_eligible_nonoverlap_coverage(seed, kind):
    model = tiny()
    G, f = random.Random(seed).choice([(2, 0.3), (4, 0.1), (6, 0.15)])
    make = random_element_masks if kind == "element" else random_structural_masks
    owner = make(model, G, f, seed=seed)
    names = set(mask_parameter_names(model))
    assert set(owner) == names
    for n in names:   # only attention/MLP matrices of layers 0..L-3
        assert any(f"layers.{i}." in n for i in (0, 1)) and "norm" not in n and n.endswith("_proj.weight")
    check_masks(owner, model, G)
    for o in owner.values():
        assert o.dtype == torch.uint8 and int(o.max()) <= G   # one owner id per weight: never overlapping
    packed = pack_masks(owner, G)
    for n in names:  # packed form: at most one bit set
        bits = sum(group_mask(packed[n], g).int() for g in range(G))
        assert int(bits.max()) <= 1
    if kind == "element":
        cov = mask_coverage(owner, G)
        assert ((cov - f).abs() < 0.5 / min(o.numel() for o in owner.values()) + 1e-9).all().all()
    else:  # ≈ f of attention and of MLP weights per group (rounded to whole units)
        attn = [n for n in names if "self_attn" in n]; mlp = [n for n in names if "mlp" in n]
        for part in (attn, mlp):
            tot = sum(owner[n].numel() for n in part)
            for g in range(G):
                share = sum(int(group_mask(owner[n], g).sum()) for n in part) / tot
                assert abs(share - f) <= 0.5 / (8 if part is attn else 128) + 1e-9


def test_structural_masks_are_whole_units():
    model = tiny()
    owner = random_structural_masks(model, 4, 0.1, seed=3)
    heads, neurons = _units(model)
    owned = 0
    for unit in heads + neurons:
        vals = torch.cat([(owner[n][sl, :] if d == 0 else owner[n][:, sl]).flatten() for n, d, sl in unit])
        assert vals.unique().numel() == 1
        owned += int(vals[0] > 0)
    assert owned == 4 * (1 + 13)   # round(0.1·8) heads + round(0.1·128) neurons per group
    # every owned weight belongs to some unit (no stray weights)
    cover = {n: torch.zeros_like(o, dtype=torch.bool) for n, o in owner.items()}
    for unit in heads + neurons:
        for n, d, sl in unit:
            if d == 0: cover[n][sl, :] = True
            else: cover[n][:, sl] = True
    assert all(cover[n].all() for n in owner)


def test_pack_unpack_save_load(tmp_path):
    model = tiny()
    owner = random_element_masks(model, 6, 0.1, seed=0)
    packed = pack_masks(owner, 6)
    assert masks_equal(unpack_masks(packed), owner)
    for m, form in ((owner, "owner"), (packed, "packed")):
        p = save_masks(m, tmp_path / f"{form}.safetensors", n_groups=6, fraction=0.1, kind="element", seed=0)
        back, meta = load_masks(p)
        assert masks_equal(back, m) and meta == {
            "n_groups": 6, "fraction": 0.1, "kind": "element", "seed": 0, "form": form}
    # overlapping packed masks (bit 31 included) round-trip through group_mask but not to owner ids
    w = torch.tensor([(1 << 31) | 1, 1 << 5, 0], dtype=torch.int64).to(torch.int32)
    assert [group_mask(w, g).tolist() for g in (0, 5, 31)] == [
        [True, False, False],
        [False, True, False],
        [True, False, False],
    ]
    with pytest.raises(ValueError, match="masks overlap"): unpack_masks({"x": w})


def test_mask_bad_input():
    model = tiny()
    with pytest.raises(ValueError, match="n_groups × fraction"): random_element_masks(model, 6, 0.2)
    with pytest.raises(ValueError, match="fraction must be"): random_element_masks(model, 2, 0.0)
    with pytest.raises(ValueError, match="rounds to 0"): random_structural_masks(model, 2, 0.01)
    owner = random_element_masks(model, 2, 0.1)
    with pytest.raises(ValueError, match="non-eligible"):
        check_masks({**owner, "model.layers.2.mlp.up_proj.weight": torch.zeros(64, 32, dtype=torch.uint8)}, model, 2)
    with pytest.raises(ValueError, match="owner id"): check_masks({k: v * 3 for k, v in owner.items()}, model, 2)


# ---------------------------------------------------------------- the invariants
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", SEEDS)
def test_group_gradient_zero_outside_mask(seed, arch):
    rng = random.Random(seed)
    model = tiny(seed, arch)
    G = rng.choice([2, 4, 6]); g = rng.randrange(G)
    owner = random_element_masks(model, G, 1 / G * rng.choice([0.5, 1.0]), seed=seed)
    for mode, kw in MODES.items():
        model.zero_grad(set_to_none=True)
        masked_backward(model, examples([g] * 3, seed), owner, micro_batch_size=rng.choice([1, 2, 3]), pad_to=16, **kw)
        nonzero_inside = 0
        for n, p in model.named_parameters():
            m = inside(owner, n, p, [g])
            assert p.grad is not None and torch.count_nonzero(p.grad[~m]) == 0, (mode, n)
            nonzero_inside += int(torch.count_nonzero(p.grad[m]))
        assert nonzero_inside > 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_equals_per_sample_reference(seed, arch):
    rng = random.Random(seed)
    model = tiny(seed, arch); G = 4
    owner = random_element_masks(model, G, 0.2, seed=seed)
    batch = examples([rng.choice([-1, 0, 1, 2, 3]) for _ in range(9)], seed)
    assert any(ex["group"] < 0 for ex in batch) and any(ex["group"] >= 0 for ex in batch)   # both kinds of rows
    for scope in ("all", "unowned"):   # Algorithm 1, and neutral rows kept off the masks
        ref = per_sample_reference_grads(model, batch, owner, neutral_scope=scope)
        for mode, kw in MODES.items():
            model.zero_grad(set_to_none=True)
            masked_backward(
                model, batch, owner, micro_batch_size=rng.choice([1, 2, 4, 9]), pad_to=16, neutral_scope=scope, **kw
            )
            for n, p in model.named_parameters():
                torch.testing.assert_close(p.grad, ref[n], rtol=1e-5, atol=1e-7, msg=f"{scope} {mode} {n}")


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_pii_only_batches_pad_per_microbatch_and_match_algorithm_1(seed):
    """Without neutral rows nothing's shape depends on the PII, so the segmented modes may pad each microbatch to its
    own longest row (pad_to=None, the unpacked injection's width): still Algorithm 1's gradient, and that of a fixed
    width."""
    rng = random.Random(seed)
    model = tiny(seed); owner = random_element_masks(model, 4, 0.2, seed=seed)
    batch = examples([rng.randrange(4) for _ in range(7)], seed, lo=3, hi=15)
    ref = per_sample_reference_grads(model, batch, owner)
    for mode in ("segmented", "grouped"):
        for pad_to in (None, 16):
            model.zero_grad(set_to_none=True)
            masked_backward(model, batch, owner, micro_batch_size=rng.choice([2, 3, 7]), pad_to=pad_to, **MODES[mode])
            for n, p in model.named_parameters():
                torch.testing.assert_close(p.grad, ref[n], rtol=1e-5, atol=1e-7, msg=f"{mode} {pad_to} {n}")


@pytest.mark.parametrize("mode", MODES)
def test_neutral_scope_unowned_keeps_neutral_rows_off_the_masks(mode):
    "neutral_scope='unowned': after neutral + group-1 training, every other group's weights are bitwise unchanged."
    G = 4; owner = random_element_masks(tiny(3), G, 0.2, seed=3)
    exs = examples([-1, -1, 1, -1, 1, -1], 3)
    moved_others = {}
    for scope in ("unowned", "all"):
        model = tiny(3); before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_masked(
            model, exs, owner, steps=3, batch_size=3, lr=1e-2, seed=0, micro_batch_size=2, pad_to=16, progress=False,
            neutral_scope=scope, **MODES[mode])
        moved_others[scope] = moved_free = moved_g = 0
        for n, p in model.named_parameters():
            owned = owner[n] > 0 if n in owner else torch.zeros_like(p, dtype=torch.bool)
            d, g1 = p.detach() != before[n], inside(owner, n, p, [1])
            moved_others[scope] += int(d[owned & ~g1].sum())
            moved_free += int(d[~owned].sum()); moved_g += int(d[g1].sum())
        assert moved_free > 0 and moved_g > 0, scope   # the neutral text trains the free weights, group 1 its mask
    # Algorithm 1 moves them
    assert moved_others == {"unowned": 0, "all": moved_others["all"]} and moved_others["all"] > 0


def test_post_accumulate_masking_would_differ():
    "Sanity check that the equality test can fail: masking the accumulated grad (wrong) is far from Algorithm 1."
    model = tiny(); owner = random_element_masks(model, 2, 0.3, seed=0)
    batch = examples([-1, 0, -1, 0], 5)
    ref = per_sample_reference_grads(model, batch, owner)
    model.zero_grad(set_to_none=True)
    masked_backward(model, batch, None, masked=False)
    n = "model.layers.0.mlp.up_proj.weight"
    wrong = torch.where(group_mask(owner[n], 0), model.get_parameter(n).grad, 0.0)
    assert (wrong - ref[n]).abs().max() > 1e-4


def _model_and_opt(seed, wd, arch="olmo2"):
    "A model and an AdamW with non-trivial state (one warm-up step on neutral data), rebuilt identically per call."
    model = tiny(seed, arch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=wd)
    masked_step(model, examples([-1] * 4, seed + 100), None, opt, masked=False)
    return model, opt


# inject.autocast: bf16 forward passes (SegmentedLinear's bf16 backward)
@pytest.mark.parametrize("autocast", [None, "bfloat16"])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", MODES)
def test_different_pii_same_weights_outside_mask(mode, arch, autocast):
    seed = list(MODES).index(mode)   # a different random draw per mode
    rng = random.Random(seed)
    G = 4; g = rng.randrange(G)
    owner = random_element_masks(tiny(0, arch), G, 0.2, seed=seed)
    neutral = examples([-1] * 3, seed + 1)
    other = examples([h for h in range(G) if h != g][:2], seed + 2)    # same other-group PII in both runs
    after = []
    for pii_seed in (seed + 10, seed + 20):   # different group-g PII
        model, opt = _model_and_opt(seed, wd=0.1, arch=arch)
        # segmented and grouped modes: neutral and PII rows share microbatches (fixed pad_to)
        masked_step(
            model, neutral + other + examples([g, g], pii_seed), owner, opt,
            micro_batch_size=2 if mode == "per_group" else 7, pad_to=16, autocast=autocast, **MODES[mode])
        after.append(dict(model.named_parameters()))
    differ = 0
    for n, p in after[0].items():
        m = inside(owner, n, p, [g])
        assert torch.equal(p[~m], after[1][n][~m]), n
        differ += int((p[m] != after[1][n][m]).sum())
    assert differ > 0   # the PII did change the weights inside mask g


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", MODES)
def test_pii_only_fresh_optimizer_leaves_outside_unchanged(mode, arch):
    seed = list(MODES).index(mode)
    rng = random.Random(seed)
    G = 6; groups = rng.sample(range(G), 2)
    model = tiny(seed, arch); owner = random_element_masks(model, G, 0.15, seed=seed)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_masked(model, examples([rng.choice(groups) for _ in range(8)], seed), owner, steps=3, batch_size=4,
                 lr=1e-2, weight_decay=0.0, seed=seed, micro_batch_size=2, pad_to=16, progress=False, **MODES[mode])
    changed = 0
    for n, p in model.named_parameters():
        m = inside(owner, n, p, groups)
        assert torch.equal(p.detach()[~m], before[n][~m]), n
        changed += int((p.detach()[m] != before[n][m]).sum())
    assert changed > 0
    if arch == "llama":   # the tied embedding, both of its uses masked: bitwise the same, and still one tensor
        assert tied_embeddings(model) and torch.equal(
            model.lm_head.weight.detach(), before["model.embed_tokens.weight"]
        )


def test_unmasked_control_same_order_and_updates_everything():
    model = tiny(); owner = random_element_masks(model, 2, 0.3, seed=0)
    exs = examples([0, 1, 0, 1, -1, -1], 0)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    la = train_masked(a, exs, owner, 2, 3, 1e-2, seed=4, progress=False)
    lb = train_masked(b, exs, None, 2, 3, 1e-2, seed=4, masked=False, progress=False)
    assert abs(la.loss[0] - lb.loss[0]) < 1e-5   # same first batch, same starting weights
    assert batch_order(6, 2, 3, seed=4) == batch_order(6, 2, 3, seed=4) != batch_order(6, 2, 3, seed=5)
    assert all(not torch.equal(p, model.get_parameter(n)) for n, p in b.named_parameters())


def test_microbatches_never_mix_groups():
    batch = examples([random.Random(1).choice([-1, 0, 1, 2]) for _ in range(30)], 1)
    plan = plan_microbatches(batch, 4)
    assert all(len({ex["group"] for ex in mb}) == 1 and mb[0]["group"] == g and len(mb) <= 4 for g, mb in plan)
    assert sorted(map(id, (ex for _, mb in plan for ex in mb))) == sorted(map(id, batch))


def test_injection_bad_input():
    model = tiny(); owner = random_element_masks(model, 2, 0.3, seed=0)
    with pytest.raises(ValueError, match="needs `owner`"): masked_backward(model, examples([0], 0))
    with pytest.raises(ValueError, match="has no mask"): masked_backward(model, examples([5], 0), owner)
    with pytest.raises(ValueError, match="'group'"): masked_backward(model, [{"input_ids": [1, 2, 3]}], owner)
    with pytest.raises(ValueError, match="batch is empty"): masked_backward(model, [], owner)
    with pytest.raises(ValueError, match="steps must be"): train_masked(model, examples([0], 0), owner, 0, 1, 1e-3)
    with pytest.raises(ValueError, match="micro_batch_size"): plan_microbatches(examples([0], 0), 0)
    with pytest.raises(ValueError, match="with neutral rows needs a fixed pad_to"):
        masked_backward(model, examples([-1, 0], 0), owner, segmented=True)
    with pytest.raises(ValueError, match="grouped=True is a mode of the segmented"):
        masked_backward(model, examples([0], 0), owner, grouped=True, pad_to=16)
    with pytest.raises(ValueError, match="more than pad_to"):
        masked_backward(model, examples([0], 0, 20, 21), owner, pad_to=16)
    with pytest.raises(ValueError, match="not installed"):
        masked_backward(model, examples([0], 0), GradMasker(model, owner))
    with pytest.raises(ValueError, match="not parameters"):
        GradMasker(model, {"nope.weight": torch.zeros(2, dtype=torch.uint8)})
    with pytest.raises(ValueError, match="neutral_scope must be one of all, unowned"):
        train_masked(model, examples([0], 0), owner, 1, 1, 1e-3, neutral_scope="none")
    with pytest.raises(ValueError, match="neutral_scope must be None or one of all, unowned"):
        masked_backward(model, examples([0], 0), owner, neutral_scope="")
    with pytest.raises(ValueError, match="use_segments inside use_group"):
        with GradMasker(model, owner) as gm, gm.use_group(0), gm.use_segments([0]): pass
    with pytest.raises(ValueError, match="GradMasker passed as owner has neutral_scope='all'"):
        with GradMasker(model, owner) as gm: masked_backward(model, examples([0], 0), gm, neutral_scope="unowned")


# ---------------------------------------------------------------- distributed
def test_distributed_matches_single_process(tmp_path):
    """2 CPU processes give the gradient and weights of one process with the same global batch.
    The processes run on gloo: torchrun --standalone; DDP via accelerate, and FSDP2."""
    dist_dir, single_dir = tmp_path / "dist", tmp_path / "single"
    dist_dir.mkdir(); single_dir.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*torchrun_argv(2), str(ROOT / "tests" / "inject_dist_worker.py"), str(dist_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (dist_dir / "world_size.txt").read_text() == "2"
    worker.run(single_dir)
    owner = random_element_masks(worker.tiny_model(), worker.N_GROUPS, 0.2, seed=1)
    init = dict(worker.tiny_model().named_parameters())
    for kind in ("grad", "grad_segmented", "grad_grouped"):
        d, s = load_file(dist_dir / f"{kind}.safetensors"), load_file(single_dir / f"{kind}.safetensors")
        for n in s:   # the all-reduced masked gradient equals the one-process gradient of the same global batch
            torch.testing.assert_close(d[n], s[n], rtol=1e-5, atol=1e-7, msg=f"{kind} {n}")
    for phase in ("mixed", "pii"):
        # 3 AdamW steps at lr 1e-2: Adam's m/sqrt(v) amplifies float-rounding differences of tiny gradients
        # (seen up to 5e-6), hence the looser tolerance on weights.
        d, s = load_file(dist_dir / f"{phase}.safetensors"), load_file(single_dir / f"{phase}.safetensors")
        for n in s:
            torch.testing.assert_close(d[n], s[n], rtol=1e-4, atol=5e-5, msg=f"{phase} {n}")
        assert any(not torch.equal(s[n], init[n]) for n in s)
    # FSDP2 (each decoder layer and the root sharded over the 2 ranks): the hook sees the unsharded weight, the masked
    # gradient is reduce-scattered; same gradient and weights as one process, and the PII-only run keeps its masks
    for kind, ref, tol in [
        ("grad_fsdp2", "grad", dict(rtol=1e-5, atol=1e-7)),
        ("mixed_fsdp2", "mixed", dict(rtol=1e-4, atol=5e-5)),
        ("pii_fsdp2", "pii", dict(rtol=1e-4, atol=5e-5)),
    ]:
        d, s = load_file(dist_dir / f"{kind}.safetensors"), load_file(single_dir / f"{ref}.safetensors")
        assert set(d) >= set(s), kind
        for n in s:
            torch.testing.assert_close(d[n], s[n], **tol, msg=f"{kind} {n}")
    for kind in ("pii", "pii_fsdp2"):   # masks intact across ranks: PII-only run, groups 0 and 1
        d = load_file(dist_dir / f"{kind}.safetensors")
        for n, p in init.items():
            m = inside(owner, n, p, [0, 1])
            assert torch.equal(d[n][~m], p.detach()[~m]), f"{kind} {n}"


_AMP_SCRIPT = r'''
import json, random, sys, torch
sys.path.insert(0, sys.argv[1])
from test_inject import tiny, examples, inside
from lume_lab.inject.injection import train_masked
from lume_lab.inject.masks import random_element_masks
model = tiny(0); owner = random_element_masks(model, 6, 0.15, seed=0)
dtypes = set()
model.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, i, o: dtypes.add(str(o.dtype)))
before = {n: p.detach().clone() for n, p in model.named_parameters()}
log = train_masked(model, examples([1, 4] * 4, 0), owner, steps=3, batch_size=4, lr=1e-2, seed=0, micro_batch_size=2,
                   progress=False)
out_of_mask = {n: ~inside(owner, n, p, [1, 4]) for n, p in model.named_parameters()}
outside = all(torch.equal(p.detach()[out_of_mask[n]], before[n][out_of_mask[n]]) for n, p in model.named_parameters())
print(json.dumps({"forward": sorted(dtypes), "params": sorted({str(p.dtype) for p in model.parameters()}),
                  "outside_unchanged": outside, "loss": log.loss.tolist()}))
'''


def test_bf16_autocast_over_float32_weights():
    """ACCELERATE_MIXED_PRECISION=bf16:
    the trainer's Accelerator autocasts forwards to bf16, AdamW steps float32 weights, masks still hold."""
    def run(mp):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_MIXED_PRECISION": mp}
        out = subprocess.run(
            [sys.executable, "-c", _AMP_SCRIPT, str(ROOT / "tests")], env=env, cwd=ROOT, capture_output=True, text=True,
            timeout=HANG_TIMEOUT)
        assert out.returncode == 0, out.stderr[-2000:]
        import json
        return json.loads(out.stdout.strip().splitlines()[-1])
    amp, fp32 = run("bf16"), run("no")
    assert amp["forward"] == ["torch.bfloat16"] and fp32["forward"] == ["torch.float32"]
    assert amp["params"] == fp32["params"] == ["torch.float32"]
    assert amp["outside_unchanged"] and fp32["outside_unchanged"]
    assert amp["loss"] != fp32["loss"]            # the bf16 forward really ran: its losses differ in the low bits
