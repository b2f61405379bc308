"""Whole-corpus MRR over the dev search's grid, for one relation of a bundle on one split.

`relsearch train` and tools/build_pack.py keep only the recipe that won on dev; this prints the
grid (the operator's share of the dense vector against identity × BM25's share, here in steps of
0.1, finer than the dev search's), so that one
can see how far the best BM25 share moves between the splits of a dataset and across datasets
(docs/results.md, "Transfer to other datasets")::

    HF_HUB_OFFLINE=1 python tools/recipe_grid.py --bundle relsearch/pack --relation duplicate-question \\
        --triples $RELSEARCH_DATA/qatarliving_dupq/triples/test.jsonl --candidates $RELSEARCH_DATA/qatarliving_dupq/corpus.jsonl

Candidates are every tail of the triples plus ``--candidates`` texts; heads are candidates too
unless ``--heads-are-queries-only`` (answer selection: questions are not answers). Each head is a
query, itself excluded (retrieval/recipe_fit.py ``Corpus.of_pairs``).
"""
from __future__ import annotations

import argparse
import sys

BM25_SHARES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default="relsearch/pack")
    ap.add_argument("--relation", required=True)
    ap.add_argument("--triples", required=True, help="JSONL {head, relation, tail}; only RELATION's lines count")
    ap.add_argument("--candidates", default=None, help="JSONL {text}: the rest of the corpus an index would hold")
    ap.add_argument("--heads-are-queries-only", action="store_true")
    ap.add_argument("--first-hit", action="store_true", help="MRR by each query's first relevant hit")
    args = ap.parse_args(argv)

    from relsearch.bench.linkpred import read_texts, read_triples
    from relsearch.encoder.bundle import load_bundle
    from relsearch.encoder.model import Encoder
    from relsearch.encoder.training import encode_cached
    from relsearch.retrieval.recipe import MIXES, Recipe, first_hit_mrr, mrr, score_matrix
    from relsearch.retrieval.recipe_fit import Corpus, baselines, tables

    bundle = load_bundle(args.bundle)
    if args.relation not in bundle.operators:
        ap.error(f"{args.relation!r} is not in {args.bundle}; it holds {', '.join(sorted(bundle.operators))}")
    op = bundle.operators[args.relation]
    pairs = [(t["head"], t["tail"]) for t in read_triples(args.triples) if t["relation"] == args.relation]
    if not pairs:
        ap.error(f"{args.triples} has no {args.relation!r} triples")
    corpus = Corpus.of_pairs(pairs, read_texts(args.candidates) if args.candidates else [],
                             heads=not args.heads_are_queries_only)
    encoder = Encoder(bundle.encoder_config())
    t = tables(corpus, op, lambda texts: encode_cached(encoder, texts, progress=False))
    metric = first_hit_mrr if args.first_hit else mrr
    print(f"{args.relation} on {args.triples}: {len(corpus.heads)} queries over {corpus.candidates} texts; "
          + ", ".join(f"{k} {v:.3f}" for k, v in baselines(t, op.name).items()) + " (MRR over every gold)")
    print("operator share \\ BM25 share " + " ".join(f"{b:5.1f}" for b in BM25_SHARES))
    for share in MIXES:
        row = []
        for b in BM25_SHARES:
            mixture = {k: w for k, w in ((op.name, share), ("identity", 1.0 - share)) if w}
            scores = score_matrix(Recipe(mixture=mixture, bm25=b), t.dense, t.lexical, t.parts, t.exclude)
            row.append(f"{metric(scores, t.gold, t.exclude):.3f}")
        print(f"{share:27.2f}  " + " ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
