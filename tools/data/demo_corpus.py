"""Write the demo corpus, relsearch/data/sp500_2017.jsonl: the shared S&P 500 (2017) descriptions with the
GICS industry group, industry and sub-industry codes of each company that the shared Russell 3000 set
classifies, joined by ticker.

Why: the pack's ``similar-company`` recipe gives bonuses for sharing ``gics_sub_industry_code`` and
``gics_industry_code`` and mentions within them (fitted on the Russell 3000, which has the codes). The S&P
set names sub-industries but has no codes, so on the default index those parts never applied and the
relation was dense + BM25 + prominence alone.

Sources (docs/datasets.md):
- ``sp500_companies/corpus_2017.jsonl``: every field, unchanged (relsearch/data/README.md says where from);
- ``russell3000_companies/corpus.jsonl``: ``gics_industry_group_code``, ``gics_industry_code``,
  ``gics_sub_industry_code`` (2020, from that set's ticker_to_gics.csv), for the tickers it holds.
  A company it does not hold keeps no code (the bonuses do not apply to it): nothing is guessed.

    python tools/data/demo_corpus.py --data ../shared/data --out relsearch/data/sp500_2017.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

CODES = ("gics_industry_group_code", "gics_industry_code", "gics_sub_industry_code")


def demo_rows(sp500: list[dict], russell: list[dict]) -> list[dict]:
    """``sp500``'s rows in order, each with the CODES that ``russell`` gives its ticker."""
    codes = {r["id"]: {c: r[c] for c in CODES if r.get(c)} for r in russell}
    return [{**row, **codes.get(row["id"], {})} for row in sp500]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data", help="folder holding the shared datasets")
    ap.add_argument("--out", default="relsearch/data/sp500_2017.jsonl")
    args = ap.parse_args(argv)
    read = lambda path: [json.loads(line) for line in Path(args.data, path).read_text(encoding="utf-8").splitlines()]  # noqa: E731
    rows = demo_rows(read("sp500_companies/corpus_2017.jsonl"), read("russell3000_companies/corpus.jsonl"))
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    coded = sum(CODES[-1] in r for r in rows)
    print(f"{args.out}: {len(rows)} companies, {coded} with GICS codes from the Russell 3000 set")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
