"""bench/: metric definitions on hand-made cases, BM25, and `bench linkpred|retrieval|sts` end to end.

The link-prediction rank/tie/filter/chance tests live in test_metrics.py (bench/metrics.py); here:
same-aspect retrieval metrics, query exclusion and filtering as the runner applies them, and a real
index whose `bench linkpred` numbers are recomputed from `Searcher.search` output.
"""
import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from conftest import shared, write_jsonl
from relsearch.indexer.lexical import BM25
from relsearch.bench.linkpred import Candidates, evaluate, raw_vectors
from relsearch.bench.report import BenchInputError, sha256_file
from relsearch.bench.retrieval import evaluate as retrieval_evaluate
from relsearch.encoder.metrics import seed_metrics
from relsearch.bench.sts import correlations
from relsearch.cli_bench import bench
from relsearch.encoder.bundle import Bundle, load_bundle
from relsearch.encoder.relations import Operator, normalize

# ---------------------------------------------------------------- same-aspect retrieval metrics


def test_retrieval_metrics_first_hit_and_denominators():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5])
    rel = np.array([False, True, False, True, False])
    assert seed_metrics(scores, rel, 3) == pytest.approx((1 / 3, 1 / 2, 1 / 2))  # P: /k, R: /all relevant
    assert seed_metrics(scores, rel, 1) == (0.0, 0.0, 0.0)  # first relevant hit beyond k → MRR@k 0
    many = np.linspace(1, 0, 12)
    p, r, mrr = seed_metrics(many, np.arange(12) < 11, 10)  # 11 relevant: R@10 is not capped at k
    assert (p, r, mrr) == pytest.approx((1.0, 10 / 11, 1.0))
    assert seed_metrics(np.array([0.3, 0.2, 0.1]), np.array([False, False, True]), 10) == pytest.approx((0.1, 1.0, 1 / 3))


def _brute_force(scores, rel, k):
    """Average of (P@k, R@k, MRR@k) over every order of the tied candidates."""
    out = []
    for perm in itertools.permutations(range(len(scores))):
        order = sorted(perm, key=lambda i: -scores[i])  # stable: ties keep the permutation's order
        top = rel[order[:k]]
        first = next((j + 1 for j, x in enumerate(top) if x), None)
        out.append((top.sum() / k, top.sum() / rel.sum(), 1 / first if first else 0.0))
    return np.mean(out, axis=0)


@pytest.mark.parametrize("scores,rel,k", [
    ([0.5] * 6, [0, 1, 0, 1, 0, 0], 3),          # constant scorer: chance level
    ([0.9, 0.5, 0.5, 0.5, 0.1, 0.5], [0, 0, 1, 0, 1, 1], 2),
    ([0.9, 0.5, 0.5, 0.5, 0.1, 0.5], [1, 0, 1, 0, 0, 0], 3),
    ([0.2, 0.2, 0.7, 0.7, 0.2], [1, 0, 0, 0, 1], 4),
])
def test_retrieval_ties_are_the_expectation_over_tie_orders(scores, rel, k):
    scores, rel = np.array(scores), np.array(rel, dtype=bool)
    assert seed_metrics(scores, rel, k) == pytest.approx(tuple(_brute_force(scores, rel, k)))


def test_constant_retrieval_scorer_is_at_chance():
    p, r, _ = seed_metrics(np.zeros(100), np.arange(100) < 20, 10)
    assert (p, r) == pytest.approx((20 / 100, 10 / 100))


def test_retrieval_excludes_the_seed_and_skips_seeds_with_nothing_to_find():
    labels = ["a", "a", "b", "c", "b"]
    scores = np.eye(5) * 10 + np.array([[0, 1, 2, 3, 4]] * 5) * 0.1  # each seed scores itself highest
    m = retrieval_evaluate(lambda a, b: scores[a:b], labels, 1)
    assert m["seeds"] == 4 and m["seeds_without_relevant"] == 1  # "c" has no other member
    # seed 0 → top other doc 4 ("b"): miss; seed 1 → 4: miss; seed 2 → 4 ("b"): hit; seed 4 → 3: miss
    assert m["p@1"] == pytest.approx(1 / 4) and m["mrr@1"] == pytest.approx(1 / 4)


# ---------------------------------------------------------------- link prediction as the runner applies it


def _candidates(texts, vectors, queries, bundle):
    unit = normalize(np.asarray(vectors, np.float32))
    return Candidates(texts, unit, {t: np.asarray(v, np.float32) for t, v in queries.items()}, bundle, {})


