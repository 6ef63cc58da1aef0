"""A trajectory point's cost: its splits scored in the order they come against shortest first (`split_metrics`).

An unlearning trajectory scores its choosing, reporting and retain splits at every evaluation point, one teacher-forced
forward per batch of 16 rows. Rows of one batch are padded to its longest, so rows whose lengths vary (the PII
questions carry up to four attributes each) spend much of a batch on padding; `analysis.trajectory.split_metrics`
scores them shortest first and reads the numbers back in order. This bench times both on a run's testbed model and
forget split, in one process, alternating, and prints the ratio and the largest difference in a row's answer
log-probability (float rounding: a row's numbers do not depend on its batch otherwise).

    .venv/bin/python bench/bench_trajectory_order.py RUN_DIR [--field phone_number] [--rows 96] [--reps 2]

RUN_DIR: a run with `testbed/` and `instruct_masked/` (e.g. runs/smollm2-paper/seed=0).
"""
import argparse, time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--field", default="phone_number")
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    from datasets import load_from_disk
    from lume_lab.analysis.trajectory import length_order, split_metrics
    from lume_lab.metrics.memorization import memorization_scores
    from lume_lab.models.lm import load_model

    rows = [dict(r) for r in load_from_disk(str(a.run / "testbed" / "splits"))[f"forget_{a.field}"]][: a.rows]
    model, tok = load_model(str(a.run / "instruct_masked" / "model"), device="cpu")
    lens = np.array([len(tok(r["prompt"] + r["answer"]).input_ids) for r in rows])
    pad = lambda ls: sum(ls[i:i + 16].max() * len(ls[i:i + 16]) for i in range(0, len(ls), 16)) / ls.sum()
    times = {"in order": [], "shortest first": []}
    for _ in range(a.reps):
        t = time.perf_counter(); s = memorization_scores(model, tok, rows, 16)
        times["in order"].append(time.perf_counter() - t)
        t = time.perf_counter(); m = split_metrics(model, tok, rows, 16)
        times["shortest first"].append(time.perf_counter() - t)
    order = length_order(rows)
    s2 = memorization_scores(model, tok, [rows[i] for i in order], 16).set_axis(order).sort_index()
    dlogp = np.abs(np.log(s.prob.to_numpy()) - np.log(s2.prob.to_numpy())).max()
    nll = float(-np.log(s.prob.clip(lower=1e-300)).mean())
    best = {k: min(v) for k, v in times.items()}
    print(f"{len(rows)} rows of {a.field}, {lens.min()}-{lens.max()} tokens (mean {lens.mean():.0f}); torch threads "
          f"{torch.get_num_threads()}")
    print(f"padded/real tokens: in order {pad(lens):.2f}, shortest first {pad(np.sort(lens)):.2f}")
    print(f"seconds (best of {a.reps}): in order {best['in order']:.1f}, shortest first {best['shortest first']:.1f}; "
          f"ratio {best['shortest first'] / best['in order']:.2f}")
    print(f"largest |Δ log p| of a row {dlogp:.1e}; mean NLL {nll:.6f} against {m['nll']:.6f}")


if __name__ == "__main__":
    main()
