"""`stage_remind_ci`'s two paths on one saved REMIND stage, side by side: the bootstrap over the out-of-fold
probabilities the stage saved (`oof_intervals`, used when `oof.parquet` is there) vs refitting every classifier from
`features.csv` first (`remind_intervals`, the path of a REMIND stage cached before the probabilities were saved).

Both must give bitwise-equal intervals; the script checks it, then prints each path's median seconds and the ratio.
Repetitions are interleaved (the machines are shared).

    .venv/bin/python bench/bench_remind_ci_stage.py [runs/<run_id>/remind_<field>] [--boot N] [--reps 1]

The stage directory must come from a run made with the code that saves `oof.parquet` (e.g.
`lume-lab run --preset smoke`). Without one (as `make bench` runs it), a stage is made up: `--profiles` profiles per
class, two rows each, two models and both inputs, random features and baselines, scored as `score_model` scores them
(`detector_scores`).
"""
import argparse, json, statistics, time
from pathlib import Path

import numpy as np
import pandas as pd

from lume_lab.pipeline.stages.remind import detector_scores, oof_intervals, oof_table, remind_intervals


def made_up_stage(profiles: int, seed: int = 0, n_splits: int = 5, rf_trees: int = 100):
    """(features, scores, oof, remind settings, seed) shaped like a REMIND stage's files, from random features.
    Scored by `detector_scores`, no model."""
    from lume_lab.analysis.remind import CLASSES, FEATURES
    from lume_lab.analysis.remind_eval import BASELINES
    rng, feats, scores, oof = np.random.default_rng(seed), [], [], []
    for model in ("none", "npo"):
        for inp in ("orig", "reph"):
            y = np.repeat(np.array(CLASSES), 2 * profiles); g = np.repeat([f"p{i}" for i in range(3 * profiles)], 2)
            F = pd.DataFrame(rng.normal(size=(len(y), len(FEATURES))), columns=list(FEATURES))
            B = pd.DataFrame(rng.normal(size=(len(y), len(BASELINES))), columns=list(BASELINES))
            scores.append(
                detector_scores(
                    F, B, y, g, model, inp, n_splits=n_splits, seed=seed, scaler="pooled", rf_trees=rf_trees, oof=oof
                )
            )
            feats.append(
                pd.concat([pd.DataFrame({"model": model, "input": inp, "class": y, "profile_id": g}), F, B], axis=1)
            )
    scores = pd.concat(scores, ignore_index=True).assign(n_splits=n_splits)
    return (
        pd.concat(feats, ignore_index=True), scores, oof_table(oof),
        {"scaler": "pooled", "rf_trees": rf_trees, "n_boot": 1000}, seed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "stage", type=Path, nargs="?", help="a REMIND stage directory: runs/<run_id>/remind_<field> (default: made up)"
    )
    ap.add_argument("--profiles", type=int, default=24, help="profiles per class of the made-up stage")
    ap.add_argument("--boot", type=int, default=None, help="bootstrap draws (default: the run's remind.n_boot)")
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    d = a.stage
    if d is None:
        feats, scores, oof, r, seed = made_up_stage(a.profiles); d = f"made-up stage ({a.profiles} profiles per class)"
    else:
        if not (d / "oof.parquet").exists():
            raise SystemExit(f"{d} has no oof.parquet: run REMIND with the current code first")
        cfg = json.loads((d.parent / "config.json").read_text())
        r, seed = cfg["remind"], cfg["seed"]
        feats = pd.read_csv(d / "features.csv", dtype={"profile_id": str})
        scores, oof = pd.read_csv(d / "scores.csv"), pd.read_parquet(d / "oof.parquet")
    n_boot = a.boot or r["n_boot"]
    refit = lambda: remind_intervals(feats, n_splits=int(scores.n_splits.iloc[0]), seed=seed, scaler=r["scaler"],
                                     rf_trees=r["rf_trees"], n_boot=n_boot)
    saved = lambda: oof_intervals(oof, scores, seed=seed, n_boot=n_boot)
    times = {"refit": [], "oof": []}
    for _ in range(a.reps):
        for name, fn in (("refit", refit), ("oof", saved)):
            t = time.perf_counter(); out = fn(); times[name].append(time.perf_counter() - t)
            if name == "refit": ref = out
            else:
                same = np.array_equal(
                    ref[0][["auc_lo", "auc_hi"]].to_numpy(), out[0][["auc_lo", "auc_hi"]].to_numpy(), equal_nan=True
                )
                if not same: raise SystemExit("the two paths' intervals differ")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{d}: {feats.groupby(['model', 'input']).ngroups} model x input, {len(oof):,} out-of-fold rows, {n_boot} "
        "draws; intervals bitwise equal"
    )
    print(f"refit {med['refit']:.2f} s | oof {med['oof']:.2f} s | refit / oof {med['refit'] / med['oof']:.1f}x")


if __name__ == "__main__":
    main()
