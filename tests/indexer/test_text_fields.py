"""Documents with several named texts (indexer/text_fields.py): parsing, the build's files and
counts, append / delete / merge / compact keeping every field's rows, and an index of one text
stored exactly as before."""
import json

import numpy as np
import pytest

from relsearch.indexer import records as rec
from relsearch.indexer import reader, store
from relsearch.indexer import text_fields as tf
from relsearch.indexer.field_view import all_norms, field_view, vectors_of
from relsearch.pipelines.index import IndexJob, run_index
from relsearch.retrieval.search import Query, Searcher
from conftest import write_jsonl

NAMES = ("text", "wiki", "bloomberg")
ROWS = [
    {"id": "XOM", "text": "Exxon Mobil explores for and produces crude oil and natural gas.",
     "wiki": "ExxonMobil is an American multinational oil and gas corporation.", "bloomberg": None, "name": "Exxon"},
    {"id": "CVX", "text": None, "wiki": "Chevron Corporation is an American multinational energy corporation "
     "predominantly specializing in oil and gas.", "name": "Chevron"},  # no primary text: indexed on its wiki text
    {"id": "MSFT", "text": "Microsoft develops and licenses software, services and devices.",
     "wiki": "Microsoft Corporation is an American technology company that makes Windows.",
     "bloomberg": "Microsoft Corporation develops, manufactures, licenses, sells and supports software.",
     "name": "Microsoft"},
    {"id": "ORCL", "bloomberg": "Oracle Corporation supplies database software and cloud services.", "name": "Oracle"},
    {"id": "NONE", "text": "", "wiki": None, "name": "Nobody"},  # no text at all: rejected with the fields named
    {"id": "GOOG", "text": "Alphabet operates Google search, YouTube and cloud services.",
     "wiki": "Alphabet Inc. is the parent company of Google.", "name": "Alphabet Inc."},
    {"id": "GOOGL", "text": "Alphabet operates Google search, YouTube and cloud services.",
     "wiki": "Alphabet Inc. is the parent company of Google.", "name": "Alphabet Inc."},
    {"id": "BAD", "text": "fine", "wiki": 7, "name": "Bad"},  # a named text that is not a string
]


def build(tmp_path, rows=ROWS, names=NAMES, **kw):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", rows)
    target = tmp_path / "idx"
    report = run_index(IndexJob(input=str(corpus), index=str(target), text_field=names[0], text_fields=names,
                                progress=False, **kw))
    return target, report


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    return build(tmp_path_factory.mktemp("multi"))


def test_a_line_is_a_record_when_any_named_text_is_there():
    line = json.dumps({"id": "a", "text": None, "wiki": "  ", "bloomberg": "Bloomberg text", "x": 1}).encode()
    r = rec.parse_line(1, line, text_fields=NAMES)
    assert isinstance(r, rec.Record)
    assert (r.text, r.texts) == ("Bloomberg text", {"bloomberg": "Bloomberg text"})
    assert r.metadata == {"wiki": "  ", "bloomberg": "Bloomberg text", "x": 1}  # the first field is not metadata
    none = rec.parse_line(2, json.dumps({"id": "b", "text": ""}).encode(), text_fields=NAMES)
    assert (none.reason, none.detail) == (rec.NO_TEXT, "no text in any of text, wiki, bloomberg")
    bad = rec.parse_line(3, json.dumps({"id": "c", "text": "ok", "wiki": ["x"]}).encode(), text_fields=NAMES)
    assert bad.reason == rec.NON_STRING_TEXT and "'wiki'" in bad.detail
    # one text field: as before
    assert rec.parse_line(4, json.dumps({"id": "d", "text": None}).encode()).reason == rec.NULL_TEXT


def test_build_indexes_every_record_with_any_text_and_counts_reconcile(multi):
    target, report = multi
    assert (report.read, report.indexed, report.rejected) == (8, 6, 2)
    assert dict(report.reasons) == {rec.NO_TEXT: 1, rec.NON_STRING_TEXT: 1}
    files = reader.open_index(target)
    try:
        m = files.manifest
        assert (m.fields.text, m.fields.texts, files.text_fields) == ("text", NAMES, NAMES)
        assert set(m.field_faiss) == {"wiki", "bloomberg"}
        for name in ("textnorms.npy", "t1-vectors.npy", "t1-index.faiss", "t1-bm25.npz", "t2-vectors.npy",
                     "t2-index.faiss", "t2-bm25.npz"):
            assert name in m.files
        ids = files.docstore.get(list(range(6)))
        by_id = {d["id"]: p for p, d in ids.items()}
        norms = all_norms(files)
        present = {i: tuple(bool(x) for x in norms[p] > 0) for i, p in by_id.items()}
        assert present == {"XOM": (True, True, False), "CVX": (False, True, False), "MSFT": (True, True, True),
                           "ORCL": (False, False, True), "GOOG": (True, True, False), "GOOGL": (True, True, False)}
        # a lacking text is a zero row; a present one a unit row
        wiki = np.asarray(vectors_of(files, 1))
        assert np.allclose(np.linalg.norm(wiki[by_id["ORCL"]]), 0)
        assert np.isclose(np.linalg.norm(wiki[by_id["CVX"]]), 1, atol=1e-5)
        assert ids[by_id["CVX"]]["text"].startswith("Chevron Corporation")  # the first text it has
        # each field's BM25 lists hold only the documents that have that text
        for i in range(3):
            view = field_view(files, NAMES[i])
            held = {int(p) for s in view.segments for p in s.bm25.positions}
            assert held == {p for p in by_id.values() if norms[p, i] > 0}
    finally:
        files.docstore.close()
        files.close_faiss_fd()


