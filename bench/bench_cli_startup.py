"""How long the quick `lume-lab` commands take to answer, side by side with importing torch alone.

`lume-lab --help`, `presets` and `status` import no torch, transformers or papermill (tests/test_cli.py asserts the
modules; this prints the time). `config` resolves every method's hyperparameters through the method registry, whose
method modules import torch, so it pays for torch once. Each command runs in a fresh interpreter, the commands and
the reference interleaved, and the median over repetitions is printed with its ratio to `python -c "import torch"`
(these machines are shared and noisy: read the ratios, not the seconds).

    .venv/bin/python bench/bench_cli_startup.py [--reps 5]
"""
import argparse, json, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MINI = HERE.parent / "tests" / "data" / "mini_run"          # a committed run directory: `status` reads its manifest


def seconds(argv: list[str]) -> float:
    "Wall seconds of one fresh process running `argv` (it must succeed)."
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    runs = Path(tempfile.mkdtemp())
    shutil.copytree(MINI, runs / "mini")
    cli = [sys.executable, "-c", "import sys; from lume_lab.pipeline.orchestration.cli import main; sys.exit(main())"]
    cases = {"import torch (reference)": [sys.executable, "-c", "import torch"],
             "lume-lab --help": cli + ["--help"], "lume-lab presets": cli + ["presets"],
             "lume-lab status": cli + ["status", "mini", "--runs-root", str(runs)],
             "lume-lab config --preset mini": cli + ["config", "--preset", "mini"]}
    times = {k: [] for k in cases}
    for _ in range(a.reps):
        for k, argv in cases.items(): times[k].append(seconds(argv))
    ref = statistics.median(times["import torch (reference)"])
    print(f"{'command':<32} {'median s':>9} {'/ import torch':>15}")
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"{k:<32} {m:>9.2f} {m / ref:>15.2f}")
    print(json.dumps({"reps": a.reps, "python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
