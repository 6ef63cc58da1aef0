"End-to-end and bad-input tests of `lume_lab.data.pii` (profiles, documents, QA, roles, the saved DatasetDict)."
import random, re

import pytest

from lume_lab.core.config import CONTENT_TYPES, QA_ATTRIBUTES, TARGET_FIELDS, ConfigError, make_config, set_fields
from lume_lab.data import pii
from lume_lab.data.pii import (ATTRIBUTES, assign_roles, build_pii, format_prompt, load_pii,
                               make_profiles, pii_fingerprint, render_documents, render_public_people, render_qa)


@pytest.fixture(scope="module")
def cfg():
    return make_config("smoke")


@pytest.fixture(scope="module")
def built(cfg, tmp_path_factory):
    d = tmp_path_factory.mktemp("pii0")
    return build_pii(cfg.pii, seed=0, out_dir=d), d


def test_same_seed_same_data_other_seed_other_people(cfg, built, tmp_path):
    dd, d = built
    dd_again = build_pii(cfg.pii, seed=0, out_dir=tmp_path / "again")
    assert pii_fingerprint(dd_again) == pii_fingerprint(dd)
    assert pii_fingerprint(load_pii(d)) == pii_fingerprint(dd)          # round trip through disk
    for split in dd:
        assert dd_again[split].to_list() == dd[split].to_list()
        assert dd_again[split]._fingerprint == dd[split]._fingerprint
    dd1 = build_pii(cfg.pii, seed=1, out_dir=tmp_path / "seed1")
    assert pii_fingerprint(dd1) != pii_fingerprint(dd)
    names0, names1 = set(dd["profiles"]["full_name"]), set(dd1["profiles"]["full_name"])
    assert len(names0 & names1) <= 2                                    # other seed, (almost) other people


def test_splits_and_columns(cfg, built):
    dd, _ = built
    c = cfg.pii
    n = c.n_groups * c.profiles_per_group
    assert set(dd) == {"profiles", "documents", "qa_train", "qa_paraphrase", "instruct"}
    assert len(dd["profiles"]) == n
    assert len(dd["documents"]) == n * c.docs_per_profile
    assert len(dd["qa_train"]) == n * len(QA_ATTRIBUTES) * c.qa_per_field
    assert len(dd["instruct"]) == c.n_instruct * len(c.target_fields) * c.instruct_questions_per_field
    for split in dd.values():
        assert {"profile_id", "group", "role", "side"} <= set(split.column_names)
        assert set(split["group"]) <= set(range(c.n_groups))
    assert set(dd["instruct"]["role"]) == {"instruct"}
    assert set(dd["instruct"]["field"]) == set(c.target_fields)
    assert set(dd["qa_paraphrase"]["field"]) == set(c.target_fields)


