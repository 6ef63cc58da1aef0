"""Where one segmented masked injection step spends its time: torch.profiler's table of operators, self CPU time first.

    .venv/bin/python bench/profile_masked_step.py [--model smollm2|mini] [--batch 8] [--seq-len 40] [--groups 6]
                                                  [--variant where|index|idle] [--rows 25]

`--variant` picks the step (`bench_owned_index.py` times the three side by side): `where` masks each group's
weight-gradient part with a `where` over the weight, `index` adds it at the owned weights (`OwnedIndex`), `idle` also
leaves the weights no mask owns out of AdamW's step (`idle_parameters`; the defaults). One warm-up step, one timed, one
profiled. Run it with one thread (`OMP_NUM_THREADS=1`) for a table that adds up."""
import sys, time
from pathlib import Path

import torch

from lume_lab.inject.injection import idle_parameters, masked_step
from lume_lab.inject.masks import GradMasker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from masked_step_setup import arguments, build  # noqa: E402


def main():
    a = arguments(seq_len=40, groups=6, extra=[("--variant", dict(default="idle", choices=["where", "index", "idle"])),
                                                ("--rows", dict(type=int, default=25))])
    model, _, owner, batch = build(a, neutral=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    idle = tuple(idle_parameters(list(model.named_parameters()), batch, owner, 0.0)) if a.variant == "idle" else ()
    with GradMasker(model, owner, a.groups) as masker:
        if a.variant == "where": masker.owned = None
        step = lambda: masked_step(model, batch, masker, opt, segmented=True, pad_to=a.seq_len, idle=idle)
        step()
        t0 = time.perf_counter(); step(); print(f"{a.variant}: one step {time.perf_counter() - t0:.2f} s, "
                                                f"{torch.get_num_threads()} thread(s)")
        with torch.profiler.profile() as prof: step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
