"""Hostile input, property-based: generated corpora, query files, lookup inputs and id files thrown
at every reader. Each line is processed or rejected with a reason, nothing raises, counts reconcile.

Most properties run the readers in-process without the model (a stub encoder stands in for the
transformer in the shard round trip); two tests run the real pipeline once on a fixed hostile
corpus with tens-of-megabytes lines.
"""
from __future__ import annotations

import json
import os
import sqlite3

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from relsearch.indexer import records as rec
from relsearch.indexer.docstore import DocStore
from relsearch.pipelines import assemble
from relsearch.pipelines import index as index_job
from relsearch.pipelines.lookup import LookupInput, parse_lookup_line
from relsearch.retrieval.inputs import MAX_WEIGHT
from relsearch.retrieval.queries import read_queries
from relsearch.retrieval.search import Query

REASONS = {rec.UNDECODABLE, rec.INVALID_JSON, rec.NOT_OBJECT, rec.MISSING_ID, rec.EMPTY_ID, rec.NON_STRING_ID,
           rec.MISSING_TEXT, rec.NULL_TEXT, rec.EMPTY_TEXT, rec.NON_STRING_TEXT, rec.DUPLICATE_ID, rec.EMPTY_LINE, rec.LINE_TOO_LONG,
           rec.TEXT_TOO_LONG, rec.METADATA_TOO_LARGE, rec.INVALID_UNICODE}
# small limits so that generated lines cross them often
SMALL = rec.Limits(max_line_bytes=400, max_text_bytes=120, max_metadata_bytes=150)
# RELSEARCH_HYPOTHESIS_EXAMPLES=2000 for a long hunt; the default keeps `make test` fast
FAST = settings(max_examples=int(os.environ.get("RELSEARCH_HYPOTHESIS_EXAMPLES", "80")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------- generators

weird_text = st.text(alphabet=st.one_of(
    st.characters(codec="utf-8"),  # anything encodable, incl. NUL, U+2028, U+0085, RTL marks
    st.sampled_from(["\u2028", "\u2029", "\x85", "\x00", "\ufeff", "\r", "\n", " ", "\t", "\x1c"])), max_size=40)
ids = st.one_of(st.sampled_from(["a", "b", "c", " a ", "ä"]),  # few values: duplicates are common
                st.integers(min_value=-3, max_value=3), st.integers(min_value=10**30, max_value=10**31),
                st.just(True), st.just(1.5), st.just(None), st.just(""), st.just("  "),
                st.lists(st.just(1), max_size=2))
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         weird_text)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                 st.dictionaries(weird_text, inner, max_size=3)),
                           max_leaves=8)


@st.composite
def json_line(draw) -> bytes:
    """A JSON object line, usually close to a valid record."""
    obj = {}
    if draw(st.integers(0, 9)):
        obj["id"] = draw(ids)
    if draw(st.integers(0, 9)):
        obj["text"] = draw(st.one_of(weird_text, weird_text.map(lambda t: "word " * 30 + t), st.just("   "),
                                     st.integers(), st.none(), st.lists(st.just("x"), max_size=2)))
    obj.update(draw(st.dictionaries(st.sampled_from(["meta", "n", "nested", "", "a.b"]), json_values, max_size=3)))
    return json.dumps(obj, ensure_ascii=draw(st.booleans())).encode("utf-8")


