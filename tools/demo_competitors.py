"""Measure ``similar-company`` on the default one-text index (``make demo``'s demo-index) against plain cosine,
BM25 and the RRF hybrid, by the competitors the Russell 3000 set's own texts name (bench/peers.py, competition
sentences) where both companies are in the demo corpus: each company an ``--id`` query, MRR@10 and hits@10
over every such pair as ``-k 10`` shows them.

A proxy, not a held-out test: the pairs come from the same sentences that judge the pack's recipe, so the
pairs of its train and dev companies were seen when its weights were chosen (the test ones were not).

    HF_HUB_OFFLINE=1 python tools/demo_competitors.py [--index demo-index] [--data ../shared/data]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import relsearch
from relsearch.bench.peers import mine_peers

METHODS = {"identity": {}, "bm25": {"hybrid": "weighted", "hybrid_weight": 0.0},  # BM25's list alone
           "hybrid": {"hybrid": "rrf"}, "similar-company": {"relations": {"similar-company": 1.0}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", default="demo-index")
    ap.add_argument("--data", default="../shared/data", help="folder holding the shared datasets")
    args = ap.parse_args(argv)
    russell = [json.loads(line) for line in Path(args.data, "russell3000_companies/corpus.jsonl").open(encoding="utf-8")]
    index = relsearch.open_index(args.index)
    demo = {json.loads(line)["id"] for line in Path("relsearch/data/sp500_2017.jsonl").open(encoding="utf-8")}
    named: dict[str, set[str]] = {}
    for a, b in sorted(mine_peers(russell, competitors=True)):
        if a in demo and b in demo and a != b:
            named.setdefault(a, set()).add(b)
    pairs = sum(map(len, named.values()))
    print(f"{pairs} competitor pairs (one way) among {len(named)} demo companies, index {args.index}")
    for method, options in METHODS.items():
        ranks = []
        for a, wanted in named.items():
            got = [hit.id for hit in index.search(id=a, k=10, **options)]
            ranks += [got.index(b) + 1 if b in got else None for b in wanted]
        mrr = sum(1 / r for r in ranks if r) / pairs
        print(f"{method:16} MRR@10 {mrr:.3f}  hits@10 {sum(r is not None for r in ranks) / pairs:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
