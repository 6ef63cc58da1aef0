"""Cross-module and bad-input tests of lume_lab.unlearn:
registry and specs, every gradient method on the toy problem, OracleGrad's mask."""
import copy, math, os
import pytest, torch

os.environ.setdefault("IN_TEST", "1")
from lume_lab.core.config import PRESETS
from lume_lab.models.ops import qa_nll
from lume_lab.models.toy import toy_problem
from lume_lab.unlearn.registry import BUILTIN_METHODS, MethodSpec, get_spec, method_names, register_method
from conftest import HANG_TIMEOUT

GRADIENT_METHODS = ["grad_ascent", "grad_diff", "ukl", "dpo", "npo", "simnpo", "oracle_grad"]


@pytest.fixture(scope="module")
def problem():
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield toy_problem(seed=0, finetune_steps=60)
    torch.set_num_threads(n)


def _forget_mask(model, frac=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.rand(p.shape, generator=g) < frac for n, p in model.named_parameters()
            if n.startswith("model.layers.0.") and n.endswith("proj.weight")}


def _run(name, problem, hparams, seed=0):
    model, tok, forget, retain = problem
    kw = {"ground_truth_mask": _forget_mask(model)} if name == "oracle_grad" else {}
    return get_spec(name).run(copy.deepcopy(model), tok, forget, retain, hparams, seed=seed, **kw)


@pytest.mark.parametrize("name", GRADIENT_METHODS)
def test_every_method_raises_forget_loss(name, problem):
    model, tok, forget, retain = problem
    before = qa_nll(model, tok, forget)
    unl, log = _run(name, problem, {"lr": 1e-2, "max_steps": 3})
    assert qa_nll(unl, tok, forget) > before + 0.05, name          # no silent no-op
    assert list(log.step) == [0, 1, 2] and log.forget_nll.notna().all()
    assert unl is not model and not unl.training


def test_builtin_specs_registered_under_their_names():
    for name in BUILTIN_METHODS:
        spec = get_spec(name)
        assert (
            spec.name == name and set(spec.grid) <= set(spec.defaults) and f"unlearn.hparams.{name}" in PRESETS["mini"]
        )
    assert method_names()[:len(BUILTIN_METHODS)] == list(BUILTIN_METHODS)
    assert [n for n in BUILTIN_METHODS if not get_spec(n).has_control] == ["oracle_grad", "uld"]
    assert get_spec("oracle_grad").inputs == ("ground_truth_mask",) and get_spec("alphaedit").inputs == (
        "neutral_texts",
    )


def test_unknown_method_lists_allowed():
    with pytest.raises(ValueError, match="unknown unlearning method 'rmu'; allowed: grad_ascent, grad_diff"):
        get_spec("rmu")
    with pytest.raises(ValueError, match="takes a MethodSpec"):
        register_method("rmu")


def test_toy_method_registered_from_a_test_runs(problem):
    "A method registered from outside the package: found by name, listed after the built-ins, hparams checked."
    def fn(model, tokenizer, forget, retain, hp, *, seed=0):
        with torch.no_grad(): model.lm_head.weight.mul_(hp["scale"])
        return model, None
    register_method(
        MethodSpec(
            "test_scale", fn, {"scale": 0.5},
            check=lambda hp: [] if hp["scale"] > 0 else ["test_scale.scale must be > 0"])
    )
    model, tok, forget, retain = problem
    unl, _ = get_spec("test_scale").run(copy.deepcopy(model), tok, forget, retain)
    assert torch.allclose(unl.lm_head.weight, 0.5 * model.lm_head.weight) and method_names()[-1] == "test_scale"
    with pytest.raises(ValueError, match="test_scale.scale must be > 0"):
        get_spec("test_scale").run(model, tok, forget, retain, {"scale": -1.0})
    with pytest.raises(ValueError, match="takes no input"):
        get_spec("test_scale").run(model, tok, forget, retain, neutral_texts=["x"])


@pytest.mark.parametrize("name", GRADIENT_METHODS)
def test_unknown_hparam_names_allowed_keys(name, problem):
    with pytest.raises(ValueError, match=rf"unknown hyperparameter\(s\) 'learning_rate' for method '{name}'; allowed: "
                                         r"lr, epochs"):
        _run(name, problem, {"learning_rate": 1e-3})


def test_bad_hparam_values_rejected(problem):
    with pytest.raises(ValueError, match="simnpo.beta must be a positive number"):
        _run("simnpo", problem, {"beta": 0.0})
    with pytest.raises(ValueError, match="grad_diff.scheduler must be one of constant"):
        _run("grad_diff", problem, {"scheduler": "exponential"})


