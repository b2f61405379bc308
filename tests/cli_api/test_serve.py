"""`relsearch serve`: a real uvicorn server on a free loopback port over a copy of the small index."""
from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from relsearch.api import Index, RequestError, SearchRequest
from relsearch.client import Client, ClientError
from relsearch.retrieval.request import SearchOptions, run
from relsearch.retrieval.search import Query, Searcher
from relsearch.serve import Batcher, Metrics, Pending, ServeLimits, create_app
from conftest import gen_of

KEY = "s3cret-key-for-tests"


def _copy_index(src: Path, dest: Path) -> Path:
    """A private copy (the session index is shared): an index is one folder, copied as such."""
    shutil.copytree(src, dest, symlinks=True)
    return dest


def _start(app):
    """Serve ``app`` on a free loopback port in a thread; returns (url, server)."""
    import uvicorn

    class Server(uvicorn.Server):
        ready = threading.Event()

        async def startup(self, sockets=None):
            await super().startup(sockets)
            self.ready.set()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.ready.wait(0.5):  # started, or its thread died trying
        if not thread.is_alive():
            raise RuntimeError("server did not start")
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


@pytest.fixture(scope="module")
def index_dir(small_index, tmp_path_factory) -> Path:
    return _copy_index(small_index, tmp_path_factory.mktemp("serve") / "companies")


@pytest.fixture(scope="module")
def index(index_dir) -> Index:
    return Index(index_dir)


@pytest.fixture(scope="module")
def server(index):
    url, srv = _start(create_app({"companies": index}, limits=ServeLimits(max_body_bytes=64 << 10)))
    yield url
    srv.should_exit = True


@pytest.fixture(scope="module")
def keyed(index):
    """The same index behind an API key; batch_wait_ms makes micro-batching deterministic."""
    url, srv = _start(create_app({"companies": index}, api_key=KEY, limits=ServeLimits(batch_wait_ms=300)))
    yield url
    srv.should_exit = True


