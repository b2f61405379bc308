"""Normalise CoDEx-M (Safavi & Koutra, EMNLP 2020) into a text knowledge graph for link prediction.

Sources:
- triples and relation labels: github.com/tsafavi/codex @ 3132e426c2a6b643b70bad679905a3a6270be440,
  data/triples/codex-m/{train,valid,test}.txt (tab-separated Wikidata ids) and data/relations/en/relations.json;
  LICENSE: MIT.
- entity texts: the English Wikipedia page extracts CoDEx ships as data/entities/en/extracts.zip; that zip and
  entities.json are too large for the mirror this was built from, so the extracts come unzipped from a copy of
  the CoDEx data in github.com/pshih6/KBAT @ 5f13a2f07aa5c401ba9cf9115874017420bf07d8,
  data/entities/en/extracts/Q*.txt. Wikipedia text is CC BY-SA; Wikidata (ids, relation labels) CC0.

Written (``--out``, default ../shared/data/codex_m):
- ``entities.jsonl`` ``{"id": Wikidata id, "text"}``: every entity of the kept triples, its text the first
  ``--sentences`` sentences of its extract, at most ``--max-words`` words (what ``relsearch index`` and
  ``relsearch train --candidates`` read);
- ``triples/{train,dev,test}.jsonl`` ``{"head", "relation", "tail", "head_id", "tail_id"}``: entity texts, the
  relation's English label (``valid`` becomes ``dev``);
- ``queries/test.jsonl`` ``{"id", "text", "relation", "answers"}``: one tail-prediction query per distinct
  (head, relation) of the test split, its test tails' ids in ``answers`` (``relsearch query --queries``);
- ``README.md``: source, licence, counts.

Triples whose head or tail has no extract (699 of CoDEx-M's 17,050 entities) are dropped and counted. The
output is deterministic: files keep CoDEx's order, entities are sorted by id; there is no sampling.

    git --git-dir=CODEX.git archive 3132e42 data/triples/codex-m data/relations/en LICENSE | tar x -C RAW
    git --git-dir=KBAT.git archive 5f13a2f data/entities/en/extracts | tar x -C RAW
    python tools/data/codex.py --raw RAW --out ../shared/data/codex_m
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

CODEX_COMMIT = "3132e426c2a6b643b70bad679905a3a6270be440"
EXTRACTS_COMMIT = "5f13a2f07aa5c401ba9cf9115874017420bf07d8"
SPLITS = {"train": "train", "dev": "valid", "test": "test"}
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def clean(text: str) -> str:
    text = re.sub(r"\(\s*[;,]?\s*\)", "", text)  # pronunciation brackets the extraction emptied: "( )", "(; )"
    return re.sub(r"\s+", " ", text).strip()


def entity_text(extract: str, sentences: int, max_words: int) -> str:
    """The first ``sentences`` sentences of ``extract``, cut to ``max_words`` words."""
    first = " ".join(SENTENCE_END.split(clean(extract))[:sentences])
    words = first.split()
    return " ".join(words[:max_words]) + (" …" if len(words) > max_words else "")


def read_triples(path: Path) -> list[tuple[str, str, str]]:
    rows = [line.rstrip("\n").split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(h, r, t) for h, r, t in rows]


def write_jsonl(path: Path, rows) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, required=True,
                    help="folder holding data/triples/codex-m, data/relations/en and data/entities/en/extracts")
    ap.add_argument("--out", type=Path, default=Path("../shared/data/codex_m"))
    ap.add_argument("--sentences", type=int, default=2, help="sentences of the extract kept per entity")
    ap.add_argument("--max-words", type=int, default=64, help="words kept per entity")
    args = ap.parse_args()

    labels = {k: v["label"] for k, v in json.loads(
        (args.raw / "data/relations/en/relations.json").read_text(encoding="utf-8")).items()}
    splits = {s: read_triples(args.raw / f"data/triples/codex-m/{name}.txt") for s, name in SPLITS.items()}
    extracts = args.raw / "data/entities/en/extracts"
    ids = sorted({e for rows in splits.values() for h, _, t in rows for e in (h, t)})
    texts = {}
    for q in ids:
        path = extracts / f"{q}.txt"
        if path.exists() and (text := entity_text(path.read_text(encoding="utf-8"), args.sentences, args.max_words)):
            texts[q] = text
    write_jsonl(args.out / "entities.jsonl", ({"id": q, "text": texts[q]} for q in sorted(texts)))

    counts = {}
    for split, rows in splits.items():
        kept = [(h, r, t) for h, r, t in rows if h in texts and t in texts]
        write_jsonl(args.out / f"triples/{split}.jsonl", (
            {"head": texts[h], "relation": labels[r], "tail": texts[t], "head_id": h, "tail_id": t} for h, r, t in kept))
        counts[split] = (len(rows), len(kept))
    queries: dict[tuple[str, str], list[str]] = {}
    for h, r, t in splits["test"]:
        if h in texts and t in texts:
            queries.setdefault((h, r), []).append(t)
    n_queries = write_jsonl(args.out / "queries/test.jsonl", (
        {"id": f"{h}|{r}", "text": texts[h], "relation": labels[r], "answers": tails}
        for (h, r), tails in queries.items()))

    used = {e for rows in splits.values() for h, _, t in rows if h in texts and t in texts for e in (h, t)}
    relations = {labels[r] for rows in splits.values() for _, r, _ in rows}
    words = sorted(len(texts[q].split()) for q in texts)
    table = "\n".join(f"| {s} | {n:,} | {k:,} |" for s, (n, k) in counts.items())
    (args.out / "README.md").write_text(f"""# CoDEx-M as a text knowledge graph (tools/data/codex.py)

