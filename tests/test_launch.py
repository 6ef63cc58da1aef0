"""Multi-process stages (`pipeline.orchestration.launch`): `lume-lab stage` under `torch.distributed.run` equals one
process, only rank 0 writes the run, the papermill-side `launched_stage` starts the job; no stage hard-codes the CPU;
bf16 keeps masks exact."""
import ast, json, os, shutil, subprocess, sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from lume_lab.core.config import make_config
from lume_lab.core.store import open_run
from lume_lab.inject.masks import load_masks, group_mask
from lume_lab.pipeline.orchestration.config import resolve_config
from lume_lab.pipeline.orchestration.launch import ENV_LAUNCHER, ENV_PROCESSES, launch_command, launch_env
from lume_lab.pipeline.stages.base import stage_base, stage_pii, stage_tokenizer, stage_world
from lume_lab.pipeline.stages.testbed import stage_inject, stage_masks
from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
# smoke, short: 24 pretraining steps, 6 injection steps of a global batch of 16 (8 per rank)
OVERRIDES = {"pretrain.steps": 24, "pretrain.checkpoint_every": 8, "inject.steps": 6}


def _weights(run_dir, stage):
    return load_file(str(run_dir / stage / "model" / "model.safetensors"))


def assert_same_training(run_a, run_b, stage, max_outliers=1e-4):
    """A job's stage trained what one process trains: per-step losses within rtol 1e-5, and the weights within rtol 1e-4
    / atol 5e-5 except for at most `max_outliers` of them. The exception is Adam's: it moves a coordinate by about ±lr
    whatever the gradient's size, so where a gradient is a cancellation residue near its eps (seen: 3 of 65,536
    embedding weights of tokens seen once), summing it over 2 ranks in another order changes that step."""
    la, lb = (pd.read_csv(r / stage / "log.csv") for r in (run_a, run_b))
    np.testing.assert_allclose(lb.loss, la.loss, rtol=1e-5)
    a, b = _weights(run_a, stage), _weights(run_b, stage)
    assert a.keys() == b.keys()
    off = {n: int((~torch.isclose(b[n], a[n], rtol=1e-4, atol=5e-5)).sum()) for n in a}
    n_all = sum(t.numel() for t in a.values())
    assert sum(off.values()) <= max_outliers * n_all, {n: k for n, k in off.items() if k}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    "Two copies of one smoke run with everything injection needs (world, tokenizer, base, pii, masks) done."
    root = tmp_path_factory.mktemp("launch")
    store = open_run("one", resolve_config(make_config("smoke", OVERRIDES)), root)
    stage_world(store); stage_tokenizer(store); stage_base(store); stage_pii(store); stage_masks(store)
    shutil.copytree(root / "one", root / "two"); shutil.copytree(root / "one", root / "sharded")
    return root