@pytest.mark.parametrize("name", BUILTIN_METHODS)
def test_presets_and_grid_resolve(name):
    """Every preset file's row of the method (mini, Lacuna Table 5) and every grid value resolves.
    Resolving is idempotent."""
    spec = get_spec(name)
    rows = {
        preset: values[f"unlearn.hparams.{name}"]
        for preset, values in PRESETS.items()
        if f"unlearn.hparams.{name}" in values
    }
    assert "mini" in rows
    for preset, values in rows.items():
        hp = spec.resolve(values)
        assert {k: hp[k] for k in values} == values and spec.resolve(hp) == hp, preset
    for k, vals in spec.grid.items():
        for v in vals: assert spec.resolve({k: v})[k] == v


def test_paper_presets_where_the_paper_has_them():
    assert {n for n in BUILTIN_METHODS if f"unlearn.hparams.{n}" in PRESETS["olmo2-1b"]} == {
        "simnpo", "oracle_grad", "memflex", "alphaedit"}
    assert get_spec("simnpo").resolve(PRESETS["olmo3-7b"]["unlearn.hparams.simnpo"])["alpha"] == 0.5


def test_missing_retain_is_an_error(problem):
    model, tok, forget, _ = problem
    with pytest.raises(ValueError, match="needs a non-empty retain set"):
        get_spec("grad_diff").run(copy.deepcopy(model), tok, forget, [], {"max_steps": 1})
    with pytest.raises(ValueError, match="needs a non-empty retain set with these hyperparameters"):
        get_spec("npo").run(copy.deepcopy(model), tok, forget, None, {"max_steps": 1, "alpha": 1.0})
    # plain NPO: no retain needed
    unl, log = get_spec("npo").run(copy.deepcopy(model), tok, forget, None, {"max_steps": 1})
    assert len(log) == 1 and math.isnan(log.retain_nll[0])


def test_bad_qa_rejected(problem):
    model, tok, forget, retain = problem
    with pytest.raises(ValueError, match=r"forget\[0\] needs a string 'answer'"):
        get_spec("grad_ascent").run(model, tok, [{"prompt": "Question: x?\nAnswer:"}], retain, {"max_steps": 1})


def test_oracle_grad_outside_mask_bitwise_unchanged(problem):
    model, tok, forget, retain = problem
    mask = _forget_mask(model, frac=0.3, seed=1)
    from lume_lab.unlearn.oracle_grad import oracle_grad
    unl, _ = oracle_grad(
        copy.deepcopy(model), tok, forget, retain, {"lr": 1e-2, "max_steps": 4}, ground_truth_mask=mask
    )
    after = dict(unl.named_parameters()); changed_in = 0
    for n, p in model.named_parameters():
        m = mask.get(n, torch.zeros_like(p, dtype=torch.bool))
        assert torch.equal(p.detach()[~m], after[n].detach().cpu()[~m]), n
        changed_in += int((p.detach()[m] != after[n].detach().cpu()[m]).sum())
    assert changed_in > 0.5 * sum(int(m.sum()) for m in mask.values())
    assert all(p.requires_grad for p in unl.parameters())          # temporarily frozen params restored


def test_oracle_grad_bad_masks(problem):
    model, tok, forget, retain = problem
    mask = _forget_mask(model)
    run = lambda m, **hp: get_spec("oracle_grad").run(
        copy.deepcopy(model), tok, forget, retain, {"max_steps": 1, **hp}, ground_truth_mask=m
    )
    with pytest.raises(ValueError, match="needs ground_truth_mask"): run(None)
    with pytest.raises(ValueError, match="must be a bool tensor"): run({k: v.to(torch.uint8) for k, v in mask.items()})
    with pytest.raises(ValueError, match="weight_decay must be 0"): run(mask, weight_decay=0.01)
    with pytest.raises(ValueError, match="not parameters of the model"):
        run({"model.nope.weight": torch.ones(2, dtype=torch.bool)})
    n0 = next(iter(mask))
    with pytest.raises(ValueError, match="has shape"): run({n0: torch.ones(3, dtype=torch.bool)})
    with pytest.raises(ValueError, match="selects no weight"): run({k: torch.zeros_like(v) for k, v in mask.items()})


def test_same_seed_same_model_different_seed_differs(problem):
    a, la = _run("simnpo", problem, {"lr": 1e-2, "max_steps": 3, "batch_size": 3}, seed=0)
    b, lb = _run("simnpo", problem, {"lr": 1e-2, "max_steps": 3, "batch_size": 3}, seed=0)
    c, _ = _run("simnpo", problem, {"lr": 1e-2, "max_steps": 3, "batch_size": 3}, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert la.equals(lb)
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))


