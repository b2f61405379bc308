"""Find a company corpus's texts that were scraped from another company's page, and write those
records without them (for ``relsearch index FIXES --append``, which replaces them).

The Russell 3000 corpus (../shared/data/russell3000_companies, scraped in 2020) gives 387
companies one of 155 Wikipedia intros that several companies share: 18 hold Alphabet's ("Alphabet
Inc. is an American multinational conglomerate ..."), 18 U.S. Bancorp's, 7 Apple's. Indexed as a
text of its own (docs/indexes.md, "Documents with several texts"), such a text makes American
Assets Trust a perfect match for GOOG. The rule needs no list of companies: a text held verbatim
by documents of different names belongs to those of them whose short name (legal suffixes cut,
bench/peers.py ``short_name``) it contains; the others lose it (the field set to null). Share
classes (GOOG and GOOGL: one name) keep theirs.

    python tools/data/misattributed_texts.py CORPUS.jsonl --field text_wikipedia > fixes.jsonl

prints to stderr how many texts were shared and how many records lost one.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from relsearch.bench.peers import short_name


def misattributed(rows: list[dict], field: str, name_field: str = "name") -> tuple[list[dict], int]:
    """(the records that hold another company's ``field`` text, with it set to None; how many
    distinct texts several names share)."""
    holders: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        text = r.get(field)
        if isinstance(text, str) and text.strip():
            holders[" ".join(text.split())].append(r)
    fixes, shared = [], 0
    for text, held in holders.items():
        if len({(r.get(name_field) or "").strip() for r in held}) < 2:
            continue  # one company (share classes included)
        shared += 1
        for r in held:
            name = short_name(r.get(name_field) or "")
            if not name or name.lower() not in text.lower():
                fixes.append({**r, field: None})
    return fixes, shared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus")
    parser.add_argument("--field", default="text_wikipedia")
    parser.add_argument("--name-field", default="name")
    args = parser.parse_args(argv)
    with open(args.corpus, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    fixes, shared = misattributed(rows, args.field, args.name_field)
    for r in fixes:
        sys.stdout.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{shared} {args.field} texts are held by companies of different names; {len(fixes)} records hold "
          "one that does not name them and are written without it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
