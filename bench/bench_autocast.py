"""One masked injection step (`masked_step`: forward, masked backward, AdamW) in float32 vs bf16 autocast, side by side.

`inject.autocast: bfloat16` runs the injection's forward passes in bf16 over the float32 weights (`torch.autocast`,
scoped to the forward pass); the masks act on the float32 gradients, so Lacuna's invariant is unchanged (checked in
`nbs/inject/01_injection.ipynb`). This prints what it buys: the same model, the same batch, the same masks, the two
settings interleaved, the median over repetitions (these machines are shared and noisy), and the ratio.

    .venv/bin/python bench/bench_autocast.py [--model smollm2|mini] [--batch 8] [--seq-len 128] [--groups 4] [--reps 3]
                                             [--page docs/results/autocast-<machine>.md]

`--page` also writes what it printed as a results page, with the command, commit, date and machine.

`--model smollm2` is the `smollm2` preset's model, SmolLM2-135M-Instruct dequantized from its GGUF (`make gguf`);
`--model mini` is mini's OLMo-2 shape with random weights (the speed does not depend on them). bf16 autocast pays off
only where the CPU has bf16 units (`lscpu` lists avx512_bf16 or amx_bf16); elsewhere it can be slower than float32.
"""
import copy, statistics, sys, time
from pathlib import Path

import torch

from lume_lab.inject.injection import masked_step
from lume_lab.inject.masks import GradMasker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from masked_step_setup import arguments, build, write_page  # noqa: E402


def main():
    a = arguments(seq_len=128, groups=4)
    model, _, owner, batch = build(a, neutral=True)
    out = []
    def say(line): print(line, flush=True); out.append(line)
    flags = " ".join(f for f in ("avx512_bf16", "amx_bf16") if f in open("/proc/cpuinfo").read()) or "none"
    say(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, bf16 CPU flags: {flags}; {a.model} "
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
    for k in models: say(f"{k:>9}: median {med[k]:.2f} s/step (min {min(times[k]):.2f}, max {max(times[k]):.2f})")
    say(f"bf16 autocast vs float32: {med['float32'] / med['bfloat16']:.2f}x the steps per second")
    if a.page:
        write_page(Path(a.page), "bench_autocast.py", "bf16 autocast against float32: one masked injection step",
                   "One masked, segmented injection step (forward, masked backward, AdamW) in float32 and under bf16 "
                   "autocast, the two interleaved.", out)


if __name__ == "__main__":
    main()
