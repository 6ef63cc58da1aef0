"End-to-end and bad-input tests of lume_lab.data.pistol (PISTOL §3, App. B-C) and lume_lab.data.lume (LUME §2-3)."
import datetime as dt, json, random, re
from collections import Counter

import pytest
from datasets import load_from_disk

from lume_lab.data.pistol import (
    build_pistol, pistol_edges, node_degrees, edge_degree, contract_attributes, contract_qa, forget_retain,
    density_forget_edges, DOMAIN_PROBES, QUESTIONS)
from lume_lab.data.lume import (
    build_lume, lume_documents, regurgitation_split, world_public_bios, BIRTH_RANGE, LUME_TASKS, GENRES)


# ---------------------------------------------------------------- PISTOL
@pytest.fixture(scope="module")
def pistol():
    return build_pistol(seed=0)


def test_dataset1_topology():
    edges = pistol_edges("dataset1")
    deg = node_degrees(edges)
    assert (len(deg), len(edges)) == (24, 20)
    assert (deg["A"], deg["B"], deg["C"]) == (8, 7, 1)
    assert edge_degree(edges, "A-B") == 14 and edge_degree(edges, "A-C") == 8
    assert Counter(t for _, _, t, _ in edges) == {"sales": 10, "employment": 10}
    # employment contracts are always company -> person; sales always company <-> company
    assert all(v.islower() and not u.islower() for u, v, t, _ in edges if t == "employment")
    assert all(not u.islower() and not v.islower() for u, v, t, _ in edges if t == "sales")
    # the domain probes sit in a component isolated from A and B
    comps = {f"{u}-{v}": c for u, v, _, c in edges}
    assert comps[DOMAIN_PROBES["sales"]] == comps[DOMAIN_PROBES["employment"]] != comps["A-B"]


def test_dataset2_topology():
    edges = pistol_edges("dataset2")
    by = Counter(c for *_, c in edges)
    assert by == {"sparse": 9, "semi_dense": 21, "dense": 45}
    for comp in by:
        nodes = {n for u, v, _, c in edges if c == comp for n in (u, v)}
        assert len(nodes) == 10
    assert len({frozenset((u, v)) for u, v, *_ in edges}) == 75
    assert {t for _, _, t, _ in edges} == {"sales"}
    dense = [(u, v) for u, v, _, c in edges if c == "dense"]
    assert max(node_degrees(dense).values()) == min(node_degrees(dense).values()) == 9  # complete graph


def test_pistol_qa_rows(pistol):
    assert (pistol["dataset1"].num_rows, pistol["dataset2"].num_rows) == (400, 1500)
    for split in ("dataset1", "dataset2"):
        rows = pistol[split].to_list()
        assert set(Counter(r["edge"] for r in rows).values()) == {20}  # 20 QAs per contract
        assert len({r["prompt"] for r in rows}) == len(rows)  # every question names a single contract
        for r in rows:
            assert r["prompt"] == f"Question: {r['question']}\nAnswer:" and r["answer"] == " " + r["value"]
            assert r["answer"].strip() and r["contract_type"] in QUESTIONS
    edges = {r["edge"]: r for r in pistol["edges"].to_list() if r["dataset"] == "dataset1"}
    assert (edges["A-B"]["degree"], edges["A-C"]["degree"]) == (14, 8)
    names = [r["name"] for r in pistol["nodes"].to_list() if r["dataset"] == "dataset1"]
    assert len(set(names)) == 24
    for r in pistol["nodes"].to_list():  # §3.1 attribute shapes
        if r["kind"] == "company": assert re.fullmatch(r"[A-Z][a-z]{5} \w+", r["name"])
        else: assert re.fullmatch(r"[A-Z][a-z]{3} [A-Z][a-z]{3}", r["name"])
        assert re.fullmatch(r"\d{3} [A-Z][a-z]{5} [A-Z][a-z]+", r["address"])


def test_pistol_answers_consistent(pistol):
    d1 = pistol["dataset1"].to_pandas()
    ab = d1[d1.edge == "A-B"].set_index("attribute")["value"]
    assert int(ab["total_price"]) == int(ab["quantity"]) * int(ab["unit_price"])
    nodes = {r["node"]: r["name"] for r in pistol["nodes"].to_list() if r["dataset"] == "dataset1"}
    assert {ab["seller_name"], ab["customer_name"]} == {nodes["A"], nodes["B"]}
    an = d1[d1.edge == "A-n"].set_index("attribute")["value"]
    assert (an["employer_name"], an["employee_name"]) == (nodes["A"], nodes["n"])
    # the contract document states every answer of its 20 QAs
    texts = {(r["dataset"], r["edge"]): r["text"] for r in pistol["edges"].to_list()}
    for split in ("dataset1", "dataset2"):
        for r in pistol[split].to_list(): assert r["value"] in texts[(split, r["edge"])], r


