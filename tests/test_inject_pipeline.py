"Cross-module tests of the injection pipeline pieces: mixture (02), instruction tuning (03), testbed (04)."
import dataclasses, math, random

import pandas as pd
import pytest
import torch
from datasets import Dataset, DatasetDict
from transformers import Olmo2ForCausalLM

from lume_lab.core.config import ConfigError, TARGET_FIELDS, make_config
from lume_lab.data.pii import pii_records
from lume_lab.inject.instruct import instruction_tune, train_val_split
from lume_lab.inject.mixture import injection_examples, mixture_table, neutral_share
from lume_lab.inject.testbed import (build_testbed, extraction_rates, extraction_table,
                                     memorized_profiles, retain_pairing, select_testbed, field_splits)
from lume_lab.models.lm import olmo2_config
from lume_lab.models.ops import generate_texts, reveals
from lume_lab.models.tokenizer import train_tokenizer

WORLD = ["Paris is the capital of France. It lies on the Seine.", "The Nile flows north through Egypt.",
         "Mount Fuji is the highest mountain in Japan."] * 100


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    "Tiny models run fastest single-threaded on these shared cores (thread oversubscription costs 10-30x)."
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def recs():
    return pii_records(make_config("smoke").pii, 0)


@pytest.fixture(scope="module")
def pii(recs):
    return DatasetDict({k: Dataset.from_list(v) for k, v in recs.items()})


@pytest.fixture(scope="module")
def tok(recs):
    texts = WORLD[:3] + [d["text"] for d in recs["documents"]] + [q["text"] for q in recs["qa_train"][:300]]
    return train_tokenizer(texts, 400)


