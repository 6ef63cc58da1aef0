"""One segmented masked injection step three ways, side by side: each group's part masked by a `where` over the whole
weight (before); added by index (`OwnedIndex`); and by index with the weights the run never trains left out of the
optimizer step (`idle_parameters`; both are the defaults now).

`SegmentedLinear` splits a Linear's weight gradient by row segment, one part per group in the batch, and masks each
part to its group's weights. The `where` path passes over the whole weight three times per group present (the
`owner == code` comparison, the `where`, the sum); the index path adds the part at the group's owned weights only, whose
indices it finds once. Masks do not overlap, so the two give the same gradient bit for bit (tested in
`nbs/inject/00_masks.ipynb`). A PII-only run never trains a weight no mask owns (the tied embedding, the norms, the
reserved layers); AdamW from zero moments steps it by exactly 0, so skipping it changes nothing (tested in
`nbs/inject/01_injection.ipynb`). This prints what each buys: the same model, batch and masks, the three interleaved,
the median over repetitions, the ratios, and whether the three left the same weights.

    .venv/bin/python bench/bench_owned_index.py [--model smollm2|mini] [--batch 8] [--seq-len 40] [--groups 6]
                                                [--reps 3] [--page docs/results/owned-index-<machine>.md]
"""
import copy, statistics, sys, time
from pathlib import Path

import torch

from lume_lab.inject.injection import idle_parameters, masked_step
from lume_lab.inject.masks import GradMasker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from masked_step_setup import arguments, build, write_page  # noqa: E402


def main():
    a = arguments(seq_len=40, groups=6)
    # PII rows only, the groups spread over the batch as the testbed's are (no neutral rows)
    model, _, owner, batch = build(a, neutral=False)
    out = []
    def say(line): print(line, flush=True); out.append(line)
    say(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads; {a.model} "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params), batch {a.batch} x {a.seq_len} tokens, "
        f"{a.groups} groups at {a.fraction:.0%}, segmented, float32; median of {a.reps} interleaved reps after one "
        "warm-up")
    kinds = ("where", "index", "index, idle skipped")
    models = {k: copy.deepcopy(model) for k in kinds}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.0) for k, m in models.items()}
    maskers = {k: GradMasker(m, owner, a.groups).install() for k, m in models.items()}
    maskers["where"].owned = None
    idle = {k: tuple(idle_parameters(list(m.named_parameters()), batch, owner, 0.0)) if "idle" in k else ()
            for k, m in models.items()}
    times = {k: [] for k in models}
    for r in range(a.reps + 1):
        for k, m in models.items():
            t0 = time.perf_counter()
            masked_step(m, batch, maskers[k], optims[k], segmented=True, pad_to=a.seq_len, idle=idle[k])
            if r: times[k].append(time.perf_counter() - t0)
    ref = list(models["where"].parameters())
    same = all(torch.equal(p, q) for k in kinds[1:] for p, q in zip(models[k].parameters(), ref))
    med = {k: statistics.median(t) for k, t in times.items()}
    for k in models: say(f"{k:>19}: median {med[k]:.2f} s/step (min {min(times[k]):.2f}, max {max(times[k]):.2f})")
    skipped = sum(p.numel() for p in idle[kinds[2]]) / sum(p.numel() for p in model.parameters())
    say(f"against where: index {med['where'] / med['index']:.2f}x, index with idle weights skipped "
        f"({skipped:.0%} of the parameters) {med['where'] / med[kinds[2]]:.2f}x the steps per second; "
        f"weights after {a.reps + 1} steps {'identical' if same else 'DIFFER'}")
    if a.page:
        write_page(Path(a.page), "bench_owned_index.py",
                   "Segmented masking: a group's part added by index, idle weights skipped, against a `where`",
                   "One segmented masked injection step (forward, masked backward, AdamW) three ways, interleaved: "
                   "each group's weight-gradient part masked by `where(owner == code, part, 0)` over the whole weight; "
                   "added at its owned weights by index (`OwnedIndex`); and by index with the weights no mask owns "
                   "left out of AdamW's step (`idle_parameters`).", out)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
