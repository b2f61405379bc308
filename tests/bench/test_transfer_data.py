"""The duplicate-question transfer sets' normalisers (tools/data/qatarliving*_dupq.py) on tiny inline SemEval files."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

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
