"""A recipe's prominence part (retrieval/recipe.py, indexer/mining.py): w · p(q) · p(d), p mined from
the index's own texts (how many other texts name d, how much text d has). The index answers as
score_matrix scores, --explain's parts add up, the mining is deterministic and needs no lists, an
index without names gets no part (and a warning), and an append is mined afresh."""
from dataclasses import replace

import numpy as np
import pytest

from relsearch.encoder.bundle import Bundle
from relsearch.encoder.relations import Operator, normalize
from relsearch.indexer import mining, mutations
from relsearch.indexer.build import Block, build_published
from relsearch.indexer.faiss_index import FaissSpec
from relsearch.indexer.lexical import BM25
from relsearch.retrieval.plan import PlanError, resolve
from relsearch.retrieval.parts import PARTS
from relsearch.retrieval.recipe import Recipe, choose, score_matrix
from relsearch.retrieval.request import SearchOptions, run
from relsearch.retrieval.search import Example, Query, Searcher

from synthetic_index import D, encoder_identity, raw_vectors

N = 60
WORDS = ["oil", "gas", "bank", "loan", "chip", "cloud", "drug", "trial", "ship", "rail"]
RECIPE = Recipe(mixture={"identity": 1.0}, bm25=0.3, prominence=0.4, depth=30)


def corpus(named: bool = True) -> list[dict]:
    """N firms; firm j names firms j % 3 and 5 + j % 2 (so firms 0-2 and 5-6 are named by many)."""
    rng = np.random.default_rng(5)
    docs = []
    for i in range(N):
        words = " ".join(rng.choice(WORDS, 4))
        text = f"Makes {words} and competes with Zorb{i % 3} and Quix{5 + i % 2} in {words}."
        metadata = {"group": i % 4, **({"name": f"{'Zorb' if i < 5 else 'Quix'}{i} Inc."} if named else {})}
        docs.append({"id": f"d{i}", "text": text, "metadata": metadata})
    return docs


def index(tmp_path, docs: list[dict], recipe: Recipe = RECIPE) -> Searcher:
    raw = raw_vectors(len(docs), 5)
    build_published(str(tmp_path / "idx"), [Block(docs, raw)], n=len(docs), d=D, encoder=encoder_identity(),
                    spec=FaissSpec(factory="Flat"))
    op = Operator(name="rel", kind="identity", params={}, info={"recipe": recipe.to_json()})
    bundle = Bundle(encoder=encoder_identity(), operators={"rel": op}).save(tmp_path / "b")
    return Searcher(str(tmp_path / "idx"), model=str(bundle))


def test_prominence_is_mined_from_the_texts_alone_and_deterministically():
    docs = corpus()
    texts, names = [[d["text"]] for d in docs], [d["metadata"]["name"] for d in docs]
    p = mining.prominence_of(texts, names)
    assert p.shape == (N,) and p.max() == pytest.approx(1.0) and p.min() > 0  # every firm has some text
    named, others = [0, 1, 2, 5, 6], np.setdiff1d(np.arange(N), [0, 1, 2, 5, 6])  # named by 20 or 30 texts; by none
    assert p[named].min() > p[others].max()
    again = mining.prominence_of(texts[::-1], names[::-1])[::-1]  # order plays no part
    np.testing.assert_array_equal(p, again)
    # a name is found only as the run of capitalised words it is: "zorb0" in lower case names nobody
    lower = mining.prominence_of([[t.lower()] for t, in texts], names)
    assert not lower[named].min() > lower[others].max()  # only the texts' lengths tell them apart
    assert mining.prominence_of(texts, [None] * N) is None  # no names: no prominence


