"""Where each value of a resolved config comes from: `pipeline.orchestration.config.config_sources`.
It is what `lume-lab config` prints."""
import json

import pytest

from lume_lab.core.config import DEFAULT_PRESET, PRESETS, ConfigError, RunConfig, dotted_leaves, make_config
from lume_lab.pipeline.orchestration.config import config_report, config_sources, resolve_config
from lume_lab.unlearn.registry import BUILTIN_METHODS, get_spec

SET = {"unlearn.hparams.npo.beta": 0.5}


def _table(report: str) -> dict[str, list[str]]:
    "The `field | value | source` rows of a report, by field."
    lines = report.split("\n\n", 1)[1].splitlines()
    assert [c.strip() for c in lines[0].split(" | ")] == ["field", "value", "source"]
    return {r.split(" | ")[0].strip(): [c.strip() for c in r.split(" | ")[1:]] for r in lines[2:] if " | " in r}


def test_mini_with_one_set_value_names_three_sources():
    """mini + --set unlearn.hparams.npo.beta=0.5:
    a --set value, preset values, method-spec values and defaults, each right."""
    cfg, src = config_sources("mini", SET)
    assert cfg == resolve_config(make_config("mini", SET))                     # the config `lume-lab run` would write
    assert (src["unlearn.hparams.npo.beta"], cfg["unlearn.hparams.npo.beta"]) == ("--set", 0.5)
    default = dotted_leaves(RunConfig())
    # every preset value that is not a default
    for k, v in dotted_leaves(PRESETS["mini"]).items():
        if k not in default or v != default[k]: assert (src[k], cfg[k]) == ("preset mini", v), k
    row = PRESETS["mini"]["unlearn.hparams.npo"]
    # NPO's other values: mini's row or its spec's default
    for hp, v in get_spec("npo").resolve(row).items():
        if hp == "beta": continue
        want = "preset mini" if hp in row else "method spec npo"
        assert (src[f"unlearn.hparams.npo.{hp}"], cfg[f"unlearn.hparams.npo.{hp}"]) == (want, v), hp
    assert (src["unlearn.methods"], cfg.unlearn.methods) == ("method registry", list(BUILTIN_METHODS))
    assert {"--set", "preset mini", "method spec npo", "method registry"} <= set(src.values())


def test_only_values_that_differ_from_the_defaults_are_listed_unless_asked():
    cfg, src = config_sources("mini", SET)
    default, leaves = dotted_leaves(RunConfig()), dotted_leaves(cfg)
    assert set(src) == {k for k, v in leaves.items() if k not in default or default[k] != v}
    _, every = config_sources("mini", SET, all_fields=True)
    assert set(every) == set(leaves)
    untouched = [
        k for k in default if k not in PRESETS["mini"] and k not in ("preset", "seed") and not k.startswith("unlearn.")
    ]
    assert untouched and all(every[k] == "default" and leaves[k] == default[k] for k in untouched)


def test_seed_and_preset_sources():
    _, src = config_sources("smoke", seed=3)
    assert (src["seed"], src["preset"]) == ("--seed", "preset smoke")
    _, src = config_sources("olmo2-1b")
    assert src["unlearn.methods"] == "preset olmo2-1b"                         # the OLMo presets list their methods
    row = PRESETS["olmo2-1b"]["unlearn.hparams.simnpo"]
    # the preset file's row
    assert {src[f"unlearn.hparams.simnpo.{hp}"] for hp in row} == {"preset olmo2-1b"}
    assert {src[f"unlearn.hparams.simnpo.{hp}"] for hp in get_spec("simnpo").defaults if hp not in row} == {
        "method spec simnpo"
    }


def test_report_lists_the_users_values_first_and_counts_spec_defaults():
    out = config_report("mini", SET)
    cfg, src = config_sources("mini", SET)
    rows = _table(out)
    listed = {k for k, s in src.items() if not s.startswith("method spec")}
    # every non-default value but the spec's
    assert rows.keys() == listed
    assert next(iter(rows)) == "unlearn.hparams.npo.beta"                        # the user's value first
    assert rows["unlearn.hparams.npo.beta"] == ["0.5", "--set"]
    assert rows["pii.n_groups"] == [json.dumps(PRESETS["mini"]["pii.n_groups"]), "preset mini"]
    assert out.rstrip().endswith("--all lists every field)") and f"(and {len(src) - len(listed)} hyperparameters" in out
    every = _table(config_report("mini", SET, all_fields=True))
    assert every.keys() == config_sources("mini", SET, all_fields=True)[1].keys()


def test_bad_input_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="unknown hyperparameter.*'bta'.*allowed: "):
        config_sources("mini", {"unlearn.hparams.npo.bta": 0.5})
    with pytest.raises(ConfigError, match="preset must be one of mini, smoke"):
        config_sources("tiny")


def test_default_preset_is_mini():
    "One default preset: the CLI's, `make_config`'s and `config_sources`'."
    assert DEFAULT_PRESET == "mini" and make_config().preset == DEFAULT_PRESET
    assert config_sources()[0].preset == DEFAULT_PRESET


def test_cli_config_prints_the_values_and_three_sources(capsys):
    """`lume-lab config --preset mini --set unlearn.hparams.npo.beta=0.5`: the user's value first.
    `--all` every value, with its source."""
    from lume_lab.pipeline.orchestration.cli import main
    assert main(["config", "--preset", "mini", "--set", "unlearn.hparams.npo.beta=0.5"]) == 0
    rows = _table(capsys.readouterr().out)
    assert next(iter(rows)) == "unlearn.hparams.npo.beta" and rows["unlearn.hparams.npo.beta"] == ["0.5", "--set"]
    assert rows["inject.mask_fraction"] == [json.dumps(PRESETS["mini"]["inject.mask_fraction"]), "preset mini"]
    assert main(["config", "--preset", "mini", "--set", "unlearn.hparams.npo.beta=0.5", "--all"]) == 0
    rows = _table(capsys.readouterr().out)
    assert rows["unlearn.hparams.npo.gamma"] == [json.dumps(get_spec("npo").defaults["gamma"]), "method spec npo"]
    cfg = resolve_config(make_config("mini", SET))
    assert {k: json.loads(v[0]) for k, v in rows.items()} == dotted_leaves(cfg)   # every value of the resolved config


def test_cli_config_refuses_a_bad_field(capsys):
    from lume_lab.pipeline.orchestration.cli import main
    assert main(["config", "--preset", "mini", "--set", "unlearn.hparams.npo.bta=0.5"]) == 2
    err = capsys.readouterr().err
    assert "bta" in err and "allowed:" in err and "beta" in err
