"""Run a smoke run up to its masked injection, checkpointing every `argv[4]` seconds, adopting finished stages from the
run ids after it (used as a subprocess by tests/test_pipeline.py)."""
import json, sys
import lume_lab.pipeline.stages.testbed as testbed
from lume_lab.core.config import make_config
from lume_lab.core.store import open_run
from lume_lab.pipeline.orchestration.config import resolve_config
from lume_lab.pipeline.stages.base import prepare_base, stage_pii

root, run_id, overrides, testbed.INJECT_CHECKPOINT_SECONDS = (
    sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4]))
store = open_run(run_id, resolve_config(make_config("smoke", overrides)), root)
if sys.argv[5:]: store.set_reuse(sys.argv[5:])
prepare_base(store); stage_pii(store); testbed.stage_inject(store, masked=True)
print("stages done")