def tiny_model(tok, layers=4, hidden=32, seed=0):
    cfg = olmo2_config(tokenizer=tok, hidden_size=hidden, num_layers=layers, num_heads=2, max_positions=256,
                       bos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return Olmo2ForCausalLM(cfg).eval()


# ---------------------------------------------------------------- mixture
@pytest.mark.parametrize("nf", [0.0, 0.3, 0.5, 0.75])
def test_mixture_neutral_fraction(pii, tok, nf):
    c = make_config("smoke", {"inject.neutral_fraction": nf}).inject
    ex = injection_examples(WORLD, pii, tok, c, seed=1)
    n_pii = sum(e["group"] >= 0 for e in ex)
    assert sum(e["group"] < 0 for e in ex) == round(nf / (1 - nf) * n_pii)
    assert abs(neutral_share(ex)["examples"] - nf) < 1.5 / len(ex) + 1e-9
    assert all(2 <= len(e["input_ids"]) <= c.seq_len for e in ex)
    n_eos = sum(e["input_ids"].count(tok.eos_token_id) for e in ex if e["group"] >= 0)
    # every PII text EOS-terminated once
    assert n_eos == len(pii["documents"]) + len(pii["qa_train"])


def test_mixture_never_mixes_groups(pii, tok):
    c = make_config("smoke").inject
    ex = injection_examples(WORLD, pii, tok, c, seed=0)
    name_group = {f"{p['first_name']} {p['last_name']}": p["group"] for p in pii["profiles"]}
    for e in ex:
        txt = tok.decode(e["input_ids"])
        seen = {g for n, g in name_group.items() if n in txt}
        assert seen <= ({e["group"]} if e["group"] >= 0 else set()), (e["group"], seen)
    # every PII token of the source is there exactly once (greedy packing drops nothing)
    n_tok = sum(
        len(tok(t, add_special_tokens=False)["input_ids"]) + 1
        for t in list(pii["documents"]["text"]) + list(pii["qa_train"]["text"])
    )
    tab = mixture_table(ex)
    assert tab[tab.group >= 0].tokens.sum() == n_tok
    assert set(tab[tab.group >= 0].source) == {"document", "qa"}


def test_mixture_deterministic_and_roles(pii, tok):
    c = make_config("smoke").inject
    a, b = injection_examples(WORLD, pii, tok, c, seed=3), injection_examples(WORLD, pii, tok, c, seed=3)
    assert a == b
    only = injection_examples(WORLD, pii, tok, c, seed=3, roles=["testbed"])
    assert sum(e["group"] >= 0 for e in only) < sum(e["group"] >= 0 for e in a)


def test_mixture_stream_replay(pii, tok):
    """neutral_replay='stream':
    one pass of steps × batch examples, every corpus block used before any repeats, PII in epochs."""
    from collections import Counter
    from lume_lab.inject.mixture import neutral_blocks
    world = [f"Box {i} holds {i * 7 % 101} red stones and {i % 13} blue ones." for i in range(300)]   # distinct blocks
    c = dataclasses.replace(make_config("smoke").inject, neutral_replay="fixed", batch_size=8, neutral_fraction=0.5)
    fixed = injection_examples(world, pii, tok, c, seed=1)
    n_pii = sum(e["group"] >= 0 for e in fixed)
    # ~2.5 passes over the PII
    c = dataclasses.replace(c, neutral_replay="stream", steps=math.ceil(2.5 * 2 * n_pii / 8))
    ex = injection_examples(world, pii, tok, c, seed=1)
    assert len(ex) == c.steps * c.batch_size
    assert ex == injection_examples(world, pii, tok, c, seed=1)                                  # seeded
    blocks = [tuple(b) for b in neutral_blocks(world, tok, c.seq_len, 10**4, seed=0)]
    corpus = set(blocks)
    neu = Counter(tuple(e["input_ids"]) for e in ex if e["group"] < 0)
    assert sum(neu.values()) == round(c.neutral_fraction * len(ex))
    assert set(neu) <= corpus
    n, B = sum(neu.values()), len(corpus)
    # the run needs more than one pass over the corpus
    assert n > B
    assert {neu.get(b, 0) for b in corpus} <= {n // B, n // B + 1}       # ... and uses each block ⌊n/B⌋ or ⌈n/B⌉ times
    pii_fixed = Counter(tuple(e["input_ids"]) for e in fixed if e["group"] >= 0)
    pii_stream = Counter(tuple(e["input_ids"]) for e in ex if e["group"] >= 0)
    assert set(pii_stream) == set(pii_fixed)                            # the same PII sequences, in whole epochs
    r = sum(pii_stream.values()) / sum(pii_fixed.values())
    assert all(math.floor(r) * k <= pii_stream[s] <= math.ceil(r) * k for s, k in pii_fixed.items())


def test_mixture_qa_resample(pii, tok):
    """qa_resample: pass 0 is qa_train.
    Every later pass asks each (profile, field) as often, in fresh training-template questions."""
    from collections import Counter
    from lume_lab.inject.mixture import _check_inject_cfg, resampled_qa
    world = [f"Box {i} holds {i * 7 % 101} red stones and {i % 13} blue ones." for i in range(300)]
    c = dataclasses.replace(make_config("smoke").inject, batch_size=8, neutral_fraction=0.5)
    n_pii = sum(e["group"] >= 0 for e in injection_examples(world, pii, tok, c, seed=1))
    # ~3.5 passes over the PII
    c = dataclasses.replace(c, neutral_replay="stream", steps=math.ceil(3.5 * 2 * n_pii / 8))
    plain = injection_examples(world, pii, tok, c, seed=1)
    r = dataclasses.replace(c, qa_resample=True)
    ex = injection_examples(world, pii, tok, r, seed=1)
    assert ex == injection_examples(world, pii, tok, r, seed=1) and len(ex) == len(plain)       # seeded, same length
    neu = lambda xs: Counter(tuple(e["input_ids"]) for e in xs if e["group"] < 0)
    # the same neutral blocks
    assert neu(ex) == neu(plain)
    docs = lambda xs: {tuple(e["input_ids"]) for e in xs if e["source"] == "document"}
    # documents are not redrawn
    assert docs(ex) == docs(plain)
    qa = lambda xs: {tuple(e["input_ids"]) for e in xs if e["source"] == "qa"}
    # > 2 passes of new questions
    assert len(qa(ex)) > 2 * len(qa(plain))
    trained = Counter((q["profile_id"], q["field"]) for q in pii["qa_train"])
    trained_text = {q["text"] for q in pii["qa_train"]}
    gold = {p["profile_id"]: p for p in pii["profiles"]}
    e1, e2 = resampled_qa(pii, 1, seed=1), resampled_qa(pii, 2, seed=1)
    # as many questions per pair
    assert Counter((q["profile_id"], q["field"]) for q in e1) == trained
    # each with its gold answer
    assert all(q["text"].endswith(" " + str(gold[q["profile_id"]][q["field"]])) for q in e1)
    assert all(q["group"] == gold[q["profile_id"]]["group"] for q in e1)                       # in its profile's group
    assert e1 == resampled_qa(pii, 1, seed=1) and e1 != e2
    assert len({q["text"] for q in e1} - trained_text) > 0.8 * len(e1)                          # nearly all new strings
    with pytest.raises(ConfigError, match="needs inject.neutral_replay='stream'"):
        _check_inject_cfg(dataclasses.replace(c, neutral_replay="fixed", qa_resample=True))
    with pytest.raises(ConfigError, match="inject.qa_resample must be true or false"):
        make_config("smoke", {"inject.qa_resample": "yes"})


def test_mixture_paraphrase_roles(pii):
    """paraphrase_roles: on a resampled pass the profiles of those roles are also asked in paraphrase templates, as
    often as their trained questions; the testbed's profiles never are, and the config refuses testbed or a missing
    qa_resample."""
    from collections import Counter
    from lume_lab.inject.mixture import _check_inject_cfg, resampled_qa
    para = ["instruct", "resurface", "validation"]
    base, e1 = resampled_qa(pii, 1, seed=1), resampled_qa(pii, 1, seed=1, paraphrase_roles=para)
    # the training-template questions unchanged
    assert e1[:len(base)] == base and all(not q["paraphrase"] for q in base)
    extra = e1[len(base):]
    role = {p["profile_id"]: p["role"] for p in pii["profiles"]}
    trained = Counter((q["profile_id"], q["field"]) for q in pii["qa_train"])
    assert {role[p] for p, _ in trained} >= {"testbed", *para}                      # the fixture has every role
    assert Counter((q["profile_id"], q["field"]) for q in extra) == +Counter(
        {k: n for k, n in trained.items() if role[k[0]] in para}
    )
    assert all(q["paraphrase"] for q in extra) and not {q["text"] for q in extra} & {q["text"] for q in base}
    gold = {p["profile_id"]: p for p in pii["profiles"]}
    assert all(
        q["text"].endswith(" " + str(gold[q["profile_id"]][q["field"]]))
        and q["group"] == gold[q["profile_id"]]["group"]
        for q in extra
    )
    only = resampled_qa(pii, 1, seed=1, paraphrase_roles=["validation"])[len(base):]
    assert only and {role[q["profile_id"]] for q in only} == {"validation"}
    assert resampled_qa(pii, 2, seed=1, paraphrase_roles=para)[len(base):] != extra  # redrawn every pass
    with pytest.raises(ValueError, match="never testbed"):
        resampled_qa(pii, 1, seed=1, paraphrase_roles=["testbed"])
    with pytest.raises(ConfigError, match="inject.paraphrase_roles must be null or a list"):
        make_config(
            "smoke",
            {"inject.neutral_replay": "stream", "inject.qa_resample": True, "inject.paraphrase_roles": ["testbed"]},
        )
    with pytest.raises(ConfigError, match="inject.paraphrase_roles needs inject.qa_resample=true"):
        make_config("smoke", {"inject.paraphrase_roles": ["instruct"]})
    c = make_config("smoke").inject
    # the config's rule, called by the mixture
    with pytest.raises(ConfigError, match="inject.paraphrase_roles needs inject.qa_resample=true"):
        _check_inject_cfg(dataclasses.replace(c, neutral_replay="stream", paraphrase_roles=["instruct"]))


def test_neutral_replay_validated():
    with pytest.raises(ConfigError, match="inject.neutral_replay must be one of fixed, stream"):
        make_config("smoke", {"inject.neutral_replay": "fresh"})
    with pytest.raises(ConfigError, match="inject.neutral_scope must be one of all, unowned"):
        make_config("smoke", {"inject.neutral_scope": "masks"})


def test_inject_reads_neutral_fields():
    """Both injections read the neutral and resampling fields at every value.
    The control reads no mask field, the masked model no control field."""
    from lume_lab.pipeline.stages.testbed import CONTROL_ONLY_FIELDS, MASK_ONLY_FIELDS, inject_reads
    c = make_config("smoke")
    masked, control = set(inject_reads(c, True)), set(inject_reads(c, False))
    shared = {
        f"inject.{k}" for k in ("neutral_replay", "qa_resample", "paraphrase_roles", "autocast", "steps", "lr")
    } | {"seed"}
    # read at their defaults too: no field is left out
    assert shared <= masked and shared <= control
    assert {f"inject.{k}" for k in MASK_ONLY_FIELDS} <= masked and not {
        f"inject.{k}" for k in MASK_ONLY_FIELDS
    } & control
    assert {f"inject.{k}" for k in CONTROL_ONLY_FIELDS} <= control and not {
        f"inject.{k}" for k in CONTROL_ONLY_FIELDS
    } & masked
    # the control trains every weight anyway
    assert "inject.neutral_scope" in masked and "inject.neutral_scope" not in control
    assert inject_reads(
        make_config("smoke", {"inject.qa_resample": True, "inject.neutral_replay": "stream"}), True
    ) == inject_reads(c, True)


# ---------------------------------------------------------------- instruction tuning
def test_lora_touches_only_last_two_layers(recs, tok):
    c = make_config(
        "smoke", {"instruct.epochs": 2, "instruct.eval_every": 2, "instruct.lora_r": 4, "instruct.lr": 1e-2}
    ).instruct
    base = tiny_model(tok, layers=4)
    snapshot = {n: p.detach().clone() for n, p in base.named_parameters()}
    merged, log = instruction_tune(base, tok, recs["instruct"][:48], c, seed=0)
    # input model untouched (inplace=False)
    assert all(torch.equal(p, snapshot[n]) for n, p in base.named_parameters())
    after = dict(merged.named_parameters())
    assert sorted(after) == sorted(snapshot)
    changed = {n for n in snapshot if not torch.equal(snapshot[n], after[n])}
    last_two = lambda n: ".layers.2." in n or ".layers.3." in n
    assert not any(hasattr(m, "lora_A") for m in merged.modules())                  # adapters merged away
    targets = {n for n in snapshot if last_two(n) and n.rsplit(".", 2)[-2] in
               ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
    assert len(targets) == 14 and log.attrs["best_step"] > 0
    # exactly the adapted matrices, bitwise elsewhere
    assert changed == targets
    assert log.step.iloc[0] == 0 and log.val_loss.notna().all()
    assert log.attrs["best_step"] == log.step[log.val_loss.idxmin()] and log.is_best.sum() == 1
    n_train = len(train_val_split(recs["instruct"][:48], c.train_fraction, 0)[0])
    assert log.step.iloc[-1] == c.epochs * math.ceil(n_train / c.batch_size)


def test_instruction_tune_patience_and_determinism(recs, tok):
    c = make_config(
        "smoke", {"instruct.epochs": 5, "instruct.eval_every": 1, "instruct.lora_r": 4, "instruct.lr": 0.3}
    ).instruct
    _, full = instruction_tune(tiny_model(tok), tok, recs["instruct"][:36], c, seed=0)
    _, cut = instruction_tune(tiny_model(tok), tok, recs["instruct"][:36], c, seed=0, patience=2)
    # deterministic: the same run, stopped early
    assert cut.val_loss.tolist() == full.val_loss.tolist()[:len(cut)]
    # stopped 2 evaluations after the best
    assert len(cut) < len(full) and (cut.step > cut.attrs["best_step"]).sum() == 2
    assert cut.attrs["best_step"] == cut.step[cut.val_loss.idxmin()]


def test_instruction_tune_bad_config(recs, tok):
    c = dataclasses.replace(make_config("smoke").instruct, train_fraction=1.0)
    with pytest.raises(ConfigError, match="instruct.train_fraction"):
        instruction_tune(tiny_model(tok), tok, recs["instruct"], c, seed=0)


# ---------------------------------------------------------------- extraction
def _memorize(tok, qa, steps=150):
    model = tiny_model(tok, layers=2, hidden=64)
    seqs = [tok(q["prompt"] + q["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for q in qa]
    T = max(map(len, seqs))
    x = torch.tensor([s + [tok.pad_token_id] * (T - len(s)) for s in seqs])
    y = x.clone()
    y[x == tok.pad_token_id] = -100
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=x, attention_mask=(y != -100).long(), labels=y).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_extraction_rate_on_memorized_model(tok):
    qa = [
        {
            "prompt": f"Question: What is the email address of {n}?\nAnswer:",
            "answer": f" {n.lower().replace(' ', '.')}@mail.com", "field": "email_address", "profile_id": f"p{i}",
            "group": i}
        for i, n in enumerate(["Ann Lee", "Bo Chan", "Cy Diaz"])
    ]
    model = _memorize(tok, qa)
    unseen = {"prompt": "Question: What is the email address of Di Ford?\nAnswer:", "answer": " zq93x@unseen.org",
              "field": "email_address", "profile_id": "p3", "group": 3}
    ext = extraction_table(model, tok, qa + [unseen], max_new_tokens=16, batch_size=4)
    manual = [r["answer"].strip().lower() in g.strip().lower() for r, g in zip(qa + [unseen], ext.generated)]
    assert ext.revealed.tolist() == manual == [True, True, True, False]
    rates = extraction_rates(memorized_profiles(ext))
    assert rates.memorized.item() == 3 and rates.rate.item() == 75.0
    # left-padded batches give the same greedy answers as one prompt at a time
    prompts = [q["prompt"] for q in qa + [unseen]] + ["Question: Who?\nAnswer:"]
    assert generate_texts(model, tok, prompts, 16, batch_size=5) == generate_texts(
        model, tok, prompts, 16, batch_size=1
    )


def test_extraction_with_stub_matches_manual_count():
    rows = [
        {
            "prompt": f"q{i}", "answer": f" v{i % 4}", "field": TARGET_FIELDS[i % 2], "profile_id": f"p{i % 4}",
            "group": i % 4}
        for i in range(16)
    ]
    rng = random.Random(0)
    answers = [r["answer"].upper() + " !" if rng.random() < 0.5 else " nope" for r in rows]
    ext = extraction_table(None, None, rows, generate=lambda ps: answers)
    assert ext.revealed.sum() == sum(a != " nope" for a in answers)
    mem = memorized_profiles(ext, min_share=1.0)
    by_hand = pd.DataFrame(rows).assign(ok=[a != " nope" for a in answers]).groupby(["profile_id", "field"]).ok.all()
    assert mem.memorized.sum() == by_hand.sum()
    assert not reveals(" v1", " v10") and reveals(" V10 yes", "v10")


# ---------------------------------------------------------------- testbed splits
def _all_memorized(recs):
    return memorized_profiles(pd.DataFrame(recs["qa_train"]).assign(revealed=True))


@pytest.mark.parametrize("offset", [1, 3])
def test_forget_retain_cross_field_and_sides(recs, offset):
    dd, info = select_testbed(_all_memorized(recs), recs["qa_train"], recs["qa_paraphrase"], TARGET_FIELDS, 10, seed=0,
                              retain_offset=offset)
    G = make_config("smoke").pii.n_groups
    for f in TARGET_FIELDS:
        s = field_splits(dd, f)
        F, R = s["forget"].to_pandas(), s["retain"].to_pandas()
        assert set(F.field) == {f} and set(R.field) == {info["pairs"][f]} and info["pairs"][f] != f
        assert set(F.group) <= set(range(G // 2)) and set(R.group) <= set(range(G // 2, G))
        assert F.profile_id.nunique() == R.profile_id.nunique() == 5
        assert set(s["forget_paraphrase"]["profile_id"]) == set(F.profile_id)
        assert set(s["retain_paraphrase"]["field"]) == {info["pairs"][f]}
        assert {"prompt", "answer", "field", "profile_id", "group"} <= set(F.columns)


def test_resurface_and_validation_never_in_forget_retain(recs):
    dd, _ = select_testbed(_all_memorized(recs), recs["qa_train"], recs["qa_paraphrase"], TARGET_FIELDS, 100, seed=0)
    fr = {p for k in dd if k.startswith(("forget_", "retain_")) for p in dd[k]["profile_id"]}
    roles = {p["profile_id"]: p["role"] for p in recs["profiles"]}
    assert fr and {roles[p] for p in fr} == {"testbed"}
    assert len(dd["resurface"]) and {roles[p] for p in dd["resurface"]["profile_id"]} == {"resurface"}
    assert {roles[p] for k in ("validation_forget", "validation_retain") for p in dd[k]["profile_id"]} == {"validation"}


def test_only_memorized_profiles_selected(recs):
    mem = _all_memorized(recs)
    mem.loc[mem.profile_id.str[-1].isin(list("13579")), "memorized"] = False
    dd, _ = select_testbed(mem, recs["qa_train"], recs["qa_paraphrase"], TARGET_FIELDS, 100, seed=0)
    assert all(int(p[-1]) % 2 == 0 for k in dd for p in dd[k]["profile_id"])


def test_bad_field_names_raise_before_compute(pii, tmp_path):
    cfg = make_config("smoke").testbed
    boom = lambda ps: (_ for _ in ()).throw(AssertionError("generation must not run"))
    with pytest.raises(ValueError, match="unknown field.*'email'"):
        build_testbed(None, None, pii, cfg, 0, tmp_path, target_fields=["email"], generate=boom)
    with pytest.raises(ValueError, match="must differ"):
        build_testbed(None, None, pii, cfg, 0, tmp_path, retain_field_of={"birth_city": "birth_city"}, generate=boom)
    with pytest.raises(ValueError, match="validation_fields"):
        build_testbed(
            None, None, pii, dataclasses.replace(cfg, validation_fields=["license", "email_address"]), 0, tmp_path,
            generate=boom)
    with pytest.raises(ValueError, match="retain_offset"):
        retain_pairing(TARGET_FIELDS, 0)
    with pytest.raises(ValueError, match="qa_fields"):
        injection_examples(WORLD, pii, None, dataclasses.replace(make_config("smoke").inject, qa_fields=["emial"]), 0)
    with pytest.raises(ValueError, match="roles"):
        injection_examples(WORLD, pii, None, make_config("smoke").inject, 0, roles=["forget"])


def test_build_testbed_roundtrip(pii, tmp_path):
    from lume_lab.inject.testbed import load_testbed, load_testbed_info
    gold = {r["prompt"]: r["answer"] for r in pii["qa_train"]}
    dd = build_testbed(
        None, None, pii, make_config("smoke").testbed, 0, tmp_path, generate=lambda ps: [gold[p] for p in ps]
    )
    re = load_testbed(tmp_path)
    assert {k: re[k].to_list() for k in re} == {k: dd[k].to_list() for k in dd}
    assert (tmp_path / "extraction.csv").exists() and (tmp_path / "extraction_rates.csv").exists()
    info = load_testbed_info(tmp_path)
    assert info["pairs"] == retain_pairing(TARGET_FIELDS)
    assert all(c["profiles"] == c["requested"] for c in info["counts"] if c["requested"])