def test_reference_model_untouched_and_input_trained_in_place(problem):
    "Methods with a reference model train the given model in place and return it; the ref never trains."
    model, tok, forget, retain = problem
    m = copy.deepcopy(model); w0 = m.lm_head.weight.detach().clone()
    from lume_lab.unlearn.npo import npo
    unl, log = npo(m, tok, forget, retain, {"lr": 1e-2, "max_steps": 2})
    assert unl is m and not torch.equal(w0, m.lm_head.weight.detach().cpu())
    # NPO's forget loss starts at (2/β) log 2 (π_θ = π_ref at step 0)
    assert abs(log.forget_loss[0] - 2 / 0.1 * math.log(2)) < 1e-4


_MP_SCRIPT = r'''
import copy, json, os, sys, torch
torch.set_num_threads(1)
from lume_lab.models.ops import qa_nll
from lume_lab.models.toy import toy_problem
from lume_lab.unlearn.registry import get_spec
out = sys.argv[1]
model, tok, forget, retain = toy_problem(finetune_steps=20)
unl, log = get_spec("grad_diff").run(copy.deepcopy(model), tok, forget, retain,
                                     {"lr": 1e-2, "max_steps": 3, "batch_size": 2})
rank = int(os.environ["RANK"])
torch.save({k: v.detach() for k, v in unl.state_dict().items()}, f"{out}/w{rank}.pt")
json.dump({"before": qa_nll(model, tok, forget), "after": qa_nll(unl, tok, forget), "steps": len(log)},
          open(f"{out}/r{rank}.json", "w"))
from lume_lab.models.accel import end_process_group
end_process_group()                      # no gloo threads left at exit (a rank can abort there otherwise)
sys.stdout.flush(); os._exit(0)          # work saved: skip the interpreter teardown, where gloo can still abort
'''


