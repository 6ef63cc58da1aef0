"""REMIND's batched landscape scoring (`variant_losses`) vs a per-variant loop (`variant_losses_loop`), side by side.

Same model (the `mini` architecture, or any preset's; random weights: the speed does not depend on them), same
inputs: N questions of ~`--prompt-len` tokens with K EPP-style variants each and a short answer, as REMIND scores
them (K+1 sequences per input). Repetitions are interleaved and the median is reported (the machines are shared).
Both paths must give the same losses; the script checks it before timing.

    .venv/bin/python bench/bench_remind.py [--preset mini] [--inputs 48] [--variants 15] [--batch 64]
        [--reps 3] [--device cpu|cuda]

Goal: batched / per-variant throughput >= 5x.
"""
import argparse, random, statistics, time

import numpy as np
import torch
from transformers import Olmo2ForCausalLM
from transformers.utils import logging as hf_logging

from lume_lab.analysis.remind import variant_losses, variant_losses_loop
from lume_lab.core.config import make_config
from lume_lab.models.lm import olmo2_config

hf_logging.set_verbosity_error()


def examples(n: int, K: int, prompt_len: int, answer_len: int, vocab: int, seed: int) -> list[dict]:
    "Random-id inputs shaped like REMIND's: a prompt, K variants differing in ~30 % of the first 2/3 of it, an answer."
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        L = prompt_len + rng.randint(-4, 4)
        p = [rng.randrange(4, vocab) for _ in range(L)]
        var = [
            [rng.randrange(4, vocab) if i < 2 * L // 3 and rng.random() < 0.3 else t for i, t in enumerate(p)]
            for _ in range(K)
        ]
        out.append(
            {
                "prompt_ids": p, "variants": var, "answer_ids": [rng.randrange(4, vocab) for _ in range(answer_len)],
                "eos_id": 1}
        )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini"); ap.add_argument("--inputs", type=int, default=48)
    ap.add_argument("--variants", type=int, default=15); ap.add_argument("--prompt-len", type=int, default=28)
    ap.add_argument("--answer-len", type=int, default=8); ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3); ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    mc = make_config(a.preset).model
    if mc.name_or_path is not None:
        raise SystemExit(
            f"preset {a.preset!r} names a hub model; this benchmark builds the mini architecture (use --preset mini "
            "or smoke)"
        )
    torch.manual_seed(a.seed)
    model = Olmo2ForCausalLM(olmo2_config(
        mc.vocab_size, mc.hidden_size, mc.num_layers, mc.num_heads, mc.intermediate_size, mc.max_seq_len,
        pad_token_id=0, eos_token_id=1)).to(a.device).eval()
    ex = examples(a.inputs, a.variants, a.prompt_len, a.answer_len, mc.vocab_size, a.seed)
    n_seq = a.inputs * (a.variants + 1)
    check = min(8, a.inputs)
    diff = np.abs(variant_losses(model, ex[:check], batch_size=a.batch) - variant_losses_loop(model, ex[:check])).max()
    print(
        f"model: {a.preset} architecture ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters) on "
        f"{a.device}, threads {torch.get_num_threads()}; {a.inputs} inputs × {a.variants + 1} sequences = {n_seq}; max "
        f"|batched − loop| = {diff:.2e}"
    )
    if diff > 1e-4: raise SystemExit("batched and per-variant losses differ: fix before timing")
    times = {"batched": [], "per-variant": []}
    for _ in range(a.reps):
        for name, fn in (
            ("batched", lambda: variant_losses(model, ex, batch_size=a.batch)),
            ("per-variant", lambda: variant_losses_loop(model, ex)),
        ):
            if a.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if a.device == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items(): print(f"{k:>12}: {v:7.2f} s  ({n_seq / v:8.1f} sequences/s, median of {a.reps})")
    print(f"batched / per-variant throughput: {med['per-variant'] / med['batched']:.1f}x (goal >= 5x)")


if __name__ == "__main__":
    main()
