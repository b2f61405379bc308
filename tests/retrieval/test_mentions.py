"""A recipe's mentions part (retrieval/parts.py ``Mentions``, indexer/mining.py): a bonus for a
candidate that the query document's texts name or whose texts name it (less for a smaller firm that
names a larger), mined from the index's own texts by the corpus's names, when it shares the query's
value of a metadata field. The index adds it where it should, --explain shows it, a text query and
an index without names get nothing, and dev takes it only when it helps."""
from dataclasses import replace

import numpy as np
import pytest

from relsearch.indexer import mining
from relsearch.retrieval.parts import PARTS
from relsearch.retrieval.plan import resolve
from relsearch.retrieval.recipe import Recipe, choose
from relsearch.retrieval.request import SearchOptions, run
from relsearch.retrieval.search import Query

from test_prominence import N, corpus, index

RECIPE = Recipe(mixture={"identity": 1.0}, bm25=0.3, mentions={"group": 0.5}, depth=N)  # group: i % 4


def test_mentions_link_both_ways_by_name_and_never_a_share_class():
    docs = corpus()  # firm j names Zorb{j % 3} and Quix{5 + j % 2}
    names = [d["metadata"]["name"] for d in docs]
    linked = mining.mentions_of([[d["text"]] for d in docs], names) > 0
    assert linked.shape == (N, N) and (linked == linked.T).all() and not linked.diagonal().any()
    assert set(np.flatnonzero(linked[10])) == {1, 5}  # what firm 10 names, and nobody names firm 10
    assert set(np.flatnonzero(linked[1])) == {6} | {j for j in range(N) if j % 3 == 1} - {1}  # and who names it
    classes = mining.mentions_of([["Acme Inc. makes anvils."], ["Acme Inc. makes anvils."], ["It competes with Acme."]],
                                 ["Acme Inc Class A", "Acme Inc Class C", "Rival Corp."]) > 0
    assert classes.tolist() == [[False, False, True], [False, False, True], [True, True, False]]
    assert mining.mentions_of([[d["text"]] for d in docs], [None] * N) is None


def test_a_smaller_firm_that_names_a_larger_is_linked_to_it_by_their_prominence():
    """Cars.com named Facebook, and was first in Facebook's five: a small firm names the platform it sells
    on, the major whose drug it develops, the insurer whose members it serves far more often than the
    major names it. The major's own texts, or a firm of its size, link as before."""
    docs = corpus()  # firm j names Zorb{j % 3} and Quix{5 + j % 2}: firms 1 and 6 are named by many
    texts, names = [[d["text"]] for d in docs], [d["metadata"]["name"] for d in docs]
    linked, p = mining.mentions_of(texts, names), mining.prominence_of(texts, names)
    assert linked[10, 1] == 1.0 and linked[1, 10] == pytest.approx(p[10] / p[1]) and p[10] / p[1] < 0.5
    assert linked[1, 6] == 1.0 and linked[6, 1] == pytest.approx(min(1.0, p[1] / p[6]))  # firm 1 names firm 6
    assert ((linked > 0) & (linked <= 1)).sum() == (linked > 0).sum()


def test_a_sentence_of_dealings_makes_no_mention_but_still_counts_for_prominence():
    names = ["Boeing Co.", "Spirit Aero Inc.", "Hexcel Corp.", "Airbus SE", "Jetsys Inc."]
    texts = [["Boeing builds airliners. It competes with Airbus in large jets."],
             ["Spirit Aero builds fuselage parts of Boeing aircraft. It was spun off in 2005."],
             ["Hexcel makes carbon fibre. Its customers include J. Smith Ltd; Boeing Co.; and others."],
             ["Airbus builds airliners in Toulouse."],
             ["Jetsys sells spares to Airbus franchisees and rivals Boeing."]]
    linked = mining.mentions_of(texts, names)
    assert set(np.flatnonzero(linked[0])) == {3}  # the rival; not the supplier or the firm whose customer it is
    assert not linked[4].any()  # a franchise is a dealing too
    prominence = mining.prominence_of(texts, names)
    assert prominence[0] == prominence.max()  # named by three texts, dealings or not


def test_a_name_inside_a_longer_name_of_the_corpus_names_only_the_longer():
    names = ["The Coca-Cola Company", "Coca-Cola Consolidated, Inc.", "Pepsi Rival Corp."]
    texts = [["The Coca-Cola Company makes soft drinks."], ["Coca-Cola Consolidated, Inc. was incorporated in 1980."],
             ["Pepsi Rival competes with Coca-Cola in colas."]]
    linked = mining.mentions_of(texts, names)
    assert set(np.flatnonzero(linked[0])) == {2}  # the bottler's own name does not name The Coca-Cola Company


