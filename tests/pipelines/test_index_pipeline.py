"""The Beam index job on real data: reconciliation, rejections, atomic publish."""
import json
import os

import numpy as np
import pytest

from relsearch.indexer import records as rec
from relsearch.indexer import store
from relsearch.indexer.manifest import Counts, Fields
from relsearch.indexer.reader import open_index
from relsearch.pipelines.index import IndexInputError, IndexJob, run_index
from conftest import DEMO_CORPUS, write_jsonl
from conftest import gen_of

GOOD = [json.loads(line) for line in DEMO_CORPUS.read_text().splitlines()[:30]]


def job(corpus, target, **kw):
    return IndexJob(input=str(corpus), index=str(target), progress=False, **kw)


def test_index_matches_direct_encoding(small_index, small_corpus, encoder):
    files = open_index(small_index)
    texts = [json.loads(line)["text"] for line in small_corpus.read_text().splitlines()]
    encoded = encoder.encode(texts)
    h = encoded.vectors
    assert files.manifest.counts == Counts(120, 120, 0, 0)
    run = files.manifest.runs[-1]
    assert (run["op"], run["read"], run["indexed"], run["rejected"], run["truncated"]) == (
        "build", 120, 120, 0, encoded.truncated)
    assert files.manifest.faiss["requested"] == "auto" and files.manifest.faiss["factory"] == "Flat"
    assert files.faiss.ntotal == 120 and files.vectors.shape == (120, 384)
    # positions follow input order; stored vector · stored norm gives back the raw h
    docs = files.docstore.get(list(range(120)))
    raw = np.asarray(files.vectors) * np.array([docs[i]["norm"] for i in range(120)])[:, None]
    assert [docs[i]["id"] for i in range(3)] == ["MMM", "ABT", "ABBV"]
    np.testing.assert_allclose(raw, h, atol=2e-3)
    assert docs[0]["metadata"]["gics_sector"] == "Industrials"


