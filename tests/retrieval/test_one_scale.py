"""One scale across a document's texts (retrieval/recipe_search.py), on real company texts: the
Russell 3000 corpus's Communication Services and Energy companies, three texts each, as
docs/companies.md indexes them. Normalised field by field, every text's best hit scored the top
of the scale, so a multi-text answer was full of ties whose order moved with k and offset."""
import json

import pytest

from relsearch.pipelines.index import IndexJob, run_index
from relsearch.retrieval.request import SearchOptions, run
from relsearch.retrieval.search import Query, Searcher
from conftest import shared, write_jsonl

NAMES = ("text", "text_wikipedia", "text_bloomberg")
SECTORS = {"Communication Services": 80, "Energy": 40}  # companies taken from each, in corpus order
MIXTURES = [{"similar-company": 1.0}, {"similar-company": 0.5, "identity": 0.5}]


@pytest.fixture(scope="module")
def companies(tmp_path_factory):
    taken, rows = dict.fromkeys(SECTORS, 0), []
    for line in open(shared("russell3000_companies", "corpus.jsonl")):
        row = json.loads(line)
        sector = row.get("gics_sector")
        if sector in SECTORS and taken[sector] < SECTORS[sector] and any(row.get(f) for f in NAMES):
            taken[sector] += 1
            rows.append(row)
    tmp = tmp_path_factory.mktemp("one-scale")
    report = run_index(IndexJob(input=str(write_jsonl(tmp / "corpus.jsonl", rows)), index=str(tmp / "idx"),
                                text_field="text", text_fields=NAMES, collapse_field="name", progress=False))
    assert report.indexed == len(rows)
    return Searcher(str(tmp / "idx")), [r["id"] for r in rows]


def _page(searcher, anchor, relations, **options):
    [hits] = run(searcher, [Query(doc_id=anchor, relations=relations)], SearchOptions(**options))
    return [(h.id, h.score) for h in hits]


@pytest.mark.parametrize("relations", MIXTURES, ids=["relation", "with-identity"])
def test_pages_agree_at_any_k_and_offset_over_three_texts(companies, relations):
    searcher, ids = companies
    for anchor in ids[::10]:
        ten = _page(searcher, anchor, relations, k=10)
        assert len(ten) == 10
        assert _page(searcher, anchor, relations, k=5) == ten[:5]
        assert _page(searcher, anchor, relations, k=100)[:10] == ten
        assert _page(searcher, anchor, relations, k=5, offset=5) == ten[5:]
        assert _page(searcher, anchor, relations, k=3, offset=3) == ten[3:6]
        scores = [s for _, s in ten]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("relations", MIXTURES, ids=["relation", "with-identity"])
def test_only_the_best_dense_score_over_every_text_tops_the_scale(companies, relations):
    """A hit's ``recipe:dense`` part is at its top (1 − b) only when its raw dense score is the
    query's best over every text field, not merely its own field's best."""
    searcher, ids = companies
    topped = 0
    for anchor in ids[::10]:
        [hits] = run(searcher, [Query(doc_id=anchor, relations=relations)], SearchOptions(k=20, explain=True))
        top = max(h.explain["recipe:dense"] for h in hits)
        best = {round(h.explain["dense"], 6) for h in hits if h.explain["recipe:dense"] == top}
        assert len(best) == 1, (anchor, [(h.id, h.field, h.explain["dense"]) for h in hits])
        assert max(h.explain["dense"] for h in hits) == pytest.approx(best.pop(), abs=1e-6)
        topped += sum(h.explain["recipe:dense"] == top for h in hits)
    assert topped <= len(ids[::10]) + 2  # share classes and verbatim shared texts aside, one per query
