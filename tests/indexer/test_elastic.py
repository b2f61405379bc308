"""Elasticsearch backend, driven through the official client over real HTTP against tests/es_server.py.

The last test is opt-in against a real server: ``RELSEARCH_TEST_ES_URL=https://... pytest -m elasticsearch``.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import uuid

import numpy as np
import pytest

from relsearch.indexer.elastic import (
    BulkAborted,
    BulkCounts,
    EsIndexConfig,
    bulk_index,
    connect,
    create_index,
    text_analysis,
    delete_index,
    index_meta,
    metadata_types,
    resolve_credentials,
    swap_alias,
)
from relsearch.retrieval.elastic import Hit, filter_clauses, knn_search, rrf_fuse

from es_server import EsTestServer

SECRET = "c2VjcmV0LWlkOnMzY3IzdC1rM3k="  # an API key that must never surface
PASSWORD = "hunter2-Pa55w0rd"
SAMPLE = {"country": "US", "year": 2020, "public": True, "rating": 4.5}


@pytest.fixture
def server():
    with EsTestServer(lifetime_s=60) as srv:
        yield srv


@pytest.fixture
def client(server):
    es = connect(server.url, environ={}, retries=2, retry_backoff=0)
    yield es
    es.close()


def _docs(n: int, dims: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    countries = ["US", "FR", "DE"]
    words = ["apple", "banana", "cherry", "delta", "echo"]
    return [{"id": f"d{i}", "text": f"{words[i % 5]} {words[(i * 3) % 5]} document {i}",
             "vector": (rng.normal(size=dims) * 3).astype(np.float32), "norm": float(i + 1),
             "country": countries[i % 3], "metadata": {"year": 2000 + i % 4}} for i in range(n)]


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _load(client, name="idx", n=30, dims=8, **config):
    docs = _docs(n, dims)
    create_index(client, name, EsIndexConfig(dims=dims, **config), SAMPLE)
    counts = bulk_index(client, name, docs, initial_backoff=0.01)
    assert counts == BulkCounts(read=n, indexed=n, failed=0)
    return docs


# ---- mapping --------------------------------------------------------------------------------

def test_mapping_payload(server, client):
    create_index(client, "idx", EsIndexConfig(dims=8, shards=2, replicas=0), SAMPLE, meta={"bundle": "minilm@abc"})
    (put,) = server.recorded("PUT", "/idx")
    body = put.json()
    props = body["mappings"]["properties"]
    assert props["vector"] == {"type": "dense_vector", "dims": 8, "index": True, "similarity": "dot_product",
                               "index_options": {"type": "int8_hnsw"}}
    assert props["text"]["type"] == "text"
    assert props["id"] == {"type": "keyword"} and props["norm"] == {"type": "float"}
    assert props["metadata"]["properties"] == {"country": {"type": "keyword"}, "year": {"type": "long"},
                                               "public": {"type": "boolean"}, "rating": {"type": "double"}}
    assert body["mappings"]["dynamic"] == "strict"
    template = body["mappings"]["dynamic_templates"][0]["metadata_strings"]
    assert template["path_match"] == "metadata.*" and template["mapping"] == {"type": "keyword"}
    assert body["settings"] == {"number_of_shards": 2, "number_of_replicas": 0, **text_analysis()}
    # the text is analysed as the local BM25 tokenises it, with its k1 and b (indexer/lexical.py)
    analysis = body["settings"]["analysis"]
    assert analysis["tokenizer"]["relsearch_words"]["pattern"] == r"\w\w+"
    assert set(analysis["filter"]["relsearch_stop"]["stopwords"]) >= {"the", "and", "of"}
    assert body["settings"]["similarity"]["relsearch_bm25"] == {"type": "BM25", "k1": 1.5, "b": 0.75}
    assert body["mappings"]["properties"]["text"] == {"type": "text", "analyzer": "relsearch",
                                                      "similarity": "relsearch_bm25"}
    meta = index_meta(client, "idx")
    assert meta["config"]["dims"] == 8 and meta["config"]["index_type"] == "int8_hnsw" and meta["version"]
    assert meta["bundle"] == "minilm@abc"


@pytest.mark.parametrize("config, options", [
    (dict(index_type="hnsw", m=32, ef_construction=200), {"type": "hnsw", "m": 32, "ef_construction": 200}),
    (dict(index_type="int8_flat", confidence_interval=0.95), {"type": "int8_flat", "confidence_interval": 0.95}),
    (dict(index_type="bbq_hnsw", dims=64), {"type": "bbq_hnsw"}),
    (dict(index_type="flat"), {"type": "flat"}),
])
def test_index_options_are_configurable(config, options):
    config = {"dims": 8, **config}
    assert EsIndexConfig(**config).vector_mapping()["index_options"] == options


@pytest.mark.parametrize("config, message", [
    (dict(dims=0), "dims"),
    (dict(dims=8, similarity="l2_norm"), "l2_norm"),
    (dict(dims=8, index_type="ivf"), "ivf"),
    (dict(dims=8, index_type="flat", m=16), "HNSW"),
    (dict(dims=32, index_type="bbq_hnsw"), "dims >= 64"),
    (dict(dims=7, index_type="int4_hnsw"), "even"),
    (dict(dims=8, index_type="hnsw", confidence_interval=0.9), "int8/int4"),
])
def test_config_errors_name_the_bad_value(config, message):
    with pytest.raises(ValueError, match=message):
        EsIndexConfig(**config)


def test_metadata_types_and_errors():
    assert metadata_types({"tags": ["a", "b"], "n": np.int64(3), "missing": None}) == {"tags": "keyword", "n": "long"}
    with pytest.raises(ValueError, match="'nested'"):
        metadata_types({"nested": {"a": 1}})
    with pytest.raises(ValueError, match="a.b"):
        metadata_types({"a.b": 1})


def test_create_existing_index_and_delete(server, client):
    create_index(client, "idx", EsIndexConfig(dims=4))
    with pytest.raises(FileExistsError, match="'idx'"):
        create_index(client, "idx", EsIndexConfig(dims=4))
    with pytest.raises(ValueError, match="Bad_Name"):
        create_index(client, "Bad_Name", EsIndexConfig(dims=4))
    assert delete_index(client, "idx") is True
    assert delete_index(client, "idx") is False
    assert "idx" not in server.indices


# ---- bulk -----------------------------------------------------------------------------------

def test_bulk_lines(server, client):
    docs = _docs(20, 8)
    create_index(client, "idx", EsIndexConfig(dims=8), SAMPLE)
    counts = bulk_index(client, "idx", docs, chunk_size=7, dims=8)
    assert counts == BulkCounts(read=20, indexed=20, failed=0) and counts.reconciles
    requests = server.recorded("PUT", "/_bulk")
    assert len(requests) == 3  # 7 + 7 + 6
    lines = [line for r in requests for line in r.ndjson()]
    actions, sources = lines[0::2], lines[1::2]
    assert actions[0] == {"index": {"_index": "idx", "_id": "d0"}}
    assert [a["index"]["_id"] for a in actions] == [d["id"] for d in docs]
    src = sources[5]
    assert set(src) == {"id", "text", "vector", "norm", "metadata"}
    np.testing.assert_allclose(src["vector"], _unit(docs[5]["vector"]), rtol=1e-6)
    assert abs(np.linalg.norm(src["vector"]) - 1) < 1e-6
    assert src["norm"] == 6.0 and src["metadata"] == {"year": 2001, "country": "DE"}
    assert server.recorded("POST", "/idx/_refresh")
    assert len(server.indices["idx"].docs) == 20


def test_bulk_rejections_reach_the_sink_and_counts_reconcile(server, client):
    docs = _docs(12, 8)
    docs[2] = {**docs[2], "vector": [np.nan] * 8}
    docs[4] = {k: v for k, v in docs[4].items() if k != "id"}
    docs[6] = {**docs[6], "vector": np.zeros(8)}
    docs[8] = {**docs[8], "vector": np.ones(5)}  # wrong dims: the server rejects it
    server.fail_item("d10", 400, reason="scripted: bad document")
    create_index(client, "idx", EsIndexConfig(dims=8), SAMPLE)
    rejected: list[tuple] = []
    counts = bulk_index(client, "idx", docs, chunk_size=5, rejected_sink=lambda i, r: rejected.append((i, r)))
    assert counts == BulkCounts(read=12, indexed=7, failed=5) and counts.reconciles
    reasons = dict(rejected)
    assert set(reasons) == {"d2", None, "d6", "d8", "d10"}
    assert "NaN" in reasons["d2"] and "input #2" in reasons["d2"]
    assert "missing id" in reasons[None] and "zeros" in reasons["d6"]
    assert reasons["d8"].startswith("400 document_parsing_exception") and "dimensions" in reasons["d8"]
    assert reasons["d10"] == "400 document_parsing_exception: scripted: bad document"
    assert len(server.indices["idx"].docs) == counts.indexed


def test_bulk_local_dims_check(server, client):
    create_index(client, "idx", EsIndexConfig(dims=8))
    rejected = []
    counts = bulk_index(client, "idx", [{"id": "a", "vector": np.ones(3)}], dims=8,
                        rejected_sink=lambda i, r: rejected.append((i, r)))
    assert counts == BulkCounts(read=1, indexed=0, failed=1)
    assert rejected == [("a", "input #0: vector has 3 dims, the index has 8")]
    assert not server.recorded("PUT", "/_bulk")


def test_bulk_retries_429_then_succeeds(server, client):
    create_index(client, "idx", EsIndexConfig(dims=8), SAMPLE)
    server.fail_next("PUT", "/_bulk", 429, times=2)  # whole request rejected twice
    server.fail_item("d3", 429, times=1, error_type="es_rejected_execution_exception")  # one item once
    counts = bulk_index(client, "idx", _docs(10, 8), max_retries=4, initial_backoff=0.01)
    assert counts == BulkCounts(read=10, indexed=10, failed=0)
    bulks = server.recorded("PUT", "/_bulk")
    assert len(bulks) == 4  # 429, 429, all-but-d3, d3 alone
    assert [line["index"]["_id"] for line in bulks[-1].ndjson()[0::2]] == ["d3"]
    assert len(server.indices["idx"].docs) == 10


def test_bulk_429_exhausted_raises_with_counts(server, client):
    create_index(client, "idx", EsIndexConfig(dims=8), SAMPLE)
    server.fail_next("PUT", "/_bulk", 429, times=100)
    with pytest.raises(BulkAborted, match="status 429") as info:
        bulk_index(client, "idx", _docs(10, 8), chunk_size=4, max_retries=2, initial_backoff=0.01)
    assert info.value.counts == BulkCounts(read=5, indexed=0, failed=0)  # the chunker reads one ahead
    assert info.value.unresolved == 5
    assert len(server.recorded("PUT", "/_bulk")) == 3


def test_transport_retries_5xx(server, client):
    _load(client)
    server.fail_next("POST", "/idx/_search", 503, times=1)
    hits = knn_search(client, "idx", np.ones((1, 8)), k=3)
    assert len(hits[0]) == 3
    assert len(server.recorded("POST", "/idx/_search")) == 2


# ---- search ---------------------------------------------------------------------------------

def test_knn_body_and_exact_results(server, client):
    docs = _load(client)
    query = np.arange(1, 9, dtype=np.float32)[None, :]  # not unit length
    (hits,) = knn_search(client, "idx", query, k=4, num_candidates=50, filters={"country": "US"})
    body = server.recorded("POST", "/idx/_search")[-1].json()
    knn = body["knn"]
    assert abs(np.linalg.norm(knn["query_vector"]) - 1) < 1e-6
    np.testing.assert_allclose(knn["query_vector"], _unit(query[0]), rtol=1e-6)
    assert knn["field"] == "vector" and knn["k"] == 4 and knn["num_candidates"] == 50
    assert knn["filter"] == [{"term": {"metadata.country": "US"}}]
    assert body["size"] == 4 and body["_source"] == {"excludes": ["vector"]}
    # Oracle: exact cosine over the US documents.
    us = [d for d in docs if d["country"] == "US"]
    cos = _unit(np.stack([d["vector"] for d in us])) @ _unit(query[0])
    order = np.argsort(-cos)[:4]
    assert [h.id for h in hits] == [us[i]["id"] for i in order]
    np.testing.assert_allclose([h.score for h in hits], cos[order], atol=1e-5)
    first = us[order[0]]
    assert hits[0] == Hit(id=first["id"], score=hits[0].score, text=first["text"],
                          metadata={"year": first["metadata"]["year"], "country": "US"}, norm=first["norm"])


def test_knn_many_rows_and_list_filters(server, client):
    _load(client)
    rng = np.random.default_rng(1)
    results = knn_search(client, "idx", rng.normal(size=(3, 8)), k=5, filters={"country": ["FR", "DE"], "year": "2001"})
    assert len(results) == 3
    for hits in results:
        assert hits and all(h.metadata["country"] in ("FR", "DE") and h.metadata["year"] == 2001 for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert knn_search(client, "idx", rng.normal(size=8), k=2)[0][0].id  # (d,) is one query
    assert server.recorded("POST", "/idx/_search")[0].json()["knn"]["filter"] == [
        {"terms": {"metadata.country": ["FR", "DE"]}}, {"term": {"metadata.year": "2001"}}]


@pytest.mark.parametrize("kwargs, message", [
    (dict(query_vectors=np.zeros((2, 8))), r"rows \[0, 1\]"),
    (dict(k=0), "k must"),
    (dict(k=20, num_candidates=10), "num_candidates"),
    (dict(fusion="magic"), "magic"),
    (dict(hybrid_text=["a", "b"]), "2 texts for 1"),
    (dict(filters={"country": None}), "'country'"),
])
def test_knn_errors_name_the_bad_value(kwargs, message):
    args = {"query_vectors": np.ones((1, 8)), "k": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        knn_search(None, "idx", args.pop("query_vectors"), **args)


def test_filter_clauses():
    assert filter_clauses(None) == []
    assert filter_clauses({"b": True, "a": np.int64(3), "c": {"y", "x"}}) == [
        {"term": {"metadata.a": 3}}, {"term": {"metadata.b": True}}, {"terms": {"metadata.c": ["x", "y"]}}]


def test_hybrid_rrf_body_and_server_client_agreement(server, client):
    _load(client)
    q = np.random.default_rng(2).normal(size=(2, 8))
    texts = ["apple cherry", "banana"]
    server_hits = knn_search(client, "idx", q, k=5, num_candidates=20, hybrid_text=texts, filters={"year": 2002})
    body = server.recorded("POST", "/idx/_search")[0].json()
    rrf = body["retriever"]["rrf"]
    assert rrf["rank_constant"] == 60 and rrf["rank_window_size"] == 20 and body["size"] == 5
    standard, knn = rrf["retrievers"][0]["standard"], rrf["retrievers"][1]["knn"]
    assert standard["query"] == {"match": {"text": {"query": "apple cherry"}}}
    assert standard["filter"] == knn["filter"] == [{"term": {"metadata.year": 2002}}]
    assert knn["k"] == 20 and knn["num_candidates"] == 20 and abs(np.linalg.norm(knn["query_vector"]) - 1) < 1e-6
    client_hits = knn_search(client, "idx", q, k=5, num_candidates=20, hybrid_text=texts, filters={"year": 2002},
                             fusion="client")
    for s_hits, c_hits in zip(server_hits, client_hits):  # equal RRF scores may trade places (ES leaves ties open)
        assert sorted((round(h.score, 9), h.id) for h in s_hits) == sorted((round(h.score, 9), h.id) for h in c_hits)
        np.testing.assert_allclose([h.score for h in s_hits], [h.score for h in c_hits])
        assert all(h.metadata["year"] == 2002 for h in s_hits)
    assert server_hits[0][0].score <= 2 / 61  # RRF scores, not cosines


def test_hybrid_without_rrf_licence_points_to_client_fusion(server, client):
    _load(client)
    server.rrf_allowed = False
    with pytest.raises(RuntimeError, match="fusion='client'"):
        knn_search(client, "idx", np.ones((1, 8)), k=3, hybrid_text="apple")
    assert len(knn_search(client, "idx", np.ones((1, 8)), k=3, hybrid_text="apple", fusion="client")[0]) == 3


def test_rrf_fuse():
    fused = rrf_fuse([["a", "b", "c"], ["c", "a", "d"]], rank_constant=1)
    assert [d for d, _ in fused] == ["a", "c", "b", "d"]
    assert dict(fused) == pytest.approx({"a": 1 / 2 + 1 / 3, "c": 1 / 4 + 1 / 2, "b": 1 / 3, "d": 1 / 4})
    # Window: only the first 2 of each list count; top_k truncates.
    assert rrf_fuse([["a", "b", "c"], ["c", "d"]], rank_window_size=2, top_k=2) == [
        ("a", pytest.approx(1 / 61)), ("c", pytest.approx(1 / 61))]
    # Ties break on best rank, then first appearance; a repeated id counts once.
    assert [d for d, _ in rrf_fuse([["x", "y"], ["y", "x"]])] == ["x", "y"]
    assert rrf_fuse([["a", "a", "b"]]) == [("a", pytest.approx(1 / 61)), ("b", pytest.approx(1 / 63))]
    assert rrf_fuse([]) == [] and rrf_fuse([[], []]) == []
    with pytest.raises(ValueError, match="rank_constant"):
        rrf_fuse([["a"]], rank_constant=0)


def test_swap_alias_publishes_atomically(server, client):
    _load(client, "idx-1")
    _load(client, "idx-2", index_type="hnsw")
    assert swap_alias(client, "live", "idx-1") == []
    assert index_meta(client, "live")["config"]["index_type"] == "int8_hnsw"
    assert swap_alias(client, "live", "idx-2") == ["idx-1"]
    assert server.aliases == {"live": {"idx-2"}}
    assert index_meta(client, "live")["config"]["index_type"] == "hnsw"
    assert knn_search(client, "live", np.ones(8), k=2)[0]
    with pytest.raises(FileExistsError):
        create_index(client, "live", EsIndexConfig(dims=8))


# ---- credentials ----------------------------------------------------------------------------

def _auth_header(server) -> str:
    return server.recorded("GET", "/")[-1].headers.get("authorization", "")


def test_api_key_from_env(server):
    server.require_auth(f"ApiKey {SECRET}")
    es = connect(server.url, environ={"RELSEARCH_ES_API_KEY": SECRET, "RELSEARCH_ES_USER": "ignored"})
    assert es.info()["version"]["number"].startswith("9.")
    assert _auth_header(server) == f"ApiKey {SECRET}"
    es.close()


def test_basic_auth_from_env(server):
    token = base64.b64encode(f"elastic:{PASSWORD}".encode()).decode()
    server.require_auth(f"Basic {token}")
    es = connect(server.url, environ={"RELSEARCH_ES_USER": "elastic", "RELSEARCH_ES_PASSWORD": PASSWORD})
    es.info()
    assert _auth_header(server) == f"Basic {token}"
    es.close()


def test_no_credentials_sends_no_authorization(server, client):
    client.info()
    assert _auth_header(server) == ""


def test_credentials_file(server, tmp_path):
    path = tmp_path / "es.json"
    path.write_text(json.dumps({"username": "svc", "password": PASSWORD}))
    path.chmod(0o600)
    # The explicit option wins over the environment; the env file is used when nothing else is set.
    es = connect(server.url, credentials_file=path, environ={"RELSEARCH_ES_API_KEY": SECRET})
    es.info()
    assert _auth_header(server) == "Basic " + base64.b64encode(f"svc:{PASSWORD}".encode()).decode()
    es.close()
    path.write_text(json.dumps({"api_key": SECRET}))
    es = connect(server.url, environ={"RELSEARCH_ES_CREDENTIALS": str(path)})
    es.info()
    assert _auth_header(server) == f"ApiKey {SECRET}"
    es.close()


def test_world_readable_credentials_file_warns(tmp_path, caplog):
    path = tmp_path / "es.json"
    path.write_text(json.dumps({"api_key": SECRET}))
    path.chmod(0o644)
    caplog.set_level(logging.WARNING, logger="relsearch.indexer.elastic")  # importing the CLI raises the root level
    assert resolve_credentials(path, environ={}).kind == "api_key"
    assert "chmod 600" in caplog.text and SECRET not in caplog.text


def test_credential_errors_do_not_echo_secrets(tmp_path):
    with pytest.raises(ValueError, match="RELSEARCH_ES_PASSWORD is not set"):
        resolve_credentials(environ={"RELSEARCH_ES_USER": "elastic"})
    bad = tmp_path / "bad.json"
    bad.write_text(f"{{'api_key': '{SECRET}'")
    with pytest.raises(ValueError, match="not valid JSON") as info:
        resolve_credentials(bad, environ={})
    assert SECRET not in str(info.value) and info.value.__cause__ is None and info.value.__suppress_context__
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"token": SECRET}))
    with pytest.raises(ValueError, match=r"keys found: \['token'\]") as info:
        resolve_credentials(wrong, environ={})
    assert SECRET not in str(info.value)
    with pytest.raises(ValueError, match="cannot read"):
        resolve_credentials(tmp_path / "missing.json", environ={})
    with pytest.raises(ValueError, match="must not embed credentials") as info:
        connect(f"https://elastic:{PASSWORD}@localhost:9200", environ={})
    assert PASSWORD not in str(info.value)
    with pytest.raises(ValueError, match="https://host:9200"):
        connect("localhost:9200", environ={})
    creds = resolve_credentials(environ={"RELSEARCH_ES_USER": "u", "RELSEARCH_ES_PASSWORD": PASSWORD})
    assert PASSWORD not in repr(creds) and "basic" in repr(creds)


def test_secrets_never_reach_logs_reprs_errors_or_payloads(server, caplog):
    caplog.set_level(logging.DEBUG)
    es = connect(server.url, environ={"RELSEARCH_ES_API_KEY": SECRET}, retry_backoff=0)
    _load(es)
    knn_search(es, "idx", np.ones((1, 8)), k=3, hybrid_text="apple")
    server.require_auth("ApiKey someone-else")
    with pytest.raises(Exception) as info:
        knn_search(es, "idx", np.ones((1, 8)), k=3)
    assert getattr(info.value, "status_code", None) == 401
    texts = [caplog.text, repr(es), str(es), str(info.value), repr(info.value), repr(getattr(info.value, "meta", ""))]
    texts += [r.body.decode() for r in server.recorded()]
    assert caplog.text  # something was logged
    for text in texts:
        assert SECRET not in text
    es.close()


# ---- recall against an exact search: in-suite server always, a real server on request -------

def _recall_roundtrip(es, name: str, *, n: int = 100, dims: int = 32, k: int = 10, score_atol: float = 1e-5) -> float:
    rng = np.random.default_rng(7)
    vectors = _unit(rng.normal(size=(n, dims))).astype(np.float32)
    docs = [{"id": f"r{i}", "text": f"doc {i}", "vector": v, "norm": 1.0, "group": f"g{i % 2}"}
            for i, v in enumerate(vectors)]
    queries = rng.normal(size=(10, dims)).astype(np.float32)
    try:
        create_index(es, name, EsIndexConfig(dims=dims), {"group": "g0"})
        assert bulk_index(es, name, docs, initial_backoff=0.1) == BulkCounts(read=n, indexed=n, failed=0)
        results = knn_search(es, name, queries, k=k, num_candidates=n)
    finally:
        delete_index(es, name)
    cos = _unit(queries) @ vectors.T
    exact = np.argsort(-cos, axis=1)[:, :k]
    found = [len({h.id for h in hits} & {f"r{i}" for i in row}) for hits, row in zip(results, exact)]
    for q, hits in enumerate(results):  # scores are cosines, like FAISS inner products
        expected = [cos[q, int(h.id[1:])] for h in hits]
        np.testing.assert_allclose([h.score for h in hits], expected, atol=score_atol)
    return sum(found) / (len(exact) * k)


def test_recall_against_exact_search_in_suite(client):
    assert _recall_roundtrip(client, "recall") == 1.0  # the in-suite server is exact


@pytest.mark.elasticsearch
@pytest.mark.skipif(not os.environ.get("RELSEARCH_TEST_ES_URL"), reason="set RELSEARCH_TEST_ES_URL to run")
def test_recall_against_exact_search_real_server():
    es = connect(os.environ["RELSEARCH_TEST_ES_URL"], ca_certs=os.environ.get("RELSEARCH_TEST_ES_CA_CERTS"))
    try:
        # int8_hnsw scores come from quantised vectors: close to the cosine, not equal.
        assert _recall_roundtrip(es, f"relsearch-test-{uuid.uuid4().hex[:12]}", score_atol=0.05) >= 0.9
    finally:
        es.close()
