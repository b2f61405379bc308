"""The Beam lookup job on the small real index: oracle against Searcher.search, --same, --filter,
rejections with reasons, new text, atomic output, and the click command."""
import json
import os

import pytest
from click.testing import CliRunner

from relsearch.cli_lookup import lookup
from relsearch.indexer import records as rec
from relsearch.pipelines import lookup as lk
from relsearch.pipelines.lookup import LookupInputError, LookupJob, run_lookup
from relsearch.retrieval.search import Query, Searcher
from conftest import write_jsonl

SECTOR = "gics_sector"


@pytest.fixture(scope="module")
def searcher(small_index):
    return Searcher(str(small_index))


@pytest.fixture(scope="module")
def docs(searcher):
    """id → metadata of every indexed document."""
    n = searcher.files.docstore.count()
    return {d["id"]: d["metadata"] for d in searcher.files.docstore.get(list(range(n))).values()}


def run(tmp_path, small_index, rows, **kw):
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    report = run_lookup(LookupJob(input=str(inp), index=str(small_index), out=str(tmp_path / "out.jsonl"), **kw))
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    rejected = [json.loads(line) for line in (tmp_path / "out.rejected.jsonl").read_text().splitlines()]
    return report, out, rejected


def same_hits(results, hits) -> bool:
    """Result rows equal to Searcher hits: ids exactly, scores to float32 noise (a batched matrix product
    and a single query's may differ in the last bit, which 6-decimal rounding can turn into 1e-6)."""
    return [r["id"] for r in results] == [h.id for h in hits] and all(
        abs(r["score"] - float(h.score)) <= 2e-6 for r, h in zip(results, hits))


def test_id_inputs_equal_searcher_search_in_input_order_without_self(tmp_path, small_index, searcher, docs):
    ids = list(docs)[::3][:40]  # 40 inputs, two batches of 32 and a remainder
    report, out, rejected = run(tmp_path, small_index, [{"id": i} for i in ids], k=7, batch_size=32)
    assert (report.read, report.answered, report.rejected) == (40, 40, 0) and rejected == []
    assert [o["query_id"] for o in out] == ids
    expected = searcher.search([Query(doc_id=i) for i in ids], k=7)
    for o, hits in zip(out, expected):
        assert o["query_id"] not in {r["id"] for r in o["results"]} and len(o["results"]) == 7
        assert same_hits(o["results"], hits)
        # issue 28 item 7: no text and no metadata unless asked (a company's metadata holds long texts)
        assert all("text" not in r and r["metadata"] == {} for r in o["results"])
    assert report.id_lookups == 40 and report.id_search_seconds > 0 and "id lookups/s" in report.throughput()


def test_same_field_gives_k_results_from_the_query_group(tmp_path, small_index, searcher, docs):
    sectors = {i: m.get(SECTOR) for i, m in docs.items()}
    ids = [i for i, s in sectors.items() if s][:30] + [next(i for i, s in sectors.items() if s is None)]
    it = "Information Technology"
    rows = [{"id": i} for i in ids] + [
        {"id": "new-chip", "text": "designs and sells semiconductors", SECTOR: it},
        {"id": "new-bank", "text": "a retail bank"}]  # new text without the --same field
    report, out, rejected = run(tmp_path, small_index, rows, k=5, same=(SECTOR,), batch_size=8, with_text=True,
                                fields=(SECTOR,))
    assert (report.read, report.answered, report.rejected) == (33, 31, 2)
    assert [(r["line"], r["reason"]) for r in rejected] == [(31, lk.MISSING_SAME_FIELD), (33, lk.MISSING_SAME_FIELD)]
    assert [o["query_id"] for o in out] == ids[:30] + ["new-chip"]
    for o in out:
        value = it if o["query_id"] == "new-chip" else sectors[o["query_id"]]
        group = sum(s == value for i, s in sectors.items() if i != o["query_id"])
        assert len(o["results"]) == min(5, group) and {r["metadata"][SECTOR] for r in o["results"]} == {value}
        assert all(list(r["metadata"]) == [SECTOR] for r in o["results"])  # --fields: that field alone
        assert o["query_id"] not in {r["id"] for r in o["results"]} and o["results"][0]["text"]
    first = out[0]  # equal to an exact search within the query's own group
    hits = searcher.search([Query(doc_id=first["query_id"])], k=5, filters={SECTOR: sectors[first["query_id"]]})[0]
    assert same_hits(first["results"], hits)