def test_pistol_determinism_and_disk(pistol, tmp_path):
    again = build_pistol(seed=0, out_dir=tmp_path / "p")
    assert again["dataset1"].to_list() == pistol["dataset1"].to_list()
    assert again["dataset2"].to_list() == pistol["dataset2"].to_list()
    other = build_pistol(seed=1)
    assert other["dataset1"]["answer"] != pistol["dataset1"]["answer"]
    loaded = load_from_disk(str(tmp_path / "p"))
    assert set(loaded) == {"dataset1", "dataset2", "edges", "nodes"}
    assert loaded["dataset2"].to_list() == pistol["dataset2"].to_list()


def test_forget_retain_selection(pistol):
    sp = forget_retain(pistol["dataset1"], "A-B")
    assert (sp["forget"].num_rows, sp["retain"].num_rows) == (20, 380)
    assert set(sp["forget"]["edge"]) == {"A-B"} and "A-B" not in set(sp["retain"]["edge"])
    picks = density_forget_edges(seed=2)
    assert picks == density_forget_edges(seed=2)
    comp = {f"{u}-{v}": c for u, v, _, c in pistol_edges("dataset2")}
    assert {d: comp[e] for d, e in picks.items()} == {d: d for d in picks}
    sp2 = forget_retain(pistol["dataset2"], list(picks.values()))
    assert (sp2["forget"].num_rows, sp2["retain"].num_rows) == (60, 1440)


def test_pistol_bad_input(pistol):
    a = {"name": "Abcdef LLC", "address": "101 Qwerty Road"}
    with pytest.raises(ValueError, match="contract_type must be one of sales, employment"):
        contract_attributes(random.Random(0), "lease", a, a)
    with pytest.raises(ValueError, match="contract_type must be one of"):
        contract_qa({}, "loan", "A-B")
    with pytest.raises(ValueError, match="dataset must be one of dataset1, dataset2"):
        pistol_edges("dataset9")
    with pytest.raises(ValueError, match="unknown edge 'A-Q'"):
        edge_degree(pistol_edges("dataset1"), "A-Q")
    with pytest.raises(ValueError, match="not in this dataset"):
        forget_retain(pistol["dataset1"], "0-1")


# ---------------------------------------------------------------- LUME
def _public_bios(n=10):
    out = []
    for i in range(n):
        name = f"Person{chr(65 + i)} Public"
        text = (f"{name} was born in City{i}. {name} worked as a sculptor for many years. Their best known work is "
                f"Statue{i}. They later taught in Town{i}. They died peacefully at home.")
        out.append(dict(name=name, text=text, facts=dict(name=name, birth_city=f"City{i}", best_work=f"Statue{i}")))
    return out


@pytest.fixture(scope="module")
def lume():
    return build_lume(seed=0, n_per_task=20, public_bios=_public_bios())


def test_lume_splits(lume):
    docs = {s: lume[f"{s}_docs"].to_pandas() for s in ("forget", "retain")}
    for s, df in docs.items():
        assert Counter(df.task) == {"creative": 10, "pii": 10, "public": 5}  # public: only 10 bios given
        assert set(df.split) == {s}
    assert not set(docs["forget"].doc_id) & set(docs["retain"].doc_id)
    for s in ("forget", "retain"):
        qa = lume[f"{s}_qa"].to_pandas()
        assert set(qa.doc_id) == set(docs[s].doc_id)
        k = qa[qa.kind == "knowledge"].groupby("task").size().to_dict()
        assert k == {"creative": 10, "pii": 50, "public": 5}  # LUME §3: five PII questions per Task 2 document
        assert (qa[qa.kind == "regurgitation"].groupby("doc_id").size() == 1).all()


def test_regurgitation_second_half(lume):
    for s in ("forget", "retain"):
        text = dict(zip(lume[f"{s}_docs"]["doc_id"], lume[f"{s}_docs"]["text"]))
        for r in lume[f"{s}_qa"].to_list():
            if r["kind"] != "regurgitation": continue
            t = text[r["doc_id"]]
            assert r["prompt"] + r["answer"] == t
            assert len(r["prompt"]) >= len(t) / 2 and r["answer"].startswith(" ") and len(r["answer"]) > 1


