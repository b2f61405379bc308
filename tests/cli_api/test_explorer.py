"""The explorer page, its assets and /docs are served by `relsearch serve` itself (no CDN, no key in
a URL); /fields and /complete are authenticated and bounded. The page in a real browser: test_browser.py."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import pytest
from test_serve import _start

from relsearch import completion, explorer
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


@pytest.mark.parametrize("path", ["/fields", "/complete?prefix=A", "/relations", "/relations/sources"])
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
    tiers = [completion.match_tier("co", m["id"], m["name"]) or 4 for m in matches]  # None: by an alias (4)
    assert tiers == sorted(tiers) and tiers[0] == 1 and 3 in tiers  # ids, names, words inside names, aliases
    at = [m["id"] for m in matches]
    assert "KO" in at and all(at.index(i) < at.index("KO") for i in at if i.startswith("CO"))
    assert ids("%25") == ids("_") == []  # no wildcard: "%" is punctuation, no word
    # "c%a" is the words "c a" (joined: "ca", as "jp morgan" is "jpmorgan"), never "coca"
    assert ids("c%25a") == ids("c%20a") and "KO" not in ids("c%25a", 50) + ids("c_ca", 50)


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
        # a generation written before its mining was (no mined.json): mined from the docstore on first use
        manifest = SimpleNamespace(files={}, fields=SimpleNamespace(metadata=list(fields)))
        files = SimpleNamespace(docstore=docs, manifest=manifest, root=tmp_path, text_fields=("text",))
        return SimpleNamespace(files=files, metadata_fields=list(fields), text_fields=("text",))

    return make


def _ids(searcher, prefix: str, limit: int = 10) -> list[str]:
    return [m["id"] for m in explorer.complete(searcher, prefix, limit)]


def test_completion_ranks_id_then_name_then_a_word_inside(crafted):
    s = crafted()
    # the id, an id prefix, a name prefix ("The" and "Company" aside: KO's name is "coca cola", the
    # shorter), then a word inside a name; no texts here, so no prominence: the shorter name first
    assert _ids(s, "coca") == ["COCA", "COCAL", "KO", "COKE", "XCOCA"]
    assert _ids(s, "coca", 2) == ["COCA", "COCAL"]
    assert _ids(s, "cola") == ["KO", "COKE"]
    assert _ids(s, "coca cola") == _ids(s, "COCA-COLA") == _ids(s, "coca--cola") == _ids(s, "cocacola") == ["KO", "COKE"]
    assert _ids(s, "the coca") == _ids(s, "coca cola company") == ["KO"]
    assert _ids(s, "coca-") == ["KO", "COKE", "COCA", "XCOCA"]  # a word ends there (the id COCA): not Cocaine
    assert _ids(s, "company") == _ids(s, "inc") == []  # a legal form starts no key
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
    assert len("international business machines co") >= completion.KEY_BYTES  # the two share every key byte
    assert _ids(s, "international business machines cor") == ["LONG"]
    assert _ids(s, "international business machines coo") == ["IBMX"]
    assert _ids(s, "business machines corporation worldwide") == ["LONG"]
    assert _ids(s, "international business machines corporation worldwide inc") == []


def test_completion_on_a_big_index_matches_whole_prefixes_only(crafted, monkeypatch):
    monkeypatch.setattr(completion, "COMPLETION_MAX_DOCS", len(COMPANIES) - 1)  # "big": no word index is built
    s = crafted()
    assert _ids(s, "coca") == ["COCA", "COCAL", "COKE"] and _ids(s, "cola") == [] and _ids(s, "%") == []
    assert s.files.docstore not in completion._COMPLETIONS


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
    assert "brackets nest more than 32 deep" in deep["errors"][0]["message"]


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


# ------------------------------------------------------------------------------ what the page says a score is
NODE = shutil.which("node")


def _node(tmp_path: Path, script: str):
    """``script`` run by node as an ES module beside the page's recipe.js, query.js and marks.js (imported
    as ``r``, ``q`` and ``m``; none imports another or touches the DOM): its JSON stdout."""
    if NODE is None:
        pytest.skip("needs node")
    for name in ("recipe", "query", "marks"):
        shutil.copy(explorer.UI_DIR / f"{name}.js", tmp_path / f"{name}.mjs")
    (tmp_path / "main.mjs").write_text('import * as r from "./recipe.mjs";\nimport * as q from "./query.mjs";\n'
                                       'import * as m from "./marks.mjs";\n' + script)
    out = subprocess.run([NODE, str(tmp_path / "main.mjs")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_page_says_a_recipe_in_the_clis_words(index, tmp_path):
    """The relations panel showed a recipe as raw JSON; recipe.js `describe` writes Recipe.describe()'s words."""
    from relsearch.retrieval.recipe import Recipe

    stored = [r["recipe"] for r in index.relations() if "recipe" in r]
    crafted = [{"mixture": {"qa-entailment": 0.25, "identity": 0.75}, "bm25": 0.1, "title": 0.25,
                "same": {"gics_sub_industry_code": 0.5, "unused": 0.0, "tiny": 1e-05}},
               {"mixture": {"a": -2.5, "b": 1 / 3}, "bm25": 1.0, "same": {"x": 10.0}}, {"mixture": {"a": 999.999999}},
               {"mixture": {"a": 1.0}, "prior": {"a": 0.2}, "unanswered": {"a": 0.5}, "neighbours": 0.3, "depth": 1000}]
    numbers = [0.0, 1.0, 0.3, 1 - 0.7, 1 / 3, 2 / 3, 1e-05, 0.0001, 123456.0, 1234567.0, -0.5, 999.9999996, 5e-324]
    said = _node(tmp_path, f"const recipes = {json.dumps(stored + crafted)};\n"
                           f"console.log(JSON.stringify({{words: recipes.map((x) => r.describe(r.readRecipe(x))),"
                           f" g: {json.dumps(numbers)}.map(r.g), bad: [r.readRecipe({{mixture: 'x'}}),"
                           f" r.readRecipe({{mixture: {{a: '1'}}}}), r.readRecipe(null)]}}));")
    assert said["words"] == [Recipe.from_json(x).describe() for x in stored + crafted]
    assert said["g"] == [format(x, "g") for x in numbers]
    assert said["bad"] == [None, None, None]
    by_name = {r["name"]: w for r, w in zip([r for r in index.relations() if "recipe" in r], said["words"])}
    assert by_name["similar-company"] == ("0.3·minmax(1·similar-company) + 0.7·minmax(bm25) + "
                                          "0.2·same gics_sub_industry_code + 0.2·same gics_industry_code + 0.5·prominence + "
                                          "1·mentions within gics_industry_code")


