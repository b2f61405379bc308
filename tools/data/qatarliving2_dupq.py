"""Normalise the rest of SemEval-2016 Task 3 subtask B (Qatar Living forum) into a second duplicate-question set.

Source: github.com/whiskeyromeo/CommunityQuestionAnswering @ 6408cbaacd24212a6998ccd85c1e23199b005c56 (files last
changed at 56b1b9d1fc5f026e46cc5caa568f141161c472e3): Data/train/SemEval2016-Task3-CQA-QL-train-part2.xml and
Data/dev/SemEval2016-Task3-CQA-QL-dev.xml, the organisers' files as released (the same v2.0 format as part1, which
tools/data/qatarliving_dupq.py normalises). Licence (the organisers' README, v2.0): "free for general research use",
cite Nakov et al., SemEval-2016 Task 3. The repository holds Qatar Living and SemEval scorer files only.

Part 2 of the training data and the development data hold original questions Q201-Q317. Their texts are not new:
the part1 file of the snapshot qatarliving_dupq reads (Q1-Q103) repeats them, and every one of its 613 judged pairs is
among this set's 1,170 (26 labelled otherwise): this is a larger sample of the same forum, not a second forum.
Splits are the data's own:
part2's original questions are ``dev`` (what a recipe may be chosen on), the SemEval dev file's are ``test``.
PerfectMatch = duplicate (label 1), Relevant / Irrelevant = not (label 0), as in qatarliving_dupq.

Written to ``--out`` in meta_se_dupq's shape: corpus.jsonl {"id", "text", "title", "role", "source_id"},
pairs/{dev,test}.jsonl {"a", "b", "label", "relevance", "a_id", "b_id", "a_title", "b_title", "orgq_id"},
triples/{dev,test,all}.jsonl {"head", "relation": "duplicate-question", "tail"} (label 1), raw/ the two XML files.

    python tools/data/qatarliving2_dupq.py --part2 PART2.xml --dev DEV.xml --out ../shared/data/qatarliving2_dupq
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path


def _qatarliving():
    """tools/data/qatarliving_dupq.py (its parser and writers), loaded by path: tools/ is no package."""
    spec = importlib.util.spec_from_file_location("qatarliving_dupq", Path(__file__).with_name("qatarliving_dupq.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


QL = _qatarliving()


def normalise(sources: dict[str, Path]) -> tuple[list[dict], dict[str, list[dict]]]:
    """``sources`` split → XML file; returns (corpus rows, split → pair rows), every original question in the
    split of its file. A forum question equal to its original question is no pair."""
    corpus: dict[str, dict] = {}
    pairs: dict[str, list[dict]] = {split: [] for split in sources}
    for split, xml in sources.items():
        for o in QL.parse(xml):
            corpus.setdefault(o["text"], {"id": QL.doc_id(o["text"]), "text": o["text"], "title": o["title"],
                                          "role": "original", "source_id": o["orgq_id"]})
            for r in o["related"]:
                corpus.setdefault(r["text"], {"id": QL.doc_id(r["text"]), "text": r["text"], "title": r["title"],
                                              "role": "related", "source_id": r["relq_id"]})
                if r["text"] != o["text"]:
                    pairs[split].append({
                        "a": o["text"], "b": r["text"], "label": int(r["relevance"] == "PerfectMatch"),
                        "relevance": r["relevance"], "a_id": QL.doc_id(o["text"]), "b_id": QL.doc_id(r["text"]),
                        "a_title": o["title"], "b_title": r["title"], "orgq_id": o["orgq_id"]})
    return list(corpus.values()), pairs


def write(out: Path, corpus: list[dict], pairs: dict[str, list[dict]]) -> None:
    print(f"corpus.jsonl: {QL.write_jsonl(out / 'corpus.jsonl', corpus)} distinct questions")
    for split, rows in pairs.items():
        QL.write_jsonl(out / f"pairs/{split}.jsonl", rows)
        n = QL.write_jsonl(out / f"triples/{split}.jsonl", ({"head": p["a"], "relation": QL.RELATION, "tail": p["b"]}
                                                            for p in rows if p["label"]))
        heads = len({p["a"] for p in rows if p["label"]})
        print(f"{split}: {len({p['orgq_id'] for p in rows})} original questions, {len(rows)} pairs, "
              f"{n} duplicate triples ({heads} heads)")
    QL.write_jsonl(out / "triples/all.jsonl", ({"head": p["a"], "relation": QL.RELATION, "tail": p["b"]}
                                               for rows in pairs.values() for p in rows if p["label"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part2", type=Path, required=True, help="SemEval2016-Task3-CQA-QL-train-part2.xml")
    ap.add_argument("--dev", type=Path, required=True, help="SemEval2016-Task3-CQA-QL-dev.xml")
    ap.add_argument("--out", type=Path, default=Path("../shared/data/qatarliving2_dupq"))
    args = ap.parse_args()
    raw = args.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for xml in (args.part2, args.dev):
        if xml.resolve() != (raw / xml.name).resolve():
            shutil.copyfile(xml, raw / xml.name)
    write(args.out, *normalise({"dev": args.part2, "test": args.dev}))


if __name__ == "__main__":
    main()
