"""A run with `unlearn.controls=false` builds no unmasked control model: e02 trains the masked model only, the stages
that read the control leave it out, an export has no `model_control/`, `score --control` is refused, and a later run
with controls on adopts every masked stage (`--reuse`) and adds only the control."""
import json

import pandas as pd
import pytest

from lume_lab.core.store import open_run
from lume_lab.pipeline.orchestration.cli import main

FIELD = "phone_number"
CONTROL_STAGES = ("inject_unmasked", "instruct_unmasked", "extraction_instruct_unmasked",
                  "reachability_instruct_unmasked", "utility_unmasked")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    "The smoke testbed (e00–e02) without controls, then the same seed with controls on, reusing it."
    root = tmp_path_factory.mktemp("controls")
    base = ["run", "--preset", "smoke", "--runs-root", str(root), "--only", "e00", "e01", "e02"]
    assert main(base + ["--run-id", "off", "--set", "unlearn.controls=false"]) == 0
    # the control is shorter than the masked injection (inject.control_steps): only the control reads it
    assert main(base + ["--run-id", "on", "--set", "inject.control_steps=2", "--reuse", "off"]) == 0
    return root


def test_no_control_model_and_no_control_rows(runs):
    run = runs / "off"
    stages = json.loads((run / "manifest.json").read_text())["stages"]
    assert {"inject_masked", "instruct_masked", "testbed"} <= set(stages)
    assert not set(CONTROL_STAGES) & set(stages) and not any((run / s).exists() for s in CONTROL_STAGES)
    rep = run / "report"
    assert set(pd.read_csv(rep / "extraction_rates.csv").model) == {"masked"}
    assert set(pd.read_csv(rep / "utility_injection.csv").model) == {"base", "masked"}
    reach = pd.read_csv(rep / "reachability.csv")
    assert set(reach.model) <= {"masked"}
    # every later experiment prepares the testbed first: without a control model
    from lume_lab.pipeline.stages.testbed import prepare_testbed
    prepare_testbed(open_run("off", root=runs))
    assert not any((run / s).exists() for s in CONTROL_STAGES)
    # REMIND compares no control model
    from lume_lab.pipeline.stages.remind import remind_models
    assert "none_control" not in remind_models(open_run("off", root=runs), FIELD)
    assert "none_control" in remind_models(open_run("on", root=runs), FIELD)


def test_a_later_run_with_controls_adopts_the_masked_stages(runs):
    on = json.loads((runs / "on" / "manifest.json").read_text())["stages"]
    for s in ("masks", "inject_masked", "instruct_masked", "testbed"):
        assert on[s].get("reused_from", "").endswith("off"), (s, on[s])
    for s in ("inject_unmasked", "instruct_unmasked"):
        assert on[s]["status"] == "done" and "reused_from" not in on[s], (s, on[s])
    assert len(pd.read_csv(runs / "on" / "inject_unmasked" / "log.csv")) == 2          # inject.control_steps
    assert set(pd.read_csv(runs / "on" / "report" / "extraction_rates.csv").model) == {"masked", "unmasked"}


def test_export_has_no_control_and_score_refuses_one(runs, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", "off", "--out", str(out), "--runs-root", str(runs)]) == 0
    assert (out / "model").is_dir() and not (out / "model_control").exists()
    assert "no model_control/" in json.loads((out / "manifest.json").read_text())["model"]
    capsys.readouterr()
    args = ["score", "off", "--checkpoint", str(out / "model"), "--name", "copy",
            "--control", str(out / "model"), "--runs-root", str(runs)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--control" in err and "unlearn.controls=false" in err and "Traceback" not in err
    assert not list((runs / "off").glob("external_copy*"))
