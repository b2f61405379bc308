"""Shards through Beam's FileSystems (pipelines/shardfs.py): with ``--temp_location`` on a
non-local scheme, workers read the staged input and write shards there, never in the index's
local build folder; the driver assembles from there; a killed run resumes from there."""
import os
import shutil

import numpy as np
import pytest
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem

from relsearch.indexer.reader import open_index
from relsearch.pipelines import index as index_job
from relsearch.pipelines import shardfs
from relsearch.pipelines.index import IndexJob, run_index
from conftest import write_jsonl

SCHEME = "relsearchtest://"


class RemoteLikeFileSystem(LocalFileSystem):
    """``relsearchtest://PATH`` → ``ROOT/PATH``: a scheme Beam resolves by name, as it does gs:// or s3://,
    so that any code opening a shard with ``open()`` or ``pathlib`` instead of FileSystems fails."""

    ROOT = ""

    @classmethod
    def scheme(cls):
        return SCHEME[:-3]

    def _local(self, path: str) -> str:
        return os.path.join(self.ROOT, path[len(SCHEME):]) if path.startswith(SCHEME) else path

    def _remote(self, m: FileMetadata) -> FileMetadata:
        return FileMetadata(SCHEME + os.path.relpath(m.path, self.ROOT), m.size_in_bytes, m.last_updated_in_seconds)

    def exists(self, path):
        return super().exists(self._local(path))

    def create(self, path, *args, **kw):
        return super().create(self._local(path), *args, **kw)

    def open(self, path, *args, **kw):
        return super().open(self._local(path), *args, **kw)

    def rename(self, sources, destinations):
        super().rename([self._local(p) for p in sources], [self._local(p) for p in destinations])

    def delete(self, paths):
        for p in map(self._local, paths):
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)

    def metadata(self, path):
        return self._remote(super().metadata(self._local(path)))

    def _list(self, dir_or_prefix):
        return (self._remote(m) for m in super()._list(self._local(dir_or_prefix)))


@pytest.fixture
def remote(tmp_path, monkeypatch):
    root = tmp_path / "remote"
    root.mkdir()
    monkeypatch.setattr(RemoteLikeFileSystem, "ROOT", str(root))
    return root


def test_shardfs_writes_whole_files_and_lists_them(remote):
    folder = SCHEME + "a/b"
    shardfs.write(shardfs.join(folder, "000001.npz"), b"x" * 10)
    shardfs.write(shardfs.join(folder, "000000.npz"), b"y")
    assert shardfs.names(folder, ".npz") == [folder + "/000000.npz", folder + "/000001.npz"]
    assert shardfs.read(folder + "/000001.npz") == b"x" * 10 and not shardfs.is_local(folder)
    assert sorted(os.listdir(remote / "a/b")) == ["000000.npz", "000001.npz"]  # no temporary file left
    shardfs.remove([folder, folder + "/missing"])
    assert not shardfs.exists(folder + "/000000.npz")


def test_index_with_remote_shards_resumes_and_matches_a_local_build(tmp_path, small_corpus, remote, monkeypatch):
    corpus = write_jsonl(tmp_path / "c.jsonl", small_corpus.read_text().splitlines()[:20] + ["not json"])
    job = dict(input=str(corpus), chunk_lines=5, progress=False)
    clean = run_index(IndexJob(index=str(tmp_path / "clean"), **job))
    real = index_job.encode_chunk

    def crash_after_two(chunk, **kw):
        if chunk.number >= 2:
            raise KeyboardInterrupt
        real(chunk, **kw)

    args = ["--temp_location", SCHEME + "scratch"]
    monkeypatch.setattr(index_job, "encode_chunk", crash_after_two)
    with pytest.raises(Exception):
        run_index(IndexJob(index=str(tmp_path / "idx"), **job), args)
    (shards,) = (remote / "scratch").iterdir()
    finished = {int(p.stem) for p in shards.glob("*.npz")}
    assert finished <= {0, 1} and (shards / "input.jsonl").read_bytes() == corpus.read_bytes()  # staged input
    assert not list((tmp_path / "idx" / "generations").glob("*/*.npz"))  # nothing in the local build folder

    monkeypatch.setattr(index_job, "encode_chunk", real)
    resumed = run_index(IndexJob(index=str(tmp_path / "idx"), **job), args)
    assert resumed.resumed_chunks == len(finished)
    counts = (resumed.read, resumed.indexed, resumed.rejected)
    assert counts == (clean.read, clean.indexed, clean.rejected) == (21, 20, 1)
    a, b = open_index(tmp_path / "clean"), open_index(tmp_path / "idx")
    np.testing.assert_array_equal(np.asarray(a.vectors), np.asarray(b.vectors))
    assert a.docstore.get(list(range(20))) == b.docstore.get(list(range(20)))
    assert list((remote / "scratch").iterdir()) == []  # published: the remote shards are gone


def test_lookup_with_remote_shards_writes_the_same_results(tmp_path, small_index, remote):
    from relsearch.pipelines.lookup import LookupJob, run_lookup

    queries = write_jsonl(tmp_path / "q.jsonl", [{"id": "MMM"}, {"id": "nope"}, "bad", {"id": "ABT"}])
    outputs = []
    for name, args in (("local", []), ("remote", ["--temp_location", SCHEME + "scratch"])):
        job = LookupJob(input=str(queries), index=str(small_index), out=str(tmp_path / f"{name}.jsonl"), k=5,
                        chunk_lines=2)
        report = run_lookup(job, args)
        assert (report.read, report.answered, report.rejected) == (4, 2, 2)
        outputs.append(((tmp_path / f"{name}.jsonl").read_text(), (tmp_path / f"{name}.rejected.jsonl").read_text()))
    assert outputs[0] == outputs[1]
    assert list((remote / "scratch").iterdir()) == []  # the remote shards and staged input are removed


def test_two_writers_of_one_file_do_not_take_each_others_temporary(tmp_path, monkeypatch):
    """Each Dask worker writes encoder.json: a write that lands while another is half-done must not
    rename the other's temporary file away (the second rename then failed: a flaky Dask run)."""
    from apache_beam.io.filesystems import FileSystems

    path, rename = str(tmp_path / "encoder.json"), FileSystems.rename
    interleaved = []

    def rename_after_another_writer(sources, destinations):
        if not interleaved:  # this worker's temporary file is written; another worker writes now
            interleaved.append(sources)
            shardfs.write(path, b"other worker")
        return rename(sources, destinations)

    monkeypatch.setattr(FileSystems, "rename", rename_after_another_writer)
    shardfs.write(path, b"this worker")
    assert (tmp_path / "encoder.json").read_bytes() == b"this worker"
    assert [p.name for p in tmp_path.iterdir()] == ["encoder.json"]

