"""Sweeps through submitit:
a smoke sweep killed after its first point and resumed, the Slurm executor it would use, bad specs, --seeds."""
import json, os, subprocess, sys, time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from lume_lab.core.config import ConfigError, make_config
from lume_lab.core.store import open_run
from lume_lab.pipeline.orchestration.config import resolve_config
from lume_lab.pipeline.orchestration.cli import main
from lume_lab.pipeline.orchestration import sweep as S

REPO = Path(__file__).resolve().parents[1]
LUME = Path(sys.executable).with_name("lume-lab")
FAST = {"pretrain.steps": 24, "pretrain.checkpoint_every": 8}      # as tests/test_pipeline.py: small but real
DROP = object()                                                     # _write_spec(key=DROP): leave the key out


def _write_spec(path: Path, **kw) -> Path:
    spec = {
        "name": "smoke_sweep", "preset": "smoke", "set": FAST, "grid": {"pretrain.lr": [0.003, 0.001]}, "seeds": [0, 1],
        "only": ["e00"], "collect": ["report/utility_base.csv"], "plot": {"where": {"metric": "mc_acc"}},
        "executor": {"kind": "local", "workers": 1}, **kw}
    spec = {k: v for k, v in spec.items() if v is not DROP}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the sweep driver and everything under it (job controllers, jobs, kernels).
    All are frozen first, so none can start another."""
    procs, seen = [psutil.Process(proc.pid)], set()
    # SIGSTOP down the tree until no new process appears
    while {p.pid for p in procs} != seen:
        seen = {p.pid for p in procs}
        for p in procs:
            try: p.suspend()
            except psutil.NoSuchProcess: pass
        procs = [procs[0]] + procs[0].children(recursive=True)
    for p in procs:
        try: p.kill()
        except psutil.NoSuchProcess: pass
    psutil.wait_procs(procs, timeout=60)


def test_smoke_sweep_killed_after_first_point_resumes_without_redoing_it(tmp_path, capsys):
    """2 points × 2 seeds through submitit's local executor:
    killed once a point is finished, resumed, aggregated into sweep.csv."""
    spec, root = _write_spec(tmp_path / "spec.yaml"), tmp_path / "runs"
    sweep = S.load_sweep(spec, root)
    names = [p.name for p in sweep.points]
    assert names == [
        "pretrain.lr=0.003,seed=0", "pretrain.lr=0.003,seed=1", "pretrain.lr=0.001,seed=0", "pretrain.lr=0.001,seed=1"]
    proc = subprocess.Popen([str(LUME), "sweep", str(spec), "--runs-root", str(root)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline, finished = time.time() + 600, []
    try:
        while time.time() < deadline and not finished:
            assert proc.poll() is None, "the sweep ended before it could be killed:\n" + proc.stdout.read()
            finished = [p for p in sweep.points if S.point_done(sweep, p)]
            time.sleep(0.2)
    finally: _kill_tree(proc)
    assert finished, "no point finished within 10 minutes"
    assert len(finished) < len(names)                                   # killed mid-sweep
    kept = {p.name: (sweep.dir / p.name / "manifest.json").read_bytes() for p in finished}
    assert not (sweep.dir / "points.csv").exists()                      # the killed driver never got to its summary
    # `--collect` reads a sweep mid-way and runs nothing: the finished points 'done', their rows in sweep.csv, the
    # others 'not run' (the killed driver's job is gone)
    assert main(["sweep", str(spec), "--runs-root", str(root), "--collect"]) == 0
    got = pd.read_csv(sweep.dir / "points.csv").set_index("point").status.to_dict()
    assert got == {n: "done" if n in kept else "not run" for n in names}, got
    assert sorted(pd.read_csv(sweep.dir / "sweep.csv").point.unique()) == sorted(kept)
    assert all((sweep.dir / n / "manifest.json").read_bytes() == b for n, b in kept.items())

    t0 = time.time()
    assert main(["sweep", str(spec), "--runs-root", str(root), "--workers", "2"]) == 0
    out = capsys.readouterr().out
    print(f"resume: {time.time() - t0:.0f} s for {len(names) - len(finished)} point(s)")
    status = pd.read_csv(sweep.dir / "points.csv").set_index("point").status.to_dict()
    assert status == {n: "skipped" if n in kept else "done" for n in names}
    assert f"{len(names) - len(finished)} done, {len(finished)} skipped" in out
    for n, before in kept.items(): assert (sweep.dir / n / "manifest.json").read_bytes() == before, f"{n} was redone"
    # every point is a normal, finished run of its own config
    for p in sweep.points:
        cfg = json.loads((sweep.dir / p.name / "config.json").read_text())
        assert (cfg["pretrain"]["lr"], cfg["seed"], cfg["pretrain"]["steps"]) == (
            p.overrides["pretrain.lr"],
            p.seed,
            24,
        )
        man = json.loads((sweep.dir / p.name / "manifest.json").read_text())
        assert man["experiments"]["e00_base"]["status"] == "done" and all(
            v["status"] == "done" for v in man["stages"].values()
        )
    # points share what their configs share: the second seed-0 point adopted the first one's world and tokenizer
    # (hard links, `reused_from`), and trained its own base model (another pretrain.lr)
    first, later = sweep.dir / names[0], json.loads((sweep.dir / names[2] / "manifest.json").read_text())["stages"]
    assert names[0] in kept
    assert [later[s].get("reused_from") for s in ("world", "tokenizer", "base")] == [str(first), str(first), None]
    assert all(
        os.path.samefile(f, first / f.relative_to(sweep.dir / names[2]))
        for f in (sweep.dir / names[2] / "world").rglob("*")
        if f.is_file()
    )
    agg = pd.read_csv(sweep.dir / "sweep.csv")
    assert list(agg.columns[:4]) == ["point", "pretrain.lr", "seed", "source"] and set(agg.source) == {
        "report/utility_base.csv"
    }
    assert sorted(agg.point.unique()) == sorted(names)
    for n in names:                                                     # each point's rows are its own CSV, untouched
        mine = agg[agg.point == n].drop(columns=["point", "pretrain.lr", "seed", "source"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(
            mine, pd.read_csv(sweep.dir / n / "report" / "utility_base.csv"), check_dtype=False
        )
    assert set(zip(agg["pretrain.lr"], agg.seed)) == {(0.003, 0), (0.003, 1), (0.001, 0), (0.001, 1)}
    assert (sweep.dir / "sweep.png").stat().st_size > 0
    assert any((sweep.dir / ".submitit").glob("*/*_log.out"))          # submitit's own logs, beside the points
    assert main(["sweep", str(spec), "--runs-root", str(root)]) == 0     # a third call: nothing left to run
    assert f"0 done, {len(names)} skipped" in capsys.readouterr().out


def _fake_cluster(tmp_path, monkeypatch) -> Path:
    "`srun` and `sbatch` stand-ins on PATH: submitit builds its SlurmExecutor; `sbatch` records what it was given."
    bin_ = tmp_path / "bin"; bin_.mkdir()
    (bin_ / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_ / "sbatch").write_text(f"#!/bin/sh\ncp \"$1\" {tmp_path}/submitted.sh\necho 'Submitted batch job 4242'\n")
    for f in bin_.iterdir(): f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{__import__('os').environ['PATH']}")
    return tmp_path / "submitted.sh"


SLURM = {"kind": "slurm", "partition": "gpu", "gpus_per_node": 1, "timeout_min": 120, "cpus_per_task": 8, "mem_gb": 64,
         "workers": 2, "account": "lab", "setup": ["module load cuda"]}


def _never_called(**kw): raise AssertionError("a job ran")


def test_slurm_executor_parameters_and_job_array_without_a_cluster(tmp_path, monkeypatch):
    """kind: slurm → submitit's SlurmExecutor with the spec's partition, GPUs, time, CPUs, memory.
    One job array of `workers` at once."""
    submitted = _fake_cluster(tmp_path, monkeypatch)
    sweep = S.load_sweep(
        yaml.safe_load(_write_spec(tmp_path / "spec.yaml", executor=SLURM).read_text()), tmp_path / "runs"
    )
    ex = S.make_executor(sweep)
    assert type(ex._executor).__name__ == "SlurmExecutor"
    p = ex._executor.parameters
    assert (
        p["partition"],
        p["gpus_per_node"],
        p["time"],
        p["cpus_per_task"],
        p["mem"],
        p["account"],
        p["setup"],
        p["job_name"],
        p["array_parallelism"],
    ) == ("gpu", 1, 120, 8, "64GB", "lab", ["module load cuda"], "lume-smoke_sweep", 2)
    assert ex.folder == sweep.dir / ".submitit" / "%j"
    jobs = S._launch(ex, sweep, sweep.points, _never_called)             # sbatch is the stand-in: nothing runs
    assert [j.job_id for j in jobs.values()] == [f"4242_{i}" for i in range(4)]
    assert {n: r["job_id"] for n, r in json.loads((sweep.dir / ".submitit" / "jobs.json").read_text()).items()} == \
           {p.name: f"4242_{i}" for i, p in enumerate(sweep.points)}
    sbatch = submitted.read_text()
    for line in (
        "--array=0-3%2", "--partition=gpu", "--gpus-per-node=1", "--time=120", "--cpus-per-task=8", "--mem=64GB",
        "--account=lab", "--job-name=lume-smoke_sweep"):
        assert f"#SBATCH {line}\n" in sbatch, line
    assert "module load cuda" in sbatch


def test_slurm_dry_run_prints_parameters_and_submits_nothing(tmp_path, capsys):
    spec = _write_spec(tmp_path / "specs" / "s.yaml", executor=SLURM)
    assert main(["sweep", str(spec), "--runs-root", str(tmp_path / "runs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "submitit.AutoExecutor(cluster='slurm')" in out
        and '"slurm_partition": "gpu"' in out
        and '"timeout_min": 120' in out
    )
    assert (
        '"slurm_array_parallelism": 2' in out
        and "pretrain.lr=0.001,seed=1" in out
        and "dry run: nothing submitted" in out
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("spec", sorted((REPO / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_sweeps_validate_in_dry_run(spec, tmp_path, capsys):
    assert main(["sweep", str(spec), "--dry-run", "--runs-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    sweep = S.load_sweep(spec, tmp_path)
    assert len(sweep.points) >= 6 and all(p.name in out for p in sweep.points)
    assert (sweep.swept[-1] == "seed") == (len({p.seed for p in sweep.points}) > 1)
    assert not any(tmp_path.iterdir())


def test_probe_ladder_is_what_it_says():
    """smollm2_5pct_probes: the first point is the spec's base recipe, each middle point moves one setting, and the
    last point is the smollm2 preset at 5 % masks in every injection and PII field but one: every point injects in
    float32 (the header says why), where the preset autocasts to bf16."""
    from dataclasses import asdict, replace
    from lume_lab.core.config import make_config
    sweep = S.load_sweep(REPO / "sweeps" / "smollm2_5pct_probes.yaml")
    assert sweep.experiments == ["e00_base", "e01_data", "t01_memorization"] and sweep.points[0].overrides == {}
    assert all(1 <= len(p.overrides) <= 2 for p in sweep.points[1:-1])
    preset = make_config("smollm2")
    at5 = replace(preset, inject=replace(preset.inject, mask_fraction=0.05, autocast=None))
    last = sweep.points[-1].config
    assert (asdict(last.inject), asdict(last.pii)) == (asdict(at5.inject), asdict(at5.pii))
    assert last.inject.shared_mask is False and sweep.points[0].config.inject.shared_mask is True
    assert preset.inject.autocast == "bfloat16" and {p.config.inject.autocast for p in sweep.points} == {None}


def test_shipped_sweeps_are_what_they_say():
    mask = S.load_sweep(REPO / "sweeps" / "mask_coverage.yaml")
    assert mask.swept == ["inject.mask_fraction", "seed"] and mask.experiments == ["e00_base", "e01_data", "e02_inject"]
    assert {0.01, 0.02, 0.05} <= {p.config.inject.mask_fraction for p in mask.points} and mask.collect == [
        "report/extraction_rates.csv"
    ]
    lr = S.load_sweep(REPO / "sweeps" / "npo_lr.yaml")
    assert lr.swept == ["unlearn.hparams.npo.lr", "seed"] and {tuple(p.config.unlearn.methods) for p in lr.points} == {
        ("npo",)
    }
    # numbers, not YAML 1.1 strings
    assert sorted({p.config.unlearn.hparams["npo"]["lr"] for p in lr.points}) == [1e-4, 3e-4, 1e-3]


@pytest.mark.parametrize("change,msg", [
    ({"grid": {"pretrain.lrr": [0.1]}}, "unknown config field 'pretrain.lrr': pretrain has fields steps"),
    ({"set": {**FAST, "unlearn.hparams.npo.bta": 0.1}},
     "unknown hyperparameter(s) 'bta' for method 'npo'; allowed: lr"),
    ({"grid": {}}, "grid is empty"),
    ({"grid": None}, "grid is empty"),
    ({"grid": {"pretrain.lr": []}}, "grid['pretrain.lr'] must be a non-empty list"),
    ({"grid": {"pretrain.lr": [0.003, -1]}}, "point(s) pretrain.lr=-1,seed=0, pretrain.lr=-1,seed=1: pretrain.lr must "
                                             "be a positive finite float"),
    ({"executor": {"kind": "local", "workers": 2, "partition": "gpu"}}, "unknown local executor option(s) 'partition'; "
                                                                        "allowed: workers, threads"),
    ({"executor": {"kind": "slurm", "partiton": "gpu", "timeout_min": 60}}, "unknown slurm executor option(s) "
                                                                            "'partiton'; allowed: workers"),
    ({"executor": {"kind": "slurm", "partition": "gpu"}}, "executor.timeout_min is required for slurm"),
    ({"executor": {"kind": "kubernetes"}}, "executor.kind must be one of local, slurm; got 'kubernetes'"),
    ({"grid": DROP, "points": [{"pretrain.lr": 0.003}, {"pretrain.lr": 0.003}]}, "duplicate point name(s) "
                                                                                 "pretrain.lr=0.003,seed=0"),
    ({"seeds": [0, 0]}, "seeds must be a non-empty list of distinct non-negative ints"),
    ({"only": ["e42"]}, "only: unknown experiment(s) e42"),
    ({"colect": ["x.csv"]}, "unknown sweep key(s) 'colect'"),
])
def test_bad_spec_rejected_before_anything_is_submitted(tmp_path, capsys, change, msg):
    spec, root = _write_spec(tmp_path / "specs" / "bad.yaml", **change), tmp_path / "runs"
    assert main(["sweep", str(spec), "--runs-root", str(root)]) == 2
    assert msg in capsys.readouterr().err
    # nothing created: no sweep folder, no submitit logs
    assert not root.exists()


def test_spec_edited_under_the_same_name_is_refused(tmp_path, capsys):
    """A point directory that holds a run of another config stops the sweep before submission.
    The spec changed, the name did not."""
    spec, root = _write_spec(tmp_path / "spec.yaml"), tmp_path / "runs"
    point = S.load_sweep(spec, root).points[0]
    open_run(
        point.name,
        resolve_config(make_config("smoke", {**FAST, "pretrain.lr": 0.003, "pretrain.steps": 30})),
        root / "smoke_sweep",
    )
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    assert main(["sweep", str(spec), "--runs-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"point {point.name} exists in" in err and "differing fields: pretrain.steps" in err
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_seeds_flag_parsing_and_wiring(tmp_path, monkeypatch, capsys):
    """`--seeds 0,1,2` is a seeds-only sweep of the run's preset and --set values in runs/<run-id>/seed=N/.
    Bad lists exit 2."""
    assert S.parse_seeds("0,1,2") == [0, 1, 2] and S.parse_seeds("7") == [7] and S.parse_seeds("2, 0") == [2, 0]
    for bad in ("a", "1,1", "-1", "1.5"):
        with pytest.raises(ConfigError, match="--seeds expects"): S.parse_seeds(bad)
    for bad in ("", "0,,x", "0,"):
        with pytest.raises(ConfigError, match="--seeds has an empty entry"): S.parse_seeds(bad)
    import lume_lab.pipeline.orchestration.cli as cli
    calls = []
    monkeypatch.setattr(
        cli,
        "run_seeds",
        lambda spec, run_fn, root=None: calls.append((spec, run_fn, root)) or pd.DataFrame({"status": ["done"]}),
    )
    args = ["run", "--preset", "smoke", "--set", "pii.n_groups=4", "--only", "e00", "--runs-root", str(tmp_path)]
    assert main(args + ["--seeds", "0,1,2", "--workers", "2"]) == 0
    spec, run_fn, root = calls[-1]
    assert run_fn is cli.run_pipeline and root == str(tmp_path)
    assert spec == {
        "name": "smoke_seeds", "preset": "smoke", "set": {"pii.n_groups": 4}, "seeds": [0, 1, 2], "only": ["e00"],
        "executor": {"kind": "local", "workers": 2}}
    sweep = S.load_sweep(spec, tmp_path)
    assert [p.name for p in sweep.points] == ["seed=0", "seed=1", "seed=2"] and sweep.dir == tmp_path / "smoke_seeds"
    assert [(p.config.seed, p.config.pii.n_groups) for p in sweep.points] == [(0, 4), (1, 4), (2, 4)]
    assert main(args + ["--seeds", "0,1", "--run-id", "mine"]) == 0 and calls[-1][0]["name"] == "mine"
    assert main(args + ["--seeds", "0,x"]) == 2 and "--seeds expects" in capsys.readouterr().err
    with pytest.raises(SystemExit): main(args + ["--seeds", "0,1", "--seed", "3"])     # one or the other
    assert len(calls) == 2 and not any(tmp_path.iterdir())


def test_readme_sweep_examples_validate(tmp_path, monkeypatch):
    "docs/sweeps.md's spec (README links it) is valid as written, locally and with its Slurm executor block."
    text = (REPO / "docs" / "sweeps.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    spec, slurm = yaml.load(blocks[0], Loader=S._SpecLoader), yaml.load(blocks[1], Loader=S._SpecLoader)
    assert len(S.load_sweep(spec, tmp_path).points) == 15
    _fake_cluster(tmp_path, monkeypatch)
    p = S.make_executor(S.load_sweep({**spec, **slurm}, tmp_path)).parameters
    assert (p["partition"], p["gpus_per_node"], p["time"], p["array_parallelism"], p["account"]) == (
        "gpu", 1, 240, 8, "my-lab")
