"""Paging and shaping: --offset, --min-score, --collapse (retrieval/paging.py), in the CLI and the API."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from relsearch.retrieval.paging import collapse, page, search_collapsed


@dataclass(frozen=True)
class FakeHit:
    id: str
    score: float
    metadata: dict


RANKED = [FakeHit(f"h{i}", 1.0 - i / 100, {"g": i // 3} if i % 5 else {}) for i in range(60)]


def test_collapse_keeps_the_best_hit_per_typed_value():
    hits = [FakeHit("a", 0.9, {"g": 1}), FakeHit("b", 0.8, {"g": True}), FakeHit("c", 0.7, {"g": 1.0}),
            FakeHit("d", 0.6, {}), FakeHit("e", 0.5, {}), FakeHit("f", 0.4, {"g": [1, 2]}),
            FakeHit("g", 0.3, {"g": [1, 2]})]
    # true is not 1, 1.0 is 1 (as filters match); hits without the field are groups of their own
    assert [h.id for h in collapse(hits, "g")] == ["a", "b", "d", "e", "f"]


def test_blank_collapse_values_are_groups_of_their_own():
    """The Russell corpus has companies whose name is "": they are not one issuer (--collapse-field
    name). Null stays a value (the demo's hq_location is null for 28 companies: one group)."""
    hits = [FakeHit("a", 0.9, {"g": ""}), FakeHit("b", 0.8, {"g": " "}), FakeHit("c", 0.7, {"g": None}),
            FakeHit("d", 0.6, {"g": None}), FakeHit("e", 0.5, {"g": "x"}), FakeHit("f", 0.4, {"g": "x"})]
    assert [h.id for h in collapse(hits, "g")] == ["a", "b", "c", "e"]
    assert [h.id for h in collapse(hits, "g", taken=["", None])] == ["a", "b", "e"]


def test_search_collapsed_widens_until_the_page_is_full():
    calls = []

    def run(fetch):
        calls.append(fetch)
        return [RANKED[:fetch]]

    out = search_collapsed(run, need=15, field="g", limit=60)[0]
    assert len(out) >= 15 and out == collapse(RANKED[:calls[-1]], "g")
    assert calls == [15, 60]
    assert search_collapsed(run, need=5, field=None, limit=60)[0] == RANKED[:5]
    # fewer groups than needed: stops at the limit with what there is
    few = [FakeHit(f"x{i}", 1 - i / 10, {"g": i % 2}) for i in range(8)]
    assert [h.id for h in search_collapsed(lambda f: [few[:f]], need=5, field="g", limit=8)[0]] == ["x0", "x1"]


def test_page_slices_then_drops_low_scores():
    assert [h.id for h in page(RANKED, offset=2, k=3)] == ["h2", "h3", "h4"]
    assert [h.id for h in page(RANKED, offset=2, k=3, min_score=0.975)] == ["h2"]


@pytest.fixture(scope="module")
def index(small_index):
    import relsearch

    return relsearch.open_index(small_index)


def test_api_pages_concatenate_and_collapse_gives_distinct_values(index):
    whole = index.search("cloud software", k=12)
    pages = index.search("cloud software", k=6) + index.search("cloud software", k=6, offset=6)
    assert [h.id for h in pages] == [h.id for h in whole]
    one_each = index.search("cloud software", k=5, collapse="gics_sector")
    sectors = [h.metadata["gics_sector"] for h in one_each]
    assert len(one_each) == 5 and len(set(sectors)) == 5 and one_each[0].id == whole[0].id
    everything = index.search("cloud software", k=120)
    assert [h.id for h in one_each] == [h.id for h in collapse(everything, "gics_sector")[:5]]
    floor = whole[3].score
    assert [h.id for h in index.search("cloud software", k=12, min_score=floor)] == [h.id for h in whole[:4]]
    from relsearch.api import RequestError

    with pytest.raises(RequestError, match="unknown collapse field 'colour'"):
        index.search("x", collapse="colour")


def test_a_collapsed_answer_never_lists_the_query_documents_own_group(index):
    """GOOG's peers collapsed on a company field list no GOOGL: the query document's value (and a liked
    example's) is taken before the first hit, as `relsearch lookup --collapse` does."""
    sector = next(h for h in index.search(id="C", k=120) if h.id == "BAC").metadata["gics_sector"]
    peers = index.search(id="BAC", k=5, collapse="gics_sector")
    assert sector not in {h.metadata["gics_sector"] for h in peers} and len(peers) == 5
    liked = index.search(like=[{"id": "BAC"}], k=5, collapse="gics_sector")
    assert sector not in {h.metadata["gics_sector"] for h in liked}
    assert [h.id for h in collapse([*peers], "gics_sector", [sector])] == [h.id for h in peers]


def test_cli_offset_collapse_and_an_empty_filter(small_index):
    from relsearch.cli import cli

    def query(*args):
        result = CliRunner().invoke(cli, ["query", "cloud software", "--index", str(small_index), "--json", *args])
        return result, [json.loads(line) for line in result.stdout.splitlines()]

    _, whole = query("-k", "8")
    result, second = query("-k", "4", "--offset", "4")
    assert result.exit_code == 0 and [h["rank"] for h in second] == [5, 6, 7, 8]
    assert [h["id"] for h in second] == [h["id"] for h in whole[4:]]
    _, collapsed = query("-k", "4", "--collapse", "gics_sector", "--min-score", "-1")
    assert len({h["metadata"]["gics_sector"] for h in collapsed}) == 4
    result, none = query("--filter", "gics_sector=No such sector")
    assert result.exit_code == 0 and none == [] and "no document matches the filter" in result.stderr
    result, ranged = query("--filter", "gics_sector in [Energy,Utilities]", "--filter", "not gics_sector=Energy")
    assert ranged and {h["metadata"]["gics_sector"] for h in ranged} == {"Utilities"}
    result, _ = query("--collapse", "colour")
    assert result.exit_code != 0 and "--collapse: unknown collapse field 'colour'" in result.stderr


def test_collapse_widening_is_bounded_and_stops_when_asked():
    """A field with one value never fills the page: the search widens to collapse_depth(need)
    candidates, not to the whole index (50k documents took 5.3 s per query); and ``stop()`` ends
    it between rounds (the server's timeout)."""
    from relsearch.retrieval.paging import MAX_COLLAPSE_CANDIDATES, SearchStopped, collapse_depth

    one_value = [FakeHit(f"h{i}", 1.0 - i / 1e6, {"g": "same"}) for i in range(50_000)]
    calls = []

    def run(fetch):
        calls.append(fetch)
        return [one_value[:fetch]]

    out = search_collapsed(run, need=10, field="g", limit=50_000)[0]
    assert [h.id for h in out] == ["h0"] and calls == [10, 40, 160, 640] and collapse_depth(10) == 640
    calls.clear()
    search_collapsed(run, need=1000, field="g", limit=50_000)
    assert calls[-1] == MAX_COLLAPSE_CANDIDATES == 10_000  # never past 10,000 (rerank's depth bound too)
    calls.clear()
    asked = []
    with pytest.raises(SearchStopped):
        search_collapsed(run, need=10, field="g", limit=50_000, stop=lambda: asked.append(1) or len(asked) > 1)
    assert calls == [10]  # the first round ran, the second was never started
