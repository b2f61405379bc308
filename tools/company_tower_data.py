"""Triples for a ``similar-company`` query tower: the competitors the companies' own texts name.

Pairs come from :func:`relsearch.bench.peers.mine_peers` (``competitors=True``: a sentence about
competition, a ranking or a shared market names another company of the corpus in the same GICS
sector; both directions), texts are the descriptions an index of the corpus holds (``text``).
Splits are by company, held out both ways:

- train: pairs whose two companies are both training companies (a pair with a dev or test company
  never trains the tower, in either direction);
- dev / test: pairs whose query company is a dev / test company (the other company may be of any
  split: it is a document of the index, never a training query of that pair).

``candidates.jsonl`` holds every company description (the whole corpus, as an index of it holds
it), for ``relsearch train --candidates``: each training query's softmax contrasts its competitors
with every other company.

    python tools/company_tower_data.py --data ../shared/data --out company-tower-data
    relsearch train company-tower-data/train.jsonl --regime encoder --dev company-tower-data/dev.jsonl \\
        --test company-tower-data/test.jsonl --candidates company-tower-data/candidates.jsonl \\
        --lora-rank 8 --time-budget 20 --out company-tower
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RELATION = "similar-company"


def tower_triples(rows: list[dict]) -> dict[str, list[dict]]:
    """split → ``{"head", "relation", "tail"}`` triples of mined competitors (see the module docstring);
    ``rows``: corpus records with ``id``, ``name``, ``split``, ``gics_sector``, ``text`` and the other texts."""
    from relsearch.bench.peers import mine_peers

    rows = list({r["text"]: r for r in rows if isinstance(r.get("text"), str) and r["text"].strip()}.values())
    by_id = {r["id"]: r for r in rows}
    out: dict[str, list[dict]] = {"train": [], "dev": [], "test": []}
    for a, b in sorted(mine_peers(rows, competitors=True)):
        split_a, split_b = by_id[a].get("split"), by_id[b].get("split")
        if split_a == "train" and split_b != "train":
            continue  # the reverse of a dev/test company's pair: it would train on what dev/test asks
        if split_a in out:
            out[split_a].append({"head": by_id[a]["text"], "relation": RELATION, "tail": by_id[b]["text"],
                                 "head_id": a, "tail_id": b})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data", help="folder holding russell3000_companies/corpus.jsonl")
    ap.add_argument("--out", required=True, help="folder for train/dev/test.jsonl and candidates.jsonl")
    args = ap.parse_args(argv)
    corpus = Path(args.data) / "russell3000_companies" / "corpus.jsonl"
    if not corpus.is_file():
        ap.error(f"{corpus} does not exist; give --data, the prepared datasets folder (docs/datasets.md)")
    with open(corpus, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, triples in tower_triples(rows).items():
        (out / f"{split}.jsonl").write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in triples),
                                            encoding="utf-8")
        print(f"{split}: {len(triples)} triples, {len({t['head_id'] for t in triples})} query companies")
    texts = dict.fromkeys(r["text"] for r in rows if isinstance(r.get("text"), str) and r["text"].strip())
    (out / "candidates.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
                                          encoding="utf-8")
    print(f"candidates: {len(texts)} company descriptions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
