"""End-to-end tests of the foundation:
determinism, crash/resume, caching, bad input, the run's one config, papermill parameters, tuning."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from lume_lab.core.config import PRESETS, make_config, ConfigError
from lume_lab.pipeline.orchestration.config import AUXILIARY_METHODS, resolve_config
from lume_lab.pipeline.orchestration.runner import run_notebook, experiment_notebooks, NotebookRunError
from lume_lab.pipeline.orchestration.cli import main
from lume_lab.unlearn.registry import BUILTIN_METHODS, get_spec
from conftest import HANG_TIMEOUT

HERE = Path(__file__).parent
PY = sys.executable
# small but real: the smoke model, fewer pretraining steps
FAST = {"pretrain.steps": 24, "pretrain.checkpoint_every": 8}


def _run_stages(root, run_id, overrides):
    return subprocess.Popen([PY, str(HERE / "_base_stages.py"), str(root), run_id, json.dumps(overrides)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _weights(run_dir):
    return load_file(str(run_dir / "base" / "model" / "model.safetensors"))


def _same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_bitwise_identical_tokenizer_and_weights(tmp_path):
    procs = [_run_stages(tmp_path, rid, FAST) for rid in ("a", "b")]
    for p in procs: assert p.wait(600) == 0, p.stdout.read()
    a, b = tmp_path / "a", tmp_path / "b"
    assert (a / "tokenizer" / "tokenizer.json").read_bytes() == (b / "tokenizer" / "tokenizer.json").read_bytes()
    assert _same_weights(_weights(a), _weights(b))
    # a different seed gives a different model (the test above could not fail if seeds were ignored)
    p = _run_stages(tmp_path, "c", {**FAST, "pretrain.steps": 8, "pretrain.checkpoint_every": 4})
    assert p.wait(600) == 0
    assert not _same_weights(_weights(a), _weights(tmp_path / "c"))


def _kill_after_first_checkpoint(p, ckpts: Path, timeout: float = 600):
    "SIGKILL the stage process `p` as soon as a checkpoint appears in `ckpts` (fails if it finishes first)."
    deadline = time.time() + timeout
    while time.time() < deadline and not (
        ckpts.exists() and any(c.name.startswith("checkpoint-") for c in ckpts.iterdir())
    ):
        assert p.poll() is None, f"stages finished before a checkpoint was seen in {ckpts}: " + p.stdout.read()
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL); p.wait()


def test_killed_during_pretraining_resumes_without_corrupt_artifacts(tmp_path):
    slow = {"pretrain.steps": 160, "pretrain.checkpoint_every": 10}
    p = _run_stages(tmp_path, "crash", slow)
    _kill_after_first_checkpoint(p, tmp_path / "crash" / ".base.partial" / "checkpoints")
    man = json.loads((tmp_path / "crash" / "manifest.json").read_text())
    assert man["stages"]["base"]["status"] == "running"          # not marked done
    assert not (tmp_path / "crash" / "base").exists()             # no artifact that looks complete
    assert _run_stages(tmp_path, "crash", slow).wait(600) == 0    # rerun resumes
    man = json.loads((tmp_path / "crash" / "manifest.json").read_text())
    assert man["stages"]["base"]["status"] == "done" and man["stages"]["base"]["resumed"]
    assert not (tmp_path / "crash" / ".base.partial").exists()
    assert not (tmp_path / "crash" / "base" / "checkpoints").exists()
    # resumed training reaches bitwise the weights of an uninterrupted run
    assert _run_stages(tmp_path, "clean", slow).wait(600) == 0
    assert _same_weights(_weights(tmp_path / "crash"), _weights(tmp_path / "clean"))


def _inject_stages(root, run_id, overrides, checkpoint_seconds=0.2, reuse=()):
    return subprocess.Popen(
        [
            PY, str(HERE / "_inject_stages.py"), str(root), run_id, json.dumps(overrides), str(checkpoint_seconds),
            *reuse],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_killed_during_injection_resumes_bitwise(tmp_path):
    """The masked injection checkpoints in its partial stage dir:
    killed, it resumes there and ends on an uninterrupted run's weights."""
    slow = {**FAST, "inject.steps": 200}
    p = _inject_stages(tmp_path, "crash", slow)
    _kill_after_first_checkpoint(p, tmp_path / "crash" / ".inject_masked.partial" / "checkpoints")
    man = json.loads((tmp_path / "crash" / "manifest.json").read_text())
    assert man["stages"]["inject_masked"]["status"] == "running" and not (tmp_path / "crash" / "inject_masked").exists()
    # the uninterrupted reference, on the killed run's finished stages (its injection is not finished: computed afresh)
    out = _inject_stages(tmp_path, "clean", slow, 3600, reuse=["crash"]); assert out.wait(600) == 0, out.stdout.read()
    clean = json.loads((tmp_path / "clean" / "manifest.json").read_text())["stages"]
    assert "reused_from" in clean["base"] and "reused_from" not in clean["inject_masked"]
    out = _inject_stages(tmp_path, "crash", slow); assert out.wait(600) == 0, out.stdout.read()
    man = json.loads((tmp_path / "crash" / "manifest.json").read_text())
    assert man["stages"]["inject_masked"]["status"] == "done" and man["stages"]["inject_masked"]["resumed"]
    assert "resumed from checkpoint-" in out.stdout.read()
    assert not (tmp_path / "crash" / "inject_masked" / "checkpoints").exists()
    log = pd.read_csv(tmp_path / "crash" / "inject_masked" / "log.csv")
    assert log.step.tolist() == list(range(200))
    w = lambda r: load_file(str(tmp_path / r / "inject_masked" / "model" / "model.safetensors"))
    assert _same_weights(w("crash"), w("clean"))
    assert pd.read_csv(tmp_path / "clean" / "inject_masked" / "log.csv").loss.tolist() == log.loss.tolist()


