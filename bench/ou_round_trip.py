"""open-unlearning's trainer and evaluator on a lume_lab export, scored here: the round-trip page.

`lume-lab export` writes the testbed, its splits and open-unlearning configs (one experiment per trainer, evaluation
configs `eval=lume_<field>`). open-unlearning's own `src/train.py` unlearns with each trainer, its `src/eval.py`
computes its metrics on each checkpoint, and `lume-lab score` scores the same checkpoint here. This script reads all of
that back and writes one page: per trainer our scorecard columns beside open-unlearning's metrics, the fetched commit of
open-unlearning and the diff of any local patch to it.

    .venv/bin/python bench/ou_round_trip.py --run RUNS_ROOT/RUN_ID --field FIELD --ou OPEN_UNLEARNING_CHECKOUT \
        [--ou-python OU_ENV/bin/python] [--name-prefix ou-] [--command "how it was made"] \
        [--out docs/results/open-unlearning-round-trip.md]

The checkpoints are read from the checkout's `saves/unlearn/lume_<run>_<method>_<field>`, open-unlearning's results
from `saves/eval/lume_<run>_<method>_<field>/TOFU_SUMMARY.json` (and `lume_<run>_base_<field>` for the testbed model
before unlearning), our results from the run's cached stages of `external:<prefix><method>` (nothing is computed
again: a stage that is not there is an error). The page names no path outside the repository.
"""
import argparse, datetime, json, platform, subprocess, sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lume_lab.pipeline.orchestration.export import OU_TRAINERS as TRAINERS  # noqa: E402  (method -> trainer, as exported)
# our scorecard columns on the page (pipeline.presentation.scorecard), in this order
OURS = ("forget_em", "retain_em", "forget_prob", "retain_prob", "forget_es", "utility_delta", "auc_forget")
# open-unlearning's metrics (configs/eval/lume_<field>.yaml) on the page, in this order
THEIRS = ("forget_exact_memorization", "retain_exact_memorization", "forget_Q_A_Prob", "retain_Q_A_Prob",
          "forget_extraction_strength", "forget_Q_A_ROUGE", "retain_Q_A_ROUGE", "forget_Truth_Ratio",
          "retain_Truth_Ratio", "mia_loss", "mia_min_k", "mia_zlib")
# (ours, theirs) that measure the same thing by name; the definitions differ (see the page's notes)
PAIRS = (("forget_em", "forget_exact_memorization"), ("retain_em", "retain_exact_memorization"),
         ("forget_prob", "forget_Q_A_Prob"), ("retain_prob", "retain_Q_A_Prob"),
         ("forget_es", "forget_extraction_strength"))
OU_PACKAGES = ("torch", "transformers", "tokenizers", "datasets", "accelerate", "hydra-core", "omegaconf",
               "rouge-score", "scipy", "scikit-learn", "numpy")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def task(run_id: str, what: str, field: str) -> str: return f"lume_{run_id}_{what}_{field}"


def our_rows(run_dir: Path, field: str, prefix: str) -> tuple[pd.DataFrame, dict, list[str]]:
    """Our scorecard columns per trainer (index: method; a trainer the run has not scored is left out), from the run's
    cached e03 and e04 stages of each checkpoint (a stage not done is an error: nothing is computed here), and the
    model before unlearning's Table 2 values (column -> value); the trainers whose REMIND and resurfacing stages are
    done too (a full `lume-lab score`)."""
    from lume_lab.core.store import open_run
    from lume_lab.metrics.evaluate import table2
    from lume_lab.pipeline.orchestration.score import score_row
    from lume_lab.pipeline.presentation.scorecard import metric_sources
    from lume_lab.pipeline.stages.external import external_source, scored_externals
    from lume_lab.pipeline.stages.unlearn import evaluate_source, localization_source, stage_evaluate_before
    store = open_run(run_dir.name, root=run_dir.parent)
    have, rows, full = set(scored_externals(store)), [], []
    for m in TRAINERS:
        name = f"{prefix}{m.replace('_', '-')}"
        if (name, field) not in have: continue
        src = external_source(store, name, field)
        if not all(store.is_done(src.result_stage(k)) for k in ("evaluate", "localization")): continue
        if all(store.is_done(src.result_stage(k)) for k in ("remind", "resurface")): full.append(m)
        # the page shows no REMIND or resurfacing column: those stages are not read
        rows.append(score_row(src.label, field, evaluate_source(store, src), localization_source(store, src), None,
                              None).assign(method=m))
    if not store.is_done(f"evaluate_none_{field}"):
        raise SystemExit(f"run {run_dir.name} has no evaluation of the testbed model on {field} (e03)")
    t = table2(stage_evaluate_before(store, field), by="model")
    before = {c: float(t.at[k, "none"]) for c, k in metric_sources("table2").items() if k in t.index}
    ours = pd.concat(rows).set_index("method") if rows else pd.DataFrame(columns=["method"]).set_index("method")
    return ours.reindex(list(TRAINERS)), before, full


