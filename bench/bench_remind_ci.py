"""REMIND's bootstrap intervals over profiles: all draws at once from running sums over the sorted scores
(`grouped_auc_ci`) vs draw by draw with `exact_auc` (`grouped_auc_ci_loop`, the reference), side by side.

Inputs shaped like one `remind_ci` comparison: `--profiles` profiles per class (retained, forgotten, holdout), each with
`--rows` rows (the original question and its rephrasing move together), and out-of-fold probabilities (random here:
the speed does not depend on them). Both the one-vs-rest macro AUC (`pos=None`, REMIND's "multi") and one binary
comparison are timed. Both paths must give bitwise-equal intervals; the script checks it before timing. Repetitions
are interleaved and the median is reported (the machines are shared).

    .venv/bin/python bench/bench_remind_ci.py [--profiles 24] [--rows 2] [--boot 1000] [--reps 3]

`stage_remind_ci` calls it once per model × input × classifier × comparison (a run with 12 models: a few hundred calls).
"""
import argparse, statistics, time

import numpy as np
import pandas as pd

from lume_lab.analysis.remind import CLASSES
from lume_lab.analysis.remind_eval import grouped_auc_ci, grouped_auc_ci_loop


def inputs(profiles: int, rows: int, seed: int = 0):
    "(labels, probabilities, profile ids) of `profiles` profiles per class with `rows` rows each."
    rng = np.random.default_rng(seed)
    y = np.repeat(np.array(CLASSES), profiles * rows)
    groups = np.repeat(np.arange(len(CLASSES) * profiles), rows)
    P = pd.DataFrame(rng.dirichlet(np.ones(len(CLASSES)), len(y)), columns=list(CLASSES))
    return y, P, groups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", type=int, default=24); ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--boot", type=int, default=1000); ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    y, P, g = inputs(a.profiles, a.rows)
    cases = {"multi (one-vs-rest macro)": None, f"binary ({CLASSES[1]} vs all)": CLASSES[1]}
    for name, pos in cases.items():
        yy = y if pos is None else np.where(y == pos, pos, "rest")
        PP = P if pos is None else P[[pos]]
        assert grouped_auc_ci(yy, PP, pos, g, a.boot) == grouped_auc_ci_loop(yy, PP, pos, g, a.boot), name   # bitwise
        times = {"all draws at once": [], "draw by draw": []}
        for _ in range(a.reps):
            for label, fn in (("all draws at once", grouped_auc_ci), ("draw by draw", grouped_auc_ci_loop)):
                t = time.perf_counter(); fn(yy, PP, pos, g, a.boot); times[label].append(time.perf_counter() - t)
        fast, slow = statistics.median(times["all draws at once"]), statistics.median(times["draw by draw"])
        print(
            f"{name}: {len(y)} rows, {a.boot} draws — all at once {fast * 1e3:.1f} ms, draw by draw {slow * 1e3:.1f} "
            f"ms, ratio {slow / fast:.1f}x (bitwise-equal intervals)"
        )


if __name__ == "__main__":
    main()
