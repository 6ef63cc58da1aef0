"""Peak resident memory and wall time of the test suite, one notebook (or pytest file) per process.

`make test` runs each library notebook in a process of its own (`nbdev-test <nb> --flags slow --n-workers 0`, two at a
time) and the pytest files in two pytest-xdist workers (`--dist loadfile`: a worker runs whole files one after another).
This script runs each notebook alone in that way, and with `--tests` each pytest file alone (`pytest -q <file>`), ONE AT
A TIME, with the environment of `make test` (one BLAS thread), and prints a table sorted by peak resident memory, the
goal (every test process <= 6 GB) marked.

The peak of one run is `ru_maxrss` from `os.wait4` on that process: the largest resident set of the process or of any
descendant it waited for (a papermill kernel, a torchrun worker). A process whose tree passes `--kill-gb` is stopped and
reported as over that limit (the machines are shared; an unbounded run could take the others down with it).

Every measured process is appended to `--record` (JSON lines: the row, with the command, commit, start time and machine
of its run); `--out` renders the page from the record, one section for the notebooks and one for the pytest files, each
row from the latest run that measured it, so a rerun of a few notebooks (`--only`) updates just their rows.

    .venv/bin/python bench/suite_memory.py [--tests] [--no-nbs] [--only nbs/x/NN_y.ipynb tests/test_x.py ...]
        [--record docs/results/suite-memory.jsonl --out docs/results/suite-memory.md]
    .venv/bin/python bench/suite_memory.py --render --record docs/results/suite-memory.jsonl
        --out docs/results/suite-memory.md

Wall times are from a shared 2-core machine: read them as a rough ranking, not a benchmark.
"""
import argparse, datetime, json, os, re, signal, subprocess, sys, time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SKIP_FOLDER = re.compile(r"^([_.]|experiments$)")   # the Makefile's NB_FILES (nbdev-test's --skip-folder-re)
GOAL_GB = 6.0
SECTIONS = {"notebook": "Notebooks (`make test`: one process per notebook)",
            "pytest": "pytest files (`make test`: two xdist workers; a file's peak is a lower bound for its worker's)"}


def library_notebooks(nbs: Path = ROOT / "nbs") -> list[Path]:
    "The notebooks `make test` runs: none in a folder matching SKIP_FOLDER, none whose name starts with _ or ."
    out = []
    for p in sorted(nbs.rglob("*.ipynb")):
        rel = p.relative_to(nbs)
        if any(SKIP_FOLDER.search(d) for d in rel.parts[:-1]) or p.name.startswith(("_", ".")): continue
        out.append(p)
    return out


def test_env(threads: int = 1) -> dict:
    "The environment of `make test` (TEST_ENV in the Makefile), with this checkout first on the path."
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
                PYTHONHASHSEED="0", PYTHONPATH=str(ROOT))


def _tree_rss(proc: psutil.Process) -> int:
    "The largest resident set (bytes) of one process in `proc`'s tree, `proc` included."
    best = 0
    try: procs = [proc, *proc.children(recursive=True)]
    except psutil.Error: return 0
    for p in procs:
        try: best = max(best, p.memory_info().rss)
        except psutil.Error: pass
    return best


def measure(cmd: list[str], cwd: Path, env: dict, kill_gb: float, poll_s: float = 0.5) -> dict:
    """Run `cmd` to its end.
    Its wall seconds, peak RSS (MB, ru_maxrss of it and its waited-for descendants), exit code, log."""
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    ps, killed, log = psutil.Process(p.pid), False, []
    os.set_blocking(p.stdout.fileno(), False)
    while True:
        chunk = p.stdout.read()
        if chunk: log.append(chunk)
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid: break
        if not killed and _tree_rss(ps) > kill_gb * 2**30:
            killed = True
            os.killpg(p.pid, signal.SIGKILL)
        time.sleep(poll_s)
    rest = p.stdout.read()
    if rest: log.append(rest)
    p.stdout.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    return dict(
        wall_s=round(time.monotonic() - t0, 1), peak_mb=round(ru.ru_maxrss / 1024, 1), rc=p.returncode, killed=killed,
        log=b"".join(log).decode(errors="replace"))


def nb_cmd(nb: Path, flags: str = "slow") -> list[str]:
    return [str(BIN / "nbdev-test"), str(nb), "--flags", flags, "--n-workers", "0"]


def pytest_cmd(f: Path) -> list[str]:
    return [str(BIN / "pytest"), "-q", "-p", "no:cacheprovider", str(f)]


def status(r: dict) -> str:
    if r["killed"]: return f"stopped at > {r['kill_gb']:g} GB"
    return "pass" if r["rc"] == 0 else f"FAIL (exit {r['rc']})"


def over_goal(r: dict) -> bool: return r["killed"] or r["peak_mb"] > GOAL_GB * 1024


def table(rows: list[dict]) -> str:
    "Markdown table, largest peak first; the goal column says whether the process stays within GOAL_GB."
    lines = [f"| process | wall s | peak RSS MB | ≤ {GOAL_GB:g} GB | result |", "|:---|---:|---:|:---:|:---|"]
    for r in sorted(rows, key=lambda r: (-r["peak_mb"], r["name"])):
        lines.append(f"| `{r['name']}` | {r['wall_s']:.0f} | {r['peak_mb']:,.0f} | "
                     f"{'**NO**' if over_goal(r) else 'yes'} | {status(r)} |")
    return "\n".join(lines)


def latest(records: list[dict]) -> list[dict]:
    "One row per process name: the latest measured (the record is append-only)."
    return list({r["name"]: r for r in records}.values())


