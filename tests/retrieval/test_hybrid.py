"""Local hybrid search: BM25 lists per segment (indexer/lexical.py) fused with the relational list
(rrf: retrieval/hybrid.py; weighted: the plan's recipe, retrieval/plan.py and recipe.py): fusion
exact on hand-made lists, and through an index: appended segments, deletes, filters, and the
refusal on an index without BM25 lists."""
import numpy as np
import pytest

from relsearch.indexer import lexical, mutations
from relsearch.indexer.ann import SearchResult
from relsearch.indexer.build import Block, build_published
from relsearch.indexer.faiss_index import FaissSpec
from relsearch.retrieval import hybrid, plan, recipe, recipe_search, request
from relsearch.retrieval.search import Query, QueryError, Searcher

from conftest import shared
from synthetic_index import D, encoder_identity, raw_vectors


def result(rows):
    """SearchResult from [[(position, score), ...], ...] rows padded to the longest."""
    width = max(len(r) for r in rows)
    positions = np.full((len(rows), width), -1, np.int64)
    scores = np.full((len(rows), width), -np.inf, np.float32)
    for i, row in enumerate(rows):
        for j, (p, s) in enumerate(row):
            positions[i, j], scores[i, j] = p, s
    return SearchResult(positions, scores)


def test_rrf_is_exact_on_hand_made_lists():
    dense = result([[(7, 0.9), (3, 0.8), (5, 0.1)]])
    lexical = result([[(3, 12.0), (9, 4.0)]])
    fused = hybrid.fuse_rrf(dense, lexical, 4)
    expected = {3: 1 / 62 + 1 / 61, 7: 1 / 61, 9: 1 / 62, 5: 1 / 63}
    assert fused.positions[0].tolist() == [3, 7, 9, 5]
    np.testing.assert_allclose(fused.scores[0], [expected[p] for p in (3, 7, 9, 5)], rtol=1e-6)
    # ties (7 and 9 would tie if both were first in their lists) go to the smaller position
    tie = hybrid.fuse_rrf(result([[(9, 1.0)]]), result([[(7, 1.0)]]), 2)
    assert tie.positions[0].tolist() == [7, 9]
    # past the pool (each list's top depth) the dense list goes on in its order, with score 0
    shallow = hybrid.fuse_rrf(dense, lexical, 4, depth=1)
    assert shallow.positions[0].tolist() == [3, 7, 5, -1]  # 9 was BM25's second: outside its pool
    np.testing.assert_allclose(shallow.scores[0][:3], [1 / 61, 1 / 61, 0.0], rtol=1e-6)


class HandMadeLists:
    """A backend (retrieval/backend.py) whose candidates are the lists given, over a real index's
    documents: what the query plan's recipe search fuses, without an ANN or BM25 search in between."""

    def __init__(self, searcher, dense: SearchResult, lexical: SearchResult):
        self.local, self.dense, self.lexical = searcher, dense, lexical

    def candidates(self, qv, texts, n_dense, n_lexical, filters, *, own):
        return self.dense, None if texts is None else self.lexical


def weighted_hybrid(searcher, dense, lexical, weight, *, k=4, doc_id="d100"):
    """(ids, scores) of ``hybrid="weighted"`` at ``weight`` over hand-made lists: the plan's recipe
    (retrieval/plan.py: BM25 share 1 − weight) run by the recipe search, as every caller runs it."""
    scoring = plan.resolve(searcher.operators, {"identity": 1.0}, hybrid="weighted", relational_share=weight)
    assert scoring.recipe.bm25 == pytest.approx(1.0 - weight)
    [hits] = recipe_search.search(HandMadeLists(searcher, dense, lexical), [Query(doc_id=doc_id)], scoring.recipe, k=k)
    return [int(h.id[1:]) for h in hits], [h.score for h in hits]


def test_weighted_fusion_normalises_each_list(index):
    searcher = Searcher(str(index))
    dense = result([[(1, 0.9), (2, 0.5), (3, 0.1)]])
    lexical = result([[(3, 10.0), (4, 0.0)]])
    ids, scores = weighted_hybrid(searcher, dense, lexical, 0.25)
    expected = {1: 0.25, 2: 0.25 * 0.5, 3: 0.75, 4: 0.0}
    assert ids == [3, 1, 2, 4]
    np.testing.assert_allclose(scores, [expected[p] for p in ids], rtol=1e-6)
    assert weighted_hybrid(searcher, result([[(1, 0.3)]]), result([[(-1, 0.0)]]), 0.5, k=2)[0] == [1]  # no BM25 hit
    # the extremes: the relational order alone (no BM25 share: the plan runs a plain dense search),
    # BM25's alone (over the union of both lists)
    assert plan.resolve(searcher.operators, {"identity": 1.0}, hybrid="weighted", relational_share=1.0).mode == "dense"
    assert weighted_hybrid(searcher, dense, lexical, 0.0, k=1)[0] == [3]
    with pytest.raises(ValueError, match="rrf or weighted"):
        hybrid.check("max", None)
    for weight in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="between 0 and 1"):
            hybrid.check("weighted", weight)
    with pytest.raises(ValueError, match="needs the weighted fusion"):
        hybrid.check("rrf", 0.3)


