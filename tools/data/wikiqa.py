"""Normalise WikiQA (Yang, Yih & Meek, EMNLP 2015) answer-sentence selection into qa-entailment pairs and triples.

Source: github.com/rohantilva/Google-Like-Question-Answering-System @ 33b4bc236eebccb53dcfb396bfcccf3f88cf48dd,
data/WikiQA/WikiQA-{train,dev,test}.tsv.gz (the original Microsoft release, untokenised) and data/WikiQA/LICENSE.pdf
(Microsoft Research Data License Agreement: research and technology development use only).

Same shape as ../shared/data/trecqa (tools/data/trecqa.py):
pairs/{split}.jsonl {"a": question, "b": sentence, "label" 1/0, "qid"}; triples/{split}.jsonl
{"head", "relation": "qa-entailment", "tail"} (label 1); queries/{split}.jsonl {"qid", "question", "candidates",
"labels"}; plus sentences/{split}.jsonl {"text"}: the split's distinct candidate sentences, the whole-corpus
candidate list (what bench/suite.py prepare_inputs derives for TrecQA).

    python tools/data/wikiqa.py --raw DIR_WITH_TSV_GZ --out ../shared/data/wikiqa
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import shutil
from collections import OrderedDict
from pathlib import Path

RELATION = "qa-entailment"
SPLITS = ("train", "dev", "test")


def clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def write_jsonl(path: Path, rows) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def read_split(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [{"a": clean(r["Question"]), "b": clean(r["Sentence"]), "label": int(r["Label"]),
             "qid": r["QuestionID"], "sentence_id": r["SentenceID"], "doc_title": r["DocumentTitle"]} for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, required=True, help="folder holding WikiQA-{train,dev,test}.tsv.gz")
    ap.add_argument("--out", type=Path, default=Path("../shared/data/wikiqa"))
    args = ap.parse_args()

    raw = args.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in [f"WikiQA-{s}.tsv.gz" for s in SPLITS] + ["LICENSE.pdf"]:
        src = args.raw / name
        if src.exists() and src.resolve() != (raw / name).resolve():
            shutil.copyfile(src, raw / name)

    print("split  pairs  positives  questions  with-pos  with-pos-and-neg  sentences")
    for split in SPLITS:
        pairs = read_split(args.raw / f"WikiQA-{split}.tsv.gz")
        write_jsonl(args.out / f"pairs/{split}.jsonl", pairs)
        n_triples = write_jsonl(args.out / f"triples/{split}.jsonl", (
            {"head": p["a"], "relation": RELATION, "tail": p["b"]} for p in pairs if p["label"]))
        queries: OrderedDict[str, dict] = OrderedDict()
        for p in pairs:
            q = queries.setdefault(p["qid"], {"qid": p["qid"], "question": p["a"], "candidates": [], "labels": []})
            q["candidates"].append(p["b"])
            q["labels"].append(p["label"])
        write_jsonl(args.out / f"queries/{split}.jsonl", queries.values())
        n_sent = write_jsonl(args.out / f"sentences/{split}.jsonl",
                             ({"text": t} for t in dict.fromkeys(p["b"] for p in pairs)))
        with_pos = sum(1 for q in queries.values() if any(q["labels"]))
        clean_q = sum(1 for q in queries.values() if any(q["labels"]) and not all(q["labels"]))
        print(f"{split:<6} {len(pairs):>5}  {n_triples:>9}  {len(queries):>9}  {with_pos:>8}  {clean_q:>16}  {n_sent:>9}")


if __name__ == "__main__":
    main()
