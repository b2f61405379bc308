"""duplicate-question's recipe weights on each forum at hand, and whether choosing them on several forums carries over.

For each forum (meta_se_dupq: train + dev duplicates both ways to choose on, test to measure; qatarliving2_dupq:
train part 2 to choose on, the SemEval dev file to measure), every recipe of the grid that tools/build_pack.py's
choice tries (retrieval/recipe.py: the query title's weight ``TITLE_SHARES`` × BM25's share ``BM25_SHARES``, over
plain cosine; plus a title weight of 2, outside that grid) is scored over the forum's whole corpus, filtered
MRR over every (query, gold) pair, as retrieval/recipe_fit.py measures a recipe. Then each way of choosing is
judged on each forum's test pairs against the shipped recipe and identity, with the paired standard error
(clustered by query, retrieval/recipe.py ``noise_margin``): on one forum's dev pairs; on every forum's dev pairs,
each forum weighing the same (pooled); and leave-one-forum-out (chosen on the other forums' dev pairs only).

    python tools/data/dupq_forum_grid.py --data ../shared/data --pack relsearch/pack [--json grid.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import numpy as np

WIDER_TITLE = 2.0  # one title weight past the grid the build tries, to see whether the grid's edge binds


def _read(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def forums(data: Path) -> dict[str, dict]:
    """forum → {"texts": its corpus, "dev"/"test": [(head, tail)]}; meta's pairs both ways (as the build
    fits them), Qatar Living's original → forum question (as bench transfer asks them)."""
    def both(triples):
        return [(t["head"], t["tail"]) for t in triples] + [(t["tail"], t["head"]) for t in triples]

    meta, ql = data / "meta_se_dupq", data / "qatarliving2_dupq"
    return {"meta.stackexchange": {"texts": [q["text"] for q in _read(meta / "corpus.jsonl")],
                                   "dev": both(_read(meta / "triples/train.jsonl") + _read(meta / "triples/dev.jsonl")),
                                   "test": both(_read(meta / "triples/test.jsonl"))},
            "Qatar Living": {"texts": [q["text"] for q in _read(ql / "corpus.jsonl")],
                             "dev": [(t["head"], t["tail"]) for t in _read(ql / "triples/dev.jsonl")],
                             "test": [(t["head"], t["tail"]) for t in _read(ql / "triples/test.jsonl")]}}


def grid_ranks(forum: dict, operator, encode) -> dict[str, dict]:
    """split → {"rr": {recipe key "title/bm25": per-pair reciprocal ranks}, "query": each pair's query}."""
    from relsearch.retrieval.fit_corpus import Corpus, Encoded
    from relsearch.retrieval.recipe import BM25_SHARES, TITLE_SHARES, Recipe, pair_reciprocal_ranks, score_matrix
    from relsearch.retrieval.recipe_fit import tables

    encoded = Encoded.of(forum["texts"], encode)
    out = {}
    for split in ("dev", "test"):
        c = Corpus.of_pairs(forum[split], forum["texts"])
        if c.texts != forum["texts"]:
            raise ValueError(f"{split}: a pair names a question outside the forum's corpus")
        c = Corpus(c.texts, c.heads, c.gold, candidate=c.candidate, encoded=encoded)
        t = tables(c, operator, encode)
        rr = {}
        for title, bm25 in itertools.product((*TITLE_SHARES, WIDER_TITLE), BM25_SHARES):
            recipe = Recipe(mixture={operator.name: 1.0}, bm25=bm25, title=title)
            scores = score_matrix(recipe, t.dense, t.lexical, t.parts, t.exclude)
            rr[f"{title:g}/{bm25:g}"] = pair_reciprocal_ranks(scores, c.gold, c.exclude()).tolist()
        out[split] = {"rr": rr, "query": [i for i, g in enumerate(c.gold) for _ in g], "queries": len(c.heads)}
    return out


def paired_se(a, b, query) -> float:
    """Standard error of mean(a − b) over pairs, clustered by query (as retrieval/recipe.py noise_margin)."""
    d = np.asarray(a) - np.asarray(b)
    per, n = np.bincount(query, weights=d), np.bincount(query)
    per, n = per[n > 0], n[n > 0]
    spread = per - n * d.mean()
    return math.sqrt(len(n) / (len(n) - 1) * float(spread @ spread)) / len(d)


def choose(ranks: dict, names: list[str], keys: list[str]) -> str:
    """The recipe key with the best mean of the forums' dev MRR (each forum weighing the same); ties: the first."""
    return max(keys, key=lambda k: (np.mean([np.mean(ranks[f]["dev"]["rr"][k]) for f in names]), -keys.index(k)))


def report(ranks: dict, shipped: str) -> list[str]:
    keys = [k for k in next(iter(ranks.values()))["dev"]["rr"] if not k.startswith(f"{WIDER_TITLE:g}/")]
    names = list(ranks)
    lines = ["recipe (title/bm25): " + ", ".join(f"{f} dev/test MRR" for f in names)]
    for k in next(iter(ranks.values()))["dev"]["rr"]:
        lines.append(f"  {k:>8}: " + "  ".join(f"{np.mean(ranks[f]['dev']['rr'][k]):.3f}/{np.mean(ranks[f]['test']['rr'][k]):.3f}"
                                                 for f in names))
    ways = {f"chosen on {f} dev": choose(ranks, [f], keys) for f in names}
    ways["pooled (every forum's dev, each weighing the same)"] = choose(ranks, names, keys)
    lines.append(f"shipped: {shipped}; " + "; ".join(f"{w}: {k}" for w, k in ways.items()))
    for f in names:
        test = ranks[f]["test"]
        held_out = choose(ranks, [o for o in names if o != f], keys)
        rows = {**ways, f"leave {f} out": held_out}
        for way, k in rows.items():
            a, q = test["rr"][k], np.asarray(test["query"])
            lines.append(f"  {f} test ({test['queries']} queries, {len(a)} pairs) {way} [{k}]: {np.mean(a):.3f}, "
                         f"vs identity {np.mean(a) - np.mean(test['rr']['0/0']):+.3f} (SE {paired_se(a, test['rr']['0/0'], q):.3f}), "
                         f"vs shipped {np.mean(a) - np.mean(test['rr'][shipped]):+.3f} (SE {paired_se(a, test['rr'][shipped], q):.3f})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--pack", default="relsearch/pack")
    ap.add_argument("--cache-dir", default=None, help="vector cache (default ~/.cache/relsearch/vectors)")
    ap.add_argument("--json", type=Path, default=None, help="write every per-pair reciprocal rank here")
    args = ap.parse_args()

    from relsearch.encoder.bundle import load_bundle
    from relsearch.encoder.model import Encoder, EncoderConfig
    from relsearch.encoder.training import encode_cached
    from relsearch.retrieval.recipe import Recipe

    operator = load_bundle(args.pack).operators["duplicate-question"]
    shipped = Recipe.from_json(operator.info["recipe"])
    encoder = Encoder(EncoderConfig())

    def encode(texts):
        return encode_cached(encoder, texts, cache_dir=args.cache_dir, progress=False)

    ranks = {name: grid_ranks(forum, operator, encode) for name, forum in forums(args.data).items()}
    if args.json:
        args.json.write_text(json.dumps(ranks), encoding="utf-8")
    print("\n".join(report(ranks, f"{shipped.title:g}/{shipped.bm25:g}")))


if __name__ == "__main__":
    main()
