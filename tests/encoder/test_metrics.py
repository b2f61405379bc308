"""Link-prediction metrics on hand-made cases: ties, filtering, query exclusion, chance level."""
import numpy as np
import pytest

from relsearch.encoder.metrics import METRIC_KEYS, Ranks, linkpred_metrics, rank_gold, ranking_metrics


def test_ranks_without_ties():
    scores = np.array([[0.9, 0.5, 0.1, 0.3],
                       [0.2, 0.8, 0.7, 0.1]])
    r = rank_gold(scores, np.array([1, 3]))
    assert r.optimistic.tolist() == [2, 4]
    assert r.pessimistic.tolist() == [2, 4]
    m = ranking_metrics(r)
    assert m["mrr"] == pytest.approx((1 / 2 + 1 / 4) / 2)
    assert m["mr"] == pytest.approx(3.0)
    assert m["hits@1"] == 0.0 and m["hits@3"] == pytest.approx(0.5) and m["hits@10"] == 1.0
    assert tuple(m) == METRIC_KEYS


def test_ties_give_optimistic_pessimistic_and_expected_realistic():
    # gold (col 2) ties with cols 0 and 3; col 1 is strictly higher
    scores = np.array([[0.5, 0.9, 0.5, 0.5, 0.1]])
    r = rank_gold(scores, np.array([2]))
    assert r.optimistic.tolist() == [2]
    assert r.pessimistic.tolist() == [4]
    assert r.realistic.tolist() == [3.0]
    assert ranking_metrics(r, "optimistic")["mrr"] == pytest.approx(1 / 2)
    assert ranking_metrics(r, "pessimistic")["mrr"] == pytest.approx(1 / 4)
    real = ranking_metrics(r)
    assert real["mrr"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)  # expectation over positions 2..4
    assert real["mr"] == pytest.approx(3.0)
    assert real["hits@1"] == 0.0
    assert real["hits@3"] == pytest.approx(2 / 3)  # positions 2 and 3 of {2, 3, 4}
    assert ranking_metrics(r, "optimistic")["hits@1"] == 0.0


def test_filter_removes_other_true_answers_but_never_gold():
    scores = np.array([[0.9, 0.8, 0.7, 0.1]])
    filt = np.array([[True, False, True, False]])  # col 0 is another true tail; True at gold col 2 ignored
    r = rank_gold(scores, np.array([2]), filter_mask=filt)
    assert r.optimistic.tolist() == [2]  # only col 1 remains above
    raw = rank_gold(scores, np.array([2]))
    assert raw.optimistic.tolist() == [3]


def test_query_exclusion_by_index_and_by_mask():
    scores = np.array([[1.0, 0.6, 0.4],    # the query itself (col 0) scores highest
                       [0.3, 0.2, 0.9]])
    gold = np.array([1, 0])
    by_index = rank_gold(scores, gold, exclude=np.array([0, -1]))
    assert by_index.optimistic.tolist() == [1, 2]
    by_mask = rank_gold(scores, gold, exclude=np.array([[True, False, False], [False, False, False]]))
    assert by_mask.optimistic.tolist() == [1, 2]
    # the gold column is never excluded, even if it is (a duplicate of) the query
    assert rank_gold(scores, gold, exclude=np.array([1, 0])).optimistic.tolist() == [2, 2]


def test_excluded_and_filtered_ties_do_not_count():
    scores = np.array([[0.5, 0.5, 0.5, 0.5]])
    r = rank_gold(scores, np.array([3]), filter_mask=np.array([[False, True, False, False]]), exclude=np.array([0]))
    assert (r.optimistic.tolist(), r.pessimistic.tolist()) == ([1], [2])


@pytest.mark.parametrize("n", [1, 2, 7, 50, 1000])
def test_constant_scorer_is_exactly_at_chance(n):
    scores = np.zeros((5, n))
    m = linkpred_metrics(scores, np.arange(5) % n)
    expected_mrr = sum(1 / k for k in range(1, n + 1)) / n  # E[1/rank] for a uniformly random rank
    assert m["mrr"] == pytest.approx(expected_mrr)
    assert m["mr"] == pytest.approx((n + 1) / 2)
    for k in (1, 3, 10):
        assert m[f"hits@{k}"] == pytest.approx(min(k, n) / n)


def test_constant_scorer_matches_random_scorers_on_average():
    rng = np.random.default_rng(0)
    n_q, n_c = 4000, 20
    gold = rng.integers(0, n_c, n_q)
    random_m = linkpred_metrics(rng.random((n_q, n_c)), gold)
    const_m = linkpred_metrics(np.ones((n_q, n_c)), gold)
    for key in ("mrr", "hits@1", "hits@3", "hits@10"):
        assert random_m[key] == pytest.approx(const_m[key], abs=0.02)
    assert random_m["mr"] == pytest.approx(const_m["mr"], rel=0.03)


def test_perfect_scorer_and_concat():
    scores = np.eye(4)
    m = linkpred_metrics(scores, np.arange(4))
    assert m == {"mrr": 1.0, "mr": 1.0, "hits@1": 1.0, "hits@3": 1.0, "hits@10": 1.0}
    a, b = rank_gold(scores[:2], np.arange(2)), rank_gold(scores[2:], np.arange(2, 4))
    assert Ranks.concat([a, b]).optimistic.tolist() == [1, 1, 1, 1]


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError, match="NaN"):
        rank_gold(np.array([[np.nan, 1.0]]), np.array([0]))
    with pytest.raises(ValueError, match="out of range"):
        rank_gold(np.zeros((1, 2)), np.array([2]))
    with pytest.raises(ValueError, match="shape"):
        rank_gold(np.zeros((2, 2)), np.array([0]))
    with pytest.raises(ValueError, match="setting"):
        ranking_metrics(Ranks(np.array([1]), np.array([1])), "mean")
    assert all(np.isnan(v) for v in ranking_metrics(Ranks.concat([])).values())
