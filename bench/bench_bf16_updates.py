"""How many weights an AdamW step actually changes when the weights are stored in bfloat16, beside float32.

`model.dtype=bfloat16` (the `olmo2-1b` and `olmo3-7b` presets) loads the weights in bf16 and every trainer steps them
in place: there is no float32 master copy. bf16 keeps 8 significant bits, so an update smaller than about half a unit
in the last place of a weight (|w| · 2⁻⁹) rounds back to the old value. AdamW's step is about `lr` per weight, so at
the small learning rates of the real-model presets (injection 1e-5) only weights with |w| ≲ 512 · lr move at all.

This script builds a preset's tiny OLMo-2 with `models.lm.build_model` (random weights, std 0.02: trained OLMo-2
matrices are of the same order), runs the same `--steps` AdamW steps on the same random batch in float32 and in
bfloat16, and prints the share of matrix weights that changed in each, and, for bf16, the median |w| of the weights that
moved and of those that did not. Weight-change scores (localization precision) then see weight magnitude as well as the
method.

    .venv/bin/python bench/bench_bf16_updates.py [--preset smoke] [--lrs 1e-5 1e-4 5e-4] [--steps 3]
"""
import argparse

import dataclasses

import torch
from transformers.utils import logging as hf_logging

from lume_lab.core.config import make_config
from lume_lab.models.lm import build_model

hf_logging.set_verbosity_error()


class VocabOnly:
    "What `build_model` reads from a tokenizer: its length and the special ids (no text is encoded here)."
    eos_token_id, pad_token_id, bos_token_id = 1, 0, 1
    def __init__(self, n: int): self.n = n
    def __len__(self): return self.n


def changed_share(model_cfg, dtype: str, lr: float, steps: int, seed: int = 0) -> tuple[float, float, float]:
    "(share of 2-D weights changed, median |w| of the changed, median |w| of the unchanged) after `steps` AdamW steps."
    model = build_model(dataclasses.replace(model_cfg, dtype=dtype), VocabOnly(model_cfg.vocab_size), seed).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 2}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    x = torch.randint(0, model_cfg.vocab_size, (8, 64), generator=torch.Generator().manual_seed(seed))
    for _ in range(steps):
        model(input_ids=x, labels=x).loss.backward(); opt.step(); opt.zero_grad()
    moved, still = [], []
    for n, p in model.named_parameters():
        if n not in before: continue
        m = p.detach() != before[n]
        moved.append(before[n][m].abs().float().flatten()); still.append(before[n][~m].abs().float().flatten())
    moved, still = torch.cat(moved), torch.cat(still)
    med = lambda t: float(t.median()) if t.numel() else float("nan")
    return moved.numel() / (moved.numel() + still.numel()), med(moved), med(still)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="smoke", help="architecture of this preset's tiny model (default smoke)")
    ap.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 1e-4, 5e-4])
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    m = make_config(a.preset).model
    print(
        f"{a.preset} architecture ({m.num_layers} layers × {m.hidden_size}), {a.steps} AdamW steps, share of matrix "
        "weights changed:"
    )
    print(f"{'lr':>8} {'float32':>8} {'bfloat16':>9} {'bf16/fp32':>10}   median |w| bf16 moved / unmoved")
    for lr in a.lrs:
        f32, _, _ = changed_share(m, "float32", lr, a.steps)
        b16, w_moved, w_still = changed_share(m, "bfloat16", lr, a.steps)
        print(f"{lr:>8.0e} {f32:>8.3f} {b16:>9.3f} {b16 / f32:>10.3f}   {w_moved:.2e} / {w_still:.2e}")


if __name__ == "__main__":
    main()
