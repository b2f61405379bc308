"""The explorer page and /docs in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright: no browser download) against a live `relsearch serve` on loopback behind an API key.

Run with `make test-browser`. Screenshots go to $RELSEARCH_BROWSER_ARTIFACTS (default: the test's
tmp folder). The page must show what `relsearch query` answers: the ids of both lists and the rank
movements are compared with the CLI's JSON for the same query.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (apt-get install chromium)")]
playwright_api = pytest.importorskip("playwright.sync_api")

KEY = "browser-test-key"
DOC = "ADBE"  # in the test index (the first 120 demo companies)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
RELSEARCH = [sys.executable, "-m", "relsearch.cli"]


@contextlib.contextmanager
def serving(index: Path, folder: Path):
    """`relsearch serve --index INDEX` on a free loopback port, with an API key; yields its url."""
    key_file = folder / "key"
    key_file.write_text(KEY + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([*RELSEARCH, "serve", "--index", str(index), "--port", "0", "--api-key-file",
                             str(key_file), "--no-access-log"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    match = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
    if match is None:
        proc.kill()
        pytest.fail(f"relsearch serve did not start: {line}{proc.stderr.read()}")
    yield match[1]
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def served(small_index, tmp_path_factory):
    """`relsearch serve` on the small index; yields (url, index dir)."""
    with serving(small_index, tmp_path_factory.mktemp("key")) as url:
        yield url, small_index


def cli(index: Path, *args: str) -> list[dict]:
    out = subprocess.run([*RELSEARCH, "query", "--index", str(index), "--json", *args], capture_output=True, text=True,
                         check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("RELSEARCH_BROWSER_ARTIFACTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def browsing(url: str, folder: Path):
    """A fresh Chromium profile; every request and console error of the page is recorded, and none may
    leave ``url`` (a download's blob: URL of this origin is the page's own bytes)."""
    with playwright_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(folder / "profile"), executable_path=CHROMIUM,
                                                       headless=True, args=CHROMIUM_ARGS, accept_downloads=True,
                                                       viewport={"width": 1400, "height": 1800})
        page = context.new_page()
        page.requests, page.console_errors = [], []
        page.on("request", lambda r: page.requests.append(r.url))
        page.on("console", lambda m: page.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: page.console_errors.append(str(e)))
        yield page
        context.close()
    off_host = [u for u in page.requests if not u.startswith((url + "/", "data:", f"blob:{url}/"))]
    assert not off_host, off_host  # nothing left 127.0.0.1
    assert not any(KEY in u for u in page.requests)  # the key never went into a URL


@pytest.fixture
def browser_page(served, tmp_path):
    with browsing(served[0], tmp_path) as page:
        yield page


def listed(page, which: str) -> list[str]:
    return page.eval_on_selector_all(f"#{which}-hits > li", "items => items.map(li => li.dataset.id)")


def wait_until(page, condition, what: str, seconds: float = 30) -> None:
    """Poll ``condition()`` from here: page.wait_for_function evaluates a string, which the page's CSP forbids."""
    for _ in range(int(seconds * 10)):
        if condition():
            return
        page.wait_for_timeout(100)
    pytest.fail(f"timed out waiting for {what}")


def movements(page) -> dict[str, str]:
    return dict(page.eval_on_selector_all("#mixture-hits > li", "items => items.map(li => "
                                          "[li.dataset.id, li.querySelector('.move').textContent])"))


def expected_movements(identity: list[dict], mixture: list[dict]) -> dict[str, str]:
    before = {h["id"]: h["rank"] for h in identity}
    out = {}
    for hit in mixture:
        delta = before[hit["id"]] - hit["rank"] if hit["id"] in before else None
        out[hit["id"]] = "new" if delta is None else "=" if delta == 0 else f"{'↑' if delta > 0 else '↓'}{abs(delta)}"
    return out


def test_docs_render_offline(served, browser_page, artifacts):
    page = browser_page
    page.goto(served[0] + "/docs")
    page.wait_for_selector(".opblock-summary-path", timeout=30_000)
    paths = page.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.textContent.trim())")
    assert {"/search", "/search/batch", "/relations", "/score", "/fields", "/complete", "/health"} <= set(paths)
    page.screenshot(path=str(artifacts / "docs.png"), full_page=False)
    assert not page.console_errors, page.console_errors


def test_explorer_matches_the_cli(served, browser_page, artifacts):
    url, index = served
    page = browser_page
    page.goto(f"{url}/?id={DOC}&relation=similar-company:1&k=10&cols=name,gics_sector")
    page.wait_for_selector("#key-form:not([hidden])")  # the key is required: the page asks for it
    page.fill("#key", KEY)
    page.click("#key-form button")
    page.wait_for_selector("#mixture-hits > li")  # the URL's state is searched without a click
    assert page.evaluate("sessionStorage.getItem('relsearch.api-key')") == KEY and KEY not in page.url
    identity, mixture = cli(index, "--id", DOC), cli(index, "--id", DOC, "-r", "similar-company")
    assert listed(page, "identity") == [h["id"] for h in identity]
    assert listed(page, "mixture") == [h["id"] for h in mixture]
    assert movements(page) == expected_movements(identity, mixture)
    page.screenshot(path=str(artifacts / "explorer-similar-company.png"), full_page=True)
    # unauthenticated console noise was the 401s before the key; nothing else may fail
    assert all("401" in e for e in page.console_errors), page.console_errors
    page.console_errors.clear()

    # sliders: similar-company 0.7 + identity 0.3 ranks as `-r similar-company=0.7 -r identity=0.3`
    first = listed(page, "mixture")
    for name, weight in (("identity", "0.3"), ("similar-company", "0.7")):
        page.eval_on_selector(f'[data-relation="{name}"]', "(el, w) => { el.value = w; "
                              "el.dispatchEvent(new Event('change')); }", weight)
    mixed = cli(index, "--id", DOC, "-r", "similar-company=0.7", "-r", "identity=0.3")
    wait_until(page, lambda: "0.7" in page.text_content("#mixture-name") and listed(page, "mixture") == [
        h["id"] for h in mixed], "the page to show the CLI's answer for the mixture")
    assert "relation=similar-company%3A0.7" in page.url and "relation=identity%3A0.3" in page.url
    assert listed(page, "mixture") != first or [h["id"] for h in mixed] == first

    # a filter narrows the results, as --filter does
    page.click("#add-filter")
    page.select_option(".filter .field", "gics_sector")
    page.select_option(".filter .op", "=")
    page.fill(".filter .value", "Information Technology")
    page.click("#search")
    narrowed = cli(index, "--id", DOC, "-r", "similar-company=0.7", "-r", "identity=0.3",
                   "--filter", "gics_sector=Information Technology")
    wait_until(page, lambda: listed(page, "mixture") == [h["id"] for h in narrowed], "the filtered answer")
    sectors = [h["metadata"].get("gics_sector") for h in mixed]
    assert set(sectors) != {"Information Technology"} and [h["id"] for h in narrowed] != [h["id"] for h in mixed]
    assert all(h["metadata"]["gics_sector"] == "Information Technology" for h in narrowed)
    page.screenshot(path=str(artifacts / "explorer-filtered.png"), full_page=True)

    # an error from the API appears next to its field
    page.fill("#k", "100000")
    page.click("#search")
    page.wait_for_selector('.error[data-for="k"]:not(:empty)')
    assert not page.console_errors or all("422" in e for e in page.console_errors), page.console_errors