MIXTURES = [({"identity": 1.0}, None), ({"similar-company": 1.0}, None), ({"identity": 0.5, "aspect:sector": 0.5}, None),
            ({"similar-company": 0.7, "identity": 0.3}, None), ({"same-caption": 1.0, "qa-entailment": 2.0}, None),
            ({"identity": 1.0}, "rrf"), ({"aspect:sector": 1.0}, "weighted"), ({"aspect:industry": 0.4}, None)]


def test_the_page_labels_scores_with_the_answers_mode_and_their_parts_add_up(index, tmp_path):
    """The page named a recipe score beside an operator's cosine (1.41 by `similar-company 0.508`): it
    labels scores with the mode the answer says its plan ran and says the answer's combined recipe in
    Recipe.describe()'s words, and the parts it stacks add up to each hit's score, as the HTTP answer
    gives them."""
    wanted, answers = [], []
    for mixture, hybrid in MIXTURES:
        hits = index.search(id="ADBE", relations=mixture, hybrid=hybrid, k=8, explain=True)
        words = "" if hits.mode == "projection" else \
            f"runs {'rrf(dense, bm25) of ' if hits.mode == 'rrf' else ''}{hits.recipe.describe()}"
        wanted.append([hits.mode, words])
        answers.append({"mode": hits.mode, "recipe": hits.recipe.to_json(),
                        "results": [h.to_json(i + 1) for i, h in enumerate(hits)]})
    said = _node(tmp_path, f"const answers = {json.dumps(answers)};\n"
                           "console.log(JSON.stringify(answers.map((a) => ({plan: [a.mode, r.ranWords(a)],"
                           " parts: a.results.map((hit) => r.scoreParts(hit, a.mode, 'score').map((x) => [x.key, x.value]))}))));")
    assert [s["plan"] for s in said] == wanted
    past = _node(tmp_path, "console.log(JSON.stringify([r.scoreParts({score: -1.2, explain: {'recipe:dense': -0.2,"
                           " 'recipe:past-pool': -1, dense: 0.1}}, 'recipe', 's'), r.scoreParts({score: 0.5, explain:"
                           " {'recipe:dense': 0.1}}, 'recipe', 's'), r.ranWords({mode: 'recipe', recipe: 'x'}),"
                           " r.ranWords({mode: 'projection', recipe: {mixture: {view: 1}}})]));")
    assert past == [[{"key": "recipe:dense", "value": -0.2, "label": "dense", "kind": "dense"},  # past the pool
                     {"key": "recipe:past-pool", "value": -1, "label": "past the pool", "kind": "past-pool"}],
                    [{"key": "score", "value": 0.5, "label": "s", "kind": "score"}],  # parts that miss: the score alone
                    "", ""]  # a recipe the page cannot read is not put in words; a projection has none
    modes = {tuple(m): s["plan"][0] for (m, _), s in zip(MIXTURES, said)}
    assert modes[("similar-company",)] == "recipe" and modes[("identity", "aspect:sector")] == "dense"
    for (mixture, hybrid), case, answer in zip(MIXTURES, said, answers):
        hits = answer["results"]
        assert len(case["parts"]) == len(hits) > 0
        for parts, hit in zip(case["parts"], hits):
            assert sum(v for _, v in parts) == pytest.approx(hit["score"], abs=1e-5), (mixture, hit["explain"])
            keys = [k for k, _ in parts]
            if case["plan"][0] == "recipe":
                assert keys[0] == "recipe:dense" and all(k.startswith("recipe:") for k in keys), keys
            elif case["plan"][0] == "dense" and (len(mixture) > 1 or set(mixture.values()) != {1.0}):
                assert keys == [f"mixture:{n}" for n in mixture], keys  # weight × cosine each
            else:
                assert keys == ["score"], keys


