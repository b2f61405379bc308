"""Queries against a real small index: oracle against exact numpy search, ids, filters, errors."""
import json

import numpy as np
import pytest

from relsearch.encoder.bundle import Bundle
from relsearch.encoder.relations import Operator
from relsearch.indexer.reader import open_index
from relsearch.retrieval.search import Query, QueryError, Searcher


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory, encoder):
    """A bundle on the index's encoder with one translation and one linear operator."""
    rng = np.random.default_rng(1)
    ops = {
        "shift": Operator(name="shift", kind="translation", description="test",
                          params={"r": rng.normal(scale=0.3, size=384).astype(np.float32)}),
        "mix": Operator(name="mix", kind="linear", params={
            "W": (np.eye(384) + rng.normal(scale=0.05, size=(384, 384))).astype(np.float32),
            "b": np.zeros(384, np.float32)}),
    }
    path = tmp_path_factory.mktemp("bundle") / "b"
    Bundle(encoder=encoder.identity, operators=ops).save(path)
    return str(path)


@pytest.fixture(scope="module")
def searcher(small_index, bundle_dir):
    return Searcher(str(small_index), bundle_dir)


def exact_top(searcher, q, k, exclude=None):
    sims = np.asarray(searcher.files.vectors) @ q
    docs = searcher.files.docstore.get(list(range(len(sims))))
    order = [int(i) for i in np.argsort(-sims) if docs[int(i)]["id"] != exclude]
    return [docs[i]["id"] for i in order[:k]], sims[order[:k]]


def test_text_query_equals_exact_search_for_each_relation(searcher, encoder):
    text = "designs and sells semiconductors and microchips"
    h = encoder.encode([text]).vectors
    for name in ("identity", "shift", "mix"):
        hits = searcher.search([Query(text=text, relations={name: 1.0})], k=5)[0]
        ids, scores = exact_top(searcher, searcher.operators[name].apply(h)[0], 5)
        assert [hit.id for hit in hits] == ids
        np.testing.assert_allclose([hit.score for hit in hits], scores, atol=1e-5)


def test_id_query_uses_raw_vector_and_never_returns_itself(searcher):
    files = searcher.files
    pos = files.docstore.positions(["ADBE"])["ADBE"]
    raw = files.vectors[pos] * files.docstore.get([pos])[pos]["norm"]
    hits = searcher.search([Query(doc_id="ADBE", relations={"shift": 1.0})], k=5)[0]
    ids, _ = exact_top(searcher, searcher.operators["shift"].apply(raw[None])[0], 5, exclude="ADBE")
    assert [h.id for h in hits] == ids and len(hits) == 5


def test_mixture_scores_are_weighted_sums_and_explain_shows_each(searcher):
    hits = searcher.search([Query(doc_id="AAPL", relations={"shift": 0.7, "identity": 0.3})], k=3, explain=True)[0]
    for hit in hits:
        # issue 28 item 7: the mixture's weighted parts first (they sum to the score), then every operator
        assert list(hit.explain)[:2] == ["mixture:shift", "mixture:identity"]
        assert set(hit.explain) == {"mixture:shift", "mixture:identity", "identity", "shift", "mix"}
        assert hit.explain["mixture:shift"] == pytest.approx(0.7 * hit.explain["shift"], abs=1e-6)
        assert hit.score == pytest.approx(hit.explain["mixture:shift"] + hit.explain["mixture:identity"], abs=1e-5)
        assert hit.score == pytest.approx(0.7 * hit.explain["shift"] + 0.3 * hit.explain["identity"], abs=1e-5)
    alone = searcher.search([Query(doc_id="AAPL", relations={"shift": 1.0})], k=1, explain=True)[0][0]
    assert set(alone.explain) == {"identity", "shift", "mix"}  # one relation alone: no parts to show
    weighted = searcher.search([Query(doc_id="AAPL", relations={"shift": 2.0})], k=1, explain=True)[0][0]
    assert list(weighted.explain)[0] == "mixture:shift" and weighted.score == pytest.approx(
        weighted.explain["mixture:shift"], abs=1e-5)


