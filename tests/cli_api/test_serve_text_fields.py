"""An index of several named texts behind the server (relsearch/serve) and the client: ``field``
in a search body, ``"field"`` on each fused hit, ``collapse: false``, the unknown-field error,
and documents added through the API with each of their texts."""
import pytest

from relsearch.api import Index
from relsearch.client import Client, ClientError
from relsearch.pipelines.index import IndexJob, run_index
from relsearch.serve import create_app
from conftest import write_jsonl
from test_serve import _start

NAMES = ("text", "wiki")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-multi")
    corpus = write_jsonl(tmp / "corpus.jsonl", [
        {"id": "GOOG", "text": "Alphabet operates Google search and YouTube.", "name": "Alphabet"},
        {"id": "GOOGL", "text": "Alphabet operates Google search and YouTube.", "name": "Alphabet"},
        {"id": "XOM", "text": None, "wiki": "ExxonMobil is an oil and gas corporation.", "name": "Exxon"}])
    run_index(IndexJob(input=str(corpus), index=str(tmp / "idx"), text_field="text", text_fields=NAMES,
                       collapse_field="name", progress=False))
    index = Index(tmp / "idx")
    url, server = _start(create_app({"multi": index}))
    yield index, Client(url)
    server.should_exit = True


def test_field_collapse_and_added_documents_over_http(served):
    index, client = served
    fused = client.search("oil producer", k=1)
    assert (fused[0]["id"], fused[0]["field"]) == ("XOM", "wiki")
    only = [h["id"] for h in client.search("oil producer", field="text", k=3)]  # no XOM; collapsed: one Alphabet
    assert len(only) == 1 and only[0] in ("GOOG", "GOOGL")
    assert [h["id"] for h in client.search(id="GOOG", k=3)] == ["XOM"]
    assert [h["id"] for h in client.search(id="GOOG", k=3, collapse=False)][0] == "GOOGL"
    with pytest.raises(ClientError, match="unknown text field 'nope'; this index's text fields: text, wiki") as e:
        client.search("oil", field="nope")
    assert (e.value.status, e.value.field) == (422, "field")
    index.add([{"id": "AAPL", "wiki": "Apple Inc. designs the iPhone and Mac computers.", "name": "Apple"}])
    hits = client.search("iPhone maker", k=1)
    assert (hits[0]["id"], hits[0]["field"]) == ("AAPL", "wiki")
    assert "AAPL" not in [h["id"] for h in client.search("iPhone maker", field="text", k=5)]


def test_the_page_offers_the_text_fields_and_keeps_the_chosen_one_in_the_url(served, tmp_path):
    from test_explorer import _node

    _, client = served
    assert client.request("GET", "/fields")["texts"] == list(NAMES)
    said = _node(tmp_path, "const s = q.readState('?text=oil&field=wiki');\n"
                           "console.log(JSON.stringify({field: s.field, again: q.readState(q.writeState(s)).field,"
                           " none: q.readState('?text=oil').field, url: q.writeState(s)}));")
    assert said["field"] == said["again"] == "wiki" and said["none"] == ""
    assert "field=wiki" in said["url"]