def test_the_page_reads_the_plan_from_the_answer_and_keeps_no_copy_of_it(tmp_path):
    """The page worked out each search's mode and combined recipe in JavaScript (a copy of
    retrieval/plan.py's resolve and combine, already apart from it: hybrid weighted gave BM25 0.5
    whatever the weight); it now reads the answer's `mode` and `recipe` and decides nothing itself."""
    from relsearch.retrieval.request import NO_HIGHLIGHTS

    source = {name: (explorer.UI_DIR / name).read_text(encoding="utf-8") for name in ASSETS if name.endswith(".js")}
    copies = {name: re.findall(r"function\s+(plan|combine|relationRecipe|modeOf|lexical)\b", text)
              for name, text in source.items()}
    assert not any(copies.values()), copies
    assert "mode: plain.mode" in source["app.js"] and "mode: mixed.mode" in source["app.js"]
    # the page asks every search for highlights and leaves out the server's word that one has none
    said = _node(tmp_path, "console.log(JSON.stringify(m.NO_HIGHLIGHTS));")
    assert len(said) > 20 and NO_HIGHLIGHTS.startswith(said)


def test_relation_sources_say_what_each_relation_was_trained_on(index):
    from types import SimpleNamespace

    said = explorer.sources(index.searcher())["relations"]
    assert said["same-caption"]["trained_on"] == "Flickr8k captions"
    assert said["same-caption"]["dataset"].startswith("flickr8k_captions — Flickr8k captions (")
    assert said["contradiction"]["trained_on"] == "SICK, SemEval-2014 Task 1"
    assert said["similar-company"]["trained_on"] == "Yahoo Finance descriptions + Bloomberg GICS codes"
    assert "identity" not in said
    op = lambda **info: SimpleNamespace(info=info)  # noqa: E731
    crafted = SimpleNamespace(bundle=SimpleNamespace(
        info={"sources": {"a": {"dataset": "listed — Listed texts (x)"}, "b": {"dataset": 3}, "c": "text"}},
        operators={"a": op(trained_on="image captions"), "b": op(domain=["x"]), "c": op(dataset="NLI sentences"),
                   "d": op(), "e": op(trained_on="x" * 1000)}, heads={"h": op(dataset="questions (Q)")}))
    assert explorer.sources(crafted)["relations"] == {
        "a": {"trained_on": "image captions", "dataset": "image captions"},
        "c": {"trained_on": "NLI sentences", "dataset": "NLI sentences"},
        "e": {"trained_on": "x" * explorer.MAX_SOURCE_CHARS, "dataset": "x" * explorer.MAX_SOURCE_CHARS},
        "h": {"trained_on": "questions", "dataset": "questions (Q)"}}


