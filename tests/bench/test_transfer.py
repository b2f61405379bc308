"""relsearch bench transfer: each relation on a dataset its recipe never saw, through the query plan, into the pack."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from relsearch.bench.transfer import (CARD_HEADING, Task, TransferJob, TransferSet, card_section, filtered_ranks,
                                      paired_se, run_transfer, score_lists, with_card_section)
from relsearch.encoder.bundle import Bundle, load_bundle
from relsearch.encoder.relations import Operator, normalize
from relsearch.retrieval.verdicts import losses

from conftest import demo_texts, write_jsonl

QUERIES = 6


def test_filtered_ranks_count_only_the_non_gold_documents_above():
    assert filtered_ranks(["x", "g1", "y", "g2", "z"], {"g1", "g2", "g3"}) == {"g1": 2, "g2": 3}
    scores = score_lists([["x", "g1", "y", "g2"], ["g3"]], [["g1", "g2", "gone"], ["g3"]])
    assert scores["mrr"] == pytest.approx((1 / 2 + 1 / 3 + 0 + 1) / 4)  # a gold past the list counts 0
    assert scores["hits@10"] == pytest.approx(3 / 4)
    assert scores["first_hit"] == pytest.approx((1 / 2 + 1) / 2)
    assert paired_se([1.0, 0.0, 1.0], [0.0, 0.0, 0.0]) == pytest.approx(1 / 3)


def tiny_set(folder: Path) -> Task:
    """Companies of the demo corpus: each of the first QUERIES (as --id) → the next two descriptions."""
    texts = [json.loads(line)["text"] for line in (folder / "corpus.jsonl").read_text().splitlines()]
    docs = [{"id": f"c{i}", "text": t} for i, t in enumerate(texts)]
    queries = [{"id": f"c{i}", "gold": [f"c{(i + 1) % len(docs)}", f"c{(i + 2) % len(docs)}"]} for i in range(QUERIES)]
    return Task(docs, queries, "test set")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, encoder):
    """A data root with one dataset folder and a bundle whose relation "dup" runs a recipe with BM25."""
    root = tmp_path_factory.mktemp("transfer")
    (root / "data" / "tiny").mkdir(parents=True)
    write_jsonl(root / "data" / "tiny" / "corpus.jsonl", [{"text": t} for t in demo_texts(24)])
    dup = Operator(name="dup", kind="identity", description="a recipe over cosine and BM25",
                   info={"recipe": {"mixture": {"dup": 1.0}, "bm25": 0.5, "title": 0.0, "same": {}, "depth": 100}})
    Bundle(encoder=encoder.identity, operators={"dup": dup}).save(root / "bundle")
    return root


def test_bench_transfer_measures_each_method_through_the_plan_and_writes_the_pack(tiny, tmp_path):
    pack = tmp_path / "pack"
    pack.mkdir()
    for f in (tiny / "bundle").iterdir():
        (pack / f.name).write_bytes(f.read_bytes())
    (pack / "MODEL_CARD.md").write_text("# card\n\n## Notes\n\n- kept\n")
    job = TransferJob(data=(str(tiny / "data"),), model=str(pack), work=str(tmp_path / "work"), write_pack=str(pack),
                      precision="fp32", sets={"dup": TransferSet("dup", "Tiny companies", "tiny", tiny_set)},
                      own_tests={"dup": TransferSet("dup", "Tiny own test", "tiny", tiny_set)})
    res = run_transfer(job, command="relsearch bench transfer (test)")
    got = res.payload["relations"]["dup"]
    assert got["queries"] == QUERIES and got["pairs"] == 2 * QUERIES and got["candidates"] == 24

    # identity and BM25 recomputed here from the texts alone: the bench's ranks are the index's
    from relsearch.encoder.model import Encoder, EncoderConfig, encode_texts
    from relsearch.indexer.lexical import BM25

    texts = demo_texts(24)
    unit = normalize(encode_texts(Encoder(EncoderConfig(precision="fp32")), texts)[0])
    task = tiny_set(tiny / "data" / "tiny")
    golds = [q["gold"] for q in task.queries]

    def lists(scores):
        out = []
        for i in range(QUERIES):
            order = [j for j in np.argsort(-scores[i], kind="stable") if j != i]
            out.append([f"c{j}" for j in order])
        return out

    cosine = unit[:QUERIES] @ unit.T
    assert got["identity"] == pytest.approx(score_lists(lists(cosine), golds)["mrr"], abs=1e-4)
    lexical = BM25(texts).scores(texts[:QUERIES])
    assert got["bm25"] == pytest.approx(score_lists(lists(lexical), golds)["mrr"], abs=0.05)  # BM25 ties: list order
    assert got["relation"] != got["identity"]  # the recipe's BM25 share moved something: it ran the recipe

    stored = json.loads((pack / "bundle.json").read_text())
    entry = next(op for op in stored["operators"] if op["name"] == "dup")["transfer"]
    assert entry["dataset"] == "Tiny companies" and entry["metric"] == "mrr"
    assert entry["relation"] == pytest.approx(got["relation"], abs=1e-4)
    assert set(entry["hits@10"]) == {"relation", "identity", "bm25", "hybrid"} and entry["date"]
    assert load_bundle(str(pack)).operators["dup"].info["transfer"] == entry  # round trip through load
    # "dup" had no whole-corpus test: the same measurement of its own test split is stored as one
    own = load_bundle(str(pack)).operators["dup"].info["whole_corpus"]["test"]
    assert own["recipe"] == own["operator"] == pytest.approx(got["relation"], abs=1e-4)
    assert own["measured_by"] == "relsearch bench transfer" and own["dataset"] == "Tiny own test"
    card = (pack / "MODEL_CARD.md").read_text()
    assert CARD_HEADING in card and "| dup | Tiny companies |" in card and "- kept" in card
    run_transfer(job, command="again")  # the section is replaced, not added twice; the index is reused
    assert (pack / "MODEL_CARD.md").read_text().count(CARD_HEADING) == 1


def test_bench_transfer_refuses_what_it_cannot_measure(tiny):
    from relsearch.cli_bench import bench

    runner = CliRunner()
    res = runner.invoke(bench, ["transfer", "--data", str(tiny / "data"), "--model", str(tiny / "bundle"), "-r", "nope"])
    assert res.exit_code != 0 and "no transfer set for nope" in res.output
    res = runner.invoke(bench, ["transfer", "--data", str(tiny / "data"), "--model", str(tiny / "bundle"),
                                "-r", "qa-entailment"])
    assert res.exit_code != 0 and "the bundle has no relation qa-entailment" in res.output
    res = runner.invoke(bench, ["transfer", "--data", str(tiny / "data"), "-r", "qa-entailment", "--quiet"])
    assert res.exit_code != 0 and "dataset folder 'wikiqa' is in none of the --data roots" in res.output


def test_card_section_replaces_only_its_own_section():
    card = f"# t\n\n{CARD_HEADING}\n\nold\n\n## After\n\nstays\n"
    out = with_card_section(card, f"{CARD_HEADING}\n\nnew\n")
    assert "old" not in out and "new" in out and out.endswith("## After\n\nstays\n")
    bundle = Bundle(encoder={"model": "m", "dim": 4}, operators={"r": Operator(name="r", kind="identity", info={
        "whole_corpus": {"test": {"recipe": 0.5, "identity": 0.4, "bm25": 0.3, "hybrid": 0.45}},
        "transfer": {"dataset": "Other", "metric": "mrr", "relation": 0.3, "identity": 0.35, "bm25": 0.2,
                     "hybrid": 0.3}})})
    section = card_section(bundle)
    assert "| r | own test | 0.500 |" in section and "loses to identity on Other (MRR 0.300 vs identity 0.350)" in section
    assert losses(bundle.operators["r"].info) == ["loses to identity on Other (MRR 0.300 vs identity 0.350)"]


def test_a_malformed_transfer_entry_is_dropped_with_one_warning(tmp_path, caplog):
    Bundle(encoder={"model": "m", "dim": 4}, operators={"r": Operator(name="r", kind="identity", info={
        "transfer": {"dataset": "Other", "relation": "high", "identity": 0.4, "bm25": 0.2, "hybrid": 0.3}}),
        "s": Operator(name="s", kind="identity", info={"transfer": ["not", "an", "object"]})}).save(tmp_path / "b")
    with caplog.at_level(logging.WARNING):
        loaded = load_bundle(str(tmp_path / "b"))
    said = [r.getMessage() for r in caplog.records]
    assert any("operator 'r': transfer.relation must be a finite number, got a string; dropped" in m for m in said)
    assert any("operator 's': transfer must be an object, got a list; dropped" in m for m in said)
    assert loaded.operators["r"].info["transfer"] == {"dataset": "Other", "identity": 0.4, "bm25": 0.2, "hybrid": 0.3}
    assert "transfer" not in loaded.operators["s"].info
    assert losses(loaded.operators["r"].info) == []  # no relation figure left: no verdict


def test_a_fitted_whole_corpus_test_is_never_replaced():
    from relsearch.bench.transfer import _has_own_test

    fitted = Operator(name="r", kind="identity", info={"whole_corpus": {"test": {"recipe": 0.5}}})
    ours = Operator(name="r", kind="identity", info={"whole_corpus": {"test": {"recipe": 0.5,
                                                                               "measured_by": "relsearch bench transfer"}}})
    assert _has_own_test(fitted) and not _has_own_test(ours)
    assert not _has_own_test(Operator(name="r", kind="identity", info={"whole_corpus": {"not_fitted": "time budget"}}))
