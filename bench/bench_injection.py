"""Masked injection vs unmasked training vs the per-sample reference loop (Lacuna Algorithm 1), side by side.

Same model, same batch, one process. Times one gradient computation (forward + backward(s) into .grad) of a
global batch; the optimizer step is identical in all three and excluded. Repetitions are interleaved and the
median is reported, because these machines are shared and noisy.

    .venv/bin/python bench/bench_injection.py [--hidden 128] [--seq-len 64] [--batch 16] [--groups 1 4 8]
        [--reps 5] [--device cpu|cuda] [--dtype bfloat16] [--modes ...]

Goals: masked/unmasked throughput >= 0.9x (masked = one backward per group sub-batch, or segmented); mask storage <= 1
byte per parameter.

Tried and reverted (2026-11-23): SegmentedLinear's per-segment `where` replaced by one gather over the stacked group
parts. It halved the masking overhead of a single 1024 × 256 layer in isolation, but on this bench (quiet machine,
7 reps) it gave 0.79x / 0.77x vs the where-loop's 0.82x / 0.82x at 6 / 8 groups: not the cost. What remains is
probably the modules that `GradMasker._segmented_forward` runs once per segment (norms, embeddings).
Tried and reverted (2026-11-23, session 8): those modules (no mask covers them) run at most twice over the whole batch,
with and without the weights' gradient, each row picking its pass. Gradients bitwise equal to the segment loop, but no
faster: fastest of 15 interleaved reps at 4 / 6 / 8 groups 0.85x / 0.88x / 0.86x vs the loop's 0.93x / 0.90x / 0.86x
(hidden 128, one thread, other jobs running). A profile (6 groups) puts the rest in SegmentedLinear's backward: the
per-segment `owner == code` + `where` (~8 % of CPU time), while its matmuls cost less than unmasked training's
(PII rows compute no gradient for the weights no mask covers).
At the presets' shapes the goal holds (2026-11-24, one thread, medians, 4 / 6 / 8 groups): segmented 0.91 / 0.95 / 0.90x
with `--hidden 256 --layers 6 --seq-len 128 --batch 8` (mini) and 0.92 / 0.95 / 0.95x with `--hidden 512 --layers 8
--seq-len 128 --batch 8` (study): the per-group masking pass costs ~ groups x weights, the matmuls ~ rows x weights.
'masked grouped' (2026-11-26) is the segmented backward in `inject.masks`' grouped mode: each Linear's group
parts written into one buffer indexed by owner code and picked by one gather, the modules no mask covers run once.
Unlike the gather reverted above, the index is the owner id clamped (a vectorised uint8 pass; `masked_fill` and `where`
on uint8 tensors were ~25x slower than a float add on this CPU), with no lookup table. Side by side with segmented, one
thread, the 2 cores shared with two other jobs (load ~4), `--modes "masked segmented" "masked grouped"`, throughput
ratio grouped / segmented at 4 / 6 / 8 groups, median of the per-rep ratios (the two back to back in each rep):
mini (15 reps) 1.04 / 0.97 / 1.11x, study (11 reps) 1.04 / 1.02 / 1.00x; ratios of medians 1.03 / 0.95 / 1.11x and
1.03 / 0.95 / 0.99x. No slower, within this machine's noise: on a CPU at these shapes the segmented mode itself runs at
0.91-1.06x unmasked (same runs), so there is little to win here. The grouped mode targets the GPU, where the segmented
mode was launch-bound (0.35-0.39x unmasked on the H200, 2026-11-24); measured there by bench/gpu_check.py, owed.
"""
import argparse, random, statistics, time

import torch
from transformers import Olmo2ForCausalLM
from transformers.utils import logging as hf_logging

from lume_lab.inject.masks import GradMasker, random_element_masks, pack_masks
from lume_lab.models.lm import olmo2_config
from lume_lab.inject.injection import masked_backward, per_sample_reference_grads