def _post(url: str, path: str, body: bytes | str, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def _request(url: str, method: str, path: str, body: bytes | str | None = None,
             headers: dict | None = None) -> tuple[int, http.client.HTTPMessage, dict]:
    """One request with exactly ``headers`` (http.client adds Host unless given, and nothing else
    but Content-Length and Accept-Encoding); (status, response headers, JSON body or {})."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    payload = response.read()
    is_json = response.getheader("Content-Type", "").startswith("application/json")
    return response.status, response.headers, json.loads(payload) if is_json else {}


def _metadata(hit: dict) -> dict:
    return hit.get("metadata", hit)  # Hit.to_json nests metadata in newer versions


def _ids_scores(hits):
    return [h["id"] for h in hits], [h["score"] for h in hits]


def test_health_and_search_equal_the_searcher(server, index_dir):
    client = Client(server)
    health = client.health()
    assert health["status"] == "ok" and health["indexes"]["companies"]["documents"] == 120
    searcher = Searcher(str(index_dir))
    text = "cloud software for enterprises"
    expected = searcher.search([Query(text=text)], k=5)[0]
    ids, scores = _ids_scores(client.search(text=text, k=5))
    assert ids == [h.id for h in expected]
    assert scores == pytest.approx([h.score for h in expected], abs=1e-4)
    doc = expected[0].id
    mixed = {"similar-company": 0.7, "identity": 0.3}  # the weighted recipe (retrieval/plan.py), as every path runs it
    expected = run(searcher, [Query(doc_id=doc, relations=mixed)], SearchOptions(k=5))[0]
    got = client.search(id=doc, relations=mixed, k=5, explain=True)
    assert [h["id"] for h in got] == [h.id for h in expected] and doc not in [h["id"] for h in got]
    assert set(got[0]["explain"]) >= {"identity", "similar-company", "recipe:dense", "recipe:bm25", "dense"}
    page = client.search(id=doc, relations=mixed, k=2, offset=2)
    assert [h["id"] for h in page] == [h.id for h in expected[2:4]] and page[0]["rank"] == 3
    floor = float(expected[1].score) - 1e-6
    above = client.search(id=doc, relations=mixed, k=5, min_score=floor)
    assert [h["id"] for h in above] == [h["id"] for h in got if h["score"] >= floor] and 2 <= len(above) < 5


def test_batch_relations_score(server):
    client = Client(server)
    batch = client.search_batch([{"text": "oil and gas"}, {"id": "NOT-THERE"}, {"text": "banks", "relations":
                                                                                  {"similar-company": 1}}], k=3)
    assert len(batch[0]["results"]) == 3 and len(batch[2]["results"]) == 3
    assert batch[1]["error"]["field"] == "queries[1].id"
    names = {r["name"] for r in client.relations()}
    assert {"identity", "similar-company"} <= names
    scores = client.score("Apple makes phones.", "Samsung makes phones.")
    assert "identity" in scores and -1 <= scores["identity"] <= 1
    assert any(w.startswith("similar-company: the score is its recipe's dense part") for w in scores.warnings)


@pytest.mark.parametrize("body, status, field", [
    ('{"text": "x",', 400, "body"),
    ('{"text": "x", "k": 1000000000}', 422, "k"),
    ('{"text": "x", "relations": {"no-such-relation": 1}}', 422, "relations"),
    ('{"text": "x", "relations": {"identity": NaN}}', 422, "relations.identity"),
    ('{"text": "x", "relations": {"identity": 0}}', 422, "relations"),
    ('{"text": "x", "filters": {"no-such-field": "a"}}', 422, "filters"),
    ('{"text": "x", "filters": {"gics_sector": {"gte": true}}}', 422, "filters"),
    ('{"text": "x", "filters": {"gics_sector": {"near": "a"}}}', 422, "filters"),
    ('{"text": "x", "collapse": "no-such-field"}', 422, "collapse"),
    ('{"text": "x", "hybrid": "max"}', 422, "hybrid"),
    ('{"text": "x", "hybrid": "weighted", "hybrid_weight": 1.5}', 422, "hybrid_weight"),
    ('{"text": "x", "hybrid": "rrf", "hybrid_weight": 0.3}', 422, "hybrid_weight"),
    ('{"text": "x", "surprise": 1}', 422, "surprise"),
    ('{"text": "x", "index": "other"}', 404, "index"),
    ('{"id": "NOT-THERE"}', 404, "id"),
    ('{"k": 3}', 422, "text"),
    ('[1, 2]', 422, "body"),
    ('{"text": "' + "x" * (70 << 10) + '"}', 413, "body"),
])
def test_malformed_requests_get_4xx_json_naming_the_field(server, body, status, field):
    got, payload = _post(server, "/search", body)
    assert (got, payload["error"]["field"]) == (status, field)
    assert payload["error"]["message"]


def test_unexpected_failure_is_a_500_without_traceback(server, index, monkeypatch):
    def boom():
        raise RuntimeError("secret detail in /private/path")

    monkeypatch.setattr(index, "relations", boom)
    with pytest.raises(ClientError) as e:
        Client(server).relations()
    assert e.value.status == 500
    assert "secret" not in e.value.message and "Traceback" not in e.value.message


def test_add_and_delete_are_visible_without_restart(server, index_dir):
    client = Client(server)
    before = client.health()["indexes"]["companies"]["generation"]
    doc = {"id": "ZZ-NEW", "text": "A maker of artisanal anvils and forging hammers.", "gics_sector": "Industrials"}
    report = client.add([doc])
    assert (report["added"], report["documents"]) == (1, 121) and report["generation"] != before
    hits = client.search(text="anvils and forging hammers", k=1)
    assert hits[0]["id"] == "ZZ-NEW" and _metadata(hits[0])["gics_sector"] == "Industrials"
    with pytest.raises(ClientError) as e:
        client.add([{"id": "bad"}])
    assert (e.value.status, e.value.field) == (422, "documents[0]")
    assert client.delete(["ZZ-NEW", "NEVER"])["not_found"] == ["NEVER"]
    with pytest.raises(ClientError) as e:
        client.search(id="ZZ-NEW")
    assert e.value.status == 404


def test_filters_match_json_types_over_http_and_in_one_micro_batch(server, index):
    """true is not 1 (nor "1"), even when both filters meet in one encoder pass (True == 1 in Python)."""
    client = Client(server)
    text = "A maker of artisanal anvils and forging hammers."
    client.add([{"id": f"ZZ-{kind}", "text": text, "flag": value}
                for kind, value in [("bool", True), ("int", 1), ("str", "1")]])
    try:
        for value, expected in [(True, "ZZ-bool"), (1, "ZZ-int"), ("1", "ZZ-str")]:
            assert [h["id"] for h in client.search(text=text, k=5, filters={"flag": value})] == [expected]
        batch = index.search_batch([SearchRequest(text=text, k=5, filters={"flag": v}) for v in (True, 1)])
        assert [[h.id for h in hits] for hits in batch.results] == [["ZZ-bool"], ["ZZ-int"]]
    finally:
        client.delete(["ZZ-bool", "ZZ-int", "ZZ-str"])


def test_operator_filters_and_collapse_over_http(server, index):
    client = Client(server)
    hits = client.search(text="power and gas utilities", k=10, collapse="gics_sector",
                         filters={"gics_sector": {"in": ["Energy", "Utilities"], "not": {"ieq": "ENERGY"}}})
    assert [_metadata(h)["gics_sector"] for h in hits] == ["Utilities"]
    same = index.search("power and gas utilities", k=10, collapse="gics_sector",
                        filters={"gics_sector": {"in": ["Energy", "Utilities"], "not": {"ieq": "ENERGY"}}})
    assert [h["id"] for h in hits] == [h.id for h in same]


def test_hybrid_search_over_http_equals_the_python_api(server, index):
    hits = Client(server).search(text="natural gas pipelines", k=5, hybrid="rrf", relations={"contradiction": 1})
    same = index.search("natural gas pipelines", k=5, hybrid="rrf", relations={"contradiction": 1})
    assert [h["id"] for h in hits] == [h.id for h in same] and len(hits) == 5
    assert hits[0]["score"] <= 2 / 61  # a fused RRF score, not a cosine
    weighted = Client(server).search(text="natural gas pipelines", k=5, hybrid="weighted", hybrid_weight=0.8,
                                     relations={"contradiction": 1})
    same = index.search("natural gas pipelines", k=5, hybrid="weighted", hybrid_weight=0.8,
                        relations={"contradiction": 1})
    assert [h["id"] for h in weighted] == [h.id for h in same]
    # similar-company's recipe already fuses BM25: refused alike over HTTP and in Python, with the reason
    with pytest.raises(ClientError, match="already fuse BM25"):
        Client(server).search(text="natural gas pipelines", hybrid="rrf", relations={"similar-company": 1})
    with pytest.raises(RequestError, match="already fuse BM25"):
        index.search("natural gas pipelines", hybrid="rrf", relations={"similar-company": 1})


def test_another_writers_publish_is_picked_up(server, index_dir):
    from relsearch.indexer import mutations

    client = Client(server)
    victim = client.search(text="a bank", k=1)[0]["id"]
    mutations.delete(str(index_dir), [victim])  # what `relsearch delete` in another process does
    assert victim not in [h["id"] for h in client.search(text="a bank", k=10)]
    assert client.health()["indexes"]["companies"]["documents"] == 119


def test_a_rollback_and_its_undo_are_picked_up(server, index_dir):
    """`relsearch rollback` in another process publishes an older generation: the server answers from
    it, exactly as before the mutation it undoes, without a restart (and from the newer one again
    after the rollback is undone)."""
    from relsearch.indexer import mutations, snapshots

    client = Client(server)
    before = client.search(text="an oil and gas company", k=5)
    older = client.health()["indexes"]["companies"]["generation"]
    mutations.delete(str(index_dir), [before[0]["id"]])
    newer = os.path.basename(gen_of(index_dir))
    assert before[0]["id"] not in [h["id"] for h in client.search(text="an oil and gas company", k=5)]
    assert snapshots.rollback(index_dir)[0] == older
    assert client.search(text="an oil and gas company", k=5) == before
    assert client.health()["indexes"]["companies"]["generation"] == older
    snapshots.rollback(index_dir, to=newer)
    assert before[0]["id"] not in [h["id"] for h in client.search(text="an oil and gas company", k=5)]
    assert client.health()["indexes"]["companies"]["generation"] == newer  # the one the search opened
    snapshots.rollback(index_dir, to=older)  # leave the shared index with the documents it had
    assert client.search(text="an oil and gas company", k=5) == before


def test_api_key_and_micro_batching(keyed):
    assert Client(keyed, api_key="").health()["status"] == "ok"  # /health stays open
    for key in ("", "wrong"):
        with pytest.raises(ClientError) as e:
            Client(keyed, api_key=key).search(text="x")
        assert e.value.status == 401 and KEY not in e.value.message
    got, _ = _post(keyed, "/search", '{"text": "x"}', {"X-API-Key": KEY})
    assert got == 200

    def one(i):
        return Client(keyed, api_key=KEY).search(text=f"company number {i}", k=3)

    with ThreadPoolExecutor(8) as pool:
        assert all(len(hits) == 3 for hits in pool.map(one, range(8)))
    metrics = Client(keyed, api_key=KEY).metrics()
    batches = int(next(line for line in metrics.splitlines() if line.startswith("relsearch_batch_queries_count"))
                  .split()[-1])
    queries = float(next(line for line in metrics.splitlines() if line.startswith("relsearch_batch_queries_sum"))
                    .split()[-1])
    assert queries >= 9 and batches < queries  # 8 concurrent queries shared encoder passes
    assert 'relsearch_requests_total{path="/search",status="401"} 2' in metrics


def test_a_pass_waits_briefly_for_the_clients_the_previous_pass_answered():
    """After a pass of N queries, the next one waits up to refill_wait_ms for N (its clients come
    back one by one); one client alone never waits."""
    import asyncio

    async def scenario(limits: ServeLimits, expected: int, arrivals: int) -> tuple[int, float]:
        batcher = Batcher(None, limits, Metrics())
        loop = asyncio.get_running_loop()

        async def arrive(i):
            await asyncio.sleep(0.002 * i)
            batcher.put(Pending([SearchRequest(text=f"q{i}")], None))

        started = loop.time()
        for i in range(arrivals):
            loop.create_task(arrive(i))
        items = await batcher.gather(expected)
        return sum(len(item.requests) for item in items), loop.time() - started

    assert asyncio.run(scenario(ServeLimits(refill_wait_ms=5000), 4, 4))[0] == 4  # waited for all four
    size, waited = asyncio.run(scenario(ServeLimits(refill_wait_ms=5000), 1, 4))
    assert size == 1 and waited < 1  # one client: no wait
    size, waited = asyncio.run(scenario(ServeLimits(refill_wait_ms=30), 8, 2))
    assert size == 2 and waited < 1  # fewer came back: the pass starts after the refill wait
    assert asyncio.run(scenario(ServeLimits(refill_wait_ms=5000, micro_batch=3), 8, 5))[0] == 3  # never past the cap


def test_cli_serve_binds_loopback_with_a_key_file(index_dir, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("RELSEARCH_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "relsearch", "serve", "--index", f"c={index_dir}", "--port", "0",
                             "--api-key-file", str(key_file), "--allowed-host", "search.example"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "on http://127.0.0.1:" in line and KEY not in line, line + proc.stderr.read()
        url = line.split(" on ")[1].split()[0]
        assert Client(url).health()["indexes"]["c"]["documents"] >= 119
        with pytest.raises(ClientError) as e:
            Client(url).search(text="x")
        assert e.value.status == 401
        assert len(Client(url, api_key=KEY).search(text="secret body words", k=2)) == 2
        # the bound names on the bound port, and --allowed-host's name on any port (a reverse proxy's)
        port = int(url.rsplit(":", 1)[1])
        statuses = {host: _request(url, "GET", "/health", headers={"Host": host})[0]
                    for host in (f"localhost:{port}", "search.example", f"127.0.0.1:{port + 1}", "other.example")}
        assert statuses == {f"localhost:{port}": 200, "search.example": 200, f"127.0.0.1:{port + 1}": 421,
                            "other.example": 421}
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    # an access log on stderr (method, path, status, latency; no body, no key) and a line at shutdown
    assert "relsearch.serve started: c (generation " in err and "relsearch.serve stopped after 7 requests" in err, err
    assert err.count("encoder: cpu, ") == 1, err  # the dtype and why, logged once
    assert " GET /health 200 " in err and " POST /search 401 " in err and " POST /search 200 " in err, err
    assert KEY not in err and "secret body words" not in err


def test_bench_load_is_bounded_and_reports_percentiles():
    from relsearch.bench.serve import format_table, load

    calls = []
    stats = load(lambda: lambda text: calls.append(text), ["a", "b"], 4, requests=50, seconds=30, warmup=1)
    assert (stats["requests"], stats["errors"], len(calls)) == (50, 0, 54)  # 4 warm-up calls, then exactly 50
    assert stats["p50_ms"] <= stats["p99_ms"] and stats["qps"] > 0
    table = format_table({"machine": {"cpu": "x", "usable_cpus": 2}, "queries": 2, "k": 10, "requests_per_level": 50,
                          "seconds_per_level": 30, "targets": {"relsearch HTTP": [stats]},
                          "skipped": {"txtai HTTP": "txtai is not installed"}})
    assert "relsearch HTTP" in table and "txtai HTTP: not measured: txtai is not installed" in table


def test_bench_measures_the_encoders_own_batch_gain(index_dir):
    from relsearch.bench.serve import ServeBenchJob, encoder_bound, format_table, query_texts

    job = ServeBenchJob(index=str(index_dir))
    bound = encoder_bound(job, query_texts(str(index_dir), 16), batch=8, seconds=0.2)
    assert bound["batch"] == 8 and bound["one_per_pass"] > 0 and bound["batched"] > 0
    assert bound["ratio"] == round(bound["batched"] / bound["one_per_pass"], 2)
    table = format_table({"machine": {}, "queries": 16, "k": 10, "requests_per_level": 1, "seconds_per_level": 1,
                          "targets": {}, "skipped": {}, "encoder_alone": bound})
    assert f"in passes of 8 ({bound['ratio']} x)" in table


def test_accepted_connections_send_without_waiting_for_acks():
    """Answers go out whole at once (TCP_NODELAY): a response written as headers then body waited
    ~40 ms for the client's delayed ACK (56 ms per query instead of 16)."""
    from relsearch.serve import listen

    sock = listen("127.0.0.1", 0)
    with sock, socket.create_connection(sock.getsockname()):
        accepted, _ = sock.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1



# ---------------------------------------------------------------- hostile requests (issue 27)


def _concurrently(*calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def test_a_request_that_fails_inside_a_pass_fails_alone(keyed, monkeypatch):
    """A failure in one request of a micro-batch pass (here SQLite's "too many terms", as 600
    filter clauses gave) is that request's 500; the innocent requests in the same pass are answered
    (35 of 60 innocent requests got 500)."""
    import sqlite3

    real = Searcher.matching

    def matching(self, filters):
        if "POISON" in json.dumps(filters):
            raise sqlite3.OperationalError("too many terms in compound SELECT")
        return real(self, filters)

    monkeypatch.setattr(Searcher, "matching", matching)
    auth = {"X-API-Key": KEY}
    innocent = [lambda i=i: _post(keyed, "/search", json.dumps({"text": f"company number {i}", "k": 3}), auth)
                for i in range(6)]
    innocent_batch = lambda: _post(keyed, "/search/batch", json.dumps({"queries": [{"text": "banks"}, {"id": "NOPE"}]}),  # noqa: E731
                                   auth)
    poison = lambda: _post(keyed, "/search", json.dumps({"text": "x", "filters": {"gics_sector": "POISON"}}), auth)  # noqa: E731
    poison_batch = lambda: _post(keyed, "/search/batch", json.dumps(  # noqa: E731
        {"queries": [{"text": "oil"}], "filters": {"gics_sector": "POISON"}}), auth)
    *answers, batch, bad, bad_batch = _concurrently(*innocent, innocent_batch, poison, poison_batch)
    assert [status for status, _ in answers] == [200] * 6 and all(len(a["results"]) == 3 for _, a in answers)
    assert batch[0] == 200 and len(batch[1]["batch"][0]["results"]) == 10
    assert batch[1]["batch"][1]["error"]["field"] == "queries[1].id"
    assert bad[0] == 500 and "OperationalError" in bad[1]["error"]["message"]
    assert bad_batch[0] == 200 and "OperationalError" in bad_batch[1]["batch"][0]["error"]["message"]


def test_a_timeout_stops_the_work_it_times_out(index, monkeypatch):
    """The 503 of a timed-out search also ends its work: a collapsed search stops before its next
    widening round, and a request whose time ran out while it queued is never searched (the work
    kept running ~75 s after the timeout)."""
    import time

    calls = []
    real = Searcher.search

    def slow(self, queries, **kw):
        calls.append(kw.get("k"))
        time.sleep(0.8)
        return real(self, queries, **kw)

    url, srv = _start(create_app({"companies": index}, limits=ServeLimits(timeout_s=0.5)))
    try:
        with monkeypatch.context() as m:
            m.setattr(Searcher, "search", slow)
            collapsed = lambda: _post(url, "/search", '{"text": "a bank", "k": 50, "collapse": "gics_sector"}')  # noqa: E731

            def queued():
                time.sleep(0.2)  # arrives while the collapsed search runs
                return _post(url, "/search", '{"text": "an insurer", "k": 5}')

            first, second = _concurrently(collapsed, queued)
            assert (first[0], second[0]) == (503, 503) and first[1]["error"]["message"]
            time.sleep(1.5)  # what would still run: the second collapse round (k=120), the queued search
            assert calls == [50]
        assert len(Client(url).search(text="an insurer", k=5)) == 5  # the server is fine afterwards
    finally:
        srv.should_exit = True


def test_cost_and_response_bounds_name_the_field(server, index):
    """k x queries x explain is bounded per request (422 naming queries / k), and so is what one
    response holds (an 8 KB batch of 256 queries, k 10,000 and explain returned 187 MB)."""
    big = {"queries": [{"text": f"q{i}"} for i in range(256)], "k": 10_000, "explain": True}
    status, payload = _post(server, "/search/batch", json.dumps(big))
    assert (status, payload["error"]["field"]) == (422, "queries") and "--max-hits" in payload["error"]["message"]
    assert _post(server, "/search", '{"text": "x", "k": 10000, "explain": true}')[0] == 200  # one query: within
    url, srv = _start(create_app({"companies": index}, limits=ServeLimits(max_hits=1000, max_response_bytes=20_000)))
    try:
        status, payload = _post(url, "/search", '{"text": "x", "k": 600, "explain": true}')
        assert (status, payload["error"]["field"]) == (422, "k")
        status, payload = _post(url, "/search", '{"text": "x", "k": 20, "collapse": "gics_sector"}')
        assert (status, payload["error"]["field"]) == (422, "k")  # collapse may widen to 64 x 20 candidates
        status, payload = _post(url, "/search", '{"text": "x", "k": 100}')
        assert (status, payload["error"]["field"]) == (422, "k") and "--max-response-bytes" in payload["error"]["message"]
        status, payload = _post(url, "/search", '{"text": "x", "k": 3}')
        assert status == 200 and len(payload["results"]) == 3
    finally:
        srv.should_exit = True


def test_why_not_costs_the_whole_answer_it_ranks():
    """why_not ranks up to 10,000 hits, every part explained: a request pays for it, so --max-hits
    bounds how many a batch may ask (5 at the default 100,000)."""
    from relsearch.serve import request_cost

    assert request_cost(SearchRequest(text="x", k=5, why_not="A")) == 2 * 10_000
    assert request_cost(SearchRequest(text="x", k=5)) == 5


def test_a_pass_holds_at_most_max_hits_of_work():
    """Expensive requests do not share one pass past the cost bound: the one over it starts the next."""
    import asyncio

    async def passes():
        batcher = Batcher(None, ServeLimits(max_hits=1000, refill_wait_ms=0), Metrics())
        for cost in (600, 300, 600, 50):
            batcher.put(Pending([SearchRequest(text="x", k=cost)], None))
        return [[item.cost for item in await batcher.gather(1)] for _ in range(2)]

    # the second 600 waits (over the pass's budget) and starts the next pass; the 50 after it fits
    assert asyncio.run(passes()) == [[600, 300, 50], [600]]


class _SlowIndex:
    """An index whose every query takes ``seconds`` of the model thread: what the batcher schedules."""

    def __init__(self, seconds: float):
        self.seconds, self.ran = seconds, []

    def search_batch(self, requests, deadlines=None):
        from relsearch.api import BatchAnswer

        for r in requests:
            time.sleep(self.seconds)
            self.ran.append(r.text)
        return BatchAnswer("g1", [[r.text] for r in requests])


def test_a_heavy_batch_shares_the_model_thread_with_a_light_search():
    """Issue 50, F-1: a 64-query batch is answered a slice at a time, so a one-query search sent while
    it runs is answered before the batch is (not after all 64), and the batch still gets every answer."""
    import asyncio

    async def scenario():
        index = _SlowIndex(0.02)
        batcher = Batcher(index, ServeLimits(refill_wait_ms=0), Metrics())
        worker = asyncio.get_running_loop().create_task(batcher.run())
        heavy = asyncio.ensure_future(batcher.search([SearchRequest(text=f"h{i}") for i in range(64)]))
        await asyncio.sleep(0.05)
        light = await batcher.search([SearchRequest(text="light")])
        done_when_light, ran_when_light = heavy.done(), len(index.ran)
        generation, results = await heavy
        worker.cancel()
        return light, done_when_light, ran_when_light, generation, results

    light, done_when_light, ran_when_light, generation, results = asyncio.run(scenario())
    assert light == ("g1", [["light"]]) and not done_when_light and ran_when_light < 30
    assert generation == "g1" and results == [[f"h{i}"] for i in range(64)]  # in order, all of them


def test_a_timed_out_request_stops_being_searched():
    """Issue 50, F-2: once nobody waits for a request (its deadline passed, the server answered 503),
    its remaining slices never run: the model thread goes idle."""
    import asyncio

    async def scenario():
        index = _SlowIndex(0.02)
        batcher = Batcher(index, ServeLimits(refill_wait_ms=0), Metrics())
        worker = asyncio.get_running_loop().create_task(batcher.run())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(batcher.search([SearchRequest(text=f"h{i}") for i in range(200)]), 0.3)
        await asyncio.sleep(0.5)
        ran = len(index.ran)
        await asyncio.sleep(0.5)
        worker.cancel()
        return ran, len(index.ran), batcher.waiting

    ran, later, waiting = asyncio.run(scenario())
    assert ran < 100 and later == ran and not waiting  # about 0.3 s of it ran; nothing after


@pytest.mark.parametrize("body, field", [
    ('{"text": "x", "k": true}', "k"),
    ('{"text": "x", "k": "5"}', "k"),
    ('{"text": "x", "k": 5.0}', "k"),
    ('{"text": "x", "offset": "1"}', "offset"),
    ('{"text": "x", "relations": {"identity": true}}', "relations.identity"),
    ('{"text": "x", "relations": {"identity": "1"}}', "relations.identity"),
    ('{"text": "x", "explain": 1}', "explain"),
    ('{"text": "x", "min_score": "0.5"}', "min_score"),
    ('{"text": 5}', "text"),
])
def test_http_types_like_the_python_api(server, index, body, field):
    status, payload = _post(server, "/search", body)
    assert (status, payload["error"]["field"]) == (422, field), payload
    kwargs = json.loads(body)
    text = kwargs.pop("text")
    with pytest.raises(RequestError) as e:
        index.search(text, **kwargs)
    assert e.value.field == field.split(".")[0]


def test_an_empty_api_key_is_refused_at_start(index_dir, monkeypatch):
    from click.testing import CliRunner

    from relsearch.cli import cli
    from relsearch.serve import read_api_key

    monkeypatch.setenv("RELSEARCH_API_KEY", "")
    with pytest.raises(ValueError, match="RELSEARCH_API_KEY is set but empty"):
        read_api_key(None)
    out = CliRunner().invoke(cli, ["serve", "--index", str(index_dir), "--port", "0"])
    assert out.exit_code == 1 and "RELSEARCH_API_KEY is set but empty" in out.output
    with pytest.raises(ValueError, match="empty"):
        create_app({"c": None}, api_key=" ")
    monkeypatch.setenv("RELSEARCH_API_KEY", "k")
    assert read_api_key(None) == "k"


def test_405_carries_allow_and_the_schema_lists_the_real_errors(server):
    host, port = server.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/search")
    response = conn.getresponse()
    assert response.status == 405 and response.getheader("Allow") == "POST"
    assert json.loads(response.read())["error"]["message"]
    conn.request("GET", "/openapi.json")
    schema = json.loads(conn.getresponse().read())
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for path, method, statuses in [("/search", "post", (400, 401, 403, 404, 408, 413, 415, 421, 422, 503)),
                                   ("/search/batch", "post", (400, 401, 404, 413, 415, 422, 503)),
                                   ("/score", "post", (400, 401, 413, 415, 422)),
                                   ("/documents", "post", (400, 401, 403, 404, 409, 413, 415, 421, 422)),
                                   ("/documents/delete", "post", (400, 401, 404, 413, 415, 422)),
                                   ("/relations", "get", (401, 403, 404, 421))]:
        responses = schema["paths"][path][method]["responses"]
        for status in statuses:
            assert responses[str(status)]["content"]["application/json"]["schema"] == error_ref, (path, status)
    schemas = schema["components"]["schemas"]
    document = schemas["DocumentsBody"]["properties"]["documents"]["items"]
    assert document["type"] == "object" and set(document["required"]) == {"id", "text"}  # {} is not a document
    search = schemas["SearchBody"]
    assert search["oneOf"] == [{"required": ["text"]}, {"required": ["id"]}, {"required": ["like"]}]  # {} is not one
    assert search["properties"]["k"]["type"] == "integer" and search["properties"]["explain"]["type"] == "boolean"


def test_a_body_shorter_than_its_content_length_is_cut_off(index):
    """A client that sends fewer bytes than its Content-Length gets a 408 and its connection closed
    after --body-timeout, instead of holding it open forever."""
    import time

    url, srv = _start(create_app({"companies": index}, limits=ServeLimits(body_timeout_s=0.5)))
    try:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(f'POST /search HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n'.encode()
                         + b'Content-Length: 100\r\n\r\n{"text": "')
            received = b""
            while chunk := sock.recv(65536):  # until the server closes the connection
                received += chunk
            assert time.monotonic() - started < 5
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and json.loads(body)["error"]["field"] == "body"
        assert len(Client(url).search(text="x", k=2)) == 2
    finally:
        srv.should_exit = True


def test_health_reports_the_generation_a_search_would_use_now(server, index_dir):
    """After another process publishes (a CLI append or delete), /health names the new generation
    and its documents before any search has opened it."""
    from relsearch.indexer import mutations, snapshots

    client = Client(server)
    before = client.health()["indexes"]["companies"]
    victim = client.search(text="a railway", k=1)[0]["id"]
    mutations.delete(str(index_dir), [victim])
    after = client.health()["indexes"]["companies"]
    assert after == {"generation": os.path.basename(gen_of(index_dir)),
                     "documents": before["documents"] - 1}
    snapshots.rollback(index_dir, to=before["generation"])
    assert client.health()["indexes"]["companies"] == before


def test_access_log_lines_hold_no_body_and_no_key(keyed, caplog):
    import logging
    import time

    with caplog.at_level(logging.INFO, logger="relsearch.access"):
        status, _ = _post(keyed, "/search", '{"text": "private words in a body", "k": 1}', {"X-API-Key": KEY})
        assert status == 200
        _post(keyed, "/search?key=" + KEY, '{"text": "x"}')
        for _ in range(200):  # each line is written just after its answer went out
            lines = [r.getMessage() for r in caplog.records if r.name == "relsearch.access"]
            if {"POST /search 200", "POST /search 401"} <= {line.rsplit(" ", 1)[0] for line in lines}:
                break
            time.sleep(0.05)
    assert any(line.startswith("POST /search 200 ") and line.endswith("ms") for line in lines), lines
    assert any(line.startswith("POST /search 401 ") for line in lines)
    assert not any(KEY in line or "private words" in line for line in lines)


# ---------------------------------------------------------------- one validation path (issue 28)

NAN = float("nan")
# (case, `relsearch query` arguments or None, Index.search keywords or None, POST /search body or None, field);
# None: the interface cannot express the case (a CLI flag is text; JSON cannot repeat a key in a dict)
VALIDATION_TABLE = [
    ("k zero", ["x", "-k", "0"], {"text": "x", "k": 0}, {"text": "x", "k": 0}, "k"),
    ("k boolean", None, {"text": "x", "k": True}, {"text": "x", "k": True}, "k"),
    ("k string", None, {"text": "x", "k": "5"}, {"text": "x", "k": "5"}, "k"),
    ("blank text", ["  "], {"text": "  "}, {"text": "  "}, "text"),
    ("text and id", ["x", "--id", "MMM"], {"text": "x", "id": "MMM"}, {"text": "x", "id": "MMM"}, "text"),
    ("unknown id", ["--id", "NOPE"], {"id": "NOPE"}, {"id": "NOPE"}, "id"),
    ("unknown relation", ["x", "-r", "nope"], {"text": "x", "relations": {"nope": 1}},
     {"text": "x", "relations": {"nope": 1}}, "relations"),
    ("zero weights", ["x", "-r", "identity=0"], {"text": "x", "relations": {"identity": 0}},
     {"text": "x", "relations": {"identity": 0}}, "relations"),
    ("NaN weight", ["x", "-r", "identity=nan"], {"text": "x", "relations": {"identity": NAN}},
     {"text": "x", "relations": {"identity": NAN}}, "relations"),
    ("boolean weight", None, {"text": "x", "relations": {"identity": True}},
     {"text": "x", "relations": {"identity": True}}, "relations"),
    ("repeated relation", ["x", "-r", "identity=1", "-r", "identity=1"], None, None, "relations"),
    ("unknown filter field", ["x", "--filter", "nosuch=a"], {"text": "x", "filters": {"nosuch": "a"}},
     {"text": "x", "filters": {"nosuch": "a"}}, "filters"),
    ("unknown collapse field", ["x", "--collapse", "nosuch"], {"text": "x", "collapse": "nosuch"},
     {"text": "x", "collapse": "nosuch"}, "collapse"),
    ("offset + k too large", ["x", "--offset", "9999", "-k", "5"], {"text": "x", "offset": 9999, "k": 5},
     {"text": "x", "offset": 9999, "k": 5}, "offset"),
    ("rerank_depth alone", ["x", "--rerank-depth", "5"], {"text": "x", "rerank_depth": 5},
     {"text": "x", "rerank_depth": 5}, "rerank_depth"),
    ("unknown head", ["x", "--rerank", "no-head"], {"text": "x", "rerank": "no-head"},
     {"text": "x", "rerank": "no-head"}, "rerank"),
    ("hybrid weight out of range", ["x", "--hybrid", "weighted", "--hybrid-weight", "1.5"],
     {"text": "x", "hybrid": "weighted", "hybrid_weight": 1.5}, {"text": "x", "hybrid": "weighted", "hybrid_weight": 1.5},
     "hybrid_weight"),
    ("NaN min_score", ["x", "--min-score", "nan"], {"text": "x", "min_score": NAN}, {"text": "x", "min_score": NAN},
     "min_score"),
    ("unknown field to return", ["x", "--fields", "name,nosuch"], {"text": "x", "fields": ["name", "nosuch"]},
     {"text": "x", "fields": ["name", "nosuch"]}, "fields"),
    ("fields without metadata", ["x", "--fields", "name", "--no-metadata"],
     {"text": "x", "fields": ["name"], "metadata": False}, {"text": "x", "fields": ["name"], "metadata": False}, "fields"),
    ("fields a string", None, {"text": "x", "fields": "name"}, {"text": "x", "fields": "name"}, "fields"),
    ("metadata a string", None, {"text": "x", "metadata": "no"}, {"text": "x", "metadata": "no"}, "metadata"),
]
CLI_NAMES = {"k": "-k", "text": "TEXT", "id": "--id", "relations": "--relation", "filters": "--filter",
             "collapse": "--collapse", "offset": "--offset", "rerank_depth": "--rerank-depth", "rerank": "--rerank",
             "hybrid_weight": "--hybrid-weight", "min_score": "--min-score", "a": "TEXT_A", "b": "TEXT_B",
             "fields": "--fields", "metadata": "--no-metadata"}


@pytest.mark.parametrize("case, cli_args, api_kwargs, http_body, field", VALIDATION_TABLE,
                         ids=[row[0] for row in VALIDATION_TABLE])
def test_cli_api_and_http_refuse_alike(server, index, index_dir, case, cli_args, api_kwargs, http_body, field):
    """One request-validation path: each case is refused by every interface that can express it, naming
    the same field (the CLI its flag)."""
    from click.testing import CliRunner

    from relsearch.cli import cli

    if cli_args is not None:
        out = CliRunner().invoke(cli, ["query", "--index", str(index_dir), *cli_args])
        assert out.exit_code in (1, 2) and CLI_NAMES[field] in out.output, out.output
    if api_kwargs is not None:
        kwargs = dict(api_kwargs)
        with pytest.raises(RequestError) as e:
            index.search(kwargs.pop("text", None), **kwargs)
        assert e.value.field == field
    if http_body is not None:
        status, payload = _post(server, "/search", json.dumps(http_body))
        assert status == (404 if field == "id" else 422) and payload["error"]["field"].split(".")[0] == field


def test_hits_carry_the_metadata_asked_for_in_every_interface(server, index, index_dir):
    """Issue 28 item 7: ``fields`` / ``metadata`` shape hits alike in the API, HTTP (search and batch)
    and the CLI (--json, and the table's columns); requests sharing one search keep their own shape."""
    from click.testing import CliRunner

    from relsearch.api import SearchRequest
    from relsearch.cli import cli

    fields = ["name", "gics_sector"]
    api = index.search(id="MMM", k=3, fields=fields)
    assert len(api) == 3 and all(list(h.metadata) == fields for h in api)
    assert [h["metadata"] for h in Client(server).search(id="MMM", k=3, fields=fields)] == [h.metadata for h in api]
    cli_json = CliRunner().invoke(cli, ["query", "--index", str(index_dir), "--id", "MMM", "-k", "3", "--json",
                                        "--fields", "name", "--fields", "gics_sector"])
    assert [json.loads(line)["metadata"] for line in cli_json.output.splitlines()] == [h.metadata for h in api]
    assert [h.metadata for h in index.search(id="MMM", k=2, metadata=False)] == [{}, {}]
    assert [h["metadata"] for h in Client(server).search(id="MMM", k=2, metadata=False)] == [{}, {}]
    bare = CliRunner().invoke(cli, ["query", "--index", str(index_dir), "--id", "MMM", "-k", "2", "--json",
                                    "--no-metadata"])
    assert [json.loads(line)["metadata"] for line in bare.output.splitlines()] == [{}, {}]
    batch = Client(server).search_batch([{"id": "MMM"}, {"text": "banks"}], k=2, fields=["gics_sector"])
    assert all(list(h["metadata"]) == ["gics_sector"] for one in batch for h in one["results"])
    shared = index.search_batch([SearchRequest(id="MMM", k=2, fields=["name"]), SearchRequest(id="MMM", k=2)])
    assert [list(h.metadata) for h in shared.results[0]] == [["name"]] * 2
    assert all(len(h.metadata) > 2 for h in shared.results[1])  # the same search, its own (full) metadata
    table = CliRunner().invoke(cli, ["query", "--index", str(index_dir), "--id", "MMM", "-k", "3",
                                     "--fields", "gics_sector,name"]).output.splitlines()
    assert table[0].split()[:5] == ["rank", "score", "id", "gics_sector", "name"]
    for line, hit in zip(table[1:], api):
        assert (hit.metadata["gics_sector"] or "")[:20] in line and hit.metadata["name"][:20] in line


def test_the_cli_table_says_fused_scores_and_shows_a_mixtures_parts_first(index_dir):
    """Issue 28 item 7: hybrid scores are fused scores on another scale (the column and a note say
    so); --explain with a mixture prints its weighted parts, summing to the score, before every
    operator's cosine."""
    from click.testing import CliRunner

    from relsearch.cli import cli

    def table(*args):
        out = CliRunner().invoke(cli, ["query", "--index", str(index_dir), "-k", "3", *args])
        assert out.exit_code == 0, out.output
        return out.output.splitlines()

    rrf = table("cloud software", "--hybrid")
    assert rrf[0].split()[:2] == ["rank", "rrf"] and "fused scores" in rrf[-1] and "not cosines" in rrf[-1]
    weighted = table("cloud software", "--hybrid", "weighted")  # runs as a recipe with BM25 share 0.5
    assert weighted[0].split()[:2] == ["rank", "recipe"] and "not cosines" in weighted[-1]
    plain = table("cloud software")
    assert plain[0].split()[:2] == ["rank", "score"] and "fused" not in plain[-1]
    mixed = table("--id", "MMM", "-r", "contradiction=0.7", "-r", "identity=0.3", "--explain")  # operators alone
    assert mixed[0].startswith("anchor: MMM")  # --explain shows the anchor's card first
    mixed = mixed[next(i for i, line in enumerate(mixed) if line.split()[:1] == ["rank"]):]
    score = float(mixed[1].split()[1])
    parts = mixed[2].split()
    assert parts[0].startswith("mixture:contradiction=") and parts[2].startswith("mixture:identity=")
    assert float(parts[-1]) == pytest.approx(score, abs=2e-3)
    assert "identity=" in mixed[3] and "mixture:" not in mixed[3]
    recipe = table("--id", "MMM", "-r", "similar-company=0.7", "-r", "identity=0.3", "--explain")  # a recipe's parts
    first = next(i for i, line in enumerate(recipe) if line.split()[:1] == ["1"])  # after the plan's warnings
    parts = recipe[first + 1].split()
    assert parts[0].startswith("recipe:dense=") and parts[2].startswith("recipe:bm25=")
    assert float(parts[-1]) == pytest.approx(float(recipe[first].split()[1]), abs=2e-3)


@pytest.mark.parametrize("a, b, field", [("", "x", "a"), ("x", "   ", "b")])
def test_score_refuses_empty_texts_in_every_interface(server, index, a, b, field):
    from click.testing import CliRunner

    from relsearch.cli import cli

    out = CliRunner().invoke(cli, ["score", a, b])
    assert out.exit_code == 1 and CLI_NAMES[field] in out.output and "empty" in out.output, out.output
    with pytest.raises(RequestError) as e:
        index.score(a, b)
    assert e.value.field == field
    status, payload = _post(server, "/score", json.dumps({"a": a, "b": b}))
    assert (status, payload["error"]["field"]) == (422, field)


def test_search_answers_carry_filter_warnings_and_a_delete_says_whether_it_published(server):
    """Issue 28 item 1: ``founded`` holds strings, so ``{"not": {"eq": 1902}}`` keeps every document
    and ``{"gte": 1990}`` none; /search and /search/batch name it in ``warnings`` (the quoted form
    to use), and /documents/delete says ``published`` (a delete of nothing publishes nothing)."""
    status, one = _post(server, "/search", json.dumps({"id": "MMM", "k": 3,
                                                       "filters": {"founded": {"not": {"eq": 1902}}}}))
    assert status == 200 and len(one["results"]) == 3
    assert len(one["warnings"]) == 1 and one["warnings"][0].startswith("filter 'founded'") and '"1902"' in one["warnings"][0]
    status, fine = _post(server, "/search", json.dumps({"id": "MMM", "k": 3, "filters": {"founded": "1902"}}))
    assert status == 200 and fine["warnings"] == []
    status, batch = _post(server, "/search/batch", json.dumps({"queries": [{"id": "MMM"}, {"text": "banks"}],
                                                               "filters": {"founded": {"gte": 1990}}}))
    assert status == 200 and [b["results"] for b in batch["batch"]] == [[], []]
    assert "holds no numbers" in batch["warnings"][0]  # then why the answers are empty (api: no_match_warnings)
    assert batch["warnings"][1:] == ['no document matches the filter {"founded": {"gte": 1990}}']
    client = Client(server)
    nothing = client.delete(["NEVER-THERE"])
    assert nothing["published"] is False and nothing["not_found"] == ["NEVER-THERE"]
    doc = {"id": "ZZ-PUB", "text": "A maker of artisanal anvils and forging hammers."}
    assert client.add([doc])["published"] is True
    assert client.delete(["ZZ-PUB"])["published"] is True


# ---------------------------------------------------------------- pages of other origins (red-team item 2)

ATTACKER = "http://attacker.example"
NEW_DOC = json.dumps({"documents": [{"id": "ZZ-CSRF", "text": "A document a web page planted."}]})


def _documents(url: str) -> int:
    return Client(url).health()["indexes"]["companies"]["documents"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "text/plain;charset=UTF-8",
                                          "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                          "application/json; charset=latin-1", "application/jsonx"])
def test_a_body_not_declared_json_is_refused_and_writes_nothing(server, content_type):
    """What fetch(..., {mode: "no-cors"}) or a <form> of any page may send without a CORS preflight
    (text/plain, a form) was read as JSON and added documents; now 415, nothing written."""
    before = _documents(server)
    status, headers, payload = _request(server, "POST", "/documents", NEW_DOC,
                                        {"Content-Type": content_type} if content_type else {})
    assert status == 415 and payload["error"]["field"] == "content-type", payload
    assert "application/json" in payload["error"]["message"] or "UTF-8" in payload["error"]["message"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert _documents(server) == before
    with pytest.raises(ClientError) as e:
        Client(server).search(id="ZZ-CSRF")
    assert e.value.status == 404
    for path, body in [("/search", '{"text": "x"}'), ("/documents/delete", '{"ids": ["MMM"]}'),
                       ("/score", '{"a": "x", "b": "y"}'), ("/search/batch", '{"queries": [{"text": "x"}]}')]:
        assert _request(server, "POST", path, body, {"Content-Type": "text/plain"})[0] == 415, path


def test_json_with_a_utf8_charset_is_accepted(server):
    for content_type in ("application/json; charset=utf-8", "Application/JSON;charset=\"UTF-8\""):
        status, _, payload = _request(server, "POST", "/search", '{"text": "oil and gas", "k": 2}',
                                      {"Content-Type": content_type})
        assert status == 200 and len(payload["results"]) == 2, (content_type, payload)


@pytest.mark.parametrize("headers, status", [
    ({"Origin": ATTACKER}, 403),
    ({"Origin": "null"}, 403),  # a sandboxed frame, a file: page
    ({"Origin": "http://127.0.0.1:1"}, 403),  # another port is another origin
    ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}, 403),
    ({"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}, 403),
    ({"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Origin": "{url}"}, 200),  # the explorer page
    ({"Sec-Fetch-Site": "none"}, 200),  # typed in the address bar
    ({}, 200),  # curl, the client, bench serve
])
def test_requests_from_pages_of_other_origins_are_refused(server, headers, status):
    headers = {k: v.replace("{url}", server) for k, v in headers.items()}
    before = _documents(server)
    got, _, payload = _request(server, "POST", "/search", '{"text": "x", "k": 1}',
                               {"Content-Type": "application/json", **headers})
    assert got == status, payload
    if status == 403:
        assert payload["error"]["field"] in ("origin", "sec-fetch-site") and "other origins" in payload["error"]["message"]
        write = _request(server, "POST", "/documents", NEW_DOC, {"Content-Type": "application/json", **headers})
        assert write[0] == 403 and _documents(server) == before


def test_a_link_from_another_site_still_opens_the_page(server):
    status, headers, _ = _request(server, "GET", "/", headers={"Sec-Fetch-Site": "cross-site",
                                                               "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"})
    assert status == 200 and "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    fetched = _request(server, "GET", "/fields", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors",
                                                          "Origin": ATTACKER})
    assert fetched[0] == 403


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:{port}", "127.0.0.1.attacker.example",
                                  "localhost@attacker.example", "", "127.0.0.1:99999", "[::1"])