@pytest.mark.parametrize("args,msg", [
    (["run", "--preset", "huge"], "preset must be one of"),
    (["run", "--preset", "smoke", "--set", "pii.n_groups=0"], "pii.n_groups must be a positive int"),
    (["run", "--preset", "smoke", "--set", "pii.n_groups=8", "--set", "inject.mask_fraction=0.2"], "pii.n_groups × "
                                                                                                   "inject.mask_fraction"),
    (["run", "--preset", "smoke", "--set", "unlearn.methods=[\"rmu\"]"], "allowed: grad_ascent"),
    (["run", "--preset", "smoke", "--set", "model.name_or_path=/no/such/model"], "does not exist"),
    (["run", "--preset", "smoke", "--set", "pii.nope=1"], "unknown config field 'pii.nope'"),
    (["run", "--preset", "smoke", "--set", "unlearn.hparams.npo.lr=-1"], "npo.lr must be a positive number"),
    (["run", "--preset", "smoke", "--set", "unlearn.hparams.rmu.lr=1"], "unlearn.hparams sets 'rmu', which is not in "
                                                                        "unlearn.methods"),
    (["run", "--preset", "smoke", "--only", "e98"], "unknown experiment(s) e98"),
    (["run", "--preset", "mini", "--set", "unlearn.hparams.alphaedit.layers=[99]"], "alphaedit.layers must be distinct "
                                                                                    "layer indices in 0..5, got [99]"),
    (["run", "--preset", "smoke", "--set", "unlearn.hparams.uld.n_layers=9"], "uld.n_layers must be None or an "
                                                                              "int in 1..4"),
    (["run", "--preset", "smoke", "--set", "unlearn.hparams.memflex.pattern=\"mlp.(\""], "memflex.pattern is not a "
                                                                                         "valid regular expression"),
    (["run", "--preset", "smoke", "--set", "inject.seq_len=4"], "inject.seq_len must be an int >= 8"),
    (["run", "--preset", "smoke", "--set", "inject.lr=NaN"], "inject.lr must be a positive finite float, got nan"),
    (["run", "--preset", "smoke", "--set", "seed=3"], "seed is not a --set field; use --seed"),
    (["run", "--preset", "smoke", "--set", "preset=study"], "preset is not a --set field; use --preset"),
    (["run", "--preset", "smoke", "--workers", "2"], "--workers applies only with --seeds"),
    (["run", "--preset", "smoke", "--seeds", "0,1", "--workers", "0"], "--workers must be an int >= 1"),
    (["run", "--preset", "smoke", "--seeds", "0,,1"], "--seeds has an empty entry"),
    (["run", "--preset", "smoke", "--only"], "--only needs at least one experiment"),
])
def test_cli_rejects_bad_config_before_compute(tmp_path, capsys, args, msg):
    assert main(args + ["--runs-root", str(tmp_path)]) == 2
    assert msg in capsys.readouterr().err
    assert not any(tmp_path.iterdir())   # nothing was computed or written


