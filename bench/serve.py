"""``relsearch bench serve``: a bounded load test on loopback — relsearch over HTTP, the in-process
Python API, and txtai's own API server on the same model and corpus, in one run.

Each target answers the same short queries (the first words of indexed documents, top 10) at
concurrency 1, 8 and 32: each level runs until ``requests`` answers or ``seconds`` have passed,
after a short warm-up, with one keep-alive connection per client thread. Reported: p50 and p99
latency per request and requests per second. The servers run as separate processes (started
here, stopped after their turn); the load generator runs in this process, so on a small machine
it competes with the server for the same cores, as a co-located application would.

txtai (``pip install "txtai[api]"``) serves ``txtai.api:app`` under uvicorn with a config that
names the same local MiniLM folder; the corpus is added through its ``/add`` and ``/index``
endpoints. When txtai is missing or cannot start, the run says so and reports relsearch alone.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .report import machine_info


@dataclass(frozen=True, kw_only=True)
class ServeBenchJob:
    index: str
    concurrency: tuple[int, ...] = (1, 8, 32)
    requests: int = 400  # answers per level (at most)
    seconds: float = 15.0  # time per level (at most)
    k: int = 10
    queries: int = 200  # distinct query texts
    txtai: bool = True
    threads: int | None = None  # relsearch serve --threads (None: torch's default)


def query_texts(index_dir: str, n: int, words: int = 8) -> list[str]:
    """Short queries: the first ``words`` words of the first ``n`` live documents."""
    from ..indexer.reader import open_index

    docs = open_index(index_dir).docstore
    out = []
    for rows in docs.rows():
        out += [" ".join(text.split()[:words]) for _, _, text, _, _ in rows]
        if len(out) >= n:
            break
    return out[:n]


def corpus_of(index_dir: str) -> list[tuple[str, str]]:
    """(id, text) of every live document, for the txtai side."""
    from ..indexer.reader import open_index

    return [(doc_id, text) for rows in open_index(index_dir).docstore.rows() for _, doc_id, text, _, _ in rows]


def load(make_call: Callable[[], Callable[[str], None]], queries: list[str], concurrency: int, *,
         requests: int, seconds: float, warmup: int = 3) -> dict:
    """Run ``concurrency`` client threads; each ``make_call()`` builds one client's ``call(text)``."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = [0.0, 0.0]  # start, end
    issued = iter(range(10 ** 9))

    def client(c: int) -> None:
        call = make_call()
        for w in range(warmup):
            call(queries[(c + w) % len(queries)])
        barrier.wait()
        mine = []
        while time.perf_counter() < deadline[1]:
            i = next(issued)
            if i >= requests:
                break
            started = time.perf_counter()
            try:
                call(queries[i % len(queries)])
                mine.append(time.perf_counter() - started)
            except Exception:  # noqa: BLE001 - counted, the run goes on
                errors[0] += 1
        with lock:
            latencies.extend(mine)

    def go() -> None:  # runs once, when every client has warmed up, before any is released
        deadline[:] = [time.perf_counter(), time.perf_counter() + seconds]

    barrier = threading.Barrier(concurrency, action=go)
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - deadline[0]
    ms = np.asarray(latencies) * 1000
    return {"concurrency": concurrency, "requests": len(latencies), "errors": errors[0], "seconds": round(elapsed, 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 2) if len(ms) else None,
            "p99_ms": round(float(np.percentile(ms, 99)), 2) if len(ms) else None,
            "qps": round(len(latencies) / elapsed, 1) if elapsed > 0 else None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_caller(url: str, method: str, path: Callable[[str], str], body: Callable[[str], bytes | None]):
    parsed = urllib.parse.urlsplit(url)

    def make():
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)

        def call(text: str) -> None:
            conn.request(method, path(text), body=body(text), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")

        return call

    return make


def _wait_healthy(url: str, path: str, proc: subprocess.Popen, log, timeout: float = 300) -> None:
    parsed = urllib.parse.urlsplit(url)
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            log.seek(0)
            tail = log.read().decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"server exited with {proc.returncode}: {tail[0][:300]}")
        try:
            conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status < 500:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} within {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_relsearch_http(job: ServeBenchJob, queries: list[str]) -> list[dict]:
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("RELSEARCH_API_KEY", None)
    log = tempfile.TemporaryFile()
    threads = ["--threads", str(job.threads)] if job.threads else []
    proc = subprocess.Popen([sys.executable, "-m", "relsearch", "serve", "--index", job.index, "--port", str(port),
                             *threads],
                            stdout=subprocess.DEVNULL, stderr=log, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, "/health", proc, log)
        make = _http_caller(url, "POST", lambda t: "/search", lambda t: json.dumps({"text": t, "k": job.k}).encode())
        return [load(make, queries, c, requests=job.requests, seconds=job.seconds) for c in job.concurrency]
    finally:
        _stop(proc)


def run_in_process(job: ServeBenchJob, queries: list[str]) -> list[dict]:
    from ..api import open_index

    index = open_index(job.index)

    def make():
        return lambda text: index.search(text, k=job.k)

    return [load(make, queries, c, requests=job.requests, seconds=job.seconds) for c in job.concurrency]


def encoder_bound(job: ServeBenchJob, queries: list[str], batch: int = 32, seconds: float = 3.0) -> dict:
    """The encoder alone, in this process: queries per second encoded one per pass and ``batch``
    per pass. Their ratio bounds what micro-batching can gain, whatever serves the queries. Timed
    on the model thread, where the in-process searches ran (encoder/threads.py)."""
    from ..api import open_index
    from ..encoder.threads import on_model_thread

    encoder = open_index(job.index).searcher().encoder

    def rate(size: int) -> float:
        encoder.encode(queries[:size])  # warm
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            for i in range(0, len(queries) - size + 1, size):
                encoder.encode(queries[i:i + size])
                done += size
        return round(done / (time.perf_counter() - started), 1)

    rates = {size: on_model_thread(rate, size) for size in (1, batch)}
    return {"batch": batch, "one_per_pass": rates[1], "batched": rates[batch], "ratio": round(rates[batch] / rates[1], 2)}


def run_txtai_http(job: ServeBenchJob, queries: list[str]) -> list[dict]:
    """txtai's API on the same local model and corpus; raises RuntimeError when it cannot run."""
    try:
        import txtai  # noqa: F401
    except ImportError as e:
        raise RuntimeError("txtai is not installed (pip install \"txtai[api]\")") from e
    from ..encoder.model import resolve_model_path
    from ..indexer.store import current_generation, read_manifest

    model = resolve_model_path(read_manifest(current_generation(job.index)).encoder["model"])
    with tempfile.TemporaryDirectory(prefix="relsearch-txtai-") as tmp:
        config = os.path.join(tmp, "config.yml")
        with open(config, "w") as f:  # JSON is YAML
            json.dump({"writable": True, "embeddings": {"path": model, "content": True}}, f)
        port = _free_port()
        env = {**os.environ, "CONFIG": config, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "txtai.api:app", "--host", "127.0.0.1", "--port",
                                 str(port), "--log-level", "warning"], stdout=subprocess.DEVNULL,
                                stderr=log, env=env, cwd=tmp)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, "/count", proc, log)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            docs = corpus_of(job.index)
            for i in range(0, len(docs), 256):
                body = json.dumps([{"id": d, "text": t} for d, t in docs[i:i + 256]])
                conn.request("POST", "/add", body=body, headers={"Content-Type": "application/json"})
                _expect_ok(conn.getresponse(), "/add")
            conn.request("GET", "/index")
            _expect_ok(conn.getresponse(), "/index")
            make = _http_caller(url, "GET", lambda t: "/search?" + urllib.parse.urlencode({"query": t, "limit": job.k}),
                                lambda t: None)
            return [load(make, queries, c, requests=job.requests, seconds=job.seconds) for c in job.concurrency]
        finally:
            _stop(proc)


