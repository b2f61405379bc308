"""Issue-level checks with the shipped relation pack on real held-out data."""
import hashlib
import json

import numpy as np
import pytest

from relsearch.encoder.bundle import default_bundle_path, is_bundle
from relsearch.pipelines.index import IndexJob, run_index
from relsearch.retrieval.search import Query, Searcher
from conftest import DEMO_CORPUS, shared, write_jsonl

pytestmark = pytest.mark.skipif(not is_bundle(default_bundle_path()), reason="relation pack not built")


def sid(text: str) -> str:
    return "s" + hashlib.sha1(text.encode()).hexdigest()[:12]


def test_trecqa_qa_entailment_ranks_gold_answers_higher_than_identity(tmp_path):
    """TrecQA test split: index every candidate sentence, ask the clean questions (≥1 right and
    ≥1 wrong candidate) through batched queries, compare the MRR of the first gold answer."""
    rows = [json.loads(line) for line in shared("trecqa", "queries", "test.jsonl").read_text().splitlines()]
    sentences = sorted({c for r in rows for c in r["candidates"]})
    run_index(IndexJob(input=str(write_jsonl(tmp_path / "c.jsonl", [{"id": sid(s), "text": s} for s in sentences])),
                       index=str(tmp_path / "idx"), progress=False))
    clean = [r for r in rows if 0 < sum(r["labels"]) < len(r["labels"])]
    gold = [{sid(c) for c, y in zip(r["candidates"], r["labels"]) if y} for r in clean]
    searcher = Searcher(str(tmp_path / "idx"))
    mrr = {}
    for relation in ("identity", "qa-entailment"):
        results = searcher.search([Query(text=r["question"], relations={relation: 1.0}) for r in clean],
                                  k=len(sentences))
        ranks = [next(i for i, h in enumerate(hits, 1) if h.id in g) for hits, g in zip(results, gold)]
        mrr[relation] = float(np.mean([1 / r for r in ranks]))
    print(f"TrecQA test ({len(clean)} questions, {len(sentences)} candidates): MRR {mrr}")
    assert mrr["qa-entailment"] > mrr["identity"]


def test_similar_company_query_on_the_demo_corpus(tmp_path):
    run_index(IndexJob(input=str(DEMO_CORPUS), index=str(tmp_path / "sp"), progress=False))
    hits = Searcher(str(tmp_path / "sp")).search([Query(doc_id="MSFT", relations={"similar-company": 1.0})], k=5)[0]
    assert len(hits) == 5 and "MSFT" not in {h.id for h in hits}
