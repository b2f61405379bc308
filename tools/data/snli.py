"""Normalise a public subset of SNLI 1.0 (Bowman et al., EMNLP 2015) into contradiction and entailment triples.

Source: github.com/Deltaus/sBiMPM @ 8f1b040cd1a4b5ef3515a14b2a401906a5b82bbf, snli_1.0/snli_1.0_{dev,test}.jsonl:
the official SNLI 1.0 jsonl format (gold_label, sentence1, sentence2, captionID, pairID, annotator_labels), but
1,277 test and 1,289 dev lines, not the official 10,000 each (the repository does not say how they were chosen;
snli_1.0_train.jsonl is too large for the snapshot). Licence: SNLI 1.0 is CC BY-SA 4.0 (Stanford NLP); the premises
are Flickr30k captions.

This set checks that the pack's ``contradiction`` (trained on SICK) carries over to another inference corpus: there is
no train split. Pairs whose gold label is "-" (no annotator majority) are dropped.

Counts (test): 1,254 labelled pairs — 420 contradiction, 405 entailment, 429 neutral; 1,674 distinct sentences; 7 of
them also occur in SICK (case and final period ignored), 82 among the Flickr8k captions.

    python tools/data/snli.py --raw DIR_WITH_JSONL --out DATA/snli

Writes pairs/{split}.jsonl {"a": premise, "b": hypothesis, "label", "pair_id", "caption_id"};
triples/{split}.jsonl {"head": premise, "relation": "contradiction" | "entailment", "tail": hypothesis};
sentences/{split}.jsonl {"text"}: every distinct premise and hypothesis of the split (the whole corpus an index
of the split holds).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from collections import Counter
from pathlib import Path

SPLITS = ("dev", "test")
RELATIONS = ("contradiction", "entailment")


def clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def write_jsonl(path: Path, rows) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def read_split(path: Path) -> list[dict]:
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r["gold_label"] == "-":
                continue
            pairs.append({"a": clean(r["sentence1"]), "b": clean(r["sentence2"]), "label": r["gold_label"],
                          "pair_id": r["pairID"], "caption_id": r["captionID"]})
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, required=True, help="folder holding snli_1.0_{dev,test}.jsonl")
    ap.add_argument("--out", type=Path, default=Path("../shared/data/snli"))
    args = ap.parse_args()

    raw = args.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        src = args.raw / f"snli_1.0_{split}.jsonl"
        if src.resolve() != (raw / src.name).resolve():
            shutil.copyfile(src, raw / src.name)
    for split in SPLITS:
        pairs = read_split(args.raw / f"snli_1.0_{split}.jsonl")
        write_jsonl(args.out / f"pairs/{split}.jsonl", pairs)
        write_jsonl(args.out / f"triples/{split}.jsonl", ({"head": p["a"], "relation": p["label"], "tail": p["b"]}
                                                          for p in pairs if p["label"] in RELATIONS))
        n = write_jsonl(args.out / f"sentences/{split}.jsonl",
                        ({"text": t} for t in dict.fromkeys(x for p in pairs for x in (p["a"], p["b"]))))
        print(f"{split}: {len(pairs)} pairs {dict(Counter(p['label'] for p in pairs))}, {n} distinct sentences")


if __name__ == "__main__":
    main()
