"""Normalise SemEval-2016 Task 3 subtask B (Qatar Living forum) into duplicate-question triples.

Source: github.com/diyessi/Iyas @ 83ac4ef9347e40d31cbb8a5689e56d1cc643c6a8,
semeval2016-3/data/Semeval2016-Task3-English-data/datasets/semeval2016-task3-cqa-ql-train/v2.0/
SemEval2016-Task3-CQA-QL-train-part1.xml (part2 and the dev/test files are not in that snapshot).

Each original question (OrgQuestion) comes with up to 10 forum questions a search engine returned, judged
PerfectMatch / Relevant / Irrelevant against it. PerfectMatch ("matches the question (almost) perfectly") is the
duplicate label; the other two are non-duplicates. This set is for checking that the pack's `duplicate-question`
transfers to another forum, so there is no train split: original questions are split dev/test (seeded).

    python tools/data/qatarliving_dupq.py --xml PART1.xml --out ../shared/data/qatarliving_dupq
"""
from __future__ import annotations

import argparse
import hashlib
import html
import json
import random
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

RELATION = "duplicate-question"
SEED = 13
DEV_FRACTION = 0.25


def clean(text: str | None) -> str:
    return re.sub(r"\s+", " ", html.unescape(text or "")).strip()


def question(subject: str | None, body: str | None) -> tuple[str, str]:
    title, body = clean(subject), clean(body)
    return title, (title + "\n" + body if body and body != title else title)


def doc_id(text: str) -> str:
    return "q" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def parse(xml_path: Path) -> list[dict]:
    """One entry per OrgQuestion: its text and [(related text, related title, label)]."""
    out = []
    for oq in ET.parse(xml_path).getroot().iter("OrgQuestion"):
        title, text = question(oq.findtext("OrgQSubject"), oq.findtext("OrgQBody"))
        related = []
        for rq in oq.iter("RelQuestion"):
            rtitle, rtext = question(rq.findtext("RelQSubject"), rq.findtext("RelQBody"))
            related.append({"text": rtext, "title": rtitle, "relevance": rq.get("RELQ_RELEVANCE2ORGQ"),
                            "relq_id": rq.get("RELQ_ID")})
        out.append({"orgq_id": oq.get("ORGQ_ID"), "text": text, "title": title, "related": related})
    return out


def write_jsonl(path: Path, rows) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--xml", type=Path, required=True, help="SemEval2016-Task3-CQA-QL-train-part1.xml")
    ap.add_argument("--out", type=Path, default=Path("../shared/data/qatarliving_dupq"))
    args = ap.parse_args()

    raw = args.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    if args.xml.resolve() != (raw / args.xml.name).resolve():
        shutil.copyfile(args.xml, raw / args.xml.name)

    orgs = parse(args.xml)
    ids = sorted({o["orgq_id"] for o in orgs}, key=lambda s: int(s.lstrip("Q")))
    random.Random(SEED).shuffle(ids)
    n_dev = round(len(ids) * DEV_FRACTION)
    split_of = {q: ("dev" if i < n_dev else "test") for i, q in enumerate(ids)}

    corpus: dict[str, dict] = {}
    pairs: dict[str, list] = {"dev": [], "test": []}  # plus triples/all.jsonl = dev + test (nothing trains here)
    for o in orgs:
        corpus.setdefault(o["text"], {"id": doc_id(o["text"]), "text": o["text"], "title": o["title"],
                                      "role": "original", "source_id": o["orgq_id"]})
        for r in o["related"]:
            corpus.setdefault(r["text"], {"id": doc_id(r["text"]), "text": r["text"], "title": r["title"],
                                          "role": "related", "source_id": r["relq_id"]})
            if r["text"] == o["text"]:
                continue  # a question is not its own duplicate
            pairs[split_of[o["orgq_id"]]].append({
                "a": o["text"], "b": r["text"], "label": int(r["relevance"] == "PerfectMatch"),
                "relevance": r["relevance"], "a_id": doc_id(o["text"]), "b_id": doc_id(r["text"]),
                "a_title": o["title"], "b_title": r["title"], "orgq_id": o["orgq_id"]})

    n_corpus = write_jsonl(args.out / "corpus.jsonl", corpus.values())
    print(f"corpus.jsonl: {n_corpus} distinct questions")
    for split, rows in pairs.items():
        write_jsonl(args.out / f"pairs/{split}.jsonl", rows)
        n = write_jsonl(args.out / f"triples/{split}.jsonl",
                        ({"head": p["a"], "relation": RELATION, "tail": p["b"]} for p in rows if p["label"]))
        heads = len({p["a"] for p in rows if p["label"]})
        print(f"{split}: {len({p['orgq_id'] for p in rows})} original questions, {len(rows)} pairs, "
              f"{n} duplicate triples ({heads} heads)")
    write_jsonl(args.out / "triples/all.jsonl", ({"head": p["a"], "relation": RELATION, "tail": p["b"]}
                                                for split in ("dev", "test") for p in pairs[split] if p["label"]))


if __name__ == "__main__":
    main()
