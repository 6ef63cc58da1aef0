import os
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("IN_TEST", "1")

# `lume-lab run` and `sweep` refuse a tree whose code has uncommitted changes. The suite runs from clean clones, where
# this changes nothing; run from a developer's tree with edits, its runs test what the code does, not where it came from
# (the refusal itself is tested with a stand-in for the tree).
from lume_lab.core.store import dirty_files
if dirty_files(): os.environ.setdefault("LUME_LAB_ALLOW_DIRTY", "1")

# A subprocess a test starts gets this long before it counts as hung. It guards against a hang, never against slowness:
# on a 2-core machine shared with other jobs, a GPU-check dry run that takes 46 s alone took 257 s, and a 300 s limit
# failed a test that would have passed. Speed goals live in bench/, not in tests.
HANG_TIMEOUT = 3600


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tf4():
    """transformers 4.51.3 (what open-unlearning pins) in its side folder, `make tf4`'s `.cache/tf4`, built if missing.
    Skipped, loudly, only when pip cannot reach the package index."""
    import warnings
    from pathlib import Path
    from lume_lab.pipeline.orchestration.export import PipUnreachable, tf4_env
    try: return tf4_env(Path(__file__).resolve().parents[1] / ".cache" / "tf4")
    except PipUnreachable as e:
        msg = f"NOT TESTED: the export under transformers 4.51.3; pip cannot reach the package index ({e})"
        warnings.warn(msg)
        pytest.skip(msg)


# `make test` runs two xdist workers, each taking a whole file at a time (`--dist loadfile`). By default xdist hands
# out files with the most tests first, so a file with one long test (the end-to-end smoke run) is handed out last and
# runs alone while the other worker idles. With `--no-loadscope-reorder` files go out in collection order: these, the
# longest (the `--durations` list at the end of `make test`), first, so the short files fill in beside them.
LONGEST_FIRST = ("test_e2e.py", "test_smollm2.py", "test_launch.py", "test_pipeline.py", "test_export_score.py",
                 "test_sweep.py", "test_report.py", "test_gpu_campaign.py", "test_gpu_check.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))       # stable: a file's tests keep their order


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Seconds per test file (setup, call and teardown of its tests, summed), the longest first, printed just above
    pytest's last line so that the tail of a CI log shows where the suite's time goes; LONGEST_FIRST follows it."""
    from collections import Counter
    per = Counter()
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "nodeid", "") and isinstance(getattr(r, "duration", None), float):
                per[r.nodeid.split("::")[0]] += r.duration
    if not per: return
    terminalreporter.write_sep("=", "seconds per test file (its tests' setup + call + teardown)")
    for path, s in per.most_common(10): terminalreporter.write_line(f"{s:8.0f}  {path}")
    terminalreporter.write_line(f"{sum(per.values()):8.0f}  all {len(per)} files, worker seconds")