def test_text_search_and_score_panel(served, browser_page, artifacts):
    url = served[0]
    page = browser_page
    page.goto(url + "/ui/assets/style.css")  # this origin, without the page's requests
    page.evaluate("key => sessionStorage.setItem('relsearch.api-key', key)", KEY)
    page.goto(f"{url}/?text=cloud+software+for+enterprises&k=5")
    page.wait_for_selector("#identity-hits > li")
    assert len(listed(page, "identity")) == 5
    page.fill("#score-a", "Apple makes phones.")
    page.fill("#score-b", "Samsung makes phones.")
    page.click("#score-form button")
    page.wait_for_selector("#scores .bar")
    labels = page.eval_on_selector_all("#scores .bar .label", "els => els.map(e => e.textContent)")
    assert {"identity", "similar-company"} <= set(labels)
    assert page.eval_on_selector_all("#relation-table tbody tr", "rows => rows.length") >= 2
    page.screenshot(path=str(artifacts / "explorer-score.png"), full_page=True)
    assert not page.console_errors, page.console_errors


# ------------------------------------------------------------------------------ filters from a URL, crafted bundles
def _open_with_key(page, url: str) -> None:
    page.goto(url + "/ui/assets/style.css")  # this origin, without the page's requests
    page.evaluate("key => sessionStorage.setItem('relsearch.api-key', key)", KEY)


def test_url_filters_are_read_as_the_cli_reads_them(served, browser_page, artifacts):
    """`A or B` became one equality to the whole text, `not ...` a field named "not ...": the page now
    sends its URL's expressions to the server, which reads them with the CLI's parser."""
    from urllib.parse import urlencode

    url, index = served
    page = browser_page
    specs = ["gics_sector=Energy or gics_sector=Utilities", "not hq_location=Houston, Texas"]
    _open_with_key(page, url)
    page.goto(f"{url}/?" + urlencode({"id": DOC, "relation": "similar-company:1", "k": "10", "filter": specs},
                                     doseq=True))
    wanted = cli(index, "--id", DOC, "-r", "similar-company", "-k", "10", *[a for s in specs for a in ("--filter", s)])
    assert 0 < len(wanted) < 10 and all(h["metadata"]["gics_sector"] in ("Energy", "Utilities") and
                                        h["metadata"]["hq_location"] != "Houston, Texas" for h in wanted)
    wait_until(page, lambda: listed(page, "mixture") == [h["id"] for h in wanted], "the CLI's answer for the URL's filters")
    # a row cannot show `or` / `not`: they stay as written, and the URL keeps them unchanged
    assert page.eval_on_selector_all(".filter.expression .expr", "els => els.map(e => e.value)") == specs
    assert page.eval_on_selector_all(".filter-error", "els => els.map(e => e.textContent)") == ["", ""]
    page.click("#search")
    wait_until(page, lambda: listed(page, "mixture") == [h["id"] for h in wanted], "the same answer again")
    from urllib.parse import parse_qs, urlsplit
    assert parse_qs(urlsplit(page.url).query)["filter"] == specs
    page.screenshot(path=str(artifacts / "explorer-url-filters.png"), full_page=True)
    assert not page.console_errors, page.console_errors


def test_url_filters_on_unknown_fields_are_named_not_replaced(served, browser_page):
    """An unknown field became the index's first field (hits for another filter), and a `__proto__`
    field set Object.prototype.eq in the page."""
    url = served[0]
    page = browser_page
    _open_with_key(page, url)
    page.goto(f"{url}/?id={DOC}&k=5&filter=nosuch%3D1&filter=__proto__%3D1&relation=__proto__%3A0.5")
    wait_until(page, lambda: page.eval_on_selector_all(".filter-error", "els => els.filter(e => e.textContent).length")
               == 2, "an error next to each filter")
    errors = page.eval_on_selector_all(".filter-error", "els => els.map(e => e.textContent)")
    assert "unknown filter field 'nosuch'" in errors[0] and "unknown filter field '__proto__'" in errors[1], errors
    assert page.eval_on_selector_all(".filter .field", "els => els.map(e => e.value)") == ["nosuch", "__proto__"]
    assert page.evaluate("() => [({}).eq, Object.prototype.eq, Object.keys(Object.prototype).length]") == [None, None, 0]
    assert listed(page, "identity") == [] and listed(page, "mixture") == []  # nothing shown for another filter
    assert page.text_content("#status").startswith("Not searched")
    assert not page.console_errors, page.console_errors