def their_rows(ou: Path, run_id: str, field: str) -> tuple[pd.DataFrame, dict]:
    """open-unlearning's summary per trainer (index: method; empty where it did not evaluate), and the testbed model's
    before unlearning."""
    def read(what):
        p = ou / "saves" / "eval" / task(run_id, what, field) / "TOFU_SUMMARY.json"
        return json.loads(p.read_text()) if p.exists() else {}
    return pd.DataFrame({m: read(m) for m in TRAINERS}).T.reindex(columns=list(THEIRS)), read("base")


def training(ou: Path, run_id: str, field: str) -> pd.DataFrame:
    "Per trainer: optimizer steps, epochs, the last logged training loss and the trainer's wall-clock seconds."
    out = {}
    for m in TRAINERS:
        st = json.loads((ou / "saves" / "unlearn" / task(run_id, m, field) / "trainer_state.json").read_text())
        logs = st.get("log_history", [])
        loss = [h["loss"] for h in logs if "loss" in h]
        end = next((h for h in reversed(logs) if "train_runtime" in h), {})
        out[m] = {"class": TRAINERS[m], "steps": st.get("global_step"), "epochs": st.get("epoch"),
                  "last logged loss": loss[-1] if loss else float("nan"),
                  "train loss (mean)": end.get("train_loss", float("nan")),
                  "seconds": end.get("train_runtime", float("nan"))}
    return pd.DataFrame(out).T


