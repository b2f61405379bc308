"""Filtered tail-prediction MRR and Hits@1/3/10 of ``relsearch query --queries ... --json`` answers on the
text knowledge graph tools/data/codex.py writes (``queries/test.jsonl``, ``triples/{train,dev,test}.jsonl``).

Each test triple (h, r, t) is ranked by the position of t among its query's answers once the other known
tails of (h, r) in train/dev/test and h itself are removed (the filtered protocol); a tail absent from the
answers counts 0, so ask for enough answers (``-k 100``: a rank past 100 would add at most 0.01).

    relsearch query --queries D/queries/test.jsonl --index IDX --model B -k 100 --json > answers.jsonl
    python tools/data/codex_query_mrr.py answers.jsonl D
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("answers", type=Path, help="the --json output of relsearch query --queries")
    ap.add_argument("data", type=Path, help="the folder tools/data/codex.py wrote")
    args = ap.parse_args()

    known: dict[tuple[str, str], set[str]] = defaultdict(set)
    for split in ("train", "dev", "test"):
        for line in (args.data / f"triples/{split}.jsonl").open(encoding="utf-8"):
            row = json.loads(line)
            known[(row["head_id"], row["relation"])].add(row["tail_id"])
    queries = {q["id"]: q for q in map(json.loads, (args.data / "queries/test.jsonl").open(encoding="utf-8"))}
    ranks = []
    for line in args.answers.open(encoding="utf-8"):
        if not line.startswith("{"):
            continue
        answer = json.loads(line)
        query = queries[answer["query_id"]]
        head = query["id"].split("|")[0]
        ids = [hit["id"] for hit in answer["results"]]
        for gold in query["answers"]:
            left_out = (known[(head, query["relation"])] - {gold}) | {head}
            kept = [i for i in ids if i not in left_out]
            ranks.append(kept.index(gold) + 1 if gold in kept else None)
    n = len(ranks)
    found = [r for r in ranks if r]
    print(json.dumps({"triples": n, "mrr": round(sum(1 / r for r in found) / n, 4),
                      **{f"hits@{k}": round(sum(r <= k for r in found) / n, 4) for k in (1, 3, 10)}}))


if __name__ == "__main__":
    main()
