"""Examples as a query (retrieval/search.py ``Query.like`` / ``unlike``): several likes rank what is
near all of them first, an unlike pushes its neighbours down, the examples never come back — on
every mode of the plan and through the CLI and the Python API."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from relsearch.api import RequestError, open_index
from relsearch.cli import cli
from relsearch.encoder.relations import normalize
from relsearch.retrieval.request import SearchOptions, run
from relsearch.retrieval.search import Example, Query, Searcher


@pytest.fixture(scope="module")
def searcher(small_index):
    return Searcher(str(small_index))


def _unit(searcher, ids):
    positions = searcher.files.docstore.positions(ids)
    return np.asarray(searcher.files.vectors[[positions[i] for i in ids]], np.float32)


def _ids(rows):
    return [[h.id for h in row] for row in rows]


def test_several_likes_rank_what_is_near_all_of_them_first(searcher):
    """Under identity, q = Σ normalize(h_e): a hit's score is the sum of its cosines to the examples."""
    likes = ("ADBE", "AAPL")
    hits = run(searcher, [Query(like=tuple(Example(doc_id=i) for i in likes))], SearchOptions(k=5))[0]
    every = np.asarray(searcher.files.vectors[:searcher.files.positions], np.float32)
    summed = every @ _unit(searcher, list(likes)).sum(axis=0)
    positions = searcher.files.docstore.positions([h.id for h in hits])
    np.testing.assert_allclose([h.score for h in hits], [summed[positions[h.id]] for h in hits], atol=1e-4)
    np.testing.assert_allclose([h.score for h in hits], np.sort(summed)[::-1][2:7], atol=1e-4)  # the best, likes aside


def test_an_unlike_pushes_its_neighbours_down_and_examples_never_come_back(searcher):
    alone = run(searcher, [Query(like=(Example(doc_id="BAC"),))], SearchOptions(k=119))[0]
    pushed = run(searcher, [Query(like=(Example(doc_id="BAC"),), unlike=(Example(doc_id="C", weight=0.8),))],
                 SearchOptions(k=119))[0]
    assert not {"BAC", "C"} & {h.id for h in pushed} and len(pushed) == 118
    near_c = run(searcher, [Query(doc_id="C")], SearchOptions(k=3))[0]
    moved = [h.id for h in near_c if h.id != "BAC"][:2]
    rank = {name: [h.id for h in hits].index for name, hits in (("alone", alone), ("pushed", pushed))}
    assert all(rank["pushed"](i) > rank["alone"](i) for i in moved)


@pytest.mark.parametrize("options", [dict(), dict(hybrid="rrf"), dict(hybrid="weighted"), dict(explain=True)])
def test_examples_run_through_every_mode_of_the_plan(searcher, options):
    query = Query(like=(Example(doc_id="BAC"), Example(text="a regional bank for consumers")),
                  unlike=(Example(doc_id="CMA"),))
    for relations in ({"identity": 1.0}, {"similar-company": 1.0}, {"similar-company": 0.5, "identity": 0.5}):
        if options.get("hybrid") and relations != {"identity": 1.0}:
            continue  # similar-company's recipe fuses BM25 already: refused with hybrid (test_plan.py)
        q = Query(like=query.like, unlike=query.unlike, relations=relations)
        hits = run(searcher, [q], SearchOptions(k=10, **options))[0]
        assert len(hits) == 10 and not {"BAC", "CMA"} & {h.id for h in hits}
        for hit in hits if options.get("explain") else ():
            parts = {k: v for k, v in hit.explain.items() if k.startswith(("recipe:", "mixture:"))}
            if parts:
                assert sum(parts.values()) == pytest.approx(hit.score, abs=1e-5)


def test_each_example_is_moved_by_the_relation_before_they_combine(searcher):
    op = searcher.operators["similar-company"]
    like = (Example(doc_id="ADBE", weight=2.0), Example(doc_id="AAPL"))
    qv = searcher.query_vectors([Query(like=like, relations={"similar-company": 1.0})]).q[0]
    h = searcher.raw_vectors([Query(doc_id="ADBE"), Query(doc_id="AAPL")])
    moved = normalize(op.apply(h, None)) if op.kind != "identity" else normalize(h)
    np.testing.assert_allclose(qv, 2.0 * moved[0] + moved[1], atol=1e-5)


def test_the_cli_and_the_api_take_examples_and_name_what_is_wrong(small_index):
    out = CliRunner().invoke(cli, ["query", "--index", str(small_index), "--like", "BAC", "--like", "C=0.5",
                                   "--unlike", "CMA", "--like-text", "consumer banking", "-k", "4", "--json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert len(rows) == 4 and not {"BAC", "C", "CMA"} & {r["id"] for r in rows}
    index = open_index(small_index)
    api = index.search(like=[{"id": "BAC"}, {"id": "C", "weight": 0.5}, {"text": "consumer banking"}],
                       unlike=[{"id": "CMA"}], k=4)
    assert [h.id for h in api] == [r["id"] for r in rows]
    for kwargs, field, message in [
            (dict(like=[{"id": "NOPE"}]), "like", "not in the index"),
            (dict(text="x", like=[{"id": "BAC"}]), "like", "no text or doc_id of its own"),
            (dict(unlike=[{"id": "BAC"}]), "like", "at least one like"),
            (dict(like=[{"id": "BAC", "weight": -1}]), "like", "weights must be numbers in (0"),
            (dict(like=[{"name": "BAC"}]), "like", "each like example is"),
            (dict(like="BAC"), "like", "must be a list")]:
        with pytest.raises(RequestError, match=message.replace("(", r"\(")) as caught:
            index.search(**kwargs)
        assert caught.value.field == field
    bad = CliRunner().invoke(cli, ["query", "x", "--index", str(small_index), "--like", "BAC"])
    assert bad.exit_code != 0 and "exactly one of TEXT, --id, --like examples or --queries" in bad.output


def test_an_unlike_without_a_weight_weighs_half_on_every_interface(small_index, searcher):
    """docs/how-a-query-runs.md: one unlike at 1 emptied the sector; unweighted, it weighs 0.5."""
    from relsearch.serve.models import SearchBody

    half = run(searcher, [Query(like=(Example(doc_id="BAC"),), unlike=(Example(doc_id="C", weight=0.5),))],
               SearchOptions(k=5))[0]
    whole = run(searcher, [Query(like=(Example(doc_id="BAC"),), unlike=(Example(doc_id="C", weight=1.0),))],
                SearchOptions(k=5))[0]
    assert [(h.id, h.score) for h in half] != [(h.id, h.score) for h in whole]
    index = open_index(small_index)
    api = index.search(like=[{"id": "BAC"}], unlike=[{"id": "C"}], k=5)
    assert [(h.id, round(h.score, 5)) for h in api] == [(h.id, round(h.score, 5)) for h in half]
    out = CliRunner().invoke(cli, ["query", "--index", str(small_index), "--like", "BAC", "--unlike", "C", "-k", "5", "--json"])
    assert out.exit_code == 0, out.output
    assert [json.loads(line)["id"] for line in out.output.splitlines() if line.startswith("{")] == [h.id for h in half]
    body = SearchBody.model_validate({"like": [{"id": "BAC"}], "unlike": [{"id": "C"}]})
    assert body.unlike[0].weight is None and body.like[0].weight is None  # the API layer fills in the default