raw_lines = st.one_of(
    json_line(),
    json_line(),
    json_line().map(lambda b: rec.BOM + b),  # a byte-order mark (editors on Windows)
    st.binary(max_size=60),  # arbitrary bytes: invalid UTF-8, NUL, half JSON
    st.sampled_from([b"", b"   ", b"\t", b"[1, 2]", b"42", b'"text"', b"null", b"{", b'{"id": "a", "text": NaN}',
                     b'{"id": "a", "text": "t", "x": Infinity}', b'{"id": "a", "text": "t", "x": 1e999}',
                     b'{"id": 1' + b"1" * 5000 + b', "text": "huge int"}',
                     b'{"id": "s", "text": "lone \\ud800 surrogate"}', b'{"id": "\\udfff", "text": "t"}',
                     b'{"id": "m", "text": "t", "k": "\\ud83d"}', b'{"id": "raw\x00nul", "text": "t"}',
                     b'{"id": "e", "text": "nul \\u0000 escaped"}', b'{"id": "x", "text": "\xff\xfe"}',
                     b'{"id": "d", "text": "t", "deep": ' + b"[" * 3000 + b"]" * 3000 + b"}",
                     b'{"id": "d2", "text": "t", "deep": ' + b"[" * 80 + b"]" * 80 + b"}",
                     b'{"id": "dup", "id": "dup2", "text": "duplicate keys"}',
                     b'{"id": "long", "text": "' + b"x" * 300 + b'"}',
                     b'{"id": "ls", "text": "a\xe2\x80\xa8b\xc2\x85c"}']),
)


@st.composite
def corpus_bytes(draw) -> bytes:
    lines = draw(st.lists(raw_lines, min_size=1, max_size=25))
    # \r\n, \n or a mix; no trailing newline sometimes
    body = b"".join(line + draw(st.sampled_from([b"\n", b"\r\n"])) for line in lines)
    return body if draw(st.booleans()) else body.rstrip(b"\r\n")


def well_formed(r: rec.Record) -> None:
    assert isinstance(r.id, str) and r.id == r.id.strip() and r.id
    assert isinstance(r.text, str) and r.text.strip()
    r.id.encode("utf-8"), r.text.encode("utf-8")  # no lone surrogates anywhere
    encoded = json.dumps(r.metadata, ensure_ascii=False, allow_nan=False).encode("utf-8")
    assert len(encoded) <= SMALL.max_metadata_bytes and len(r.text.encode()) <= SMALL.max_text_bytes


# ---------------------------------------------------------------- the corpus reader

@FAST
@given(data=corpus_bytes(), chunk_lines=st.integers(1, 7), chunk_bytes=st.integers(1, 300))
def test_every_corpus_line_is_a_record_or_a_reason(tmp_path_factory, data, chunk_lines, chunk_bytes):
    path = tmp_path_factory.mktemp("c") / "corpus.jsonl"
    path.write_bytes(data)
    total = index_job.check_input(str(path)) if data else 0
    whole = list(rec.read_numbered_lines(str(path), max_bytes=SMALL.max_line_bytes))
    assert [n for n, _ in whole] == list(range(1, total + 1))
    # chunks partition the lines exactly, whatever the line and byte limits
    chunks = index_job.plan_chunks(str(path), chunk_lines, chunk_bytes) if data else []
    pieces = [x for c in chunks for x in rec.read_numbered_lines(str(path), c.start, c.end, c.first_line,
                                                                  SMALL.max_line_bytes)]
    assert pieces == whole and sum(c.lines for c in chunks) == total
    for n, raw in whole:
        result = rec.parse_line(n, raw, limits=SMALL)
        if isinstance(result, rec.Record):
            well_formed(result)
        else:
            assert result.reason in REASONS and result.line == n
            json.dumps(result.to_json(), ensure_ascii=False).encode("utf-8")  # writable to rejected.jsonl


class StubEncoder:
    """Stands in for the transformer: the shard round trip does not depend on the vectors' values."""

    max_length = 8

    def encode(self, texts, progress=None):
        from relsearch.encoder.model import EncodeResult

        vectors = np.array([[len(t) % 7 + 1.0, 1.0, float(i)] for i, t in enumerate(texts)], np.float32).reshape(-1, 3)
        return EncodeResult(vectors, sum(len(t) > 40 for t in texts))


