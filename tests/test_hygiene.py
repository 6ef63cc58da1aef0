"""No file of the repository names a path of the machine it was written on: no work folder, scratch folder
or home directory. System paths that code uses on purpose (`/tmp`, `/proc`) are fine.

The patterns are assembled from pieces, so this file does not contain what it looks for and is scanned like every
other file (no exclusion list to keep in sync)."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_S = "/"
# a path segment starts the string or follows a separator, a quote, a space or a bracket, never a word character: so the
# notebook name `_scratch.ipynb` and a variable named `scratch` pass, a folder of that name does not (cases below)
_SEG = r"(?<![\w.~-])"
MACHINE_PATHS = {
    "work folder": re.compile(_SEG + _S + "work" + _S),
    "home directory": re.compile(_SEG + _S + "home" + _S + r"\w"),
    "root's home": re.compile(_SEG + _S + "root" + _S),
    "macOS home": re.compile(_SEG + _S + "Users" + _S + r"\w"),
    "Windows home": re.compile(r"\b[A-Za-z]:[\\/]+" + "Users" + r"[\\/]+\w"),
    "scratch folder": re.compile(_SEG + "scratch" + _S),
}


def machine_paths(text: str) -> list[tuple[int, str, str]]:
    "(line number, kind, line) of every line of `text` that names a machine path."
    return [(i, kind, line.strip()) for i, line in enumerate(text.splitlines(), 1)
            for kind, pat in MACHINE_PATHS.items() if pat.search(line)]


def repo_text_files() -> list[tuple[Path, str]]:
    """(path, text) of every file git tracks (committed or staged) that reads as UTF-8 text, each read once. Untracked
    files are not the repository's: a `make test > test.log` in the root must not fail the next run (a new file is
    scanned once it is added)."""
    names = subprocess.run(["git", "ls-files", "--cached", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    out = []
    for n in filter(None, names):
        p = ROOT / n
        try: b = p.read_bytes()
        # deleted meanwhile (another test's probe module), or a submodule
        except (FileNotFoundError, IsADirectoryError): continue
        if b"\0" in b: continue                                   # binary (a PNG, a safetensors file)
        try: out.append((p, b.decode("utf-8")))
        except UnicodeDecodeError: continue
    return out


@pytest.mark.parametrize("line", [
    "see " + _S + "work" + _S + "main" + _S + "README.md",
    "`" + _S + "work" + _S + "scratch" + _S + "ae" + _S + "probe.py`",
    "probe: scratch" + _S + "s11" + _S + "probe.py",
    "cd " + _S + "home" + _S + "alice" + _S + "lume",
    "open('" + _S + "root" + _S + ".cache')",
    "cache in " + _S + "Users" + _S + "bob" + _S + "lume",
    "C:\\" + "Users" + "\\bob\\lume",
    "\"runs_root\": \"" + _S + "work" + _S + "runs\"",
])
def test_a_machine_path_is_found(line):
    assert machine_paths("ok\n" + line) and machine_paths("ok\n" + line)[0][0] == 2


@pytest.mark.parametrize("line", [
    "tmp = Path(\"/tmp/lume-no-such-root\")",
    "open(\"/proc/self/status\")",
    "for f in [\"data/_scratch.ipynb\"]: pass",
    "scratch = Path(tempfile.mkdtemp()); fn(scratch)",
    "a from-scratch tiny model",
    "runs/<id>/report/ and nbs/experiments/",
    "https://github.com/org/homework/",
])
def test_system_paths_and_code_names_pass(line):
    assert machine_paths(line) == []


def test_the_repository_is_scanned():
    files = {p.relative_to(ROOT).as_posix() for p, _ in repo_text_files()}
    for f in ("README.md", "Makefile", "pyproject.toml", "tests/test_hygiene.py", "nbs/experiments/e02_inject.ipynb"):
        assert f in files, f


def test_untracked_files_are_not_scanned():
    probe = ROOT / "test-hygiene-untracked.log"     # as `make test > test.log` leaves one: a log quoting machine paths
    probe.write_text("FAILED " + _S + "work" + _S + "main" + _S + "tests" + _S + "test_x.py\n")
    try:
        assert machine_paths(probe.read_text())                                   # the probe does name a machine path
        assert probe not in {p for p, _ in repo_text_files()}
    finally: probe.unlink()


def test_no_file_names_a_machine_path():
    hits = [f"{p.relative_to(ROOT)}:{i}: {kind}: {line[:160]}" for p, text in repo_text_files()
            for i, kind, line in machine_paths(text)]
    assert not hits, "machine paths (name a path inside the repository, or none):\n" + "\n".join(hits)


# the project's own issue numbers mean nothing to a reader of the repository: a ticket's number says why code is as
# it is only to someone with the tracker open. Another project's issues keep their owner ("open-unlearning's
# issues #187 and #94": plural, and named), so the pattern is the singular word followed by a number.
ISSUE_REF = re.compile(r"\b[Ii]" + "ssue" + r" #?\d+\b")


@pytest.mark.parametrize("line,found", [
    ("> Is" + "sue #40's stress tests as cached stages", True),
    ("(is" + "sue 13: every table states its n)", True),
    ("open-unlearning's is" + "sues #187 and #94", False),
    ("a known is" + "sue with padding", False),
])
def test_an_issue_number_is_found(line, found):
    assert bool(ISSUE_REF.search(line)) == found


def test_no_file_names_an_issue_number():
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:160]}" for p, text in repo_text_files()
            for i, line in enumerate(text.splitlines(), 1) if ISSUE_REF.search(line)]
    assert not hits, ("internal issue numbers (say what the code does and why, not which ticket asked):\n"
                      + "\n".join(hits))
