"""Threads or processes on a small CPU: one masked injection step's throughput with every core in one process, against
as many one-thread processes stepping at once, side by side in one run.

A 2-core machine can give a run both cores (`OMP_NUM_THREADS=2`), or run two jobs of one thread each: two seeds, two
sweep points (`executor: {kind: local, workers: 2, threads: 1}`, docs/sweeps.md). Which does more work per hour
depends on how well one step's operators scale over threads. This measures it on the step that dominates the
SmolLM2 testbed's CPU hours (segmented masked injection, the defaults: owned weights by index, idle weights skipped):

- one process with `--cores` threads;
- one process with one thread, alone;
- `--cores` processes with one thread each, stepping at the same time (each loads and warms up, then all start
  together).

It prints each one's median seconds per step and the machine's steps per second in each layout, and the ratio of the
one-thread processes at once to the one process with every thread: above 1, a queue of independent jobs finishes
sooner as one-thread jobs side by side. Each process builds the same model, masks and batch (`masked_step_setup`).

    .venv/bin/python bench/bench_threads.py [--model smollm2|mini] [--cores 2] [--steps 6]
                                            [--page docs/results/threads-<machine>.md]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(threads: int, steps: int, ready: Path, go: Path) -> None:
    "One process: build the step, warm up, say ready, wait for go, time `steps` steps; print the times as JSON."
    import torch
    torch.set_num_threads(threads)
    sys.path.insert(0, str(HERE))
    from masked_step_setup import build
    from lume_lab.inject.injection import idle_parameters, masked_step
    from lume_lab.inject.masks import GradMasker
    a = _args()
    model, _, owner, batch = build(a, neutral=False)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    masker = GradMasker(model, owner, a.groups).install()
    idle = tuple(idle_parameters(list(model.named_parameters()), batch, owner, 0.0))
    step = lambda: masked_step(model, batch, masker, optim, segmented=True, pad_to=a.seq_len, idle=idle)
    step()
    ready.touch()
    while not go.exists(): time.sleep(0.05)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
    print(json.dumps({"threads": torch.get_num_threads(), "times": times}), flush=True)


def _args():
    sys.path.insert(0, str(HERE))
    from masked_step_setup import arguments
    return arguments(seq_len=40, groups=6, extra=[
        ("--cores", {"type": int, "default": 2, "help": "threads of the one process; processes of one thread"}),
        ("--steps", {"type": int, "default": 6, "help": "timed steps per process, after one warm-up step"}),
        ("--worker", {"type": int, "default": None, "help": argparse.SUPPRESS}),
        ("--ready", {"default": None, "help": argparse.SUPPRESS}),
        ("--go", {"default": None, "help": argparse.SUPPRESS})])


def layout(a, threads: int, processes: int) -> list[list[float]]:
    "Start `processes` workers of `threads` threads each; release them together; their step times."
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        args = [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in ("model", "batch", "seq_len", "groups", "fraction",
                                                                      "seed", "steps")]
        procs, ready, logs = [], [], []
        for i in range(processes):
            ready.append(Path(tmp) / f"ready{i}")
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            logs.append(open(Path(tmp) / f"stderr{i}", "w"))   # loading bars and warnings; shown if a worker fails
            procs.append(subprocess.Popen(
                [sys.executable, __file__, *args, "--worker", str(threads), "--ready", str(ready[i]), "--go", str(go)],
                env=env, stdout=subprocess.PIPE, stderr=logs[-1], text=True))
        while not all(r.exists() for r in ready):
            if any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit("a worker failed:\n" + "".join((Path(tmp) / f"stderr{i}").read_text()[-3000:]
                                                                for i in range(processes)))
            time.sleep(0.2)
        go.touch()
        outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        for f in logs: f.close()
    assert all(o["threads"] == threads for o in outs), outs
    return [o["times"] for o in outs]


def main():
    a = _args()
    if a.worker is not None:
        worker(a.worker, a.steps, Path(a.ready), Path(a.go)); return 0
    out = []
    def say(line): print(line, flush=True); out.append(line)
    say(f"{a.model}, batch {a.batch} x {a.seq_len} tokens, {a.groups} groups at {a.fraction:.0%}, segmented masked "
        f"step (by index, idle weights skipped), float32; {a.steps} timed steps per process after one warm-up; "
        f"{os.cpu_count()} CPUs")
    rate = {}
    for name, threads, procs in ((f"1 process x {a.cores} threads", a.cores, 1), ("1 process x 1 thread", 1, 1),
                                 (f"{a.cores} processes x 1 thread", 1, a.cores)):
        times = layout(a, threads, procs)
        med = [statistics.median(t) for t in times]
        rate[name] = sum(1 / m for m in med)
        say(f"{name:>24}: median s/step per process {', '.join(f'{m:.2f}' for m in med)}; "
            f"{rate[name]:.3f} steps/s on the machine")
    one, many = f"1 process x {a.cores} threads", f"{a.cores} processes x 1 thread"
    say(f"{many} against {one}: {rate[many] / rate[one]:.2f}x the steps per second "
        f"(1 thread alone against {a.cores}: {rate['1 process x 1 thread'] / rate[one]:.2f}x)")
    if a.page:
        sys.path.insert(0, str(HERE))
        from masked_step_setup import write_page
        write_page(Path(a.page), "bench_threads.py", "Threads or processes: a masked step on every core, or one core "
                   "per process", "The machine's masked injection steps per second with one process on every core, "
                   "one process on one core, and one one-thread process per core at once (each process builds the "
                   "same model, masks and batch; they start stepping together).", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