@FAST
@given(data=corpus_bytes(), chunk_lines=st.integers(1, 6))
def test_shards_round_trip_and_counts_reconcile(tmp_path_factory, data, chunk_lines):
    """encode_chunk → shard files → plan_shards / shard_blocks (what the index job publishes):
    read = kept + rejected, one entry per line, kept ids unique, texts and metadata intact."""
    work = tmp_path_factory.mktemp("s")
    path = work / "corpus.jsonl"
    path.write_bytes(data or b"\n")
    job = index_job.IndexJob(input=str(path), index=str(work / "idx"), limits=SMALL, chunk_lines=chunk_lines)
    chunks = index_job.plan_chunks(str(path), chunk_lines, job.chunk_bytes)
    for chunk in chunks:
        index_job.encode_chunk(chunk, path=str(path), job=job, encoder=StubEncoder(), shard_dir=work)
    plan = assemble.plan_shards(work, chunks)
    blocks = list(assemble.shard_blocks(work, chunks, plan))
    kept = [d for b in blocks for d in b.docs]
    assert plan.read == index_job.check_input(str(path)) == plan.kept + len(plan.rejected)
    assert len(kept) == plan.kept == len({d["id"] for d in kept}) == sum(len(b.vectors) for b in blocks)
    expected = {}
    for n, raw in rec.read_numbered_lines(str(path), max_bytes=SMALL.max_line_bytes):
        r = rec.parse_line(n, raw, limits=SMALL)
        if isinstance(r, rec.Record):
            expected.setdefault(r.id, r)  # the first line with an id wins
    # every line exactly once: kept, or rejected with a reason (later duplicates included)
    lines = sorted([r["line"] for r in plan.rejected] + [r.line for r in expected.values()])
    assert lines == list(range(1, plan.read + 1))
    assert {d["id"]: (d["text"], d["metadata"]) for d in kept} == {i: (r.text, r.metadata) for i, r in expected.items()}


@FAST
@given(data=corpus_bytes())
def test_accepted_records_survive_the_docstore(tmp_path_factory, data):
    """Whatever the parser accepts, SQLite stores and its JSON functions read back (NUL, U+2028,
    deep nesting, big integers): filters and the metadata field list never fail."""
    work = tmp_path_factory.mktemp("d")
    (work / "corpus.jsonl").write_bytes(data)
    store = DocStore(":memory:", create=True)
    records = {}
    for n, raw in rec.read_numbered_lines(str(work / "corpus.jsonl")):
        r = rec.parse_line(n, raw, limits=SMALL)
        if isinstance(r, rec.Record) and r.id not in records:
            records[r.id] = r
    store.add((i, r.id, r.text, r.metadata, 1.0) for i, r in enumerate(records.values()))
    got = store.get(list(range(len(records))))
    assert [(g["id"], g["text"], g["metadata"]) for g in got.values()] == [(r.id, r.text, r.metadata)
                                                                         for r in records.values()]
    fields = store.metadata_fields()
    for f in fields[:3]:
        store.matching({f: "1"})
    store.close()


# ---------------------------------------------------------------- query files, lookup inputs, id files

query_lines = st.one_of(
    raw_lines,
    st.fixed_dictionaries({"text": weird_text}, optional={"id": json_values, "relation": json_values}).map(
        lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"doc_id": ids}, optional={"relation": st.one_of(
        st.dictionaries(weird_text, st.one_of(st.floats(), st.integers(), st.none(), st.booleans(), weird_text),
                        max_size=3), weird_text)}).map(lambda d: json.dumps(d).encode()),
    st.just(b'{"text": "q", "relation": {"identity": NaN}}'),
)