def test_a_foreign_host_header_is_refused(server, host):
    """DNS rebinding: a page on attacker.example whose name now resolves to 127.0.0.1 sends its own
    name as Host; such a request reads nothing and writes nothing."""
    host = host.replace("{port}", server.rsplit(":", 1)[1])
    for method, path, body in [("GET", "/health", None), ("GET", "/fields", None), ("POST", "/search", '{"text": "x"}')]:
        status, headers, payload = _request(server, method, path, body,
                                            {"Host": host, "Content-Type": "application/json"})
        assert status in (400, 421), (host, path, status)  # 400: refused by the HTTP parser itself
        if status == 421:
            assert payload["error"]["field"] == "host" and "--allowed-host" in payload["error"]["message"]
            assert headers["X-Content-Type-Options"] == "nosniff"


def test_the_loopback_names_are_accepted_and_allowed_hosts_admit_a_proxy(index):
    from relsearch.serve import Hosts

    url, srv = _start(create_app({"companies": index}, access_log=False,
                                 hosts=Hosts.bound("127.0.0.1", None, ["search.example", "other.example:8443"])))
    try:
        port = url.rsplit(":", 1)[1]
        for host, status in [(f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200), (f"[::1]:{port}", 200),
                             (f"LOCALHOST:{port}", 200), ("search.example", 200), ("search.example:443", 200),
                             ("other.example:8443", 200), ("other.example", 421), ("attacker.example", 421)]:
            assert _request(url, "GET", "/health", headers={"Host": host})[0] == status, host
        # a proxy that rewrites Host: the page's Origin is the allowed name, the Host the bound one
        status, _, payload = _request(url, "POST", "/search", '{"text": "x", "k": 1}', {
            "Content-Type": "application/json", "Origin": "https://search.example", "Host": f"127.0.0.1:{port}"})
        assert status == 200, payload
        assert _request(url, "POST", "/search", '{"text": "x"}', {"Content-Type": "application/json",
                                                                  "Origin": ATTACKER, "Host": "search.example"})[0] == 403
    finally:
        srv.should_exit = True


