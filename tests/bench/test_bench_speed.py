"""bench speed measures what it says (behaviour only; no timing thresholds)."""
import pytest

from relsearch.bench import speed
from conftest import SHARED_DATA, shared
from conftest import demo_texts as texts


def test_real_sentences_are_distinct_and_seeded():
    shared("stsb")
    a = speed.real_sentences(300, data_dir=SHARED_DATA)
    assert len(set(a)) == 300 and a == speed.real_sentences(300, data_dir=SHARED_DATA)


def test_querying_compares_the_same_index_through_both_paths(small_index):
    result = speed.querying(small_index, ["a bank", "a software company", "oil and gas"], repeats=1)
    assert result["batch"] == 120 and result["relsearch_qps"] > 0 and result["raw_faiss_qps"] > 0
    assert result["relsearch_over_faiss_qps"] == pytest.approx(result["relsearch_qps"] / result["raw_faiss_qps"])
    assert result["relsearch_over_faiss_with_docs_qps"] == pytest.approx(
        result["relsearch_qps"] / result["raw_faiss_with_docs_qps"])
    assert result["relsearch_every_hit_built_qps"] > 0 and result["plan_qps"] > 0
    assert result["plan_over_faiss_qps"] == pytest.approx(result["plan_qps"] / result["raw_faiss_qps"])
    assert result["plan_over_every_hit_built_qps"] == pytest.approx(
        result["plan_qps"] / result["relsearch_every_hit_built_qps"])
    table_input = {
        "machine": speed.machine_info(),
        "encoding": {"texts": 1, "device": "cpu", "attention": "sdpa", "precision": "bfloat16",
                     "precision_reason": "bf16: avx512_bf16; the probe ran bf16 3.1x fp32's speed",
                     "sentence_transformers_per_s": 1.0, "relsearch_per_s": 5.0, "ratio": 5.0,
                     "min_cosine_to_fp32": 0.9999, "model_only_per_s": 5.5, "relsearch_over_model_only": 0.91,
                     "model_flops_per_sentence": 4e8, "relsearch_flop_per_s": 2e9, "fp32_per_s": 1.5,
                     "matrix_limit_flop_per_s": {"float32": 1e9, "bfloat16": 4e9}, "relsearch_over_matrix_limit": 0.5,
                     "probe": "(a) @ (b)"},
        "indexing": {"documents": 1, "rounds": 3, "pure_encoding_s": 1.0, "index_wall_s": 1.0, "index_over_encoding": 1.0,
                     "beam_import_s": 0.5, "index_with_import_over_encoding": 1.5},
        "querying": result}
    table = speed.format_table(table_input)
    assert "machine:" in table and table.count("50% of the bfloat16 matrix limit") == 1
    assert "precision: bfloat16, chosen by `auto`: bf16: avx512_bf16; the probe ran bf16 3.1x" in table
    assert "ratio 1.000   (1.500 counting 0.5 s of importing Beam" in table
    assert "(a) @ (b): float32 1.0 GFLOP/s, bfloat16 4.0 GFLOP/s" in table and "float32 (one run" in table
    assert "vs raw FAISS search alone" in table and "vs raw FAISS + the same documents in one SQL read" in table
    assert "through the query plan (request.run" in table and "of every hit built" in table
    fp32 = speed.format_table({**table_input, "encoding": {**table_input["encoding"], "precision": "float32",
                                                            "precision_asked": "fp32"}})
    assert "precision: float32, asked for" in fp32 and "chosen by" not in fp32


def test_the_raw_faiss_baseline_reads_the_documents_a_hit_shows(small_index):
    import numpy as np

    from relsearch.retrieval.search import Searcher

    searcher = Searcher(str(small_index))
    rows = speed.raw_fetch(searcher.files.segments[0].docstore.conn, np.array([[4, 2, -1], [2, 7, 4]]))
    docs = searcher.files.docstore.get([2, 4, 7])
    assert [(p, i, t) for p, i, t, _ in rows] == [(p, docs[p]["id"], docs[p]["text"]) for p in (2, 4, 7)]


def test_the_raw_faiss_baseline_searches_with_the_parameters_relsearch_uses(tmp_path):
    """An IVF index stores nprobe 1 (FAISS's default); relsearch searches with the tuned or given
    nprobe, and so does the baseline: the same positions, so the ratio compares like with like."""
    import numpy as np

    from relsearch.retrieval.search import Searcher
    from synthetic_index import QUERIES, build

    target = tmp_path / "ivf"
    build(target, n=2000, factory="IVF32,Flat")
    searcher = Searcher(str(target), search_params={"nprobe": 8})
    assert searcher.files.faiss.nprobe == 1 and searcher.effective_params()["nprobe"] == 8
    found = speed.raw_search(searcher, QUERIES, 10)()
    np.testing.assert_array_equal(found, searcher.ann(QUERIES, 10).positions)
    assert not np.array_equal(found, searcher.files.faiss.search(QUERIES, 10)[1])  # nprobe 1 finds others


def test_model_flops_counts_projections_feed_forward_and_attention_by_hand():
    from types import SimpleNamespace

    from relsearch.bench.limits import model_flops

    cfg = SimpleNamespace(hidden_size=2, intermediate_size=3, num_hidden_layers=2)
    # per token 8·d² + 4·d·ffn = 56; attention 4·L²·d = 8 (L=1) and 32 (L=2); two layers
    assert model_flops(cfg, [1, 2]) == 2 * ((56 + 8) + (2 * 56 + 32))