def test_filter_is_an_exact_metadata_match(tmp_path, small_index, searcher, docs):
    ids = list(docs)[:12]
    flt = {SECTOR: "Health Care"}
    report, out, _ = run(tmp_path, small_index, [{"id": i} for i in ids], k=4, filters=flt, with_metadata=True)
    assert report.answered == 12
    expected = searcher.search([Query(doc_id=i) for i in ids], k=4, filters=flt)
    for o, hits in zip(out, expected):
        assert {r["metadata"][SECTOR] for r in o["results"]} == {"Health Care"} and len(o["results"]) == 4
        assert same_hits(o["results"], hits)
        assert all(r["metadata"] == docs[r["id"]] for r in o["results"])  # --with-metadata: every field


def test_unanswerable_lines_are_rejected_with_reasons_and_counts_reconcile(tmp_path, small_index):
    rows = [{"id": "ADBE"}, "{oops", "[1, 2]", {"text": "no id"}, {"id": "NO-SUCH-ID"}, {"id": "z", "text": "  "},
            "", {"id": "", "text": "x"}, {"id": "w", "text": ["list"]}, {"id": 7, "text": "a video game publisher"},
            {"id": "MMM"}]
    report, out, rejected = run(tmp_path, small_index, rows, k=3)
    assert (report.read, report.answered, report.rejected) == (11, 3, 8)
    assert report.summary().startswith("read 11, answered 3, rejected 8 (")
    assert [o["query_id"] for o in out] == ["ADBE", "7", "MMM"]
    assert [(r["line"], r["reason"]) for r in rejected] == [
        (2, rec.INVALID_JSON), (3, rec.NOT_OBJECT), (4, rec.MISSING_ID), (5, lk.UNKNOWN_ID), (6, rec.EMPTY_TEXT),
        (7, rec.EMPTY_LINE), (8, rec.EMPTY_ID), (9, rec.NON_STRING_TEXT)]
    assert "NO-SUCH-ID" in rejected[3]["detail"]


def test_new_text_equals_text_search_and_drops_its_own_id(tmp_path, small_index, searcher):
    adbe = searcher.files.docstore.get([searcher.files.docstore.positions(["ADBE"])["ADBE"]])
    adbe_text = next(iter(adbe.values()))["text"]
    text = "operates hospitals and outpatient surgery centers"
    report, out, _ = run(tmp_path, small_index, [{"id": "q1", "text": text}, {"id": "ADBE", "text": adbe_text}], k=5)
    assert report.answered == 2 and report.text_lookups == 2
    hits = searcher.search([Query(text=text)], k=5)[0]
    # encoded in another batch (other padding), so scores agree to ~1e-4, not bit for bit
    assert [r["id"] for r in out[0]["results"]] == [h.id for h in hits]
    assert [r["score"] for r in out[0]["results"]] == pytest.approx([h.score for h in hits], abs=2e-3)
    as_text = searcher.search([Query(text=adbe_text)], k=6)[0]
    assert as_text[0].id == "ADBE"  # the same text finds itself first; the job leaves it out
    assert [r["id"] for r in out[1]["results"]] == [h.id for h in as_text[1:]]


# --collapse: a company's own other share class is not its peer. In the demo data GOOG and GOOGL are
# the only companies headquartered in Mountain View, so hq_location says they are one company here.
HQ = "hq_location"


def collapsed_oracle(hits, own: dict, field: str, k: int) -> list[str]:
    """The first hit per value of ``field`` among ``hits`` (an uncollapsed search), none with ``own``'s
    value, first ``k``: written out here, not retrieval/paging.collapse."""
    seen = {json.dumps(own[field])} if field in own else set()
    out = []
    for h in hits:
        if field not in h.metadata:  # a group of its own
            out.append(h.id)
        elif json.dumps(h.metadata[field]) not in seen:
            out.append(h.id)
            seen.add(json.dumps(h.metadata[field]))
    return out[:k]


