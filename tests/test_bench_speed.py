"""bench speed measures what it says (behaviour only; no timing thresholds)."""
import pytest

from relsearch.bench import speed
from conftest import SHARED_DATA, shared


def test_real_sentences_are_distinct_and_seeded():
    shared("stsb")
    a = speed.real_sentences(300, data_dir=SHARED_DATA)
    assert len(set(a)) == 300 and a == speed.real_sentences(300, data_dir=SHARED_DATA)


def test_querying_compares_the_same_index_through_both_paths(small_index):
    result = speed.querying(small_index, ["a bank", "a software company", "oil and gas"], repeats=1)
    assert result["batch"] == 120 and result["relsearch_qps"] > 0 and result["raw_faiss_qps"] > 0
    assert result["relsearch_over_faiss_qps"] == pytest.approx(result["relsearch_qps"] / result["raw_faiss_qps"])
    assert "machine:" in speed.format_table({
        "machine": speed.machine_info(),
        "encoding": {"texts": 1, "precision": "bf16", "sentence_transformers_per_s": 1.0, "relsearch_per_s": 5.0,
                     "ratio": 5.0, "min_cosine_to_fp32": 0.9999},
        "indexing": {"documents": 1, "pure_encoding_s": 1.0, "index_wall_s": 1.0, "index_over_encoding": 1.0},
        "querying": result})