def test_roles_follow_fig2(cfg, built):
    dd, _ = built
    c, prof = cfg.pii, dd["profiles"].to_pandas()
    counts = prof["role"].value_counts().to_dict()
    assert (counts["instruct"], counts["resurface"], counts["validation"]) == (
        c.n_instruct,
        c.n_resurface,
        c.n_validation,
    )
    assert counts["testbed"] == len(prof) - c.n_instruct - c.n_resurface - c.n_validation
    assert (prof["side"] == prof["group"].map(lambda g: "forget" if g < c.n_groups // 2 else "retain")).all()
    val = prof[prof.role == "validation"].side.value_counts()
    assert val["forget"] == val["retain"] == c.n_validation // 2        # license-forget / email-retain halves
    assert (prof.groupby("group").role.apply(lambda r: (r == "testbed").sum()) >= 1).all()


def test_qa_format_and_answers(built):
    dd, _ = built
    prof = {r["profile_id"]: r for r in dd["profiles"]}
    for split in ("qa_train", "qa_paraphrase", "instruct"):
        for r in dd[split]:
            p = prof[r["profile_id"]]
            assert r["prompt"] == format_prompt(r["question"]) == f"Question: {r['question']}\nAnswer:"
            assert r["answer"] == " " + p[r["field"]]
            assert r["text"] == r["prompt"] + r["answer"]
            assert r["question"].startswith(p["full_name"] + ", ")
            assert r["group"] == p["group"] and r["role"] == p["role"]
            if r["field"] in ("email_address", "phone_number", "drivers_license"):
                assert p[r["field"]] not in r["question"]                # the answer never leaks into its question


def _template_regex(t: str) -> re.Pattern:
    "A template with its `{slot}`s turned into wildcards, matched against the question's last clause."
    parts = re.split(r"\{[a-zA-Z_]+\}", t)
    body = ".+".join(re.escape(x) for x in parts)
    return (
        re.compile(r"(^|, )" + "(?i:" + body[:1] + ")" + body[1:] + "$")
        if body and body[0].isalpha()
        else re.compile(body + "$")
    )


def test_paraphrases_never_trained(built):
    dd, _ = built
    train_q = set(dd["qa_train"]["question"]) | set(dd["instruct"]["question"])
    para_q = set(dd["qa_paraphrase"]["question"])
    assert para_q and not (train_q & para_q)
    # stronger: no training question (nor any public-people text) ends with a paraphrase *template*
    para_res = [_template_regex(t) for _, _, paras in pii._QA.values() for t in paras]
    public = [t for t in render_public_people(20, seed=0) if t.startswith("Question: ")]
    public_q = {t.split("\n")[0][len("Question: "):] for t in public}
    for q in list(train_q)[:600] + list(public_q):
        assert not any(rx.search(q) for rx in para_res), q
    assert all(any(rx.search(q) for rx in para_res) for q in list(para_q)[:100])   # the regexes do match paraphrases


def test_target_values_unique_and_documents_mention_them(cfg, built):
    dd, _ = built
    prof = dd["profiles"]
    for f in TARGET_FIELDS: assert len(set(prof[f])) == len(prof), f
    assert len(set(prof["full_name"])) == len(prof)
    docs = dd["documents"].to_pandas()
    for p in prof:
        texts = docs[docs.profile_id == p["profile_id"]]
        assert sorted(texts.content_type) == sorted(cfg.pii.content_types)
        for f in cfg.pii.target_fields:
            assert any(p[f] in t for t in texts.text), (p["profile_id"], f)


def test_templates_cover_every_attribute():
    ps = make_profiles(40, seed=5)
    assert all(set(p) == set(ATTRIBUTES) | {"profile_id", "full_name"} for p in ps)
    seen = set()
    for p in ps:
        for d in render_documents(p, CONTENT_TYPES, random.Random(p["profile_id"])):
            for a in d["attributes"]:
                assert p[a] in d["text"]
                seen.add(a)
    assert seen == set(QA_ATTRIBUTES)
    qa = render_qa(ps[0], QA_ATTRIBUTES, 2, random.Random(0))
    assert {r["field"] for r in qa} == set(QA_ATTRIBUTES) and len(qa) == 2 * len(QA_ATTRIBUTES)


def test_many_profiles_unique_birth_cities():
    ps = make_profiles(1200, seed=3)
    for f in TARGET_FIELDS: assert len({p[f] for p in ps}) == 1200


def test_public_people_disjoint_from_injected(built):
    dd, _ = built
    names = set(dd["profiles"]["full_name"])
    pub = make_profiles(300, seed=0, exclude_names=names, id_prefix="pub")
    assert not names & {p["full_name"] for p in pub}
    texts = render_public_people(30, seed=0, exclude_names=names)
    assert len(texts) == 30 * (len(CONTENT_TYPES) + len(QA_ATTRIBUTES))
    assert not any(n in t for t in texts for n in names)
    assert texts == render_public_people(30, seed=0, exclude_names=names)


def test_public_and_injected_names_disjoint_by_construction():
    injected = {p["full_name"] for p in make_profiles(400, seed=0)}
    public = make_profiles(400, seed=0, id_prefix=pii.PUBLIC_PREFIX)       # same seed, no exclude_names
    assert not injected & {p["full_name"] for p in public}
    texts = render_public_people(5, seed=0, content_types=["wiki"])
    assert all(any(p["full_name"] in t for t in texts) for p in public[:5])  # the rendered people are make_profiles'


def test_bad_inputs(cfg, tmp_path):
    bad = lambda **kw: set_fields(cfg, {f"pii.{k}": v for k, v in kw.items()}).pii
    with pytest.raises(ConfigError, match="pii.target_fields has unknown value.*'ssn'.*allowed: email_address"):
        build_pii(bad(target_fields=["ssn"]), 0, tmp_path / "a")
    with pytest.raises(ConfigError, match="pii.content_types has unknown value.*'blog'.*allowed: wiki"):
        build_pii(bad(content_types=["wiki", "blog"]), 0, tmp_path / "b")
    with pytest.raises(ConfigError, match="pii.profiles_per_group must be a positive int"):
        build_pii(bad(profiles_per_group=0), 0, tmp_path / "c")
    with pytest.raises(ConfigError, match="testbed profile"):
        build_pii(bad(n_instruct=1000), 0, tmp_path / "d")
    assert not any((tmp_path / x).exists() for x in "abcd")             # rejected before writing anything
    with pytest.raises(ValueError, match="'tweet'; allowed: wiki, social, forum, review, marketplace"):
        render_documents(make_profiles(1, 0)[0], ["tweet"], 0)
    with pytest.raises(ValueError, match="unknown QA field"):
        render_qa(make_profiles(1, 0)[0], ["blood_group"], 1, 0)
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        make_profiles(-1, 0)
    with pytest.raises(ValueError, match="n_groups must be even"):
        assign_roles(3, 10, 1, 1, 1, 0)
    with pytest.raises(ValueError, match="profiles_per_group must be an int >= 1"):
        assign_roles(6, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="exceeds n_groups"):
        assign_roles(2, 3, 2, 1, 2, 0)
