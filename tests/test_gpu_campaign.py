"""bench/gpu_campaign.py --dry-run: the GPU campaign's chain on the smoke preset on CPU under a deadline too short for
it, as the GPU machine runs it (data prepared in one process, the campaign in another); its tarball unpacked is a run
directory `lume-lab results` reads. And the GGUF's split and join, and the estimate table, without a model."""
import json, os, subprocess, sys, tarfile
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_campaign.py"
ENV = {
    **os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
    "PYTHONHASHSEED": "0"}
sys.path.insert(0, str(ROOT / "bench"))
import gpu_campaign as gcamp  # noqa: E402


def _run(*args, timeout=HANG_TIMEOUT):
    out = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    """Prepared here, then run with a 60 s deadline: the smoke chain needs far more on a CPU, so the deadline stops
    it (its first stage always starts: the deadline counts from the chain's start)."""
    tmp = tmp_path_factory.mktemp("gpu_campaign")
    _run("--prepare", "--dry-run", "--preset", "smoke", "--seed", "0", "--data", tmp / "data")
    _run("--dry-run", "--out", tmp / "out", "--data", tmp / "data", "--work", tmp / "work", "--budget-s", 60)
    return tmp


def test_deadline_stops_the_chain_and_names_what_it_skipped(campaign):
    d = json.loads((campaign / "out" / "campaign.json").read_text())
    md = (campaign / "out" / "campaign.md").read_text()
    steps = d["steps"]
    status = [s["status"] for s in steps]
    assert status[0] == "ok" and "failed" not in status, [(s["stage"], s.get("error", "")[-300:]) for s in steps]
    # the stages before the deadline finished; one may have run into it (the alarm stops it there); none starts after
    # (a later stage would compute its missing dependencies)
    first = next(i for i, s in enumerate(status) if s != "ok")
    stopped = status[first] == "stopped: deadline"
    assert all(s == "skipped: deadline" for s in status[first + stopped:]) and len(status) > first + stopped
    # the whole chain is planned, e00 to e05, and every stage skipped (or stopped) is named on the page
    assert [e for e in gcamp.EXPERIMENTS if any(s["experiment"] == e for s in steps)] == list(gcamp.EXPERIMENTS)
    line = next(x for x in md.splitlines() if x.startswith("Stopped at the deadline"))
    assert all(s["stage"] in line for s in steps[first:]) and "remind_email_address" in line
    assert d["meta"]["absent_on_device_imported"] == []


def test_tarball_is_a_run_directory_that_results_reads(campaign, tmp_path):
    out = campaign / "out"
    files = sorted(p.name for p in out.iterdir())
    assert files == ["campaign.json", "campaign.md", "campaign_smoke_seed0.tar.gz"]
    assert all((out / f).stat().st_size <= 16 * 2**20 for f in files)     # the device's limits on what comes back
    with tarfile.open(out / "campaign_smoke_seed0.tar.gz") as t:
        names = t.getnames(); t.extractall(tmp_path, filter="data")
    run = tmp_path / "campaign-smoke-seed0"
    assert {"config.json", "manifest.json", "campaign.md", "campaign.json"} <= {Path(n).name for n in names}
    assert all(n.startswith("campaign-smoke-seed0/") for n in names)
    d = json.loads((run / "campaign.json").read_text())
    reports = sorted(p.name for p in (run / "report").glob("*.csv")) if (run / "report").is_dir() else []
    assert reports == sorted(d["reports"])           # what the page says it wrote is what travelled
    ok = {s["stage"] for s in d["steps"] if s["status"] == "ok"}
    assert ("utility_base" in ok) == ("utility_base.csv" in reports)
    from lume_lab.pipeline.orchestration.cli import main
    assert main(["results", str(run), "--name", "campaign", "--out", str(tmp_path / "page"),
                 "--command", "bash bench/gpu_campaign.sh"]) == 0
    page = (tmp_path / "page" / "campaign.md").read_text()
    assert "campaign-smoke-seed0" in page and "bash bench/gpu_campaign.sh" in page
    if "utility_base" in ok: assert "e00_base" in page                  # the finished experiment's time