def test_append_delete_merge_and_compact_keep_every_fields_rows(tmp_path):
    target, _ = build(tmp_path, ROWS[:4])
    more = write_jsonl(tmp_path / "more.jsonl", [
        {"id": "AAPL", "wiki": "Apple Inc. designs the iPhone and the Mac.", "name": "Apple"},
        {"id": "XOM", "text": "Exxon Mobil, replaced: an integrated oil company.", "name": "Exxon"}])
    for i in range(3):  # three appends with max_segments 2: the appended segments merge
        report = run_index(IndexJob(input=str(more), index=str(target), text_field="text", text_fields=NAMES,
                                    append=True, max_segments=2, progress=False))
        assert report.indexed == 2
    files = reader.open_index(target)
    try:
        assert files.manifest.counts.documents == 5 and len(files.segments) <= 2
        positions = files.docstore.positions(["AAPL", "XOM"])
        norms = all_norms(files)
        assert tuple(norms[positions["AAPL"]] > 0) == (False, True, False)
        assert tuple(norms[positions["XOM"]] > 0) == (True, False, False)
        unit = np.asarray(vectors_of(files, 1)[[positions["AAPL"]]])
    finally:
        files.docstore.close()
        files.close_faiss_fd()
    s = Searcher(str(target))
    hits = s.for_field("wiki").search([Query(text="Apple iPhone maker")], k=10)[0]
    assert hits[0].id == "AAPL" and "XOM" not in [h.id for h in hits]  # XOM's new version has no wiki text

    from relsearch.indexer import mutations

    mutations.delete(str(target), ["AAPL"])
    assert "AAPL" not in [h.id for h in Searcher(str(target)).for_field("wiki").search([Query(text="iPhone")], k=10)[0]]
    mutations.append(str(target), [], n=0, run={"read": 0})  # nothing new: still opens
    mutations.compact(str(target))
    files = reader.open_index(target)
    try:
        assert len(files.segments) == 1 and files.manifest.counts.documents == 4
        assert set(files.manifest.field_faiss) == {"wiki", "bloomberg"}
        p = files.docstore.positions(["CVX"])["CVX"]
        assert tuple(all_norms(files)[p] > 0) == (False, True, False)
    finally:
        files.docstore.close()
        files.close_faiss_fd()
    hits = Searcher(str(target)).for_field("wiki").search([Query(text="Chevron energy")], k=2)[0]
    assert hits[0].id == "CVX"
    assert unit.shape == (1, 384)


def test_append_with_other_text_fields_is_refused(tmp_path):
    from relsearch.pipelines.assemble import IndexInputError

    target, _ = build(tmp_path, ROWS[:3])
    with pytest.raises(IndexInputError, match="has the text fields text, wiki, bloomberg"):
        run_index(IndexJob(input=str(tmp_path / "corpus.jsonl"), index=str(target), append=True, progress=False))


def test_an_index_of_one_text_is_stored_as_before(small_index):
    """No new manifest key, no new file: what older versions wrote and read (and a manifest without
    the new keys — every index written before them — opens with one text field)."""
    gen = store.current_generation(small_index)
    data = json.loads((gen / "manifest.json").read_text())
    assert "texts" not in data["fields"] and "field_faiss" not in data and "collapse" not in data
    assert not [n for n in data["files"] if n.startswith("t1-") or n == tf.NORMS_FILE]
    files = reader.open_index(small_index)
    try:
        assert files.text_fields == ("text",) and field_view(files, "text") is files
        with pytest.raises(KeyError, match="unknown text field 'wiki'; this index's text fields: text"):
            field_view(files, "wiki")
    finally:
        files.docstore.close()
        files.close_faiss_fd()


def test_a_damaged_text_fields_list_is_named(small_index, tmp_path):
    from relsearch.indexer.manifest import Manifest

    data = json.loads((store.current_generation(small_index) / "manifest.json").read_text())
    data["fields"]["texts"] = ["wiki", "text"]
    with pytest.raises(store.IndexCorruptError, match="fields.texts"):
        Manifest.from_json(data)


def test_a_failed_append_leaves_the_last_good_index(multi, tmp_path, monkeypatch):
    import shutil

    target = shutil.copytree(multi[0], tmp_path / "copy", symlinks=True)
    before = store.current_generation(target)

    def full_disk(*args, **kwargs):
        raise OSError("the fields' FAISS could not be written")

    monkeypatch.setattr(tf, "write_indexes", full_disk)  # after the new segment's rows, before its manifest
    more = write_jsonl(tmp_path / "more.jsonl", [{"id": "AAPL", "wiki": "Apple designs the iPhone."}])
    with pytest.raises(OSError, match="could not be written"):
        run_index(IndexJob(input=str(more), index=str(target), text_field="text", text_fields=NAMES, append=True,
                           progress=False))
    assert store.current_generation(target) == before
    assert [p.name for p in (target / "generations").iterdir() if not p.name.startswith("build-")] == [before.name]
    s = Searcher(str(target))
    assert s.files.manifest.counts.documents == 6
    assert Searcher(str(target)).for_field("wiki").search([Query(text="oil")], k=1)[0][0].id in ("XOM", "CVX")


def test_an_elasticsearch_mirror_of_several_texts_is_refused_before_any_work(tmp_path):
    from relsearch.indexer.es_mirror import EsTarget
    from relsearch.pipelines.assemble import IndexInputError

    corpus = write_jsonl(tmp_path / "corpus.jsonl", ROWS[:2])
    with pytest.raises(IndexInputError, match="Elasticsearch mirror holds an index of one text field"):
        run_index(IndexJob(input=str(corpus), index=str(tmp_path / "idx"), text_field="text", text_fields=NAMES,
                           es=EsTarget(url="http://127.0.0.1:9", alias="companies"), progress=False))
    assert not (tmp_path / "idx").exists()
