"""Querying documents with several named texts (retrieval/fields.py, indexer/field_view.py): the
fused default, one field, --id of a document lacking a field, filters, highlights, explain,
the recorded share-class collapse, and the same through the CLI, the Python API and lookup
(HTTP: tests/cli_api/test_serve_text_fields.py)."""
import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

from relsearch.api import Index, RequestError
from relsearch.cli import cli
from relsearch.pipelines.index import IndexJob, run_index
from relsearch.retrieval.request import SearchOptions, run
from relsearch.retrieval.search import Query, Searcher
from conftest import write_jsonl

NAMES = ("text", "wiki", "bloomberg")
ROWS = [
    {"id": "XOM", "text": "Exxon Mobil explores for and produces crude oil and natural gas.",
     "wiki": "ExxonMobil is an American multinational oil and gas corporation.", "name": "Exxon", "sector": "Energy"},
    {"id": "CVX", "text": None, "wiki": "Chevron Corporation is an American multinational energy corporation "
     "predominantly specializing in oil and gas.", "name": "Chevron", "sector": "Energy"},
    {"id": "MSFT", "text": "Microsoft develops and licenses software, services and devices.",
     "wiki": "Microsoft Corporation is an American technology company that makes Windows.",
     "bloomberg": "Microsoft Corporation develops, manufactures, licenses, sells and supports software.",
     "name": "Microsoft", "sector": "Technology"},
    {"id": "ORCL", "bloomberg": "Oracle Corporation supplies database software and cloud services.",
     "name": "Oracle", "sector": "Technology"},
    {"id": "GOOG", "text": "Alphabet operates Google search, YouTube and cloud services.",
     "wiki": "Alphabet Inc. is the parent company of Google.", "name": "Alphabet Inc.", "sector": "Technology"},
    {"id": "GOOGL", "text": "Alphabet operates Google search, YouTube and cloud services.",
     "wiki": "Alphabet Inc. is the parent company of Google.", "name": "Alphabet Inc.", "sector": "Technology"},
    {"id": "KO", "text": "Coca-Cola makes and sells soft drinks and beverages.", "name": "Coca-Cola",
     "sector": "Consumer Staples"},
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """precision → the index of ROWS encoded in it, built once per module when first asked."""
    indexes = {}

    def build(precision: str):
        if precision not in indexes:
            tmp = tmp_path_factory.mktemp(f"multi-query-{precision}")
            corpus = write_jsonl(tmp / "corpus.jsonl", ROWS)
            report = run_index(IndexJob(input=str(corpus), index=str(tmp / "idx"), text_field="text",
                                        text_fields=NAMES, collapse_field="name", precision=precision, progress=False))
            assert (report.indexed, report.rejected) == (7, 0)
            indexes[precision] = tmp / "idx"
        return indexes[precision]
    return build


@pytest.fixture(scope="module")
def multi(built):
    return built("fp32")


@pytest.fixture(scope="module")
def searcher(multi):
    return Searcher(str(multi))


def ids(hits):
    return [h.id for h in hits]


def test_fused_search_is_the_best_field_score_and_finds_documents_with_one_text(searcher):
    q = [Query(text="database software and cloud"), Query(text="oil and gas energy company")]
    fused = run(searcher, q, SearchOptions(k=7, collapse=False))
    per_field = {name: run(searcher, q, SearchOptions(k=7, field=name, collapse=False)) for name in NAMES}
    for i in range(len(q)):
        best = {}
        for name in NAMES:
            for h in per_field[name][i]:
                if h.id not in best or h.score > best[h.id][0]:
                    best[h.id] = (h.score, name)
        assert {h.id: (pytest.approx(h.score), h.field) for h in fused[i]} == \
            {d: (pytest.approx(s), f) for d, (s, f) in best.items()}
        assert [h.score for h in fused[i]] == sorted((h.score for h in fused[i]), reverse=True)
    assert "ORCL" in ids(fused[0]) and dict((h.id, h.field) for h in fused[0])["ORCL"] == "bloomberg"
    assert ids(fused[1])[:2] == ["XOM", "CVX"] or ids(fused[1])[:2] == ["CVX", "XOM"]  # CVX has no Yahoo-like text
    # one field: only documents having it, each showing that field's text
    wiki = per_field["wiki"][1]
    assert set(ids(wiki)) == {"XOM", "CVX", "MSFT", "GOOG", "GOOGL"}
    assert next(h for h in wiki if h.id == "XOM").text.startswith("ExxonMobil is")
    assert all(h.field is None for h in wiki)


def _fused_hit_by_hit(per_field, names, fetch):
    """The fusion as first written, over every field's built hits: the reference fuse_max keeps."""
    out = []
    for rows in zip(*per_field):
        best = {}
        for name, hits in zip(names, rows):
            for hit in hits:
                held = best.get(hit.id)
                if held is None or hit.score > held.score:
                    best[hit.id] = dataclasses.replace(hit, field=name)
        out.append(sorted(best.values(), key=lambda h: (-h.score, h.id))[:fetch])
    return out


@pytest.mark.parametrize("relations", [{"similar-company": 1.0}, {"identity": 1.0}])
@pytest.mark.parametrize("explain", [False, True])
def test_fusion_builds_only_the_hits_it_keeps_and_keeps_what_every_fields_hits_give(searcher, relations, explain):
    """fuse_max reads each field's columns (ids and scores) and builds the hits it keeps alone: the
    same hits, scores, texts, fields and ties (GOOG and GOOGL have the same texts: by id) as fusing
    every field's built hits, for a recipe and plain cosine, with explain or not, one batch
    (columns) or two (id and text queries resolve apart: lists)."""
    from relsearch.retrieval.fields import fuse_max
    from relsearch.retrieval.hits import HitColumns
    from relsearch.retrieval.request import plan

    by_id = [Query(doc_id=d, relations=relations) for d in ("GOOG", "CVX", "ORCL")]
    by_text = [Query(text=t, relations=relations) for t in ("Alphabet Google search and YouTube", "oil and gas")]
    for queries, one_batch in ((by_id, True), (by_text, True), (by_id + by_text, False)):  # two scorings
        found = plan(searcher, queries, SearchOptions(k=5, collapse=False, explain=explain))
        names = [b.field for b in found.fields]
        assert names == list(NAMES)
        for fetch in (3, 7):
            columns = found.per_field(fetch, columns=True)
            if one_batch:  # a recipe explained comes as lists, plain cosine as columns with its explain
                assert all(isinstance(c, HitColumns) for c in columns) is not (explain and "identity" not in relations)
            built = [[list(row) for row in field] for field in found.per_field(fetch)]
            want = _fused_hit_by_hit(built, names, fetch)
            assert fuse_max(columns, names, fetch) == want == fuse_max(built, names, fetch) == found.ranked(fetch)
            assert all(h.field in NAMES and h.text for row in want for h in row)
        if one_batch and queries is by_text:  # the ties are there: GOOG and GOOGL score alike in every field
            google = {h.id: h.score for h in found.ranked(7)[0]}
            assert google["GOOG"] == google["GOOGL"]


def test_pages_of_the_fused_ranking_tile(searcher):
    q = [Query(text="software company")]
    whole = ids(run(searcher, q, SearchOptions(k=6, collapse=False))[0])
    pages = [ids(run(searcher, q, SearchOptions(k=2, offset=o, collapse=False))[0]) for o in (0, 2, 4)]
    assert sum(pages, []) == whole


def test_id_queries_use_the_documents_own_texts(searcher):
    hits = run(searcher, [Query(doc_id="CVX")], SearchOptions(k=6, collapse=False))[0]
    assert "CVX" not in ids(hits) and ids(hits)[0] == "XOM"
    # CVX has no text of field "text": its query there starts from the mean of the texts it has
    text_view = searcher.for_field("text")
    files = text_view.files
    p = files.docstore.positions(["CVX"])["CVX"]
    assert np.allclose(files.raw_rows(np.asarray([p])), searcher.for_field("wiki").files.raw_rows(np.asarray([p])))
    assert "CVX" not in ids(run(searcher, [Query(doc_id="CVX")], SearchOptions(k=6, field="text"))[0])


def test_filters_highlights_and_explain_name_the_field(searcher):
    hits = run(searcher, [Query(text="software")], SearchOptions(k=5, filters={"sector": "Technology"},
                                                                 hybrid="rrf", highlight=True, explain=True))[0]
    assert hits and {h.metadata["sector"] for h in hits} == {"Technology"}
    orcl = next(h for h in hits if h.id == "ORCL")
    assert orcl.field == "bloomberg" and orcl.text.startswith("Oracle")
    start, end = orcl.highlights[0]
    assert orcl.text[start:end].lower() == "software"  # offsets into the matched field's text
    assert json.loads(json.dumps(orcl.to_json()))["field"] == "bloomberg"


def test_share_classes_collapse_by_default_on_the_recorded_field(searcher):
    assert searcher.files.manifest.collapse == "name"
    default = [ids(hits) for hits in run(searcher, [Query(doc_id="GOOG"), Query(text="Google search")],
                                         SearchOptions(k=6))]
    assert "GOOGL" not in default[0]
    assert default[1].count("GOOG") + default[1].count("GOOGL") == 1
    off = ids(run(searcher, [Query(doc_id="GOOG")], SearchOptions(k=6, collapse=False))[0])
    assert off[0] == "GOOGL"


def test_unknown_field_is_one_line_listing_the_fields(multi):
    index = Index(multi)
    with pytest.raises(RequestError) as e:
        index.search("oil", field="yahoo")
    assert (e.value.field, str(e.value)) == ("field", "unknown text field 'yahoo'; this index's text fields: "
                                                      "text, wiki, bloomberg")
    result = CliRunner().invoke(cli, ["query", "oil", "--index", str(multi), "--field", "yahoo"])
    assert result.exit_code != 0
    assert result.output.strip().splitlines()[-1] == ("Error: --field: unknown text field 'yahoo'; this index's "
                                                      "text fields: text, wiki, bloomberg")


def test_cli_query_shows_the_matched_field_and_takes_no_collapse(multi):
    out = CliRunner().invoke(cli, ["query", "--id", "GOOG", "--index", str(multi), "-k", "3", "--no-collapse", "--json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines() if line.startswith("{")]
    assert rows[0]["id"] == "GOOGL" and rows[0]["field"] in NAMES
    table = CliRunner().invoke(cli, ["query", "oil", "--index", str(multi), "-k", "2"])
    assert table.exit_code == 0 and "field" in table.output.splitlines()[0]


def test_lookup_collapses_share_classes_and_searches_one_field(multi, tmp_path):
    anchors = write_jsonl(tmp_path / "anchors.jsonl", [{"id": "GOOG"}, {"id": "ORCL"}])
    out = tmp_path / "peers.jsonl"
    for extra, expect_googl in (([], False), (["--no-collapse"], True)):
        result = CliRunner().invoke(cli, ["lookup", str(anchors), "--index", str(multi), "-k", "6", "--out", str(out),
                                          *extra])
        assert result.exit_code == 0, result.output
        goog = json.loads(out.read_text().splitlines()[0])
        assert ("GOOGL" in [r["id"] for r in goog["results"]]) is expect_googl
    result = CliRunner().invoke(cli, ["lookup", str(anchors), "--index", str(multi), "-k", "6", "--out", str(out),
                                      "--field", "bloomberg"])
    assert result.exit_code == 0, result.output
    orcl = json.loads(out.read_text().splitlines()[1])
    assert [r["id"] for r in orcl["results"]] == ["MSFT"]  # the one other document with a bloomberg text


@pytest.mark.parametrize("precision", ["fp32", "bf16"])  # bf16 runs on any CPU: slower without its instructions
def test_a_lookup_of_peers_answers_each_anchor_as_its_query_over_every_text(built, precision, tmp_path):
    """The Russell lookup's shape (docs/companies.md) on a small index of three texts: a recipe,
    --same, the recorded collapse and --fields, anchors in batches of two and all at once; each
    anchor's peers are its query's (the same ids and scores, to the rounding of a batched matrix
    product), never itself nor its share class — in an fp32 and a bf16 index (on an AVX-512 BF16
    CPU, GOOG and GOOGL once swapped between a batch and a single query)."""
    from relsearch.pipelines.lookup import LookupJob, run_lookup

    multi = built(precision)
    searcher = Searcher(str(multi))

    anchors = [r["id"] for r in ROWS]
    path = write_jsonl(tmp_path / "anchors.jsonl", [{"id": a} for a in anchors])
    outputs = []
    for batch_size in (2, 256):
        out = tmp_path / f"peers-{batch_size}.jsonl"
        report = run_lookup(LookupJob(input=str(path), index=str(multi), out=str(out), relations={"similar-company": 1},
                                      k=3, same=("sector",), fields=("name",), batch_size=batch_size))
        assert (report.answered, report.rejected) == (len(anchors), 0)
        outputs.append([json.loads(line) for line in out.read_text().splitlines()])
    for anchor, *rows in zip(anchors, *outputs):
        sector = next(r["sector"] for r in ROWS if r["id"] == anchor)
        want = run(searcher, [Query(doc_id=anchor, relations={"similar-company": 1})],
                   SearchOptions(k=3, filters={"sector": sector}, fields=["name"]))[0]
        for row in rows:
            assert row["query_id"] == anchor
            # (not the field: GOOG tops two fields at 1.0, and which one's 1.0 is rounded lower moves with the batch)
            assert [(r["id"], r["metadata"]) for r in row["results"]] == [(h.id, {"name": h.metadata["name"]})
                                                                            for h in want]
            assert all(r["field"] in NAMES for r in row["results"])
            assert [r["score"] for r in row["results"]] == pytest.approx([h.score for h in want], abs=2e-6)
    goog = next(row for row in outputs[1] if row["query_id"] == "GOOG")
    assert sorted(r["id"] for r in goog["results"]) == ["MSFT", "ORCL"]  # no GOOGL: one issuer


def test_rerank_reads_the_vectors_of_the_matched_field(searcher):
    from relsearch.retrieval.hits import Hit
    from relsearch.retrieval.rerank import document_vectors

    wiki = searcher.for_field("wiki")
    p = searcher.files.docstore.positions(["CVX"])["CVX"]
    expected = wiki.files.raw_rows(np.asarray([p]))[0]
    assert np.linalg.norm(expected) > 0  # CVX has a wiki text (and no text of field 0: a zero row there)
    fused_hit = Hit("CVX", 0.5, "", {}, field="wiki")
    assert np.allclose(document_vectors(searcher, [fused_hit])[0], expected, atol=1e-5)
    assert np.allclose(document_vectors(wiki, [Hit("CVX", 0.5, "", {})])[0], expected, atol=1e-5)
