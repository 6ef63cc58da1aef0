"""Exact AUC over scores that never exist all at once (`lume_lab.analysis.localization.streaming_auc`), at 7B scale.

A 7B model has ~7e9 maskable weights; `localization_aucs` scores them tensor by tensor. This bench streams N
synthetic float32 scores (15 % positives, ~1.3k distinct values: heavy ties, like m^F = 3 groups × 5 %) in chunks of
one "tensor" (default 2^24 ≈ a 4096 × 4096 projection) that are regenerated from a per-chunk seed on every pass, so
neither the scores nor the labels are ever materialized. It prints wall time and peak memory (VmHWM) of the process,
beside scikit-learn's cost measured on a small size in a subprocess and scaled (it must hold every score: ~69 bytes
each). First it checks streaming_auc against roc_auc_score on 1e6 scores of the same generator.

    .venv/bin/python bench/bench_auc_stream.py                 # 1e8 scores (~1 min on 2 cores)
    .venv/bin/python bench/bench_auc_stream.py --n 1e9         # the full size (goal: peak < 4 GB)
"""
import argparse, json, subprocess, sys, time


def _status_kb(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"): return int(line.split()[1])
    raise KeyError(key)


def chunks(n: int, chunk: int, seed: int):
    "A fresh iterator of (scores, labels) chunks; chunk i comes from seed (seed, i), the same on every pass."
    import torch
    def gen():
        for i, start in enumerate(range(0, n, chunk)):
            k = min(chunk, n - start)
            g = torch.Generator().manual_seed(seed * 1_000_003 + i)
            lab = torch.rand(k, generator=g) < 0.15
            yield ((torch.rand(k, generator=g) + 0.3 * lab) * 1000).floor() / 1000, lab
    return gen


def sklearn_worker(n: int, seed: int) -> dict:
    import torch
    from sklearn.metrics import roc_auc_score
    s, l = map(torch.cat, zip(*chunks(n, 1 << 16, seed)()))   # the chunks of the exactness check below
    base = _status_kb("VmRSS")
    t = time.perf_counter(); auc = roc_auc_score(l.numpy(), s.numpy()); sec = time.perf_counter() - t
    return dict(seconds=sec, extra_mb=(_status_kb("VmHWM") - base) / 1024, auc=auc)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", default="1e8"); p.add_argument("--chunk", type=int, default=1 << 24)
    p.add_argument("--seed", type=int, default=0); p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sklearn-worker", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.sklearn_worker: print(json.dumps(sklearn_worker(a.sklearn_worker, a.seed))); return
    import torch
    from lume_lab.analysis.localization import streaming_auc
    torch.set_num_threads(a.threads)
    n = int(float(a.n))
    # exactness on a size scikit-learn can hold
    ref = json.loads(subprocess.run([sys.executable, __file__, "--sklearn-worker", str(10 ** 6), "--seed", str(a.seed)],
                                    capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    ours_small = streaming_auc(chunks(10 ** 6, 1 << 16, a.seed))
    print(
        f"check on 1e6 scores: streaming {ours_small:.17f}  sklearn {ref['auc']:.17f}  |Δ| = "
        f"{abs(ours_small - ref['auc']):.1e}"
    )
    base_mb = _status_kb("VmRSS") / 1024
    t = time.perf_counter(); auc = streaming_auc(chunks(n, a.chunk, a.seed)); sec = time.perf_counter() - t
    peak_mb = _status_kb("VmHWM") / 1024
    sk_bytes = ref["extra_mb"] * 2 ** 20 / 10 ** 6
    print(
        f"torch {torch.__version__}, {a.threads} threads; n = {n:.0e} scores in chunks of {a.chunk:,} (3 passes: "
        "counts, smaller class, stream)"
    )
    ours_extra = peak_mb - base_mb
    print(f"{'':>22} {'seconds':>9} {'extra MB':>9} {'bytes/score':>12}")
    print(f"{'streaming_auc':>22} {sec:>9.1f} {ours_extra:>9.0f} {ours_extra * 2 ** 20 / n:>12.2f}   auc {auc:.12f}")
    print(
        f"{'sklearn (scaled 1e6)':>22} {ref['seconds'] * n / 1e6:>9.1f} {sk_bytes * n / 2**20:>9.0f} "
        f"{sk_bytes:>12.2f}   (plus the {5 * n / 2**20:.0f} MB of scores and labels it must hold)"
    )
    print(
        f"process peak {peak_mb / 1024:.2f} GB ({'<' if peak_mb < 4096 else '>='} the 4 GB goal); "
        f"extra memory sklearn/ours {sk_bytes * n / 2**20 / max(ours_extra, 1):.1f}x, time sklearn/ours "
        f"{ref['seconds'] * n / 1e6 / sec:.1f}x"
    )


if __name__ == "__main__": main()
