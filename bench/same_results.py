"""Did a code change leave a run's results alone? Compare two run directories stage by stage, file by file.

A refactoring that must not change behaviour (declared cache keys instead of hand-built ones, one config resolution
instead of four) is checked by running the same slice of the pipeline with the old code and with the new one, at one
thread count, and comparing what each stage wrote. Every file of every stage done in both runs is compared byte for
byte; a CSV that differs is compared again as numbers, to say how far apart the two are. A third run directory can be
given with `--migrated`: a copy of the old run opened by the new code (`lume-lab run` on it), whose manifest says which
stages the key migration adopted and which it computed again.

    .venv/bin/python bench/same_results.py OLD_RUN NEW_RUN [--migrated MIGRATED_RUN] [--only e03 e04]
        [--command "how the runs were made"] [--out docs/results/<page>.md]

Only stages whose files are results are compared by default (`--stages`: a regex on the stage name); model weights
are compared too when `--weights` is given (slow, large).
"""
import argparse, datetime, hashlib, io, json, platform, re, subprocess, sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = (".safetensors", ".bin", ".pt")
CLOCK_COLUMNS = {"seconds", "elapsed", "time"}   # wall-clock columns: they differ between any two runs


def digest(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""): h.update(block)
    return h.hexdigest()


def csv_gap(a: Path, b: Path) -> str:
    "How two CSVs that are not byte-identical differ: shape, columns, or the largest absolute numeric difference."
    try: x, y = pd.read_csv(a), pd.read_csv(b)
    except Exception as e: return f"unreadable: {e}"
    if list(x.columns) != list(y.columns): return f"columns differ: {sorted(set(x.columns) ^ set(y.columns))}"
    if x.shape != y.shape: return f"shape {x.shape} vs {y.shape}"
    num = x.select_dtypes("number").columns
    gaps = (x[num] - y[num]).abs().max() if len(num) else pd.Series(dtype=float)
    text = [c for c in x.columns if c not in num and not x[c].astype(str).equals(y[c].astype(str))]
    moved = ", ".join(f"{c} {g:.3g}" for c, g in gaps[gaps > 0].items())
    if moved and set(gaps[gaps > 0].index) <= CLOCK_COLUMNS and not text: return f"wall-clock only (max abs Δ {moved})"
    return (f"max abs Δ: {moved}" if moved else "numbers equal") + (f"; text columns differ: {text}" if text else "")


def path_only(a: Path, b: Path, old: Path, new: Path) -> str:
    "'only the run's own path' when two text files differ just by naming their run directories (an adapter's base)."
    try: x, y = a.read_text(), b.read_text()
    except (UnicodeDecodeError, OSError): return ""
    return "only the run's own path" if x.replace(str(old.resolve()), str(new.resolve())) == y else ""


def compare(old: Path, new: Path, stages: str, weights: bool) -> pd.DataFrame:
    mo, mn = (json.loads((r / "manifest.json").read_text())["stages"] for r in (old, new))
    rows = []
    for name in mo:
        if not re.search(stages, name) or mo[name].get("status") != "done" or mn.get(name, {}).get("status") != "done":
            continue
        files = sorted({p.relative_to(old / name) for p in (old / name).rglob("*") if p.is_file()} |
                       {p.relative_to(new / name) for p in (new / name).rglob("*") if p.is_file()})
        for f in files:
            if f.suffix in WEIGHTS and not weights: continue
            a, b = old / name / f, new / name / f
            if not (a.exists() and b.exists()):
                rows.append((name, str(f), "only in " + ("new" if b.exists() else "old"), ""))
                continue
            same = digest(a) == digest(b)
            how = "" if same else csv_gap(a, b) if f.suffix == ".csv" else path_only(a, b, old, new)
            rows.append((name, str(f), "identical" if same else "differs", how))
    for f in sorted({p.name for r in (old, new) for p in (r / "report").glob("*.csv")}):   # the report's tables
        a, b = old / "report" / f, new / "report" / f
        if not (a.exists() and b.exists()):
            rows.append(("report", f, "only in " + ("new" if b.exists() else "old"), "")); continue
        same = digest(a) == digest(b)
        rows.append(("report", f, "identical" if same else "differs", "" if same else csv_gap(a, b)))
    return pd.DataFrame(rows, columns=["stage", "file", "bytes", "how far"])


def migration(run: Path) -> pd.DataFrame:
    """Per stage of a migrated run: `adopted` under its declared key, `pending` (verified, not asked for since),
    `unverified`, or `-` (computed by the new code). `seconds`: what computing it took, when it was computed."""
    m = json.loads((run / "manifest.json").read_text())
    rows = [(n, e.get("migration", "-"), e.get("status"), e.get("seconds")) for n, e in m["stages"].items()]
    return pd.DataFrame(rows, columns=["stage", "migration", "status", "seconds"])


def md(df: pd.DataFrame) -> str:
    if df.empty: return "(none)\n"
    out = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    out += ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path); ap.add_argument("new", type=Path)
    ap.add_argument("--migrated", type=Path, nargs="+", default=[],
                    help="copies of old runs, run again by the new code: their manifests say what was adopted")
    ap.add_argument(
        "--stages",
        default=r"^(testbed|forget_fields|evaluate_|localization_|extraction_|reachability_|utility_)",
        help="regex on stage names whose files are compared",
    )
    ap.add_argument("--weights", action="store_true", help="compare model weights too")
    ap.add_argument("--command", default="", help="how the two runs were made, for the page")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    cmp_ = compare(a.old, a.new, a.stages, a.weights)
    n_same = int((cmp_["bytes"] == "identical").sum())
    print(f"{n_same} of {len(cmp_)} files identical in {cmp_['stage'].nunique()} stages")
    print(cmp_[cmp_["bytes"] != "identical"].to_string(index=False) if n_same < len(cmp_) else "every file identical")
    migs = {r: migration(r) for r in a.migrated}
    for r, mig in migs.items():
        print(r, mig["migration"].value_counts().to_dict())
    if a.out:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty=+dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        page = [f"# Same results before and after: {a.old.name} vs {a.new.name}\n",
                f"Generated by `bench/same_results.py` at commit {commit} on {datetime.date.today()} "
                f"({platform.system()} {platform.machine()}); regenerate it, do not edit it.\n",
                f"- **Runs**: {a.command}" if a.command else "",
                f"- **Compared**: every file of every stage matching `{a.stages}` done in both runs, and the CSVs "
                "of their `report/`"
                + (", model weights included" if a.weights else ", model weights left out") + ".\n",
                f"## Files\n\n{n_same} of {len(cmp_)} files identical in {cmp_['stage'].nunique()} stages.\n",
                md(cmp_[cmp_["bytes"] != "identical"]) if n_same < len(cmp_) else "Every file identical.\n",
                "<details><summary>Every file compared</summary>\n\n" + md(cmp_) + "\n</details>\n"]
        for r, mig in migs.items():
            counts = mig["migration"].value_counts().to_dict()
            page += [f"## The key migration on a copy of `{a.old.name}`: `{r.name}`\n",
                     "The old run copied, then run again by the new code with the same command: each stage the old "
                     "code had finished is adopted under its declared key (`adopted`), or computed again "
                     "(`unverified`, or no entry).\n",
                     "Counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + ".\n", md(mig)]
        a.out.write_text("\n".join(p for p in page if p != "") + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
