"""Searcher.hits: a batch's documents come from one docstore read; each row drops its query
document and padding and keeps k."""
import numpy as np

from relsearch.indexer.ann import SearchResult
from relsearch.retrieval.search import Query, Searcher


def test_hits_reads_the_docstore_once_per_batch_and_keeps_k(small_index, monkeypatch):
    searcher = Searcher(str(small_index))
    store = searcher.files.docstore
    reads = []
    real_get = store.get
    monkeypatch.setattr(store, "get", lambda positions: reads.append(len(positions)) or real_get(positions))
    own = real_get([3])[3]["id"]
    positions = np.array([[3, 5, -1, 7, 9], [1, 2, 3, 4, 5], [-1, -1, -1, -1, -1]])
    scores = np.linspace(1, 0, 15, dtype=np.float32).reshape(3, 5)
    queries = [Query(doc_id=own), Query(text="x"), Query(text="y")]
    rows = searcher.hits(SearchResult(scores=scores, positions=positions), queries, 3)
    assert reads == [6]  # one read of the distinct positions kept: 1, 2, 3, 5, 7, 9
    docs = real_get([1, 2, 3, 5, 7, 9])
    assert [h.id for h in rows[0]] == [docs[5]["id"], docs[7]["id"], docs[9]["id"]]  # own document and -1 dropped
    assert [h.id for h in rows[1]] == [docs[1]["id"], docs[2]["id"], docs[3]["id"]]
    assert rows[2] == []
    assert rows[1][0].score == float(scores[1, 0]) and rows[1][0].text == docs[1]["text"]
    assert rows[1][0].metadata == docs[1]["metadata"]
    assert searcher.hits(SearchResult(scores=scores, positions=positions), queries, 0) == [[], [], []]