def test_the_query_document_leaves_both_lists_before_fusing(index):
    """An --id query's own document neither takes a rank nor sets a list's maximum."""
    dense = result([[(1, 1.0), (2, 0.8), (3, 0.6)]])
    lexical = result([[(1, 30.0), (3, 10.0), (4, 6.0), (2, 2.0)]])
    # without 1: dense 2 → 1, 3 → 0; BM25 3 → 1, 4 → 0.5, 2 → 0 (with 1, BM25's 3 would be 8/28)
    ids, scores = weighted_hybrid(Searcher(str(index)), dense, lexical, 0.4, doc_id="d1")
    assert ids == [3, 2, 4]
    np.testing.assert_allclose(scores, [0.6, 0.4, 0.3], rtol=1e-6)
    fused = hybrid.fuse_rrf(dense, lexical, 3, exclude=np.array([1]))
    assert fused.positions[0].tolist() == [3, 2, 4]
    np.testing.assert_allclose(fused.scores[0], [1 / 62 + 1 / 61, 1 / 61 + 1 / 63, 1 / 62], rtol=1e-6)


def test_fusion_over_score_matrices_matches_the_list_fusion():
    dense = np.array([[0.9, 0.1, 0.5, 0.2]], np.float32)
    lexical = np.array([[0.0, 3.0, 1.0, 0.0]], np.float32)  # 0: no term matches, not a hit
    fused = hybrid.rrf_matrix(dense, lexical, depth=2)
    np.testing.assert_allclose(fused[0], [1 / 61, 1 / 61, 2 / 62, 0.0], rtol=1e-6)
    lists = hybrid.fuse_rrf(result([[(0, 0.9), (2, 0.5)]]), result([[(1, 3.0), (2, 1.0)]]), 3, depth=2)
    np.testing.assert_allclose(fused[0][lists.positions[0]], lists.scores[0], rtol=1e-6)
    weighted = hybrid.weighted_matrix(dense, lexical, weight=0.25, depth=2)
    # dense top 2: 0 → 1, 2 → 0; BM25 top 2 (scores > 0): 1 → 1, 2 → 0
    np.testing.assert_allclose(weighted[0], [0.25, 0.75, 0.0, 0.0], rtol=1e-6)
    # the weighted recipe (BM25 share 0.75) scores its pool alike; candidate 3 is past the pool there
    as_recipe = recipe.score_matrix(recipe.Recipe(mixture={"identity": 1.0}, bm25=0.75, depth=2),
                                    {"identity": dense}, lexical, {}, np.zeros(dense.shape, bool))
    np.testing.assert_allclose(as_recipe[0][:3], weighted[0][:3], rtol=1e-6)
    assert as_recipe[0][3] < 0
    # candidate 2 excluded (the query itself): it leaves both lists and the others move up
    fused = hybrid.rrf_matrix(dense, lexical, depth=2, exclude=np.array([[False, False, True, False]]))
    np.testing.assert_allclose(fused[0], [1 / 61, 1 / 61, 0.0, 1 / 62], rtol=1e-6)


WORDS = ["oil", "gas", "bank", "loan", "chip", "cloud", "drug", "trial"]


def corpus(ids, seed):
    rng = np.random.default_rng(seed)
    docs = [{"id": i, "text": " ".join(rng.choice(WORDS, 3)) + f" {i}", "metadata": {"group": int(i[1:]) % 3}}
            for i in ids]
    return Block(docs, raw_vectors(len(ids), seed))


@pytest.fixture
def index(tmp_path):
    target = tmp_path / "idx"
    build_published(str(target), [corpus([f"d{i}" for i in range(200)], 1)], n=200, d=D,
                    encoder=encoder_identity(), spec=FaissSpec(factory="Flat"))
    return target