@pytest.fixture(scope="module")
def crafted_served(small_index, tmp_path_factory):
    """`relsearch serve --model` a copy of the shipped pack whose operators describe themselves badly:
    a string where metrics.bm25 is an object, a NaN count (JSON has no NaN: GET /relations failed)."""
    from relsearch.encoder.bundle import default_bundle_path

    folder = tmp_path_factory.mktemp("crafted") / "pack"
    shutil.copytree(default_bundle_path(), folder)
    manifest = json.loads((folder / "bundle.json").read_text())
    for op in manifest["operators"]:
        if op["name"] != "identity":
            op["metrics"] = {**op.get("metrics", {}), "bm25": "mrr-string", "queries": float("nan")}
    (folder / "bundle.json").write_text(json.dumps(manifest))
    key_file = tmp_path_factory.mktemp("crafted-key") / "key"
    key_file.write_text(KEY + "\n")
    proc = subprocess.Popen([*RELSEARCH, "serve", "--index", str(small_index), "--model", str(folder), "--port", "0",
                             "--api-key-file", str(key_file), "--no-access-log"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    line = proc.stdout.readline()
    match = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
    if match is None:
        proc.kill()
        pytest.fail(f"relsearch serve did not start: {line}{proc.stderr.read()}")
    yield match[1]
    proc.terminate()
    proc.wait(30)


def test_a_bundle_field_of_the_wrong_type_does_not_close_the_explorer(crafted_served, tmp_path, artifacts):
    """metrics {"bm25": "mrr-string"} made the page say "The index could not be opened"."""
    with playwright_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                       headless=True, args=CHROMIUM_ARGS)
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        _open_with_key(page, crafted_served)
        page.goto(f"{crafted_served}/?text=oil+and+gas+producers&k=5")
        page.wait_for_selector("#identity-hits > li", timeout=60_000)
        rows = page.eval_on_selector_all("#relation-table tbody tr", "rows => rows.map(r => r.dataset.name)")
        assert "similar-company" in rows and "could not be opened" not in page.text_content("#status")
        page.screenshot(path=str(artifacts / "explorer-crafted-bundle.png"), full_page=True)
        context.close()
    assert not errors, errors


def test_the_relations_panel_marks_a_relation_that_loses(served, browser_page, artifacts):
    """Each relation that GET /relations says loses (own test or transfer set: retrieval/verdicts.py)
    is marked in the relations panel with its lines; the others are not; transfer figures get a column."""
    from relsearch.api import open_index

    url, index = served
    rows = open_index(index).relations()
    page = browser_page
    _open_with_key(page, url)
    page.goto(f"{url}/?text=oil+and+gas+producers&k=5")
    page.wait_for_selector("#relation-table tbody tr")
    shown = dict(page.eval_on_selector_all("#relation-table tbody tr", "rows => rows.map(r => [r.dataset.name, "
                                           "[...r.querySelectorAll('ul.losses li')].map(li => li.textContent)])"))
    assert shown == {r["name"]: r.get("losses", []) for r in rows}
    marked = page.eval_on_selector_all("#relation-table tbody tr.loses", "rows => rows.map(r => r.dataset.name)")
    assert marked == [r["name"] for r in rows if r.get("losses")]
    transfer = dict(page.eval_on_selector_all("#relation-table tbody tr", "rows => rows.map(r => [r.dataset.name, "
                                              "r.lastElementChild.textContent])"))
    for r in rows:
        if isinstance(r.get("transfer"), dict):
            assert r["transfer"]["dataset"] in transfer[r["name"]], r["name"]
    page.screenshot(path=str(artifacts / "explorer-relations-panel.png"), full_page=True)
    assert not page.console_errors, page.console_errors


# ------------------------------------------------------------------------------ the score the page shows, explained
SCORES_JS = """items => items.map(li => {
  const stack = li.querySelector('.stack'), track = li.querySelector('.stack-track').getBoundingClientRect().width;
  return {id: li.dataset.id, scale: li.querySelector('.score .scale').textContent,
          shown: Number(li.querySelector('.score .value').textContent), lo: Number(stack.dataset.lo),
          hi: Number(stack.dataset.hi), legend: (li.querySelector('.legend') || {}).textContent || '',
          parts: [...li.querySelectorAll('.seg')].map(s => [s.dataset.part, Number(s.dataset.value),
                                                            s.getBoundingClientRect().width / track])};
})"""


def shown_scores(page, which: str) -> list[dict]:
    return page.eval_on_selector_all(f"#{which}-hits > li", SCORES_JS)


def assert_parts_add_up(hits: list[dict], scale: str) -> None:
    """Each hit's stacked parts: values summing to the score it shows, lengths (positive right of 0,
    negative left) that measure the score on the list's track, the score labelled with its scale."""
    assert hits
    for hit in hits:
        assert hit["scale"] == scale, hit
        values = [v for _, v, _ in hit["parts"]]
        assert sum(values) == pytest.approx(hit["shown"], abs=2e-4), hit
        signed = sum(w if v >= 0 else -w for _, v, w in hit["parts"])
        assert signed == pytest.approx(hit["shown"] / (hit["hi"] - hit["lo"]), abs=5e-3), hit


def test_the_page_explains_the_score_it_shows(served, browser_page, artifacts):
    """The page showed a recipe score (1.41) beside a bar labelled `similar-company 0.508`, the recipe as
    raw JSON, and dropped a relation the index lacks from the URL without a word."""
    from relsearch.encoder.bundle import default_bundle_path
    from relsearch.retrieval.recipe import Recipe

    url, index = served
    page = browser_page
    _open_with_key(page, url)
    page.goto(f"{url}/?id={DOC}&relation=similar-company:1&k=5")
    page.wait_for_selector("#mixture-hits > li .stack")
    mixture, identity = shown_scores(page, "mixture"), shown_scores(page, "identity")
    assert_parts_add_up(mixture, "recipe score")
    assert_parts_add_up(identity, "cosine")
    cli_hits = cli(index, "--id", DOC, "-r", "similar-company", "-k", "5", "--explain")
    assert [h["id"] for h in mixture] == [h["id"] for h in cli_hits]
    for hit, want in zip(mixture, cli_hits):  # the CLI's recipe:* parts, each its own segment
        parts = {k: v for k, v in want["explain"].items() if k.startswith("recipe:")}
        assert {k: v for k, v, _ in hit["parts"]} == pytest.approx(parts, abs=1e-6)
        assert "dense" in hit["legend"] and "BM25" in hit["legend"]
    # the plan's warnings, listed above the results: none for this --id query (the demo corpus has the GICS
    # codes of the recipe's bonuses); a text query of the relation has no document to share them with
    warnings = lambda: page.eval_on_selector_all("#warnings li", "els => els.map(e => e.textContent)")  # noqa: E731
    assert not any("bonuses for sharing" in w for w in warnings()), warnings()
    page.goto(f"{url}/?text=cloud+software&relation=similar-company:1&k=5")
    page.wait_for_selector("#mixture-hits > li .stack")
    assert any("the recipe's bonuses for sharing gics_sub_industry_code" in w and "do not apply to a text query" in w
               for w in warnings()), warnings()
    page.goto(f"{url}/?id={DOC}&relation=similar-company:1&k=5")
    page.wait_for_selector("#mixture-hits > li .stack")
    # sliders start where the search is; the relations panel says recipes in words and what each was trained on
    weights = dict(page.eval_on_selector_all("[data-relation]", "els => els.map(e => [e.dataset.relation, e.value])"))
    assert weights["similar-company"] == "1" and weights["identity"] == "0"
    words = dict(page.eval_on_selector_all("#relation-table tr", "rows => rows.filter(r => r.querySelector('.recipe'))"
                                           ".map(r => [r.dataset.name, r.querySelector('.recipe').textContent])"))
    shipped = json.loads((Path(default_bundle_path()) / "bundle.json").read_text())["operators"]
    assert words == {op["name"]: "runs " + Recipe.from_json(op["recipe"]).describe() for op in shipped if "recipe" in op}
    assert words["similar-company"] == ("runs 0.3·minmax(1·similar-company) + 0.7·minmax(bm25) + "
                                        "0.2·same gics_sub_industry_code + 0.2·same gics_industry_code + 0.5·prominence + "
                                        "1·mentions within gics_industry_code")
    notes = dict(page.eval_on_selector_all("#relation-table tr", "rows => rows.filter(r => r.querySelector('.trained-on'))"
                                           ".map(r => [r.dataset.name, r.querySelector('.trained-on').textContent])"))
    assert notes["same-caption"] == "trained on: Flickr8k captions" and "identity" not in notes
    assert "trained on: Flickr8k captions" in page.text_content('label.relation:has([data-relation="same-caption"])')
    page.screenshot(path=str(artifacts / "explorer-recipe-parts.png"), full_page=True)

    # a dense mixture: its mixture:NAME parts (weight × cosine) stack up to the score
    page.goto(f"{url}/?id={DOC}&relation=identity:0.5&relation=aspect:sector:0.5&k=5")
    page.wait_for_selector("#mixture-hits > li .seg[data-part='mixture:aspect:sector']")
    mixture = shown_scores(page, "mixture")
    assert_parts_add_up(mixture, "cosine")
    assert all(sorted(p[0] for p in hit["parts"]) == ["mixture:aspect:sector", "mixture:identity"] for hit in mixture)

    # nothing chosen: identity at 1; a relation the index lacks is named next to it, and nothing is searched
    page.goto(f"{url}/?text=cloud+software&k=5")
    page.wait_for_selector("#mixture-hits > li")
    weights = dict(page.eval_on_selector_all("[data-relation]", "els => els.map(e => [e.dataset.relation, e.value])"))
    assert weights["identity"] == "1" and set(weights.values()) == {"0", "1"}
    page.goto(f"{url}/?text=cloud+software&k=5&relation=nosuch:1&relation=similar-company:0.5")
    page.wait_for_selector(".relation-error:not(:empty)")
    assert "nosuch is not a relation of this index" in page.text_content(".relation-error")
    wait_until(page, lambda: page.text_content("#status").startswith("Not searched"), "the page to refuse the search")
    assert listed(page, "mixture") == [] and "nosuch" in page.text_content("#status")
    page.click('[data-unknown-relation="nosuch"] .remove')
    page.click("#search")
    page.wait_for_selector("#mixture-hits > li")
    assert "nosuch" not in page.url and "relation=similar-company%3A0.5" in page.url
    assert_parts_add_up(shown_scores(page, "mixture"), "recipe score")
    assert not page.console_errors, page.console_errors


# ------------------------------------------------------------------------------ examples, facets, highlights
@pytest.fixture(scope="module")
def api_index(served):
    """The Python API on the served index (read only), for the answers the page must show."""
    from relsearch.api import Index

    return Index(served[1])


def ids(hits) -> list[str]:
    return [h.id for h in hits]


def test_a_url_with_examples_searches_by_them(served, api_index, browser_page, artifacts):
    """like=ADBE&like=ADSK:0.5&unlike=CSCO is a query by examples: both lists are what Index.search(like=...,
    unlike=...) answers, no example comes back, the examples are shown, and one added in the form goes into the URL."""
    url = served[0]
    page = browser_page
    like, unlike = [{"id": "ADBE"}, {"id": "ADSK", "weight": 0.5}], [{"id": "CSCO"}]
    _open_with_key(page, url)
    page.goto(f"{url}/?like=ADBE&like=ADSK:0.5&unlike=CSCO&relation=similar-company:1&k=10&cols=name")
    mixture = ids(api_index.search(like=like, unlike=unlike, relations={"similar-company": 1.0}, k=10))
    identity = ids(api_index.search(like=like, unlike=unlike, relations={"identity": 1.0}, k=10))
    wait_until(page, lambda: listed(page, "mixture") == mixture, "the API's answer for the examples")
    assert listed(page, "identity") == identity and len(mixture) == 10
    assert not {"ADBE", "ADSK", "CSCO"} & set(mixture + identity)  # the examples never come back
    assert page.eval_on_selector('input[name="mode"]:checked', "e => e.value") == "like"
    rows = page.eval_on_selector_all("#examples .example", "rows => rows.map(r => [r.dataset.kind, "
                                     "r.querySelector('.source').value, r.querySelector('.example-value').value, "
                                     "r.querySelector('.weight').value])")
    assert rows == [["like", "id", "ADBE", ""], ["like", "id", "ADSK", "0.5"], ["unlike", "id", "CSCO", ""]]
    said = page.eval_on_selector_all("#query-line .ex", "els => els.map(e => [e.dataset.kind, e.textContent])")
    assert said == [["like", "ADBE"], ["like", "ADSK ×0.5"], ["unlike", "CSCO"]]
    assert "not like" in page.text_content("#query-line")
    page.screenshot(path=str(artifacts / "explorer-examples.png"), full_page=True)

    # one more "not like", its id completed as the id box's is; the URL keeps it, so it reproduces the search
    page.click("#add-unlike")
    page.fill("#examples .example:last-child .example-value", "appl")
    wait_until(page, lambda: "AAPL" in page.eval_on_selector_all("#id-options option", "os => os.map(o => o.value)"),
               "the completion of 'appl'")
    page.fill("#examples .example:last-child .example-value", "AAPL")
    page.fill("#examples .example:last-child .weight", "2")
    page.click("#search")
    more = ids(api_index.search(like=like, unlike=[*unlike, {"id": "AAPL", "weight": 2}],
                                relations={"similar-company": 1.0}, k=10))
    wait_until(page, lambda: listed(page, "mixture") == more, "the answer with AAPL not liked")
    assert "unlike=AAPL%3A2" in page.url and "AAPL" not in listed(page, "identity") + more
    page.goto(page.url)  # the URL alone: the same examples, the same hits
    wait_until(page, lambda: listed(page, "mixture") == more, "the same answer from the URL")
    assert not page.console_errors, page.console_errors


def facet_counts(page, field: str) -> list[list]:
    return page.eval_on_selector_all(f'#facets .facet[data-field="{field}"] .facet-value', "bs => bs.map(b => "
                                     "[JSON.parse(b.dataset.value), Number(b.querySelector('.count').textContent)])")


def test_a_facet_count_adds_its_filter(served, api_index, browser_page, artifacts):
    """facet=gics_sector counts the sectors of the mixture's first 100 hits, as Hits.facets does; clicking
    a count adds `gics_sector=VALUE` and searches again: every new hit has that value."""
    url = served[0]
    page = browser_page
    _open_with_key(page, url)
    page.goto(f"{url}/?id={DOC}&relation=similar-company:1&k=10&facet=gics_sector&cols=name,gics_sector")
    page.wait_for_selector('#facets .facet[data-field="gics_sector"] .facet-value')
    want = api_index.search(id=DOC, relations={"similar-company": 1.0}, k=10, facets=["gics_sector"]).facets
    assert facet_counts(page, "gics_sector") == want["gics_sector"]
    assert page.is_checked('[data-facet="gics_sector"]')
    sectors = [h.metadata.get("gics_sector") for h in api_index.search(id=DOC, relations={"similar-company": 1.0}, k=10)]
    at, (value, count) = next((i, vc) for i, vc in enumerate(want["gics_sector"])
                              if isinstance(vc[0], str) and vc[0] != sectors[0])  # one the first hit does not have
    page.locator("#facets .facet-value").nth(at).click()
    narrowed = api_index.search(id=DOC, relations={"similar-company": 1.0}, k=10, filters={"gics_sector": value})
    wait_until(page, lambda: listed(page, "mixture") == ids(narrowed) and listed(page, "identity") and
               page.is_visible(".filter"), f"the answer filtered on {value}")
    shown = page.eval_on_selector_all("#mixture-hits > li, #identity-hits > li", "items => items.map(li => "
                                      "[...li.querySelectorAll('.meta dt')].map(dt => [dt.textContent, "
                                      "dt.nextElementSibling.textContent]))")
    assert shown and all(dict(meta).get("gics_sector") == value for meta in shown), shown
    assert all(h.metadata["gics_sector"] == value for h in narrowed) and len(narrowed) >= min(10, count)
    assert f"filter=gics_sector%3D{value.replace(' ', '+')}" in page.url
    under = api_index.search(id=DOC, relations={"similar-company": 1.0}, k=10, filters={"gics_sector": value},
                             facets=["gics_sector"]).facets["gics_sector"]
    assert len(under) == 1 and under[0][0] == value and under[0][1] >= count
    wait_until(page, lambda: facet_counts(page, "gics_sector") == under, "the counts under the new filter")
    assert page.eval_on_selector("#facets .facet-value", "b => b.classList.contains('active')")
    page.screenshot(path=str(artifacts / "explorer-facets.png"), full_page=True)
    page.locator("#facets .facet-value").first.click()  # the same filter again: not doubled
    page.wait_for_timeout(500)
    assert page.eval_on_selector_all("#filters .filter", "rows => rows.length") == 1
    assert not page.console_errors, page.console_errors


def test_a_long_facet_shows_ten_values_and_more(served, api_index, browser_page, artifacts):
    """Issue 52, 6: a facet of more than 10 values shows its 10 most frequent and a "more (N)" button
    (aria-expanded, Enter works) that shows the rest in place and "fewer" that folds them; unfolded, it stays
    so when the search runs again, and a value past the tenth still adds its filter."""
    url, page, field = served[0], browser_page, "gics_sub_industry"
    row = f'#facets .facet[data-field="{field}"]'
    query = {"id": DOC, "relations": {"similar-company": 1.0}, "k": 10}
    want = api_index.search(**query, facets=[field]).facets[field]
    assert len(want) > 11  # the 120 companies' first 100 hits hold many sub-industries

    def shown() -> list[list]:
        return page.eval_on_selector_all(f"{row} .facet-value", "bs => bs.filter(b => b.checkVisibility()).map(b => "
                                         "[JSON.parse(b.dataset.value), Number(b.querySelector('.count').textContent)])")

    def toggle() -> tuple[str, str]:
        return tuple(page.eval_on_selector(f"{row} button.more", "b => [b.textContent, b.getAttribute('aria-expanded')]"))

    _open_with_key(page, url)
    page.goto(f"{url}/?id={DOC}&relation=similar-company:1&k=10&facet={field}&cols=name,{field}")
    page.wait_for_selector(f"{row} .facet-value")
    assert facet_counts(page, field) == want and shown() == want[:10]
    assert toggle() == (f"more ({len(want) - 10})", "false")
    page.click(f"{row} button.more")
    assert shown() == want and toggle() == ("fewer", "true")
    page.screenshot(path=str(artifacts / "explorer-facet-more.png"), full_page=True)
    page.focus(f"{row} button.more")
    page.keyboard.press("Enter")  # the keyboard folds it again
    assert shown() == want[:10] and toggle() == (f"more ({len(want) - 10})", "false")
    page.keyboard.press("Enter")
    assert shown() == want

    before = page.query_selector(f"{row} button.more")
    page.click("#search")  # the same search again: drawn anew, still unfolded
    wait_until(page, lambda: not before.evaluate("b => b.isConnected"), "the facets drawn again")
    page.wait_for_selector(f"{row} button.more")
    assert shown() == want and toggle() == ("fewer", "true")

    at, value = next((i, v) for i, (v, _) in enumerate(want) if i >= 10 and isinstance(v, str))
    page.locator(f"{row} .facet-value").nth(at).click()  # a value past the tenth filters as the first ten do
    narrowed = ids(api_index.search(**query, filters={field: value}))
    wait_until(page, lambda: listed(page, "mixture") == narrowed and [v for v, _ in facet_counts(page, field)] == [value],
               f"the answer filtered on {value}")
    assert not page.query_selector(f"{row} button.more")  # one value: nothing to fold
    assert page.eval_on_selector_all("#filters .filter", "rows => rows.length") == 1
    assert not page.console_errors, page.console_errors


def test_highlighted_terms_are_marked(served, api_index, browser_page, artifacts):
    """Every search asks for highlights; one with a BM25 part (the server's plan says) carries them: each
    <mark> holds one text node, a term of the query; one without (identity) neither marks nor shows the
    server's warning that it has none (the page asked, not the user)."""
    from relsearch.retrieval.highlight import terms

    url = served[0]
    page = browser_page
    query = "oil and gas exploration"
    wanted = terms(query)
    _open_with_key(page, url)
    page.goto(f"{url}/?text={query.replace(' ', '+')}&relation=similar-company:1&k=5")
    page.wait_for_selector("#mixture-hits > li .snippet mark")
    marks = page.eval_on_selector_all("#mixture-hits .snippet mark", "ms => ms.map(m => [m.textContent, "
                                      "m.childNodes.length === 1 && m.firstChild.nodeType === Node.TEXT_NODE])")
    assert marks and all(text.lower() in wanted and only_text for text, only_text in marks), marks
    assert page.eval_on_selector_all("#identity-hits .snippet mark", "ms => ms.length") == 0
    assert not any("highlight" in w for w in page.eval_on_selector_all("#warnings li", "ls => ls.map(l => l.textContent)"))
    page.screenshot(path=str(artifacts / "explorer-highlights.png"), full_page=True)
    # hybrid gives both lists a BM25 part: both mark
    page.goto(f"{url}/?text={query.replace(' ', '+')}&relation=aspect:sector:1&hybrid=rrf&k=5")
    page.wait_for_selector("#identity-hits > li .snippet mark")
    page.wait_for_selector("#mixture-hits > li .snippet mark")
    marks = page.eval_on_selector_all(".snippet mark", "ms => ms.map(m => m.textContent.toLowerCase())")
    assert set(marks) <= wanted
    # what the mixture ran is the answer's word, not the page's: rrf of the dense search and BM25
    ran = api_index.search(query, relations={"aspect:sector": 1.0}, hybrid="rrf", k=5)
    assert ran.mode == "rrf" and page.text_content("#mixture-recipe") == f"runs rrf(dense, bm25) of {ran.recipe.describe()}"
    assert page.eval_on_selector("#mixture-hits", "l => l.dataset.mode") == "rrf"
    assert not page.console_errors, page.console_errors


def test_highlighted_text_stays_text(served, browser_page):
    """A hit's text is data: markup in it, highlighted or not, is shown as written and never runs."""
    url = served[0]
    page = browser_page
    attack = '<img src=x onerror="window.pwned=1"><b>oil</b> 😀 gas'
    tag, oil, gas = attack.index(">") + 1, attack.index("oil"), attack.index("gas")  # code points: gas past the emoji
    spans = [[0, tag], [oil, oil + 3], [gas, gas + 3]]

    def crafted(route):
        answer = route.fetch().json()
        for hit in answer["results"]:
            hit["text"], hit["highlights"] = attack, spans
        route.fulfill(json=answer)

    _open_with_key(page, url)
    page.route("**/search", crafted)
    page.goto(f"{url}/?text=oil+gas&relation=similar-company:1&k=3")
    page.wait_for_selector("#mixture-hits > li .snippet mark")
    snippets = page.eval_on_selector_all("#mixture-hits .snippet", "ps => ps.map(p => [p.textContent, "
                                         "[...p.querySelectorAll('mark')].map(m => m.textContent), p.querySelectorAll('img, b').length])")
    assert snippets == [[attack, [attack[:tag], "oil", "gas"], 0]] * 3
    assert page.evaluate("() => window.pwned") is None
    assert not page.console_errors, page.console_errors


ATTACK_PAGE = """<!doctype html><title></title><script>
(async () => {
  const out = {};
  try {  // what any page may send without a CORS preflight
    await fetch("%(url)s/documents", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
                                      body: JSON.stringify({documents: [{id: "PLANTED", text: "a planted document"}]})});
    out.write = "sent";
  } catch (e) { out.write = String(e); }
  try { out.read = (await (await fetch("%(url)s/health")).text()).length; } catch (e) { out.read = "refused"; }
  document.title = JSON.stringify(out);
})();
</script>"""


def test_a_page_on_another_origin_can_neither_write_nor_read(small_index, tmp_path):
    """Red-team item 2 in a real browser, against a server without a key (the default): a page on
    attacker.test (Chromium maps the name to 127.0.0.1), or on localhost's other port, sends a
    no-cors text/plain POST to /documents (it used to add the document) and tries a read; then the
    attacker's name points at the server itself (DNS rebinding) and the page reads its own origin."""
    import http.server
    import threading
    import urllib.request

    from test_serve import _start

    from relsearch.api import Index
    from relsearch.serve import create_app

    url, server = _start(create_app({"companies": Index(small_index)}, access_log=False))
    port = int(url.rsplit(":", 1)[1])

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (ATTACK_PAGE % {"url": url}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    other = attacker.server_address[1]

    def documents() -> int:
        with urllib.request.urlopen(url + "/health", timeout=30) as response:
            return json.load(response)["indexes"]["companies"]["documents"]

    before = documents()
    try:
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=[*CHROMIUM_ARGS, "--host-resolver-rules=MAP attacker.test 127.0.0.1"])
            page = browser.new_page()
            for origin in (f"http://attacker.test:{other}", f"http://localhost:{other}"):
                page.goto(origin + "/")
                wait_until(page, lambda: page.title(), f"the page on {origin} to finish")
                assert json.loads(page.title()) == {"write": "sent", "read": "refused"}, origin
                assert documents() == before, origin
            page.goto(f"http://attacker.test:{port}/health")  # rebound: the page's own origin, its own name
            assert '"field":"host"' in page.text_content("body") and "documents" not in page.text_content("body")
            browser.close()
    finally:
        attacker.shutdown()
        server.should_exit = True


# ------------------------------------------------------------------------------ why not X
def why_not_cards(page) -> list[dict]:
    """The why-not box's cards: the document's, then the last shown hit's (when it ranks below it)."""
    return page.eval_on_selector_all("#why-not-box .why-not-hit", "cs => cs.map(c => ({id: c.dataset.id, "
                                     "rank: Number(c.dataset.rank), score: Number(c.dataset.score), "
                                     "text: c.querySelector('.head').textContent, parts: Object.fromEntries("
                                     "[...c.querySelectorAll('.seg')].map(s => [s.dataset.part, Number(s.dataset.value)]))}))")


def assert_shows_why_not(page, reason: dict) -> None:
    """The box says what Index.search(why_not=...) says: rank, of, score, the recipe parts; the last shown hit's."""
    recipe = lambda hit: {k: pytest.approx(v, abs=1e-6) for k, v in hit["explain"].items() if k.startswith("recipe:")}  # noqa: E731
    cards = why_not_cards(page)
    assert [c["id"] for c in cards] == [reason["id"], *([reason["cut"]["id"]] if "cut" in reason else [])]
    for card, hit in zip(cards, [reason, reason.get("cut")]):
        assert card["rank"] == hit["rank"] and card["score"] == pytest.approx(hit["score"], abs=1e-6)
        assert f"{hit['score']:.4f}" in card["text"] and card["parts"] == recipe(hit)
    assert f"rank {reason['rank']:,} of {reason['of']:,}" in cards[0]["text"]


def test_why_not_shows_where_a_document_ranks(served, api_index, browser_page, artifacts):
    """Issue 52, 5: why_not=ID in the URL sends `why_not` with the mixture's search; under the hits, the rank and
    score Index.search(why_not=ID) gives, its parts beside the last shown hit's and the parts it trails most on
    (as the CLI's table says them). The query's own document cannot be returned; an unknown id is named next to
    the field; one typed in the field (completed as the id box is) goes into the URL, which reproduces it."""
    url, page = served[0], browser_page
    query = {"id": DOC, "relations": {"similar-company": 1.0}, "k": 5}
    target = api_index.search(**{**query, "k": 30})[19].id
    reason = api_index.search(**query, why_not=target).why_not
    assert reason["rank"] > 5 and reason["cut"]["rank"] == 5
    _open_with_key(page, url)
    page.goto(f"{url}/?id={DOC}&relation=similar-company:1&k=5&why_not={target}")
    page.wait_for_selector("#why-not-box .why-not-hit")
    assert page.input_value("#why-not") == target and listed(page, "mixture")[-1] == reason["cut"]["id"]
    assert_shows_why_not(page, reason)
    gaps = sorted(((reason["cut"]["explain"].get(k, 0.0) - v, k) for k, v in reason["explain"].items()
                   if k.startswith(("recipe:", "mixture:"))), reverse=True)
    behind = [k for gap, k in gaps if gap > 0][:3]
    assert page.eval_on_selector_all(".why-not-behind .gap", "gs => gs.map(g => g.dataset.part)") == behind and behind
    page.screenshot(path=str(artifacts / "explorer-why-not.png"), full_page=True)

    # the query's own document: no rank
    page.fill("#why-not", DOC)
    page.click("#search")
    wait_until(page, lambda: "not among the" in (page.text_content("#why-not-box") or ""), "no rank for the query's own")
    own = api_index.search(**query, why_not=DOC).why_not
    assert own["rank"] is None and f"not among the {own['of']:,} hits this query can return" in page.text_content("#why-not-box")
    assert f"why_not={DOC}" in page.url

    # an unknown id: the server's 422 next to the field, no box
    page.fill("#why-not", "NOSUCH")
    page.click("#search")
    wait_until(page, lambda: page.text_content('.error[data-for="why_not"]'), "the error next to the why-not field")
    assert "unknown document id 'NOSUCH'" in page.text_content('.error[data-for="why_not"]')
    assert page.is_hidden("#why-not-box") and "why_not=NOSUCH" in page.url

    # typed (completed as the id box is), searched, kept in the URL: the URL alone shows the same box
    page.fill("#why-not", "appl")
    wait_until(page, lambda: "AAPL" in page.eval_on_selector_all("#id-options option", "os => os.map(o => o.value)"),
               "the completion of 'appl'")
    page.fill("#why-not", "AAPL")
    page.click("#search")
    apple = api_index.search(**query, why_not="AAPL").why_not
    wait_until(page, lambda: [c["id"] for c in why_not_cards(page)][:1] == ["AAPL"], "AAPL's rank")
    assert_shows_why_not(page, apple)
    assert page.text_content('.error[data-for="why_not"]') == "" and "why_not=AAPL" in page.url
    page.goto(page.url)
    wait_until(page, lambda: [c["id"] for c in why_not_cards(page)][:1] == ["AAPL"], "AAPL's rank from the URL")
    assert_shows_why_not(page, apple)
    # only Chromium's own note of the refused request (NOSUCH's 422): the page itself logged nothing
    assert [e for e in page.console_errors if "status of 422" not in e] == [] and len(page.console_errors) == 1


# ------------------------------------------------------------------------------ the anchor, the next query, a download
@pytest.fixture(scope="module")
def sp500_served(tmp_path_factory):
    """`relsearch serve` on all 500 demo companies (what `make demo` indexes); yields (url, index dir)."""
    from conftest import DEMO_CORPUS

    from relsearch.pipelines.index import IndexJob, run_index

    index = tmp_path_factory.mktemp("sp500") / "demo-index"
    assert run_index(IndexJob(input=str(DEMO_CORPUS), index=str(index), progress=False)).indexed == 500
    with serving(index, tmp_path_factory.mktemp("key")) as url:
        yield url, index


def downloaded(page, selector: str):
    """Click the download link ``selector``: (the file name the page gave it, its text)."""
    with page.expect_download() as info:
        page.click(selector)
    return info.value.suggested_filename, Path(info.value.path()).read_text(encoding="utf-8")


def next_queries(page, which: str = "mixture") -> list[tuple[str, dict]]:
    """Each hit's id and the query string of its "→ query" link."""
    from urllib.parse import parse_qs, urlsplit

    links = page.eval_on_selector_all(f"#{which}-hits > li", "items => items.map(li => "
                                      "[li.dataset.id, li.querySelector('a.next-query').getAttribute('href')])")
    return [(hit, parse_qs(urlsplit(href).query)) for hit, href in links]


def test_the_anchor_card_next_queries_and_the_answer_as_a_file(sp500_served, tmp_path, artifacts):
    """Issue 52, 1-3: /?id=JPM&relation=similar-company:1&k=5 shows JPM's own text above its 5 hits, each
    hit links to the same search from it (Back returns), and the answer downloads as CSV and JSONL with the
    page's hits, nothing leaving the machine."""
    import csv
    import io

    from conftest import DEMO_CORPUS

    url, index = sp500_served
    jpm = next(json.loads(line) for line in DEMO_CORPUS.read_text().splitlines() if '"id": "JPM"' in line)
    with browsing(url, tmp_path) as page:
        _open_with_key(page, url)
        page.goto(f"{url}/?id=JPM&relation=similar-company:1&k=5")
        page.wait_for_selector("#mixture-hits > li")
        mixture = cli(index, "--id", "JPM", "-r", "similar-company", "-k", "5")
        assert listed(page, "mixture") == [h["id"] for h in mixture] and len(mixture) == 5
        # 1. the anchor card: name, id, its own text, its fields folded
        assert page.text_content("#anchor .anchor-name") == jpm["name"] == "JPMorgan Chase & Co."
        assert page.text_content("#anchor .anchor-id") == "JPM"
        assert page.text_content("#anchor .anchor-text") == jpm["text"]
        assert page.eval_on_selector("#anchor details.anchor-fields", "d => d.open") is False
        assert "gics_sector" in page.text_content("#anchor details.anchor-fields dl")
        page.screenshot(path=str(artifacts / "explorer-anchor-jpm.png"), full_page=True)
        # 2. a next query on each hit: the same relation and k, the hit as the stored document
        links = next_queries(page)
        assert [hit for hit, _ in links] == [h["id"] for h in mixture]
        assert all((q["id"], q["relation"], q["k"]) == ([hit], ["similar-company:1"], ["5"]) and "filter" not in q
                   for hit, q in links), links
        # 3. the answer as files: the page's hits, in its order, as the API writes them
        name, text = downloaded(page, "#download-csv")
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
        assert name == "relsearch-answer.csv" and [r["id"] for r in rows] == listed(page, "mixture")
        assert {r["query"] for r in rows} == {"JPM"} and [r["rank"] for r in rows] == ["1", "2", "3", "4", "5"]
        assert [r["name"] for r in rows] == [h["metadata"]["name"] for h in mixture]
        name, text = downloaded(page, "#download-jsonl")
        lines = [json.loads(line) for line in text.splitlines()]
        assert name == "relsearch-answer.jsonl" and [line["id"] for line in lines] == listed(page, "mixture")

        first = mixture[0]["id"]
        page.click(f'#mixture-hits > li[data-id="{first}"] a.next-query')
        onward = cli(index, "--id", first, "-r", "similar-company", "-k", "5")
        wait_until(page, lambda: listed(page, "mixture") == [h["id"] for h in onward], f"the search from {first}")
        assert f"id={first}" in page.url and page.text_content("#anchor .anchor-id") == first
        page.go_back()  # the browser's Back: JPM's answer again
        wait_until(page, lambda: listed(page, "mixture") == [h["id"] for h in mixture], "JPM's answer after Back")
        assert "id=JPM" in page.url and page.text_content("#anchor .anchor-id") == "JPM"

        # filters travel with the next query too, and a text query's card is its text
        page.goto(f"{url}/?id=JPM&relation=similar-company:1&filter=gics_sector%3DFinancials&k=5")
        page.wait_for_selector("#mixture-hits > li")
        assert all(q["filter"] == ["gics_sector=Financials"] and q["relation"] == ["similar-company:1"]
                   for _, q in next_queries(page) + next_queries(page, "identity"))
        page.goto(f"{url}/?text=investment+banking&k=3")
        page.wait_for_selector("#mixture-hits > li")
        assert page.text_content("#anchor .anchor-text") == "investment banking"
        assert not page.console_errors, page.console_errors
