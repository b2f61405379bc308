"""Append / replace / delete / compact on indexes built from synthetic vectors through the indexer
functions: counts, tombstones never returned, readers isolated, writers serialised, CLI delete."""
import json
import os
from pathlib import Path
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.encoder.model import resolve_model_path, weights_fingerprint
from relsearch.indexer import integrity, mutations, reader, store
from relsearch.indexer.manifest import Counts
from relsearch.indexer.build import Block, build_published
from relsearch.indexer.faiss_index import FaissSpec
from relsearch.retrieval.search import Query, Searcher
from conftest import gen_of

D = 384


@pytest.fixture(scope="module")
def encoder_identity():
    """The default encoder's identity, so Searcher accepts these synthetic indexes."""
    return {"model": "all-MiniLM-L6-v2", "weights_sha256": weights_fingerprint(resolve_model_path("all-MiniLM-L6-v2")),
            "pooling": "mean", "dim": D}


def raw_vectors(n, seed):
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(99).standard_normal((40, D)).astype(np.float32)
    return (centers[rng.integers(0, 40, n)] + 0.8 * rng.standard_normal((n, D)).astype(np.float32)) * 3.0


def docs(ids, seed):
    vectors = raw_vectors(len(ids), seed)
    return Block([{"id": i, "text": f"text of {i}", "metadata": {"group": int(i[1:]) % 5}} for i in ids], vectors)


def build(target, identity, n=3000, factory="Flat"):
    block = docs([f"d{i}" for i in range(n)], seed=1)
    build_published(str(target), [block], n=n, d=D, encoder=identity,
                    spec=FaissSpec(factory=factory, tune_queries=100))
    return block


def vector_search(searcher, q, k, **kw):
    result = searcher.ann(q, k, **kw)
    docs = searcher.files.docstore.get(sorted({int(p) for p in result.positions.ravel() if p >= 0}))
    return [[docs[p]["id"] for p in row if p >= 0] for row in result.positions], result


@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat", "HNSW16"])
def test_append_replace_delete_compact(tmp_path, encoder_identity, factory):
    target = tmp_path / "idx"
    original = build(target, encoder_identity, factory=factory)
    old_reader = Searcher(str(target))  # opened before any mutation; FAISS not loaded yet
    built_faiss = os.stat(Path(gen_of(target)) / store.FAISS_FILE).st_ino

    replacement = docs([f"d{i}" for i in range(100)] + [f"d{i}" for i in range(3000, 3200)], seed=2)
    report = mutations.append(str(target), [replacement], n=300, run={"read": 300})
    assert (report.added, report.replaced, report.documents, report.positions) == (200, 100, 3200, 3300)
    files = reader.open_index(target)
    assert files.manifest.counts == Counts(3200, 3300, 100, 100)
    # the appended documents are a second segment; the first segment's FAISS file is untouched
    assert [(s.start, len(s.vectors)) for s in files.segments] == [(0, 3000), (3000, 300)]
    assert files.faiss.ntotal == 3000 == files.manifest.faiss["ntotal"]
    assert os.stat(files.root / store.FAISS_FILE).st_ino == built_faiss
    assert [r["op"] for r in files.manifest.runs] == ["build", "append"]
    assert sorted(files.deleted.tolist()) == list(range(100))

    searcher = Searcher(str(target))
    # the replaced documents' old vectors as queries: their old positions must never come back
    ids, result = vector_search(searcher, original.vectors[:20] / np.linalg.norm(original.vectors[:20], axis=1,
                                                                                  keepdims=True), 30)
    assert not np.isin(result.positions, np.arange(100)).any()
    assert all(len(row) == 30 == len(set(row)) for row in ids)
    # an --id query of a replaced document starts from its new vector
    h = searcher.raw_vectors([Query(doc_id="d7")])[0]
    np.testing.assert_allclose(h, replacement.vectors[7], rtol=1e-4, atol=1e-4)
    # a filter searched through FAISS with an IDSelector (not the exact path) still gives k live matches
    broad = Searcher(str(target), exact_subset_max=0)
    hits = broad.search([Query(doc_id="d3005")], k=25, filters={"group": 0})[0]
    assert len(hits) == 25 and all(h.metadata["group"] == 0 for h in hits)

    report = mutations.delete(str(target), ["d3000", "d5", "d200", "nope", "d200"])
    assert (report.deleted, report.not_found, report.documents) == (3, ["nope"], 3197)
    files = reader.open_index(target)
    assert files.manifest.counts.deleted == 103 and files.docstore.count() == 3197
    assert json.loads((files.root / "rejected.jsonl").read_text().splitlines()[0])["raw"] == "nope"
    assert files.faiss.ntotal == 3000  # a delete only writes tombstones: segment files are hard links
    gone = Searcher(str(target))
    q = raw_vectors(10, seed=5)
    ids, _ = vector_search(gone, q / np.linalg.norm(q, axis=1, keepdims=True), 50)
    assert not {"d3000", "d200"} & {i for row in ids for i in row}

    # the reader opened before the mutations still answers from its own generation
    assert old_reader.files.docstore.count() == 3000
    old_ids, _ = vector_search(old_reader, original.vectors[:3] / np.linalg.norm(original.vectors[:3], axis=1,
                                                                                 keepdims=True), 1)
    assert [row[0] for row in old_ids] == ["d0", "d1", "d2"]

    report = mutations.compact(str(target))
    files = reader.open_index(target)
    assert files.manifest.counts == Counts(3197, 3197, 0, 0)
    assert not (files.root / store.DELETED_FILE).exists() and files.faiss.ntotal == 3197
    assert files.manifest.faiss["factory"] == factory
    # the published generation and the two before it are retained (snapshots); older ones are gone
    assert sorted(os.listdir(tmp_path / "idx" / "generations")) == sorted(g.name for g in store.retained(target))
    assert len(store.retained(target)) == 3


