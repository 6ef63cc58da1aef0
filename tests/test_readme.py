"""README.md is the front door: short, naming only runs `make run` creates, and its worked examples run as written."""
import re, subprocess, sys, textwrap
from pathlib import Path
from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    "The text of README's `## title` section."
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert m, f"README has no section '## {title}'"
    return m.group(1)


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_readme_is_a_front_door():
    assert len(README.splitlines()) <= 300, f"README.md has {len(README.splitlines())} lines (≤ 300)"
    heads = [l[3:] for l in README.splitlines() if l.startswith("## ")]
    assert heads[0] == "Quick start", heads          # the first section a newcomer reads is how to start
    for h in ("The experiments", "Concepts", "Extending", "Read it as a tutorial", "Layout", "Known limits"):
        assert h in heads, h
    assert "make run PRESET=smoke" in _section("Quick start") and "runs/smoke/report/index.html" in _section(
        "Quick start"
    )


def test_readme_names_only_runs_make_run_creates():
    "Run directories named in README: `make run` makes runs/<preset>/ (mini by default, smoke with PRESET=smoke)."
    named = set(re.findall(r"runs/([A-Za-z0-9_.=-]+)/", README))
    assert named <= {"mini", "smoke"}, sorted(named - {"mini", "smoke"})
    for m in re.findall(r"--reuse ((?:[A-Za-z0-9_-]+ ?)+)", README):
        names = {n for n in m.split() if not n.isupper()}          # `--reuse RUN ...`: the placeholder, not a run
        assert names <= {"mini", "smoke"}, m


def test_readme_links_resolve():
    "Every relative link of README points at a file or folder of the repository."
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if "://" in target: continue
        assert (ROOT / target).exists(), f"README links {target}, which does not exist"


def test_readme_reading_order_lists_every_library_notebook():
    "The tutorial's reading order names every library notebook (by its NN_topic stem, and a sub-folder by its path)."
    order = _section("Read it as a tutorial")
    nbs = ROOT / "nbs"
    lib = [
        p.relative_to(nbs)
        for p in sorted(nbs.rglob("[0-9]*.ipynb"))
        if p.relative_to(nbs).parts[0] != "experiments"
        and not any(q.startswith(("_", ".")) for q in p.relative_to(nbs).parts)
    ]
    assert any(len(p.parts) > 2 for p in lib), "no notebook in a sub-folder found: the walk is not recursive"
    missing = [
        p.as_posix()
        for p in lib
        if p.stem not in order or (len(p.parts) > 2 and f"{p.parent.as_posix()}/" not in order)
    ]
    assert not missing, missing


def test_readme_extending_examples_run(tmp_path):
    """The method, metric and experiment examples, exactly as README prints them, in a fresh interpreter; the
    experiment's section on the page of a run made for it: "not yet run" while e12 is to come, its table once e12 wrote
    its CSV; the metric's one declaration puts its column in the scorecard (scorecard.csv and the page's table, under
    its label)."""
    blocks = _python_blocks(_section("Extending"))
    assert len(blocks) == 3, len(blocks)
    # the prose names where metrics are declared
    from lume_lab.pipeline.presentation.scorecard import register_metric
    metric = _section("Extending").split("**Add a metric**")[1].split("**Add an experiment**")[0]
    assert f"`register_metric` in `{register_metric.__module__}`" in metric and metric.count("register_metric(") == 1
    check = textwrap.dedent("""
        import math, torch
        from lume_lab.unlearn.registry import get_spec
        from lume_lab.core.config import make_config
        from lume_lab.pipeline.orchestration.config import resolve_config
        spec = get_spec("toy_shrink")                                   # registered by the method example
        cfg = resolve_config(make_config("smoke", {"unlearn.methods": ["toy_shrink"]}))
        # beside the auxiliary methods' rows
        assert cfg.unlearn.hparams["toy_shrink"] == {"amount": 0.5}, cfg.unlearn.hparams
        try: spec.resolve({"amount": 2.0}); raise SystemExit("amount=2 was accepted")
        except ValueError as e: assert "amount" in str(e)
        w = model.model.layers[0].mlp.down_proj.weight.detach().clone()
        out, log = spec.fn(model, tok, forget, retain, spec.resolve({"amount": 0.25}))
        assert torch.equal(out.model.layers[0].mlp.down_proj.weight, w * 0.75)
        assert math.isfinite(gap) and nll_gap(model, tok, forget, forget) == 0.0    # the metric example's value
        import re, sys
        from lume_lab.pipeline.orchestration.config import open_experiment
        from lume_lab.pipeline.presentation.report import read_html_tables, write_report
        # a run made for the example, no experiment run yet
        store = open_experiment("readme", sys.argv[1], "smoke")
        section = lambda page: page.split("<h2>NLL gap (e12)</h2>")[1].split("<h2>")[0]
        assert "e12_gap: not yet run" in section(write_report([store.dir], pending=["e12_gap"]).read_text())
        assert "NLL gap (e12)" not in write_report([store.dir]).read_text()       # neither run nor to come: no section
        want = nll_gap(model, tok, forget, retain)                      # the model as the method check left it
        run_e12(store, model, tok, forget, retain)
        shown = section(write_report([store.dir]).read_text())
        assert "not yet run" not in shown
        t = read_html_tables(shown)[0]
        assert (list(t.columns) == ["field", "method", "nll_gap"]
                and abs(float(t.at[0, "nll_gap"]) - want) < 1e-9), (t, want)
        # the metric example's one declaration: the scorecard's last metric column, read from the experiment's file,
        # on the page's scorecard table under its label and digits, and in scorecard.csv
        from lume_lab.pipeline.presentation.scorecard import SCORECARD_METRICS, scorecard
        assert list(SCORECARD_METRICS)[-1] == "nll_gap" and SCORECARD_METRICS["nll_gap"].label == "NLL gap"
        card = scorecard([store.dir])
        assert card.columns.tolist()[-2:] == ["nll_gap", "direction_mismatch"], card.columns.tolist()
        assert (card[["field", "method"]].values.tolist() == [["phone_number", "none"]]
                and abs(card.nll_gap.iat[0] - want) < 1e-12)
        page = (store.dir / "report" / "index.html").read_text()
        assert re.findall(r"<h2>([^<]+)</h2>", page)[0] == "Scorecard"   # no verdict metric: no verdict section
        sc = read_html_tables(page.split("<h2>Scorecard</h2>")[1].split("<h2>")[0])[0]
        assert (sc.columns.tolist() == ["method", "NLL gap", "direction mismatch"]
                and sc.at[0, "NLL gap"] == f"{want:.2f}"), sc
        import pandas as pd
        assert abs(pd.read_csv(store.dir / "report" / "scorecard.csv").nll_gap.iat[0] - want) < 1e-12
        try: write_report_file(store, "gap.csv", t); raise SystemExit("a name no section declares was written")
        except ValueError as e: assert "nll_gap.csv" in str(e), e
        assert sorted(p.name for p in (store.dir / "report").iterdir()) == [
            "index.html", "nll_gap.csv", "report.md", "scorecard.csv"]
        print("ok")
    """)
    script = tmp_path / "readme_examples.py"
    script.write_text("\n".join(blocks) + check)
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs")], capture_output=True, text=True,
        timeout=HANG_TIMEOUT, cwd=ROOT
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-3000:]