def test_bm25_lists_equal_bm25s_own_scores():
    """The index's BM25 lists are computed over arrays (lexical.build); every term's rows and
    float32 scores must equal what bm25s itself computes, on real sentences with repeated terms,
    a text of stop words only and an empty one."""
    from relsearch.bench.speed import real_sentences

    texts = real_sentences(3000, data_dir=shared("stsb").parent) + ["the and of it", "", "rock rock rock band rock"]
    ours = lexical.build(texts)
    theirs = lexical.bm25s_module().BM25(k1=lexical.K1, b=lexical.B)
    theirs.index(lexical.tokenize(texts), show_progress=False)

    def lists(retriever):
        s, out = retriever.scores, {}
        for term, t in retriever.vocab_dict.items():
            if t + 1 < len(s["indptr"]):
                lo, hi = s["indptr"][t], s["indptr"][t + 1]
                out[term] = sorted(zip(s["indices"][lo:hi].tolist(), s["data"][lo:hi].tolist()))
        return out

    mine, reference = lists(ours), lists(theirs)
    assert len(mine) > 3000 and mine == reference
    assert mine["rock"][-1][0] == len(texts) - 1  # a repeated term: its tf, not one entry per repeat
    assert lexical.build(["the it", "x"]).scores is None  # no term at all: nothing bm25s could index


def test_a_querys_bm25_scores_add_each_terms_list_in_float32_term_after_term(tmp_path):
    """LexicalSegment.scores adds every distinct query term's contributions with one np.add.at over
    the terms' lists laid end to end: bit for bit what one np.add.at per term, in the same term
    order, gives (float32 sums depend on that order), for whole descriptions as queries (a lookup
    of peers), repeated and unknown terms, a query of stop words and an empty one."""
    from relsearch.bench.speed import real_sentences

    texts = real_sentences(2000, data_dir=shared("stsb").parent)
    lexical.write(tmp_path / "bm25.npz", np.arange(100, 100 + len(texts)), texts)
    segment = lexical.LexicalSegment.load(tmp_path / "bm25.npz")

    def per_term(tokens):
        out = np.zeros(len(segment.positions), np.float32)
        for term in dict.fromkeys(tokens):  # each distinct term once, in the query's order
            t = segment.vocab.get(term)
            if t is not None and t + 1 < len(segment.indptr):
                lo, hi = segment.indptr[t], segment.indptr[t + 1]
                np.add.at(out, segment.indices[lo:hi], segment.data[lo:hi])
        return out

    queries = [" ".join(texts[i:i + 8]) for i in range(0, 400, 8)] + [
        texts[3] + " " + texts[3], "zzyzx qwerty " + texts[5], "the and of it", ""]
    for tokens in lexical.tokenize(queries):
        got, want = segment.scores(tokens), per_term(tokens)
        assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    assert segment.scores(lexical.tokenize([" ".join(texts[:40])])[0]).any()


