"""The explorer page, its assets and /docs are served by `relsearch serve` itself (no CDN, no key in
a URL); /fields and /complete are authenticated and bounded. The page in a real browser: test_browser.py."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from email.message import Message

import pytest
from test_serve import _start

from relsearch import explorer
from relsearch.api import Index
from relsearch.serve import create_app

KEY = "explorer-test-key"
ASSETS = sorted(p.name for p in explorer.UI_DIR.iterdir() if p.suffix in (".html", ".js", ".css"))


@pytest.fixture(scope="module")
def index(small_index) -> Index:
    return Index(small_index)


@pytest.fixture(scope="module")
def keyed(index):
    url, server = _start(create_app({"companies": index}, api_key=KEY, access_log=False))
    yield url
    server.should_exit = True


def _get(url: str, key: str | None = KEY) -> tuple[int, Message, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def _local_references(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]*)"', html)


def test_page_and_assets_are_served_without_a_key(keyed):
    for path in ("/", "/ui"):
        status, headers, body = _get(keyed + path, key=None)
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert b'<script type="module" src="/ui/assets/app.js">' in body
    assert {"index.html", "app.js", "api.js", "query.js", "view.js", "style.css"} <= set(ASSETS)
    for name in ASSETS:
        status, headers, body = _get(f"{keyed}/ui/assets/{name}", key=None)
        assert status == 200, name
        kind = {".js": "javascript", ".css": "text/css", ".html": "text/html"}[name[name.rindex("."):]]
        assert kind in headers["content-type"], name


def test_no_served_asset_names_another_host(keyed):
    for name in ASSETS:
        text = (explorer.UI_DIR / name).read_text()
        assert not re.search(r"https?:|//[a-z0-9]", text, re.I), name  # no URL to another origin, in any form
        assert "@import" not in text and "url(" not in text, name
    page = _get(keyed + "/", key=None)[2].decode()
    assert all(ref.startswith("/") or ref.startswith("data:") for ref in _local_references(page))
    for module in ("app.js", "api.js", "view.js"):  # modules import each other by relative path only
        imports = re.findall(r'from "([^"]+)"', (explorer.UI_DIR / module).read_text())
        assert all(i.startswith("./") for i in imports), imports


def test_docs_load_swagger_ui_from_this_server(keyed):
    status, _, body = _get(keyed + "/docs", key=None)
    assert status == 200
    html = body.decode()
    refs = _local_references(html)
    assert refs and all(ref.startswith("/docs/assets/") for ref in refs), refs
    assert "cdn" not in html.lower() and "validatorUrl\": null" in html
    for ref in refs:
        status, _, asset = _get(keyed + ref, key=None)
        assert status == 200 and len(asset) > 1000, ref
    assert _get(keyed + "/docs/oauth2-redirect", key=None)[0] == 200
    paths = json.loads(_get(keyed + "/openapi.json", key=None)[2])["paths"]
    assert {"/search", "/fields", "/complete"} <= set(paths) and "/" not in paths and "/docs" not in paths


def test_the_key_stays_out_of_urls():
    api = (explorer.UI_DIR / "api.js").read_text()
    assert "sessionStorage" in api and "localStorage" not in api and "headers.Authorization = `Bearer ${key}`" in api
    for name in ASSETS:  # only api.js reads the stored key, and only into a header
        text = (explorer.UI_DIR / name).read_text()
        assert name == "api.js" or "sessionStorage" not in text, name
        assert "localStorage" not in text and "document.cookie" not in text, name


@pytest.mark.parametrize("path", ["/fields", "/complete?prefix=A", "/relations"])
def test_data_endpoints_need_the_key(keyed, path):
    for key in (None, "wrong-key"):
        status, _, body = _get(keyed + path, key=key)
        assert status == 401 and json.loads(body)["error"]["field"] == "authorization"
    assert _get(keyed + path)[0] == 200


def test_fields_list_types_and_few_values(keyed):
    answer = json.loads(_get(keyed + "/fields")[2])
    by_name = {f["name"]: f for f in answer["fields"]}
    assert answer["index"] == "companies" and not answer["truncated"]
    assert {"name", "gics_sector", "founded"} <= set(by_name)
    assert "text" in by_name["gics_sector"]["types"] and "Financials" in by_name["gics_sector"]["values"]
    assert "values" not in by_name["name"]  # 120 distinct names: more than MAX_VALUES, none listed
    assert by_name["name"]["types"] == ["text"]


def test_complete_by_id_and_name(keyed):
    matches = json.loads(_get(keyed + "/complete?prefix=ad")[2])["matches"]  # an id prefix, any case
    assert {"ADBE", "ADSK", "ADS", "ADM", "ADI", "ADP"} <= {m["id"] for m in matches}
    matches = json.loads(_get(keyed + "/complete?prefix=adobe")[2])["matches"]  # a name prefix, any case
    assert [m["id"] for m in matches] == ["ADBE"] and matches[0]["name"].startswith("Adobe")
    assert json.loads(_get(keyed + "/complete?prefix=zzzz")[2])["matches"] == []


@pytest.mark.parametrize("query, field", [("", "prefix"), ("?prefix=", "prefix"), ("?prefix=" + "A" * 201, "prefix"),
                                          ("?prefix=A&limit=51", "limit"), ("?prefix=A&limit=0", "limit"),
                                          ("?prefix=A&index=nope", "index")])
def test_complete_is_bounded(keyed, query, field):
    status, _, body = _get(keyed + "/complete" + query)
    assert status in (404, 422) and json.loads(body)["error"]["field"] == field


def test_complete_answers_at_most_limit(keyed):
    assert len(json.loads(_get(keyed + "/complete?prefix=A&limit=3")[2])["matches"]) == 3
    assert len(json.loads(_get(keyed + f"/complete?prefix=A&limit={explorer.MAX_COMPLETIONS}")[2])["matches"]) <= 50


def test_complete_finds_a_word_inside_a_name_after_the_id_matches(keyed):
    def ids(prefix: str, limit: int = 10) -> list[str]:
        return [m["id"] for m in json.loads(_get(f"{keyed}/complete?prefix={prefix}&limit={limit}")[2])["matches"]]

    assert ids("cola") == ["KO"] and ids("coca%20cola") == ids("Coca-Cola") == ["KO"]  # "Coca Cola Company"
    matches = json.loads(_get(keyed + "/complete?prefix=co&limit=50")[2])["matches"]
    tiers = [explorer.match_tier("co", m["id"], m["name"]) for m in matches]
    assert tiers == sorted(tiers) and tiers[0] == 1 and 3 in tiers  # ids, names, then words inside names
    at = [m["id"] for m in matches]
    assert "KO" in at and all(at.index(i) < at.index("KO") for i in at if i.startswith("CO"))
    assert ids("%25") == ids("_") == ids("c%25a") == ids("c_ca") == []  # no wildcard: "coca" is not "c%a"


COMPANIES = [("KO", "The Coca-Cola Company"), ("COKE", "Coca-Cola Consolidated, Inc."), ("COCA", "Cocanut Farms"),
             ("COCAL", "Cocaine Anonymous Ltd"), ("XCOCA", "Xtra Coca Bottlers"), ("NESN", "Nestlé S.A."),
             ("PCT", "100% Natural_Foods Inc"), ("BRK.B", "Berkshire Hathaway Inc."), ("ZZ", None),
             ("LONG", "International Business Machines Corporation Worldwide"),
             ("IBMX", "International Business Machines Cooperative")]


@pytest.fixture
def crafted(tmp_path):
    """``make(deleted, fields)``: a searcher-shaped object over a docstore of COMPANIES (complete reads its
    docstore and metadata fields only), a new one each time (completion keeps an index per docstore)."""
    from types import SimpleNamespace

    import numpy as np

    from relsearch.indexer.docstore import DocStore
    from relsearch.indexer.segments import Documents

    path = str(tmp_path / "docs.sqlite")
    store = DocStore(path, create=True)
    store.add([(pos, i, "text", {"name": n} if n else {}, 1.0) for pos, (i, n) in enumerate(COMPANIES)])
    store.close()

    def make(deleted=(), fields=("name",)):
        docs = Documents([DocStore(path)], np.asarray(deleted, np.int64), len(COMPANIES))
        return SimpleNamespace(files=SimpleNamespace(docstore=docs), metadata_fields=list(fields))

    return make


def _ids(searcher, prefix: str, limit: int = 10) -> list[str]:
    return [m["id"] for m in explorer.complete(searcher, prefix, limit)]


def test_completion_ranks_id_then_name_then_a_word_inside(crafted):
    s = crafted()
    # the id, an id prefix, a name prefix, then a word inside a name (shorter name first)
    assert _ids(s, "coca") == ["COCA", "COCAL", "COKE", "XCOCA", "KO"]
    assert _ids(s, "coca", 2) == ["COCA", "COCAL"]
    assert _ids(s, "cola") == ["KO", "COKE"]
    assert _ids(s, "coca cola") == _ids(s, "COCA-COLA") == _ids(s, "coca--cola") == ["COKE", "KO"]
    assert _ids(s, "coca-") == ["COKE", "COCA", "XCOCA", "KO"]  # a word ends there (the id COCA): not Cocaine
    assert _ids(s, "nestle") == _ids(s, "NESTLÉ") == _ids(s, "s.a") == ["NESN"]  # accents and case
    assert _ids(s, "brk.b") == _ids(s, "brk b") == _ids(s, "hathaway") == ["BRK.B"]
    assert explorer.complete(s, "z", 10) == [{"id": "ZZ", "name": ""}]
    assert _ids(crafted(fields=()), "coca") == ["COCA", "COCAL"]  # no name field: ids only
    assert _ids(crafted(deleted=[0]), "cola") == ["COKE"]  # KO deleted


def test_completion_prefix_is_text_not_a_pattern(crafted):
    s = crafted()
    for prefix in ("%", "_", "%%", "c%a", "c_ca", "%cola%", "'", "\\", "[a-z]*"):
        assert _ids(s, prefix) == ([] if prefix != "%cola%" else ["KO", "COKE"]), prefix
    assert _ids(s, "100%") == _ids(s, "natural_") == _ids(s, "natural foods") == ["PCT"]
    assert _ids(s, "n_tural") == _ids(s, "natura%") == []


def test_completion_checks_a_prefix_longer_than_a_key_whole(crafted):
    s = crafted()
    assert len("international business machines co") >= explorer.KEY_BYTES  # the two share every key byte
    assert _ids(s, "international business machines cor") == ["LONG"]
    assert _ids(s, "international business machines coo") == ["IBMX"]
    assert _ids(s, "business machines corporation worldwide") == ["LONG"]
    assert _ids(s, "international business machines corporation worldwide inc") == []


def test_completion_on_a_big_index_matches_whole_prefixes_only(crafted, monkeypatch):
    monkeypatch.setattr(explorer, "COMPLETION_MAX_DOCS", len(COMPANIES) - 1)  # "big": no word index is built
    s = crafted()
    assert _ids(s, "coca") == ["COCA", "COCAL", "COKE"] and _ids(s, "cola") == [] and _ids(s, "%") == []
    assert s.files.docstore not in explorer._COMPLETIONS


def test_relations_carry_a_stored_recipe(small_index):
    index = Index(small_index)  # a private one: its bundle's operator is changed here
    operator = index.searcher().bundle.operators["similar-company"]
    operator.info["recipe"] = {"mixture": {"similar-company": 1.0}, "bm25": 0.2}
    operator.info["whole_corpus"] = {"test": {"recipe": 0.61, "identity": 0.48, "bm25": 0.4}}
    rows = {r["name"]: r for r in index.relations()}
    assert rows["similar-company"]["recipe"]["bm25"] == 0.2
    assert rows["similar-company"]["whole_corpus"]["test"]["recipe"] == 0.61
    assert "recipe" not in rows["identity"]


# ------------------------------------------------------------------------------ filters from the page's URL
def _post(url: str, body: dict, key: str | None = KEY) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_filter_texts_are_read_with_the_cli_grammar():
    """The page sends its URL's filter expressions to the server, which reads them as `relsearch query
    --filter` does: `or`, `not`, typed values; each error names its expression, nothing is guessed."""
    from relsearch.cli_query import typed_filters

    specs = ["gics_sector=Energy or founded<1950", "not ceo exists", 'code="1"', "x in [1, b]", "name~=apple"]
    fields = ["gics_sector", "founded", "ceo", "code", "x", "name"]
    answer = explorer.parse_filters(specs, fields)
    assert answer == {"filters": typed_filters(None, None, specs), "errors": []}
    assert answer["filters"]["$any"] == [{"gics_sector": "Energy"}, {"founded": {"lt": 1950}}]
    assert answer["filters"]["ceo"] == {"not": {"exists": True}}
    bad = explorer.parse_filters(["gics_sector=Energy", "nosuch=1", "year == 2010", "__proto__=1"], fields)
    assert bad["filters"] is None and [e["field"] for e in bad["errors"]] == ["filters[1]", "filters[2]", "filters[3]"]
    assert "unknown filter field 'nosuch'" in bad["errors"][0]["message"]
    assert "is not an operator; write year=2010" in bad["errors"][1]["message"]
    twice = explorer.parse_filters(["gics_sector=Energy", "gics_sector=Utilities"], fields)
    assert twice["filters"] is None and twice["errors"][0]["field"] == "filters" and "given twice" in twice["errors"][0]["message"]
    deep = explorer.parse_filters(["founded in " + "[" * 3000 + "]" * 3000], fields)
    assert "brackets nest 3,000 deep, at most 32" in deep["errors"][0]["message"]


def test_filters_parse_endpoint_checks_the_index_fields(keyed):
    status, answer = _post(keyed + "/filters/parse", {"filters": ["gics_sector=Energy or founded<1950", "nosuch=1"]})
    assert status == 200 and answer["index"] == "companies" and answer["filters"] is None
    assert answer["errors"] == [{"field": "filters[1]", "message": answer["errors"][0]["message"]}]
    assert "unknown filter field 'nosuch'" in answer["errors"][0]["message"]
    status, answer = _post(keyed + "/filters/parse", {"filters": ["gics_sector=Energy or founded<1950"]})
    assert status == 200 and answer["errors"] == [] and answer["filters"] == {
        "$any": [{"gics_sector": "Energy"}, {"founded": {"lt": 1950}}]}
    assert _post(keyed + "/filters/parse", {"filters": ["a=1"]}, key=None)[0] == 401
    for body, field in [({"filters": ["a=1"] * (explorer.MAX_FILTER_TEXTS + 1)}, "filters"),
                        ({"filters": ["a=" + "1" * explorer.MAX_FILTER_CHARS]}, "filters.0"), ({"filters": [1]}, "filters.0"),
                        ({"filters": [], "index": "nope"}, "index")]:
        status, answer = _post(keyed + "/filters/parse", body)
        assert status in (404, 422) and answer["error"]["field"] == field, (body, answer)
