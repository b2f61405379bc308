"""indexer/docstore.py in memory: a read-only docstore answers batch-sized lookups from memory
exactly as its SQL does, stays on SQL where it is too big for the process's memory budget or its
positions have gaps; the budget is shared by every store and given back; a search's hits are the
same from memory and from SQL through build, append and delete generations; the hits a batch
builds are Hit objects like any other (retrieval/hits.py _hit). A small search runs FAISS on the
calling thread (indexer/ann.py threads_for) and a batch of a few queries is scored by BLAS
(blas_from_batches)."""
import dataclasses
import gc
import json
import pickle
import tracemalloc

import faiss
import numpy as np
import pytest

from relsearch.indexer import ann, docstore, mutations
from relsearch.indexer.build import Block, build_published
from relsearch.indexer.docstore import DocStore
from relsearch.indexer.faiss_index import FaissSpec
from relsearch.indexer.reader import open_index
from relsearch.retrieval import hits as hits_module
from relsearch.retrieval import request
from relsearch.retrieval.hits import Hit
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


def test_a_store_above_the_memory_budget_stays_on_sql(tmp_path, monkeypatch):
    monkeypatch.setattr(docstore, "MEMORY_AT", 2)
    used = docstore.BUDGET.used
    s = _store(tmp_path / "big.sqlite", range(20))
    # one byte short of the store alone, whatever other stores of this test process hold (with room for
    # those only, it would wait for them: "asked again later", not refused for good)
    monkeypatch.setattr(docstore, "MEMORY_BUDGET", s.memory_bytes() - 1)
    assert s.read([3, 4, 5]).ids == ["d3", "d4", "d5"] and s._memory is None
    assert s.read_at(np.array([[5, 3, -1]]))[0].ids == ["d3", "d5"] and s._memory is None and s._memory_tried
    monkeypatch.setattr(docstore, "MEMORY_BUDGET", 10 * docstore.ROW_BYTES)  # tinier than the count alone
    t = _store(tmp_path / "bigger.sqlite", range(20))
    assert t.positions(["d1", "d2", "nope"]) == {"d1": 1, "d2": 2} and t._memory is None
    assert t.memory_bytes() == 20 * docstore.ROW_BYTES and docstore.BUDGET.used == used