def _expect_ok(response, what: str) -> None:
    payload = response.read()
    if response.status != 200:
        raise RuntimeError(f"txtai {what}: HTTP {response.status} {payload[:200]!r}")


def run(job: ServeBenchJob, echo: Callable[[str], None] = print) -> dict:
    queries = query_texts(job.index, job.queries)
    if not queries:
        raise ValueError(f"{job.index} holds no documents to draw queries from")
    result = {"machine": machine_info(), "index": os.path.abspath(job.index), "k": job.k, "queries": len(queries),
              "requests_per_level": job.requests, "seconds_per_level": job.seconds, "targets": {}, "skipped": {}}
    targets = [("relsearch HTTP", run_relsearch_http), ("relsearch in-process", run_in_process)]
    if job.txtai:
        targets.append(("txtai HTTP", run_txtai_http))
    for name, fn in targets:
        echo(f"{name} ...")
        try:
            result["targets"][name] = fn(job, queries)
        except RuntimeError as e:
            result["skipped"][name] = str(e)
            echo(f"{name}: skipped ({e})")
    result["encoder_alone"] = encoder_bound(job, queries)
    return result


def format_table(result: dict) -> str:
    m = result["machine"]
    lines = [f"serve load test: {result['queries']} distinct queries, top {result['k']}, at most "
             f"{result['requests_per_level']} requests or {result['seconds_per_level']} s per level; "
             f"{m.get('cpu')}, {m.get('usable_cpus')} usable CPUs",
             f"{'target':<22} {'clients':>7} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'QPS':>8} {'errors':>6}"]
    for name, levels in result["targets"].items():
        for r in levels:
            lines.append(f"{name:<22} {r['concurrency']:>7} {r['requests']:>8} {_num(r['p50_ms']):>8} "
                         f"{_num(r['p99_ms']):>8} {_num(r['qps']):>8} {r['errors']:>6}")
    for name, why in result["skipped"].items():
        lines.append(f"{name}: not measured: {why}")
    e = result.get("encoder_alone")
    if e:
        lines.append(f"encoder alone (in-process, no search, no HTTP): {e['one_per_pass']} queries/s one per pass, "
                     f"{e['batched']} in passes of {e['batch']} ({e['ratio']} x)")
    return "\n".join(lines)


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.1f}"
