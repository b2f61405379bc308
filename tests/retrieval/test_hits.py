"""Searcher.hits and retrieval/hits.py: a batch's documents come from one ordered docstore read;
each row drops its query document and padding and keeps k, in rank order; the columns give the same
hits as building every Hit from the docstore's rows (the former way, kept here as the oracle)."""
import shutil

import numpy as np
import pytest

import relsearch
from relsearch.indexer.ann import SearchResult
from relsearch.retrieval.hits import Hit, HitColumns, keep_top
from relsearch.retrieval.search import Query, Searcher, drop_own


def _count_doc_reads(searcher) -> list[str]:
    """SQL statements reading ``docs`` from now on, on every segment's connection (sqlite trace)."""
    seen: list[str] = []
    for part in searcher.files.docstore.parts:
        part.conn.set_trace_callback(lambda sql: seen.append(sql) if "FROM docs" in sql else None)
    return seen


def _oracle(searcher, result: SearchResult, own: list[int], k: int) -> list[list[Hit]]:
    """The hits as they were built before columns: per-hit pairs, drop_own, one get, a Hit each."""
    rows = [[(p, s) for p, s in zip(row, row_scores) if p >= 0]
            for row, row_scores in zip(result.positions.tolist(), result.scores.tolist())]
    rows = drop_own(rows, own, k, key=lambda pair: pair[0])
    docs = searcher.files.docstore.get(sorted({p for row in rows for p, _ in row}))
    return [[Hit(docs[p]["id"], s, docs[p]["text"], docs[p]["metadata"]) for p, s in row] for row in rows]


def test_hits_reads_the_docstore_once_per_batch_and_keeps_k(small_index):
    searcher = Searcher(str(small_index))
    store = searcher.files.docstore
    own = store.get([3])[3]["id"]
    positions = np.array([[3, 5, -1, 7, 9], [1, 2, 3, 4, 5], [-1, -1, -1, -1, -1]])
    scores = np.linspace(1, 0, 15, dtype=np.float32).reshape(3, 5)
    queries = [Query(doc_id=own), Query(text="x"), Query(text="y")]
    reads = _count_doc_reads(searcher)
    rows = searcher.hits(SearchResult(scores=scores, positions=positions), queries, 3)
    assert len(reads) == 2  # the own-position lookup by id, then one read of positions 1, 2, 3, 5, 7, 9
    assert "json_each" in reads[1] and "ORDER BY pos" in reads[1]
    assert rows.docs.ids == [store.get([p])[p]["id"] for p in (1, 2, 3, 5, 7, 9)]
    docs = store.get([1, 2, 3, 5, 7, 9])
    assert [h.id for h in rows[0]] == [docs[5]["id"], docs[7]["id"], docs[9]["id"]]  # own document and -1 dropped
    assert [h.id for h in rows[1]] == [docs[1]["id"], docs[2]["id"], docs[3]["id"]]
    assert rows[2] == []
    assert rows[1][0].score == float(scores[1, 0]) and rows[1][0].text == docs[1]["text"]
    assert rows[1][0].metadata == docs[1]["metadata"]
    reads.clear()
    assert searcher.hits(SearchResult(scores=scores, positions=positions), queries, 0) == [[], [], []]
    assert len(reads) == 1  # k = 0: the id lookup alone, no read for nothing


@pytest.mark.parametrize("k", [1, 4, 9, 12])
def test_columns_give_the_hits_of_the_former_per_hit_path(small_index, k):
    searcher = Searcher(str(small_index))
    rng = np.random.default_rng(k)
    n, m = 40, 10
    positions = rng.integers(0, 120, (n, m))
    positions[rng.random((n, m)) < 0.15] = -1  # padding anywhere in a row, as filtered searches give
    scores = np.sort(rng.random((n, m)).astype(np.float32), axis=1)[:, ::-1].copy()
    own = np.where(rng.random(n) < 0.5, positions[:, 2], -1)  # half the queries are --id, their document hit
    ids = searcher.files.docstore.get(list(range(120)))
    queries = [Query(text="t") if p < 0 else Query(doc_id=ids[int(p)]["id"]) for p in own]
    result = SearchResult(positions=positions, scores=scores)
    got = searcher.hits(result, queries, k, own=own)
    expected = _oracle(searcher, result, own.tolist(), k)
    assert got == expected and list(got) == expected  # ids, scores, texts, metadata and order
    assert [got.ids(i) for i in range(n)] == [[h.id for h in row] for row in expected]
    assert got[-1] == expected[-1] and got[3:7] == expected[3:7]
    assert got.counts.tolist() == [len(row) for row in expected]