def hyperparameters(run_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """Per trainer the run's resolved hyperparameters its experiment carries; and the trainers whose hyperparameters
    the run's config holds though the run never used them (added to it for the export, as the preset resolves them)."""
    from lume_lab.pipeline.orchestration.config import AUXILIARY_METHODS
    u = json.loads((run_dir / "config.json").read_text())["unlearn"]
    keys = ("lr", "epochs", "batch_size", "scheduler", "beta", "delta", "gamma", "alpha")
    hp = pd.DataFrame({m: {k: u["hparams"].get(m, {}).get(k, "") for k in keys} for m in TRAINERS}).T
    added = [m for m in TRAINERS if m not in (u.get("methods") or TRAINERS) and m not in AUXILIARY_METHODS]
    return hp, added


def versions(python: str | None) -> str:
    "The side environment's package versions, as `name version` pairs."
    if not python: return "not recorded"
    code = ("from importlib import metadata as m\nfor p in %r:\n    try: print(p, m.version(p))\n"
            "    except m.PackageNotFoundError: pass\nimport platform; print('python', platform.python_version())"
            % (OU_PACKAGES,))
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return ", ".join(r.stdout.split("\n")[:-1]).replace("\n", ", ")


def fmt(v, digits: int) -> str:
    if isinstance(v, str): return v
    return "" if v is None or v != v else f"{v:.{digits}f}"


def table(df: pd.DataFrame, digits: dict | int) -> list[str]:
    cols = list(df.columns)
    d = (lambda c: digits.get(c, 3)) if isinstance(digits, dict) else (lambda c: digits)
    lines = ["| " + " | ".join([df.index.name or "", *cols]) + " |", "|" + "---|" * (len(cols) + 1)]
    for i, r in df.iterrows(): lines.append("| " + " | ".join([str(i), *(fmt(r[c], d(c)) for c in cols)]) + " |")
    return lines


def page(a) -> str:
    from lume_lab.core.store import machine_info, package_versions
    from lume_lab.pipeline.presentation.scorecard import SCORECARD_METRICS
    run_dir, ou = Path(a.run).resolve(), Path(a.ou).resolve()
    run_id = run_dir.name
    ours, before, full = our_rows(run_dir, a.field, a.name_prefix)
    scored = [m for m in TRAINERS if not ours.loc[m].isna().all()]
    partial = [m for m in scored if m not in full]
    theirs, base = their_rows(ou, run_id, a.field)
    train = training(ou, run_id, a.field)
    hp, added = hyperparameters(run_dir)
    hp.index.name = "trainer"
    missing = [f"{what}: {', '.join(m for m in TRAINERS if df.loc[m].isna().all())}"
               for what, df in (("not scored here", ours.reindex(columns=list(OURS))),
                                ("not evaluated by open-unlearning", theirs)) if df.isna().all(axis=1).any()]
    head, subject, when = git(ou, "rev-parse", "HEAD"), git(ou, "log", "-1", "--format=%s"), git(ou, "log", "-1",
                                                                                                  "--format=%cI")
    diff = git(ou, "diff", "HEAD", "--", ".")
    untracked = [p for p in git(ou, "ls-files", "--others", "--exclude-standard").splitlines()
                 if not p.startswith("saves/")]
    commit = git(ROOT, "rev-parse", "--short", "HEAD")
    label = lambda c: SCORECARD_METRICS[c].label
    digits = {label(c): SCORECARD_METRICS[c].digits for c in OURS}
    o = ours.reindex(columns=list(OURS)).astype(float)
    o.loc["before (testbed model)"] = [before.get(c, float("nan")) for c in OURS]
    o = o.rename(columns=label)
    o.index.name = "trainer"
    t = theirs.astype(float)
    t.loc["before (testbed model)"] = [base.get(c, float("nan")) for c in THEIRS]
    t.index.name = "trainer"
    side = pd.DataFrame(index=o.index)
    for us, them in PAIRS:
        side[f"{label(us)} (ours, %)"] = o[label(us)]
        side[f"{them} (theirs, ×100)"] = t[them] * 100
    side.index.name = "trainer"
    ci = ours.reindex(columns=["auc_forget_ci", "auc_forget_reading"]).fillna("")
    ci.columns = ["AUC m^F interval", "reading"]
    ci.index.name = "trainer"
    train.index.name = "trainer"
    lines = [
        "# open-unlearning round trip: its trainers and evaluator on a lume_lab export",
        "",
        f"Generated by `bench/ou_round_trip.py` at commit {commit} on {datetime.date.today()} "
        f"({platform.system()} {platform.machine()}); regenerate it, do not edit it.",
        "",
        f"- **Command**: `{a.command or 'not recorded'}`",
        f"- **Commit** (lume_lab, this page): `{commit}`; the run was made at "
        f"`{(json.loads((run_dir / 'manifest.json').read_text()).get('git_commit') or 'not recorded')[:7]}`",
        f"- **Date**: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- **Machine**: {machine_info()}; CPU only",
        f"- **Run**: `{run_id}` (preset `{json.loads((run_dir / 'config.json').read_text())['preset']}`), forget field "
        f"`{a.field}`; every checkpoint scored here as `external:{a.name_prefix}<method>`",
        f"- **open-unlearning**: commit `{head}` ({when[:10]}, \"{subject}\"), fetched, never committed here; its "
        f"environment: {versions(a.ou_python)}",
        f"- **lume_lab's environment**: " + ", ".join(f"{k} {v}" for k, v in package_versions().items() if v),
        *([f"- **Missing when this page was generated**: {'; '.join(missing)}"] if missing else []),
        "",
        "## Side by side",
        "",
        "The same checkpoints, the metrics of the same name: ours in percent, open-unlearning's fractions times 100. "
        "Their per-row definitions are the same; the tokenization of the answer and the averaging are each "
        "framework's own (see the notes below).",
        "",
        *table(side, 1),
        "",
        "## Ours: `lume-lab score` on each checkpoint",
        "",
        *([f"Scored by `lume-lab score`'s stages up to e04 (the checkpoint's import, Table 2, localization) for "
           f"{', '.join(partial)}; its REMIND (e05) and resurfacing (e06) stages were not run for "
           f"{'them' if len(partial) > 1 else 'it'} (this page shows neither).", ""] if partial else []),
        *table(o, digits),
        "",
        *table(ci, 3),
        "",
        "## open-unlearning's evaluator on each checkpoint (`eval=lume_" + a.field + "`)",
        "",
        *table(t, 3),
        "",
        "## open-unlearning's training (`src/train.py`, `experiment=unlearn/lume/" + a.field + "_<method>`)",
        "",
        *table(hp.astype(str).replace("nan", ""), 0),
        "",
        *([f"The run itself never resolved {', '.join(added)}: their hyperparameters were added to its "
           "`config.json` for the export, as its preset resolves them (the export reads only resolved "
           "hyperparameters)."] if added else []),
        "",
        *table(train, {"steps": 0, "epochs": 1, "last logged loss": 4, "train loss (mean)": 4, "seconds": 1}),
        "",
        "## Notes",
        "",
        "- Ours are e03's Table 2 values (`metrics.evaluate`) and e04's localization: EM the share of answer tokens "
        "whose teacher-forced argmax is the gold token, ES 1 − k/|y| for the shortest gold prefix k from which the "
        "rest is reproduced, Prob exp(mean log p) over the answer tokens, utility Δ the multiple-choice accuracy "
        "change against the testbed model, AUC m^F the localization AUC of |Δθ| against the forget groups' "
        "ground-truth mask.",
        "- open-unlearning's `*_exact_memorization`, `*_extraction_strength` and `*_Q_A_Prob` have the same per-row "
        "definitions, read on its own tokenization of the row (the chat template's labels, the end-of-sequence "
        "token counted as part of the answer) and averaged over rows; its ES is at least 1/|y| where no suffix is "
        "reproduced (ours: 0). `*_Q_A_ROUGE` is ROUGE-L recall of the greedy answer, the truth ratio compares the "
        "answer with five wrong values of the same field (forget: `closer_to_1_better`; retain: `true_better`), "
        "and `mia_*` are the loss, min-k and zlib membership attacks' AUC of forget against holdout. The truth "
        "ratio's correct answer is `answer`: a PII value has no paraphrase. Forget quality and privleak need a "
        "retain model's logs, which the testbed has none of.",
        "- open-unlearning batches and shuffles on its own, so its steps are not bitwise ours; the hyperparameters "
        "are lume_lab's resolved ones for the matching method (the export's experiment files).",
        "",
        "## The local patch to open-unlearning",
        "",
        ("What was changed in the fetched checkout to run it on CPU, without deepspeed or lm-eval, under "
         "transformers " + ("4.51.3" if "4.51.3" in versions(a.ou_python) else "4") + ":" if diff
         else "None: the fetched commit ran as it is."),
        "",
        *(["```diff", diff, "```", ""] if diff else []),
        "The export's configs, copied into its `configs/` (untracked there): "
        + (", ".join(f"{n} under `{d}/`" for d, n in sorted(pd.Series([str(Path(p).parent) for p in untracked])
                                                            .value_counts().items())) if untracked else "none") + ".",
        "",
    ]
    text = "\n".join(lines)
    for outside in {str(ou), str(run_dir.parent)}:
        if outside in text: raise SystemExit(f"the page would name a path outside the repository: {outside}")
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="the scored run directory (RUNS_ROOT/RUN_ID)")
    p.add_argument("--field", required=True, help="the forget field the checkpoints unlearned")
    p.add_argument("--ou", required=True, help="the open-unlearning checkout that trained and evaluated")
    p.add_argument("--ou-python", default=None, help="its environment's python (package versions for the header)")
    p.add_argument("--name-prefix", default="ou-", help="the checkpoints' names in the run: PREFIX<method, '-'>")
    p.add_argument("--command", default=None, help="how the checkpoints were made and scored, for the header")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "open-unlearning-round-trip.md"))
    a = p.parse_args(argv)
    text = page(a)
    Path(a.out).write_text(text)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
