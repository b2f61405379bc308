"""Peer companies mined from a company corpus's own texts: what ``similar-company`` is trained
and judged on (tools/build_pack.py, ``relsearch bench companies``).

"Same GICS sub-industry" is not what an analyst means by similar; the companies a description
names are closer ("one of the Big Four banks, along with ..."). For each company of the Russell
3000 corpus, its Wikipedia and Bloomberg texts are searched for the names of the *other*
companies of the corpus; a mention within the same GICS sector makes the two peers (both ways).
With ``competitors=True`` only mentions in a sentence that speaks of competition count: fewer
pairs (82 one-way in Russell 3000), closer to what an analyst calls a competitor. Nothing is
hand-listed: names come from the corpus's ``name`` field, cue words are generic.

Names → aliases: the legal suffixes are cut ("JPMorgan Chase & Co." → "JPMorgan Chase"), and the
first word of a multi-word name is an alias too when it is long. An alias is dropped when
- it names more than one company (ambiguous),
- it occurs as a lower-case word anywhere in the corpus ("american", "national": a common word),
- or the texts mentioning it come from more than ``MAX_SECTORS`` GICS sectors (a place or a
  generic name, e.g. "California", mentioned by companies of every kind).

    python -m relsearch.bench.peers russell3000_companies/corpus.jsonl > peers.jsonl

writes ``{"a", "b", "split_a", "split_b"}`` lines (a mentions b, or b mentions a) for inspection.
"""
from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

from ..indexer.belonging import short_name

MAX_SECTORS = 3
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CUE = re.compile(r"\b(compet\w*|rivals?|peers?|alongside|along with|Big (Three|Four|Five|Six)|"
                  r"one of the (largest|biggest|leading)|(second|third)?.?largest|"
                  # a ranking or a market shared with the named company: "ahead of Regal and Cinemark", "challenging Cisco's
                  # market share", "similar to tools developed by Microsoft and Okta"
                  r"market share|duopoly|oligopoly|ahead of|fell behind|second only to|challeng(er|ers|ing)|"
                  r"similar to|other (major|large|leading))\b", re.I)
MENTIONING = ("text_wikipedia", "text_bloomberg")
ALL_TEXTS = ("text",) + MENTIONING


def without_cues(text: str | None) -> str:
    """``text`` without its sentences that speak of competition (:data:`_CUE`): what a recipe part
    fitted against this judge may read of the texts it mines, never the sentences the gold comes from."""
    return " ".join(s for s in _SENTENCE.split(text or "") if not _CUE.search(s))


def _aliases(rows: list[dict]) -> dict[str, str]:
    candidates: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        name = short_name(r.get("name") or "")
        if len(name) >= 3:
            candidates[name].add(r["id"])
        words = name.split()
        if len(words) > 1 and len(words[0]) >= 4:
            candidates[words[0]].add(r["id"])
    text = " ".join(r.get(f) or "" for r in rows for f in ALL_TEXTS)
    common = set(re.findall(r"\b[a-z][a-z\-]+\b", text))
    return {a: next(iter(ids)) for a, ids in candidates.items() if len(ids) == 1 and a.lower() not in common}


def mine_peers(rows: list[dict], *, competitors: bool = False, max_sectors: int = MAX_SECTORS) -> set[tuple[str, str]]:
    """Ordered peer pairs (a, b), both directions, of companies in ``rows`` (corpus records with
    ``id``, ``name``, ``gics_sector`` and the texts). ``competitors``: only mentions in a sentence
    that speaks of competition (:data:`_CUE`: "competitors include ...", "one of the Big Four
    banks, alongside ...", "rival", "peer", "largest"), not acquisitions, customers or owners."""
    aliases = _aliases(rows)
    if not aliases:
        return set()
    pattern = re.compile(r"\b(" + "|".join(re.escape(a) for a in sorted(aliases, key=len, reverse=True)) + r")\b")
    by_id = {r["id"]: r for r in rows}
    sectors: dict[str, set] = defaultdict(set)
    for r in rows:
        for alias in set(pattern.findall(" ".join(r.get(f) or "" for f in ALL_TEXTS))):
            if aliases[alias] != r["id"]:
                sectors[alias].add(r.get("gics_sector"))
    peers = set()
    for r in rows:
        text = " ".join(r.get(f) or "" for f in MENTIONING)
        passages = [s for s in _SENTENCE.split(text) if _CUE.search(s)] if competitors else [text]
        for alias in {a for passage in passages for a in pattern.findall(passage)}:
            other = aliases[alias]
            if other != r["id"] and len(sectors[alias]) <= max_sectors and r.get("gics_sector") \
                    and by_id[other].get("gics_sector") == r["gics_sector"]:
                peers |= {(r["id"], other), (other, r["id"])}
    return peers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.split("\n\n")[-2].strip(), file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    split = {r["id"]: r.get("split") for r in rows}
    competitors = mine_peers(rows, competitors=True)
    for a, b in sorted(mine_peers(rows)):
        print(json.dumps({"a": a, "b": b, "split_a": split[a], "split_b": split[b], "competitor": (a, b) in competitors}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