@pytest.mark.parametrize("lowest", [-1, 0])  # padded rows; full rows, where every row keeps k (the usual case)
def test_keep_top_matches_drop_own(lowest):
    rng = np.random.default_rng(0)
    positions = rng.integers(lowest, 30, (200, 8))
    scores = rng.random((200, 8)).astype(np.float32)
    own = rng.integers(-1, 30, 200)
    for k in (0, 1, 3, 7, 8, 20):
        kept = keep_top(SearchResult(positions=positions, scores=scores), own, k)
        pairs = [[(p, s) for p, s in zip(r, rs) if p >= 0] for r, rs in zip(positions.tolist(), scores.tolist())]
        oracle = drop_own(pairs, own.tolist(), k, key=lambda pair: pair[0])
        assert kept.positions.shape == (200, min(k, 8)) and kept.scores.dtype == np.float32
        assert [[(p, s) for p, s in zip(r, rs) if p >= 0]
                for r, rs in zip(kept.positions.tolist(), kept.scores.tolist())] == oracle
        assert (kept.scores[kept.positions < 0] == -np.inf).all()


def test_rows_are_built_on_demand_and_explain_rides_along(small_index):
    searcher = Searcher(str(small_index))
    ids = searcher.files.docstore.get([0, 1])
    queries = [Query(doc_id=ids[0]["id"]), Query(doc_id=ids[1]["id"])]
    plain = searcher.search(queries, k=3)
    assert isinstance(plain, HitColumns) and len(plain) == 2 and repr(plain) == "HitColumns(2 queries, 6 hits)"
    assert plain[0] is not plain[0] and plain[0] == plain[0]  # a new list each read, equal by value
    assert plain[0][0].metadata is not plain[0][0].metadata  # decoded per read: a caller may change its copy
    explained = searcher.search(queries, k=3, explain=True)
    assert [h.id for h in explained[1]] == plain.ids(1)
    assert all(h.explain and "identity" in h.explain for row in explained for h in row)
    assert explained[1][0].explain["identity"] == pytest.approx(explained[1][0].score, abs=1e-5)


def test_a_segmented_index_reads_once_per_segment_hit(small_index, tmp_path):
    target = tmp_path / "idx"
    shutil.copytree(small_index, target)
    relsearch.open_index(str(target)).add([{"id": f"new{i}", "text": f"A new company number {i} makes widgets."}
                                           for i in range(5)])
    searcher = Searcher(str(target))
    assert len(searcher.files.segments) == 2
    first, second = searcher.files.segments[1].start - 1, searcher.files.segments[1].start + 2
    result = SearchResult(positions=np.array([[second, first, 0], [0, -1, second]]),
                          scores=np.array([[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]], np.float32))
    reads = _count_doc_reads(searcher)
    got = searcher.hits(result, [Query(text="a"), Query(text="b")], 3, own=np.array([-1, -1]))
    assert len(reads) == 2  # one ordered read in each segment
    assert got.ids(0)[0] == "new2" and got == _oracle(searcher, result, [-1, -1], 3)
    assert got.ids(1) == [got.ids(0)[2], "new2"]


def test_a_position_without_a_document_is_named(small_index):
    store = Searcher(str(small_index)).files.docstore
    assert store.read([]).ids == []
    with pytest.raises(LookupError, match="position.s. 500"):
        store.read([2, 500])


def test_a_rows_chosen_hits_and_shaped_hits_are_the_hits_replace_would_give(small_index):
    """HitColumns.hits builds the hits of a row at some ranks alone (retrieval/fields.py keeps a few
    of each text field's), carrying their field; Hit.shaped copies a hit without __init__: both
    the objects dataclasses.replace gives, with dicts of their own."""
    import dataclasses

    searcher = Searcher(str(small_index))
    ids = searcher.files.docstore.read(list(range(70))).ids
    for explain in (False, True):
        columns = searcher.search([Query(doc_id=i) for i in ids], k=6, explain=explain)
        for i in (0, 33, 69):
            row = columns[i]
            for ranks in ([], [0], [5, 1, 3], list(range(6))):
                picked = columns.hits(i, ranks, field="wiki")
                assert picked == [dataclasses.replace(row[j], field="wiki") for j in ranks]
                assert all(vars(h) == vars(dataclasses.replace(row[j], field="wiki")) for h, j in zip(picked, ranks))
            assert columns.hits(i, [2]) == [row[2]] and columns.hits(i, [2])[0].field is None
            assert columns.hits(i, [2])[0].metadata is not columns.hits(i, [2])[0].metadata
    hit = columns[0][0]
    for fields, metadata in ((None, True), (None, False), ([], True), (["gics_sector", "nope"], True)):
        shaped, replaced = hit.shaped(fields, metadata), dataclasses.replace(
            hit, metadata={f: hit.metadata[f] for f in fields if f in hit.metadata} if metadata and fields is not None
            else ({} if not metadata else hit.metadata))
        assert type(shaped) is Hit and shaped == replaced and vars(shaped) == vars(replaced)
    assert hit.shaped(["gics_sector"]).metadata == {"gics_sector": hit.metadata["gics_sector"]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        hit.shaped(["gics_sector"]).score = 1.0
