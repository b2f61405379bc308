"""retrieval/export.py: the anchor document of a query by id, and hits as CSV rows and JSONL lines."""
from __future__ import annotations

import csv
import io
import json

import pytest

from relsearch.retrieval.export import columns, csv_text, jsonl_lines, query_label, stored_document, write_csv

HITS = [
    {"rank": 3, "id": "A", "score": 0.5, "text": "first, with \"quotes\"\nand a line", "metadata": {
        "name": "Alpha", "tags": ["x", "y"], "id": "own-id", "extra": {"k": 1}, "listed": True}},
    {"rank": 4, "id": "B", "score": -0.25, "text": "second", "metadata": {"name": "Beta", "founded": 1902}},
]


def parsed(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def test_a_row_per_hit_with_metadata_flattened():
    rows = parsed(csv_text([("MSFT", HITS)]))
    assert list(rows[0]) == ["query", "rank", "id", "score", "text", "name", "tags", "metadata.id", "extra", "listed",
                             "founded"]
    first, second = rows
    assert (first["query"], first["rank"], first["id"], float(first["score"])) == ("MSFT", "3", "A", 0.5)
    assert first["text"] == HITS[0]["text"]  # quotes and a newline survive the quoting
    assert json.loads(first["tags"]) == ["x", "y"] and json.loads(first["extra"]) == {"k": 1}
    assert first["metadata.id"] == "own-id" and first["listed"] == "true"  # a field named id stays the document's
    assert first["founded"] == "" and second["founded"] == "1902" and second["tags"] == ""
    assert float(second["score"]) == -0.25


def test_rank_by_place_without_one_and_no_text_column_without_text():
    hits = [{"id": "A", "score": 1.0, "metadata": {}}, {"id": "B", "score": 0.5, "metadata": {}}]
    assert columns([("q", hits)]) == ["query", "rank", "id", "score"]
    assert [r["rank"] for r in parsed(csv_text([("q1", hits), ("q2", hits[:1])]))] == ["1", "2", "1"]
    with_field = [{**hits[0], "field": "text_wikipedia"}]
    assert columns([("q", with_field)]) == ["query", "rank", "id", "score", "field"]


def test_write_csv_reads_its_answers_twice_and_counts_rows():
    calls = []

    def answers():
        calls.append(1)
        return iter([("q", HITS)])

    out = io.StringIO()
    assert write_csv(out, answers) == 2 and len(calls) == 2
    assert out.getvalue().endswith("\r\n") and len(parsed(out.getvalue())) == 2


def test_jsonl_lines_carry_the_query_and_the_hit():
    lines = [json.loads(line) for line in jsonl_lines([("JPM", HITS)])]
    assert [(line["query"], line["rank"], line["id"]) for line in lines] == [("JPM", 3, "A"), ("JPM", 4, "B")]
    assert lines[0]["metadata"] == HITS[0]["metadata"]


def test_query_label_says_what_was_asked():
    assert query_label("some text", None) == "some text" and query_label(None, "JPM") == "JPM"
    assert query_label(None, None, {"like": [{"id": "A"}, {"text": "t", "weight": 2}], "unlike": [{"id": "C"}]}) == "like A, t ×2; unlike C"


@pytest.fixture(scope="module")
def searcher(small_index):
    from relsearch.retrieval.search import Searcher

    return Searcher(str(small_index))


def test_stored_document_is_the_anchor(searcher, small_corpus):
    record = json.loads(next(line for line in small_corpus.read_text().splitlines() if '"id": "BAC"' in line))
    doc = stored_document(searcher, "BAC")
    assert doc["id"] == "BAC" and doc["name"] == record["name"] == "Bank of America Corp"
    assert doc["texts"] == {"text": record["text"]}
    assert doc["metadata"] == {k: v for k, v in record.items() if k not in ("id", "text")}
    assert stored_document(searcher, "NO-SUCH-ID") is None