def test_a_querys_bm25_scores_are_the_same_under_any_hash_seed(tmp_path):
    """Two processes with different PYTHONHASHSEEDs (set iteration order) score a long query alike,
    bit for bit: a lookup's answers must not change from run to run."""
    import os
    import subprocess
    import sys

    from relsearch.bench.speed import real_sentences

    texts = real_sentences(500, data_dir=shared("stsb").parent)
    lexical.write(tmp_path / "bm25.npz", np.arange(len(texts)), texts)
    script = ("import sys; from relsearch.indexer import lexical; "
              "s = lexical.LexicalSegment.load(sys.argv[1]); "
              "sys.stdout.write(s.scores(lexical.tokenize([sys.argv[2]])[0]).tobytes().hex())")
    query = " ".join(texts[:30])
    runs = [subprocess.run([sys.executable, "-c", script, str(tmp_path / "bm25.npz"), query], check=True,
                           capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")]
    assert runs[0] and runs[0] == runs[1]


def test_hybrid_over_segments_deletes_and_filters(index):
    mutations.append(str(index), [Block([{"id": "new", "text": "zeppelin airship cloud", "metadata": {"group": 0}}],
                                        raw_vectors(1, 9))], n=1, run={"read": 1})
    mutations.delete(str(index), ["d3"])
    searcher = Searcher(str(index))
    assert len(searcher.files.segments) == 2
    lexical = searcher.lexical_search(["zeppelin"], 5)
    assert lexical.positions[0].tolist() == [200, -1, -1, -1, -1]  # a word only the appended document has
    d3 = searcher.files.docstore.get([3])[3]["text"].split()[0]
    assert 3 not in searcher.lexical_search([d3], 200).positions  # deleted
    for method in hybrid.METHODS:  # the query plan runs weighted fusion as a recipe, rrf in Searcher.search
        hits = request.run(searcher, [Query(doc_id="d5")], request.SearchOptions(k=10, hybrid=method))[0]
        assert len(hits) == 10 and {"d5", "d3"}.isdisjoint(h.id for h in hits)
        filtered = request.run(searcher, [Query(doc_id="d5")],
                               request.SearchOptions(k=10, hybrid=method, filters={"group": 1}))[0]
        assert filtered and all(h.metadata["group"] == 1 for h in filtered)
    # every fused hit comes from one of the two candidate lists, and the order is neither list's own
    dense = [h.id for h in searcher.search([Query(doc_id="d5")], k=100)[0]]
    words = searcher.files.docstore.get([5])[5]["text"]
    found = searcher.lexical_search([words], 100).positions[0]
    lexical_ids = [d["id"] for d in searcher.files.docstore.get([int(p) for p in found if p >= 0]).values()]
    fused = [h.id for h in searcher.search([Query(doc_id="d5")], k=10, hybrid="rrf")[0]]
    assert set(fused) <= set(dense) | set(lexical_ids)
    assert fused != dense[:10] and set(fused) & set(lexical_ids)


def test_a_segment_without_any_bm25_term_is_appended_and_searched(index):
    """Stop words and single letters give no BM25 term; a segment of only such texts has empty lists."""
    mutations.append(str(index), [Block([{"id": "it", "text": "it", "metadata": {"group": 0}},
                                         {"id": "x", "text": "x ?", "metadata": {"group": 0}}], raw_vectors(2, 9))],
                     n=2, run={"read": 2})
    searcher = Searcher(str(index))
    assert searcher.lexical_search(["it x"], 5).positions[0].tolist() == [-1] * 5
    hits = searcher.search([Query(doc_id="it")], k=5, hybrid="rrf")[0]
    assert len(hits) == 5 and "it" not in {h.id for h in hits}


def test_an_index_without_bm25_lists_is_refused_until_compact(tmp_path):
    target = tmp_path / "idx"
    build_published(str(target), [corpus([f"d{i}" for i in range(50)], 2)], n=50, d=D,
                    encoder=encoder_identity(), spec=FaissSpec(factory="Flat"), bm25=False)
    with pytest.raises(QueryError, match="relsearch compact"):
        Searcher(str(target)).search([Query(doc_id="d1")], k=3, hybrid="rrf")
    mutations.compact(str(target))
    assert len(Searcher(str(target)).search([Query(doc_id="d1")], k=3, hybrid="rrf")[0]) == 3
    with pytest.raises(QueryError, match="fuses by rrf only"):  # weighted runs as a recipe (retrieval/plan.py)
        Searcher(str(target)).search([Query(doc_id="d1")], k=3, hybrid="max")


def test_cli_query_hybrid(index):
    import json

    from click.testing import CliRunner

    from relsearch.cli import cli

    runner = CliRunner()
    for args in (["--hybrid"], ["--hybrid", "weighted"]):
        out = runner.invoke(cli, ["query", "--id", "d5", "--index", str(index), "-k", "3", "--json", *args])
        assert out.exit_code == 0, out.output
        rows = [json.loads(line) for line in out.output.splitlines()]
        assert len(rows) == 3 and "d5" not in {r["id"] for r in rows}
    expected = [h.id for h in request.run(Searcher(str(index)), [Query(doc_id="d5")],
                                          request.SearchOptions(k=3, hybrid="weighted"))[0]]
    assert [r["id"] for r in rows] == expected
    out = runner.invoke(cli, ["query", "--id", "d5", "--index", str(index), "--hybrid", "max"])
    assert out.exit_code == 2 and "'max' is not one of 'rrf', 'weighted'" in out.output
    # --hybrid-weight moves the weighted fusion between the relational order (1) and BM25's (0)
    by_weight = {}
    for w in ("0", "1"):
        out = runner.invoke(cli, ["query", "--id", "d5", "--index", str(index), "-k", "5", "--json",
                                  "--hybrid", "weighted", "--hybrid-weight", w])
        assert out.exit_code == 0, out.output
        by_weight[w] = [json.loads(line)["id"] for line in out.output.splitlines()]
    searcher = Searcher(str(index))
    assert by_weight["1"] == [h.id for h in searcher.search([Query(doc_id="d5")], k=5)[0]]
    assert by_weight["0"] != by_weight["1"]
    out = runner.invoke(cli, ["query", "--id", "d5", "--index", str(index), "--hybrid", "--hybrid-weight", "0.3"])
    assert out.exit_code != 0 and "--hybrid-weight: a hybrid weight needs the weighted fusion" in out.output
    with pytest.raises(request.RequestError, match="between 0 and 1"):
        request.SearchOptions(k=3, hybrid="weighted", hybrid_weight=2.0).check()