def test_linkpred_excludes_query_and_duplicate_gold_and_filters_known_tails():
    bundle = Bundle(encoder={"model": "toy", "dim": 2})
    texts = ["q", "gold", "other-true", "gold", "x"]
    vecs = [[1, 0], [0.8, 0.6], [0.95, 0.3], [0.8, 0.6], [0.9, 0.44]]  # query itself, then other-true, then x, gold
    test = [{"head": "q", "relation": "r", "tail": "gold"}]
    known = [{"head": "q", "relation": "r", "tail": "other-true"}]
    cands = _candidates(texts, vecs, {"q": [1, 0]}, bundle)
    rows = {(r["relation"], r["method"]): r for r in evaluate(test, known, cands, ["identity"])["rows"]}
    m = rows[("r", "identity")]
    # raw: "q" excluded (query itself), the second "gold" excluded (a copy of the gold text): other-true, x above → 3
    assert m["raw"]["mr"] == 3 and m["raw"]["mrr"] == pytest.approx(1 / 3)
    assert m["filtered"]["mr"] == 2  # other-true filtered
    with pytest.raises(BenchInputError, match="--skip-missing"):
        evaluate([{"head": "q", "relation": "r", "tail": "absent"}], [], cands, ["identity"])
    out = evaluate([{"head": "q", "relation": "r", "tail": "absent"}] + test, [], cands, ["identity"], skip_missing=True)
    assert out["counts"]["missing"]["tail"] == {"r": 1}


def test_linkpred_weighted_hybrid_methods():
    """hybrid-wW fuses the triple's own operator with BM25 by weight W: at W = 1 it ranks as the
    operator does (every candidate is within the fused depth); the weights come from the job."""
    from relsearch.bench.linkpred import LinkPredJob, methods_for

    bundle = Bundle(encoder={"model": "toy", "dim": 2})
    texts = ["q about oil", "gold gas", "oil well", "x oil oil", "y"]
    vecs = [[1, 0], [0.8, 0.6], [0.95, 0.3], [0.6, 0.8], [0.9, 0.44]]
    test = [{"head": "q about oil", "relation": "identity", "tail": "gold gas"}]
    cands = _candidates(texts, vecs, {"q about oil": [1, 0]}, bundle)
    rows = {r["method"]: r for r in evaluate(test, [], cands, ["identity", "relation", "hybrid-w1", "hybrid-w0.5"])["rows"]
            if r["relation"] == "overall"}
    assert rows["hybrid-w1"]["filtered"] == rows["identity"]["filtered"]
    assert rows["hybrid-w0.5"]["available"] and rows["hybrid-w0.5"]["operator"] is None
    job = LinkPredJob(test="t", candidates="c", fusion_weights=(0.3, 0.7, 0.3))
    assert methods_for(job, bundle, test) == ["bm25", "identity", "relation", "hybrid", "hybrid-w0.3", "hybrid-w0.7"]
    with pytest.raises(BenchInputError, match="leave out --relation"):
        methods_for(LinkPredJob(test="t", candidates="c", relations=("identity",), fusion_weights=(0.3,)), bundle, test)
    with pytest.raises(BenchInputError, match="between 0 and 1"):
        methods_for(LinkPredJob(test="t", candidates="c", fusion_weights=(1.5,)), bundle, test)


def test_linkpred_head_prediction_uses_minus_r_or_an_inverse_operator():
    r = np.array([0.0, 1.0], np.float32)
    ops = {"t": Operator(name="t", kind="translation", params={"r": r}),
           "lin": Operator(name="lin", kind="linear",
                           params={"W": np.eye(2, dtype=np.float32), "b": np.zeros(2, np.float32)})}
    bundle = Bundle(encoder={"model": "toy", "dim": 2}, operators=ops)
    texts, vecs = ["h", "t", "decoy"], [[1, 0], [1, 1], [1, -0.9]]
    cands = _candidates(texts, vecs, {"h": [1, 0], "t": [1, 1]}, bundle)
    test = [{"head": "h", "relation": "t", "tail": "t"}]
    out = evaluate(test, [], cands, ["relation"], directions=("tail", "head"))
    rows = {(r["direction"], r["relation"]): r for r in out["rows"]}
    assert rows[("head", "t")]["available"]  # normalize(h_t − r) = (1, 0) finds "h" first
    assert rows[("head", "t")]["raw"]["mrr"] == 1.0 and rows[("mean", "t")]["available"]
    test = [{"head": "h", "relation": "lin", "tail": "t"}]
    rows = {(r["direction"], r["relation"]): r for r in evaluate(test, [], cands, ["relation"],
                                                                  directions=("tail", "head"))["rows"]}
    assert not rows[("head", "lin")]["available"] and "lin^-1" in rows[("head", "lin")]["reason"]
    assert "its kind linear has none (kinds with one: identity, translation)" in rows[("head", "lin")]["reason"]
    assert not rows[("mean", "lin")]["available"] and rows[("tail", "lin")]["available"]


