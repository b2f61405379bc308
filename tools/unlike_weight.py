"""Measure what one ``--unlike`` example does at each weight, to choose its default (docs/cli.md).

For anchors of the S&P 500 demo corpus (every 5th company), U is the anchor's first same-sector
hit under plain cosine; the query likes the anchor and unlikes U at weight w. Two figures per w:

- removed: of U's near copies in the anchor's plain top 10 (U's own 3 nearest documents, the
  anchor and U aside), the share gone from the top 10 with the unlike;
- sector kept: same-sector hits in the top 10 with the unlike, over those without it.

One unliked example should remove its near copies without emptying the anchor's sector: the
default (retrieval/search.py DEFAULT_WEIGHT) is the smallest weight that removes at least 3/4.

    HF_HUB_OFFLINE=1 python tools/unlike_weight.py [--index DIR]   # builds a demo index when none is given
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

WEIGHTS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def main(argv=None) -> None:
    from relsearch.pipelines.index import IndexJob, run_index
    from relsearch.retrieval.request import SearchOptions, run
    from relsearch.retrieval.search import Example, Query, Searcher

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", help="an index of relsearch/data/sp500_2017.jsonl (built in a temporary folder if absent)")
    args = ap.parse_args(argv)
    index = args.index
    if index is None:
        index = str(Path(tempfile.mkdtemp()) / "sp500")
        corpus = Path(__file__).resolve().parents[1] / "relsearch" / "data" / "sp500_2017.jsonl"
        run_index(IndexJob(input=str(corpus), index=index, progress=False))
    searcher = Searcher(index)
    store = searcher.files.docstore
    ids = [doc_id for batch in store.rows() for _, doc_id, _, _, _ in batch]
    sector = {i: d["metadata"].get("gics_sector") for i, d in zip(ids, store.get(sorted(store.positions(ids).values())).values())}
    anchors = ids[::5]
    plain = {a: run(searcher, [Query(doc_id=a)], SearchOptions(k=10))[0] for a in anchors}
    cases = []
    for a in anchors:
        same = [h.id for h in plain[a] if sector[h.id] == sector[a]]
        if not same:
            continue
        u = same[0]
        near = [h.id for h in run(searcher, [Query(doc_id=u)], SearchOptions(k=5))[0] if h.id != a][:3]
        copies = [d for d in near if d in {h.id for h in plain[a]}]
        cases.append((a, u, copies, len(same)))
    print(f"{len(cases)} anchors; index {index}")
    print(f"{'weight':>6}  {'removed':>8}  {'sector kept':>11}")
    chosen = None
    for w in WEIGHTS:
        removed = total = 0
        kept = []
        for a, u, copies, n_same in cases:
            q = Query(like=(Example(doc_id=a),), unlike=(Example(doc_id=u, weight=w),))
            top = [h.id for h in run(searcher, [q], SearchOptions(k=10))[0]]
            removed += sum(d not in top for d in copies)
            total += len(copies)
            kept.append(sum(sector[d] == sector[a] for d in top) / n_same)
        print(f"{w:>6}  {removed / max(total, 1):>8.3f}  {sum(kept) / len(kept):>11.3f}")
        if chosen is None and removed >= 0.75 * total:
            chosen = w
    print(f"smallest weight removing at least 3/4 of the copies: {chosen}")


if __name__ == "__main__":
    main()
