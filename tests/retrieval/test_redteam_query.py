"""Issue 12, the query surface: forged hits, unbounded k and depth, bad weights and text, typed
filters, query-file ids and lines. A synthetic index (no transformer) whose documents carry
metadata named like a hit's own fields and a ``flag`` field of every JSON type."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.indexer import records as rec
from relsearch.indexer.docstore import DocStore
from relsearch.pipelines.lookup import LookupInputError, LookupJob, run_lookup
from relsearch.retrieval.elastic import filter_clauses
from relsearch.retrieval.inputs import MAX_K, MAX_WEIGHT, filter_value
from relsearch.retrieval.queries import read_queries
from relsearch.retrieval.request import RequestError, SearchOptions
from relsearch.retrieval.search import Hit, Query, Searcher
from synthetic_index import D, raw_vectors

# flag values of d0..d9, one per JSON type a filter must tell apart
FLAGS = [True, False, 1, 1.0, "1", "true", 0, 2.5, "x", None]
FORGED = {"id": "FAKE-ID", "score": 1.0, "rank": 0, "explain": {"identity": 1.0}}


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    from relsearch.indexer.build import Block, build_published
    from relsearch.indexer.faiss_index import FaissSpec
    from synthetic_index import encoder_identity

    docs = [{"id": f"d{i}", "text": f"text of d{i}", "metadata": {**FORGED, "flag": flag}} for i, flag in enumerate(FLAGS)]
    target = tmp_path_factory.mktemp("forged") / "idx"
    build_published(str(target), [Block(docs, raw_vectors(len(docs), seed=3))], n=len(docs), d=D,
                    encoder=encoder_identity(), spec=FaissSpec(factory="Flat", tune_queries=5))
    return target


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_hit_json_nests_metadata_so_it_cannot_forge_the_hit():
    hit = Hit("d1", 0.25, "t", dict(FORGED), {"identity": 0.25})
    assert hit.to_json(rank=3) == {"rank": 3, "id": "d1", "score": 0.25, "text": "t", "metadata": FORGED,
                                   "explain": {"identity": 0.25}}
    reranked = Hit("d1", 0.9, "t", dict(FORGED), ann_score=0.25, ann_rank=2, reranker="h").to_json(1)
    assert (reranked["id"], reranked["score"], reranked["ann_rank"], reranked["metadata"]) == ("d1", 0.9, 2, FORGED)


def test_json_outputs_keep_the_real_id_and_score(forged, tmp_path):
    lines = invoke("query", "--id", "d0", "--index", forged, "-k", "3", "--json").output.splitlines()
    hits = [json.loads(line) for line in lines]
    assert [h["rank"] for h in hits] == [1, 2, 3] and all(h["metadata"]["id"] == "FAKE-ID" for h in hits)
    assert {h["id"] for h in hits} < {f"d{i}" for i in range(1, 10)} and all(h["score"] < 1 for h in hits)
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"doc_id": "d0"}\n')
    (row,) = [json.loads(x) for x in invoke("query", "--queries", queries, "--index", forged, "--json").output.splitlines()]
    assert [h["id"] for h in row["results"]][:3] == [h["id"] for h in hits]
    queries.write_text('{"id": "d0"}\n')  # the lookup job's input format
    out = tmp_path / "out.jsonl"
    run_lookup(LookupJob(input=str(queries), index=str(forged), out=str(out), k=3))
    assert [h["id"] for h in json.loads(out.read_text())["results"]] == [h["id"] for h in hits]


def test_k_and_depth_are_bounded_and_clipped_to_the_index(forged, tmp_path):
    huge = invoke("query", "--id", "d0", "--index", forged, "-k", 3_000_000_000)
    assert huge.exit_code == 2 and f"1<=x<={MAX_K}" in huge.output and "Traceback" not in huge.output
    every = invoke("query", "--id", "d0", "--index", forged, "-k", MAX_K, "--json").output.splitlines()
    assert len(every) == 9  # all ten documents but the query's own
    depth = invoke("query", "--id", "d0", "--index", forged, "--rerank", "h", "--rerank-depth", 10 ** 8)
    assert depth.exit_code == 2 and "--rerank-depth" in depth.output
    searcher = Searcher(str(forged))
    assert len(searcher.search([Query(doc_id="d0")], k=3_000_000_000)[0]) == 9  # clipped, not allocated
    with pytest.raises(RequestError, match="rerank_depth must be between 1 and 10,000"):
        SearchOptions(rerank="h", rerank_depth=10 ** 8).check()
    with pytest.raises(LookupInputError, match="k must be between 1 and 10,000"):
        LookupJob(input="in.jsonl", index=str(forged), out="o.jsonl", k=3_000_000_000)
    assert invoke("lookup", "in.jsonl", "--index", forged, "--out", tmp_path / "o", "-k", 10 ** 9).exit_code == 2


@pytest.mark.parametrize("weights, message", [
    (["identity=nan"], "relation weight in 'identity=nan' is not a finite number"),
    (["identity=inf"], "relation weight in 'identity=inf' is not a finite number"),
    (["identity=1e308"], "relation 'identity': weight 1e+308 is beyond ±1e+06"),
    (["identity=0"], "relation weights are all zero (identity=0): give at least one non-zero weight"),
    (["identity=0.5", "identity=-0.5"], "relation 'identity' given twice: give each relation once, with its weight"),
])
def test_weights_that_give_junk_are_refused_in_one_line(forged, weights, message):
    args = [x for w in weights for x in ("--relation", w)]
    out = invoke("query", "--id", "d0", "--index", forged, *args)
    assert out.exit_code == 1 and out.output.strip() in (f"Error: {message}", f"Error: --relation: {message}")


def test_query_file_weights_are_checked_per_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"text": "x", "relation": r}) + "\n" for r in (
        {"identity": 1e308}, {"identity": 0}, {"identity": MAX_WEIGHT}, {"identity": 10 ** 400})))
    queries, errors = read_queries(str(path), {"identity": 1.0})
    assert [q.line for q in queries] == [3]
    assert [(e["line"], e["error"].split(":")[0]) for e in errors] == [
        (1, "relation 'identity'"), (2, "relation weights are all zero (identity=0)"), (4, "relation 'identity'")]


def test_query_file_reads_the_http_apis_relations_key_too(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in (
        {"text": "x", "relations": {"identity": float("nan")}}, {"text": "x", "relations": {"paraphrase": 2}},
        {"text": "x", "relation": "identity", "relations": {"identity": 1}})))
    queries, errors = read_queries(str(path), {"identity": 1.0})
    assert [(q.line, q.relations) for q in queries] == [(2, {"paraphrase": 2.0})]
    assert [e["line"] for e in errors] == [1, 3] and "not both" in errors[1]["error"]


def test_empty_and_undecodable_query_text_is_refused(forged):
    for text, message in [("   ", "query text is empty"), ("caf\udce9 bank", "query text is not valid UTF-8")]:
        out = invoke("query", text, "--index", forged)  # click hands undecodable argv bytes over as surrogates
        assert out.exit_code == 1 and out.output.strip() == f"Error: TEXT: {message}"
    out = invoke("query", "--id", "caf\udce9", "--index", forged)
    assert out.output.strip() == "Error: --id: query document id is not valid UTF-8"


def test_max_length_must_be_positive(tmp_path):
    out = invoke("index", tmp_path / "c.jsonl", "--index", tmp_path / "idx", "--max-length", "-5")
    assert out.exit_code == 2 and "'--max-length': -5 is not in the range x>=1" in out.output


# (CLI value, metadata flag values it must match): numbers compare as numbers, booleans only as
# booleans, strings only as strings; "1" in double quotes is the string.
FILTER_TABLE = [
    ("true", [True]), ("false", [False]), ("1", [1, 1.0]), ("1.0", [1, 1.0]), ('"1"', ["1"]),
    ('"true"', ["true"]), ("0", [0]), ("2.5", [2.5]), ("x", ["x"]), ('"x"', ["x"]), ("null", []), ("True", []),
]


@pytest.mark.parametrize("spec, expected", FILTER_TABLE)
def test_filter_semantics_table(tmp_path, spec, expected):
    store = DocStore(str(tmp_path / "d.sqlite"), create=True)
    store.add((i, f"d{i}", "t", {"flag": flag}, 1.0) for i, flag in enumerate(FLAGS))
    matched = [FLAGS[p] for p in store.matching({"flag": filter_value(spec)})]
    assert matched == expected and [type(v) for v in matched] == [type(v) for v in expected]
    assert filter_clauses({"flag": filter_value(spec)}) == [{"term": {"metadata.flag": filter_value(spec)}}]


def test_cli_filters_are_typed(forged):
    def ids(spec):
        out = invoke("query", "--id", "d9", "--index", forged, "--filter", f"flag={spec}", "--json")
        assert out.exit_code == 0, out.output
        return sorted(json.loads(line)["id"] for line in out.output.splitlines())

    assert (ids("true"), ids("1"), ids('"1"')) == (["d0"], ["d2", "d3"], ["d4"])


def test_query_file_ids_are_strings_and_errors_name_lines(forged, tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"id": "a", "doc_id": "d1"}, {"doc_id": "d2"}, {"text": "no id"}, {"id": 7, "text": "int id"},
            {"id": 1.5, "text": "float id"}, {"doc_id": True}, {"query_id": ["l"], "text": "list"},
            {"id": "q8", "doc_id": "NOPE"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    queries, errors = read_queries(str(path), {"identity": 1.0})
    assert [(q.query_id, q.line) for q in queries] == [("a", 1), ("d2", 2), ("3", 3), ("7", 4), ("q8", 8)]
    assert [e["line"] for e in errors] == [5, 6, 7] and all(e["error"].startswith(rec.NON_STRING_ID) for e in errors)
    out = invoke("query", "--queries", path, "--index", forged, "--json")
    assert out.exit_code == 1 and f"{path}:8: doc_id 'NOPE' is not in the index" in out.output


def test_corpus_without_the_text_field_names_the_fields_it_has(tmp_path):
    from relsearch.pipelines.index import IndexInputError, IndexJob, run_index

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"a{i}", "text": "t", "sector": "s"}) + "\n" for i in range(3)) + "\n")
    with pytest.raises(IndexInputError, match="no line has field 'txt'; fields seen: id, text, sector$"):
        run_index(IndexJob(input=str(corpus), index=str(tmp_path / "idx"), text_field="txt", progress=False))
    assert rec.missing_field_hint(str(corpus), {rec.MISSING_TEXT: 2, rec.EMPTY_TEXT: 1}) == ""  # not only missing
