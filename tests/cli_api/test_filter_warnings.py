"""Issue 28 item 1: a filter operator whose value's type never occurs in its field (``founded`` holds
strings; ``founded>=1990`` matches nothing, ``founded!=1902`` everything) is named, with the quoted
form to use, on stderr by ``relsearch query`` and ``relsearch lookup`` and in the Python API's hits
(``Hits.warnings``, ``Index.filter_warnings``); the HTTP answers are in tests/cli_api/test_serve.py."""
from __future__ import annotations

import json

from click.testing import CliRunner

from conftest import write_jsonl


def test_relsearch_query_prints_filter_warnings_on_stderr(small_index):
    from relsearch.cli import cli

    def query(*args):
        result = CliRunner().invoke(cli, ["query", "--id", "MMM", "--index", str(small_index), "--json", *args])
        assert result.exit_code == 0, result.output
        return result, [json.loads(line) for line in result.stdout.splitlines()]

    result, hits = query("--filter", "founded!=1902", "-k", "3")
    assert len(hits) == 3  # negated, it keeps every document: the warning says why
    assert "warning: filter 'founded'" in result.stderr and "--filter 'founded!=\"1902\"'" in result.stderr
    result, hits = query("--filter", "founded>=1990")
    assert hits == [] and "warning: filter 'founded'" in result.stderr and '"1990"' in result.stderr
    result, hits = query("--filter", 'founded>="1990"', "-k", "3")
    assert hits and "warning" not in result.stderr
    queries = write_jsonl(small_index.parent / "warn-queries.jsonl", [{"doc_id": "MMM"}])
    result = CliRunner().invoke(cli, ["query", "--queries", str(queries), "--index", str(small_index), "--json",
                                      "--filter", "founded>=1990"])
    assert result.exit_code == 0 and "warning: filter 'founded'" in result.stderr


def test_relsearch_lookup_prints_filter_warnings_on_stderr(tmp_path, small_index):
    from relsearch.cli_lookup import lookup

    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": "MMM"}])
    result = CliRunner().invoke(lookup, [str(inp), "--index", str(small_index), "-k", "3", "--filter", "founded!=1902",
                                         "--out", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 0, result.output
    assert "warning: filter 'founded'" in result.stderr and "warning" not in result.stdout
    fine = CliRunner().invoke(lookup, [str(inp), "--index", str(small_index), "-k", "3", "--filter",
                                       'founded!="1902"', "--out", str(tmp_path / "out.jsonl")])
    assert fine.exit_code == 0 and "warning" not in fine.stderr


def test_the_python_api_returns_filter_warnings_with_the_hits(small_index):
    from relsearch.api import Hits, Index, SearchRequest

    index = Index(small_index)
    hits = index.search(id="MMM", k=3, filters={"founded": {"not": {"eq": 1902}}})
    assert isinstance(hits, list) and isinstance(hits, Hits) and len(hits) == 3
    assert len(hits.warnings) == 1 and hits.warnings[0].startswith("filter 'founded'") and '"1902"' in hits.warnings[0]
    assert index.filter_warnings({"founded": {"gte": 1990}}) and index.filter_warnings({"founded": "1990"}) == []
    fine = index.search(id="MMM", k=3, filters={"founded": "1902"})
    assert fine.warnings == [] and index.search(id="MMM", k=3).warnings == []
    batch = index.search_batch([SearchRequest(id="MMM", filters={"founded": {"gte": 1990}}),
                                SearchRequest(id="MMM", filters={"founded": {"gte": "1990"}})])
    assert batch.results[0] == [] and batch.results[0].warnings and batch.results[1].warnings == []
