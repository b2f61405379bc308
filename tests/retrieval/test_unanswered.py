"""A recipe's unanswered part (retrieval/parts.py, retrieval/prior.py): a bonus for a candidate that
training never gave as an answer of the relation. The index ranks as the whole table scores and
explains it, dev chooses it only when it helps, and it needs the relation's every answer stored."""
from dataclasses import replace

import numpy as np
import pytest

from relsearch.encoder.bundle import Bundle
from relsearch.encoder.relations import Operator
from relsearch.retrieval import prior
from relsearch.retrieval.recipe import Recipe, choose, score_matrix
from relsearch.retrieval.recipe_fit import keep_table
from relsearch.retrieval.request import SearchOptions, run
from relsearch.retrieval.search import Query, QueryError, Searcher

from synthetic_index import encoder_identity
from test_recipe import N, RECIPE, _with_prior, explained, indexed, whole_table  # noqa: F401 (indexed: a fixture)


def test_the_index_ranks_as_the_whole_table_scores_and_a_cut_table_is_refused(indexed, tmp_path):  # noqa: F811
    searcher, docs, raw = indexed
    recipe = replace(RECIPE, unanswered={"rel": 0.5}, depth=20)
    heads = [0, 42]
    dense, lexical, tables, exclude = whole_table(searcher, docs, raw, heads)
    without = score_matrix(replace(recipe, unanswered={}), dense, lexical, tables, exclude)
    top = [int(j) for j in np.argsort(-np.where(exclude[0], -np.inf, without[0]))[:6]]
    other = _with_prior(searcher, tmp_path, recipe, [docs[j]["text"] for j in top[:5]])  # training answered five
    values = prior.unanswered(other.operators["rel"], [d["text"] for d in docs])
    assert values[top[:5]].sum() == 0 and values[top[5]] == 1 and values.sum() == N - 5
    expected = score_matrix(recipe, dense, lexical, {**tables, "unanswered": {"rel": values}}, exclude)
    assert int(np.argmax(np.where(exclude[0], -np.inf, expected[0]))) == top[5]  # the first without an answer
    pages = run(other, [Query(doc_id=f"d{h}", relations={"rel": 1.0}) for h in heads], SearchOptions(k=N, explain=True))
    for hit, parts in explained(expected, pages):
        if "recipe:past-pool" not in parts:
            assert parts.get("recipe:unanswered:rel", 0.0) == (0.5 if values[int(hit.id[1:])] else 0.0)
    assert "0.5·unanswered(rel)" in recipe.describe() and Recipe.from_json(recipe.to_json()) == recipe
    # a table cut to the most frequent answers cannot say which texts are none
    cut = Operator(name="rel", kind="identity", info={"recipe": recipe.to_json(),
                                                       "answer_prior": {**prior.table([docs[1]["text"]]), "complete": False}})
    path = Bundle(encoder=encoder_identity(), operators={"rel": cut}).save(tmp_path / "cut")
    with pytest.raises(QueryError, match="unanswered names 'rel', which is not an operator of this bundle with every"):
        Searcher(str(searcher.files.root), model=str(path))


def test_choose_takes_it_when_new_answers_are_not_old_ones():
    """Each query's gold was never an answer in training, while the operator ranks old answers high
    (a birthplace asked of people, most of whom have one): dev takes the bonus; offered a table where
    every candidate was answered, it has nothing to choose."""
    rng = np.random.default_rng(2)
    n, m = 40, 300
    exclude = np.zeros((n, m), bool)
    exclude[np.arange(n), np.arange(n)] = True
    answered = rng.choice(np.arange(n, m), 150, replace=False)
    fresh = np.setdiff1d(np.arange(n, m), answered)
    gold = [{int(rng.choice(fresh))} for _ in range(n)]
    dense = {"identity": rng.random((n, m)), "rel": rng.random((n, m))}
    dense["rel"][:, answered] += 0.3
    for i, g in enumerate(gold):
        dense["rel"][i, sorted(g)] += 0.3
    values = np.ones(m, np.float32)
    values[answered] = 0.0
    assert choose("rel", dense, None, {"unanswered": {"rel": values}}, exclude, gold).recipe.unanswered.get("rel", 0) > 0
    assert not choose("rel", dense, None, {"unanswered": {"rel": np.zeros(m, np.float32)}}, exclude, gold).recipe.unanswered


def test_a_fitted_relation_keeps_of_its_table_what_its_recipe_reads():
    answers = [f"text {i}" for i in range(prior.MAX_ENTRIES + 10)]
    for recipe, kept, complete in [(Recipe(mixture={"rel": 1.0}, unanswered={"rel": 0.2}), prior.MAX_ENTRIES + 10, True),
                                   (Recipe(mixture={"rel": 1.0}, prior={"rel": 0.2}), prior.MAX_ENTRIES, False),
                                   (Recipe(mixture={"rel": 1.0}), None, None)]:
        op = Operator(name="rel", kind="identity", info={"answer_prior": prior.table(answers)})
        assert prior.complete(op)
        keep_table(op, recipe)
        entry = op.info.get("answer_prior")
        assert (entry and (len(entry["weights"]), entry["complete"])) == ((kept, complete) if kept else None)


def test_a_table_is_complete_only_where_the_bundle_has_room_for_it():
    answers = [f"text {i % 900}" for i in range(2000)]
    assert prior.table(answers)["complete"] and len(prior.table(answers)["weights"]) == 900
    assert not prior.table(answers, room=899)["complete"]  # the bundle's complete tables are full
    many = [f"text {i}" for i in range(prior.MAX_ANSWERS + 1)]
    assert (len(prior.table(many)["weights"]), prior.table(many)["complete"]) == (prior.MAX_ENTRIES, False)