def test_the_index_answers_as_score_matrix_and_explain_adds_up(tmp_path):
    docs = corpus()
    searcher = index(tmp_path, docs)
    heads = [1, 17, 40]  # d1 is named by a third of the texts: its prominence re-ranks its list
    raw = raw_vectors(N, 5)
    stored = searcher.files.vectors[heads] * np.array([[searcher.files.docstore.get([h])[h]["norm"]] for h in heads])
    unit = normalize(raw)
    q = normalize(stored)
    dense = {"identity": q @ unit.T}
    lexical = BM25([d["text"] for d in docs]).scores([docs[h]["text"] for h in heads])
    exclude = np.zeros((len(heads), N), bool)
    exclude[np.arange(len(heads)), heads] = True
    p = mining.prominence_of([[d["text"]] for d in docs], [d["metadata"]["name"] for d in docs])
    relative = np.outer(p[heads], p)  # the query document's prominence times each candidate's
    expected = score_matrix(RECIPE, dense, lexical, {"prominence": relative}, exclude)
    without = score_matrix(replace(RECIPE, prominence=0.0), dense, lexical, {"prominence": relative}, exclude)
    assert not np.array_equal(np.argsort(-expected[0])[:10], np.argsort(-without[0])[:10])  # it re-ranks
    pages = run(searcher, [Query(doc_id=f"d{h}", relations={"rel": 1.0}) for h in heads],
                SearchOptions(k=N - 1, explain=True))
    for row, hits, h in zip(expected, pages, heads):
        np.testing.assert_allclose([h.score for h in hits], [row[int(h.id[1:])] for h in hits], atol=2e-4)
        np.testing.assert_allclose([h.score for h in hits], np.sort(np.delete(row, h))[::-1], atol=2e-4)
        for hit in hits:
            parts = {k: v for k, v in hit.explain.items() if k.startswith("recipe:")}
            assert sum(parts.values()) == pytest.approx(hit.score, abs=1e-5)
            if "recipe:past-pool" not in parts:
                assert parts.get("recipe:prominence", 0.0) == pytest.approx(0.4 * p[h] * p[int(hit.id[1:])], abs=1e-6)
    assert "0.4·prominence" in RECIPE.describe()
    assert Recipe.from_json(RECIPE.to_json()) == RECIPE


def test_a_query_by_examples_weighs_by_its_documents_and_a_text_query_is_told_it_has_none(tmp_path):
    searcher = index(tmp_path, corpus())
    p = mining.prominence(searcher.files)
    [hits] = run(searcher, [Query(like=(Example(doc_id="d0"), Example(doc_id="d3")), relations={"rel": 1.0})],
                 SearchOptions(k=10, explain=True))
    weighed = [h for h in hits if "recipe:prominence" in h.explain]
    assert weighed and all(h.explain["recipe:prominence"] == pytest.approx(0.4 * (p[0] + p[3]) / 2 * p[int(h.id[1:])],
                                                                             abs=1e-6) for h in weighed)
    scoring = resolve(searcher.operators, {"rel": 1.0}, metadata_fields=searcher.metadata_fields, text_query=True)
    assert any("prominence" in w and "does not apply to a text query" in w for w in scoring.warnings)
    assert not resolve(searcher.operators, {"rel": 1.0}, metadata_fields=searcher.metadata_fields).warnings


def test_an_index_without_names_gets_no_part_and_a_warning(tmp_path):
    searcher = index(tmp_path, corpus(named=False))
    scoring = resolve(searcher.operators, {"rel": 1.0}, metadata_fields=searcher.metadata_fields)
    assert any("prominence does not apply" in w and "no name field" in w for w in scoring.warnings)
    [hits] = run(searcher, [Query(doc_id="d3", relations={"rel": 1.0})], SearchOptions(k=10, explain=True))
    assert not any("recipe:prominence" in h.explain for h in hits)
    plain = index(tmp_path / "plain", corpus(named=False), replace(RECIPE, prominence=0.0))
    [same] = run(plain, [Query(doc_id="d3", relations={"rel": 1.0})], SearchOptions(k=10))
    assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in same]


