"""The command line answers at once and ends cleanly. `lume-lab --help`, `presets`, `status` and `config` import no
torch, transformers or papermill: each runs under `python -X importtime` and the test reads the module names it printed
(never the times: these machines are noisy). A reader that closes the pipe early ends the command quietly, and a
mistyped run id is answered with the runs there are."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "data" / "mini_run"   # the config and manifest of `make run`'s mini run (see test_report.py)
HEAVY = ("torch", "transformers", "papermill")
# the console script's body
ENTRY = "import sys; from lume_lab.pipeline.orchestration.cli import main; sys.exit(main())"


def lume_lab(*args: str, importtime: bool = False, **kw) -> subprocess.CompletedProcess:
    "`lume-lab ARGS` in a fresh interpreter, on this checkout's code (the working folder comes first on `sys.path`)."
    flags = ["-X", "importtime"] if importtime else []
    io = kw or {"capture_output": True}                       # or the caller's stdout/stderr
    return subprocess.run([sys.executable, *flags, "-c", ENTRY, *args], cwd=ROOT, text=True, timeout=HANG_TIMEOUT, **io)


def imported_modules(importtime_log: str) -> set[str]:
    "Module names from `-X importtime` lines (`import time: <self us> | <cumulative us> | <indented name>`)."
    out = set()
    for line in importtime_log.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2: continue
        self_us, _, name = line[len("import time:"):].split("|")
        if self_us.strip().isdigit(): out.add(name.strip())   # the header line reads "self [us]"
    return out


def test_importtime_lines_are_parsed():
    log = ("import time: self [us] | cumulative | imported package\n"
           "import time:       120 |        120 |     torch._C\n"
           "import time:      3000 |       3120 |   torch\n"
           "some other stderr line | with | bars\n")
    assert imported_modules(log) == {"torch._C", "torch"}


@pytest.fixture
def runs(tmp_path) -> Path:
    "A runs root holding a copy of the committed mini run (`status` reads it; nothing writes into tests/data)."
    shutil.copytree(MINI, tmp_path / "runs" / "mini_run")
    return tmp_path / "runs"


@pytest.mark.parametrize("cmd", ["--help", "presets", "status", "config"])
def test_quick_commands_import_no_torch_transformers_or_papermill(cmd, runs):
    args = {"status": ["status", "mini_run", "--runs-root", str(runs)], "config": ["config", "--preset", "mini"]}
    r = lume_lab(*args.get(cmd, [cmd]), importtime=True)
    assert r.returncode == 0, r.stderr[-2000:]
    mods = imported_modules(r.stderr)
    assert "lume_lab.core.store" in mods and "argparse" in mods     # the log was read: the CLI's own imports are in it
    heavy = sorted({m.split(".")[0] for m in mods} & set(HEAVY))
    assert not heavy, f"`lume-lab {cmd}` imports {', '.join(heavy)} (python -X importtime shows which module asks)"


def test_config_resolves_every_method_from_the_declarations_alone():
    """`lume-lab config` resolves each method's hyperparameters from `lume_lab.unlearn.specs`: no method's own
    module (its training code) is imported, and the resolved methods are all there."""
    from lume_lab.pipeline.orchestration.config import config_methods
    from lume_lab.core.config import make_config
    # the registry loads the declarations by name (importlib), which -X importtime does not list: read sys.modules
    spy = ("import atexit, sys; atexit.register(lambda: print('MODULES', *sorted(m for m in sys.modules "
           "if m.startswith('lume_lab.unlearn')), file=sys.stderr)); " + ENTRY)
    r = subprocess.run([sys.executable, "-c", spy, "config", "--preset", "mini", "--all"], cwd=ROOT, text=True,
                       capture_output=True, timeout=HANG_TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    mods = set(next(l for l in r.stderr.splitlines() if l.startswith("MODULES ")).split()[1:])
    assert "lume_lab.unlearn.specs" in mods
    methods = config_methods(make_config("mini"))
    assert not [m for m in methods if f"lume_lab.unlearn.{m}" in mods]
    assert all(f"unlearn.hparams.{m}." in r.stdout for m in methods)


def test_status_prints_the_stages_of_the_fixture_run(runs):
    r = lume_lab("status", "mini_run", "--runs-root", str(runs))
    assert r.returncode == 0, r.stderr[-2000:]
    stages = json.loads((MINI / "manifest.json").read_text())["stages"]
    rows = r.stdout.splitlines()
    assert rows[0].split()[:2] == ["stage", "status"]
    assert [row.split()[0] for row in rows[1:]] == list(stages)   # one row per stage, in the manifest's order


def test_presets_lists_every_preset():
    from lume_lab.core.config import PRESETS
    r = lume_lab("presets")
    assert r.returncode == 0, r.stderr[-2000:]
    # one line per preset with its description, then the sizes
    described, table = r.stdout.split("\n\n")[:2]
    assert [row.split()[0] for row in described.splitlines()] == list(PRESETS)
    assert [row.split()[0] for row in table.splitlines()[1:]] == list(PRESETS)


@pytest.mark.parametrize("cmd", ["--help", "status"])
def test_a_closed_pipe_ends_quietly(cmd, runs):
    "`lume-lab status RUN | head -1`: here the pipe is closed before the first write, so every write meets it."
    read, write = os.pipe()
    os.close(read)
    try:
        r = lume_lab(
            *(["status", "mini_run", "--runs-root", str(runs)] if cmd == "status" else [cmd]),
            stdout=write,
            stderr=subprocess.PIPE,
        )
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (0, "")


def test_an_unknown_run_is_answered_with_the_runs_there_are(runs, tmp_path):
    shutil.copytree(MINI, runs / "other_run")
    r = lume_lab("status", "nosuchrun", "--runs-root", str(runs))
    assert r.returncode == 2 and "no run 'nosuchrun'" in r.stderr
    assert "runs there: mini_run, other_run" in r.stderr
    r = lume_lab("status", "nosuchrun", "--runs-root", str(tmp_path / "empty"))
    assert r.returncode == 2 and "there are no runs there" in r.stderr