def test_hosts_of_a_bind():
    from relsearch.serve import Hosts

    loopback = Hosts.bound("127.0.0.1", 8000)
    assert loopback.accepts("localhost", 8000) and loopback.accepts("[::1]", 8000)
    assert not loopback.accepts("localhost", 8001) and not loopback.accepts("10.0.0.5", 8000)
    named = Hosts.bound("search.lan", 8000, ["::1", "[fe80::1]:9000"])
    assert named.accepts("search.lan", 8000) and not named.accepts("localhost", 8000)
    assert named.accepts("[::1]", 1234) and named.accepts("[fe80::1]", 9000) and not named.accepts("[fe80::1]", 8000)
    wildcard = Hosts.bound("0.0.0.0", 8000)  # its own addresses are not listed: any address literal, never a name
    assert wildcard.accepts("192.168.1.5", 8000) and wildcard.accepts("localhost", 8000)
    assert not wildcard.accepts("attacker.example", 8000) and not wildcard.accepts("192.168.1.5", 8001)
    for bad in ("a b", "x:y", "evil/path", "[::1"):
        with pytest.raises(ValueError, match="--allowed-host"):
            Hosts.bound("127.0.0.1", 8000, [bad])


def test_cli_serve_refuses_a_bad_allowed_host_before_loading(index_dir):
    from click.testing import CliRunner

    from relsearch.cli import cli

    out = CliRunner().invoke(cli, ["serve", "--index", str(index_dir), "--port", "0", "--allowed-host", "x:y"])
    assert out.exit_code == 2 and "--allowed-host" in out.output and "'x:y'" in out.output, out.output