def test_an_append_is_mined_afresh(tmp_path):
    docs = corpus()
    searcher = index(tmp_path, docs)
    before = mining.prominence(searcher.files)
    more = [{"id": f"e{i}", "text": f"Ember{i} trails Quix30 in rail.", "metadata": {"name": f"Ember{i} Inc."}}
            for i in range(40)]
    mutations.append(str(tmp_path / "idx"), [Block(more, raw_vectors(40, 8))], n=40, run={"read": 40})
    after_searcher = Searcher(str(tmp_path / "idx"), model=str(tmp_path / "b"))
    after = mining.prominence(after_searcher.files)
    assert after[30] > before.get(30, 0.0) and after[30] == pytest.approx(1.0)  # named by 40 new texts (a text held twice counts once)
    [hits] = run(after_searcher, [Query(doc_id="d0", relations={"rel": 1.0})], SearchOptions(k=5, explain=True))
    assert any(h.id == "d30" for h in hits)  # lifted in a prominent firm's list


def test_each_write_mines_its_generation_and_a_query_only_reads_it(tmp_path, monkeypatch):
    searcher = index(tmp_path, corpus())
    first = searcher.files.root
    assert mining.FILE in searcher.files.manifest.files  # checked with the generation's other files
    written = (first / mining.FILE).read_bytes()
    more = [{"id": "e0", "text": "Ember0 trails Quix30 in rail.", "metadata": {"name": "Ember0 Inc."}}]
    mutations.append(str(tmp_path / "idx"), [Block(more, raw_vectors(1, 8))], n=1, run={"read": 1})
    assert (first / mining.FILE).read_bytes() == written  # the append wrote its own file, not through a link

    def mine(*args):
        raise AssertionError("a query mined the texts")
    monkeypatch.setattr(mining, "mine", mine)
    after = Searcher(str(tmp_path / "idx"), model=str(tmp_path / "b"))
    assert after.files.root != first and mining.prominence(after.files)
    [hits] = run(after, [Query(doc_id="d3", relations={"rel": 1.0})], SearchOptions(k=5, explain=True))
    assert any("recipe:prominence" in h.explain for h in hits)
    monkeypatch.setattr(mining, "VERSION", mining.VERSION + 1)  # code that mines otherwise: the file is not read
    with pytest.raises(AssertionError, match="a query mined"):
        mining.prominence(Searcher(str(tmp_path / "idx"), model=str(tmp_path / "b")).files)


def test_choose_takes_prominence_when_dev_rewards_it_and_a_mixture_averages_it():
    rng = np.random.default_rng(2)
    n, m = 40, 300
    exclude = np.zeros((n, m), bool)
    exclude[np.arange(n), np.arange(n)] = True
    major = rng.choice(np.arange(n, m), 10, replace=False)  # the rivals everyone names
    gold = [{int(rng.choice(major))} for _ in range(n)]
    dense = {"identity": rng.random((n, m))}
    for i, g in enumerate(gold):
        dense["identity"][i, sorted(g)] += 0.2
    p = np.full(m, 0.1, np.float32)
    p[major] = 1.0
    picked = choose("identity", dense, None, {"prominence": p}, exclude, gold, mixes=(1.0,))
    assert picked.recipe.prominence in PARTS["prominence"].grid and picked.recipe.prominence > 0
    assert choose("identity", dense, None, {}, exclude, gold, mixes=(1.0,)).recipe.prominence == 0
    flat = choose("identity", dense, None, {"prominence": np.zeros(m, np.float32)}, exclude, gold, mixes=(1.0,))
    assert flat.recipe.prominence == 0  # nothing to weigh: not offered
    ops = {"a": Operator(name="a", kind="identity", params={}, info={"recipe": Recipe(
        mixture={"a": 1.0}, prominence=0.4).to_json()}), "identity": Operator(name="identity", kind="identity", params={})}
    assert resolve(ops, {"a": 0.5, "identity": 0.5}, metadata_fields=["name"]).recipe.prominence == pytest.approx(0.2)
    with pytest.raises(PlanError, match="prominence"):
        resolve(ops, {"a": 1.0}, hybrid="rrf")
    with pytest.raises(ValueError, match="prominence weight must be in"):
        Recipe(mixture={"a": 1.0}, prominence=-0.1)