def test_a_firm_is_named_as_people_write_it_and_one_texts_lower_case_leaves_a_name_linking():
    """Others write "Eli Lilly" and "Amazon", not "Eli Lilly and" or "Amazon com"; one text's "apple"
    (a flavour) does not make Apple a common word, two texts' "target" make Target one."""
    names = ["Eli Lilly and Company", "Amazon.com, Inc.", "Apple Inc.", "Target Corporation", "Rival Corp."]
    texts = [["Eli Lilly and Company makes drugs."], ["Amazon.com, Inc. sells online."], ["Apple Inc. makes phones."],
             ["Target Corporation runs stores."],
             ["Rival competes with Eli Lilly, Amazon, Apple and Target. Its sodas taste of apple.",
              "Rival meets its sales target.", "Each store has a target."]]
    linked = mining.mentions_of(texts, names)
    assert set(np.flatnonzero(linked[4])) == {0, 1, 2}  # "target": lower case in two texts
    assert mining.naming_key("Becton, Dickinson and Company") == "becton dickinson"
    assert mining.naming_key("Procter and Gamble") == "procter and gamble"  # "and" goes only with a legal form


def test_the_index_adds_the_bonus_to_named_candidates_of_the_same_group_and_explains_it(tmp_path):
    searcher = index(tmp_path, corpus(), RECIPE)
    found = mining.of_generation(searcher.files)
    assert found.names[searcher.files.docstore.positions(["d13"])["d13"]] == {1, 6}  # d13 names Zorb1 and Quix6
    [hits] = run(searcher, [Query(doc_id="d13", relations={"rel": 1.0})], SearchOptions(k=N - 1, explain=True))
    got = {h.id: h.explain.get("recipe:mentions:group", 0.0) for h in hits}
    # d13 is in group 1 (i % 4), as d1 is; d6 (group 2) is named too but outside it
    assert {i for i, v in got.items() if v} == {"d1"} and got["d1"] == pytest.approx(0.5)
    for h in hits:
        parts = {k: v for k, v in h.explain.items() if k.startswith("recipe:")}
        assert sum(parts.values()) == pytest.approx(h.score, abs=1e-5)
    plain = index(tmp_path / "plain", corpus(), replace(RECIPE, mentions={}))
    [before] = run(plain, [Query(doc_id="d13", relations={"rel": 1.0})], SearchOptions(k=N - 1))
    score = {h.id: h.score for h in before}
    assert all(h.score == pytest.approx(score[h.id] + got[h.id], abs=1e-5) for h in hits)
    # a text query has no document to be named by: no part
    [text_hits] = run(searcher, [Query(text=corpus()[13]["text"], relations={"rel": 1.0})],
                      SearchOptions(k=10, explain=True))
    assert not any(h.explain.get("recipe:mentions:group") for h in text_hits)
    assert "0.5·mentions within group" in RECIPE.describe() and Recipe.from_json(RECIPE.to_json()) == RECIPE


def test_an_index_without_names_gets_no_part_and_a_warning(tmp_path):
    searcher = index(tmp_path, corpus(named=False), RECIPE)
    scoring = resolve(searcher.operators, {"rel": 1.0}, metadata_fields=searcher.metadata_fields)
    assert any("mentions does not apply" in w and "no name field" in w for w in scoring.warnings)
    [hits] = run(searcher, [Query(doc_id="d10", relations={"rel": 1.0})], SearchOptions(k=10, explain=True))
    assert not any("recipe:mentions:group" in h.explain for h in hits)


def test_choose_takes_mentions_only_when_dev_rewards_them():
    rng = np.random.default_rng(3)
    n, m = 40, 200
    exclude = np.zeros((n, m), bool)
    exclude[np.arange(n), np.arange(n)] = True
    gold = [{int(g)} for g in rng.integers(n, m, n)]
    dense = {"identity": rng.random((n, m))}
    for i, g in enumerate(gold):
        dense["identity"][i, sorted(g)] += 0.15
    named = rng.random((n, m)) < 0.02
    named[np.arange(n), [min(g) for g in gold]] = True  # every gold is named, among a few others
    picked = choose("identity", dense, None, {"mentions": {"f": named}}, exclude, gold, mixes=(1.0,))
    assert picked.recipe.mentions["f"] in PARTS["mentions"].grid and picked.recipe.mentions["f"] > 0
    noise = rng.random((n, m)) < 0.02
    for i, g in enumerate(gold):
        noise[i, sorted(g)] = False  # names that never are the gold
    assert not choose("identity", dense, None, {"mentions": {"f": noise}}, exclude, gold, mixes=(1.0,)).recipe.mentions


def test_a_field_the_index_lacks_is_said_once_for_every_part_keyed_by_it(tmp_path):
    """make demo printed the missing GICS fields twice: once for the metadata bonuses, once for mentions."""
    searcher = index(tmp_path, corpus(), replace(RECIPE, same={"gics_code": 0.3}, mentions={"gics_code": 1.0}))
    scoring = resolve(searcher.operators, {"rel": 1.0}, metadata_fields=searcher.metadata_fields)
    missing = [w for w in scoring.warnings if "gics_code" in w]
    assert missing == ["rel: the recipe's bonuses for sharing gics_code do not apply: this index has no such metadata field"]