def test_responses_say_nosniff_and_pages_forbid_framing(server):
    import base64
    import hashlib
    import re

    for method, path in [("GET", "/health"), ("GET", "/nowhere"), ("GET", "/metrics"), ("GET", "/openapi.json"),
                         ("GET", "/ui/assets/app.js"), ("GET", "/search")]:
        assert _request(server, method, path)[1]["X-Content-Type-Options"] == "nosniff", path
    for path in ("/", "/ui", "/docs", "/docs/oauth2-redirect"):
        status, headers, _ = _request(server, "GET", path)
        csp = headers["Content-Security-Policy"]
        assert status == 200 and "frame-ancestors 'none'" in csp and headers["X-Frame-Options"] == "DENY", path
        assert "'unsafe-eval'" not in csp and "script-src 'self'" in csp and "*" not in csp, csp
    # /docs runs Swagger UI's one inline script (it starts the bundle): allowed by its hash, no other
    host, port = server.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", "/docs")
    response = conn.getresponse()
    html = response.read()
    inline = re.findall(rb"<script>(.*?)</script>", html, re.S)
    assert len(inline) == 1 and b"SwaggerUIBundle" in inline[0]
    digest = base64.b64encode(hashlib.sha256(inline[0]).digest()).decode()
    assert f"script-src 'self' 'sha256-{digest}';" in response.getheader("Content-Security-Policy")


