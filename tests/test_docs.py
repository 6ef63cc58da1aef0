"""`make docs`: every library notebook has a page linked from `_docs/index.html` in reading order; an executed page
carries its figures inline and fetches nothing from the network."""
import json
import re
import shutil
from pathlib import Path

from lume_lab.pipeline.presentation.docs import build_docs, remote_resources

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / "nbs"
# the tutorial's order (README "Read it as a tutorial"), then the machinery
ORDER = ["data", "models", "inject", "unlearn", "metrics", "analysis", "core", "pipeline"]


def _library() -> list[Path]:
    """Library notebooks found here, independently of the builder: every nbs/<area>/**/*.ipynb minus experiments and _/.
    names."""
    out = []
    for p in NBS.rglob("*.ipynb"):
        parts = p.relative_to(NBS).parts
        if parts[0] != "experiments" and not any(q.startswith(("_", ".")) for q in parts): out.append(p)
    return out


def _quiet(*a): pass


def test_every_library_notebook_has_a_page_linked_in_reading_order(tmp_path):
    lib = _library()
    areas = {p.relative_to(NBS).parts[0] for p in lib}
    assert len(lib) >= 40 and areas == set(ORDER), f"areas {areas - set(ORDER)} need a place in the reading order"
    assert any(len(p.relative_to(NBS).parts) > 2 for p in lib)        # pipeline's sub-folders are walked too
    # one executed experiment in a fake run: its page is the run's copy, linked from the experiments list
    run_nb = tmp_path / "runs" / "mini" / "notebooks" / "e00_base.ipynb"; run_nb.parent.mkdir(parents=True)
    shutil.copy(NBS / "experiments" / "e00_base.ipynb", run_nb)
    out = tmp_path / "_docs"
    built = build_docs(out, execute=False, workers=2, runs_dir=tmp_path / "runs", log=_quiet)

    lib_pages = [p for p in built if p.area != "runs"]
    assert sorted(Path(p.src) for p in lib_pages) == sorted(lib)
    assert all(p.status == "rendered" and not p.error for p in built), [p for p in built if p.status != "rendered"]
    expected = sorted((p.relative_to(NBS).with_suffix(".html").as_posix() for p in lib),
                      key=lambda h: (ORDER.index(h.split("/")[0]), h))
    index = (out / "index.html").read_text()
    links = re.findall(r'<a href="([^"]+)">', index)
    assert [h for h in links if h in expected] == expected          # every page linked, once, in reading order
    for h in expected:
        page = (out / h).read_text()
        up = "../" * h.count("/")                                      # pipeline/stages/00_base.html: ../../index.html
        assert "jp-Notebook" in page and f'<a href="{up}index.html">' in page, h
    # the headings of the tutorial: the six areas numbered in order, then the machinery, then the experiments
    heads = [index.index(f'<h2 id="{a}">{i}. {a}') for i, a in enumerate(ORDER[:6], 1)]
    assert heads == sorted(heads) and heads[-1] < index.index('id="machinery"') < index.index('id="experiments"')
    assert 'href="runs/mini/e00_base.html">mini</a>' in index and (out / "runs" / "mini" / "e00_base.html").exists()
    # a title and summary from each notebook's first markdown cell
    first = json.loads((NBS / "inject" / "00_masks.ipynb").read_text())["cells"][0]["source"][0].lstrip("# ").strip()
    assert f'href="inject/00_masks.html">{first}</a>' in index


def test_executed_page_embeds_its_figures_and_needs_no_network(tmp_path):
    nb = NBS / "inject" / "00_masks.ipynb"        # small, no slow cells, one seaborn figure
    out = tmp_path / "_docs"
    built = build_docs(out, execute=True, notebooks=[nb], workers=1, runs_dir=tmp_path / "runs", log=_quiet)
    assert [(p.href, p.status, p.error) for p in built] == [("inject/00_masks.html", "executed", "")]
    page = (out / "inject" / "00_masks.html").read_text()
    assert "data:image/png;base64," in page
    assert remote_resources(page) == [] and not re.search(r"<script[^>]+src=", page)
    index = (out / "index.html").read_text()
    assert 'href="inject/00_masks.html"' in index and "(no page yet)" in index   # the others are listed, unbuilt
    assert remote_resources(index) == []
