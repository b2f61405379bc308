"""A recipe's additive parts (retrieval/parts.py) as the index ranks a query's pool with them
(retrieval/recipe_search.py ``_rank_row``): each part's scorer from the table, summed in order."""
from types import SimpleNamespace

import numpy as np

from relsearch.encoder.relations import Operator
from relsearch.retrieval import parts as recipe_parts
from relsearch.retrieval import recipe_search
from relsearch.retrieval.recipe import Recipe


def test_the_pools_fused_scores_are_their_parts_summed_in_order_bit_for_bit():
    """_rank_row adds each pooled position's parts (dense, BM25, bonuses, prior) in the parts'
    order: the float64 sums, ranking and parts are exactly those of sum() over every part (0.0 where
    a part lacks the position), ties to the smaller position, then the dense list past the pool."""
    from relsearch.indexer.ann import SearchResult
    from relsearch.retrieval import prior

    rng = np.random.default_rng(11)
    n, depth, k = 300, 40, 85  # pools of at most 80: the dense list goes on past them
    texts = [f"t{j % 17}" for j in range(n)]
    metadata = [{"a": int(rng.integers(3)), "b": int(rng.integers(2)), **({"c": 1} if j % 5 else {})} for j in range(n)]
    documents = {j: {"text": texts[j], "metadata": metadata[j]} for j in range(n)}
    recipe = Recipe(mixture={"identity": 1.0}, bm25=0.7, same={"a": 0.5, "b": 0.05, "c": 0.1}, prior={"rel": 0.3},
                    depth=depth)
    weights = {prior.key(f"t{j}"): round(float(rng.random()), 4) for j in range(0, 17, 3)}
    rows = 20
    dense_p = np.stack([rng.permutation(n)[:90] for _ in range(rows)])
    dense_s = np.sort(rng.choice(np.linspace(0, 1, 30), (rows, 90)).astype(np.float32), axis=1)[:, ::-1]  # ties
    lex_p = np.stack([rng.permutation(n)[:depth] for _ in range(rows)])
    lex_s = np.sort(rng.choice(np.linspace(0, 9, 12), (rows, depth)).astype(np.float32), axis=1)[:, ::-1]
    lex_p[3, 30:], lex_s[3, 30:] = -1, -np.inf  # a short BM25 list
    dense, lexical = SearchResult(dense_p, dense_s), SearchResult(lex_p, lex_s)
    query_meta = [{"a": [metadata[i]["a"]], "b": [metadata[i]["b"]], "c": [1]} for i in range(rows)]
    searcher = SimpleNamespace(metadata_fields=["a", "b", "c"], operators={"rel": Operator(
        name="rel", kind="identity", info={"answer_prior": {"key": prior.KEY, "weights": weights}})})
    batch = recipe_parts.Batch(searcher, [None] * rows, np.arange(rows))
    batch.metadata = query_meta  # what the query documents' metadata would give
    scorers, read = recipe_parts.scorers(recipe, batch)
    assert read and [label for label, _ in scorers] == ["recipe:same:a", "recipe:same:b", "recipe:same:c",
                                                         "recipe:prior:rel"]
    for i in range(rows):
        pool, parts_in = recipe_search._pooled(recipe, dense, lexical, i, recipe_search.Scale.of(dense, lexical, depth))
        ranked, explained = recipe_search._rank_row(recipe, dense, i, pool, parts_in, documents, scorers, k)
        # the reference: every part as a dict, each position's score sum() of them in order
        contributions = dict(parts_in)
        for f, w in recipe.same.items():
            contributions[f"recipe:same:{f}"] = {p: w for p in pool if metadata[p].get(f) in query_meta[i][f]}
        contributions["recipe:prior:rel"] = {p: 0.3 * weights[prior.key(texts[p])] for p in pool
                                             if weights.get(prior.key(texts[p]), 0.0)}
        total = {p: sum(part.get(p, 0.0) for part in contributions.values()) for p in pool}
        want = sorted(total.items(), key=lambda item: (-item[1], item[0]))
        assert len(want) < k and ranked[:len(want)] == want
        assert len(ranked) == k and all(s < 0 for _, s in ranked[len(want):])  # past the pool
        assert all(explained[p] == {name: part.get(p, 0.0) for name, part in contributions.items()}
                   for p, _ in want[:k])
        assert recipe_search._rank_row(recipe, dense, i, pool, parts_in, documents, scorers, k, explain=False)[0] == ranked
