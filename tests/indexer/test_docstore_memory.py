"""indexer/docstore.py in memory: a read-only docstore answers batch-sized lookups from memory
exactly as its SQL does, stays on SQL where it is too big or its positions have gaps; a small
search runs FAISS on the calling thread (indexer/ann.py threads_for) and a batch of a few queries
is scored by BLAS (blas_from_batches)."""
import faiss
import numpy as np
import pytest

from relsearch.indexer import ann, docstore
from relsearch.indexer.docstore import DocStore
from relsearch.indexer.store import open_index
from relsearch.retrieval.search import Query, Searcher


def _store(path, positions):
    s = DocStore(str(path), create=True)
    s.add((p, f"d{p}", f"text {p} ü", {"n": p, "tags": ["a", p]}, 1.0 + p) for p in positions)
    s.close()
    return DocStore(str(path))


def _answers(s: DocStore, positions):
    return s.read(positions).rows, s.norms(positions).tolist(), s.positions([f"d{p}" for p in positions] + ["nope"])


@pytest.mark.parametrize("positions, loads", [(range(5, 105), True), ([0, 1, 2, 7], False)])
def test_memory_answers_as_sql_does(tmp_path, monkeypatch, positions, loads):
    monkeypatch.setattr(docstore, "MEMORY_AT", 2)
    positions = list(positions)
    sql = _answers(_store(tmp_path / "a.sqlite", positions), [positions[0]])  # one position: never loads
    mem_store = _store(tmp_path / "b.sqlite", positions)
    wanted = sorted(set(positions[1:4] + positions[-2:]))  # sorted and distinct, as read() takes them
    first = _answers(mem_store, wanted)  # batch-sized: loads (consecutive positions only)
    assert (mem_store._memory is not None) == loads
    again = _answers(DocStore(str(tmp_path / "b.sqlite")), wanted)  # a fresh store: SQL (MEMORY_AT not reached)
    assert first == again and sql[0] == [("d%d" % positions[0], f"text {positions[0]} ü",
                                           '{"n": %d, "tags": ["a", %d]}' % (positions[0], positions[0]))]
    with pytest.raises(LookupError, match="no document at position"):
        mem_store.read([positions[-1] + 1, positions[-1] + 2])


def test_positions_in_any_order_and_shape_read_alike_from_memory_and_sql(tmp_path, monkeypatch):
    at = np.array([[12, 29, 12, -1], [10, -1, -1, -1]])  # a batch's hits: repeats, -1 pads
    answers = []
    for name, memory_at in (("memory", 4), ("sql", 10**9)):
        monkeypatch.setattr(docstore, "MEMORY_AT", memory_at)
        s = _store(tmp_path / f"{name}.sqlite", range(10, 30))
        docs, slots = s.read_at(at)
        answers.append(([[docs.rows[i][0] if i >= 0 else None for i in row] for row in slots.tolist()],
                        s.norms([29, 12, 12, 10]).tolist()))
        assert (s._memory is not None) == (name == "memory")
        with pytest.raises(LookupError, match="no document at position"):
            s.norms([12, 31])
    assert answers[0] == answers[1] == ([["d12", "d29", "d12", None], ["d10", None, None, None]], [30.0, 13.0, 13.0, 11.0])


def test_a_store_above_the_memory_limit_stays_on_sql(tmp_path, monkeypatch):
    monkeypatch.setattr(docstore, "MEMORY_AT", 2)
    monkeypatch.setattr(docstore, "MEMORY_MAX_ROWS", 10)
    s = _store(tmp_path / "big.sqlite", range(20))
    assert s.read([3, 4, 5]).ids == ["d3", "d4", "d5"] and s._memory is None


def test_a_batch_search_reads_its_hits_from_memory_and_gets_the_same_hits(small_index):
    files = open_index(small_index)
    ids = files.docstore.read(list(range(80))).ids
    batch = [Query(doc_id=i) for i in ids]
    before = [[(h.id, h.text) for h in row] for row in Searcher(str(small_index)).search(batch[:1], k=5)]
    searcher = Searcher(str(small_index))
    hits = searcher.search(batch, k=5)
    assert searcher.files.segments[0].docstore._memory is not None  # 80 ids asked at once
    assert [[(h.id, h.text) for h in row] for row in hits][:1] == before


def test_small_searches_run_faiss_on_the_calling_thread(small_index, monkeypatch):
    before = faiss.omp_get_max_threads()
    seen = []
    real = ann.search

    def spying(*args, **kwargs):
        seen.append((len(args[1]), faiss.omp_get_max_threads()))
        return real(*args, **kwargs)

    monkeypatch.setattr(ann, "search", spying)
    searcher = Searcher(str(small_index))
    ids = searcher.files.docstore.read(list(range(40))).ids
    searcher.search([Query(doc_id=ids[0])], k=3)
    searcher.search([Query(doc_id=i) for i in ids], k=3)
    assert seen == [(1, 1), (40, before)] and faiss.omp_get_max_threads() == before


def test_a_searcher_lets_faiss_score_small_batches_with_blas_and_the_hits_stay_exact(small_index, monkeypatch):
    monkeypatch.setattr(faiss.cvar, "distance_compute_blas_threshold", 128_000)  # FAISS 1.15's own
    searcher = Searcher(str(small_index))
    dim = searcher.files.manifest.dim
    assert faiss.cvar.distance_compute_blas_threshold == ann.BLAS_FROM_QUERIES * dim
    ids = searcher.files.docstore.read(list(range(8))).ids
    hits = searcher.search([Query(doc_id=i) for i in ids], k=5)
    vectors = np.asarray(searcher.files.vectors)  # unit rows: a hit's score is their inner product
    for i, row in enumerate(hits):
        scores = vectors @ vectors[i]
        scores[i] = -np.inf  # never the query document itself
        assert [h.score for h in row] == pytest.approx(np.sort(scores)[::-1][:5].tolist(), abs=1e-5)