def test_linkpred_head_prediction_asks_the_kind_registry_for_an_inverse(monkeypatch):
    """bench linkpred inverted an operator by branching on the kind name "translation"; it asks the
    operator-kind registry (encoder/kinds.py) now, so a kind registered with an inverse is predicted
    both ways with no change to the benchmark."""
    from dataclasses import replace

    from relsearch.encoder import kinds

    swap = np.array([[0, 1], [1, 0]], np.float32)  # maps "h" = (1, 0) onto "t" = (0, 1)
    ops = {"lin": Operator(name="lin", kind="linear", params={"W": swap, "b": np.zeros(2, np.float32)})}
    cands = _candidates(["h", "t", "decoy"], [[1, 0], [0, 1], [0.6, 0.8]], {"h": [1, 0], "t": [0, 1]},
                        Bundle(encoder={"model": "toy", "dim": 2}, operators=ops))
    test = [{"head": "h", "relation": "lin", "tail": "t"}]

    def head_row():
        rows = evaluate(test, [], cands, ["relation"], directions=("tail", "head"))["rows"]
        return next(r for r in rows if (r["direction"], r["relation"]) == ("head", "lin"))

    assert not head_row()["available"]
    inverse = lambda p: {"W": np.linalg.inv(p["W"]), "b": -np.linalg.inv(p["W"]) @ p["b"]}  # noqa: E731
    monkeypatch.setitem(kinds.REGISTRY, "linear", replace(kinds.REGISTRY["linear"], inverse=inverse))
    row = head_row()
    assert row["available"] and row["raw"]["mrr"] == 1.0  # W⁻¹ t = (1, 0) finds "h" first


def test_linkpred_head_prediction_prefers_a_trained_inverse_for_every_kind():
    """``train --inverse`` writes ``<r>^-1``: head prediction uses it (for a translation too, over −r),
    and a query encoder's inverse reads the tail's text."""
    swap = np.array([[0, 1], [1, 0]], np.float32)  # the inverse maps "t" = (0, 1) onto "h" = (1, 0)
    ops = {"lin": Operator(name="lin", kind="linear", params={"W": np.eye(2, dtype=np.float32), "b": np.zeros(2, "f")}),
           "lin^-1": Operator(name="lin^-1", kind="linear", params={"W": swap, "b": np.zeros(2, "f")}),
           "t": Operator(name="t", kind="translation", params={"r": np.array([5.0, 5.0], "f")}),
           "t^-1": Operator(name="t^-1", kind="linear", params={"W": swap, "b": np.zeros(2, "f")})}
    texts, vecs = ["h", "t", "decoy"], [[1, 0], [0, 1], [0.6, 0.8]]
    seen = []
    tower = Operator(name="enc^-1", kind="encoder", params={"m.lora_A": np.zeros((1, 2), "f"), "m.lora_B": np.zeros((2, 1), "f")},
                     info={"tower": {"name": "x", "marker": "{text}", "scale": 1.0, "base": "toy"}},
                     query_tower=lambda batch: seen.extend(batch) or np.array([[1.0, 0.0]] * len(batch), "f"))
    ops.update({"enc": Operator(name="enc", kind="linear", params={"W": np.eye(2, dtype=np.float32), "b": np.zeros(2, "f")}),
                "enc^-1": tower})
    bundle = Bundle(encoder={"model": "toy", "dim": 2}, operators=ops)
    cands = _candidates(texts, vecs, {"h": [1, 0], "t": [0, 1]}, bundle)
    for rel in ("lin", "t", "enc"):
        out = evaluate([{"head": "h", "relation": rel, "tail": "t"}], [], cands, ["relation"], directions=("tail", "head"))
        rows = {(r["direction"], r["relation"]): r for r in out["rows"]}
        assert rows[("head", rel)]["available"] and rows[("head", rel)]["raw"]["mrr"] == 1.0, rel
        assert rows[("mean", rel)]["available"]
    assert seen == ["t"]  # the tower read the tail's text


