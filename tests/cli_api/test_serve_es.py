"""``relsearch serve --backend es``: /search answered from the Elasticsearch mirror (tests/es_server.py,
the official client over real HTTP) gives the local index's hits; a filter matching nothing is a
warning; a write through the server re-mirrors; the CLI wires the options and refuses bad ones."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from relsearch.api import Index
from relsearch.cli import cli
from relsearch.client import Client, ClientError
from relsearch.serve import create_app
from conftest import copy_published
from es_server import EsTestServer
from test_serve import _start


@pytest.fixture(scope="module")
def es_server():
    with EsTestServer(lifetime_s=600) as srv:
        yield srv


@pytest.fixture(scope="module")
def mirrored(small_index, tmp_path_factory, es_server) -> str:
    """A private copy of the small index, mirrored as alias ``companies`` by ``relsearch compact``."""
    target = copy_published(small_index, tmp_path_factory.mktemp("serve-es") / "companies")
    out = CliRunner().invoke(cli, ["compact", "--index", str(target), "--es-url", es_server.url,
                                   "--es-index", "companies", "--es-index-type", "flat"])
    assert out.exit_code == 0, out.output
    return str(target)


@pytest.fixture(scope="module")
def served(mirrored, es_server, monkeypatch_module):
    """What ``relsearch serve --backend es`` opens (its serve() call captured), behind a real server."""
    import relsearch.serve

    opened = {}
    monkeypatch_module.setattr(relsearch.serve, "serve", lambda indexes, **kw: opened.update(indexes))
    out = CliRunner().invoke(cli, ["serve", "--index", mirrored, "--port", "0", "--backend", "es",
                                   "--es-url", es_server.url, "--es-index", "companies"])
    assert out.exit_code == 0, out.output
    assert "backend: Elasticsearch companies at http://127.0.0.1:" in out.output
    index = opened["companies"]
    assert isinstance(index, Index) and index.es.index == "companies"
    url, server = _start(create_app(opened))
    yield index, Client(url)
    server.should_exit = True


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _searches(es_server) -> int:
    return sum(r.path.endswith("/_search") for r in list(es_server.requests))


@pytest.mark.parametrize("body", [
    {"id": "AAPL", "relations": {"similar-company": 1}},
    {"text": "bank holding company", "relations": {"similar-company": 1}, "filters": {"gics_sector": "Financials"}},
    {"id": "BAC", "relations": {"similar-company": 0.6, "duplicate-question": 0.4}},
    {"text": "video game publisher"},
])
def test_search_over_http_gives_the_local_top_5_from_elasticsearch(served, mirrored, es_server, body):
    index, client = served
    before = _searches(es_server)
    hits = client.search(k=5, **body)
    assert _searches(es_server) > before  # answered by the mirror
    local = Index(mirrored).search(k=5, **body)
    assert [h["id"] for h in hits] == [h.id for h in local] and len(hits) == 5
    assert [h["score"] for h in hits] == pytest.approx([float(h.score) for h in local], abs=1e-5)


def test_a_filter_matching_nothing_is_a_warning(served):
    _, client = served
    answer = client.search(id="AAPL", relations={"similar-company": 1}, k=5, filters={"gics_sector": "energy"})
    assert list(answer) == []
    assert any("no document matches the filter" in w for w in answer.warnings)
    assert any("gics_sector='Energy' does" in w for w in answer.warnings)


def test_unknown_text_field_and_explain_are_refused_by_name(served):
    _, client = served
    with pytest.raises(ClientError, match="unknown text field 'summary'") as e:
        client.search(id="AAPL", field="summary")
    assert (e.value.status, e.value.field) == (422, "field")
    with pytest.raises(ClientError, match="explain needs the FAISS backend"):
        client.search(id="AAPL", explain=True)


def test_a_document_added_through_the_server_is_mirrored_and_found(served, es_server):
    index, client = served
    old = set(es_server.aliases["companies"])
    client.add([{"id": "ZZZ", "text": "Designs and sells video game consoles and handheld games.",
                 "gics_sector": "Communication Services"}])
    assert es_server.aliases["companies"] != old  # the alias moved to a fresh mirror of the new generation
    assert index.searcher().files.manifest.backends["elasticsearch"].get("stale") is not True
    assert "ZZZ" in [h["id"] for h in client.search("video game consoles", k=3)]


@pytest.mark.parametrize("args, message", [
    (["--backend", "es"], "--backend es needs --es-url and --es-index"),
    (["--es-url", "http://127.0.0.1:9"], "--es-url apply to --backend es"),
    (["--backend", "es", "--es-url", "http://127.0.0.1:9", "--es-index", "c", "--index", "b=x"],
     "--backend es serves one --index"),
    (["--backend", "es", "--es-url", "http//nope", "--es-index", "c"], "must look like https://host:9200"),
])
def test_serve_refuses_bad_es_options(mirrored, args, message):
    out = CliRunner().invoke(cli, ["serve", "--index", mirrored, "--port", "0", *args])
    assert out.exit_code != 0 and message in out.output, out.output


def test_an_unreachable_cluster_is_a_502_naming_it(mirrored):
    from relsearch.retrieval.es_backend import EsQueryOptions

    index = Index(mirrored, es=EsQueryOptions(url="http://127.0.0.1:9", index="companies"))
    url, server = _start(create_app({"down": index}))
    try:
        with pytest.raises(ClientError, match="cannot search companies at http://127.0.0.1:9") as e:
            Client(url).search(id="AAPL", k=3)
        assert e.value.status == 502
    finally:
        server.should_exit = True
