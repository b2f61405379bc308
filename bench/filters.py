"""Filter cost: the indexed filter table (indexer/filters.py) against a json_extract scan of every
document's metadata (how DocStore.matching worked before), on a synthetic docstore.

    python -m relsearch.bench.filters --docs 200000

Prints, per filter, the matches and the best of 5 wall times. The scan reads every row whatever
the filter; the table reads only each operator's matches.
"""
from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from ..indexer.docstore import DocStore

FILTERS = {
    "code=c42": {"code": "c42"},
    "year in [1901,1902], sector=s3": {"year": {"in": [1901, 1902]}, "sector": "s3"},
    "year>=2018": {"year": {"gte": 2018}},
    "tags has t7": {"tags": {"has": "t7"}},
}


def scan(store: DocStore, field: str, value: str) -> list[int]:
    path = '$."' + field + '"'
    q = "SELECT pos FROM docs WHERE json_type(meta, ?) = 'text' AND json_extract(meta, ?) = ? ORDER BY pos"
    return [p for (p,) in store.conn.execute(q, [path, path, value])]


def best_of(f, reps: int = 5) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(reps):
        started = time.perf_counter()
        n = len(f())
        best = min(best, time.perf_counter() - started)
    return best, n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200_000)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "docstore.sqlite")
        store = DocStore(path, create=True)
        for start in range(0, args.docs, 10_000):
            store.add((i, f"d{i}", "t", {"year": 1900 + rng.randrange(120), "sector": f"s{rng.randrange(11)}",
                                         "code": f"c{i % 5000}", "tags": [f"t{rng.randrange(50)}"]}, 1.0)
                      for i in range(start, min(args.docs, start + 10_000)))
        store.close()
        store = DocStore(path)
        rows = [("scan  code=c42", *best_of(lambda: scan(store, "code", "c42")))]
        rows += [(f"table {name}", *best_of(lambda f=f: store.matching(f))) for name, f in FILTERS.items()]
        store.close()
    print(f"{args.docs:,} documents")
    for name, seconds, n in rows:
        print(f"{name:38s} {n:7d} matches {seconds * 1000:9.2f} ms")


if __name__ == "__main__":
    main()