def test_collapse_keeps_one_result_per_value_and_never_the_querys_own(tmp_path, small_index, searcher, docs):
    ids = ["GOOG", "GOOGL", "ADBE", "MMM", "AAPL", "BAC"]
    plain = searcher.search([Query(doc_id="GOOG")], k=1)[0]
    assert plain[0].id == "GOOGL"  # uncollapsed, GOOG's first peer is its own other share class
    report, out, rejected = run(tmp_path, small_index, [{"id": i} for i in ids], k=6, collapse=HQ, fields=(HQ,))
    assert (report.answered, rejected) == (len(ids), [])
    wide = searcher.search([Query(doc_id=i) for i in ids], k=120)  # every document: the oracle's candidates
    for i, o, hits in zip(ids, out, wide):
        values = [json.dumps(r["metadata"][HQ]) for r in o["results"]]
        assert len(o["results"]) == 6 and len(set(values)) == 6, (i, values)
        assert json.dumps(docs[i][HQ]) not in values, i  # nothing from the query's own group
        assert [r["id"] for r in o["results"]] == collapsed_oracle(hits, docs[i], HQ, 6), i
        by_id = {h.id: h.score for h in hits}
        assert all(abs(r["score"] - by_id[r["id"]]) <= 2e-6 for r in o["results"])
    assert {"GOOG", "GOOGL"}.isdisjoint(r["id"] for o in out[:2] for r in o["results"])


def test_collapse_on_new_text_uses_the_lines_value_and_drops_its_own_id_first(tmp_path, small_index, searcher, docs):
    goog = next(iter(searcher.files.docstore.get([searcher.files.docstore.positions(["GOOG"])["GOOG"]]).values()))
    rows = [{"id": "GOOG", "text": goog["text"]},  # no hq_location on the line: a group of its own
            {"id": "GOOG", "text": goog["text"], HQ: docs["GOOG"][HQ]},  # the line says it is one of them
            {"id": "new-search", "text": goog["text"], HQ: 42}]  # a value no document has: nothing dropped
    report, out, _ = run(tmp_path, small_index, rows, k=5, collapse=HQ, fields=(HQ,))
    assert report.answered == 3
    as_text = searcher.search([Query(text=goog["text"])], k=120)[0]
    assert {h.id for h in as_text[:2]} == {"GOOG", "GOOGL"} and as_text[0].score == as_text[1].score  # one text
    no_self = [h for h in as_text if h.id != "GOOG"]
    # its own id goes before collapsing, so GOOGL, the best of the Mountain View group left, stays
    assert [r["id"] for r in out[0]["results"]] == collapsed_oracle(no_self, {}, HQ, 5)
    assert out[0]["results"][0]["id"] == "GOOGL"
    assert [r["id"] for r in out[1]["results"]] == collapsed_oracle(no_self, docs["GOOG"], HQ, 5)
    assert "GOOGL" not in {r["id"] for r in out[1]["results"]}
    assert [r["id"] for r in out[2]["results"]] == collapsed_oracle(as_text, {HQ: 42}, HQ, 5)


def test_collapse_widens_until_k_groups_and_keeps_same_and_filters(tmp_path, small_index, searcher, docs):
    """20 distinct places take more than 21 candidates (the search widens, as query --collapse does);
    with --same the groups come from the query's own sector only."""
    ids = ["GOOG", "ADBE", "MMM"]
    _, out, _ = run(tmp_path, small_index, [{"id": i} for i in ids], k=20, collapse=HQ, fields=(HQ, SECTOR))
    wide = searcher.search([Query(doc_id=i) for i in ids], k=120)
    for i, o, hits in zip(ids, out, wide):
        assert [r["id"] for r in o["results"]] == collapsed_oracle(hits, docs[i], HQ, 20)
        assert len(o["results"]) == 20
    _, out, _ = run(tmp_path, small_index, [{"id": i} for i in ids], k=4, collapse=HQ, same=(SECTOR,),
                    fields=(HQ, SECTOR))
    for i, o in zip(ids, out):
        hits = searcher.search([Query(doc_id=i)], k=120, filters={SECTOR: docs[i][SECTOR]})[0]
        assert [r["id"] for r in o["results"]] == collapsed_oracle(hits, docs[i], HQ, 4)
        assert {r["metadata"][SECTOR] for r in o["results"]} == {docs[i][SECTOR]}


