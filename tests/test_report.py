"""The report page (`pipeline.report`): its tables equal the CSVs they come from, it is one offline file, sections follow the
stages present, seeds aggregate to mean ± std, and a failed write leaves the previous page intact."""
import json, re, shutil
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from lume_lab.pipeline import report as R, scorecard as S
from lume_lab.pipeline.cli import main
from report_checks import assert_fig3_table_matches, assert_report_matches_csvs, assert_self_contained, scorecard_tables

HERE = Path(__file__).parent
MINI = HERE / "data" / "mini_run"     # the CSVs, config and manifest (stage warnings dropped) of `make run`'s mini run, REMIND rows only
FIGURES = ["extraction_rates.png", "utility_injection.png", "unlearning_phone_number.png", "localization_email_address.png",
           "remind_phone_number.png", "resurfacing_leakage.png", "resurfacing_jaccard_email_address.png"]


def _png(path: Path, label: str):
    fig, ax = plt.subplots(figsize=(1.5, 1)); ax.set_title(label, fontsize=6); fig.savefig(path, dpi=40); plt.close(fig)


def _copy_run(dst: Path, seed: int | None = None) -> Path:
    shutil.copytree(MINI, dst)
    for name in FIGURES: _png(dst / "report" / name, name)
    if seed is not None:
        cfg = json.loads((dst / "config.json").read_text()); cfg["seed"] = seed
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _h2(page: str) -> list[str]:
    return re.findall(r"<h2>([^<]+)</h2>", page)


def test_mini_page_tables_equal_the_csvs(tmp_path):
    "Every scorecard value on the page and in scorecard.csv is the value in the run's CSV; figures inline; markdown twin written."
    run = _copy_run(tmp_path / "mini")
    page_path = R.write_report([run])
    assert page_path == run / "report" / "index.html"
    page = page_path.read_text()
    assert assert_self_contained(page) == len(FIGURES)
    assert assert_report_matches_csvs(run) > 300          # 2 fields × 11 methods × 9 output columns, AUCs, REMIND, leakage
    assert_fig3_table_matches(run)
    assert _h2(page) == ["Scorecard", "Data and base model", "Injection and memorization (Fig. 3)", "Unlearning (Fig. 4a)",
                         "Localization precision (Fig. 4b)", "REMIND: residual memorization", "Resurfacing attack (Fig. 5)", "The run"]
    card = pd.read_csv(run / "report" / "scorecard.csv")
    assert list(card.field.unique()) == ["phone_number", "email_address"]                    # the config's forget-field order
    assert card.method.tolist()[:3] == ["none", "grad_ascent", "grad_diff"] and (card.n_seeds == 1).all()
    assert not any(c.endswith("_std") for c in card.columns)                                 # one run: plain values
    # the markdown twin: same sections, figures by relative path to files that exist
    md = (run / "report" / "report.md").read_text()
    assert [l[3:] for l in md.splitlines() if l.startswith("## ")] == _h2(page)
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == len(FIGURES) and all((run / "report" / l).exists() for l in links)
    # run section: seed, commit and stage times from manifest.json, and the reproduce line
    man = json.loads((run / "manifest.json").read_text())
    assert man["git_commit"] in page and "lume-lab run --preset mini --seed 0 --run-id mini" in page
    times = R.stage_times(run).set_index("family").seconds
    assert times["unlearn"] == pytest.approx(sum(v["seconds"] for k, v in man["stages"].items() if k.startswith("unlearn_")))


def test_direction_marks_on_mini(tmp_path):
    "The mark names exactly the checks whose signs differ, recomputed here from the scorecard's own columns."
    run = _copy_run(tmp_path / "mini")
    card = S.scorecard([run]).set_index(["field", "method"])
    paper_rows = card.forget_em_paper.notna()
    assert paper_rows.sum() == 8                              # 4 paper methods × 2 fields
    assert (card.loc[~paper_rows, "direction_mismatch"] == "").all()
    for key, r in card[paper_rows].iterrows():
        want = [name for name, (a, b, tol) in S.DIRECTION_CHECKS.items()
                if not pd.isna(r.get(a)) and not pd.isna(r.get(f"{a}_paper"))
                and (not isinstance(b, str) or not (pd.isna(r.get(b)) or pd.isna(r.get(f"{b}_paper"))))
                and S.direction(r[a], r[b] if isinstance(b, str) else b, tol) != S.direction(r[f"{a}_paper"], r[f"{b}_paper"] if isinstance(b, str) else b, tol)]
        assert r.direction_mismatch == ", ".join(want), key
    # AlphaEdit on email: the paper's forget EM 63.2 > retain EM 58.8 (no selective forgetting); ours keeps retain above forget
    assert "EM" in card.at[("email_address", "alphaedit"), "direction_mismatch"].split(", ")


