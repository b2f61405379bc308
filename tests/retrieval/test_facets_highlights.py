"""Facet counts over a query's candidates and highlights of its BM25 terms (retrieval/request.py,
retrieval/highlight.py), through the plan, the CLI and the Python API."""
import json
from collections import Counter

import pytest
from click.testing import CliRunner

from relsearch.api import RequestError, open_index
from relsearch.cli import cli
from relsearch.retrieval.highlight import offsets, terms
from relsearch.retrieval.request import NO_HIGHLIGHTS, SearchOptions, plan
from relsearch.retrieval.search import Query, Searcher


@pytest.fixture(scope="module")
def searcher(small_index):
    return Searcher(str(small_index))


def test_facets_count_the_values_of_the_first_hits_under_the_filters(searcher):
    options = SearchOptions(k=3, facets=("gics_sector", "founded"), facet_depth=40,
                            filters={"gics_sector": {"in": ["Financials", "Energy"]}})
    query = [Query(text="banks and oil companies")]
    counts = plan(searcher, query, options).facets()[0]
    top = plan(searcher, query, SearchOptions(k=40, filters=options.filters)).run()[0]
    want = Counter(h.metadata["gics_sector"] for h in top if "gics_sector" in h.metadata)
    assert counts["gics_sector"] == sorted([[v, n] for v, n in want.items()], key=lambda vn: (-vn[1], json.dumps(vn[0])))
    assert {v for v, _ in counts["gics_sector"]} <= {"Financials", "Energy", None}
    assert sum(n for _, n in counts["founded"]) <= 40


def test_highlights_mark_the_query_terms_a_hit_matched(searcher):
    assert terms("The Oil and GAS companies") == {"oil", "gas", "companies"}  # stop words and case as BM25 has them
    text = "Oilfield services; oil, gas and Gas-fired power."
    assert [text[a:b] for a, b in offsets(text, terms("oil gas"))] == ["oil", "gas", "Gas"]
    query = [Query(text="natural gas pipelines", relations={"contradiction": 1.0})]
    lit = plan(searcher, query, SearchOptions(k=5, hybrid="rrf", highlight=True)).run()[0]
    assert all(h.highlights is not None for h in lit) and any(h.highlights for h in lit)
    for hit in lit:
        assert all(hit.text[a:b].lower() in {"natural", "gas", "pipelines"} for a, b in hit.highlights)
    dense = plan(searcher, query, SearchOptions(k=5, highlight=True))
    assert NO_HIGHLIGHTS in dense.warnings and all(h.highlights is None for h in dense.run()[0])


def test_the_cli_and_the_api_give_facets_and_highlights(small_index):
    out = CliRunner().invoke(cli, ["query", "natural gas pipelines", "--index", str(small_index), "--json", "-k", "3",
                                   "--facet", "gics_sector", "--hybrid", "--highlight"])
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.output.splitlines()]
    assert len(lines) == 4 and set(lines[-1]) == {"facets"} and all("highlights" in h for h in lines[:3])
    index = open_index(small_index)
    hits = index.search("natural gas pipelines", k=3, facets=["gics_sector"], hybrid="rrf", highlight=True)
    assert hits.facets == lines[-1]["facets"] and [h.highlights for h in hits] == [h["highlights"] for h in lines[:3]]
    table = CliRunner().invoke(cli, ["query", "natural gas pipelines", "--index", str(small_index), "-k", "3",
                                     "--facet", "gics_sector", "--hybrid", "--highlight"])
    assert "facet gics_sector: " in table.output and "[gas]" in table.output.lower()
    with pytest.raises(RequestError, match="unknown field 'colour'") as caught:
        index.search("x", facets=["colour"])
    assert caught.value.field == "facets"
    with pytest.raises(RequestError, match="facet_depth must be between"):
        index.search("x", facets=["gics_sector"], facet_depth=0)



def test_the_table_shows_a_long_facets_ten_most_frequent_values(small_index):
    """issue 52 item 6: as the page folds a long facet under "more", the table shows its first 10."""
    from relsearch.api import open_index

    every = open_index(small_index).search(id="MMM", k=5, facets=["gics_sub_industry"]).facets["gics_sub_industry"]
    assert len(every) > 10
    out = CliRunner().invoke(cli, ["query", "--index", str(small_index), "--id", "MMM", "-k", "5",
                                   "--facet", "gics_sub_industry"])
    line = next(line for line in out.output.splitlines() if line.startswith("facet gics_sub_industry: "))
    assert line.endswith(f", … {len(every) - 10} more (--json lists them all)")
    assert f"{every[9][0]} {every[9][1]}," in line and f"{every[10][0]} {every[10][1]}" not in line


def test_a_long_texts_highlights_are_bounded():
    """Issue 50, F-1: highlighting scans at most MAX_ANALYZED characters and keeps MAX_HIGHLIGHTS offsets."""
    from relsearch.retrieval import highlight

    text = "gas pipeline " * 200_000  # 2.6 million characters, 200,000 matches of "gas"
    found = offsets(text, terms("natural gas"))
    assert len(found) == highlight.MAX_HIGHLIGHTS and found[:2] == [[0, 3], [13, 16]]
    late = "x " * highlight.MAX_ANALYZED + "gas"
    assert offsets(late, terms("gas")) == []  # past the analysed prefix