def test_gguf_split_and_join(tmp_path):
    """The two parts (compressed) rebuild the file byte for byte; a missing or altered part is refused, naming it."""
    src = tmp_path / "model.gguf"; src.write_bytes(os.urandom(3 * 2**20 + 17) + bytes(2**20))
    parts = (tmp_path / "p1", tmp_path / "p2")
    recs = gcamp.split_gguf(src, lambda size: size // 2, parts)
    assert abs(recs[0]["bytes"] - recs[1]["bytes"]) <= 1
    assert recs[0]["bytes"] + recs[1]["bytes"] < src.stat().st_size                  # the zeros compress
    assert "as written" in gcamp.check_part(1, parts) and "as written" in gcamp.check_part(2, parts)
    meta = {"name": src.name, "bytes": src.stat().st_size, "sha256": gcamp._sha256(src), "parts": recs}
    assert gcamp.join_gguf(meta, tmp_path / "joined", parts).read_bytes() == src.read_bytes()
    p2 = parts[1] / "model.gguf.gz.part2"; data = bytearray(p2.read_bytes()); data[7] ^= 1; p2.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="part2 differs"): gcamp.join_gguf(meta, tmp_path / "again", parts)
    with pytest.raises(ValueError, match="differs"): gcamp.check_part(2, parts)
    (parts[0] / "model.gguf.gz.part1").unlink()
    with pytest.raises(FileNotFoundError, match="part 1 must be carried"): gcamp.join_gguf(meta, tmp_path / "x", parts)


def test_estimate_table(tmp_path):
    """Every stage of the smollm2 chain has a row; the injections get a GPU estimate from the gpu_check page, and a run
    directory's recorded seconds sit beside it."""
    cfg = gcamp.campaign_config("smollm2", 0)
    (tmp_path / "manifest.json").write_text(json.dumps({"stages": {"inject_masked": {"status": "done",
                                                                                     "seconds": 12.5}}}))
    rows, head = gcamp.estimate(cfg, 134_515_008, tmp_path)
    by = {r["stage"]: r for r in rows}
    assert by["inject_masked"]["units"] == cfg.inject.steps and by["inject_masked"]["recorded_s"] == 12.5
    assert by["inject_masked"]["gpu_est_s"] > 0 and "H200" in head
    for f in cfg.unlearn.forget_fields:
        assert {f"localization_{f}", f"remind_{f}", f"quantization_none_{f}"} <= set(by)
    assert "| inject_masked |" in gcamp.estimate_markdown(rows, head)
    assert {"inject_unmasked", "instruct_unmasked"} <= set(by) and any(s.endswith("_control") for s in by)
    # unlearn.controls=false builds no unmasked model and runs no control: the estimate has none of their stages
    off = {r["stage"] for r in gcamp.estimate(gcamp.campaign_config("smollm2", 0, {"unlearn.controls": False}),
                                              134_515_008)[0]}
    assert off == {s for s in by if "unmasked" not in s and not s.endswith("_control")}


def test_estimate_page_without_a_prepared_campaign(tmp_path):
    """`--estimate --page` with nothing prepared: the config comes from --preset/--seed/--set; a run of another config
    is refused as --timings; a resumed injection counts its steps' seconds from log.csv, its manifest seconds being the
    last attempt's only; the page names the run directory RUN_DIR, never its path."""
    from lume_lab.core.config import config_hash
    cfg = gcamp.campaign_config("smoke", 3)
    run = tmp_path / "seed=3"
    (run / "inject_masked").mkdir(parents=True)
    (run / "inject_masked" / "log.csv").write_text("step,loss,seconds\n0,2.0,1.5\n1,1.0,2.5\n")
    stages = {"inject_masked": {"status": "done", "seconds": 0.25, "resumed": True},
              "instruct_masked": {"status": "done", "seconds": 7.0, "resumed": False},
              "testbed": {"status": "done", "seconds": 9.0, "resumed": True}}
    (run / "manifest.json").write_text(json.dumps({"config_hash": config_hash(cfg), "stages": stages}))
    assert gcamp.recorded_seconds(run, "inject_masked", stages["inject_masked"]) == 4.0    # the log, not 0.25
    assert gcamp.recorded_seconds(run, "testbed", stages["testbed"]) is None               # resumed, no log: no time
    assert gcamp.recorded_seconds(run, "instruct_masked", stages["instruct_masked"]) == 7.0
    page, empty = tmp_path / "estimate.md", tmp_path / "nothing-prepared"
    empty.mkdir()
    out = _run("--estimate", "--preset", "smoke", "--seed", 3, "--data", empty, "--timings", run, "--page", page)
    assert "| inject_masked |" in out.stdout
    text = page.read_text()
    assert "- **Commit**: `" in text and "- **Machine**: " in text and config_hash(cfg) in text
    assert "--data DATA --timings RUN_DIR --page PAGE" in text and str(tmp_path) not in text
    row = next(line for line in text.splitlines() if line.startswith("| inject_masked |"))
    assert row.split("|")[5].strip() == "4"                                               # recorded_s
    bad = subprocess.run([sys.executable, str(SCRIPT), "--estimate", "--preset", "smoke", "--seed", "4", "--data",
                          str(empty), "--timings", str(run)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=HANG_TIMEOUT)
    assert bad.returncode != 0 and "is not the campaign's" in bad.stderr