def test_knowledge_rows_grounded(lume):
    for s in ("forget", "retain"):
        text = dict(zip(lume[f"{s}_docs"]["doc_id"], lume[f"{s}_docs"]["text"]))
        for r in lume[f"{s}_qa"].to_list():
            if r["kind"] != "knowledge": continue
            assert r["prompt"] == f"Question: {r['question']}\nAnswer:" and r["answer"].startswith(" ")
            if r["field"] == "birth_date":  # answered as YYYY-MM-DD, written out in the text
                d = dt.date.fromisoformat(r["answer"].strip())
                assert f"{d:%B} {d.day}, {d.year}" in text[r["doc_id"]]
            else:
                assert r["answer"].strip() in text[r["doc_id"]]


def test_pii_values_obey_lume_ranges():
    docs = lume_documents("pii", 200, seed=3)
    lo, hi = BIRTH_RANGE
    assert (lo, hi) == (dt.date(1964, 1, 1), dt.date(1991, 1, 1))
    for d in docs:
        f = d["facts"]
        assert lo <= dt.date.fromisoformat(f["birth_date"]) <= hi
        assert re.fullmatch(r"900-\d{2}-\d{4}", f["ssn"])
        assert re.fullmatch(r"\d{3}-\d{3}-\d{4}", f["phone"])
        assert f["email"] == f"{f['first_name'].lower()}_{f['last_name'].lower()}@me.com"
        assert f["state"] != f["zip_state"] and re.search(rf", {f['state']} \d{{5}}$", f["address"])
    assert len({d["facts"]["name"] for d in docs}) == 200
    births = sorted(d["facts"]["birth_date"] for d in docs)
    assert births[0] < "1970" and births[-1] > "1985"  # spread over the range, not a constant


def test_story_lengths_and_genres():
    docs = lume_documents("creative", 300, seed=1)
    words = [len(d["text"].split()) for d in docs]
    assert min(words) >= 150 and max(words) <= 200
    assert {d["genre"] for d in docs} == set(GENRES)
    assert len({d["qa"][0][0] for d in docs}) == 300  # unambiguous questions
    for d in docs: assert d["qa"][0][1] in d["text"]


def test_lume_determinism_and_disk(lume, tmp_path):
    again = build_lume(seed=0, n_per_task=20, public_bios=_public_bios(), out_dir=tmp_path / "l")
    for s in lume: assert again[s].to_list() == lume[s].to_list()
    other = build_lume(seed=1, n_per_task=20, public_bios=_public_bios())
    assert other["forget_docs"]["text"] != lume["forget_docs"]["text"]
    loaded = load_from_disk(str(tmp_path / "l"))
    assert loaded["forget_qa"].to_list() == lume["forget_qa"].to_list()
    assert json.loads(loaded["forget_docs"][0]["facts"])


def test_lume_bad_input():
    with pytest.raises(ValueError, match="tasks must be drawn from creative, pii, public"):
        build_lume(0, n_per_task=4, tasks=["creative", "novels"])
    with pytest.raises(ValueError, match="needs public_bios"):
        build_lume(0, n_per_task=4, tasks=["public"])
    with pytest.raises(ValueError, match="forget_fraction"):
        build_lume(0, n_per_task=4, forget_fraction=0)
    with pytest.raises(ValueError, match="n_per_task"):
        build_lume(0, n_per_task=1)
    with pytest.raises(ValueError, match="no 'name'"):
        build_lume(0, n_per_task=4, tasks=["public"], public_bios=[{"text": "Someone did something. Then more."}])
    with pytest.raises(ValueError, match="must be drawn from"):
        lume_documents("poems", 3)
    # default without public bios: tasks 1 and 2 only
    assert set(build_lume(0, n_per_task=4)["forget_docs"]["task"]) == {"creative", "pii"}


def test_world_public_bios_are_pretraining_documents():
    "Task 3 must be knowledge the base model was pretrained on: every bio is a document of the world corpus."
    from lume_lab.data.world import public_people_texts
    bios = world_public_bios(12, seed=4, heldout_fraction=0.1)
    train, held = public_people_texts(12, 4, 0.1)
    corpus = {r["text"] for r in train}
    assert len(bios) == 11 and all(b["text"] in corpus for b in bios)
    assert not any(b["text"] in {r["text"] for r in held} for b in bios)
    for b in bios: assert b["answer"] in b["text"] and str(b["facts"][b["field"]]) == b["answer"]
    dd = build_lume(seed=0, n_per_task=6, public_bios=bios, tasks=["public"])
    k = [r for r in dd["forget_qa"].to_list() + dd["retain_qa"].to_list() if r["kind"] == "knowledge"]
    assert {r["question"] for r in k} <= {b["question"] for b in bios}
    with pytest.raises(ValueError, match="doc_type must be one of"):
        world_public_bios(4, seed=0, heldout_fraction=0.1, doc_type="novel")
