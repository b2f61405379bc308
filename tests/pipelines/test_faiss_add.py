"""The index job's FAISS add on the Beam workers (pipelines/faiss_add.py): units of consecutive
chunks, filled by a second pipeline and merged in order — the same index the driver builds alone.
The same comparison on Beam's DaskRunner is in test_dask.py."""
import os
from types import SimpleNamespace

import faiss
import numpy as np
import pytest

from relsearch.indexer import sharded_add, store
from relsearch.pipelines import faiss_add
from relsearch.pipelines.index import IndexJob, run_index
from conftest import write_jsonl


def test_units_are_runs_of_chunks_with_consecutive_positions():
    chunks = [SimpleNamespace(number=i) for i in range(5)]
    keep = [np.array([1, 1, 0], bool), np.array([0, 0], bool), np.array([1, 1], bool), np.array([1], bool),
            np.array([1, 1, 1], bool)]
    units = faiss_add.plan_units(chunks, keep, 3)
    # 8 kept rows; chunks start at positions 0, 2, 4 and 5: units begin at rows 0, 8/3 and 16/3
    assert [(u.number, u.first, [c for c, _ in u.chunks]) for u in units] == [(0, 0, [0, 2]), (1, 4, [3, 4])]
    assert [len(faiss_add.plan_units(chunks, keep, n)) for n in (1, 2, 100)] == [1, 2, 4]  # never an empty unit
    assert faiss_add.units_for(2_500_000, 0) == 3 and faiss_add.units_for(10, 0) == 1
    assert faiss_add.units_for(10, 4) == 4


def _build(tmp_path, corpus, name: str, factory: str, units: int):
    target = tmp_path / name
    report = run_index(IndexJob(input=str(corpus), index=str(target), chunk_lines=7, faiss_factory=factory,
                                faiss_add_units=units, progress=False))
    gen = store.current_generation(target)
    return report, faiss.read_index(str(gen / "index.faiss")), np.load(gen / "vectors.npy")


@pytest.mark.parametrize("factory", ["IVF8,Flat", "IVF8,PQ16x4"])
def test_units_filled_by_the_workers_give_the_index_the_driver_builds(tmp_path, small_corpus, factory, monkeypatch):
    rows = small_corpus.read_text().splitlines()[:40]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows + ["not json", rows[3]])  # a rejection and a duplicate id
    merged, merge = [], sharded_add.merge_shard
    monkeypatch.setattr(sharded_add, "merge_shard", lambda index, shard: merged.append(len(shard)) or merge(index, shard))
    one, alone, vectors = _build(tmp_path, corpus, "driver", factory, 1)
    assert merged == []
    many, filled, same_vectors = _build(tmp_path, corpus, "workers", factory, 3)
    assert len(merged) == 3  # three units came back from the workers and were merged
    assert (one.indexed, one.rejected) == (many.indexed, many.rejected) == (40, 2)
    np.testing.assert_array_equal(vectors, same_vectors)
    assert filled.ntotal == alone.ntotal == 40
    faiss.extract_index_ivf(alone).nprobe = faiss.extract_index_ivf(filled).nprobe = 8  # every list
    s1, p1 = alone.search(vectors, 10)
    s2, p2 = filled.search(vectors, 10)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(s1, s2)
    assert one.faiss["search_params"] == many.faiss["search_params"]
    leftovers = [n for n in os.listdir(tmp_path / "workers" / "generations") if n.startswith("build-")]
    assert leftovers == []  # the units and the trained index went with the build folder


def test_a_flat_index_is_added_by_the_driver_whatever_the_units(tmp_path, small_corpus, monkeypatch):
    monkeypatch.setattr(faiss_add.WorkerAdd, "__call__", lambda *a: pytest.fail("Flat needs no worker add"))
    report, index, _ = _build(tmp_path, small_corpus, "flat", "Flat", 3)
    assert index.ntotal == report.indexed