def test_concurrent_appends_are_serialised(tmp_path, encoder_identity):
    target = tmp_path / "idx"
    build(target, encoder_identity, n=200)
    errors = []

    def add(first):
        try:
            mutations.append(str(target), [docs([f"d{i}" for i in range(first, first + 50)], seed=first)], n=50,
                             run={"read": 50})
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=add, args=(first,)) for first in (1000, 2000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    files = reader.open_index(target)
    assert files.docstore.count() == 300 == files.manifest.counts.documents  # no lost update


def test_cli_delete_and_compact(tmp_path, encoder_identity):
    target = tmp_path / "idx"
    build(target, encoder_identity, n=300)
    ids = tmp_path / "ids.txt"
    ids.write_text("d1\n\n{\"id\": \"d2\"}\nmissing\n")
    runner = CliRunner()
    out = runner.invoke(cli, ["delete", "--index", str(target), "--ids", str(ids)])
    assert out.exit_code == 0, out.output
    assert "deleted 2, not found 1" in out.output and "missing" in out.output
    out = runner.invoke(cli, ["compact", "--index", str(target)])
    assert out.exit_code == 0 and "kept 298" in out.output, out.output
    assert reader.open_index(target).manifest.counts.positions == 298
    bad = runner.invoke(cli, ["delete", "--index", str(tmp_path / "none"), "--ids", str(ids)])
    assert bad.exit_code != 0 and "no index" in bad.output


def test_searcher_falls_back_to_cpu_when_the_gpu_copy_fails(tmp_path, encoder_identity, caplog):
    """faiss-cpu has no GPU resources: with "a GPU is present" injected, the GPU copy fails, the
    Searcher logs it, answers on the CPU, and stays on the CPU."""
    import logging

    from relsearch.indexer.gpu import GpuFacts

    target = tmp_path / "idx"
    build(target, encoder_identity, n=2000, factory="IVF16,Flat")
    q = raw_vectors(300, seed=7)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    cpu = Searcher(str(target), gpu_facts=GpuFacts(False, 0)).ann(q, 10)
    claimed = Searcher(str(target), gpu_facts=GpuFacts(True, 1))
    with caplog.at_level(logging.WARNING):
        result = claimed.ann(q, 10)
    np.testing.assert_array_equal(result.positions, cpu.positions)
    assert "searching on the CPU" in caplog.text and not claimed.gpu_facts.available


@pytest.mark.parametrize("where", ["vectors", "docstore", "faiss"])
def test_a_full_disk_mid_append_is_one_error_and_keeps_the_index(tmp_path, encoder_identity, monkeypatch, where):
    """The disk fills while an append writes vectors.npy (space reserved up front: an OSError, not a
    SIGBUS in the memory map), the docstore (SQLite's own error) or index.faiss (FAISS's own writer
    would only print the failed close and leave a truncated file)."""
    import errno
    import sqlite3
    from pathlib import Path

    from relsearch.indexer import faiss_index
    from relsearch.indexer.docstore import DocStore

    target = tmp_path / "idx"
    build(target, encoder_identity, n=200)
    before = os.listdir(tmp_path / "idx" / "generations")

    def no_fallocate(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def sqlite_full(self, rows):
        raise sqlite3.OperationalError("database or disk is full")

    if where == "faiss" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    monkeypatch.setattr(*{"vectors": (os, "posix_fallocate", no_fallocate),
                          "docstore": (DocStore, "add", sqlite_full),
                          "faiss": (mutations, "save_faiss",
                                    lambda index, path: faiss_index.save_faiss(index, Path("/dev/full")))}[where])
    with pytest.raises(store.NoSpaceError, match="^no space left on device while writing .*; nothing was published$"):
        mutations.append(str(target), [docs([f"d{i}" for i in range(1000, 1050)], seed=3)], n=50, run={"read": 50})
    assert os.listdir(tmp_path / "idx" / "generations") == before  # the half-written generation is gone
    assert reader.open_index(target).docstore.count() == 200
    monkeypatch.undo()
    mutations.append(str(target), [docs([f"d{i}" for i in range(1000, 1050)], seed=3)], n=50, run={"read": 50})
    assert reader.open_index(target).docstore.count() == 250


_OTHER_ENCODER_BUILD = """
import sys, numpy as np
from relsearch.indexer.build import Block, build_published
from relsearch.indexer.faiss_index import FaissSpec
vectors = np.random.default_rng(5).standard_normal((50, 384)).astype(np.float32)
block = Block([{"id": f"o{i}", "text": f"other {i}", "metadata": {}} for i in range(50)], vectors)
build_published(sys.argv[1], [block], n=50, d=384, spec=FaissSpec(factory="Flat", tune_queries=10),
                encoder={"model": "another-384d-model", "weights_sha256": "0" * 64, "pooling": "mean", "dim": 384})
"""


def _waiting_for_lock(lock_file) -> bool:
    """True while some process waits for the flock on ``lock_file`` (a ``->`` line of /proc/locks)."""
    inode = os.stat(lock_file).st_ino
    with open("/proc/locks") as f:
        return any("->" in line and line.split()[6].endswith(f":{inode}") for line in f)


def test_an_append_checks_the_encoder_under_the_writer_lock(tmp_path, encoder_identity):
    """A rebuild with another 384-d model publishes while Index.add (the API and POST /documents) waits
    for the lock with vectors of the old model: the add is refused (409), never written under a
    manifest that names the new model. The rebuild is held at the fault point commit.manifest-written
    (SIGSTOP) with the writer lock taken, so the add is certain to encode and reach the lock first."""
    import signal
    import subprocess
    import sys

    from relsearch import open_index
    from relsearch.retrieval.request import RequestError

    target = tmp_path / "idx"
    build(target, encoder_identity, n=100)
    index = open_index(target)
    env = {**os.environ, "RELSEARCH_FAULT": "commit.manifest-written:1:stop"}
    rebuild = subprocess.Popen([sys.executable, "-c", _OTHER_ENCODER_BUILD, str(target)], env=env)
    try:
        _, status = os.waitpid(rebuild.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status  # complete, unpublished, holding the writer lock
        outcome = []

        def add():
            try:
                outcome.append(index.add([{"id": "late", "text": "a document encoded by the old model"}]))
            except RequestError as e:
                outcome.append(e)

        adder = threading.Thread(target=add)
        adder.start()
        lock_file = tmp_path / "idx" / "lock"
        for _ in range(600):  # the model loads and encodes, then the add waits for the lock
            if _waiting_for_lock(lock_file) or not adder.is_alive():
                break
            adder.join(0.1)
        os.kill(rebuild.pid, signal.SIGCONT)
        assert rebuild.wait(60) == 0
        adder.join(60)
    finally:
        if rebuild.poll() is None:
            rebuild.kill()
    assert isinstance(outcome[0], RequestError), outcome
    assert outcome[0].status == 409 and "another-384d-model" in str(outcome[0])
    files = reader.open_index(target)
    assert files.manifest.encoder["model"] == "another-384d-model"
    assert files.docstore.positions(["late"]) == {} and files.manifest.counts.documents == 50


def test_rejections_of_every_operation_accumulate(tmp_path, encoder_identity):
    """A delete adds its unknown ids to rejected.jsonl instead of replacing the build's rejections
    (93 build rejections became one unknown-id line); compact and rejection-free writes carry them."""
    target = tmp_path / "idx"
    build(target, encoder_identity, n=50)
    root = reader.open_index(target).root
    build_lines = [json.dumps({"line": n, "reason": "invalid-json", "detail": "x", "raw": "{"}) for n in (51, 52)]
    (root / "rejected.jsonl").write_text("".join(line + "\n" for line in build_lines))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"]["rejected.jsonl"] = {"size": (root / "rejected.jsonl").stat().st_size,
                                           "sha256": integrity.sha256_file(root / "rejected.jsonl")}
    (root / "manifest.json").write_text(json.dumps(manifest))

    mutations.delete(str(target), ["d1", "gone"])
    mutations.append(str(target), [docs(["d60"], seed=3)], n=1, run={"read": 1},
                     rejected=[{"line": 2, "reason": "empty-text", "detail": "", "raw": ""}])
    mutations.compact(str(target))
    mutations.delete(str(target), ["d2", "lost"])
    lines = [json.loads(x) for x in (reader.open_index(target).root / "rejected.jsonl").read_text().splitlines()]
    assert [(r.get("op"), r["reason"], r["raw"]) for r in lines] == [
        (None, "invalid-json", "{"), (None, "invalid-json", "{"), ("delete", "unknown-id", "gone"),
        ("append", "empty-text", ""), ("delete", "unknown-id", "lost")]
    assert all("at" in r for r in lines[2:])


def test_a_delete_that_deletes_nothing_publishes_nothing_and_says_so(tmp_path, encoder_identity):
    target = tmp_path / "idx"
    build(target, encoder_identity, n=50)
    before = gen_of(target)
    report = mutations.delete(str(target), ["nope", "missing"])
    assert not report.published and report.deleted == 0 and report.not_found == ["nope", "missing"]
    assert "no new generation published" in report.summary() and report.documents == 50
    assert gen_of(target) == before and len(reader.open_index(target).manifest.runs) == 1
    ids = tmp_path / "ids.txt"
    ids.write_text("nope\n")
    out = CliRunner().invoke(cli, ["delete", "--index", str(target), "--ids", str(ids)])
    assert out.exit_code == 0 and "nothing changed, no new generation published" in out.output, out.output
    assert "added to" not in out.output and gen_of(target) == before
    mutations.delete(str(target), ["d3"])
    assert gen_of(target) != before
    assert not mutations.delete(str(target), ["d3"]).published  # already deleted: nothing to do