def test_relation_sources_endpoint(keyed):
    answer = json.loads(_get(keyed + "/relations/sources")[2])
    assert answer["index"] == "companies" and answer["relations"]["same-caption"]["trained_on"] == "Flickr8k captions"


# ------------------------------------------------------------------------------ examples, facets, highlights
def test_a_query_by_examples_lives_in_the_url(tmp_path):
    """like=MSFT&like=ORCL:0.5&unlike=IBM (and like_text / unlike_text) read back as the examples the API
    takes, and a state written as a URL reads back as itself (an id with a colon keeps its weight)."""
    from urllib.parse import urlencode

    url = "?" + urlencode([("like", "MSFT"), ("like", "ORCL:0.5"), ("unlike", "IBM"), ("like_text", "cloud software"),
                           ("unlike_text", "note: a text:2"), ("unlike", "X:1e-3"), ("like", "BRK:B"),
                           ("relation", "similar-company:0.7"), ("facet", "gics_sector"), ("facet", "founded"),
                           ("facet_depth", "50"), ("k", "5")])
    said = _node(tmp_path, f"const s = q.readState({json.dumps(url)});\n"
                           "const again = q.readState(q.writeState(s));\n"
                           "const colon = q.readState(q.writeState({...s, like: [{id: 'A:1', weight: null}], unlike: []}));\n"
                           "console.log(JSON.stringify({s, again, like: q.examplesBody(s.like), unlike: q.examplesBody(s.unlike),"
                           " colon: colon.like, id: q.readState('?id=ADBE&k=5'), written: q.writeState(s)}));")
    state = said["s"]
    assert state["mode"] == "like" and state["k"] == 5 and state["relations"] == {"similar-company": 0.7}
    assert said["like"] == [{"id": "MSFT"}, {"id": "ORCL", "weight": 0.5}, {"id": "BRK:B"}, {"text": "cloud software"}]
    assert said["unlike"] == [{"id": "IBM"}, {"id": "X", "weight": 0.001}, {"text": "note: a text", "weight": 2}]
    assert state["facets"] == ["gics_sector", "founded"] and state["facetDepth"] == 50
    assert said["again"] == state  # URL → state → URL → the same state
    assert "like=MSFT&like=ORCL%3A0.5&like=BRK%3AB&" in said["written"] and "unlike=IBM" in said["written"]
    assert said["colon"] == [{"id": "A:1", "weight": 1}]  # written A:1:1, not read as A weighted 1
    plain = said["id"]
    assert plain["mode"] == "id" and plain["like"] == plain["unlike"] == [] and plain["facets"] == []
    # what the page sends is what the Python API reads
    from relsearch.api import examples

    assert [(e.doc_id, e.text, e.weight) for e in examples(said["unlike"], "unlike")] == [
        ("IBM", None, 0.5), ("X", None, 0.001), (None, "note: a text", 2.0)]


