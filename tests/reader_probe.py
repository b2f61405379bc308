"""A query process for tests/indexer/test_reliability_readers.py: `python reader_probe.py INDEX OUT STOP`.

Until the file STOP exists it opens INDEX afresh, checks that what it opened is one consistent
generation, answers fixed queries and appends ``{"state", "answers"}`` to OUT (one JSON line per
round). A Searcher opened at start must keep answering identically throughout. Any exception is
written as ``{"error": ...}`` and ends the process with status 1.
"""
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from synthetic_index import searcher_answers  # noqa: E402


def consistent(files) -> int:
    """The run count of an opened generation, after checking that its parts agree."""
    m = files.manifest
    assert files.docstore.count() == m.counts.documents, "docstore and manifest disagree"
    assert files.positions == m.counts.positions, "vectors and manifest disagree"
    assert files.faiss.ntotal == m.faiss["ntotal"], "faiss and manifest disagree"
    assert len(files.deleted) == m.counts.deleted, "deleted.npy and manifest disagree"
    return len(m.runs)


def main(target: str, out: str, stop: str) -> int:
    from relsearch.retrieval.search import Query, Searcher

    with open(out, "a") as log:
        try:
            held = Searcher(target)  # opened once: must never change under us
            first = [[h.id for h in hs] for hs in held.search([Query(doc_id="d1"), Query(doc_id="d2")], k=5)]
            while not Path(stop).exists():
                fresh = Searcher(target)  # what a new query process would open now
                state, result = consistent(fresh.files), searcher_answers(fresh)
                fresh.files.docstore.close()
                again = [[h.id for h in hs] for hs in held.search([Query(doc_id="d1"), Query(doc_id="d2")], k=5)]
                assert again == first, "a reader's own generation changed under it"
                log.write(json.dumps({"state": state, "answers": result}) + "\n")
                log.flush()
        except BaseException:  # noqa: BLE001 - report anything
            log.write(json.dumps({"error": traceback.format_exc()}) + "\n")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
