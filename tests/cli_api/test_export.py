"""An answer as a file and its anchor: `relsearch query --format csv`, `relsearch lookup --format csv`,
`POST /search?format=csv|jsonl`, `GET /document` and the anchor card of `query --explain`, each
checked against the JSON answer of the same query."""
from __future__ import annotations

import csv
import io
import json
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner
from test_serve import _start

from conftest import write_jsonl
from relsearch.api import Index
from relsearch.cli import cli
from relsearch.serve import create_app

KEY = "export-test-key"


def query(small_index, *args: str) -> str:
    """What `relsearch query` prints on stdout (warnings go to stderr)."""
    out = CliRunner().invoke(cli, ["query", "--index", str(small_index), *args])
    assert out.exit_code == 0, out.output
    return out.stdout


def parsed(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def test_query_format_csv_is_the_json_answer_a_row_per_hit(small_index):
    args = ["--id", "BAC", "-r", "similar-company", "--filter", "gics_sector=Financials", "-k", "5"]
    hits = [json.loads(line) for line in query(small_index, *args, "--json").splitlines()]
    rows = parsed(query(small_index, *args, "--format", "csv"))
    assert [(r["query"], int(r["rank"]), r["id"]) for r in rows] == [("BAC", h["rank"], h["id"]) for h in hits]
    assert [float(r["score"]) for r in rows] == [h["score"] for h in hits]
    assert all(r["gics_sector"] == "Financials" and r["name"] == h["metadata"]["name"] and r["text"] == h["text"]
               for r, h in zip(rows, hits))
    assert query(small_index, *args, "--format", "json") == query(small_index, *args, "--json")  # JSON unchanged
    paged = parsed(query(small_index, *args, "--offset", "2", "-k", "2", "--fields", "name", "--format", "csv"))
    assert [r["rank"] for r in paged] == ["3", "4"] and list(paged[0])[-1] == "name"


def test_query_format_csv_of_a_text_and_of_a_queries_file(small_index, tmp_path):
    rows = parsed(query(small_index, "video game publisher", "-k", "3", "--format", "csv"))
    assert len(rows) == 3 and {r["query"] for r in rows} == {"video game publisher"}
    questions = write_jsonl(tmp_path / "q.jsonl", [{"id": "q1", "text": "natural gas pipelines"}, {"doc_id": "BAC"}])
    rows = parsed(query(small_index, "--queries", str(questions), "-k", "2", "--format", "csv"))
    assert [(r["query"], r["rank"]) for r in rows] == [("q1", "1"), ("q1", "2"), ("BAC", "1"), ("BAC", "2")]


def test_query_format_csv_refusals_name_the_flags(small_index):
    for args, said in [(["--json", "--format", "csv"], "give --json or --format csv, not both"),
                       (["--format", "csv", "--facet", "gics_sector"], "--facet: a CSV holds the hits alone"),
                       (["--format", "xml"], "'xml' is not one of")]:
        out = CliRunner().invoke(cli, ["query", "x", "--index", str(small_index), *args])
        assert out.exit_code != 0 and said in out.output, out.output


def test_explain_starts_with_the_anchor_card(small_index, small_corpus):
    record = json.loads(next(line for line in small_corpus.read_text().splitlines() if '"id": "BAC"' in line))
    table = query(small_index, "--id", "BAC", "-r", "similar-company", "-k", "3", "--explain")
    card, rest = table.split("\nrank", 1)
    assert card.startswith("anchor: BAC  Bank of America Corp\n  text: Bank of America Corporation")
    assert " ".join(record["text"].split()[:30]) in " ".join(card.split())  # its text, wrapped
    assert "gics_sector=Financials" in card and "recipe:dense=" in rest
    assert "anchor:" not in query(small_index, "--id", "BAC", "-k", "3")  # without --explain: the table alone
    said = query(small_index, "video game publisher", "-k", "2", "--explain")
    assert said.startswith("anchor: text\n  query: video game publisher\n")


def test_lookup_format_csv(small_index, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": "BAC"}, {"id": "ADBE"}, {"id": "NOPE"}])
    common = [str(inp), "--index", str(small_index), "-k", "3", "--fields", "name,gics_sector"]
    assert CliRunner().invoke(cli, ["lookup", *common, "--out", str(tmp_path / "peers.jsonl")]).exit_code == 0
    out = CliRunner().invoke(cli, ["lookup", *common, "--format", "csv", "--out", str(tmp_path / "peers.csv")])
    assert out.exit_code == 0 and "read 3, answered 2, rejected 1" in out.output, out.output
    lines = [json.loads(line) for line in (tmp_path / "peers.jsonl").read_text().splitlines()]
    rows = parsed((tmp_path / "peers.csv").read_text())
    assert list(rows[0]) == ["query", "rank", "id", "score", "name", "gics_sector"]
    assert [(r["query"], r["rank"], r["id"], float(r["score"]), r["name"]) for r in rows] == [
        (line["query_id"], str(rank), hit["id"], hit["score"], hit["metadata"]["name"])
        for line in lines for rank, hit in enumerate(line["results"], 1)]
    assert json.loads((tmp_path / "peers.rejected.jsonl").read_text())["reason"] == "unknown-id"


@pytest.fixture(scope="module")
def served(small_index):
    url, server = _start(create_app({"companies": Index(small_index)}, api_key=KEY, access_log=False))
    yield url
    server.should_exit = True


def call(url: str, body: dict | None = None, key: str | None = KEY):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None if body is None else json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=120) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def test_search_format_csv_and_jsonl_are_the_json_answers_hits(served):
    body = {"id": "BAC", "relations": {"similar-company": 1}, "filters": {"gics_sector": "Financials"}, "k": 5,
            "offset": 1}
    status, _, text = call(served + "/search", body)
    hits = json.loads(text)["results"]
    assert status == 200 and len(hits) == 5
    status, headers, text = call(served + "/search?format=csv", body)
    assert status == 200 and headers["content-type"] == "text/csv; charset=utf-8"
    assert headers["content-disposition"] == 'attachment; filename="relsearch-answer.csv"'
    rows = parsed(text)
    assert [(r["query"], int(r["rank"]), r["id"], float(r["score"])) for r in rows] == [
        ("BAC", h["rank"], h["id"], h["score"]) for h in hits] and rows[0]["rank"] == "2"
    assert all(r["gics_sector"] == "Financials" for r in rows)
    status, headers, text = call(served + "/search?format=jsonl", body)
    assert status == 200 and headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines == [{"query": "BAC", **h} for h in hits]
    status, _, text = call(served + "/search?format=csv", {"text": "video game publisher", "k": 2})
    assert status == 200 and {r["query"] for r in parsed(text)} == {"video game publisher"}
    status, _, text = call(served + "/search?format=xml", body)
    assert status == 422 and json.loads(text)["error"]["field"] == "format"
    status, _, text = call(served + "/search?format=csv", {**body, "id": "NOPE"})
    assert status == 404 and json.loads(text)["error"]["field"] == "id"
    assert call(served + "/search?format=csv", body, key=None)[0] == 401


def test_document_is_the_anchor_behind_the_key(served):
    status, _, text = call(served + "/document?id=BAC")
    doc = json.loads(text)["document"]
    assert status == 200 and doc["id"] == "BAC" and doc["name"] == "Bank of America Corp"
    assert doc["texts"]["text"].startswith("Bank of America Corporation") and doc["metadata"]["gics_sector"] == "Financials"
    status, _, text = call(served + "/document?id=NOPE")
    assert status == 404 and json.loads(text)["error"] == {"field": "id", "message": "document id 'NOPE' is not in the index"}
    assert call(served + "/document?id=", None)[0] == 422
    assert call(served + "/document?id=BAC", key=None)[0] == 401