FACET_VALUES = ["Energy", "Houston, Texas", "123", "true", "null", "Oil or Gas", "OIL OR GAS", " padded", "", 'say "hi"',
                "=x", "<3", "[1]", "{a}", "a\\b", "ends\\", "not this", "x in [1]", "Zürich", "Procter AND Gamble",
                "Oil or", "a b=c", "a\tor b", "orbit and", 5, 2.5, -3, 0, True, False]


def test_a_facet_count_adds_the_filter_it_stands_for(tmp_path):
    """Each value a facet counts becomes an expression that the CLI's parser (POST /filters/parse) reads
    as an equality to exactly that value; null: `is null`; an array, an object or an odd field name: none."""
    said = _node(tmp_path, f"const values = {json.dumps(FACET_VALUES)};\n"
                           "console.log(JSON.stringify({specs: values.map((v) => q.facetFilter('gics_sector', v)),"
                           " none: [q.facetFilter('f', [1]), q.facetFilter('f', {a: 1}), q.facetFilter('a b', 'x'),"
                           " q.facetFilter('a=b', 'x')], nil: q.facetFilter('f', null)}));")
    for value, spec in zip(FACET_VALUES, said["specs"]):
        parsed = explorer.parse_filters([spec], ["gics_sector"])
        assert parsed["errors"] == [] and parsed["filters"] == {"gics_sector": value}, (value, spec, parsed)
        assert type(parsed["filters"]["gics_sector"]) is type(value), (value, spec)
    assert said["specs"][:2] == ["gics_sector=Energy", "gics_sector=Houston, Texas"]  # plain where plain reads alike
    assert said["none"] == [None, None, None, None]
    assert said["nil"] == "f is null" and explorer.parse_filters([said["nil"]], ["f"])["filters"] == {"f": {"null": True}}


def test_highlights_mark_what_the_server_offsets_say(tmp_path):
    """The server's offsets count code points (Python), the page's strings UTF-16 units: a text with
    characters past U+FFFF must still mark the terms; a term past the first 220 characters moves the
    snippet to it; offsets that are not a pair of integers within the text mark nothing."""
    from relsearch.retrieval.highlight import offsets, terms

    query = "oil and gas exploration"
    texts = ["😀😀 Oil and 𝔊as: gas exploration, 🛢 oil.", "word " * 80 + "then oil and gas exploration at last 🛢 oil",
             "short oil"]
    wanted = terms(query)
    highlights = [offsets(t, wanted) for t in texts]
    said = _node(tmp_path, f"const texts = {json.dumps(texts)}, hl = {json.dumps(highlights)};\n"
                           "console.log(JSON.stringify({whole: texts.map((t, i) => m.snippet(t, hl[i], 10000)),"
                           " cut: m.snippet(texts[1], hl[1]), bad: m.snippet(texts[2], [[6, 3], 'x', [0, 99], [1.5, 3],"
                           " [6, 9], [7, 8]]), whole_term: m.snippet('abc oil', [[4, 7]], 5)}));")
    for text, spans, shown in zip(texts, highlights, said["whole"]):
        assert "".join(part for part, _ in shown["parts"]) == text
        assert [part for part, marked in shown["parts"] if marked] == [text[s:e] for s, e in spans]
        assert all(part.lower() in wanted for part, marked in shown["parts"] if marked)
    cut = said["cut"]
    assert cut["cutBefore"] and len("".join(p for p, _ in cut["parts"])) <= 220
    assert [p for p, marked in cut["parts"] if marked][:3] == ["oil", "gas", "exploration"]
    assert said["bad"]["parts"] == [["short ", False], ["oil", True]]  # only [6, 9]; [7, 8] overlaps it
    assert said["whole_term"]["parts"] == [["abc ", False], ["oil", True]]  # widened: never half a term marked