def test_broken_lines_reconcile_with_one_rejection_each(tmp_path):
    lines = [json.dumps(GOOD[0]), b"\xff\xfe".decode("latin-1"), "{oops", "[1, 2]", json.dumps({"text": "x"}),
             json.dumps({"id": "", "text": "x"}), json.dumps({"id": "z"}), json.dumps({"id": "y", "text": ""}),
             json.dumps({"id": "w", "text": ["list"]}), json.dumps(GOOD[0]), "", json.dumps(GOOD[1])]
    corpus = tmp_path / "mixed.jsonl"
    corpus.write_bytes(b"\n".join(line.encode("utf-8") if i != 1 else b"\xff\xfe"
                                  for i, line in enumerate(lines)) + b"\n")
    report = run_index(job(corpus, tmp_path / "idx"))
    assert (report.read, report.indexed, report.rejected) == (12, 2, 10)
    rejected = [json.loads(line) for line in (tmp_path / "idx" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [
        (2, rec.UNDECODABLE), (3, rec.INVALID_JSON), (4, rec.NOT_OBJECT), (5, rec.MISSING_ID), (6, rec.EMPTY_ID),
        (7, rec.MISSING_TEXT), (8, rec.EMPTY_TEXT), (9, rec.NON_STRING_TEXT), (10, rec.DUPLICATE_ID),
        (11, rec.EMPTY_LINE)]
    assert report.summary().startswith("read 12, indexed 2, rejected 10")


def test_strict_refuses_and_keeps_previous_index(tmp_path):
    target = tmp_path / "idx"
    run_index(job(write_jsonl(tmp_path / "a.jsonl", GOOD[:5]), target))
    before = gen_of(target)
    with pytest.raises(IndexInputError, match="--strict"):
        run_index(job(write_jsonl(tmp_path / "b.jsonl", GOOD[:5] + ["{bad"]), target, strict=True))
    assert gen_of(target) == before and open_index(target).docstore.count() == 5
    assert len(os.listdir(tmp_path / "idx" / "generations")) == 1  # the failed generation is gone


@pytest.mark.parametrize("content, message", [(None, "does not exist"), (b"", "is empty"),
                                              (b"{bad\n[]\n", "no valid records")])
def test_unusable_input_writes_no_index(tmp_path, content, message):
    corpus = tmp_path / "in.jsonl"
    if content is not None:
        corpus.write_bytes(content)
    with pytest.raises(IndexInputError, match=message):
        run_index(job(corpus, tmp_path / "idx"))
    assert not (tmp_path / "idx").exists()


def test_rebuild_replaces_atomically_and_custom_fields(tmp_path):
    target = tmp_path / "idx"
    rows = [{"ticker": g["id"], "desc": g["text"], "sector": g["gics_sector"]} for g in GOOD[:6]]
    run_index(job(write_jsonl(tmp_path / "a.jsonl", rows), target, id_field="ticker", text_field="desc",
                  faiss_factory="HNSW16"))
    files = open_index(target)
    assert files.manifest.fields == Fields("ticker", "desc", ("sector",))
    assert files.manifest.faiss["factory"] == "HNSW16"
    run_index(job(write_jsonl(tmp_path / "b.jsonl", rows[:3]), target, id_field="ticker", text_field="desc"))
    assert open_index(target).docstore.count() == 3
    assert files.docstore.count() == 6  # a reader opened before the swap keeps its generation
    # the rebuilt generation and the one it replaced (a snapshot) are all that is left
    assert sorted(os.listdir(tmp_path / "idx" / "generations")) == sorted(g.name for g in store.retained(target))
    assert len(store.retained(target)) == 2


def test_bad_faiss_factory_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="index-factory"):
        run_index(job(write_jsonl(tmp_path / "a.jsonl", GOOD[:3]), tmp_path / "idx", faiss_factory="Nonsense42"))
    assert not store.is_published(tmp_path / "idx")


def test_interrupted_build_resumes_and_matches_an_uninterrupted_one(tmp_path, small_corpus, monkeypatch):
    from relsearch.pipelines import index as index_job

    clean = run_index(job(small_corpus, tmp_path / "clean", chunk_lines=25))
    real, log = index_job.encode_chunk, tmp_path / "encoded.log"  # Beam pickles the DoFn: count in a file

    def crash_after_two(chunk, **kw):
        if chunk.number >= 2:
            raise KeyboardInterrupt  # what Ctrl-C raises; SIGKILL is covered in test_cli.py
        real(chunk, **kw)

    def logged(chunk, **kw):
        with open(log, "a") as f:
            f.write(f"{chunk.number}\n")
        real(chunk, **kw)

    monkeypatch.setattr(index_job, "encode_chunk", crash_after_two)
    with pytest.raises(Exception):
        run_index(job(small_corpus, tmp_path / "idx", chunk_lines=25))
    assert not store.is_published(tmp_path / "idx")  # the folder holds only the shards to resume
    finished = {int(p.stem) for p in (tmp_path / "idx" / "generations").glob("build-*/*.npz")}
    assert finished <= {0, 1}  # chunk order after Reshuffle is not fixed; whatever finished is kept
    monkeypatch.setattr(index_job, "encode_chunk", logged)
    resumed = run_index(job(small_corpus, tmp_path / "idx", chunk_lines=25))
    # 5 chunks of ≤ 25 lines: only the unfinished ones are encoded again
    assert resumed.resumed_chunks == len(finished)
    assert sorted(map(int, log.read_text().split())) == sorted({0, 1, 2, 3, 4} - finished)
    a, b = open_index(tmp_path / "clean"), open_index(tmp_path / "idx")
    assert (resumed.read, resumed.indexed) == (clean.read, clean.indexed) == (120, 120)
    np.testing.assert_array_equal(np.asarray(a.vectors), np.asarray(b.vectors))
    assert a.docstore.get(list(range(120))) == b.docstore.get(list(range(120)))
    assert os.listdir(tmp_path / "idx" / "generations") == [os.path.basename(gen_of(tmp_path / "idx"))]


def test_append_adds_replaces_and_reconciles(tmp_path):
    from relsearch.retrieval.search import Query, Searcher

    target = tmp_path / "idx"
    run_index(job(write_jsonl(tmp_path / "a.jsonl", GOOD[:5]), target))
    changed = dict(GOOD[1], text="A company that only makes garden gnomes and nothing else.")
    report = run_index(job(write_jsonl(tmp_path / "b.jsonl", [changed, GOOD[5], GOOD[6], GOOD[6], "{bad"]), target,
                           append=True))
    assert (report.read, report.indexed, report.rejected, report.replaced, report.documents) == (5, 3, 2, 1, 7)
    files = open_index(target)
    assert files.manifest.counts == Counts(7, 8, 1, 1)
    assert [(r["op"], r["read"], r.get("replaced")) for r in files.manifest.runs] == [("build", 5, None),
                                                                                        ("append", 5, 1)]
    rejected = [json.loads(line) for line in (target / "rejected.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [(4, rec.DUPLICATE_ID), (5, rec.INVALID_JSON)]
    hits = Searcher(str(target)).search([Query(text="garden gnomes")], k=7)[0]
    assert hits[0].id == GOOD[1]["id"] and "gnomes" in hits[0].text
    assert sorted(h.id for h in hits) == sorted(g["id"] for g in GOOD[:7])  # the old version never comes back


def test_two_appends_to_a_missing_index_keep_both_inputs(tmp_path, monkeypatch):
    """Two `--append` runs on an index that does not exist yet: the one that publishes second
    appends to the first one's index instead of replacing it. Deterministic: B has finished
    encoding and waits for the writer lock before A publishes (B saw no index before the fix)."""
    import threading

    from relsearch.indexer import locking

    target = tmp_path / "idx"
    a, b = write_jsonl(tmp_path / "a.jsonl", GOOD[:3]), write_jsonl(tmp_path / "b.jsonl", GOOD[3:6])
    b_waits, real_lock, reports = threading.Event(), locking.writer_lock, []

    def lock(index, **kw):
        if threading.current_thread().name == "B":
            b_waits.set()
        return real_lock(index, **kw)

    monkeypatch.setattr(locking, "writer_lock", lock)
    with real_lock(target):
        writer_b = threading.Thread(name="B", target=lambda: reports.append(run_index(job(b, target, append=True))))
        writer_b.start()
        assert b_waits.wait(300)
        run_index(job(a, target, append=True))  # this thread holds the lock: it re-enters
    writer_b.join(300)
    assert reports and reports[0].documents == 6
    files = open_index(target)
    assert sorted(d["id"] for d in files.docstore.get(list(range(files.positions))).values()) == sorted(
        g["id"] for g in GOOD[:6])


def test_a_full_disk_is_one_error_and_never_blocks_the_next_build(tmp_path, monkeypatch):
    """Disk full while encoding, then while publishing: one line each, the last good index keeps
    answering, the resumable shards are reported, and a build of other input then succeeds
    (it drops the stale shards first)."""
    import errno
    import sqlite3

    from click.testing import CliRunner

    from relsearch.cli import cli
    from relsearch.indexer import store
    from relsearch.indexer.docstore import DocStore
    from relsearch.pipelines import index as pipeline
    from synthetic_index import build

    target = tmp_path / "idx"
    build(target, n=20)
    gens = tmp_path / "idx" / "generations"
    good = os.listdir(gens)

    def full_disk(path, **arrays):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    with monkeypatch.context() as m:  # encoding: the first shard cannot be written (inside a Beam step)
        m.setattr(pipeline, "_save_npz", full_disk)
        with pytest.raises(store.NoSpaceError, match=r"no space left on device while writing .*000000\.npz(\.tmp)?; "
                                                     r"nothing was published$"):
            run_index(job(write_jsonl(tmp_path / "a.jsonl", GOOD[:3]), target))
    assert os.listdir(gens) == good  # no shard was finished: nothing kept

    def sqlite_full(self, rows):  # publishing: what SQLite raises on a full disk
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as m:
        m.setattr(DocStore, "add", sqlite_full)
        out = CliRunner().invoke(cli, ["index", str(write_jsonl(tmp_path / "b.jsonl", GOOD[3:6])), "--index",
                                       str(target), "--quiet"])
    assert out.exit_code == 1 and out.output.count("\n") == 1, out.output
    assert out.output.startswith(f"Error: no space left on device while writing {target}; nothing was published; ")
    assert "MB of encoded shards kept in" in out.output
    kept = [g for g in os.listdir(gens) if g.startswith("build-")]
    assert sorted(os.listdir(gens)) == sorted(good + kept) and len(kept) == 1
    assert open_index(target).docstore.count() == 20  # the last good index answers

    report = run_index(job(write_jsonl(tmp_path / "c.jsonl", GOOD[6:9]), target))
    # the new build and the good one before it (a snapshot); the kept shards are gone
    assert report.documents == 3 and sorted(os.listdir(gens)) == sorted(g.name for g in store.retained(target))
    assert [g.name for g in store.retained(target)] == [os.path.basename(gen_of(target)), *good]


def test_beam_scratch_space_stays_in_the_build_folder(tmp_path, monkeypatch):
    """Beam makes a scratch folder in /tmp for each pipeline; a killed run would leave it there."""
    import tempfile

    from relsearch.pipelines.runners import new_pipeline, pipeline_options

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    build = tmp_path / "build"
    build.mkdir()
    p = new_pipeline(pipeline_options([]), build)
    assert os.listdir(tmp_path / "tmp") == [] and os.path.dirname(p.local_tempdir) == str(build)


def test_chunks_are_reshuffled_only_where_there_are_workers_to_spread_them_over():
    """The default in-process runner with one worker gets no Reshuffle stage (it cost ~0.07 s a
    job); more local workers, or any runner a user names but that one, keep it."""
    import apache_beam as beam

    from relsearch.encoder.model import EncoderConfig
    from relsearch.pipelines import index as index_job
    from relsearch.pipelines.runners import one_local_worker, pipeline_options

    def stages(args):
        p = beam.Pipeline(options=pipeline_options(args))
        index_job.build_pipeline(p, index_job.IndexJob(input="c.jsonl", index="unused"), [], EncoderConfig(), "shards")
        return [t.full_label for t in p.transforms_stack[0].parts]

    assert one_local_worker(pipeline_options([])) and one_local_worker(pipeline_options(["--runner=FnApiRunner"]))
    assert stages([]) == ["Chunks", "Encode"]
    for args in (["--direct_num_workers=2", "--direct_running_mode=multi_processing"], ["--runner=DirectRunner"]):
        assert not one_local_worker(pipeline_options(args))
        assert stages(args) == ["Chunks", "Spread", "Encode"]


def test_repeated_ids_are_rejected_before_encoding_and_a_huge_number_never_ends_a_build(tmp_path, monkeypatch):
    """A corpus of one id repeated encodes one text per chunk, not one per line (3 MB of one repeated
    id took 539 s); every repeat is rejected naming the first line, across chunks too. A metadata
    number beyond float (10**400, valid JSON) is indexed, kept as JSON, and compared by no filter
    (before: OverflowError after encoding, and the build died)."""
    from relsearch.pipelines import index as index_job

    encoded = []
    real = index_job.encode_texts

    def counting(encoder, texts, **kw):
        encoded.extend(texts)
        return real(encoder, texts, **kw)

    monkeypatch.setattr(index_job, "encode_texts", counting)
    lines = [GOOD[0]] + [{**GOOD[0], "text": f"repeat {i}"} for i in range(249)]
    lines += [{**GOOD[1], "huge": 10**400}, *GOOD[2:6]]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in lines))
    report = run_index(job(corpus, tmp_path / "idx", chunk_lines=100, faiss_factory="Flat"))
    assert (report.read, report.indexed, report.rejected) == (255, 6, 249)
    assert len(encoded) <= 6 + 2  # the 6 kept texts, and one first-of-its-chunk repeat per later chunk
    rejected = [json.loads(x) for x in (tmp_path / "idx" / store.REJECTED_FILE).read_text().splitlines()]
    assert [r["line"] for r in rejected] == list(range(2, 251))
    assert {r["reason"] for r in rejected} == {rec.DUPLICATE_ID}
    assert all(f"id {GOOD[0]['id']!r} first seen on line 1" == r["detail"] for r in rejected)
    files = open_index(tmp_path / "idx")
    huge = files.docstore.get(list(files.docstore.positions([GOOD[1]["id"]]).values()))
    assert next(iter(huge.values()))["metadata"]["huge"] == 10**400
    assert len(files.docstore.matching({"huge": {"exists": True}})) == 1
    assert files.docstore.matching({"huge": {"gte": 0}}) == []


def test_an_index_job_freezes_the_long_lived_heap_once_per_process(small_index):
    import gc

    from relsearch.pipelines import runners

    frozen = gc.get_freeze_count()  # small_index ran a job in this process: its encoder loaded, then the freeze
    assert frozen > 0 and runners._frozen_done
    made_later = [[i] for i in range(1000)]  # noqa: F841 (tracked objects a second freeze would take)
    runners.freeze_long_lived()
    assert gc.get_freeze_count() == frozen  # once only: what work allocates later stays collectable