- Source: github.com/tsafavi/codex @ `{CODEX_COMMIT}` (triples `data/triples/codex-m`, relation labels
  `data/relations/en/relations.json`; licence MIT, raw/LICENSE). Entity texts: CoDEx's English Wikipedia
  extracts (`data/entities/en/extracts.zip` upstream, absent from the mirror), unzipped in
  github.com/pshih6/KBAT @ `{EXTRACTS_COMMIT}` `data/entities/en/extracts/`. Wikipedia text: CC BY-SA;
  Wikidata ids and labels: CC0.
- Citation: Safavi & Koutra, "CoDEx: A Comprehensive Knowledge Graph Completion Benchmark", EMNLP 2020.
- Raw copies: `raw/` (as archived from those commits).

## Counts

{len(texts):,} entities with an extract of {len(ids):,} ({len(ids) - len(texts):,} without one: their triples are
dropped); {len(used):,} entities in the kept triples; {len(relations)} relations; entity text
{words[len(words) // 2]} words (median), at most {args.max_words}.

| split | triples | kept |
|---|---:|---:|
{table}

`queries/test.jsonl`: {n_queries:,} distinct (head, relation) test queries.

## Normalisation

- `entities.jsonl` `{{"id", "text"}}`: first {args.sentences} sentences of the extract, whitespace collapsed,
  emptied pronunciation brackets removed, cut to {args.max_words} words (" …" marks a cut).
- `triples/{{train,dev,test}}.jsonl` `{{"head", "relation", "tail", "head_id", "tail_id"}}`: texts as in
  `entities.jsonl`; relation = its English label (e.g. `cast member`); CoDEx `valid` is `dev`.
- `queries/test.jsonl` `{{"id": "HEAD_ID|RELATION_ID", "text", "relation", "answers": [tail ids]}}`.
""", encoding="utf-8")
    print(f"entities {len(texts)} (of {len(ids)}), relations {len(relations)}, queries {n_queries}")
    for s, (n, k) in counts.items():
        print(f"{s:<5} {n:>7} triples, {k:>7} kept")


if __name__ == "__main__":
    main()