def test_cli_refuses_a_tree_with_uncommitted_code(tmp_path, monkeypatch, capsys):
    """`lume-lab run`, `run --seeds` and `sweep` started from a checkout whose tracked code has uncommitted changes are
    refused before anything is written, naming the files; an edited doc is no reason; `--allow-dirty` goes on."""
    from lume_lab.core import store
    repo, runs = tmp_path / "repo", tmp_path / "runs"
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo, check=True,
                                    capture_output=True)
    for f in ("lume_lab/core/store.py", "docs/notes.md"):
        (repo / f).parent.mkdir(parents=True, exist_ok=True); (repo / f).write_text("x = 1\n")
    git("init", "-q"); git("add", "."); git("commit", "-qm", "init")
    monkeypatch.setattr(store, "package_dir", lambda: repo / "lume_lab")   # the checkout the package runs from
    monkeypatch.delenv("LUME_LAB_ALLOW_DIRTY", raising=False)
    spec = tmp_path / "s.yaml"; spec.write_text("name: s\npreset: smoke\nseeds: [0]\n")
    commands = (["run", "--preset", "smoke"], ["run", "--preset", "smoke", "--seeds", "0,1"], ["sweep", str(spec)])
    only = lambda c: ["--only", "e98"] if c[0] == "run" else []    # past the check, a run stops at the unknown name
    (repo / "docs/notes.md").write_text("x = 2\n")
    assert main([*commands[0], "--only", "e98", "--runs-root", str(runs)]) == 2
    assert "unknown experiment(s) e98" in capsys.readouterr().err                # a doc edit: not refused
    (repo / "lume_lab/core/store.py").write_text("x = 2\n")
    for c in commands:
        assert main([*c, *only(c), "--runs-root", str(runs)]) == 2
        assert "uncommitted changes to the code (lume_lab/core/store.py)" in capsys.readouterr().err, c
    assert not runs.exists()
    assert main([*commands[0], "--allow-dirty", "--only", "e98", "--runs-root", str(runs)]) == 2
    assert "unknown experiment(s) e98" in capsys.readouterr().err
    monkeypatch.setenv("LUME_LAB_ALLOW_DIRTY", "1")
    assert main([*commands[0], "--only", "e98", "--runs-root", str(runs)]) == 2
    assert "unknown experiment(s) e98" in capsys.readouterr().err
    assert store.git_commit().endswith("+dirty")


def _config_only_checkpoint(d: Path, layers: int) -> Path:
    "A directory holding only an OLMo-2 `config.json` with `layers` layers: all that `check_checkpoint` reads."
    from lume_lab.models.lm import olmo2_config
    olmo2_config(1024, 64, layers, 4, 256, pad_token_id=1, bos_token_id=0, eos_token_id=0).save_pretrained(d)
    return d


