"""A method registered in this file alone runs the smoke pipeline's unlearning, evaluation and localization stages."""
import json

import pandas as pd
import torch

from lume_lab.core.config import make_config
from lume_lab.core.store import open_run
from lume_lab.pipeline.orchestration.cli import parse_overrides
from lume_lab.pipeline.orchestration.config import resolve_config
from lume_lab.pipeline.stages.testbed import prepare_testbed
from lume_lab.pipeline.stages.unlearn import (
    stage_evaluate, stage_evaluate_before, stage_localization, stage_unlearn, unlearn_jobs)
from lume_lab.unlearn.registry import MethodSpec, register_method


SEEN = []   # the hyperparameters each call of the method's step received


def _shrink(model, tokenizer, forget, retain, hp, *, seed=0):
    "Toy 'unlearning': scale the MLP output weights of layer 0 by (1 - amount); log one row."
    SEEN.append(dict(hp))
    w = model.model.layers[0].mlp.down_proj.weight
    with torch.no_grad(): w.mul_(1 - hp["amount"])
    return model, pd.DataFrame([{"step": 0, "epoch": 0, "lr": 0.0, "loss": float("nan"), "forget_loss": float("nan"),
                                 "retain_loss": float("nan"), "forget_nll": float("nan"), "retain_nll": float("nan")}])


def _check(hp): return [] if 0 < hp["amount"] < 1 else [f"toy_shrink.amount must be in (0, 1), got {hp['amount']!r}"]


def test_toy_method_through_unlearn_evaluate_localization(tmp_path, monkeypatch):
    register_method(MethodSpec("toy_shrink", _shrink, {"amount": 0.5}, check=_check, grid={"amount": [0.1, 0.5]},
                               summary="scale layer-0 MLP output weights"))
    # the command line's own parser, then the one resolution: `--set unlearn.hparams.toy_shrink.amount=0.25`
    overrides = parse_overrides(["pretrain.steps=16", "pretrain.checkpoint_every=8", 'unlearn.methods=["toy_shrink"]',
                                 "unlearn.hparams.toy_shrink.amount=0.25"])
    cfg = resolve_config(make_config("smoke", overrides))
    # the run's value for the new method reached the resolved config
    assert cfg.unlearn.hparams["toy_shrink"] == {"amount": 0.25}
    store = open_run("toy", cfg, tmp_path)
    saved = json.loads((store.dir / "config.json").read_text())["unlearn"]["hparams"]["toy_shrink"]
    prepare_testbed(store)
    field = cfg.unlearn.forget_fields[0]
    assert unlearn_jobs(cfg) == [("toy_shrink", field, False), ("toy_shrink", field, True)]
    resolve_calls, real_resolve = [], MethodSpec.resolve
    monkeypatch.setattr(
        MethodSpec, "resolve", lambda self, hp=None: resolve_calls.append(self.name) or real_resolve(self, hp)
    )
    for m, f, ctl in unlearn_jobs(cfg): stage_unlearn(store, m, f, ctl)
    # the step of each run (masked, control) got config.json's row as it is
    assert SEEN == [saved, saved]
    # and the spec only checked it (one `run` each): the stage resolved nothing
    assert resolve_calls.count("toy_shrink") == 2
    metrics = pd.concat([stage_evaluate_before(store, field), stage_evaluate(store, "toy_shrink", field)])
    assert set(metrics.method) == {"none", "toy_shrink"} and metrics.value.notna().any()
    loc = stage_localization(store, field, ["toy_shrink"])
    assert set(loc.method) == {"toy_shrink"} and loc.applicable.all() and loc.auc.between(0, 1).all()
    done = store.manifest["stages"]
    assert all(
        done[s]["status"] == "done"
        for s in (
            f"unlearn_toy_shrink_{field}", f"unlearn_toy_shrink_{field}_control", f"evaluate_toy_shrink_{field}",
            f"localization_{field}")
    )