def test_collapse_errors_name_the_field_and_the_choices(tmp_path, small_index):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": "ADBE"}])
    base = dict(input=str(inp), index=str(small_index), out=str(tmp_path / "o.jsonl"))
    with pytest.raises(LookupInputError, match=f"unknown --collapse field 'colour'; metadata fields: .*{HQ}"):
        run_lookup(LookupJob(**base, collapse="colour"))
    with pytest.raises(LookupInputError, match=f"--same and --collapse both name {SECTOR}"):
        LookupJob(**base, same=(SECTOR,), collapse=SECTOR)
    with pytest.raises(LookupInputError, match="collapse must be a metadata field name, got ''"):
        LookupJob(**base, collapse="")
    bad = CliRunner().invoke(lookup, [str(inp), "--index", str(small_index), "--collapse", "colour",
                                      "--out", str(tmp_path / "o.jsonl")])
    assert bad.exit_code != 0 and "unknown --collapse field 'colour'; metadata fields:" in bad.output
    assert not (tmp_path / "o.jsonl").exists()
    ok = CliRunner().invoke(lookup, [str(inp), "--index", str(small_index), "-k", "3", "--collapse", SECTOR,
                                     "--fields", SECTOR, "--out", str(tmp_path / "o.jsonl")])
    assert ok.exit_code == 0, ok.output
    results = json.loads((tmp_path / "o.jsonl").read_text())["results"]
    sectors = [r["metadata"][SECTOR] for r in results]
    assert len(results) == 3 and len(set(sectors)) == 3 and "Information Technology" not in sectors  # ADBE's own


def test_a_failed_run_leaves_the_previous_results_untouched(tmp_path, small_index, monkeypatch):
    (tmp_path / "out.jsonl").write_text("previous\n")

    def broken(*a, **kw):
        raise RuntimeError("search failed")

    monkeypatch.setattr(lk, "search_batch", broken)
    with pytest.raises(Exception, match="search failed"):
        run(tmp_path, small_index, [{"id": "ADBE"}])
    assert (tmp_path / "out.jsonl").read_text() == "previous\n"
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl"]  # no work folder or temp file left


def test_job_errors_name_the_bad_value(tmp_path, small_index):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": "ADBE"}])
    base = dict(input=str(inp), index=str(small_index), out=str(tmp_path / "o.jsonl"))
    with pytest.raises(LookupInputError, match="available:"):
        run_lookup(LookupJob(**base, relations={"no-such-relation": 1.0}))
    with pytest.raises(LookupInputError, match=SECTOR):
        run_lookup(LookupJob(**base, same=("colour",)))
    with pytest.raises(LookupInputError, match="does not exist"):
        run_lookup(LookupJob(**{**base, "input": str(tmp_path / "nope.jsonl")}))
    with pytest.raises(LookupInputError, match="both name"):
        LookupJob(**base, same=(SECTOR,), filters={SECTOR: "x"})
    with pytest.raises(LookupInputError, match=f"unknown --fields field 'colour'.*{SECTOR}"):
        run_lookup(LookupJob(**base, fields=("colour",)))
    with pytest.raises(LookupInputError, match="not both"):
        LookupJob(**base, fields=(SECTOR,), with_metadata=True)
    assert not (tmp_path / "o.jsonl").exists()


def test_cli_command_prints_counts_and_throughput(tmp_path, small_index):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": "ADBE"}, {"id": "nope"}, {"id": "MMM"}])
    out = tmp_path / "res.jsonl"
    result = CliRunner().invoke(lookup, [str(inp), "--index", str(small_index), "--relation", "identity", "-k", "3",
                                         "--filter", f"{SECTOR}=Industrials", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "read 3, answered 2, rejected 1 (unknown-id: 1)" in result.output and "lookups/s" in result.output
    assert "res.rejected.jsonl" in result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["query_id"] for row in rows] == ["ADBE", "MMM"]
    assert all(r["metadata"] == {} for row in rows for r in row["results"])  # default: no metadata
    chosen = CliRunner().invoke(lookup, [str(inp), "--index", str(small_index), "-k", "3", "--fields",
                                         f"name,{SECTOR}", "--out", str(out)])
    assert chosen.exit_code == 0, chosen.output
    results = [r for line in out.read_text().splitlines() for r in json.loads(line)["results"]]
    assert results and all(set(r["metadata"]) <= {"name", SECTOR} for r in results)
    assert any(list(r["metadata"]) == ["name", SECTOR] for r in results)
    every = CliRunner().invoke(lookup, [str(inp), "--index", str(small_index), "-k", "3", "--with-metadata",
                                        "--out", str(out)])
    assert every.exit_code == 0 and all(len(r["metadata"]) > 2 for line in out.read_text().splitlines()
                                        for r in json.loads(line)["results"])
    bad = CliRunner().invoke(lookup, [str(inp), "--index", str(small_index), "--relation", "nope", "--out", str(out)])
    assert bad.exit_code != 0 and "available:" in bad.output