# ---------------------------------------------------------------- every filter form over HTTP (query-plan issue)

FILTER_DOCS = [{"id": "ZZ-F1", "text": "An energy trading and finance house.", "year": 1990, "tags": ["finance", "energy"],
                "rating": None},
               {"id": "ZZ-F2", "text": "A software maker for energy traders.", "year": 2005, "tags": ["software"],
                "rating": 3.5},
               {"id": "ZZ-F3", "text": "A solar power producer.", "year": 2015, "rating": 4}]
# (the form, a filter): each form indexer/filters.py documents
FILTER_FORMS = [
    ("value", {"gics_sector": "Energy"}),
    ("eq", {"gics_sector": {"eq": "Utilities"}}),
    ("ieq", {"gics_sector": {"ieq": "ENERGY"}}),
    ("number range", {"year": {"gte": 2000, "lt": 2020}}),
    ("string range", {"founded": {"gte": "1950", "lt": "2000"}}),
    ("in", {"gics_sector": {"in": ["Energy", "Utilities"]}}),
    ("has", {"tags": {"has": "finance"}}),
    ("exists", {"year": {"exists": True}}),
    ("null true", {"gics_sector": {"null": True}}),
    ("null false", {"rating": {"null": False}}),
    ("not", {"gics_sector": {"not": {"in": ["Energy", "Utilities"], "eq": "Financials"}}}),
    ("not null", {"rating": {"not": {"null": True}}}),
    ("$any", {"$any": [{"gics_sector": "Energy"}, {"year": {"lt": 2000}}]}),
    ("$all", {"$all": [{"$any": [{"gics_sector": "Energy"}, {"gics_sector": "Utilities"}]},
                       {"$any": [{"founded": {"lt": "1950"}}, {"hq_location": {"null": True}}]}]}),
    ("fields and $any", {"gics_sector": {"null": False}, "$any": [{"tags": {"has": "software"}},
                                                                  {"founded": {"gte": "2000"}}]}),
    ("case mismatch", {"gics_sector": "energy"}),  # matches nothing: the index holds "Energy"
    ("type mismatch", {"founded": {"gte": 1990}}),  # founded holds strings: a warning says so
]