def test_linkpred_summary_gives_tail_head_and_their_mean_with_uniform_keys():
    from relsearch.bench.linkpred import DIRECTIONS, summary

    ops = {"lin": Operator(name="lin", kind="linear", params={"W": np.eye(2, dtype="f"), "b": np.zeros(2, "f")}),
           "lin^-1": Operator(name="lin^-1", kind="linear", params={"W": np.array([[0, 1], [1, 0]], "f"),
                                                                     "b": np.zeros(2, "f")})}
    bundle = Bundle(encoder={"model": "toy", "dim": 2}, operators=ops)
    cands = _candidates(["h", "t", "decoy"], [[1, 0], [0, 1], [0.6, 0.8]], {"h": [1, 0], "t": [0, 1]}, bundle)
    test = [{"head": "h", "relation": "lin", "tail": "t"}]
    rows = evaluate(test, [], cands, ["identity", "relation"], directions=DIRECTIONS)["rows"]
    out = summary(rows, ["identity", "relation"], DIRECTIONS)
    overall = {(r["direction"], r["method"]): r["filtered"] for r in rows if r["relation"] == "overall"}
    for method in ("identity", "relation"):
        e = out[method]
        assert e["mrr_tail"] == overall[("tail", method)]["mrr"] and e["mrr_head"] == overall[("head", method)]["mrr"]
        assert e["mrr"] == pytest.approx((e["mrr_tail"] + e["mrr_head"]) / 2)
        assert e["hits@3"] == pytest.approx((e["hits@3_tail"] + e["hits@3_head"]) / 2)
        assert e["queries_tail"] == e["queries_head"] == 1
    assert out["relation"]["mrr_head"] == 1.0  # the inverse maps "t" onto "h"
    del ops["lin^-1"]  # no inverse: head prediction unavailable, so no mean either
    rows = evaluate(test, [], cands, ["relation"], directions=DIRECTIONS)["rows"]
    e = summary(rows, ["relation"], DIRECTIONS)["relation"]
    assert e["mrr_head"] is None and e["mrr"] is None and e["mrr_tail"] is not None
    tail_only = summary(evaluate(test, [], cands, ["relation"])["rows"], ["relation"], ("tail",))["relation"]
    assert tail_only["mrr"] == tail_only["mrr_tail"] and "mrr_head" not in tail_only


def test_bench_linkpred_predicts_heads_by_default_for_a_bundle_trained_with_inverse(tmp_path, encoder):
    texts = ["Paris is the capital of France.", "France is a country in Europe.", "Berlin is the capital of Germany.",
             "Germany is a country in Europe.", "Rome is the capital of Italy.", "Italy is a country in Europe."]
    eye = {"W": np.eye(384, dtype=np.float32), "b": np.zeros(384, np.float32)}
    ops = {"capital of": Operator(name="capital of", kind="linear", params=dict(eye)),
           "capital of^-1": Operator(name="capital of^-1", kind="linear", params=dict(eye))}
    Bundle(encoder=encoder.identity, operators=ops).save(tmp_path / "inv")
    Bundle(encoder=encoder.identity, operators={"capital of": ops["capital of"]}).save(tmp_path / "tail")
    cands = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    test = write_jsonl(tmp_path / "test.jsonl", [{"head": texts[i], "relation": "capital of", "tail": texts[i + 1]}
                                                 for i in (0, 2, 4)])

    def run(model, *extra):
        out = tmp_path / f"{model}{len(extra)}.json"
        result = CliRunner().invoke(bench, ["linkpred", str(test), "--candidates", str(cands), "--model",
                                            str(tmp_path / model), "--cache", str(tmp_path / "cache"), "--json",
                                            str(out), "--quiet", *extra])
        assert result.exit_code == 0, result.output
        return result.output, json.loads(out.read_text())

    output, record = run("inv")
    assert record["directions"] == ["tail", "head"]
    assert "overall, tail and head prediction and their mean" in output and "MRR mean" in output
    rows = {(r["direction"], r["relation"], r["method"]): r for r in record["rows"]}
    for method in ("identity", "relation"):
        e = record["summary"][method]
        assert e["mrr_tail"] == rows[("tail", "overall", method)]["filtered"]["mrr"]
        assert e["mrr_head"] == rows[("head", "overall", method)]["filtered"]["mrr"]
        assert e["mrr"] == pytest.approx(rows[("mean", "overall", method)]["filtered"]["mrr"])
        assert e["hits@10"] == pytest.approx((e["hits@10_tail"] + e["hits@10_head"]) / 2)
    _, record = run("inv", "--tail-only")
    assert record["directions"] == ["tail"] and "mrr_head" not in record["summary"]["relation"]
    _, record = run("tail")  # no "capital of^-1": tails only unless asked
    assert record["directions"] == ["tail"]
    _, record = run("tail", "--both-directions")
    assert record["directions"] == ["tail", "head"] and record["summary"]["relation"]["mrr"] is None


# ---------------------------------------------------------------- BM25 and correlations


def test_bm25_ranks_the_obvious_document_first():
    docs = ["The cat sat on the mat.", "Stock markets fell sharply on Monday.", "A recipe for lemon cake.",
            "Quarterly earnings beat analyst expectations."]
    bm25 = BM25(docs)
    scores = bm25.scores(["lemon cake recipe", "why did the stock market fall", "the of and"])
    assert scores.shape == (3, 4)
    assert scores[0].argmax() == 2 and scores[1].argmax() == 1
    assert not scores[2].any()  # stop words only: no match, no crash


