"""Index and lookup on Beam's DaskRunner give what the default runner gives.

Default suite: option plumbing, and both jobs on an in-process dask.distributed cluster (two
worker threads; quick). Marked ``dask`` (``make test-dask``): a real scheduler and two worker
processes started on loopback, as a remote cluster would be reached.
"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from relsearch.pipelines import index as index_mod
from relsearch.pipelines import runners
from relsearch.pipelines.index import IndexJob, run_index
from relsearch.pipelines.lookup import LookupJob, run_lookup
from relsearch.retrieval.search import Searcher
from conftest import write_jsonl

distributed = pytest.importorskip("distributed")

DASK = ["--runner", "DaskRunner"]
QUERIES = [{"id": "MMM"}, {"id": "not-indexed"}, {"id": "q", "text": "oil and gas exploration"}, "not json",
           {"id": "ABT"}, {"id": "q2", "text": "banks and insurance", "gics_sector": "Financials"}, {"id": "ADBE"}]


def test_dask_runner_resolves_and_spreads_chunks():
    opts = runners.pipeline_options(DASK).get_all_options()
    assert opts["runner"] == runners.RUNNER_ALIASES["DaskRunner"]
    assert "--dask_partition_size=1" in runners.pipeline_options(DASK)._flags  # one chunk per Dask task
    given = runners.pipeline_options(DASK + ["--dask_npartitions=3"])._flags
    assert "--dask_partition_size=1" not in given  # the user's partitioning wins (the two exclude each other)
    assert runners.pipeline_options([]).get_all_options()["runner"] == "FnApiRunner"
    assert runners.pipeline_options(["--runner=FnApiRunner"]).get_all_options()["runner"] == "FnApiRunner"


def test_dask_runner_without_dask_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails as if not installed
    with pytest.raises(runners.RunnerUnavailable, match=r"pip install 'relsearch\[dask\]'"):
        runners.pipeline_options(DASK)


def _index_rows(target) -> tuple[list, np.ndarray, list]:
    s = Searcher(str(target))
    n = s.files.docstore.count()
    docs = s.files.docstore.get(list(range(n)))
    rejected = (Path(target) / "rejected.jsonl").read_text()
    return [docs[i]["id"] for i in range(n)], np.asarray(s.files.vectors), rejected


def _corpus(tmp_path, small_corpus, lines: int) -> Path:
    rows = small_corpus.read_text().splitlines()[:lines]
    return write_jsonl(tmp_path / "corpus.jsonl", rows + ['{"id": "no-text"}', "not json", rows[0]])


def _same_index_and_lookup(tmp_path, corpus, beam_args, chunk_lines: int, factory: str = "auto") -> None:
    """Index ``corpus`` and look up QUERIES with the default runner and with ``beam_args``: same output.
    With an IVF ``factory``, the Dask run fills the index on the workers in three units
    (pipelines/faiss_add.py), the local run in the driver."""
    out = {}
    for name, args, units in (("local", [], 1), ("dask", beam_args, 3)):
        target = tmp_path / f"idx-{name}"
        report = run_index(IndexJob(input=str(corpus), index=str(target), chunk_lines=chunk_lines, progress=False,
                                    faiss_factory=factory, faiss_add_units=units), args)
        assert report.read == report.indexed + report.rejected and report.rejected == 3
        queries = write_jsonl(tmp_path / "queries.jsonl", QUERIES)
        job = LookupJob(input=str(queries), index=str(target), out=str(tmp_path / f"{name}.jsonl"), k=5,
                        same=("gics_sector",), chunk_lines=2)
        found = run_lookup(job, args)
        assert (found.read, found.answered, found.rejected) == (7, 4, 3)
        out[name] = (*_index_rows(target), (tmp_path / f"{name}.jsonl").read_text(),
                     (tmp_path / f"{name}.rejected.jsonl").read_text())
    (ids, vectors, rejected, results, lookup_rejected), dask = out["local"], out["dask"]
    assert dask[0] == ids
    np.testing.assert_allclose(dask[1], vectors, atol=1e-5)
    assert dask[2] == rejected
    # the indexes are equal to float noise, so the answers agree in ids and to 1e-5 in score
    for a, b in zip(map(json.loads, results.splitlines()), map(json.loads, dask[3].splitlines()), strict=True):
        assert a["query_id"] == b["query_id"] and [h["id"] for h in a["results"]] == [h["id"] for h in b["results"]]
        assert [h["score"] for h in b["results"]] == pytest.approx([h["score"] for h in a["results"]], abs=1e-5)
    assert dask[4] == lookup_rejected


def test_index_and_lookup_on_an_in_process_dask_cluster(tmp_path, small_corpus):
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        _same_index_and_lookup(tmp_path, _corpus(tmp_path, small_corpus, 12), DASK + [
            "--dask_client_address", c.scheduler_address], chunk_lines=4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dask_cluster(tmp_path):
    """`dask scheduler` and `dask worker --nworkers 2` on loopback, as separate processes."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    dask = str(Path(sys.executable).with_name("dask"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = open(tmp_path / "dask.log", "w")
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                               "--no-dashboard"], env=env, stdout=log, stderr=log)]
    procs.append(subprocess.Popen([dask, "worker", address, "--nworkers", "2", "--nthreads", "1", "--no-dashboard"],
                                  env=env, stdout=log, stderr=log, cwd=tmp_path))
    try:
        with distributed.Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
            yield address, client
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(30)
        log.close()


@pytest.mark.dask
@pytest.mark.parametrize("factory", ["auto", "IVF32,Flat", "IVF8,PQ16x4"])
def test_index_and_lookup_on_a_dask_scheduler_with_two_worker_processes(tmp_path, small_corpus, dask_cluster,
                                                                        factory):
    address, client = dask_cluster
    pids = client.run(os.getpid)
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    started = time.perf_counter()
    _same_index_and_lookup(tmp_path, _corpus(tmp_path, small_corpus, 60), DASK + [
        "--dask_client_address", address], chunk_lines=6, factory=factory)
    loads = client.run(lambda: index_mod.encoders_loaded)
    assert all(n <= 1 for n in loads.values()) and sum(loads.values()) >= 1, loads  # one model per worker process
    print(f"dask run: {time.perf_counter() - started:.1f} s, encoders loaded per worker {loads}")


def test_an_unreachable_scheduler_is_one_line_and_writes_nothing(tmp_path, small_index):
    from click.testing import CliRunner

    from relsearch.cli import cli

    queries = write_jsonl(tmp_path / "q.jsonl", [{"id": "MMM"}])
    result = CliRunner().invoke(cli, ["lookup", str(queries), "--index", str(small_index), "--out",
                                      str(tmp_path / "o.jsonl"), *DASK, "--dask_client_address",
                                      f"tcp://127.0.0.1:{_free_port()}", "--dask_connection_timeout", "2"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: Timed out trying to connect")
    assert sorted(os.listdir(tmp_path)) == ["q.jsonl"]
