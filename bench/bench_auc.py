"""Exact streaming ROC AUC (`lume_lab.analysis.localization.exact_auc`) vs `sklearn.metrics.roc_auc_score`.

Same data (float32 scores with ~1.3k distinct values, i.e. heavy ties; 15 % positives, like m^F = 3 groups × 5 %),
each measurement in a fresh subprocess: wall time of the AUC call and its peak memory above the data
(Linux VmHWM reset through /proc/self/clear_refs after the data is built; tracemalloc cannot see torch).

    .venv/bin/python bench/bench_auc.py                 # 1e7
    .venv/bin/python bench/bench_auc.py --sizes 1e7 1e8 # 1e8: sklearn needs ~7 GB
"""
import argparse, json, subprocess, sys, time


def _status_kb(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"): return int(line.split()[1])
    raise KeyError(key)


def worker(impl: str, n: int, seed: int, threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    scores, labels = torch.empty(n, dtype=torch.float32), torch.empty(n, dtype=torch.bool)
    step = 10_000_000
    for i in range(0, n, step):
        k = min(step, n - i)
        lab = torch.rand(k, generator=g) < 0.15
        labels[i:i + k] = lab
        scores[i:i + k] = ((torch.rand(k, generator=g) + 0.3 * lab) * 1000).floor() / 1000
    if impl == "sklearn":
        from sklearn.metrics import roc_auc_score
        fn = lambda: roc_auc_score(labels.numpy(), scores.numpy())
    else:
        from lume_lab.analysis.localization import exact_auc
        fn = lambda: exact_auc(scores, labels)
    base = _status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f: f.write("5")          # reset VmHWM to the current RSS
    t = time.perf_counter(); auc = fn(); dt = time.perf_counter() - t
    return dict(impl=impl, n=n, seconds=dt, data_rss_mb=base / 1024, peak_extra_mb=(_status_kb("VmHWM") - base) / 1024,
                peak_total_mb=_status_kb("VmHWM") / 1024, auc=auc)


def measure(impl: str, n: int, seed: int, threads: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", impl, "--sizes", str(n), "--seed", str(seed), "--threads", str(threads)],
        capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["1e7"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", choices=["sklearn", "ours"])
    a = p.parse_args()
    sizes = [int(float(s)) for s in a.sizes]
    if a.worker: print(json.dumps(worker(a.worker, sizes[0], a.seed, a.threads))); return
    print(f"{'n':>12} {'impl':>8} {'seconds':>9} {'peak extra MB':>14} {'peak total MB':>14} {'auc':>20}")
    for n in sizes:
        r = {impl: measure(impl, n, a.seed, a.threads) for impl in ("sklearn", "ours")}
        for impl, m in r.items():
            print(
                f"{n:>12.0e} {impl:>8} {m['seconds']:>9.2f} {m['peak_extra_mb']:>14.0f} {m['peak_total_mb']:>14.0f} "
                f"{m['auc']:>20.17f}"
            )
        sk, us = r["sklearn"], r["ours"]
        print(f"{n:>12.0e}   speed-up {sk['seconds'] / us['seconds']:.2f}x, peak extra memory sklearn/ours "
              f"{sk['peak_extra_mb'] / max(us['peak_extra_mb'], 1):.1f}x, |Δauc| = {abs(sk['auc'] - us['auc']):.1e}, "
              f"data itself {us['data_rss_mb']:.0f} MB RSS")


if __name__ == "__main__": main()