def test_spearman_and_pearson_are_scipys():
    rng = np.random.default_rng(0)
    pred, gold = rng.random(40), rng.random(40)
    got = correlations(pred, gold)
    assert got["spearman"] == pytest.approx(stats.spearmanr(pred, gold).statistic)
    assert got["pearson"] == pytest.approx(stats.pearsonr(pred, gold).statistic)
    # Spearman = Pearson of ranks, with average ranks for ties
    tied = np.array([1, 2, 2, 3, 5, 5, 5, 8.0])
    other = np.array([2, 1, 3, 3, 4, 6, 5, 7.0])
    expected = np.corrcoef(stats.rankdata(tied), stats.rankdata(other))[0, 1]
    assert correlations(tied, other)["spearman"] == pytest.approx(expected)
    assert np.isnan(correlations(np.ones(5), np.arange(5.0))["spearman"])


# ---------------------------------------------------------------- end to end on a real index


@pytest.fixture(scope="module")
def qa_data(tmp_path_factory):
    """~50 TrecQA test texts (questions and their candidate sentences) and their answer triples."""
    pairs = [json.loads(line) for line in shared("trecqa", "pairs", "test.jsonl").read_text().splitlines()]
    texts, qids = [], []
    for p in pairs:
        if p["qid"] not in qids:
            if len(texts) >= 45:
                break
            qids.append(p["qid"])
            texts.append(p["a"])
        texts.append(p["b"])
    texts = list(dict.fromkeys(texts))
    triples = [{"head": p["a"], "relation": "qa-entailment", "tail": p["b"]}
               for p in pairs if p["qid"] in qids and p["label"] == 1]
    root = tmp_path_factory.mktemp("qa")
    write_jsonl(root / "corpus.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    write_jsonl(root / "test.jsonl", triples)
    write_jsonl(root / "known.jsonl", triples[:1])
    assert len(texts) >= 45 and len(triples) >= 8
    return root


@pytest.fixture(scope="module")
def qa_bundles(tmp_path_factory, encoder):
    """Bundle with a translation "qa-entailment" and a linear "mix"; a second one holding −r as "inv"."""
    rng = np.random.default_rng(3)
    r = rng.normal(scale=0.3, size=384).astype(np.float32)
    ops = {"qa-entailment": Operator(name="qa-entailment", kind="translation", params={"r": r}),
           "mix": Operator(name="mix", kind="linear", params={
               "W": (np.eye(384) + rng.normal(scale=0.05, size=(384, 384))).astype(np.float32),
               "b": np.zeros(384, np.float32)})}
    root = tmp_path_factory.mktemp("bundles")
    Bundle(encoder=encoder.identity, operators=ops).save(root / "b")
    Bundle(encoder=encoder.identity, operators={"inv": Operator(name="inv", kind="translation",
                                                                params={"r": -r})}).save(root / "inv")
    return str(root / "b"), str(root / "inv")


@pytest.fixture(scope="module")
def qa_index(qa_data, qa_bundles, tmp_path_factory):
    from relsearch.pipelines.index import IndexJob, run_index

    target = tmp_path_factory.mktemp("qaidx") / "idx"
    report = run_index(IndexJob(input=str(qa_data / "corpus.jsonl"), index=str(target), model=qa_bundles[0],
                                faiss_factory="Flat", progress=False))  # exact: Searcher.search is the oracle
    assert report.published
    return str(target)


def _ranks_from_search(searcher, order, triples, known, relation, direction):
    """(filtered realistic, raw optimistic) metric dicts recomputed from Searcher.search hits."""
    from relsearch.encoder.metrics import Ranks, ranking_metrics
    from relsearch.retrieval.search import Query

    n_docs = searcher.files.docstore.count()
    docs = searcher.files.docstore.get(list(range(n_docs)))
    ids = {d["text"]: d["id"] for d in docs.values()}  # --id queries: the stored vector, as the runner takes it
    hits = searcher.search([Query(doc_id=ids[t], relations={relation: 1.0}) for t in order], k=n_docs)
    by_text = dict(zip(order, hits))
    q_key, a_key = ("head", "tail") if direction == "tail" else ("tail", "head")
    lo_f, hi_f, lo_r = [], [], []
    for t in triples:
        query, gold = t[q_key], t[a_key]
        others = {k[a_key] for k in known + triples if k[q_key] == query} - {gold}
        ranked = [(h.text, h.score) for h in by_text[query] if h.text != query]  # the query itself excluded
        gold_score = next(s for text, s in ranked if text == gold)
        kept = [(text, s) for text, s in ranked if text != gold]
        lo_r.append(1 + sum(s > gold_score for _, s in kept))
        kept_f = [s for text, s in kept if text not in others]
        lo_f.append(1 + sum(s > gold_score for s in kept_f))
        hi_f.append(lo_f[-1] + sum(s == gold_score for s in kept_f))
    return (ranking_metrics(Ranks(np.array(lo_f), np.array(hi_f)), "realistic"),
            ranking_metrics(Ranks(np.array(lo_r), np.array(lo_r)), "optimistic"))


def test_bench_linkpred_on_a_real_index_matches_searcher_output(qa_data, qa_bundles, qa_index, tmp_path):
    from relsearch.retrieval.search import Searcher

    out, png = tmp_path / "lp.json", tmp_path / "lp.png"
    args = ["linkpred", str(qa_data / "test.jsonl"), "--index", qa_index, "--model", qa_bundles[0], "--known",
            str(qa_data / "known.jsonl"), "-r", "qa-entailment", "-r", "mix", "--both-directions", "--json", str(out),
            "--plot", str(png), "--quiet"]
    result = CliRunner().invoke(bench, args)
    assert result.exit_code == 0, result.output
    assert "qa-entailment" in result.output and "unavailable" in result.output
    record = json.loads(out.read_text())
    rows = {(r["direction"], r["relation"], r["method"]): r for r in record["rows"]}
    triples = [json.loads(line) for line in (qa_data / "test.jsonl").read_text().splitlines()]
    known = [json.loads(line) for line in (qa_data / "known.jsonl").read_text().splitlines()]
    order = list(dict.fromkeys(x for t in triples for x in (t["head"], t["tail"])))  # as the runner encodes them
    checks = [(Searcher(qa_index, qa_bundles[0]), "identity", "tail", "identity"),
              (Searcher(qa_index, qa_bundles[0]), "qa-entailment", "tail", "qa-entailment"),
              (Searcher(qa_index, qa_bundles[0]), "identity", "head", "identity"),
              (Searcher(qa_index, qa_bundles[1]), "inv", "head", "qa-entailment")]  # head prediction: −r
    for searcher, relation, direction, method in checks:
        filtered, raw = _ranks_from_search(searcher, order, triples, known, relation, direction)
        row = rows[(direction, "qa-entailment", method)]
        for key in filtered:
            assert row["filtered"][key] == pytest.approx(filtered[key], abs=1e-6), (method, direction, key)
            assert row["raw"][key] == pytest.approx(raw[key], abs=1e-6), (method, direction, key)
    assert rows[("tail", "overall", "identity")]["filtered"] == rows[("tail", "qa-entailment", "identity")]["filtered"]
    assert not rows[("head", "qa-entailment", "mix")]["available"]  # linear, no "mix^-1" in the bundle
    assert rows[("mean", "qa-entailment", "identity")]["filtered"]["mrr"] == pytest.approx(
        (rows[("tail", "qa-entailment", "identity")]["filtered"]["mrr"]
         + rows[("head", "qa-entailment", "identity")]["filtered"]["mrr"]) / 2)
    assert rows[("tail", "qa-entailment", "bm25")]["available"]
    # the record: command line, data and model fingerprints, environment
    assert record["command"].startswith("relsearch bench linkpred ") and "--both-directions" in record["command"]
    assert record["data"]["inputs"]["test"]["sha256"] == sha256_file(qa_data / "test.jsonl")
    assert record["model"]["fingerprint"] == Searcher(qa_index, qa_bundles[0]).bundle.fingerprint
    assert record["model"]["encoder"]["weights_sha256"]
    assert {"cpu", "logical_cpus", "torch_threads", "gpu"} <= set(record["environment"]["machine"])
    assert record["environment"]["packages"]["bm25s"] and record["environment"]["packages"]["numpy"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_linkpred_errors_are_clear(qa_data, qa_bundles, qa_index):
    runner = CliRunner()
    test = str(qa_data / "test.jsonl")
    res = runner.invoke(bench, ["linkpred", test, "--index", qa_index, "--model", qa_bundles[0], "-r", "nope"])
    assert res.exit_code != 0 and "available:" in res.output and "qa-entailment" in res.output
    res = runner.invoke(bench, ["linkpred", test, "--index", qa_index, "--candidates", test])
    assert res.exit_code != 0 and "exactly one of" in res.output
    res = runner.invoke(bench, ["linkpred", test, "--index", qa_index])  # the index's bundle has the relation
    assert res.exit_code == 0, res.output
    missing = qa_data / "missing.jsonl"
    write_jsonl(missing, [{"head": "What is it ?", "relation": "qa-entailment", "tail": "not in the index"}])
    res = runner.invoke(bench, ["linkpred", str(missing), "--index", qa_index, "--model", qa_bundles[0]])
    assert res.exit_code != 0 and "--skip-missing" in res.output


def test_bench_retrieval_and_sts_against_direct_computation(qa_bundles, tmp_path):
    texts = ["Banks lend money and take deposits.", "A retail bank offering mortgages.", "Insurance for homes and cars.",
             "Oil and gas exploration company.", "Offshore drilling for petroleum.", "Refines crude oil into fuels.",
             "Designs microchips for phones.", "Semiconductor foundry services.", "No label here.",
             "Banks lend money and take deposits."]
    labels = ["fin", "fin", "fin", "energy", "energy", "energy", "tech", "tech", None, "fin"]
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t, "sector": s, "split": "test"} for t, s in zip(texts, labels)])
    cache, out = str(tmp_path / "cache"), tmp_path / "r.json"
    res = CliRunner().invoke(bench, ["retrieval", str(corpus), "--aspect", "sector", "-k", "2", "-r", "qa-entailment",
                                     "--model", qa_bundles[0], "--cache", cache, "--json", str(out),
                                     "--plot", str(tmp_path / "r.png"), "--quiet"])
    assert res.exit_code == 0, res.output
    record = json.loads(out.read_text())
    assert record["counts"] == {"documents": 10, "no_text": 0, "no_label": 1, "duplicate_text": 1, "pool": 8, "labels": 3}
    bundle = load_bundle(qa_bundles[0])
    pool, lab = texts[:8], np.array(labels[:8])
    h = raw_vectors(bundle, pool, cache_dir=cache)  # the cached vectors: this test checks the metrics, not encoding
    for name in ("identity", "qa-entailment"):
        scores = bundle.operators[name].apply(h) @ normalize(h).T
        p, r, mrr = [], [], []
        for i in range(8):
            others = [j for j in np.argsort(-scores[i]) if j != i]  # the seed excluded
            rel = lab[others] == lab[i]
            p.append(rel[:2].sum() / 2)
            r.append(rel[:2].sum() / rel.sum())
            mrr.append(next((1 / (j + 1) for j, x in enumerate(rel[:2]) if x), 0.0))
        row = next(x for x in record["rows"] if x["method"] == name)
        assert (row["p@2"], row["r@2"], row["mrr@2"]) == pytest.approx((np.mean(p), np.mean(r), np.mean(mrr)), abs=1e-6)

    pairs = write_jsonl(tmp_path / "p.jsonl", [{"a": texts[i], "b": texts[j], "score": s} for i, j, s in
                                               [(0, 1, 4.5), (0, 3, 0.5), (3, 4, 4.0), (6, 7, 3.5), (2, 5, 1.0),
                                                (1, 2, 2.5), (4, 5, 3.0), (6, 0, 0.2)]])
    out = tmp_path / "s.json"
    res = CliRunner().invoke(bench, ["sts", str(pairs), "--model", qa_bundles[0], "-r", "qa-entailment", "--cache",
                                     cache, "--json", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    rec = [json.loads(line) for line in pairs.read_text().splitlines()]
    ha = raw_vectors(bundle, [x["a"] for x in rec], cache_dir=cache)
    hb = raw_vectors(bundle, [x["b"] for x in rec], cache_dir=cache)
    for name in ("identity", "qa-entailment"):
        pred = (bundle.operators[name].apply(ha) * normalize(hb)).sum(axis=1)
        expected = stats.spearmanr(pred, [x["score"] for x in rec]).statistic
        assert rows[name]["spearman"] == pytest.approx(expected, abs=1e-6)
    assert set(rows) == {"bm25", "identity", "qa-entailment"}


def test_companies_reports_every_method_for_industry_and_sector_and_cross_source(tmp_path):
    from relsearch.bench.companies import CompaniesJob, run_companies

    rows = [json.loads(line) for line in open(shared("russell3000_companies", "corpus.jsonl"))]
    picked = [r for r in rows if r["split"] == "test" and r.get("text") and r.get("text_wikipedia")][:60]
    corpus = tmp_path / "companies.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in picked))
    res = run_companies(CompaniesJob(corpus=str(corpus), cache_dir=str(tmp_path / "cache"), depth=10),
                        plot_out=str(tmp_path / "map.png"), json_out=str(tmp_path / "c.json"))
    methods = [r["method"] for r in res.payload["rows"]]
    assert methods[:2] == ["bm25", "identity"]
    heads = {f"{name} (re-ranks identity top 10)" for name in load_bundle(None).heads}  # the pack ships none now
    assert {"similar-company", "aspect:sector", "aspect:industry"} | heads <= set(methods)
    for r in res.payload["rows"]:
        for aspect in ("industry", "sector"):
            assert 0 <= r[aspect]["p@10"] <= 1 and r[aspect]["seeds"] > 0
    cross = {(c["source"], c["method"]) for c in res.payload["cross_source"]}
    assert ("wikipedia", "identity") in cross and ("wikipedia", "bm25") in cross
    assert (tmp_path / "map.png").stat().st_size > 0 and json.loads((tmp_path / "c.json").read_text())["companies"] == 60


@pytest.mark.slow
def test_hybrid_beats_bm25_and_identity_on_trecqa(tmp_path):
    """The issue's bar for local hybrid search, on the whole TrecQA test split (1,393 candidate
    sentences, 284 triples; the default pack): RRF of the operator and BM25 beats both baselines."""
    from relsearch.bench.linkpred import HYBRID, LinkPredJob, evaluate, load_candidates, read_triples

    pairs = [json.loads(line) for line in shared("trecqa", "pairs", "test.jsonl").read_text().splitlines()]
    write_jsonl(tmp_path / "cands.jsonl", [{"text": t} for t in dict.fromkeys(p["b"] for p in pairs)])
    test = read_triples(str(shared("trecqa", "triples", "test.jsonl")))
    known = [t for split in ("train", "dev") for t in read_triples(str(shared("trecqa", "triples", f"{split}.jsonl")))]
    cands = load_candidates(LinkPredJob(test="", candidates=str(tmp_path / "cands.jsonl"), progress=False),
                            [t["head"] for t in test])
    rows = evaluate(test, known, cands, ["bm25", "identity", HYBRID])["rows"]
    mrr = {r["method"]: r["filtered"]["mrr"] for r in rows if r["relation"] == "overall"}
    assert mrr[HYBRID] > mrr["bm25"] > mrr["identity"]


def test_bench_linkpred_scores_a_stored_recipe_as_the_index_runs_it(qa_data, qa_bundles, qa_index, tmp_path):
    """The `recipe` method: each triple's relation as `--relation NAME` runs it over an index."""
    from relsearch.encoder.bundle import load_bundle
    from relsearch.encoder.metrics import Ranks, ranking_metrics
    from relsearch.retrieval.request import SearchOptions, run
    from relsearch.retrieval.search import Query, Searcher

    bundle = load_bundle(qa_bundles[0])
    bundle.operators["qa-entailment"].info["recipe"] = {"mixture": {"qa-entailment": 0.5, "identity": 0.5},
                                                        "bm25": 0.3, "depth": 20}  # a pool smaller than the index
    path = str(bundle.save(tmp_path / "with-recipe"))
    out = tmp_path / "lp.json"
    result = CliRunner().invoke(bench, ["linkpred", str(qa_data / "test.jsonl"), "--index", qa_index, "--model", path,
                                        "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(out.read_text())["rows"] if r["method"] == "recipe"
               and r["relation"] == "qa-entailment" and r["direction"] == "tail")
    triples = [json.loads(line) for line in (qa_data / "test.jsonl").read_text().splitlines()]
    searcher = Searcher(qa_index, path)
    heads = list(dict.fromkeys(t["head"] for t in triples))
    ids = {json.loads(line)["text"]: json.loads(line)["id"] for line in (qa_data / "corpus.jsonl").read_text().splitlines()}
    # --id queries: the question itself leaves both lists, as the benchmark excludes the query's text
    pages = run(searcher, [Query(doc_id=ids[h], relations={"qa-entailment": 1.0}) for h in heads],
                SearchOptions(k=searcher.live_count))
    lo, hi = [], []
    for t in triples:
        ranked = [(h.text, h.score) for h in pages[heads.index(t["head"])] if h.text != t["head"]]
        others = {x["tail"] for x in triples if x["head"] == t["head"]} - {t["tail"]}
        gold = next(s for text, s in ranked if text == t["tail"])
        kept = [s for text, s in ranked if text not in others and text != t["tail"]]
        lo.append(1 + sum(s > gold + 1e-6 for s in kept))
        hi.append(lo[-1] + sum(abs(s - gold) <= 1e-6 for s in kept))
    expected = ranking_metrics(Ranks(np.array(lo), np.array(hi)), "realistic")
    # the recipe's pool and its normalisation are fixed by its depth, not by k: the two agree
    assert row["filtered"]["mrr"] == pytest.approx(expected["mrr"], abs=1e-4)


def test_linkpred_runs_a_query_encoder_once_per_distinct_query():
    """A tower's vectors are computed once per (operator, query) over the whole evaluation: the own,
    hybrid and recipe rows, and a query with several test tails, reuse them."""
    from types import SimpleNamespace

    from relsearch.bench.linkpred import Candidates

    seen = []

    def apply(h, texts):
        seen.extend(texts)
        return h * 2.0

    tower = SimpleNamespace(name="rel", needs_text=True, apply=apply)
    raw = {t: np.full(3, i, np.float32) for i, t in enumerate(["a", "b", "c"])}
    cands = Candidates(["x"], np.ones((1, 3), np.float32), raw, bundle=None, inputs={})
    first = cands.query_vectors(tower, ["a", "b", "a"])
    again = cands.query_vectors(tower, ["c", "b"])
    assert seen == ["a", "b", "c"]
    np.testing.assert_array_equal(first, [raw["a"] * 2, raw["b"] * 2, raw["a"] * 2])
    np.testing.assert_array_equal(again, [raw["c"] * 2, raw["b"] * 2])
