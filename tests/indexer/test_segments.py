"""Segments (indexer/segments.py): an append writes one new segment and links the rest, a delete
writes only tombstones, merges keep answers, and an index of many segments answers exactly like a
rebuild of the same documents from scratch."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

from relsearch.indexer import integrity, mutations, reader, store
from relsearch.indexer import segments as seg
from relsearch.indexer.manifest import Counts
from relsearch.indexer.build import build_published
from relsearch.indexer.faiss_index import FaissSpec
from relsearch.retrieval.search import Query, Searcher

from synthetic_index import encoder_identity as identity_of
from test_mutations import D, docs, raw_vectors
from conftest import gen_of


@pytest.fixture(scope="module")
def encoder_identity():
    return identity_of()


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# ---------------------------------------------------------------- the pieces


def test_vectors_view_reads_like_one_array():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 4)).astype(np.float32) for n in (5, 0, 3, 7)]
    whole = np.concatenate(parts)
    view = seg.Vectors(parts, [0, 5, 5, 8])
    assert view.shape == whole.shape and len(view) == 15
    for key in (0, 4, 5, 14, -1, slice(3, 9), slice(0, 15), slice(9, 3), slice(1, 14, 3)):
        np.testing.assert_array_equal(view[key], whole[key])
    idx = np.array([[14, 0], [5, 8]])
    np.testing.assert_array_equal(view[idx], whole[idx])
    np.testing.assert_array_equal(view[[7, 2, 7]], whole[[7, 2, 7]])
    np.testing.assert_array_equal(np.asarray(view), whole)


def specs(*sizes):
    out, at = [], 0
    for i, n in enumerate(sizes):
        out.append(seg.SegmentSpec("" if i == 0 else f"s{i}-", at, n))
        at += n
    return out


def test_merge_plan_merges_the_smallest_neighbours_and_never_the_first_segment():
    assert seg.merge_plan(specs(100, 5, 5), 3) is None
    assert seg.merge_plan(specs(100, 50, 5, 6, 40), 4) == (2, 4)  # 5 + 6 is the smallest pair
    assert seg.merge_plan(specs(100, 50, 5, 6, 40), 3) == (2, 5)  # three must go: 5 + 6 + 40 < 50 + 5 + 6
    assert seg.merge_plan(specs(1, 50, 50), 2) == (1, 3)  # the first segment is never merged
    assert seg.next_prefix(specs(1, 2, 3)) == "s3-"


@pytest.mark.parametrize("bad", [{"prefix": "../x", "start": 0, "positions": 300},
                                 {"prefix": "", "start": 1, "positions": 300},
                                 {"prefix": "s1", "start": 0, "positions": 300}])
def test_a_damaged_segment_list_is_refused(tmp_path, encoder_identity, bad):
    target = tmp_path / "idx"
    build_published(str(target), [docs([f"d{i}" for i in range(300)], seed=1)], n=300, d=D,
                    encoder=encoder_identity, spec=FaissSpec(factory="Flat"))
    root = gen_of(target)
    manifest = json.loads((Path(root) / store.MANIFEST).read_text())
    manifest["segments"] = [bad]
    (Path(root) / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(store.IndexCorruptError, match="segment"):
        reader.open_index(target)


# ---------------------------------------------------------------- appends, deletes, merges


def ids_and_scores(searcher, q, k, **kw):
    result = searcher.ann(q, k, **kw)
    found = searcher.files.docstore.get(sorted({int(p) for p in result.positions.ravel() if p >= 0}))
    return ([[found[p]["id"] for p in row if p >= 0] for row in result.positions],
            [[s for p, s in zip(pr, sr) if p >= 0] for pr, sr in zip(result.positions, result.scores)])


def assert_same_answers(a, b):
    (ids_a, scores_a), (ids_b, scores_b) = a, b
    assert ids_a == ids_b
    for x, y in zip(scores_a, scores_b):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat"])
def test_many_segments_answer_like_a_rebuild_from_scratch(tmp_path, encoder_identity, factory):
    target = tmp_path / "idx"
    build_published(str(target), [docs([f"d{i}" for i in range(2000)], seed=1)], n=2000, d=D,
                    encoder=encoder_identity, spec=FaissSpec(factory=factory, tune_queries=100, recall_target=1.0))
    for step in range(6):  # new documents, and replacements of documents in the first and in earlier segments
        ids = [f"d{i}" for i in range(2000 + 100 * step, 2100 + 100 * step)] + [f"d{7 * step + i}" for i in range(3)]
        ids += [f"d{2000 + 100 * (step - 1) + 5}"] if step else []
        mutations.append(str(target), [docs(ids, seed=10 + step)], n=len(ids), run={"read": len(ids)},
                         max_segments=4)
        if step == 3:
            mutations.delete(str(target), ["d1", "d2050", "d2150", "nope"])
    files = reader.open_index(target)
    assert len(files.segments) == 4 and files.manifest.max_segments == 4
    # an IVF build's appended segments fill its trained IVF (no training), sharing one coarse assignment
    kinds = {type(s.faiss).__name__ for s in files.segments[1:]}
    assert kinds == ({"IndexIVFFlat"} if factory.startswith("IVF") else {"IndexFlatIP"})
    assert files.manifest.counts.documents == files.docstore.count() == 2600 - 3
    segmented = Searcher(str(target))
    q = unit(raw_vectors(40, seed=77))
    segmented.ann(q[:1], 1)
    assert segmented._shared_quantizer is factory.startswith("IVF")
    filters = {"group": {"in": [1, 3]}}
    before = [ids_and_scores(segmented, q, 20), segmented.search([Query(doc_id="d2203")], k=15, filters=filters)]
    live_ids = {doc_id for rows in files.docstore.rows() for _, doc_id, _, _, _ in rows}

    mutations.compact(str(target))  # the same live documents, one segment, positions renumbered
    rebuilt = Searcher(str(target))
    assert len(rebuilt.files.segments) == 1
    assert {doc_id for rows in rebuilt.files.docstore.rows() for _, doc_id, _, _, _ in rows} == live_ids
    after = [ids_and_scores(rebuilt, q, 20), rebuilt.search([Query(doc_id="d2203")], k=15, filters=filters)]
    assert_same_answers(before[0], after[0])
    assert [(h.id, round(h.score, 5)) for h in before[1][0]] == [(h.id, round(h.score, 5)) for h in after[1][0]]
    assert not {"d1", "d2050", "d2150"} & {i for row in before[0][0] for i in row}


def test_an_append_writes_only_its_own_segment_and_a_delete_only_tombstones(tmp_path, encoder_identity, monkeypatch):
    target = tmp_path / "idx"
    build_published(str(target), [docs([f"d{i}" for i in range(3000)], seed=1)], n=3000, d=D,
                    encoder=encoder_identity, spec=FaissSpec(factory="Flat"))
    first = reader.open_index(target)
    inodes = {name: os.stat(first.root / name).st_ino for name in first.manifest.files}
    hashed = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path: hashed.append(path.name) or real(path))

    mutations.append(str(target), [docs(["d5", "d3000"], seed=2)], n=2, run={"read": 2})
    files = reader.open_index(target)
    for name in seg.SegmentSpec("", 0, 0).files():  # the first segment: the same inodes, not re-hashed
        assert os.stat(files.root / name).st_ino == inodes[name]
    assert sorted(hashed) == sorted(["deleted.npy", "s1-vectors.npy", "s1-index.faiss", "s1-bm25.npz",
                                     "s1-docstore.sqlite"])  # no rejections: rejected.jsonl is a link too
    assert os.path.getsize(files.root / "s1-vectors.npy") < 4 * D * 4  # two rows and a header

    hashed.clear()
    report = mutations.delete(str(target), ["d3000", "d7", "missing"])
    assert (report.deleted, report.not_found) == (2, ["missing"])
    assert sorted(hashed) == ["deleted.npy", "rejected.jsonl"]
    files = reader.open_index(target)
    assert sorted(files.deleted.tolist()) == [5, 7, 3001]
    assert files.manifest.counts == Counts(2999, 3002, 3, 3)
    assert files.docstore.positions(["d5", "d7", "d3000"]) == {"d5": 3000}


def test_a_merge_keeps_positions_and_answers(tmp_path, encoder_identity):
    target = tmp_path / "idx"
    build_published(str(target), [docs([f"d{i}" for i in range(500)], seed=1)], n=500, d=D,
                    encoder=encoder_identity, spec=FaissSpec(factory="Flat"))
    for step in range(3):
        batch = [f"d{i}" for i in range(500 + 50 * step, 550 + 50 * step)] + ["d520"] * (step == 2)
        mutations.append(str(target), [docs(batch, seed=step)], n=len(batch), run={"read": len(batch)})
    q = unit(raw_vectors(10, seed=3))
    searcher = Searcher(str(target))
    before = searcher.ann(q, 30), searcher.search([Query(doc_id="d520")], k=5)
    assert len(searcher.files.segments) == 4

    mutations.append(str(target), [], n=0, run={"read": 0}, max_segments=3)  # nothing new: only the merge
    files = reader.open_index(target)
    assert [(s.prefix, s.start, s.positions) for s in files.manifest.segment_specs] == [
        ("", 0, 500), ("s4-", 500, 100), ("s3-", 600, 51)]
    assert not (files.root / "s1-vectors.npy").exists() and not (files.root / "s2-index.faiss").exists()
    # the merged docstore dropped the replaced d520's old row; its live row is the one appended last
    assert files.segments[1].docstore.positions(["d520"]) == {}
    assert files.docstore.positions(["d520"]) == {"d520": 650}
    merged = Searcher(str(target))
    after = merged.ann(q, 30), merged.search([Query(doc_id="d520")], k=5)
    np.testing.assert_array_equal(after[0].positions, before[0].positions)
    np.testing.assert_allclose(after[0].scores, before[0].scores, rtol=1e-6)
    assert [h.id for h in after[1][0]] == [h.id for h in before[1][0]] and len(after[1][0]) == 5


def test_one_coarse_assignment_for_all_segments_finds_what_each_segment_finds_alone(tmp_path, encoder_identity):
    from relsearch.indexer import ann

    target = tmp_path / "idx"
    build_published(str(target), [docs([f"d{i}" for i in range(2000)], seed=1)], n=2000, d=D,
                    encoder=encoder_identity, spec=FaissSpec(factory="IVF16,Flat", tune_queries=50))
    for step in range(3):
        batch = [f"d{i}" for i in range(2000 + 300 * step, 2300 + 300 * step)]
        mutations.append(str(target), [docs(batch, seed=step)], n=300, run={"read": 300})
    mutations.delete(str(target), [f"d{i}" for i in range(0, 2900, 7)])
    files = Searcher(str(target)).files
    parts = [(s.start, s.faiss, s.vectors) for s in files.segments]
    assert ann.shares_quantizer([p[1] for p in parts])
    q = unit(raw_vectors(30, seed=4))
    for selection in (files.live(), ann.Selection.of(np.arange(100, 2700, 3), files.positions)):
        for params in ({"nprobe": 2}, {"nprobe": 3, "rerank": 40}):
            shared, alone = (ann.search_segments(parts, q, 10, params=params, selection=selection, vectors=files.vectors,
                                                 shared_quantizer=flag) for flag in (True, False))
            np.testing.assert_array_equal(shared.positions, alone.positions)
            np.testing.assert_allclose(shared.scores, alone.scores, rtol=1e-6)
            assert (shared.positions >= 0).all() and np.isin(shared.positions, selection.positions).all()
