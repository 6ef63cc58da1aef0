"""How many weights an AdamW step actually changes when the weights are stored in bfloat16, beside float32.

`model.dtype=bfloat16` (the `olmo2-1b` and `olmo3-7b` presets) loads the weights in bf16 and every trainer steps them
in place: there is no float32 master copy. bf16 keeps 8 significant bits, so an update smaller than about half a unit
in the last place of a weight (|w| · 2⁻⁹) rounds back to the old value. AdamW's step is about `lr` per weight, so at
the small learning rates of the real-model presets (injection 1e-5) only weights with |w| ≲ 512 · lr move at all.

This script takes a preset's architecture with random weights (HF's init, std 0.02: trained OLMo-2 matrices are of
the same order), runs the same `--steps` AdamW steps on the same random batch in float32 and in bfloat16, and prints
the share of matrix weights that changed in each, and, for bf16, the median |w| of the weights that moved and of those
that did not. Weight-change scores (localization precision) then see weight magnitude as well as the method.

    .venv/bin/python bench/bench_bf16_updates.py [--preset smoke] [--lrs 1e-5 1e-4 5e-4] [--steps 3]
"""
import argparse

import torch
from transformers import Olmo2Config, Olmo2ForCausalLM
from transformers.utils import logging as hf_logging

from lume_lab.core.config import make_config

hf_logging.set_verbosity_error()


def changed_share(cfg: Olmo2Config, dtype: torch.dtype, lr: float, steps: int, seed: int = 0) -> tuple[float, float, float]:
    "(share of 2-D weights changed, median |w| of the changed ones, median |w| of the unchanged ones) after `steps` AdamW steps."
    torch.manual_seed(seed)
    model = Olmo2ForCausalLM(cfg).to(dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 2}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    x = torch.randint(0, cfg.vocab_size, (8, 64), generator=torch.Generator().manual_seed(seed))
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
    cfg = Olmo2Config(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
                      num_attention_heads=m.num_heads, num_key_value_heads=m.num_heads, intermediate_size=m.intermediate_size,
                      max_position_embeddings=m.max_seq_len, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    print(f"{a.preset} architecture ({m.num_layers} layers × {m.hidden_size}), {a.steps} AdamW steps, share of matrix weights changed:")
    print(f"{'lr':>8} {'float32':>8} {'bfloat16':>9} {'bf16/fp32':>10}   median |w| bf16 moved / unmoved")
    for lr in a.lrs:
        f32, _, _ = changed_share(cfg, torch.float32, lr, a.steps)
        b16, w_moved, w_still = changed_share(cfg, torch.bfloat16, lr, a.steps)
        print(f"{lr:>8.0e} {f32:>8.3f} {b16:>9.3f} {b16 / f32:>10.3f}   {w_moved:.2e} / {w_still:.2e}")


if __name__ == "__main__":
    main()