def test_accelerate_two_cpu_processes(tmp_path):
    """The loop under accelerate with 2 CPU processes (gloo): ranks end bitwise identical and the forget NLL rises.
    One process with the same global batch trains the same weights."""
    import json, subprocess, sys
    from lume_lab.pipeline.orchestration.launch import torchrun_argv
    script = tmp_path / "run.py"; script.write_text(_MP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "IN_TEST": "1"}
    r = subprocess.run(
        [*torchrun_argv(2), str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT
    )
    assert r.returncode == 0, r.stderr[-3000:]
    w0, w1 = (torch.load(tmp_path / f"w{i}.pt", weights_only=True) for i in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    res = [json.loads((tmp_path / f"r{i}.json").read_text()) for i in (0, 1)]
    assert res[0]["steps"] == 3 and res[0]["after"] > res[0]["before"] + 0.05
    # batch_size is the global batch (split over the ranks): one process takes the same 3 steps on the same examples
    one = tmp_path / "one"; one.mkdir()
    r1 = subprocess.run(
        [sys.executable, str(script), str(one)], env={**env, "RANK": "0"}, capture_output=True, text=True,
        timeout=HANG_TIMEOUT
    )
    assert r1.returncode == 0, r1.stderr[-3000:]
    s = json.loads((one / "r0.json").read_text()); ws = torch.load(one / "w0.pt", weights_only=True)
    assert s["steps"] == 3 and abs(s["after"] - res[0]["after"]) < 1e-4 * abs(s["after"])
    off = sum(int((~torch.isclose(w0[k], ws[k], rtol=1e-4, atol=5e-5)).sum()) for k in ws)
    # Adam's near-zero-gradient coordinates aside (test_launch)
    assert off <= 1e-4 * sum(v.numel() for v in ws.values()), off


_FSDP2_SCRIPT = r"""
import copy, json, os, sys, torch
torch.set_num_threads(1)
from lume_lab.models.lm import full_state_dict
from lume_lab.models.toy import toy_problem
from lume_lab.unlearn.registry import get_spec
out, rank = sys.argv[1], int(os.environ.get("RANK", "0"))
model, tok, forget, retain = toy_problem(finetune_steps=20)
torch.manual_seed(0)
mask = {n: torch.rand(p.shape) < 0.3 for n, p in model.named_parameters() if n.endswith("mlp.down_proj.weight")}
torch.save({n: p.detach().clone() for n, p in model.state_dict().items()}, f"{out}/init{rank}.pt")
torch.save(mask, f"{out}/mask{rank}.pt")
hp = {"lr": 1e-2, "max_steps": 3, "batch_size": 2}
for name, kw in [("grad_diff", {}), ("oracle_grad", {"ground_truth_mask": mask}), ("npo", {})]:
    unl, log = get_spec(name).run(copy.deepcopy(model), tok, forget, retain, hp, **kw)
    sd = full_state_dict(unl) or unl.state_dict()          # gathered from the FSDP2 shards on every rank
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in sd.items()}, f"{out}/{name}.pt")
        log.to_csv(f"{out}/{name}.csv", index=False)
print("sharded:", type(unl).__name__)
print(f"rank {rank}: trained and saved", flush=True)
del unl, sd                              # the sharded model holds the process group: free it before the teardown
from lume_lab.models.accel import end_process_group
end_process_group()                      # no gloo threads left at exit (a rank can abort there otherwise)
print(f"rank {rank}: process group down", flush=True)
os._exit(0)                              # work saved: skip the interpreter teardown, where gloo can still abort
"""


def test_fsdp2_two_cpu_processes_equal_one_process(tmp_path):
    """`--fsdp2` ($LUME_LAB_FSDP2=1): GradDiff, NPO (a sharded reference model) and OracleGrad (masks applied to the
    gradient shards: FSDP2 never fires tensor hooks) in 2 sharded processes train what one process trains, and
    OracleGrad leaves every weight outside its mask bitwise unchanged."""
    import json, subprocess, sys
    from lume_lab.pipeline.orchestration.launch import torchrun_argv
    import numpy as np, pandas as pd
    script = tmp_path / "run.py"; script.write_text(_FSDP2_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "IN_TEST": "1", "LUME_LAB_FSDP2": "1"}
    two, one = tmp_path / "two", tmp_path / "one"; two.mkdir(); one.mkdir()
    r = subprocess.run([*torchrun_argv(2), str(script), str(two)], env=env, capture_output=True, text=True,
                       timeout=HANG_TIMEOUT)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-3000:]   # stdout says whether the ranks got to the teardown
    assert "sharded: FSDP" in r.stdout                    # the model was sharded, not replicated
    r1 = subprocess.run([sys.executable, str(script), str(one)], env=env, capture_output=True, text=True,
                        timeout=HANG_TIMEOUT)
    assert r1.returncode == 0, r1.stderr[-3000:]
    assert "sharded: Olmo2ForCausalLM" in r1.stdout       # one process: nothing to shard over
    for name in ("grad_diff", "oracle_grad", "npo"):
        a, b = torch.load(one / f"{name}.pt", weights_only=True), torch.load(two / f"{name}.pt", weights_only=True)
        assert a.keys() == b.keys(), name
        la, lb = pd.read_csv(one / f"{name}.csv"), pd.read_csv(two / f"{name}.csv")
        for term in ("forget_loss", "retain_loss"):                    # each term of the loss, to float rounding
            np.testing.assert_allclose(lb[term], la[term], rtol=1e-5, err_msg=f"{name} {term}")
        # the loss is their difference: rounding of the terms, not of the difference (which cancels)
        scale = la.forget_loss.abs().to_numpy() + la.retain_loss.abs().fillna(0).to_numpy()   # NPO here: no retain
        np.testing.assert_array_less(np.abs(lb.loss - la.loss).to_numpy(), 1e-5 * scale + 1e-12, err_msg=name)
        off = sum(int((~torch.isclose(b[k], a[k], rtol=1e-4, atol=5e-5)).sum()) for k in a)
        assert off <= 1e-4 * sum(v.numel() for v in a.values()), (name, off)
    init, mask, og = (torch.load(two / f, weights_only=True) for f in ("init0.pt", "mask0.pt", "oracle_grad.pt"))
    for k, w in og.items():
        outside = ~mask[k] if k in mask else torch.ones_like(w, dtype=torch.bool)
        assert torch.equal(w[outside], init[k][outside]), k
    assert any(not torch.equal(og[k], init[k]) for k in mask)


@pytest.mark.parametrize("key,value", [
    ("alphaedit.kl_factor", float("inf")), ("alphaedit.v_lr", float("inf")), ("memflex.grad_threshold", float("inf")),
    ("memflex.retain_factor", float("nan")), ("memflex.forget_factor", float("-inf")),
    ("uld.retain_weight", float("nan")), ("memflex.grad_quantile", float("nan")), ("memflex.grad_quantile", 1.0)])
def test_method_hyperparameters_must_be_finite(key, value):
    """A method's own hyperparameters refuse NaN and ±inf before any compute.
    A JSON --set value of NaN or Infinity parses to these."""
    from lume_lab.core.config import ConfigError, make_config
    from lume_lab.pipeline.orchestration.config import resolve_config
    with pytest.raises((ConfigError, ValueError), match=key.replace(".", r"\.")):
        resolve_config(make_config("smoke", {f"unlearn.hparams.{key}": value}))
