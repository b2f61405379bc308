"""Sharded FAISS adds (indexer/sharded_add.py): train once, fill in worker processes, merge — the
same index as one process adding everything."""
import numpy as np
import pytest

from relsearch.indexer import sharded_add
from relsearch.indexer.faiss_index import build_faiss


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    path = tmp_path_factory.mktemp("vec") / "vectors.npy"
    np.save(path, x)
    return np.load(path, mmap_mode="r")


def test_shard_ranges_cover_every_position_once():
    assert sharded_add.shard_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert sharded_add.shard_ranges(2, 4) == [(0, 1), (1, 2)]


@pytest.mark.parametrize("factory", ["IVF32,PQ8x4", "IVF32,Flat"])
def test_sharded_build_equals_a_single_process_build(vectors, factory):
    one, _ = build_faiss(vectors, factory, device="cpu", block=1000)
    many, device = build_faiss(vectors, factory, device="cpu", block=1000, fill=sharded_add.LocalAdd(2))
    assert device == "cpu" and many.ntotal == one.ntotal == len(vectors)
    q = np.asarray(vectors[:50])
    one.nprobe = many.nprobe = 32  # every list: the whole index is compared
    s1, p1 = one.search(q, 10)
    s2, p2 = many.search(q, 10)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(s1, s2)


def test_indexes_that_do_not_merge_by_lists_are_built_in_process(vectors):
    flat, _ = build_faiss(vectors, "Flat", device="cpu", fill=sharded_add.LocalAdd(2))  # not IVF: the ordinary path
    assert flat.ntotal == len(vectors) and not sharded_add.shardable(flat)
    with pytest.raises(ValueError, match="trained, empty"):
        sharded_add.add_sharded(flat, vectors.filename, len(vectors), workers=2)
