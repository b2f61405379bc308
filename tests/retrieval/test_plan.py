"""One request, one meaning (retrieval/plan.py) on the shipped pack and the small real index: every
shipped relation means the same in a mixture, with hybrid, in `score` and in `query`; what cannot
contribute says so."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.retrieval.plan import PlanError, combine, relation_recipe, resolve
from relsearch.retrieval.recipe import Recipe
from relsearch.retrieval.request import SearchOptions, plan, run
from relsearch.retrieval.pair import score_pair
from relsearch.retrieval.search import Example, Query, QueryError, Searcher

SHIPPED = ("similar-company", "duplicate-question", "qa-entailment", "same-caption", "contradiction")


@pytest.fixture(scope="module")
def searcher(small_index):
    return Searcher(str(small_index))


def _ids(rows):
    return [[h.id for h in row] for row in rows]


@pytest.mark.parametrize("relation", SHIPPED)
def test_score_is_what_query_runs(searcher, relation):
    """`relsearch score A B` for relation R equals the query's score of hit B (dense mode) or the
    ``dense`` part its recipe normalises (recipe mode)."""
    text = "bank holding company offering loans and deposits"
    hits = run(searcher, [Query(text=text, relations={relation: 1.0})], SearchOptions(k=3, explain=True))[0]
    scores = score_pair(searcher.bundle, searcher.encoder, text, hits[0].text)
    mode = plan(searcher, [Query(text=text, relations={relation: 1.0})], SearchOptions()).scorings[0].mode
    want = hits[0].explain["dense"] if mode == "recipe" else hits[0].score
    assert scores[relation] == pytest.approx(want, abs=2e-3)  # the hit's text re-encoded: bf16 noise at most
    recipe = relation_recipe(searcher.operators, relation)
    assert any(w.startswith(f"{relation}:") for w in scores.warnings) == bool(recipe.bm25 or any(recipe.same.values()))


def test_the_cli_docs_mixture_is_not_plain_cosine_and_explains_its_parts(searcher):
    """The mixture docs/cli.md shows first (similar-company 0.7, identity 0.3)."""
    query = [Query(doc_id="BAC", relations={"similar-company": 0.7, "identity": 0.3})]
    mixed = run(searcher, query, SearchOptions(k=5, explain=True))[0]
    plain = run(searcher, [Query(doc_id="BAC")], SearchOptions(k=5))[0]
    assert [h.id for h in mixed] != [h.id for h in plain] or \
        [h.score for h in mixed] != pytest.approx([h.score for h in plain])
    for hit in mixed:
        parts = {k: v for k, v in hit.explain.items() if k.startswith("recipe:")}
        assert parts and sum(parts.values()) == pytest.approx(hit.score, abs=1e-5)
    # hybrid with a relation whose recipe already fuses BM25: refused over every interface, with why
    out = CliRunner().invoke(cli, ["query", "--id", "BAC", "--index", str(searcher.files.root.parent.parent),
                                   "--relation", "similar-company", "--hybrid"])
    assert out.exit_code != 0 and "already fuse BM25" in out.output


def test_combine_reduces_to_the_vector_mixture_without_recipes():
    plain = {"a": Recipe(mixture={"a": 1.0}), "b": Recipe(mixture={"b": 1.0})}
    assert combine(plain, {"a": 0.7, "b": -0.3}) == Recipe(mixture={"a": 0.7, "b": -0.3})
    fused = {"a": Recipe(mixture={"a": 0.5, "identity": 0.5}, bm25=0.4, same={"f": 0.2}),
             "identity": Recipe(mixture={"identity": 1.0})}
    got = combine(fused, {"a": 3.0, "identity": 1.0})
    assert got.mixture == {"a": 1.5, "identity": 2.5}
    assert got.bm25 == pytest.approx(0.3) and got.same == {"f": pytest.approx(0.15)}


def test_refusals_and_warnings_name_the_relation(searcher):
    ops = searcher.operators
    with pytest.raises(PlanError, match="positive weights"):
        resolve(ops, {"similar-company": 1.0, "identity": -0.5})
    with pytest.raises(PlanError, match="already fuse BM25"):
        resolve(ops, {"duplicate-question": 1.0}, hybrid="weighted")
    zero = resolve(ops, {"identity": 1.0, "contradiction": 0.0})
    assert any("'contradiction' has weight 0" in w for w in zero.warnings)
    text = resolve(ops, {"similar-company": 1.0}, metadata_fields=searcher.metadata_fields, text_query=True)
    assert text.mode == "recipe" and any("similar-company" in w for w in text.warnings)
    fields = searcher.metadata_fields + ["gics_sub_industry_code", "gics_industry_code"]
    text = resolve(ops, {"similar-company": 1.0}, metadata_fields=fields, text_query=True)
    assert [w for w in text.warnings if "do not apply to a text query" in w]
    assert not resolve(ops, {"similar-company": 1.0}, metadata_fields=fields).warnings
    with pytest.raises(KeyError, match="nosuch"):
        resolve(ops, {"nosuch": 1.0})


def test_score_and_query_warnings_reach_the_cli(searcher, small_index):
    out = CliRunner().invoke(cli, ["score", "cloud software", "enterprise software company", "--json"])
    assert out.exit_code == 0 and "warning: similar-company: the score is its recipe's dense part" in out.output
    scores = json.loads(out.output.splitlines()[-1])
    assert set(SHIPPED) <= set(scores) and all(np.isfinite(list(scores.values())))
    query = CliRunner().invoke(cli, ["query", "cloud software", "--index", str(small_index), "--relation",
                                     "similar-company", "-k", "2"])
    # a text query has no document to share the recipe's GICS codes with: the bonuses say they do not apply
    assert query.exit_code == 0 and "bonuses for sharing gics_sub_industry_code" in query.output
    assert "recipe: the dense and BM25 scores" in query.output  # the scale of the score column, said once


@pytest.mark.parametrize("relation", SHIPPED)
def test_every_shipped_relation_ranks_alike_whatever_k_and_pages_tile(searcher, relation):
    """Issue: `recipe.search` normalised over max(depth, k) candidates, so the top 5 moved with -k."""
    queries = [Query(doc_id="BAC", relations={relation: 1.0}), Query(text="oil and gas exploration",
                                                                     relations={relation: 1.0})]
    full = _ids(run(searcher, queries, SearchOptions(k=120)))  # the --id query's own document never comes back
    assert [len(row) for row in full] == [119, 120]
    for k in (5, 30):
        assert _ids(run(searcher, queries, SearchOptions(k=k))) == [row[:k] for row in full]
    pages = [_ids(run(searcher, queries, SearchOptions(k=10, offset=o))) for o in range(0, 120, 10)]
    assert [sum((p[i] for p in pages), []) for i in range(2)] == full


@pytest.mark.parametrize("query, filters, message", [
    (Query(text="   ", relations={"similar-company": 1.0}), {}, "query text is empty"),
    (Query(text="caf\udce9 bank"), {}, "query text is not valid UTF-8"),
    (Query(doc_id="caf\udce9"), {}, "query document id is not valid UTF-8"),
    (Query(text="bank"), {"colour": "red"}, "unknown filter field 'colour'"),
    (Query(like=(Example(text=" "),)), {}, "an example text is empty"),
])
def test_the_plan_refuses_what_a_search_refuses_with_the_same_words(searcher, query, filters, message):
    with pytest.raises(QueryError, match=message):
        plan(searcher, [query], SearchOptions(filters=filters))
    with pytest.raises(QueryError, match=message):  # a direct search checks its queries as the plan does
        searcher.search([query], filters=filters)


def test_a_plans_run_checks_nothing_again(searcher, monkeypatch):
    """Queries and filters are checked once, before plan() returns; its run (dense, recipe, examples,
    why-not) never checks them again, so it crosses no validation code."""
    calls = []
    for name in ("check", "check_queries"):
        checker = getattr(Searcher, name)
        monkeypatch.setattr(Searcher, name, lambda self, *a, _c=checker, _n=name, **k: (calls.append(_n), _c(self, *a, **k))[1])
    queries = [Query(text="bank holding company", relations={"similar-company": 1.0}),
               Query(doc_id=searcher.files.docstore.get([0])[0]["id"], relations={"identity": 1.0}),
               Query(like=(Example(text="oil and gas"), Example(text="pipelines")))]
    first = queries[1].doc_id
    planned = plan(searcher, queries, SearchOptions(k=3, filters={"gics_sector": {"not": {"eq": "x"}}}, why_not=first))
    assert calls.count("check_queries") == 1
    calls.clear()
    assert all(len(hits) == 3 for hits in planned.run()) and planned.why_not(0, 3)["id"] == first and calls == []
