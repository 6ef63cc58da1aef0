"Run the first three stages of a smoke run (used as a subprocess by tests/test_pipeline.py)."
import json, sys
from lume_lab.core.config import make_config
from lume_lab.core.store import open_run
from lume_lab.pipeline.orchestration.config import resolve_config
from lume_lab.pipeline.stages.base import stage_world, stage_tokenizer, stage_base

root, run_id, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
store = open_run(run_id, resolve_config(make_config("smoke", overrides)), root)
stage_world(store); stage_tokenizer(store); stage_base(store)
print("stages done")
