"""One validation table, run through every interface: `relsearch query --filter` text, the page's URL
filters (POST /filters/parse), the Python API, HTTP and the stdlib client. Each row is a documented
filter form (or a bad one) with what every interface must answer: the same hits, or the same
error naming the same field."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from relsearch.api import Index, RequestError
from relsearch.cli import cli
from relsearch.client import Client, ClientError
from relsearch.explorer import parse_filters
from relsearch.serve import create_app

from test_serve import _post, _start

TEXT = "energy companies and power producers"
# (CLI --filter expressions, the JSON form they mean): every documented text form
TEXT_FORMS = [
    (["gics_sector=Energy"], {"gics_sector": "Energy"}),
    (["gics_sector~=ENERGY"], {"gics_sector": {"ieq": "ENERGY"}}),
    (['founded>="1950"', 'founded<"2000"'], {"founded": {"gte": "1950", "lt": "2000"}}),  # founded holds strings
    (["gics_sector in [Energy,Utilities]"], {"gics_sector": {"in": ["Energy", "Utilities"]}}),
    (["gics_sector exists"], {"gics_sector": {"exists": True}}),
    (["not gics_sector=Energy"], {"gics_sector": {"not": {"eq": "Energy"}}}),
    (["gics_sector!=Energy"], {"gics_sector": {"not": {"eq": "Energy"}}}),
    (["gics_sector=Energy or gics_sector=Utilities"],
     {"$any": [{"gics_sector": "Energy"}, {"gics_sector": "Utilities"}]}),
]
# JSON forms with no single-expression text form: API, HTTP and client only
JSON_FORMS = [
    {"$all": [{"$any": [{"gics_sector": "Energy"}, {"gics_sector": "Utilities"}]}, {"founded": {"null": False}}]},
    {"founded": {"not": {"null": True}}},
]
# (bad input, the field named, a piece of the message), in every interface that can express it
ERRORS = [
    ({"colour": "red"}, "filters", "unknown filter field 'colour'"),
    ({"gics_sector": {"between": [1, 2]}}, "filters", "between"),
    ({"$any": []}, "filters", "$any"),
    ({"gics_sector": {"in": ["x"] * 10_001}}, "filters", "10,000"),
]


@pytest.fixture(scope="module")
def index(small_index):
    return Index(small_index)


@pytest.fixture(scope="module")
def server(index):
    url, srv = _start(create_app({"companies": index}))
    yield url
    srv.should_exit = True


def _cli_ids(small_index, *args) -> tuple[int, list[str], str]:
    out = CliRunner().invoke(cli, ["query", TEXT, "--index", str(small_index), "-k", "30", "--json", *args])
    return out.exit_code, [json.loads(line)["id"] for line in out.stdout.splitlines() if line.startswith("{")], \
        out.output


@pytest.mark.parametrize("texts, meant", TEXT_FORMS, ids=[" & ".join(t) for t, _ in TEXT_FORMS])
def test_each_text_form_means_one_filter_in_the_cli_and_the_page(small_index, index, server, texts, meant):
    fields = index.searcher().metadata_fields
    assert parse_filters(texts, fields) == {"filters": meant, "errors": []}
    status, parsed = _post(server, "/filters/parse", json.dumps({"filters": texts}))
    assert status == 200 and parsed["filters"] == meant
    api = [h.id for h in index.search(TEXT, k=30, filters=meant)]
    code, cli_ids, output = _cli_ids(small_index, *(a for t in texts for a in ("--filter", t)))
    assert code == 0 and cli_ids == api, output
    assert api, f"{texts}: a filter that matches nothing tests nothing"


@pytest.mark.parametrize("filters", [f for _, f in TEXT_FORMS] + JSON_FORMS)
def test_each_json_form_answers_alike_in_the_api_over_http_and_in_the_client(index, server, filters):
    api = index.search(TEXT, k=30, filters=filters)
    status, answer = _post(server, "/search", json.dumps({"text": TEXT, "k": 30, "filters": filters}))
    assert status == 200 and [h["id"] for h in answer["results"]] == [h.id for h in api]
    assert answer["warnings"] == api.warnings
    client = Client(server).search(text=TEXT, k=30, filters=filters)
    assert [h["id"] for h in client] == [h.id for h in api] and client.warnings == api.warnings


@pytest.mark.parametrize("filters, field, message", ERRORS, ids=[m for _, _, m in ERRORS])
def test_each_error_is_the_same_error_everywhere(index, server, filters, field, message):
    with pytest.raises(RequestError) as api:
        index.search(TEXT, filters=filters)
    assert api.value.field == field and message in api.value.message
    status, answer = _post(server, "/search", json.dumps({"text": TEXT, "filters": filters}))
    assert (status, answer["error"]["field"]) == (422, field) and answer["error"]["message"] == api.value.message
    with pytest.raises(ClientError) as client:
        Client(server).search(text=TEXT, filters=filters)
    assert client.value.field == field and message in str(client.value)


def test_a_case_mismatch_says_so_in_every_interface(small_index, index, server):
    """`gics_sector=energy` (the index holds "Energy") was silent outside the CLI."""
    api = index.search(TEXT, filters={"gics_sector": "energy"})
    assert not api and any("gics_sector='Energy' does" in w for w in api.warnings)
    status, answer = _post(server, "/search", json.dumps({"text": TEXT, "filters": {"gics_sector": "energy"}}))
    assert status == 200 and answer["warnings"] == api.warnings
    code, _, output = _cli_ids(small_index, "--filter", "gics_sector=energy")
    assert code == 0 and "gics_sector='Energy' does" in output and "gics_sector~=energy" in output
    fields = index.searcher().metadata_fields
    bad = parse_filters(["colour=red", "gics_sector in [a"], fields)
    assert bad["filters"] is None and [e["field"] for e in bad["errors"]] == ["filters[0]", "filters[1]"]
    out = CliRunner().invoke(cli, ["query", TEXT, "--index", str(small_index), "--filter", "colour=red"])
    assert out.exit_code != 0 and "--filter: unknown filter field 'colour'" in out.output


def test_facets_and_highlights_answer_alike_over_http_and_in_the_client(index, server):
    want = index.search("natural gas pipelines", k=3, facets=["gics_sector"], hybrid="rrf", highlight=True)
    got = Client(server).search(text="natural gas pipelines", k=3, facets=["gics_sector"], hybrid="rrf", highlight=True)
    assert want.facets and got.facets == want.facets
    assert [h["highlights"] for h in got] == [h.highlights for h in want] and any(h.highlights for h in want)
    batch = Client(server).search_batch([{"text": "natural gas pipelines"}], k=3, facets=["gics_sector"])
    assert batch[0]["facets"] == want.facets


# issue 50, F-4 and F-7: filter text the old splitter crashed on (RecursionError, IndexError) or misread
F4 = 'name in ["\\\\", ' + "[" * 3000 + "]" * 3000 + "]"  # name in ["\\", [[[…]]]]
MISREAD = [F4, "gics_sector==", "founded>=", "gics_sector=Financials AND"]


@pytest.mark.parametrize("text", MISREAD, ids=["F-4", "==", ">=", "AND"])
def test_malformed_filter_text_is_one_line_naming_the_position_everywhere(small_index, index, server, text):
    status, answer = _post(server, "/filters/parse", json.dumps({"filters": [text]}))
    assert status == 200 and answer["filters"] is None
    [error] = answer["errors"]
    assert error["field"] == "filters[0]" and " at position " in error["message"] and "\n" not in error["message"]
    out = CliRunner().invoke(cli, ["query", TEXT, "--index", str(small_index), "--filter", text])
    said = [line for line in out.output.splitlines() if line.startswith("Error:")]
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit) and "Traceback" not in out.output
    assert said == [f"Error: Invalid value for '--filter': {error['message']}"], out.output
    with pytest.raises(RequestError) as api:  # the Python API reads the same text with the same parser
        index.search(TEXT, filters=text)
    assert api.value.field == "filters" and api.value.message == error["message"]


def test_an_escaped_backslash_ends_its_string_everywhere(small_index, index, server):
    text = 'name = "\\\\" or name = "3M Company"'  # F-7: was one equality to '"\\" or name = "3M Company"'
    meant = {"$any": [{"name": "\\"}, {"name": "3M Company"}]}
    assert parse_filters([text], index.searcher().metadata_fields) == {"filters": meant, "errors": []}
    status, parsed = _post(server, "/filters/parse", json.dumps({"filters": [text]}))
    assert status == 200 and parsed["filters"] == meant
    api = [h.id for h in index.search(TEXT, k=30, filters=meant)]
    assert api == ["MMM"] and [h.id for h in index.search(TEXT, k=30, filters=[text])] == api
    code, cli_ids, output = _cli_ids(small_index, "--filter", text)
    assert code == 0 and cli_ids == api, output