def test_encoding_reports_the_limits_it_measured_beside_sentence_transformers(monkeypatch):
    pytest.importorskip("sentence_transformers")
    from relsearch.bench import limits

    monkeypatch.setattr(limits, "PROBE_ROWS", 256)  # the probe's size, not its logic, costs time
    e = speed.encoding([t[:120] for t in texts(24)], repeats=1, device="cpu")
    assert e["device"] == "cpu" and e["min_cosine_to_fp32"] > 0.999
    matrix = e["matrix_limit_flop_per_s"]
    assert sorted(matrix) == ["bfloat16", "float32"] and min(matrix.values()) > 0  # both dtypes, whichever runs
    assert e["model_flops_per_sentence"] > 1e6 and e["model_only_per_s"] > 0 and e["fp32_per_s"] > 0
    assert e["relsearch_over_matrix_limit"] == pytest.approx(e["relsearch_flop_per_s"] / matrix[e["precision"]])
    assert e["relsearch_flop_per_s"] == pytest.approx(e["model_flops_per_sentence"] * e["relsearch_per_s"])
    assert e["relsearch_over_model_only"] == pytest.approx(e["relsearch_per_s"] / e["model_only_per_s"])


def test_bench_speed_on_a_missing_device_says_so_in_one_line():
    import torch
    from click.testing import CliRunner

    from relsearch.cli_bench import bench

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = CliRunner().invoke(bench, ["speed", "--device", "cuda", "--sentences", "10"])
    assert result.exit_code == 1 and "no CUDA device here" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(bench, ["speed", "--device", "tpu"])
    assert result.exit_code == 1 and "choose cpu or cuda" in result.output


def test_indexing_times_interleaved_rounds_each_into_a_fresh_index(tmp_path):
    r = speed.indexing([t[:80] for t in texts(30)], tmp_path, device="cpu", repeats=2, precision="fp32")
    assert r["rounds"] == 2 and r["documents"] == 30
    assert r["index_over_encoding"] == pytest.approx(r["index_wall_s"] / r["pure_encoding_s"])
    assert sorted(p.name for p in tmp_path.glob("idx*")) == ["idx0", "idx1"]  # both jobs built and published


def test_the_scale_check_times_bench_speeds_batch_and_the_plan_beside_raw_faiss(tmp_path, monkeypatch):
    """python -m relsearch.bench.scale, small: every timed path runs, and the ratios of the --id
    batch (Searcher.search, the plan) are taken against FAISS searching those same documents."""
    import argparse

    import numpy as np

    from relsearch.bench import scale
    from synthetic_index import encoder_identity

    base = np.random.default_rng(0).standard_normal((200, 384)).astype(np.float32)
    monkeypatch.setattr(scale, "encode_base", lambda *a: (base, encoder_identity()))  # no model to load
    args = argparse.Namespace(corpus="unused", base=200, n=3000, noise=1.0, queries=80, k=5, recall_target=0.9,
                              factory="IVF16,Flat", add_workers=1, repeats=1, seed=0, cache=None,
                              out=str(tmp_path / "out"), keep=False)
    report = scale.run(args)
    assert set(report["qps_median"]) == {"faiss", "relsearch", "relsearch+docs", "faiss+docs", "faiss_ids",
                                         "search", "plan"}
    assert report["ratio_search_vs_faiss_ids_paired_median"] == pytest.approx(
        report["qps_median"]["search"] / report["qps_median"]["faiss_ids"], rel=1e-3)
    assert report["ratio_plan_vs_faiss_ids_paired_median"] > 0 and report["faiss"]["factory"] == "IVF16,Flat"


def test_the_query_part_runs_alone_on_an_index_already_built(monkeypatch, capsys, tmp_path):
    """python -m relsearch.bench.speed --index DIR: querying() on that index with bench speed's texts,
    printed as bench speed prints it."""
    seen = {}

    def querying(index_dir, queries, *, repeats, precision):
        seen.update(index=index_dir, queries=len(queries), repeats=repeats)
        return {"k": 10, "relation": "r", "latency_ms_identity_p50": 1.0, "latency_ms_identity_p95": 2.0,
                "latency_ms_relation_p50": 1.0, "latency_ms_relation_p95": 2.0, "batch": 1000, "faiss": "IVF8,Flat",
                "search_params": {"nprobe": 2}, "relsearch_qps": 90.0, "raw_faiss_qps": 100.0,
                "relsearch_over_faiss_qps": 0.9, "raw_faiss_with_docs_qps": 80.0,
                "relsearch_over_faiss_with_docs_qps": 1.125, "relsearch_every_hit_built_qps": 60.0, "plan_qps": 50.0,
                "plan_over_faiss_qps": 0.5, "plan_over_every_hit_built_qps": 0.8333}

    monkeypatch.setattr(speed, "querying", querying)
    monkeypatch.setattr(speed, "real_sentences", lambda n: [f"s{i}" for i in range(n)])
    speed.main(["--index", str(tmp_path), "--repeats", "2"])
    out = capsys.readouterr().out
    assert seen == {"index": tmp_path, "queries": 500, "repeats": 2}
    assert 'IVF8,Flat {"nprobe": 2} on both sides' in out and "ratio 0.900" in out and "0.500 of raw FAISS" in out