def test_hits_carry_the_metadata_fields_asked_for(searcher):
    """Issue 28 item 7: ``fields`` (only those, in that order) and ``metadata`` false, checked in
    SearchOptions and applied after collapse (the collapse field need not be kept)."""
    from relsearch.retrieval.request import RequestError, SearchOptions, run

    query = [Query(doc_id="AAPL")]
    full = run(searcher, query, SearchOptions(k=4))[0]
    assert all(len(h.metadata) > 2 for h in full)
    chosen = run(searcher, query, SearchOptions(k=4, fields=["name", "gics_sector"]))[0]
    assert [h.id for h in chosen] == [h.id for h in full]
    assert all(h.metadata == {f: g.metadata[f] for f in ("name", "gics_sector") if f in g.metadata}
               and list(h.metadata)[:1] == ["name"] for h, g in zip(chosen, full))
    none = run(searcher, query, SearchOptions(k=4, metadata=False))[0]
    assert [h.metadata for h in none] == [{}] * 4 and [h.to_json()["metadata"] for h in none] == [{}] * 4
    collapsed = run(searcher, query, SearchOptions(k=4, collapse="gics_sector", fields=["name"]))[0]
    assert len(collapsed) == 4 and all(list(h.metadata) == ["name"] for h in collapsed)
    for options, says in ((SearchOptions(fields=["colour"]), "unknown field 'colour'; metadata fields: "),
                          (SearchOptions(fields="name"), "fields must be a list"),
                          (SearchOptions(fields=[""]), "fields must be a list"),
                          (SearchOptions(fields=["name"], metadata=False), "metadata false"),
                          (SearchOptions(metadata="no"), "metadata must be true or false")):
        with pytest.raises(RequestError, match=says) as e:
            options.check()
            options.check_against(searcher)
        assert e.value.field in ("fields", "metadata")


def test_filter_returns_k_whenever_k_match(searcher):
    # few matching documents, far from the query: an over-fetching ANN would return fewer than k
    sector = "Utilities"
    matching = searcher.files.docstore.matching({"gics_sector": sector})
    assert 3 <= len(matching) < 10
    hits = searcher.search([Query(text="video games", relations={"identity": 1.0})], k=len(matching),
                           filters={"gics_sector": sector})[0]
    assert len(hits) == len(matching) and all(h.metadata["gics_sector"] == sector for h in hits)
    more = searcher.search([Query(text="video games")], k=50, filters={"gics_sector": sector})[0]
    assert len(more) == len(matching)  # never padded with non-matching documents


def test_batched_queries_match_single_queries(searcher):
    qs = [Query(text="oil and gas exploration", relations={"mix": 1.0}, query_id="a"),
          Query(doc_id="BAC", relations={"identity": 1.0}, query_id="b"),
          Query(text="retail pharmacy", relations={"shift": 0.5, "mix": 0.5}, query_id="c")]
    batched = searcher.search(qs, k=4)
    for q, hits in zip(qs, batched):
        assert [h.id for h in hits] == [h.id for h in searcher.search([q], k=4)[0]]


def test_errors_name_the_valid_choices(searcher):
    with pytest.raises(KeyError, match="available: identity, mix, shift"):
        searcher.search([Query(text="x", relations={"nope": 1.0})])
    with pytest.raises(QueryError, match="metadata fields: .*gics_sector"):
        searcher.search([Query(text="x")], filters={"colour": "red"})
    with pytest.raises(QueryError, match="not in the index: NOPE"):
        searcher.search([Query(doc_id="NOPE")])


def test_index_built_with_another_encoder_is_refused(small_index, tmp_path):
    Bundle(encoder={"model": "other", "dim": 384, "weights_sha256": "0" * 16, "pooling": "mean"}).save(tmp_path / "b")
    with pytest.raises(QueryError, match="re-index"):
        Searcher(str(small_index), str(tmp_path / "b"))