def test_the_budget_is_shared_by_every_store_and_given_back(tmp_path, monkeypatch):
    monkeypatch.setattr(docstore, "MEMORY_AT", 2)
    used = docstore.BUDGET.used
    a, b = _store(tmp_path / "a.sqlite", range(50)), _store(tmp_path / "b.sqlite", range(50))
    assert a.memory_bytes() == b.memory_bytes() > 50 * docstore.ROW_BYTES
    monkeypatch.setattr(docstore, "MEMORY_BUDGET", used + a.memory_bytes() + b.memory_bytes() // 2)  # room for one
    assert a.read([1, 2]).ids == b.read([1, 2]).ids == ["d1", "d2"]
    assert a._memory is not None and b._memory is None and not b._memory_tried  # b: asks again later
    assert docstore.BUDGET.used == used + a.memory_bytes()
    a.close()  # gives its bytes back: b loads at its next batch-sized lookup
    assert docstore.BUDGET.used == used and b.read([3, 4]).ids == ["d3", "d4"] and b._memory is not None
    del b
    gc.collect()  # a store collected without close() gives its bytes back too
    assert docstore.BUDGET.used == used


def test_the_estimate_bounds_what_the_documents_hold(tmp_path):
    """The bytes counted against the budget (UTF-8 size + ROW_BYTES a document) cover what the
    loaded documents take, measured with tracemalloc (the copy of a 200k store: 76 MiB held,
    77 estimated); while loading, one chunk of SQL rows more."""
    s = DocStore(str(tmp_path / "m.sqlite"), create=True)
    s.add((p, f"doc-{p}", f"text number {p} of a few words, ü", {"n": p, "x": 1.5, "tags": ["a"]}, 1.0)
          for p in range(5_000))
    s.close()
    s = DocStore(str(tmp_path / "m.sqlite"))
    estimate = s.memory_bytes()
    tracemalloc.start()
    try:
        memory = s._load()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert memory is not None and 0.8 * estimate < held <= estimate and peak < 1.5 * estimate


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


def _rich_docs(ids, seed):
    """Documents whose metadata exercises every JSON type (1 and 1.0 and true stay apart)."""
    rng = np.random.default_rng(seed)
    docs = [{"id": i, "text": f"tëxt of {i} ✓ {n}", "metadata": {
        "n": n, "f": float(n), "half": n / 2, "ok": n % 2 == 0, "none": None, "tags": ["a", n, 1.0, True, None],
        "nested": {"k": [n, {"deep": "ü"}]}, "unicode": "日本 \U0001F600"}} for n, i in enumerate(ids)]
    return Block(docs, (rng.standard_normal((len(ids), 384)) * 3).astype(np.float32))


def _hits_of(target, batch_ids, k=7):
    """Each --id query's hits with every field kept with its JSON type, through Searcher.search and
    through the plan (retrieval/request.py), and read_at of positions with repeats and padding."""
    searcher = Searcher(str(target))
    batch = [Query(doc_id=i) for i in batch_ids]
    typed = [[(h.id, h.score, h.text, json.dumps(h.metadata)) for h in row] for row in searcher.search(batch, k=k)]
    planned = [[(h.id, h.score, h.text, json.dumps(h.metadata)) for h in row]
               for row in request.run(searcher, batch, request.SearchOptions(k=k))]
    n = searcher.files.positions
    docs, slots = searcher.files.docstore.read_at(np.array([[n - 1, 0, n - 1, -1], [n // 2, -1, -1, -1]]))
    read = [[docs.rows[s] if s >= 0 else None for s in row] for row in slots.tolist()]
    loaded = [part._memory is not None for part in searcher.files.docstore.parts]
    return typed, planned, read, loaded


def test_hits_from_memory_equal_hits_from_sql_through_append_and_delete_generations(tmp_path, monkeypatch):
    from synthetic_index import encoder_identity

    monkeypatch.setattr(docstore, "MEMORY_AT", 2)  # every segment's share of a batch loads it
    target = tmp_path / "idx"
    first = [f"d{i}" for i in range(300)]
    build_published(str(target), [_rich_docs(first, 1)], n=300, d=384, encoder=encoder_identity(),
                    spec=FaissSpec(factory="Flat"))
    seen = []
    for step in ("built", "appended", "deleted"):
        if step == "appended":  # a second segment: 50 new documents and 20 replacing old ones
            mutations.append(str(target), [_rich_docs([f"d{i}" for i in range(280, 350)], 2)], n=70, run={})
        if step == "deleted":
            mutations.delete(str(target), ["d3", "d290", "d345"])
        live = [i for i in (f"d{j}" for j in range(350)) if i not in {"d3", "d290", "d345"} or step != "deleted"]
        live = live[:300] if step == "built" else live
        from_sql, from_memory = [], []
        for budget, out in ((0, from_sql), (docstore.MEMORY_BUDGET, from_memory)):
            monkeypatch.setattr(docstore, "MEMORY_BUDGET", budget)
            out.extend(_hits_of(target, live[::3]))
        assert from_sql[:3] == from_memory[:3], step
        assert not any(from_sql[3]) and all(from_memory[3]), step  # SQL alone, memory in every segment
        typed = from_memory[0]
        assert all(len(row) == 7 for row in typed) and from_memory[0] == from_memory[1]
        seen.append(len(from_memory[3]))
        if step == "deleted":
            assert not {"d3", "d290", "d345"} & {h[0] for row in typed for h in row}
    assert seen == [1, 2, 2]
    hit = typed[0][0]
    assert json.loads(hit[3])["tags"] == ["a", json.loads(hit[3])["n"], 1.0, True, None]
    assert isinstance(json.loads(hit[3])["f"], float) and json.loads(hit[3])["unicode"] == "日本 \U0001F600"


def test_a_batch_builds_hits_like_any_other(small_index):
    assert hits_module._FAST  # every field past the five a row gives has a plain default
    searcher = Searcher(str(small_index))
    ids = searcher.files.docstore.read(list(range(70))).ids
    columns = searcher.search([Query(doc_id=i) for i in ids], k=3)
    built = columns[0][0]
    plain = Hit(built.id, built.score, built.text, dict(built.metadata))
    assert vars(built) == vars(plain) == {f.name: getattr(plain, f.name) for f in dataclasses.fields(Hit)}
    assert type(built) is Hit and built == plain and hash(built.id) == hash(plain.id) and repr(built) == repr(plain)
    assert pickle.loads(pickle.dumps(built)) == plain and dataclasses.asdict(built) == dataclasses.asdict(plain)
    assert dataclasses.replace(built, metadata={}) == dataclasses.replace(plain, metadata={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.score = 1.0
    assert built.shaped(metadata=False).metadata == {} and built.to_json(1) == plain.to_json(1)
    assert columns[0][0].metadata is not columns[0][0].metadata  # each read builds its own dicts
