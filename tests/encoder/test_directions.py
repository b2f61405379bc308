"""Link prediction in both directions (encoder/training/directions.py): tail through R, head through
R^-1 and their mean, from the operators' own test figures; in the trainer's report and the card, and
end to end for a tiny graph trained with --inverse."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from relsearch.encoder.bundle import Bundle
from relsearch.encoder.metrics import METRIC_KEYS
from relsearch.encoder.relations import Operator
from relsearch.encoder.training.card import render_model_card, summary_lines
from relsearch.encoder.training.directions import both_directions, direction_lines

from conftest import write_jsonl


def _op(name, queries, mrr, hits, identity_mrr=0.01):
    def figures(m, h):
        return {"mrr": m, "mr": 1 / m, "hits@1": h / 2, "hits@3": h, "hits@10": min(1.0, 2 * h)}

    metrics = {"split": "test", "protocol": "p", "queries": queries, "candidates": 50,
               "trained": figures(mrr, hits), "identity": figures(identity_mrr, 0.0)}
    return Operator(name=name, kind="linear", params={"W": np.eye(2, dtype="f"), "b": np.zeros(2, "f")},
                    info={"metrics": metrics})


def test_tail_head_and_mean_are_micro_over_each_directions_queries():
    ops = {"a": _op("a", 10, 0.6, 0.4), "a^-1": _op("a^-1", 10, 0.2, 0.2),
           "b": _op("b", 30, 0.4, 0.2), "b^-1": _op("b^-1", 30, 0.1, 0.0),
           "c": _op("c", 5, 0.9, 0.9)}  # no inverse: left out of both directions
    out = both_directions(ops)
    t = out["trained"]
    assert out["relations"] == 2 and out["queries"] == {"tail": 40, "head": 40}
    assert t["mrr_tail"] == pytest.approx((10 * 0.6 + 30 * 0.4) / 40)
    assert t["mrr_head"] == pytest.approx((10 * 0.2 + 30 * 0.1) / 40)
    assert t["mrr"] == pytest.approx((t["mrr_tail"] + t["mrr_head"]) / 2, abs=1e-5)
    assert {f"{k}{s}" for k in METRIC_KEYS for s in ("", "_tail", "_head")} == set(t)
    assert t["hits@10_head"] == pytest.approx((10 * 0.4 + 0) / 40)
    assert out["per_relation"]["a"]["trained"]["mrr"] == pytest.approx(0.4)
    assert out["identity"]["mrr"] == pytest.approx(0.01)
    assert both_directions({"a": ops["a"], "c": ops["c"]}) is None  # no inverse: nothing to combine
    lines = direction_lines(out)
    assert lines[0].startswith("link prediction, both directions (2 relations, 40 tail and 40 head test queries")
    assert f"MRR {t['mrr']:.3f} (tail {t['mrr_tail']:.3f}, head {t['mrr_head']:.3f})" in lines[0]
    assert "hits@1" in lines[1] and "hits@3" in lines[1] and "hits@10" in lines[1]


def test_the_report_and_card_show_both_directions():
    ops = {"a": _op("a", 10, 0.6, 0.4), "a^-1": _op("a^-1", 10, 0.2, 0.2)}
    bundle = Bundle(encoder={"model": "toy", "dim": 2}, operators=ops, info={"link_prediction": both_directions(ops)})
    assert any("MRR 0.400 (tail 0.600, head 0.200)" in line for line in summary_lines(bundle))
    card = render_model_card(bundle)
    assert "## Link prediction in both directions" in card
    assert "| **overall** | 10 / 10 | 0.600 / 0.200 / **0.400** |" in card


def test_training_with_inverse_reports_tail_head_and_mean(tmp_path):
    """A tiny graph: the adapter trained with --inverse and --test; the bundle records, and the
    command prints, the figures of both directions, each equal to its operator's own."""
    from relsearch.cli import cli
    from relsearch.encoder.bundle import load_bundle

    people = ["Ada Lovelace was an English mathematician.", "Alan Turing was an English computer scientist.",
              "Marie Curie was a Polish and French physicist.", "Niels Bohr was a Danish physicist.",
              "Enrico Fermi was an Italian physicist.", "Lise Meitner was an Austrian physicist."]
    places = ["London is the capital of England.", "Warsaw is the capital of Poland.",
              "Copenhagen is the capital of Denmark.", "Rome is the capital of Italy.", "Vienna is the capital of Austria."]
    born = [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
    rows = [{"head": people[p], "relation": "born in", "tail": places[c]} for p, c in born]
    train = write_jsonl(tmp_path / "train.jsonl", rows[:4])
    test = write_jsonl(tmp_path / "test.jsonl", rows[4:])
    result = CliRunner().invoke(cli, ["train", str(train), "--test", str(test), "--inverse", "--epochs", "2",
                                      "--out", str(tmp_path / "b"), "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    assert result.exit_code == 0, result.output
    bundle = load_bundle(str(tmp_path / "b"))
    lp = bundle.info["link_prediction"]
    tail, head = (bundle.operators[n].info["metrics"]["trained"] for n in ("born in", "born in^-1"))
    assert lp["queries"] == {"tail": 2, "head": 2}
    assert lp["trained"]["mrr_tail"] == pytest.approx(tail["mrr"]) and lp["trained"]["mrr_head"] == pytest.approx(head["mrr"])
    assert lp["trained"]["mrr"] == pytest.approx((tail["mrr"] + head["mrr"]) / 2, abs=1e-5)
    assert f"(tail {tail['mrr']:.3f}, head {head['mrr']:.3f})" in result.output
    assert "training stopped by" in result.output
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["info"]["link_prediction"]["relations"] == 1