def section(kind: str, rows: list[dict]) -> str:
    """A section of the page:
    the runs its rows come from (command, commit, date, machine), the processes over the goal, the table."""
    runs = list(dict.fromkeys((r["command"], r["commit"], r["machine"]) for r in rows))
    out = [f"## {SECTIONS[kind]}", ""]
    for cmd, commit, machine in runs:
        days = sorted(
            {r["started"][:10] for r in rows if (r["command"], r["commit"], r["machine"]) == (cmd, commit, machine)}
        )
        n = sum((r["command"], r["commit"], r["machine"]) == (cmd, commit, machine) for r in rows)
        out += [f"- **Command**: `{cmd}` ({n} process{'es' if n > 1 else ''})", f"  - **Commit**: `{commit}`",
                f"  - **Date**: {', '.join(days)}", f"  - **Machine**: {machine}"]
    over = [f"`{r['name']}`" for r in rows if over_goal(r)]
    every = library_notebooks() if kind == "notebook" else sorted((ROOT / "tests").glob("test_*.py"))
    missing = sorted({str(p.relative_to(ROOT)) for p in every} - {r["name"] for r in rows})
    if missing: out.append(f"- **Not measured** (no row yet): {', '.join(f'`{n}`' for n in missing)}")
    peak = max(rows, key=lambda r: r["peak_mb"])
    out += [f"- **Largest**: `{peak['name']}`, {peak['peak_mb']:,.0f} MB; over {GOAL_GB:g} GB: "
            f"{', '.join(over) or 'none'}", "",
            table(rows), ""]
    return "\n".join(out)


PAGE_HEAD = f"""# Suite memory: peak resident memory per test process

Generated by `bench/suite_memory.py` from `suite-memory.jsonl` (every measured process, with its run's command, commit,
date and machine); regenerate it, do not edit it.

Each library notebook runs alone, `nbdev-test <nb> --flags slow --n-workers 0`, as `make test` runs it; each pytest
file alone, `pytest -q <file>`; one process at a time, with the environment of `make test` (one BLAS thread). Peak RSS:
`ru_maxrss` of the process, or of its largest waited-for descendant (a papermill kernel, a torchrun worker). Goal: every
test process ≤ {GOAL_GB:g} GB. The machine is shared with other jobs: read the wall times as a rough ranking.
"""


def render(records: list[dict]) -> str:
    rows = latest(records)
    return PAGE_HEAD + "".join(
        "\n" + section(k, [r for r in rows if r["kind"] == k]) for k in SECTIONS if any(r["kind"] == k for r in rows)
    )


def provenance() -> dict:
    """This checkout's commit and this machine, asked of `lume_lab.core.store` in a child process: importing it here (it
    imports torch) would make this process ~200 MB, and a child's `ru_maxrss` starts from the size of the process it
    forks."""
    code = ("import json, psutil; from lume_lab.core.store import git_commit, machine_info; print(json.dumps(dict("
            "commit=git_commit(), machine=f'{machine_info()}, {psutil.virtual_memory().total / 2**30:.0f} GiB "
            "memory')))")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=test_env(), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def read_record(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="notebooks or pytest files to run (default: every library "
                                                            "notebook)")
    ap.add_argument("--tests", action="store_true", help="also run each tests/test_*.py file alone")
    ap.add_argument("--no-nbs", action="store_true", help="skip the notebooks (with --tests: only the pytest files)")
    ap.add_argument("--kill-gb", type=float, default=12.0, help="stop a process tree whose largest process passes this")
    ap.add_argument("--record", default=None, help="JSON lines file every measured process is appended to")
    ap.add_argument("--out", default=None, help="markdown page rendered from --record (after every process)")
    ap.add_argument("--render", action="store_true", help="only render --out from --record; run nothing")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.out and not args.record: ap.error("--out renders the page from --record: give both")
    record = Path(args.record) if args.record else None
    if args.render:
        Path(args.out).write_text(render(read_record(record)))
        return 0
    if args.only: items = [ROOT / p for p in args.only]
    else:
        items = [] if args.no_nbs else library_notebooks()
        if args.tests: items += sorted((ROOT / "tests").glob("test_*.py"))
    run = dict(command=" ".join(["bench/suite_memory.py", *argv]), **provenance())
    env, rows = test_env(), []
    for i, it in enumerate(items, 1):
        kind = "notebook" if it.suffix == ".ipynb" else "pytest"
        started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
        r = measure(nb_cmd(it) if kind == "notebook" else pytest_cmd(it), ROOT, env, args.kill_gb)
        log = r.pop("log")
        r = dict(name=str(it.relative_to(ROOT)), kind=kind, **r, kill_gb=args.kill_gb, started=started, **run)
        rows.append(r)
        print(f"[{i}/{len(items)}] {r['name']}: {r['wall_s']:.0f} s, {r['peak_mb']:,.0f} MB, {status(r)}", flush=True)
        if r["rc"] != 0: print(log[-3000:], flush=True)
        # cell_timing_min
        for l in re.findall(r"^\S+\.ipynb:\S+: [\d.]+s$", log, re.M): print("    slow cell", l, flush=True)
        if record:
            with record.open("a") as f: f.write(json.dumps(r) + "\n")
            if args.out: Path(args.out).write_text(render(read_record(record)))
    for k in SECTIONS:
        if any(r["kind"] == k for r in rows): print("\n" + table([r for r in rows if r["kind"] == k]))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__": sys.exit(main())
