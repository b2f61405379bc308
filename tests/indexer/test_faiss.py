"""FAISS layer on synthetic clustered unit vectors: auto choice, tuning, parameters, id selection,
re-ranking and GPU dispatch (with injected "GPU present" facts), each against exact numpy search."""
import logging

import faiss
import numpy as np
import pytest

from relsearch.indexer import ann, gpu
from relsearch.indexer.faiss_index import FaissSpec, build_faiss, build_index, supports_removal
from relsearch.indexer.tuning import AutoPolicy, TuningConfig, choose_factory, nlist_for, pq_bytes_for, tune


def clustered(n, d=32, centers=150, noise=0.6, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, d)).astype(np.float32)
    x = c[rng.integers(0, centers, n)] + noise * rng.standard_normal((n, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def data():
    x = clustered(6000)
    rng = np.random.default_rng(2)  # held-out queries: perturbed corpus vectors, not in the index
    noise = rng.standard_normal((200, x.shape[1])).astype(np.float32)
    q = x[rng.choice(len(x), 200, replace=False)] + 0.3 * noise / np.linalg.norm(noise, axis=1, keepdims=True)
    return x, (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def recall(found, truth_scores, x, q, k=10):
    """Share of found ids scoring at least the exact k-th score (ties count as hits)."""
    kth = truth_scores[:, k - 1]
    got = np.einsum("nd,nkd->nk", q, x[np.where(found >= 0, found, 0)])
    return float(((found >= 0) & (got >= kth[:, None] - 1e-6)).sum() / (len(q) * k))


def test_auto_picks_by_size():
    assert choose_factory(1_000, 384).factory == "Flat"
    ivf = choose_factory(200_000, 384)
    assert ivf.tier == "ivf" and ivf.factory == f"IVF{nlist_for(200_000)},Flat" == "IVF1024,Flat"
    big = choose_factory(10_000_000, 384)
    assert big.tier == "compressed" and big.factory == "IVF8192,PQ48"
    assert pq_bytes_for(100) == 10 and pq_bytes_for(30) == 3
    assert choose_factory(5_000, 32, AutoPolicy(exact_max=100, compressed_min_bytes=0)).factory.startswith("IVF")


@pytest.mark.parametrize("policy, tier", [(AutoPolicy(exact_max=1000), "ivf"),
                                          (AutoPolicy(exact_max=1000, compressed_min_bytes=0), "compressed")])
def test_auto_index_reaches_recall_target_on_held_out_queries(data, policy, tier):
    x, q = data
    index, info = build_index(x, FaissSpec(policy=policy, recall_target=0.95, tune_queries=200))
    assert info["tier"] == tier and info["requested"] == "auto" and info["ntotal"] == len(x)
    params = info["search_params"]
    assert ("rerank" in params) == (tier == "compressed") and "nprobe" in params
    assert info["tuning"]["reached"] and info["tuning"]["validation_recall"] >= 0.93
    truth = ann.exact_search(x, q, 10)
    res = ann.search(index, q, 10, params=params, vectors=x)
    assert recall(res.positions, truth.scores, x, q) >= 0.93
    if tier == "compressed":  # re-ranked scores are exact inner products
        np.testing.assert_allclose(res.scores, np.einsum("nd,nkd->nk", q, x[res.positions]), atol=1e-5)


def test_tuning_picks_the_smallest_setting_and_more_recall_costs_more(data):
    x, _ = data
    index, _ = build_faiss(x, "IVF64,Flat")
    low, high = (tune(index, x, TuningConfig(recall_target=t, queries=150)) for t in (0.8, 0.99))
    assert low.params["nprobe"] <= high.params["nprobe"] and low.reached and high.reached
    below = [t for t in low.tried if t["params"]["nprobe"] < low.params["nprobe"]]
    assert all(t["recall"] < 0.8 for t in below)  # nothing cheaper would have done
    assert tune(build_faiss(x[:500], "Flat")[0], x[:500]).params == {}


def test_explicit_factory_and_hnsw_tunes_ef_search(data):
    x, q = data
    index, info = build_index(x, FaissSpec(factory="HNSW16", tune_queries=100))
    assert info["tier"] == "explicit" and "efSearch" in info["search_params"] and info["removal"] == "tombstones"
    with pytest.raises(ValueError, match="index-factory"):
        build_index(x, FaissSpec(factory="Nonsense42"))


def test_parameters_are_validated_against_the_index(data):
    x, _ = data
    flat = build_faiss(x[:100], "Flat")[0]
    with pytest.raises(ValueError, match="valid: rerank"):
        ann.parse_params({"nprobe": "4"}, flat)
    ivf = build_faiss(x, "IVF64,Flat")[0]
    assert ann.parse_params({"nprobe": "4", "rerank": "0"}, ivf) == {"nprobe": 4, "rerank": 0}
    with pytest.raises(ValueError, match="not a number"):
        ann.parse_params({"nprobe": "many"}, ivf)
    ivf.nprobe = 7  # a parameter object keeps the index's own values for keys it is not given
    assert ann.faiss_parameters(ivf, {}).nprobe == 7 and ann.faiss_parameters(ivf, {"nprobe": 3}).nprobe == 3
    assert supports_removal(ivf) and not supports_removal(flat)


@pytest.mark.parametrize("factory, params", [("IVF64,Flat", {"nprobe": 1}), ("HNSW16", {"efSearch": 16}),
                                             ("IVF64,PQ8", {"nprobe": 1, "rerank": 20}), ("Flat", {})])
@pytest.mark.parametrize("matching", [12, 600, 6000])
def test_selection_returns_k_hits_from_the_selection_whenever_k_qualify(data, factory, params, matching):
    x, q = data
    index, _ = build_faiss(x, factory)
    allowed = np.random.default_rng(3).choice(len(x), matching, replace=False)
    selection = ann.Selection.of(allowed, len(x))
    res = ann.search(index, q, 20, params=params, vectors=x, selection=selection)  # deliberately stingy params
    want = min(20, matching)
    assert (res.positions[:, :want] >= 0).all() and (res.positions[:, want:] < 0).all()
    assert np.isin(res.positions[:, :want], allowed).all()
    if matching >= 20:  # widening by WIDEN/fraction keeps recall near the unfiltered level
        truth = ann.exact_search(x, q, 20, np.sort(allowed))
        unfiltered = recall(ann.search(index, q, 20, params=params, vectors=x).positions,
                            ann.exact_search(x, q, 20).scores, x, q, k=20)
        assert recall(res.positions, truth.scores, x, q, k=20) >= min(unfiltered, 0.9) - 0.06


def test_exact_search_matches_numpy_in_blocks(data):
    x, q = data
    res = ann.exact_search(x, q[:7], 5, max_block_floats=7 * 1024)  # forces several blocks
    sims = q[:7] @ x.T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(res.positions, order)
    np.testing.assert_allclose(res.scores, np.take_along_axis(sims, order, 1), atol=1e-6)
    subset = np.arange(0, len(x), 5)
    sub = ann.exact_search(x, q[:3], 4, subset)
    assert np.isin(sub.positions, subset).all()


# ---- GPU dispatch, with the machine's facts injected ------------------------------------------

GPU = gpu.GpuFacts(gpu_module=True, devices=1)
NO_GPU = gpu.GpuFacts(gpu_module=True, devices=0)


def test_gpu_dispatch_decisions():
    ivf = faiss.index_factory(32, "IVF16,Flat", faiss.METRIC_INNER_PRODUCT)
    hnsw = faiss.index_factory(32, "HNSW8", faiss.METRIC_INNER_PRODUCT)
    pq = faiss.index_factory(32, "IVF16,PQ8", faiss.METRIC_INNER_PRODUCT)
    assert gpu.build_device(ivf, GPU) == "gpu" and gpu.build_device(pq, GPU) == "gpu"
    assert gpu.build_device(hnsw, GPU) == "cpu"  # no GPU HNSW
    assert gpu.build_device(ivf, NO_GPU) == "cpu" and gpu.build_device(ivf, gpu.GpuFacts(False, 2)) == "cpu"
    assert gpu.build_device(ivf, GPU, device="cpu") == "cpu"
    assert gpu.search_device(ivf, 1000, GPU, filtered=False) == "gpu"
    assert gpu.search_device(ivf, 1000, GPU, filtered=True) == "cpu"  # IDSelector is CPU-only
    assert gpu.search_device(ivf, 8, GPU, filtered=False) == "cpu"  # small batches do not pay
    assert gpu.search_device(hnsw, 1000, GPU, filtered=False) == "cpu"
    assert gpu.detect().available is (faiss.get_num_gpus() > 0 and hasattr(faiss, "StandardGpuResources"))
    with pytest.raises(ValueError, match="choose one of auto, cpu"):
        gpu.build_device(ivf, GPU, device="tpu")


def test_gpu_build_path_and_fallback_to_cpu(data, caplog):
    x, _ = data
    moved = []

    def fake_to_gpu(index):  # stands in for index_cpu_to_gpu: the "GPU" copy is a CPU clone
        moved.append(type(index).__name__)
        return faiss.clone_index(index)

    index = faiss.index_factory(32, "IVF16,Flat", faiss.METRIC_INNER_PRODUCT)
    built, device = gpu.train_and_add(index, x[:2000], lambda: iter([x[:3000], x[3000:]]), facts=GPU,
                                      to_gpu=fake_to_gpu, to_cpu=lambda i: i)
    assert device == "gpu" and built.ntotal == len(x) and moved == ["IndexIVFFlat"]
    assert not index.is_trained  # the CPU original was left alone

    def broken(index):
        raise RuntimeError("CUDA out of memory")

    with caplog.at_level(logging.WARNING):
        built, device = gpu.train_and_add(index, x[:2000], lambda: iter([x]), facts=GPU, to_gpu=broken)
    assert device == "cpu" and built.ntotal == len(x) and "building on the CPU" in caplog.text


def test_gpu_search_path_sets_parameters_and_matches_cpu(data):
    x, q = data
    index, _ = build_faiss(x, "IVF64,Flat")
    seen = {}

    def set_param(idx, key, value):
        seen[key] = value
        idx.nprobe = value

    searcher = gpu.GpuSearch(index, to_gpu=faiss.clone_index, set_param=set_param)
    on_gpu = searcher.search(q, 10, {"nprobe": 4}, vectors=x)
    on_cpu = ann.search(index, q, 10, params={"nprobe": 4}, vectors=x)
    assert seen == {"nprobe": 4}
    np.testing.assert_array_equal(on_gpu.positions, on_cpu.positions)


def test_identical_documents_tie_exactly_and_rank_by_position_in_a_batch_as_alone():
    """ann.settle_ties: float32 products of identical vectors differ in their last bits with a
    batch's shape (a bf16-built index swapped GOOG and GOOGL between a lookup batch and one
    query); near-tied hits are scored again pair by pair, so identical vectors tie exactly and the
    smaller position goes first, and hits apart by more than the tolerance keep their order."""
    from relsearch.indexer.ann import TIE_TOLERANCE, SearchResult, settle_ties

    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((6, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors[4] = vectors[1]  # a share class: the same text
    q = vectors[[1, 0]] + np.float32(0.1)  # row 0 nearest to 1 and its copy 4
    exact = [float(q[0].astype(np.float64) @ vectors[p].astype(np.float64)) for p in range(6)]
    ulp = np.spacing(np.float32(exact[1]))
    # as a noisy batch gives them: 4 a few ulps above 1, then the other three far apart
    others = sorted((p for p in (0, 2, 3, 5)), key=lambda p: -exact[p])
    noisy = SearchResult(np.asarray([[4, 1, *others], [0, 1, 2, 3, 4, 5]]),
                         np.asarray([[exact[1] + 2 * ulp, exact[1], *(exact[p] for p in others)],
                                     [1.0, 0.9, 0.9 - TIE_TOLERANCE * 10, 0.5, -np.inf, -np.inf]], np.float32))
    noisy.positions[1, 4:] = -1
    settled = settle_ties(noisy, q, vectors, 4)
    assert settled.positions[0, :2].tolist() == [1, 4] and settled.scores[0, 0] == settled.scores[0, 1]
    assert settled.positions[0, 2:].tolist() == others[:2]
    assert settled.positions[1].tolist() == [0, 1, 2, 3]  # nothing near: untouched, cut to k
    np.testing.assert_array_equal(settled.scores[1], noisy.scores[1, :4])