def test_seeds_mean_std_and_n(tmp_path):
    "Two seeds of one config: each cell the mean, `_std` the sample std, n_seeds 2; another config is refused."
    a, b = _copy_run(tmp_path / "s0"), _copy_run(tmp_path / "s1", seed=1)
    t2 = b / "report" / "table2_phone_number.csv"
    t = pd.read_csv(t2, index_col=[0, 1]); t.loc[("forget", "em"), "npo"] += 6.0; t.to_csv(t2)
    card = S.scorecard([a, b]).set_index(["field", "method"])
    ref = pd.read_csv(a / "report" / "table2_phone_number.csv", index_col=[0, 1]).at[("forget", "em"), "npo"]
    assert card.at[("phone_number", "npo"), "forget_em"] == pytest.approx(ref + 3.0)
    assert card.at[("phone_number", "npo"), "forget_em_std"] == pytest.approx(np.std([ref, ref + 6.0], ddof=1))
    assert card.at[("phone_number", "npo"), "retain_em_std"] == 0 and (card.n_seeds == 2).all()
    with pytest.raises(ValueError, match="pass out_dir"): R.write_report([a, b])
    page = R.write_report([a, b], tmp_path / "seeds").read_text()
    cell = scorecard_tables(page)["phone_number"].at["npo", "forget EM"]
    assert cell == f"{ref + 3.0:.1f} ± {np.std([ref, ref + 6.0], ddof=1):.1f}"
    assert "lume-lab run --preset mini --seed 1 --run-id s1" in page
    other = _copy_run(tmp_path / "other")
    cfg = json.loads((other / "config.json").read_text()); cfg["inject"]["lr"] *= 2; (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="inject.lr"): S.scorecard([a, other])


def test_failed_render_leaves_previous_page(tmp_path, monkeypatch):
    "Everything is rendered before anything is written: a figure that cannot be read leaves the old page (or none), no temp file."
    run = _copy_run(tmp_path / "mini")
    before = {p.name: p.read_bytes() for p in [R.write_report([run]), run / "report" / "report.md", run / "report" / "scorecard.csv"]}
    def boom(path): raise OSError(f"cannot read {path}")
    monkeypatch.setattr(R, "_data_uri", boom)
    with pytest.raises(OSError): R.write_report([run])
    assert {n: (run / "report" / n).read_bytes() for n in before} == before
    with pytest.raises(OSError): R.write_report([run], tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists() or not any((tmp_path / "fresh").iterdir())
    assert not [p for p in (run / "report").iterdir() if p.name.startswith(".")]


def test_partial_smoke_run_gives_valid_page(tmp_path):
    "`lume-lab run --only e00 e01 e02 e99` on smoke: e99 writes a valid offline page with only the data, injection and run sections."
    args = ["run", "--preset", "smoke", "--run-id", "part", "--runs-root", str(tmp_path),
            "--set", "pretrain.steps=24", "--set", "pretrain.checkpoint_every=8", "--only", "e00", "e01", "e02", "e99"]
    assert main(args) == 0
    run = tmp_path / "part"
    assert (run / "notebooks" / "e99_report.ipynb").exists()
    page = (run / "report" / "index.html").read_text()
    assert assert_self_contained(page) >= 2                                  # Fig. 3a and 3b at least
    assert _h2(page) == ["Data and base model", "Injection and memorization (Fig. 3)", "The run"]
    assert "Scorecard" not in page and "<h3>" not in page
    assert_fig3_table_matches(run)
    assert pd.read_csv(run / "report" / "scorecard.csv").empty
    assert "lume-lab run --preset smoke --seed 0 --run-id part --set pretrain.checkpoint_every=8 --set pretrain.steps=24" in page
    assert [l[3:] for l in (run / "report" / "report.md").read_text().splitlines() if l.startswith("## ")] == _h2(page)


def test_page_of_a_run_without_outputs_says_so(tmp_path):
    "e99 on a run that has no experiment outputs yet writes a page that says so, not one that looks finished."
    from lume_lab.pipeline.report import EMPTY_NOTE, write_report
    run = tmp_path / "empty"; run.mkdir()
    for name in ("config.json", "manifest.json"): shutil.copy(MINI / name, run / name)
    page = write_report([run]).read_text()
    assert _h2(page)[0] == "No results yet" and EMPTY_NOTE.split(":")[0] in page
    assert "Scorecard" not in page and pd.read_csv(run / "report" / "scorecard.csv").empty
    full = write_report([_copy_run(tmp_path / "full")], tmp_path / "full_page").read_text()
    assert "No results yet" not in full