def test_every_filter_form_over_http_answers_as_the_python_api(server, index):
    """The server's schema refused every $any / $all filter (422 "filters.$any.str: Input should be a
    valid string"); now each documented form reaches the one shared check and answers, in /search,
    /search/batch and the client, with the Python API's hits and warnings."""
    client = Client(server)
    client.add(FILTER_DOCS)
    text = "energy companies and power producers"
    try:
        for form, filters in FILTER_FORMS:
            expected = index.search(text, k=30, filters=filters)
            status, _, one = _request(server, "POST", "/search", json.dumps({"text": text, "k": 30, "filters": filters}),
                                      {"Content-Type": "application/json"})
            assert status == 200, (form, one)
            assert [h["id"] for h in one["results"]] == [h.id for h in expected], form
            assert one["warnings"] == expected.warnings, form
            batch = client.search_batch([{"text": text}, {"id": "ZZ-F2"}], k=30, filters=filters)
            assert [h["id"] for h in batch[0]["results"]] == [h.id for h in expected], form
            assert batch.warnings == expected.warnings, form
            if form not in ("case mismatch", "type mismatch"):
                assert expected, f"{form}: a filter that matches nothing tests nothing"
        assert not index.search(text, k=30, filters={"gics_sector": "energy"})
        assert index.search(text, k=30, filters={"founded": {"gte": 1990}}).warnings
    finally:
        client.delete([d["id"] for d in FILTER_DOCS])