def _one_and_two_processes(runs, stage: str, run_one: str, run_two: str, fsdp2: bool = False) -> tuple[dict, dict]:
    """Run `lume-lab stage <stage>` in one process on `run_one` and as a 2-process torchrun job on `run_two` (the model
    sharded by FSDP2 with `fsdp2`); their manifest entries."""
    env = launch_env("torchrun")
    one = subprocess.run(
        [
            sys.executable, "-m", "lume_lab.pipeline.orchestration.cli", "stage", stage, "--run-id", run_one,
            "--runs-root", str(runs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(launch_command(stage, run_two, runs, 2, "torchrun", fsdp2=fsdp2), cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert two.returncode == 0, two.stderr[-3000:]
    return tuple(json.loads((runs / r / "manifest.json").read_text())["stages"][stage] for r in (run_one, run_two))


def test_two_process_stage_equals_one_process(runs):
    """`lume-lab stage inject_masked` in 2 torchrun processes (gloo) gives one process's weights.
    Rank 0 alone writes the run."""
    m1, m2 = _one_and_two_processes(runs, "inject_masked", "one", "two")
    assert m1["status"] == m2["status"] == "done" and m1["hash"] == m2["hash"]
    assert m2["processes"] == 2 and "processes" not in m1
    assert not list((runs / "two").glob(".*.partial"))               # nothing half-written left behind
    assert_same_training(runs / "one", runs / "two", "inject_masked")   # the gradients themselves: test_inject
    a, base = _weights(runs / "one", "inject_masked"), _weights(runs / "one", "base")
    assert sum(not torch.equal(a[n], base[n]) for n in a) > len(a) // 2       # injection did move the weights
    # masks intact: the masks file is untouched and the run's masks are what the stage used
    assert (runs / "one" / "masks" / "masks.safetensors").read_bytes() == (
        runs / "two" / "masks" / "masks.safetensors"
    ).read_bytes()


def test_two_process_fsdp2_injection_equals_one_process(runs):
    "`lume-lab stage inject_masked --fsdp2`: the model sharded over 2 gloo ranks (FSDP2) learns one process's weights."
    stage_inject(open_run("one", root=runs), True)                   # cached when the test above ran
    e = subprocess.run(launch_command("inject_masked", "sharded", runs, 2, "torchrun", fsdp2=True), cwd=ROOT,
                       env=launch_env("torchrun"), capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert e.returncode == 0, e.stderr[-3000:]
    assert "sharded over 2 processes" in e.stdout + e.stderr                 # FSDP2, not DDP, trained it
    m = json.loads((runs / "sharded" / "manifest.json").read_text())["stages"]["inject_masked"]
    assert m["status"] == "done" and m["processes"] == 2
    # gathered into full tensors, the usual names
    assert_same_training(runs / "one", runs / "sharded", "inject_masked")
    b, base = _weights(runs / "sharded", "inject_masked"), _weights(runs / "one", "base")
    # it trained (the mask invariant under FSDP2 is in test_inject)
    assert sum(not torch.equal(b[n], base[n]) for n in b) > len(b) // 2


def test_two_process_instruction_tuning_equals_one_process(runs):
    """`lume-lab stage instruct_masked` (LoRA, DDP over 2 gloo ranks) merges the adapters one process would.
    Both start from the same injected model."""
    stage_inject(open_run("one", root=runs), True)                   # cached when the test above ran
    for r in ("three", "four"): shutil.copytree(runs / "one", runs / r)
    m3, m4 = _one_and_two_processes(runs, "instruct_masked", "three", "four")
    assert m3["status"] == m4["status"] == "done" and m3["hash"] == m4["hash"] and m4["processes"] == 2
    a, b, inj = (
        _weights(runs / "three", "instruct_masked"),
        _weights(runs / "four", "instruct_masked"),
        _weights(runs / "one", "inject_masked"),
    )
    L = make_config("smoke").model.num_layers
    changed = sorted(n for n in a if not torch.equal(a[n], inj[n]))
    # LoRA merged into the last two layers
    assert changed and all(f"layers.{L - 2}." in n or f"layers.{L - 1}." in n for n in changed), changed
    for n in a: torch.testing.assert_close(b[n], a[n], rtol=1e-4, atol=5e-5, msg=n)
    l3, l4 = (pd.read_csv(runs / r / "instruct_masked" / "log.csv") for r in ("three", "four"))
    assert l3.step.tolist() == l4.step.tolist() and l3.is_best.tolist() == l4.is_best.tolist()
    np.testing.assert_allclose(l4.val_loss, l3.val_loss, rtol=1e-4)
    # the global batch's token mean on every rank
    np.testing.assert_allclose(l4.train_loss[1:], l3.train_loss[1:], rtol=1e-4)


def test_launched_stage_from_the_notebook_side(runs, monkeypatch):
    "With --num-processes 2 in the environment, `stage_inject` starts the job itself and returns the finished stage."
    store = open_run("two", root=runs)
    monkeypatch.setenv(ENV_PROCESSES, "2"); monkeypatch.setenv(ENV_LAUNCHER, "torchrun")
    d = stage_inject(store, masked=False)
    e = store.entry("inject_unmasked")
    assert e["status"] == "done" and e["processes"] == 2 and d == store.path("inject_unmasked")
    monkeypatch.setenv(ENV_PROCESSES, "1")
    one = open_run("one", root=runs)
    stage_inject(one, masked=False)                                    # in this process
    assert_same_training(runs / "one", runs / "two", "inject_unmasked")
    hits = store.entry("inject_unmasked")["cache_hits"]
    monkeypatch.setenv(ENV_PROCESSES, "2")
    stage_inject(store, masked=False)                                  # cached: no job is started
    store.reload(); assert store.entry("inject_unmasked")["cache_hits"] == hits + 1


def test_default_device_is_honoured_by_the_loaders(runs, monkeypatch):
    "Models are built and loaded where `default_device` says (here the meta device), not on a hard-coded CPU."
    from lume_lab.models.lm import load_model
    from lume_lab.pipeline.stages.base import load_base
    monkeypatch.setenv("LUME_LAB_DEVICE", "meta")
    store = open_run("one", root=runs)
    for model in (load_base(store)[0], load_model(store.path("base") / "model")[0]):   # stages load through load_model
        assert {p.device.type for p in model.parameters()} == {"meta"}
    assert load_model(store.path("base") / "model", device="cpu")[0].device.type == "cpu"   # a named device wins


# Literal CPU placements allowed in library code, each for a reason (they move data *off* the accelerator or build
# something device-independent); any other `"cpu"` in lume_lab/ is a stage that would silently run on the CPU.
CPU_ALLOWED = {   # file → (number of "cpu" literals, why each is not a placement of compute)
    "pipeline/stages/testbed.py": (1, "masks are drawn from the base model's shapes on the CPU: seeded, "
                                      "device-independent"),
    "inject/injection.py": (2, "the injection checkpoint's RNG-state key 'cpu', written and read back (the CPU "
                               "generator's state)"),
    "unlearn/base.py": (2, "the unlearning checkpoint's RNG-state key 'cpu', written and read back (the CPU "
                           "generator's state)"),
    "models/lm.py": (3, "the pretraining checkpoint's RNG-state key 'cpu' (twice) and torch.load(map_location='cpu') "
                        "of optimizer state, which load_state_dict then moves to the parameters' device"),
    "analysis/localization.py": (1, "weight-change scores move to the CPU in float32 for the exact streaming AUC"),
    "unlearn/localized_graddiff.py": (1, "top-k selection of attribution scores: numpy's introselect on the CPU copy; "
                                         "the mask then moves to the parameters' device"),
    "analysis/attribution.py": (2, "per-weight statistics of two state dicts for the scikit-learn mask-signature "
                                   "classifier (numpy)"),
}


def test_no_stage_hard_codes_the_cpu():
    found = {}
    for f in (ROOT / "lume_lab").rglob("*.py"):
        rel = f.relative_to(ROOT / "lume_lab").as_posix()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and node.value == "cpu":
                found.setdefault(rel, []).append(node.lineno)
    stray = {k: v for k, v in found.items() if len(v) != CPU_ALLOWED.get(k, (0,))[0]}
    assert not stray, (f"'cpu' literals in {stray} differ from the reasoned allow-list: a stage that names the CPU "
                       "runs there even on a GPU machine; use models.accel.default_device() (or update CPU_ALLOWED "
                       "with the reason)")


def test_bf16_pii_only_steps_keep_out_of_mask_weights_bitwise():
    "The bf16 path: PII-only masked steps change no weight outside its group's mask, bit for bit."
    sys.path.insert(0, str(ROOT / "tests"))
    import inject_dist_worker as worker
    from lume_lab.inject.injection import train_masked
    from lume_lab.inject.masks import random_element_masks
    model = worker.tiny_model().to(torch.bfloat16)
    owner = random_element_masks(model, worker.N_GROUPS, 0.2, seed=1)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_masked(model, worker.examples([0, 1, 1, 0, 0, 1], seed=3), owner, steps=3, batch_size=3, lr=1e-2,
                 weight_decay=0.0, seed=0, micro_batch_size=2, progress=False)
    moved = 0
    for n, p in model.named_parameters():
        assert p.dtype == torch.bfloat16
        inside = group_mask(owner[n], [0, 1]) if n in owner else torch.zeros_like(p, dtype=torch.bool)
        assert torch.equal(p.detach()[~inside], init[n][~inside]), n
        moved += int((p.detach()[inside] != init[n][inside]).sum())
    assert moved > 0                                                   # the masked weights did learn in bf16


def test_study_preset_end_to_end_on_cpu_in_bf16(tmp_path):
    """`lume-lab run --preset study` with smoke sizes runs every experiment on the CPU through the code path the GPU run
    uses, here in bfloat16: the run completes, the models are bf16, and OracleGrad moves no weight outside m^F, bit for
    bit."""
    from lume_lab.core.config import PRESETS
    from lume_lab.pipeline.orchestration.cli import main
    from lume_lab.pipeline.orchestration.runner import experiment_notebooks
    from lume_lab.pipeline.stages.testbed import forget_groups, ground_truth_forget_mask
    # every experiment's code path in bf16 at the least work: one relearning epoch per attack and two REMIND variants
    # (bf16 matmuls are emulated on a processor without bf16 units: these two were over a third of the chain's time)
    sizes = {**PRESETS["smoke"], "pretrain.steps": 24, "pretrain.checkpoint_every": 8, "model.dtype": "bfloat16",
             "unlearn.methods": ["npo", "oracle_grad"], "unlearn.forget_fields": ["phone_number"],
             "robustness.relearn_epochs": 1, "remind.variants": 2}
    args = ["run", "--preset", "study", "--run-id", "study", "--runs-root", str(tmp_path)]
    for k, v in sizes.items(): args += ["--set", f"{k}={json.dumps(v)}"]
    assert main(args) == 0
    run = tmp_path / "study"
    man = json.loads((run / "manifest.json").read_text())
    assert {v["status"] for v in man["stages"].values()} == {"done"}
    assert sorted(p.name for p in (run / "notebooks").glob("*.ipynb")) == sorted(p.name for p in experiment_notebooks())
    assert man["overrides"] == json.loads(json.dumps(sizes))           # the --set overrides it was created with
    cfg = open_run("study", root=tmp_path).config
    assert cfg.preset == "study" and cfg.pii.n_groups == 6 and cfg.inject.mask_fraction == 0.13
    a = load_file(str(run / "instruct_masked" / "model" / "model.safetensors"))
    b = load_file(str(run / "unlearn_oracle_grad_phone_number" / "model" / "model.safetensors"))
    assert {t.dtype for t in a.values()} == {torch.bfloat16}
    m = ground_truth_forget_mask(load_masks(run / "masks" / "masks.safetensors")[0], forget_groups(cfg))
    for n in a:
        out = ~m[n] if n in m else torch.ones_like(a[n], dtype=torch.bool)
        assert torch.equal(a[n][out], b[n][out]), n
    assert sum(int((a[n][m[n]] != b[n][m[n]]).sum()) for n in m) > 0