@FAST
@given(lines=st.lists(query_lines, max_size=20))
@example(lines=[b"\x00\n\x00"])  # one generated "line" that is two lines in the file
def test_query_files_never_raise_and_account_for_every_line(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("q") / "queries.jsonl"
    content = b"\n".join(lines) + b"\n"
    path.write_bytes(content)
    known = {"identity", "ä", "0"}
    queries, errors = read_queries(str(path), {"identity": 1.0}, limits=SMALL, known_relations=known)
    physical = content.split(b"\n")[:-1]  # generated raw bytes may hold newlines themselves
    blank = sum(1 for line in physical if not line.removeprefix(rec.BOM).strip())
    assert len(queries) + len(errors) == len(physical) - blank
    for q in queries:
        assert set(q.relations) <= known
        assert isinstance(q, Query) and (q.text is None) != (q.doc_id is None)
        assert all(isinstance(k, str) and abs(v) <= MAX_WEIGHT for k, v in q.relations.items())
        assert any(q.relations.values()) and isinstance(q.query_id, str) and isinstance(q.line, int)
        (q.text or q.doc_id).encode("utf-8")
    assert all(isinstance(e["line"], int) and e["error"] for e in errors)


@FAST
@given(raw=raw_lines, same=st.sampled_from([(), ("meta",), ("n", "nested")]))
def test_lookup_lines_never_raise(raw, same):
    result = parse_lookup_line(3, raw, same=same)
    assert isinstance(result, (LookupInput, rec.Rejection))
    if isinstance(result, LookupInput):
        assert result.id and result.id == result.id.strip()
        result.id.encode("utf-8")
    else:
        assert result.reason in REASONS | {"missing-same-field"}


@FAST
@given(data=corpus_bytes())
def test_delete_id_files_never_raise(tmp_path_factory, data):
    from relsearch.cli_index import read_ids

    path = tmp_path_factory.mktemp("i") / "ids.txt"
    path.write_bytes(data)
    found = read_ids(str(path))
    assert all(isinstance(i, str) and i for i in found)
    conn = sqlite3.connect(":memory:")  # every id can be bound as a SQLite parameter
    for i in found:
        assert conn.execute("SELECT ?", (i,)).fetchone() == (i,)


# ---------------------------------------------------------------- limits

def test_limits_have_documented_defaults_and_refuse_nonsense():
    assert rec.DEFAULT_LIMITS == rec.Limits(32 * rec.MiB, 8 * rec.MiB, 1 * rec.MiB)
    with pytest.raises(ValueError, match="max_text_bytes"):
        rec.Limits(max_text_bytes=0)


def test_an_over_long_line_is_skipped_without_reading_it_whole(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "a", "text": "' + b"y" * 5000 + b'"}\r\n{"id": "b", "text": "ok"}\n')
    lines = list(rec.read_numbered_lines(str(path), max_bytes=100))
    assert [n for n, _ in lines] == [1, 2] and len(lines[0][1]) == 102 and lines[1][1] == b'{"id": "b", "text": "ok"}'
    assert rec.parse_line(1, lines[0][1], limits=rec.Limits(max_line_bytes=100)).reason == rec.LINE_TOO_LONG
    # exactly at the limit, with CRLF, is accepted
    exact = b'{"id": "c", "text": "' + b"z" * 70 + b'"}'
    path.write_bytes(exact + b"\r\n")
    assert list(rec.read_numbered_lines(str(path), max_bytes=len(exact))) == [(1, exact)]


# ---------------------------------------------------------------- the real pipeline, once

def _hostile_corpus(path) -> dict[int, str | None]:
    """A fixed corpus with one line of each kind, tens of megabytes in all; line → expected reason
    (None: indexed)."""
    big_line = b'{"id": "huge-line", "text": "' + b"a" * (40 * rec.MiB) + b'"}'
    big_text = json.dumps({"id": "huge-text", "text": "word " * (2 * rec.MiB + 1)}).encode()  # 10 MB text
    long_text = json.dumps({"id": "long-text", "text": "the company makes garden tools " * 4000}).encode()
    lines = [
        (json.dumps({"id": "ok1", "text": "A bank in Zürich.", "country": "CH"}).encode(), None),
        (rec.BOM + json.dumps({"id": "bom", "text": "Line with a byte-order mark."}).encode(), None),
        (b"\xff\xfe\x00 not utf-8", rec.UNDECODABLE),
        (b'{"id": "nan", "text": "x", "score": NaN}', rec.INVALID_JSON),
        (b"[1, 2, 3]", rec.NOT_OBJECT),
        (json.dumps({"id": True, "text": "bool id"}).encode(), rec.NON_STRING_ID),
        (json.dumps({"id": "ws", "text": " \t "}).encode(), rec.EMPTY_TEXT),
        (b'{"id": "sur", "text": "\\ud800"}', rec.INVALID_UNICODE),
        (json.dumps({"id": "nested", "text": "Nested metadata.", "m": {"a": [1, {"b": 10**40}]}}).encode(), None),
        (json.dumps({"id": "sep", "text": "Line\u2028separators\x85inside\u0000text."}, ensure_ascii=False).encode(),
         None),
        (json.dumps({"id": "ok1", "text": "duplicate"}).encode(), rec.DUPLICATE_ID),
        (big_line, rec.LINE_TOO_LONG),
        (big_text, rec.TEXT_TOO_LONG),
        (long_text, None),
        (b"", rec.EMPTY_LINE),
        (json.dumps({"id": "meta", "text": "t", "blob": "m" * (2 * rec.MiB)}).encode(), rec.METADATA_TOO_LARGE),
    ]
    path.write_bytes(b"\r\n".join(line for line, _ in lines) + b"\r\n")
    return {n: reason for n, (_, reason) in enumerate(lines, 1)}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "corpus.jsonl"
    return path, _hostile_corpus(path)


def test_pipeline_indexes_or_rejects_every_hostile_line(hostile, tmp_path):
    from relsearch.indexer.reader import open_index
    from relsearch.pipelines.index import IndexJob, run_index

    path, expected = hostile
    report = run_index(IndexJob(input=str(path), index=str(tmp_path / "idx"), progress=False, chunk_lines=4))
    assert (report.read, report.indexed, report.rejected) == (len(expected), 5, len(expected) - 5)
    assert report.truncated == 1  # long-text: longer than the model's window, truncated and counted
    target = tmp_path / "idx"
    text = (target / "rejected.jsonl").read_text(encoding="utf-8")
    rejected = [json.loads(line) for line in text.split("\n") if line]
    assert {r["line"]: r["reason"] for r in rejected} == {n: r for n, r in expected.items() if r}
    assert all(len(r["raw"]) <= rec.PREVIEW_BYTES for r in rejected)
    files = open_index(target)
    docs = files.docstore.get(list(range(5)))
    assert [d["id"] for d in docs.values()] == ["ok1", "bom", "nested", "sep", "long-text"]
    assert docs[3]["text"] == "Line\u2028separators\x85inside\u0000text."
    assert docs[2]["metadata"] == {"m": {"a": [1, {"b": 10**40}]}}


def test_cli_raises_the_limits_and_then_truncates_instead(hostile, tmp_path):
    """With --max-line-bytes / --max-text-bytes raised, the 40 MB line and the 10 MB text are
    indexed: truncated for the model (counted), stored whole."""
    from click.testing import CliRunner

    from relsearch.cli import cli
    from relsearch.indexer.reader import open_index

    path, expected = hostile
    out = CliRunner().invoke(cli, ["index", str(path), "--index", str(tmp_path / "idx"), "--quiet",
                                   "--max-line-bytes", str(64 * rec.MiB), "--max-text-bytes", str(48 * rec.MiB),
                                   "--max-metadata-bytes", "50"])
    assert out.exit_code == 0, out.output
    assert f"read {len(expected)}, indexed 6, rejected {len(expected) - 6}" in out.output
    assert "3 texts were longer than the encoder's max length" in out.output
    assert "metadata-too-large: 2" in out.output  # the nested one is now over 50 bytes too
    files = open_index(tmp_path / "idx")
    texts = {d["id"]: d["text"] for d in files.docstore.get(list(range(files.positions))).values()}
    assert len(texts["huge-line"]) == 40 * rec.MiB and len(texts["huge-text"]) == 10 * rec.MiB + 5
    bad = CliRunner().invoke(cli, ["index", str(path), "--index", str(tmp_path / "x"), "--max-text-bytes", "0"])
    assert bad.exit_code == 2 and "max-text-bytes" in bad.output and not os.path.exists(tmp_path / "x")
