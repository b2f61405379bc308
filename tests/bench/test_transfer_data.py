"""The duplicate-question transfer sets' normalisers (tools/data/qatarliving*_dupq.py) on tiny inline SemEval files."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from relsearch.bench.transfer import qatarliving

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "data"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _xml(orgs: list[tuple[str, str, str, list[tuple[str, str, str, str]]]]) -> str:
    """A SemEval-2016 Task 3 file: each (ORGQ_ID, subject, body, [(RELQ_ID, subject, body, relevance)])."""
    out = ['<?xml version="1.0" encoding="utf-8"?>', '<xml version="1.0">']
    for qid, subject, body, related in orgs:
        for rid, rsubject, rbody, relevance in related:  # one OrgQuestion element per thread, as the organisers write
            out += [f'<OrgQuestion ORGQ_ID="{qid}"><OrgQSubject>{subject}</OrgQSubject><OrgQBody>{body}</OrgQBody>',
                    f'<Thread THREAD_SEQUENCE="{rid}"><RelQuestion RELQ_ID="{rid}" '
                    f'RELQ_RELEVANCE2ORGQ="{relevance}"><RelQSubject>{rsubject}</RelQSubject>'
                    f'<RelQBody>{rbody}</RelQBody></RelQuestion></Thread></OrgQuestion>']
    return "\n".join(out + ["</xml>"])


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_qatarliving2_keeps_each_file_as_its_split_and_perfect_matches_as_duplicates(tmp_path, monkeypatch):
    part2, dev = tmp_path / "part2.xml", tmp_path / "dev.xml"
    part2.write_text(_xml([("Q201", "Good bank?", "Which bank is good in  Doha &amp; why",
                            [("Q201_R1", "Best bank", "Which bank do you use", "PerfectMatch"),
                             ("Q201_R2", "Car loan", "Any car loan offers", "Irrelevant"),
                             ("Q201_R3", "Good bank?", "Which bank is good in Doha &amp; why", "PerfectMatch")])]))
    dev.write_text(_xml([("Q268", "Visa", "How long is a visit visa", [
        ("Q268_R1", "Visit visa length", "How many days on a visit visa", "PerfectMatch"),
        ("Q268_R2", "Best bank", "Which bank do you use", "Relevant")])]))
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["qatarliving2_dupq.py", "--part2", str(part2), "--dev", str(dev), "--out", str(out)])
    _load("qatarliving2_dupq").main()

    corpus = _rows(out / "corpus.jsonl")
    assert [r["text"] for r in corpus] == ["Good bank?\nWhich bank is good in Doha & why", "Best bank\nWhich bank do you use",
                                           "Car loan\nAny car loan offers", "Visa\nHow long is a visit visa",
                                           "Visit visa length\nHow many days on a visit visa"]
    assert corpus[0]["title"] == "Good bank?" and corpus[0]["id"].startswith("q") and corpus[0]["role"] == "original"
    dev_pairs, test_pairs = _rows(out / "pairs/dev.jsonl"), _rows(out / "pairs/test.jsonl")
    assert [(p["orgq_id"], p["label"], p["relevance"]) for p in dev_pairs] == [("Q201", 1, "PerfectMatch"),
                                                                              ("Q201", 0, "Irrelevant")]  # not itself
    assert [(p["orgq_id"], p["label"]) for p in test_pairs] == [("Q268", 1), ("Q268", 0)]
    assert _rows(out / "triples/dev.jsonl") == [{"head": corpus[0]["text"], "relation": "duplicate-question",
                                                 "tail": corpus[1]["text"]}]
    assert len(_rows(out / "triples/all.jsonl")) == 2
    assert sorted(p.name for p in (out / "raw").iterdir()) == ["dev.xml", "part2.xml"]

    task = qatarliving(out)  # what bench transfer asks of the set: each original (--id) → its duplicates
    ids = {d["text"]: d["id"] for d in task.documents}
    assert task.queries == [{"id": ids[corpus[0]["text"]], "gold": [ids[corpus[1]["text"]]]},
                            {"id": ids[corpus[3]["text"]], "gold": [ids[corpus[4]["text"]]]}]


def test_forum_grid_chooses_with_each_forum_weighing_the_same_and_leaves_the_measured_forum_out():
    grid = _load("dupq_forum_grid")
    # forum a: 4 dev pairs favour "0/0" a little; forum b: 1 dev pair favours "1/0" a lot
    ranks = {"a": {"dev": {"rr": {"0/0": [1, 1, 1, 1], "1/0": [1, 1, 1, 0.5]}},
                   "test": {"rr": {"0/0": [1, 0.5], "1/0": [0.5, 0.5], "0.25/0.1": [1, 1]}, "query": [0, 1], "queries": 2}},
             "b": {"dev": {"rr": {"0/0": [0.1], "1/0": [1]}},
                   "test": {"rr": {"0/0": [0.2, 0.2], "1/0": [1, 0.5], "0.25/0.1": [0.2, 0.2]}, "query": [0, 1],
                            "queries": 2}}}
    keys = ["0/0", "1/0"]
    assert grid.choose(ranks, ["a"], keys) == "0/0" and grid.choose(ranks, ["b"], keys) == "1/0"
    assert grid.choose(ranks, ["a", "b"], keys) == "1/0"  # pooled by pairs, forum a's 4 pairs would choose 0/0
    assert grid.paired_se([1, 0, 1], [0, 0, 0], np.asarray([0, 1, 2])) == pytest.approx(1 / 3)
    for forum in ranks:
        for split in ("dev",):
            ranks[forum][split]["rr"]["0.25/0.1"] = ranks[forum][split]["rr"]["0/0"]
    lines = grid.report(ranks, "0.25/0.1")
    assert any(line.strip().startswith("b test") and "leave b out [0/0]" in line for line in lines)
