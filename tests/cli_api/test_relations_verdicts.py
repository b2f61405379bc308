"""`relsearch relations` and GET /relations say where a relation loses: its own test or its transfer set."""
from __future__ import annotations

import json

from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.encoder.bundle import Bundle
from relsearch.encoder.relations import Operator
from relsearch.retrieval.verdicts import losses

RECIPE = {"mixture": {"{name}": 1.0}, "bm25": 0.1, "title": 0.0, "same": {}, "depth": 100}


def _op(name: str, test: dict | None = None, transfer: dict | None = None) -> Operator:
    info = {"recipe": json.loads(json.dumps(RECIPE).replace("{name}", name))}
    if test is not None:
        info["whole_corpus"] = {"test": {**test, "queries": 10, "candidates": 100}}
    if transfer is not None:
        info["transfer"] = {"dataset": "Other forum", "metric": "mrr", "queries": 20, "candidates": 300,
                            "date": "2026-11-27", "commit": "abc1234", **transfer}
    return Operator(name=name, kind="identity", description=f"the {name} relation", info=info)


def tiny_bundle(folder):
    ops = {"winner": _op("winner", {"recipe": 0.6, "identity": 0.5, "bm25": 0.4, "hybrid": 0.55},
                         {"relation": 0.5, "identity": 0.45, "bm25": 0.3, "hybrid": 0.4}),
           "transfer-loser": _op("transfer-loser", {"recipe": 0.6, "identity": 0.5, "bm25": 0.4, "hybrid": 0.55},
                                 {"relation": 0.634, "identity": 0.647, "bm25": 0.39, "hybrid": 0.52}),
           "test-loser": _op("test-loser", {"recipe": 0.423, "identity": 0.39, "bm25": 0.413, "hybrid": 0.429}),
           "plain": Operator(name="plain", kind="identity", description="no figures at all")}
    Bundle(encoder={"model": "sentence-transformers/all-MiniLM-L6-v2", "dim": 384}, operators=ops).save(folder)
    return str(folder)


def test_the_listing_marks_a_relation_that_loses_and_shows_its_transfer_figure(tmp_path):
    model = tiny_bundle(tmp_path / "b")
    res = CliRunner().invoke(cli, ["relations", "--model", model])
    assert res.exit_code == 0, res.output
    blocks = {}
    for line in res.output.splitlines()[1:]:
        if not line.startswith("   " * 3):
            name = line.split()[0]
        blocks.setdefault(name, []).append(line.strip())
    assert "! loses to identity on Other forum (MRR 0.634 vs identity 0.647)" in blocks["transfer-loser"]
    assert any(line.startswith("transfer: Other forum, MRR 0.634 (identity 0.647, BM25 0.390, hybrid 0.520)")
               for line in blocks["transfer-loser"])
    assert "! loses to the hybrid on its own test (MRR 0.423 vs hybrid 0.429)" in blocks["test-loser"]
    assert not any(line.startswith("!") for line in blocks["winner"] + blocks["plain"])
    assert any(line.startswith("transfer: Other forum, MRR 0.500") for line in blocks["winner"])

    rows = {json.loads(line)["name"]: json.loads(line) for line in
            CliRunner().invoke(cli, ["relations", "--model", model, "--json"]).output.splitlines()}
    assert rows["transfer-loser"]["losses"] == ["loses to identity on Other forum (MRR 0.634 vs identity 0.647)"]
    assert rows["transfer-loser"]["transfer"]["relation"] == 0.634
    assert rows["winner"]["losses"] == [] and "losses" not in rows["plain"] and "transfer" not in rows["plain"]


def test_losses_name_every_rival_above_best_first():
    info = {"whole_corpus": {"test": {"recipe": 0.3, "identity": 0.35, "bm25": 0.4, "hybrid": 0.2}},
            "transfer": {"dataset": "X", "relation": 0.5, "identity": 0.5, "bm25": 0.1, "hybrid": 0.49}}
    assert losses(info) == ["loses to BM25 and identity on its own test (MRR 0.300 vs BM25 0.400, identity 0.350)"]
    assert losses({"whole_corpus": {"test": {"recipe": "x", "identity": 0.9}}, "transfer": []}) == []


def test_an_operator_without_a_recipe_is_judged_by_its_own_test_metric():
    aspect = {"metrics": {"metric": "p@10", "trained": {"p@10": 0.3}, "identity": {"p@10": 0.35}}}
    assert losses(aspect) == ["loses to identity on its own test (p@10 0.300 vs identity 0.350)"]
    aspect["metrics"]["trained"]["p@10"] = 0.4
    assert losses(aspect) == []
    # a whole-corpus test, when there is one, is what --relation runs: the operator's own metric is not asked
    assert losses({**aspect, "whole_corpus": {"test": {"recipe": 0.5, "identity": 0.4, "bm25": 0.1, "hybrid": 0.2}},
                   "metrics": {"metric": "mrr", "trained": {"mrr": 0.1}, "identity": {"mrr": 0.9}}}) == []


def test_an_operator_without_a_recipe_lists_its_whole_corpus_test(tmp_path):
    """An aspect operator measured by bench transfer on its own test: the listing shows that figure too."""
    test = {"recipe": 0.31, "operator": 0.31, "identity": 0.25, "bm25": 0.33, "hybrid": 0.3, "dataset": "Own set"}
    op = Operator(name="aspect:x", kind="identity", description="an aspect", info={"whole_corpus": {"test": test}})
    Bundle(encoder={"model": "sentence-transformers/all-MiniLM-L6-v2", "dim": 384}, operators={"aspect:x": op}).save(
        tmp_path / "b")
    out = CliRunner().invoke(cli, ["relations", "--model", str(tmp_path / "b")]).output
    assert ("runs: the operator alone; whole-corpus test on Own set, MRR 0.310 (identity 0.250, BM25 0.330, hybrid "
            "0.300)") in out
    assert "! loses to BM25 on its own test (MRR 0.310 vs BM25 0.330)" in out


def test_a_relation_shipped_as_identity_says_so_first():
    """relsearch train stored identity for a relation whose recipe lost on test (whole_corpus.fallback):
    its listing says so with both figures; a malformed record says nothing."""
    test = {"recipe": 0.614, "identity": 0.614, "bm25": 0.6, "hybrid": 0.62}
    info = {"whole_corpus": {"test": test, "fallback": {"recipe": {"mixture": {"r": 1.0}}, "test": 0.598,
                                                        "identity": 0.614, "tolerance": 0.005}}}
    assert losses(info) == ["ships as identity: its trained recipe ranked below identity on its own test "
                            "(MRR 0.598 vs identity 0.614)",
                            "loses to the hybrid on its own test (MRR 0.614 vs hybrid 0.620)"]
    info["whole_corpus"]["fallback"]["test"] = "0.598"
    assert losses(info) == ["loses to the hybrid on its own test (MRR 0.614 vs hybrid 0.620)"]