@pytest.mark.parametrize("filters, message", [
    ({"$any": {"gics_sector": "Energy"}}, "takes a list of filters"),
    ({"$any": []}, "takes a list of filters"),
    ({"gics_sector": {"in": "Energy"}}, '"in" takes a list'),
    ({"gics_sector": {"null": "yes"}}, '"null" takes true'),
    ({"gics_sector": ["Energy"]}, "is not a string, boolean or finite number"),
    ({"gics_sector": {"not": {"not": {"eq": "x"}}}}, '"not" takes an object'),
])
def test_an_invalid_filter_is_refused_by_the_shared_check_with_its_message(server, index, filters, message):
    status, _, payload = _request(server, "POST", "/search", json.dumps({"text": "x", "filters": filters}),
                                  {"Content-Type": "application/json"})
    with pytest.raises(RequestError) as e:
        index.search("x", filters=filters)
    assert (status, payload["error"]["field"], e.value.field) == (422, "filters", "filters")
    assert message in payload["error"]["message"] and payload["error"]["message"] == e.value.message


def test_the_schema_documents_the_filter_grammar(server):
    schema = Client(server).request("GET", "/openapi.json")
    filters = schema["components"]["schemas"]["SearchBody"]["properties"]["filters"]
    assert filters["type"] == "object" and set(filters["properties"]) == {"$any", "$all"}
    assert filters["properties"]["$any"]["type"] == "array" and "$all" in filters["description"]
    operators = filters["additionalProperties"]["anyOf"][1]["properties"]
    assert {"eq", "ieq", "gt", "gte", "lt", "lte", "in", "has", "exists", "null", "not"} == set(operators)


def test_the_client_returns_warnings_with_the_hits(server, index):
    """relsearch.client dropped the answer's warnings: search and search_batch return a list, as
    before, that carries them (and the generation that answered)."""
    from relsearch.client import Results

    client = Client(server)
    filters = {"founded": {"not": {"eq": 1902}}}  # founded holds strings: keeps everything, says why
    hits = client.search(id="MMM", k=3, filters=filters)
    assert isinstance(hits, Results) and isinstance(hits, list) and len(hits) == 3
    assert hits.warnings == index.search(id="MMM", k=3, filters=filters).warnings and len(hits.warnings) == 1
    assert hits.generation == client.health()["indexes"]["companies"]["generation"] and hits.index == "companies"
    assert hits == [dict(h) for h in hits]  # compares as the plain list it was
    batch = client.search_batch([{"id": "MMM"}, {"text": "banks"}], k=2, filters={"founded": {"gte": 1990}})
    assert [b["results"] for b in batch] == [[], []] and "holds no numbers" in batch.warnings[0]
    assert client.search(id="MMM", k=2, filters={"founded": "1902"}).warnings == []


def test_examples_as_a_query_over_http_answer_as_the_python_api(server, index):
    """like / unlike (docs/how-a-query-runs.md): the same hits over HTTP, the client and Index.search."""
    like, unlike = [{"id": "AAPL"}, {"text": "consumer electronics", "weight": 0.5}], [{"id": "ADSK"}]
    want = index.search(like=like, unlike=unlike, k=5, relations={"similar-company": 1})
    status, payload = _post(server, "/search", json.dumps({"like": like, "unlike": unlike, "k": 5,
                                                            "relations": {"similar-company": 1}}))
    assert status == 200 and [h["id"] for h in payload["results"]] == [h.id for h in want]
    assert len(want) == 5 and not {"AAPL", "ADSK"} & {h.id for h in want}
    batch = Client(server).search_batch([{"like": like, "unlike": unlike, "relations": {"similar-company": 1}}], k=5)
    assert [h["id"] for h in batch[0]["results"]] == [h.id for h in want]
    status, payload = _post(server, "/search", json.dumps({"like": [{"id": "NOPE"}]}))
    assert (status, payload["error"]["field"]) == (404, "like")


def test_search_answers_say_what_the_plan_ran_in_every_mode(index, index_dir, tmp_path):
    """The explorer page worked out each answer's mode and combined recipe itself, mirroring
    retrieval/plan.py, because answers did not say; now /search, /search/batch, the client and
    Index.search carry the plan's own: mode (the scale of the scores) and the combined recipe."""
    import numpy as np

    from relsearch.encoder.bundle import Bundle
    from relsearch.encoder.relations import Operator
    from relsearch.retrieval.plan import SCALES, resolve
    from relsearch.retrieval.recipe import Recipe

    shipped = index.searcher().bundle
    d = shipped.encoder["dim"]
    view = Operator(name="view", kind="projection",  # a both-sides projection: searched in its own projected space
                    params={"P": np.random.default_rng(5).normal(0, 1, (16, d)).astype(np.float32)})
    path = Bundle(encoder=dict(shipped.encoder), operators={**shipped.operators, "view": view}).save(tmp_path / "b")
    projecting = Index(index_dir, model=str(path))
    url, srv = _start(create_app({"companies": projecting}))
    try:
        cases = [("dense", {"identity": 1.0}, {}), ("dense", {"identity": 0.5, "aspect:sector": 0.5}, {}),
                 ("recipe", {"similar-company": 1.0}, {}),
                 ("recipe", {"contradiction": 1.0}, {"hybrid": "weighted", "hybrid_weight": 0.8}),
                 ("rrf", {"contradiction": 1.0}, {"hybrid": "rrf"}), ("projection", {"view": 1.0}, {})]
        assert {mode for mode, _, _ in cases} == set(SCALES)
        searcher = projecting.searcher()
        for mode, relations, options in cases:
            scoring = resolve(searcher.operators, relations, hybrid=options.get("hybrid"),
                              relational_share=options.get("hybrid_weight"), metadata_fields=searcher.metadata_fields)
            assert scoring.mode == mode
            status, payload = _post(url, "/search", json.dumps({"id": "MMM", "relations": relations, "k": 3, **options}))
            assert status == 200 and len(payload["results"]) == 3, payload
            assert (payload["mode"], payload["recipe"]) == (mode, scoring.recipe.to_json()), relations
            hits = Client(url).search(id="MMM", relations=relations, k=3, **options)
            assert (hits.mode, hits.recipe) == (mode, scoring.recipe.to_json())
            local = projecting.search(id="MMM", relations=relations, k=3, **options)
            assert (local.mode, local.recipe) == (mode, scoring.recipe)
        # each query of a batch says its own; a refused one carries its error alone
        status, payload = _post(url, "/search/batch", json.dumps({"k": 2, "queries": [
            {"id": "MMM"}, {"text": "banks", "relations": {"similar-company": 1}}, {"id": "MMM", "relations": {"nope": 1}}]}))
        assert status == 200
        assert [entry.get("mode") for entry in payload["batch"]] == ["dense", "recipe", None]
        assert payload["batch"][1]["recipe"]["mixture"] == {"similar-company": 1.0} and "error" in payload["batch"][2]
        # the schema: additive (the request bodies unchanged), the answers' mode and recipe documented
        schema = Client(url).request("GET", "/openapi.json")
        answer = schema["paths"]["/search"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert answer == {"$ref": "#/components/schemas/SearchAnswer"}
        properties = schema["components"]["schemas"]["SearchAnswer"]["properties"]
        assert set(properties["mode"]["enum"]) == set(SCALES)
        recipe_keys = set(Recipe(mixture={"identity": 1.0}).to_json())  # the schema names every key an answer has
        assert set(schema["components"]["schemas"]["RecipeParts"]["properties"]) == recipe_keys
        batch = schema["paths"]["/search/batch"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert batch == {"$ref": "#/components/schemas/BatchSearchAnswer"}
    finally:
        srv.should_exit = True


def test_why_not_and_score_by_ids_over_http(server, index):
    """issue 52 item 5: "why_not" in /search answers as Index.search does; /score takes two ids."""
    want = index.search(id="MMM", relations={"similar-company": 1}, k=3, why_not="ADBE").why_not
    status, payload = _post(server, "/search", json.dumps({"id": "MMM", "relations": {"similar-company": 1}, "k": 3,
                                                           "why_not": "ADBE"}))
    assert status == 200 and payload["why_not"] == json.loads(json.dumps(want))
    status, payload = _post(server, "/score", json.dumps({"ids": ["MMM", "ADBE"]}))
    assert status == 200 and payload["scores"] == json.loads(json.dumps(index.score_ids("MMM", "ADBE")))
    status, payload = _post(server, "/score", json.dumps({"ids": ["MMM", "NOPE"]}))
    assert status == 422 and payload["error"]["field"] == "ids"
    status, payload = _post(server, "/search", json.dumps({"id": "MMM", "why_not": "NOPE"}))
    assert status == 422 and payload["error"]["field"] == "why_not"