def test_json_output_shape(searcher):
    hit = searcher.search([Query(doc_id="ADBE")], k=1)[0][0]
    row = hit.to_json(rank=1)
    assert list(row) == ["rank", "id", "score", "text", "metadata"] and "gics_sector" in row["metadata"]
    assert row["id"] != "ADBE"
    json.dumps(row)


@pytest.fixture(scope="module")
def graph_index(small_index, tmp_path_factory):
    """The small index's own vectors and documents rebuilt as an HNSW graph through the indexer functions."""
    from relsearch.indexer.build import Block, build_published
    from relsearch.indexer.faiss_index import FaissSpec

    files = open_index(small_index)
    rows = [r for rows in files.docstore.rows() for r in rows]
    raw = np.asarray(files.vectors) * np.array([r[4] for r in rows], dtype=np.float32)[:, None]
    block = Block([{"id": r[1], "text": r[2], "metadata": r[3]} for r in rows], raw)
    target = tmp_path_factory.mktemp("graph") / "idx"
    build_published(str(target), [block], n=len(rows), d=raw.shape[1], encoder=files.manifest.encoder,
                    spec=FaissSpec(factory="HNSW8", tune_queries=50))
    return target


def test_tuned_parameters_are_used_and_can_be_overridden(graph_index, searcher):
    graph = Searcher(str(graph_index))
    assert set(graph.tuned_params) == {"efSearch"} and graph.effective_params({"efSearch": "99"})["efSearch"] == 99
    hits = graph.search([Query(doc_id="ADBE")], k=5, params={"efSearch": 200})[0]
    assert [h.id for h in hits] == exact_top(graph, graph.files.vectors[graph.files.docstore.positions(["ADBE"])["ADBE"]],
                                             5, exclude="ADBE")[0]
    with pytest.raises(ValueError, match="valid: efSearch, rerank"):
        Searcher(str(graph_index), search_params={"nprobe": 4})
    with pytest.raises(ValueError, match="valid: rerank"):  # the small index is exact (Flat): nothing to tune
        Searcher(str(searcher.files.root), search_params={"efSearch": 4})


def test_broad_filter_goes_through_faiss_with_an_id_selector(graph_index):
    graph = Searcher(str(graph_index), exact_subset_max=0)  # force the IDSelector path
    sector = "Utilities"
    matching = graph.files.docstore.matching({"gics_sector": sector})
    hits = graph.search([Query(text="video games")], k=len(matching) + 5, filters={"gics_sector": sector})[0]
    assert len(hits) == len(matching) and all(h.metadata["gics_sector"] == sector for h in hits)
    wide = graph.search([Query(text="software")], k=10, filters={"gics_sector": "Information Technology"})[0]
    exact = Searcher(str(graph_index)).search([Query(text="software")], k=10,
                                              filters={"gics_sector": "Information Technology"})[0]
    assert [h.id for h in wide] == [h.id for h in exact]


def test_a_cpu_only_searcher_never_asks_where_to_search(small_index, bundle_dir, monkeypatch):
    """No GPU (GpuFacts says none): decided once when the Searcher opens, so no search asks
    indexer/gpu.py again; with a GPU each batch still asks (big unfiltered batches go there)."""
    from relsearch.indexer import gpu

    asked = []
    monkeypatch.setattr(gpu, "search_device", lambda *a, **k: asked.append(a[1]) or "cpu")
    q = np.asarray(open_index(str(small_index)).vectors[:2])
    cpu = Searcher(str(small_index), bundle_dir, gpu_facts=gpu.GpuFacts(False, 0)).ann(q, 3)
    assert asked == []
    claimed = Searcher(str(small_index), bundle_dir, gpu_facts=gpu.GpuFacts(True, 1)).ann(q, 3)
    assert asked == [2]
    np.testing.assert_array_equal(cpu.positions, claimed.positions)