hf_logging.set_verbosity_error()
MODES = ["unmasked", "masked", "masked segmented", "masked grouped", "per-sample ref"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=128); ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64); ap.add_argument("--batch", type=int, default=16)
    ap.add_argument(
        "--groups", type=int, nargs="+", default=[1, 4, 8], help="numbers of PII groups present in the batch"
    )
    ap.add_argument("--neutral", type=float, default=0.5, help="fraction of neutral rows in the batch")
    ap.add_argument("--reps", type=int, default=5); ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--modes", nargs="+", default=MODES, choices=MODES, help="which methods to time (unmasked is always timed)"
    )
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = olmo2_config(1024, a.hidden, a.layers, 4, 4 * a.hidden, pad_token_id=0, eos_token_id=0)
    model = Olmo2ForCausalLM(cfg).to(device=a.device, dtype=getattr(torch, a.dtype))
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    G = max(a.groups)
    owner = random_element_masks(model, G, 1 / (2 * G), seed=a.seed)
    n_params = sum(p.numel() for p in model.parameters()); n_elig = sum(o.numel() for o in owner.values())
    owner_bytes = sum(o.numel() * o.element_size() for o in owner.values())
    packed_bytes = sum(o.numel() * o.element_size() for o in pack_masks(owner, G).values())
    dev = (torch.cuda.get_device_name(a.device) if a.device.startswith("cuda")
           else f"CPU, {torch.get_num_threads()} threads")
    print(
        f"torch {torch.__version__}, device {a.device} ({dev}), {a.dtype}; OLMo-2 hidden {a.hidden}, {a.layers} "
        f"layers, {n_params / 1e6:.2f}M params ({n_elig / 1e6:.2f}M eligible); batch {a.batch} x {a.seq_len} tokens, "
        f"{a.neutral:.0%} neutral; median of {a.reps} interleaved reps (shared 2-core machine: expect noise)"
    )
    print(
        f"mask storage: owner uint8 {owner_bytes / n_elig:.2f} B/eligible weight = {owner_bytes / n_params:.3f} "
        "B/model param; "
        f"packed int32 {packed_bytes / n_elig:.2f} B/eligible weight = {packed_bytes / n_params:.3f} B/model param"
    )
    rng = random.Random(a.seed)
    ids = lambda: [rng.randrange(1, 1024) for _ in range(a.seq_len)]
    rows, versus = [], []
    for k in a.groups:
        n_neutral = round(a.neutral * a.batch)
        batch = [{"input_ids": ids(), "group": -1} for _ in range(n_neutral)]
        batch += [{"input_ids": ids(), "group": i % k} for i in range(a.batch - n_neutral)]
        runs = {
            "unmasked": lambda: masked_backward(model, batch, None, masked=False, micro_batch_size=a.batch),
            "masked": lambda: masked_backward(model, batch, masker, micro_batch_size=a.batch),
            "masked segmented": lambda: masked_backward(
                model, batch, masker, micro_batch_size=a.batch, segmented=True, pad_to=a.seq_len
            ),
            "masked grouped": lambda: masked_backward(
                model, batch, masker, micro_batch_size=a.batch, segmented=True, pad_to=a.seq_len, grouped=True
            ),
            "per-sample ref": lambda: per_sample_reference_grads(model, batch, owner),
        }
        runs = {n: f for n, f in runs.items() if n == "unmasked" or n in a.modes}
        times = {n: [] for n in runs}
        with GradMasker(model, owner, G) as masker:
            for r in range(a.reps + 1):   # first rep is warm-up
                for n, f in runs.items():
                    model.zero_grad(set_to_none=True)
                    sync(); t0 = time.perf_counter(); f(); sync(); dt = time.perf_counter() - t0
                    if r: times[n].append(dt)
        med = {n: statistics.median(t) for n, t in times.items()}; lo = {n: min(t) for n, t in times.items()}
        for n in runs:
            rows.append(
                (k, n, med[n], a.batch / med[n], med["unmasked"] / med[n], lo[n], lo["unmasked"] / lo[n], max(times[n]))
            )
        if "masked grouped" in med and "masked segmented" in med:
            # same rep, back to back
            pair = [g / s for g, s in zip(times["masked grouped"], times["masked segmented"])]
            versus.append(
                (
                    k, med["masked segmented"] / med["masked grouped"], lo["masked segmented"] / lo["masked grouped"],
                    1 / statistics.median(pair),
                    med["per-sample ref"] / med["masked grouped"] if "per-sample ref" in med else float("nan"))
            )
    print(
        f"\n{'groups':>6} {'method':>17} {'median s':>9} {'samples/s':>10} {'vs unmasked':>12} {'min s':>7} "
        f"{'vs unm. (min)':>14} {'max s':>7}"
    )
    for k, n, m, thr, ratio, lo_, rlo, hi in rows:
        print(f"{k:>6} {n:>17} {m:>9.3f} {thr:>10.1f} {ratio:>11.2f}x {lo_:>7.3f} {rlo:>13.2f}x {hi:>7.3f}")
    if versus:
        print(
            f"\n{'groups':>6} {'grouped vs segmented':>21} {'(min)':>6} {'(paired)':>9} {'grouped vs per-sample':>22}"
        )
    for k, r_med, r_lo, r_pair, r_ps in versus:
        print(
            f"{k:>6} {r_med:>20.2f}x {r_lo:>5.2f}x {r_pair:>8.2f}x "
            + (f"{r_ps:>21.2f}x" if r_ps == r_ps else f"{'(not timed)':>22}")
        )
    print("\n'vs unmasked' = throughput ratio of medians; 'vs unm. (min)' = ratio of the fastest reps, the less "
          "contention-sensitive estimate on a shared machine.")
    print(
        "'vs unmasked' = throughput ratio (goal for masked: >= 0.9x). Masked does one backward per group sub-batch (k "
        "PII groups present -> k+1 backwards); 'masked segmented' does one backward: Linear weight-gradient matmuls "
        "split per group, other parameterised modules run per group segment; 'masked grouped' is that backward with "
        "each Linear's group parts picked by one gather and the modules no mask covers run once; the per-sample "
        "reference does one backward per row. 'grouped vs segmented' = throughput ratio (> 1: grouped faster): of "
        "medians, of the fastest reps, and the median of the per-rep ratios (the two run back to back in every rep)."
    )


if __name__ == "__main__":
    main()