def test_checkpoint_is_resolved_before_compute(tmp_path, capsys):
    """A local checkpoint whose layer count differs from model.num_layers is refused with the value to set.
    The refusal comes before anything is written; a matching checkpoint resolves."""
    from lume_lab.pipeline.stages.base import check_checkpoint
    ckpt = _config_only_checkpoint(tmp_path / "ckpt", 3)
    assert (
        check_checkpoint(
            make_config("smoke", {"model.name_or_path": str(ckpt), "model.num_layers": 3})
        ).num_hidden_layers
        == 3
    )
    assert check_checkpoint(make_config("smoke")) is None                      # the tiny model: nothing to resolve
    runs = tmp_path / "runs"; runs.mkdir()
    assert main(["run", "--preset", "smoke", "--set", f"model.name_or_path={ckpt}", "--runs-root", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "model.num_layers is 4 but" in err and "has 3 layers; set model.num_layers=3" in err
    assert not any(runs.iterdir())
    empty = tmp_path / "empty"; empty.mkdir()                                  # a directory that is no checkpoint
    assert main(["run", "--preset", "smoke", "--set", f"model.name_or_path={empty}", "--runs-root", str(runs)]) == 2
    assert "is a directory without config.json" in capsys.readouterr().err
    assert not any(runs.iterdir())
    # a sweep refuses it up front too
    from lume_lab.pipeline.orchestration.sweep import load_sweep
    with pytest.raises(ConfigError, match="has 3 layers; set model.num_layers=3"):
        load_sweep({"name": "ck", "preset": "smoke", "grid": {"model.name_or_path": [str(ckpt)]}}, runs)
    assert not any(runs.iterdir())


def test_checkpoint_check_is_skipped_once_base_is_done(tmp_path, monkeypatch):
    "A resumed or report-only run whose base stage is done does not resolve its checkpoint again (no hub needed)."
    _resolve_only(monkeypatch)
    import lume_lab.pipeline.stages.base as stages

    calls = []
    monkeypatch.setattr(stages, "check_checkpoint", lambda cfg: calls.append(cfg))
    args = ["run", "--preset", "smoke", "--run-id", "r", "--runs-root", str(tmp_path)]
    assert main(args) == 0 and len(calls) == 1
    man = tmp_path / "r" / "manifest.json"
    m = json.loads(man.read_text())
    m.setdefault("stages", {})["base"] = {"status": "done"}
    man.write_text(json.dumps(m))
    assert main(args) == 0 and len(calls) == 1


def test_cli_unreachable_hub_id_fails_before_compute(tmp_path):
    """A hub id that is neither reachable nor cached (offline here) exits 2 with one message.
    No stage is written (not even a pointer marked done)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}                               # no retries against an unreachable hub
    r = subprocess.run(
        [
            sys.executable, "-m", "lume_lab.pipeline.orchestration.cli", "run", "--preset", "smoke", "--set",
            "model.name_or_path=nope-org/nope-model", "--runs-root", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert (
        "model.name_or_path 'nope-org/nope-model'" in r.stderr
        and "does not load as a Hugging Face checkpoint" in r.stderr
    )
    assert "Traceback" not in r.stderr and not any(tmp_path.iterdir())


def test_cli_stage_whose_inputs_are_not_done_is_an_error_not_a_traceback(tmp_path, monkeypatch, capsys):
    _resolve_only(monkeypatch)
    assert main(["run", "--preset", "smoke", "--run-id", "r", "--runs-root", str(tmp_path)]) == 0
    assert main(["stage", "inject_unmasked", "--run-id", "r", "--runs-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lume-lab: error:") and "needs 'world' first" in err
    assert not (tmp_path / "r" / "inject_unmasked").exists()


def test_cli_rejects_unknown_method_hyperparameter_naming_allowed_keys(tmp_path, capsys):
    "`--set unlearn.hparams.npo.bta=0.1` exits 2 before any compute, naming NPO's allowed keys, and writes nothing."
    args = [
        "run", "--preset", "smoke", "--set", "unlearn.hparams.npo.bta=0.1", "--run-id", "typo", "--runs-root",
        str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "unknown hyperparameter(s) 'bta' for method 'npo'" in err
    assert "allowed: " + ", ".join(get_spec("npo").defaults) in err
    assert not any(tmp_path.iterdir())


def _resolve_only(monkeypatch):
    "Make `lume-lab run` stop after writing the run's config: record the notebook calls instead of executing them."
    import lume_lab.pipeline.orchestration.cli as cli
    calls = []
    monkeypatch.setattr(cli, "run_notebook", lambda nb, out, params, **kw: calls.append((nb.stem, params)))
    monkeypatch.setattr(cli, "run_status", lambda run_id, root=None: __import__("pandas").DataFrame())
    return calls


def test_dotted_override_changes_one_method_only(tmp_path, monkeypatch):
    """`--set unlearn.hparams.npo.beta=0.5`:
    config.json has npo.beta 0.5 and every other method's hparams equal the preset's."""
    calls = _resolve_only(monkeypatch)
    assert (
        main(
            [
                "run", "--preset", "mini", "--set", "unlearn.hparams.npo.beta=0.5", "--run-id", "r", "--runs-root",
                str(tmp_path)]
        )
        == 0
    )
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    plain = resolve_config(make_config("mini")).to_dict()["unlearn"]["hparams"]
    hp = cfg["unlearn"]["hparams"]
    assert hp["npo"] == {**plain["npo"], "beta": 0.5} and plain["npo"]["beta"] != 0.5
    assert {m: h for m, h in hp.items() if m != "npo"} == {m: h for m, h in plain.items() if m != "npo"}
    assert set(hp) == set(BUILTIN_METHODS) | set(AUXILIARY_METHODS) and cfg["unlearn"]["methods"] == list(
        BUILTIN_METHODS
    )
    # the preset's tuned values survive
    assert hp["grad_ascent"]["lr"] == PRESETS["mini"]["unlearn.hparams.grad_ascent"]["lr"]
    man = json.loads((tmp_path / "r" / "manifest.json").read_text())
    from lume_lab.core.config import config_hash
    assert man["config_hash"] == config_hash(cfg)
    # the notebooks get only the run id and where runs live; they read config.json
    assert calls and all(p == {"run_id": "r", "runs_root": str(tmp_path.resolve())} for _, p in calls)


def test_existing_run_with_other_config_is_refused(tmp_path, monkeypatch, capsys):
    """Neither the CLI nor a notebook run by hand rewrites an existing run's config:
    both refuse, and the files stay as they were."""
    _resolve_only(monkeypatch)
    base = ["run", "--preset", "smoke", "--run-id", "r", "--runs-root", str(tmp_path)]
    assert main(base) == 0
    run = tmp_path / "r"
    before = {p: (run / p).read_bytes() for p in ("config.json", "manifest.json")}
    assert main(base + ["--set", "unlearn.hparams.npo.beta=0.5"]) == 2
    err = capsys.readouterr().err
    assert "exists with a different config" in err and "unlearn.hparams.npo.beta" in err
    assert {p: (run / p).read_bytes() for p in before} == before
    nb = experiment_notebooks(["e00"])[0]
    with pytest.raises(NotebookRunError, match="ConfigError.*differing fields: seed"):
        run_notebook(
            nb, tmp_path / "by-hand" / nb.name, {"run_id": "r", "runs_root": str(tmp_path), "seed": 1}, root=tmp_path,
            progress=False)
    assert {p: (run / p).read_bytes() for p in before} == before
    assert not json.loads((run / "manifest.json").read_text()).get("stages")                # no stage ran
    # report/: the run's page
    assert not any(p.name not in ("config.json", "manifest.json", "report") for p in run.iterdir())


def test_unknown_papermill_parameter_rejected(tmp_path):
    nb = experiment_notebooks(["e00"])[0]
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) 'presett'.*allowed: run_id, runs_root, preset, "
                                         r"overrides, seed"):
        run_notebook(nb, tmp_path / "r" / "e00.ipynb", {"presett": "mini"}, root=tmp_path)
    assert not (tmp_path / "r").exists()


def test_experiment_notebooks_have_one_parameters_cell():
    for nb in experiment_notebooks(["e", "t"]):
        cells = json.loads(nb.read_text())["cells"]
        assert sum("parameters" in c.get("metadata", {}).get("tags", []) for c in cells) == 1, nb.name


def test_default_chain_is_e_series_and_tuning_is_opt_in():
    names = [p.stem for p in experiment_notebooks()]
    assert names == sorted(names) and names and all(n.startswith("e") for n in names)
    assert names[-1] == "e99_report"          # the report page reads what every other experiment wrote: last
    assert [p.stem for p in experiment_notebooks(["t00"])] == ["t00_tune"]
    with pytest.raises(ValueError, match="unknown experiment.*allowed: .*t00_tune"): experiment_notebooks(["t99"])


def test_one_default_preset_and_a_named_by_hand_preset(tmp_path):
    """The CLI and `make_config` default to `DEFAULT_PRESET`.
    A notebook opened by hand on a new run gets `BY_HAND_PRESET`."""
    import inspect
    from lume_lab.core.config import DEFAULT_PRESET, PRESETS
    from lume_lab.pipeline.orchestration.cli import _parser, run_pipeline
    from lume_lab.pipeline.orchestration.config import BY_HAND_PRESET, open_experiment
    assert _parser().parse_args(["run"]).preset == DEFAULT_PRESET
    assert inspect.signature(run_pipeline).parameters["preset"].default == DEFAULT_PRESET
    assert make_config().preset == DEFAULT_PRESET and {DEFAULT_PRESET, BY_HAND_PRESET} <= set(PRESETS)
    assert open_experiment("by_hand", tmp_path).config.preset == BY_HAND_PRESET


def _side_em(model, rows): return model[rows[0]["side"]]


def test_grid_search_scores_and_selects_on_constructed_data():
    "The search's arithmetic and selection on a registered toy method whose EM is set by construction."
    import pandas as pd
    from lume_lab.unlearn.registry import MethodSpec, register_method
    from lume_lab.pipeline.stages.tune import grid_search, select_best
    def halve(model, tok, forget, retain, hp, *, seed=0):
        return {
            "forget": model["forget"] * (1 - hp["k"]),
            "retain": model["retain"] * (1 - hp["k"] / 10),
        }, pd.DataFrame()
    register_method(MethodSpec("test_halve", halve, {"k": 0.5}))   # `k`: a key without a generic rule, so 0 is allowed
    grid = {"k": [0.0, 0.5, 1.0]}
    res = grid_search(
        "test_halve", lambda: {"forget": 0.8, "retain": 0.6}, None, [{"side": "forget"}], [{"side": "retain"}], grid,
        em_fn=_side_em, progress=False)
    assert res.point.tolist() == [0, 1, 2] and res.forgetting.tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert res.retention.tolist() == pytest.approx([1.0, 0.95, 0.9])
    assert select_best(res, grid) == {"k": 1.0}


def test_grid_search_refuses_an_unmemorized_split():
    """A validation split with EM 0 before unlearning cannot be scored:
    refused before any run (or NaN scores when not required)."""
    import pandas as pd, warnings
    from lume_lab.unlearn.registry import MethodSpec, register_method
    from lume_lab.pipeline.stages.tune import grid_search, select_best
    ran = []
    register_method(
        MethodSpec("test_noop", lambda m, t, f, r, hp, *, seed=0: (ran.append(1) or m, pd.DataFrame()), {"lr": 0.5})
    )
    args = (
        "test_noop", lambda: {"forget": 0.7, "retain": 0.0}, None, [{"side": "forget"}], [{"side": "retain"}],
        {"lr": [0.1, 0.2]})
    with pytest.raises(ValueError, match=r"retain_before must be > 0"):
        grid_search(*args, em_fn=_side_em, progress=False)
    assert ran == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = grid_search(*args, em_fn=_side_em, progress=False, require_memorized=False)
    assert len(res) == 2 and res.score.isna().all() and select_best(res, args[-1]) == {"lr": 0.1}


def test_grid_search_on_toy_model():
    """A rate that moves nothing forgets less than one that does, on models.toy's problem.
    The toy model is fine-tuned until it memorizes."""
    import copy
    from lume_lab.models.toy import toy_problem
    from lume_lab.pipeline.stages.tune import grid_search
    model, tok, forget, retain = toy_problem()
    grid = {"lr": [1e-7, 1e-2], "max_steps": [8]}
    res = grid_search("grad_ascent", lambda: copy.deepcopy(model), tok, forget, retain, grid, progress=False)
    # the precondition, with a wide margin
    assert (res.em_forget_before > 0.5).all() and (res.em_retain_before > 0.5).all()
    assert res.loc[0, "forgetting"] < 0.05 and res.loc[1, "forgetting"] > 0.5


def test_memorization_probe_notebook_on_smoke(tmp_path):
    """t01 on smoke with a probe's recipe (one shared mask over every layer, one question per sequence, no documents):
    every injected profile of every target field scored before and after instruction tuning, the utility table of the
    base and the masked model, one mask that covers the top layer, and unlearning refused before any compute (no score
    is asserted: smoke memorizes nothing)."""
    import pandas as pd
    from lume_lab.core.store import open_run
    from lume_lab.inject.masks import load_masks
    from lume_lab.pipeline.stages.unlearn import stage_unlearn
    probe = {"inject.shared_mask": True, "inject.reserved_layers": 0, "inject.packing": False,
             "inject.documents": False}
    params = {"run_id": "probe", "runs_root": str(tmp_path), "preset": "smoke", "overrides": {**FAST, **probe}}
    nb = experiment_notebooks(["t01"])[0]
    run_notebook(nb, tmp_path / "probe" / "notebooks" / nb.name, params, root=tmp_path)
    store = open_run("probe", root=str(tmp_path))
    c = store.config
    mem = pd.read_csv(tmp_path / "probe" / "report" / "memorization.csv")
    assert sorted(mem.model.unique()) == ["after instruction tuning", "before instruction tuning"]
    assert mem.groupby("model").field.apply(sorted).map(tuple).nunique() == 1
    assert sorted(mem.field.unique()) == sorted(c.pii.target_fields)
    assert (mem.profiles == c.pii.n_groups * c.pii.profiles_per_group).all()
    util = pd.read_csv(tmp_path / "probe" / "report" / "probe_utility.csv")   # e02's rows, base and masked
    assert set(util.model) == {"base", "masked"}
    assert util.groupby("model").metric.apply(frozenset).nunique() == 1           # the same metrics for both
    owner, meta = load_masks(store.path("masks") / "masks.safetensors")
    top = c.model.num_layers - 1
    assert meta["n_groups"] == 1 and max(int(m.max()) for m in owner.values()) == 1
    assert any(f"layers.{top}." in n for n in owner)
    with pytest.raises(ValueError, match="inject.shared_mask=true"):
        stage_unlearn(store, "grad_diff", c.pii.target_fields[0])
    assert not any(k.startswith("unlearn_") for k in store.manifest["stages"])


def test_tuning_notebook_on_smoke_then_cached(tmp_path, monkeypatch):
    """t00 end to end on smoke:
    its files, one row per grid point, the best point is a grid point, cached on rerun (no score is asserted)."""
    import pandas as pd
    from lume_lab.core.store import open_run
    from lume_lab.pipeline.stages.tune import grid_points, stage_tune
    from lume_lab.pipeline.stages.testbed import stage_testbed
    from lume_lab.pipeline.orchestration.config import method_hparams
    from lume_lab.pipeline.stages.unlearn import stage_forget_fields
    grids = {
        "grad_ascent": {"lr": [1e-6, 3e-3], "max_steps": [2]},
        "grad_diff": {"lr": [3e-3], "epochs": [1], "alpha": [1.0, 3.0]},
    }
    # at an operating point (smoke's default has none): each grid point runs to it on the validation field
    rule = {"rule": "never_trained", "min_points": 2}
    params = {
        "run_id": "tune", "runs_root": str(tmp_path), "preset": "smoke", "methods": list(grids), "grids": grids,
        "overrides": {**FAST, "unlearn.operating_point": rule, "unlearn.eval_points": 4}}
    nb = experiment_notebooks(["t00"])[0]
    run_notebook(nb, tmp_path / "tune" / "notebooks" / nb.name, params, root=tmp_path)
    report = tmp_path / "tune" / "report"
    assert {"tuning_grid.csv", "tuning_best.json", "tuning_best.csv", "tuning_grid.png"} <= {
        p.name for p in report.iterdir()
    }
    grid = pd.read_csv(report / "tuning_grid.csv")
    assert grid.groupby("method").size().to_dict() == {"grad_ascent": 2, "grad_diff": 2}
    assert grid.groupby("method").point.apply(list).to_dict() == {"grad_ascent": [0, 1], "grad_diff": [0, 1]}
    # the guard and the steps ran
    assert {"ppl_before", "ppl_after", "ppl_ratio", "eligible", "steps"} <= set(grid.columns)
    assert (grid.ppl_ratio > 0).all() and grid.eligible.dtype == bool
    # each point's trajectory and operating point are kept; one that did not reach it is never eligible
    assert {"op_status", "op_step", "reached"} <= set(grid.columns)
    assert set(grid.op_status) <= {"reached", "not reached", "crossed before the first point"}, grid.op_status
    assert not (grid.eligible & ~grid.reached).any() and grid.score.equals(grid.retention)
    for m, i in zip(grid.method, grid.point):
        op = json.loads((tmp_path / "tune" / f"tune_{m}" / f"point_{i:02d}" / "operating_point.json").read_text())
        assert op["status"] == grid.op_status[(grid.method == m) & (grid.point == i)].item() and op["point"] == i
        assert (tmp_path / "tune" / f"tune_{m}" / f"point_{i:02d}" / "trajectory.csv").exists()
        # the row an interrupted grid would resume from
        kept = json.loads((tmp_path / "tune" / f"tune_{m}" / "rows" / f"point_{i:02d}.json").read_text())
        assert kept["point"] == i and kept["op_status"] == op["status"]
    best = json.loads((report / "tuning_best.json").read_text())
    assert set(best) == set(grids) and all(best[m] in grid_points(grids[m]) for m in grids)
    store = open_run("tune", root=str(tmp_path))                                      # the config the notebook wrote
    rows = len(stage_testbed(store)[f"forget_{stage_forget_fields(store)[0]}"])
    # the grid's own max_steps
    assert grid.loc[grid.method == "grad_ascent", "steps"].tolist() == [2, 2]
    batch = method_hparams(store.config, "grad_diff")["batch_size"]
    # 1 epoch over the first forget split
    assert grid.loc[grid.method == "grad_diff", "steps"].tolist() == [-(-rows // batch)] * 2
    before = store.manifest["stages"]["tune_grad_ascent"]["finished"]
    stage_tune(store, "grad_ascent", grids["grad_ascent"])                              # cache hit
    assert open_run("tune", root=str(tmp_path)).manifest["stages"]["tune_grad_ascent"]["finished"] == before
    with pytest.raises(ValueError, match="unknown unlearning method"): stage_tune(store, "gradient_ascent")
    with pytest.raises(ValueError, match=r"grid\['lr'\]"): stage_tune(store, "grad_ascent", {"lr": []})
    # unlearn.tune_prune on a copy of the run: a grid over lr alone runs from the highest rate down and runs nothing
    # below the first rate that did not reach; a grid over more keys is left whole, its stage a cache hit
    import shutil
    shutil.copytree(tmp_path / "tune", tmp_path / "pruned")
    cfg = json.loads((tmp_path / "pruned" / "config.json").read_text()); cfg["unlearn"]["tune_prune"] = True
    (tmp_path / "pruned" / "config.json").write_text(json.dumps(cfg))
    pruned = open_run("pruned", root=str(tmp_path))
    done = pruned.manifest["stages"]["tune_grad_diff"]["finished"]
    stage_tune(pruned, "grad_diff", grids["grad_diff"])
    assert open_run("pruned", root=str(tmp_path)).manifest["stages"]["tune_grad_diff"]["finished"] == done
    # each point's loop runs inside its own checkpointing block (point_<i>/checkpoints), as e03's runs do
    from lume_lab.unlearn import base as unlearn_base
    blocks, real = [], unlearn_base.checkpointing
    monkeypatch.setattr(unlearn_base, "checkpointing", lambda d, s: blocks.append(Path(d).parent.name) or real(d, s))
    g = stage_tune(pruned, "grad_ascent", {"lr": [1e-6, 3e-3]})
    assert g.point.tolist() == [0, 1] and g.op_status[1] != "not run" and g.lr.tolist() == [1e-6, 3e-3]
    ran = sorted(p.name for p in (tmp_path / "pruned" / "tune_grad_ascent").glob("point_*"))
    assert sorted(blocks) == ran and not list((tmp_path / "pruned" / "tune_grad_ascent").glob("point_*/checkpoints"))
    if g.op_status[1] == "not reached":         # the higher rate did not reach: the lower one is listed, not run
        assert g.op_status[0] == "not run: lr=0.003 did not reach" and ran == ["point_01"] and not g.eligible[0]
    else: assert ran == ["point_00", "point_01"] and not g.op_status[0].startswith("not run")
