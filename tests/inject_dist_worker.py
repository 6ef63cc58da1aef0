"""Worker for tests/test_inject.py::test_distributed_matches_single_process.

Run as `python -m torch.distributed.run --nproc_per_node 2 tests/inject_dist_worker.py OUT_DIR` (2 ranks; accelerate's
`Accelerator(cpu=True)` picks MULTI_CPU + gloo from the torchrun environment; `accelerate launch --cpu` spawns one
process only, it expects mpirun for multi-CPU) or
imported and called with `run(out_dir)` in one process. Phase "mixed": neutral + PII of several groups;
phase "pii": PII of groups 0 and 1 only, from a fresh model/optimizer without weight decay. Rank 0 writes
the final weights of each phase to OUT_DIR/<phase>.safetensors, and the gradient of one masked
backward to OUT_DIR/grad.safetensors (Adam is scale-invariant, so the weights alone would not catch a wrong
loss scale across ranks; the gradient does). With 2 ranks the same gradient and phases also run with the model
sharded by FSDP2 (`fsdp2=True`: `fully_shard` per decoder layer and the root), gathered into `*_fsdp2.safetensors`.
"""
import random, sys
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import save_file
from transformers import Olmo2ForCausalLM
from transformers.utils import logging as hf_logging

from lume_lab.inject.masks import random_element_masks
from lume_lab.inject.injection import masked_backward, train_masked
from lume_lab.models.accel import fsdp2_shard
from lume_lab.models.lm import full_state_dict, olmo2_config
from lume_lab.inject.masks import GradMasker

hf_logging.set_verbosity_error()
N_GROUPS = 4


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return Olmo2ForCausalLM(olmo2_config(128, num_layers=4, pad_token_id=0, eos_token_id=0))


def examples(groups, seed):
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(1, 128) for _ in range(rng.randrange(5, 14))], "group": g} for g in groups]


def run(out_dir, accelerator=None):
    accelerator = accelerator or Accelerator(cpu=True)
    if accelerator.is_main_process: (Path(out_dir) / "world_size.txt").write_text(str(accelerator.num_processes))
    owner = random_element_masks(tiny_model(), N_GROUPS, 0.2, seed=1)
    phases = {"mixed": (examples([-1, 0, 1, 2, 3, -1, 2, -1, 0, 3, -1, 1], seed=2), 0.1),
              "pii": (examples([0, 1, 1, 0, 0, 1, 1, 0, 0, 1], seed=3), 0.0)}
    # phase "grad": the accumulated masked gradient of one global batch of 7 (shards of 4 and 3 rows)
    model = accelerator.prepare(tiny_model())
    with GradMasker(accelerator.unwrap_model(model), owner) as masker:
        masked_backward(model, phases["mixed"][0][:7], masker, accelerator=accelerator, micro_batch_size=2)
    if accelerator.is_main_process:
        save_file({n: p.grad.contiguous().clone() for n, p in accelerator.unwrap_model(model).named_parameters()},
                  str(Path(out_dir) / "grad.safetensors"))
    model.zero_grad(set_to_none=True)   # the same with segmented masking (one backward per rank)
    with GradMasker(accelerator.unwrap_model(model), owner) as masker:
        masked_backward(model, phases["mixed"][0][:7], masker, accelerator=accelerator, micro_batch_size=8,
                        segmented=True, pad_to=16)
    if accelerator.is_main_process:
        save_file({n: p.grad.contiguous().clone() for n, p in accelerator.unwrap_model(model).named_parameters()},
                  str(Path(out_dir) / "grad_segmented.safetensors"))
    # and the segmented backward's grouped mode (one gather per Linear, unowned modules once)
    model.zero_grad(set_to_none=True)
    with GradMasker(accelerator.unwrap_model(model), owner) as masker:
        masked_backward(model, phases["mixed"][0][:7], masker, accelerator=accelerator, micro_batch_size=8,
                        segmented=True, pad_to=16, grouped=True)
    if accelerator.is_main_process:
        save_file({n: p.grad.contiguous().clone() for n, p in accelerator.unwrap_model(model).named_parameters()},
                  str(Path(out_dir) / "grad_grouped.safetensors"))
    for phase, (exs, wd) in phases.items():
        model = tiny_model()
        # odd global batch (5) over 2 ranks: shards of 3 and 2 rows with different group mixes
        train_masked(model, exs, owner, steps=3, batch_size=5, lr=1e-2, weight_decay=wd, seed=0,
                     micro_batch_size=2, accelerator=accelerator, progress=False)
        if accelerator.is_main_process:
            sd = {n: p.detach().contiguous().clone() for n, p in accelerator.unwrap_model(model).named_parameters()}
            save_file(sd, str(Path(out_dir) / f"{phase}.safetensors"))
        accelerator.wait_for_everyone()
    if accelerator.num_processes > 1: run_fsdp2(out_dir, accelerator, owner, phases)


def run_fsdp2(out_dir, accelerator, owner, phases):
    "The gradient and the phases again, the model sharded by FSDP2 over the ranks; full tensors gathered on every rank."
    model = fsdp2_shard(tiny_model())
    with GradMasker(model, owner) as masker:
        masked_backward(model, phases["mixed"][0][:7], masker, accelerator=accelerator, micro_batch_size=2)
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}   # a collective: every rank gathers
    if accelerator.is_main_process: save_file(grads, str(Path(out_dir) / "grad_fsdp2.safetensors"))
    for phase, (exs, wd) in phases.items():
        model = tiny_model()
        train_masked(model, exs, owner, steps=3, batch_size=5, lr=1e-2, weight_decay=wd, seed=0,
                     micro_batch_size=2, accelerator=accelerator, progress=False, fsdp2=True)
        sd = full_state_dict(model)
        if accelerator.is_main_process:
            save_file({n: t.contiguous() for n, t in sd.items()}, str(Path(out_dir) / f"{phase}_fsdp2.safetensors"))
        accelerator.wait_for_everyone()


if __name__ == "__main__":
    run(sys.argv[1])
    from lume_lab.models.accel import end_process_group
    end_process_group()                  # no gloo threads left at exit (a rank can abort there otherwise)
