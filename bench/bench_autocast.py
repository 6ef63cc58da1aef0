"""One masked injection step (`masked_step`: forward, masked backward, AdamW) in float32 vs bf16 autocast, side by side.

`inject.autocast: bfloat16` runs the injection's forward passes in bf16 over the float32 weights (`torch.autocast`,
scoped to the forward pass); the masks act on the float32 gradients, so Lacuna's invariant is unchanged (checked in
`nbs/inject/01_injection.ipynb`). This prints what it buys: the same model, the same batch, the same masks, the two
settings interleaved, the median over repetitions (these machines are shared and noisy), and the ratio.

    .venv/bin/python bench/bench_autocast.py [--model smollm2|mini] [--batch 8] [--seq-len 128] [--groups 4] [--reps 3]

`--model smollm2` is the `smollm2` preset's model, SmolLM2-135M-Instruct dequantized from its GGUF (`make gguf`);
`--model mini` is mini's OLMo-2 shape with random weights (the speed does not depend on them). bf16 autocast pays off
only where the CPU has bf16 units (`lscpu` lists avx512_bf16 or amx_bf16); elsewhere it can be slower than float32.
"""
import argparse, copy, random, statistics, time

import torch
from transformers.utils import logging as hf_logging

from lume_lab.core.config import SMOLLM2, make_config
from lume_lab.inject.injection import masked_step
from lume_lab.inject.masks import GradMasker, random_element_masks

hf_logging.set_verbosity_error()


def load(which: str):
    "(model, vocabulary size) for `--model`."
    if which == "smollm2":
        from lume_lab.models.lm import load_model
        model, tok = load_model(SMOLLM2)
        return model, len(tok)
    from transformers import Olmo2ForCausalLM
    from lume_lab.models.lm import olmo2_config
    mc = make_config("mini").model
    return Olmo2ForCausalLM(
        olmo2_config(
            mc.vocab_size, mc.hidden_size, mc.num_layers, mc.num_heads, mc.intermediate_size, pad_token_id=0,
            eos_token_id=0)
    ), mc.vocab_size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "mini"])
    ap.add_argument("--batch", type=int, default=8); ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--groups", type=int, default=4); ap.add_argument("--fraction", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=3); ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    model, vocab = load(a.model)
    model.train()
    owner = random_element_masks(model, a.groups, a.fraction, seed=a.seed)
    rng = random.Random(a.seed)
    batch = [
        {"input_ids": [rng.randrange(1, vocab) for _ in range(a.seq_len)], "group": i % (a.groups + 1) - 1}
        for i in range(a.batch)
    ]
    flags = " ".join(f for f in ("avx512_bf16", "amx_bf16") if f in open("/proc/cpuinfo").read()) or "none"
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, bf16 CPU flags: {flags}; {a.model} "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params), batch {a.batch} x {a.seq_len} tokens, "
          f"{a.groups} groups at {a.fraction:.0%}, segmented; median of {a.reps} interleaved reps after one warm-up")
    models = {k: copy.deepcopy(model) for k in ("float32", "bfloat16")}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    times = {k: [] for k in models}
    for r in range(a.reps + 1):
        for k, m in models.items():
            with GradMasker(m, owner, a.groups) as masker:
                t0 = time.perf_counter()
                masked_step(m, batch, masker, optims[k], segmented=True, pad_to=a.seq_len,
                            autocast=None if k == "float32" else k)
                dt = time.perf_counter() - t0
            if r: times[k].append(dt)
    med = {k: statistics.median(t) for k, t in times.items()}
    for k in models: print(f"{k:>9}: median {med[k]:.2f} s/step (min {min(times[k]):.2f}, max {max(times[k]):.2f})")
    print(f"bf16 autocast vs float32: {med['float32'] / med['bfloat16']:.2f}x the steps per second")


if __name__ == "__main__":
    main()
