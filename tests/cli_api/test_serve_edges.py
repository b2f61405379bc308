"""Two loose edges of `relsearch serve` without a key: a request that says twice where it comes from
(the foreign Origin first, the page's own last), and `/health` over a generation removed from disk
under the running server. A real uvicorn server (tests/cli_api/test_serve.py's) over a private copy."""
from __future__ import annotations

import http.client
import json
import shutil
from pathlib import Path

import pytest

from relsearch.api import Index
from relsearch.indexer import store
from relsearch.serve import create_app
from conftest import gen_of
from test_serve import ATTACKER, NEW_DOC, _copy_index, _start


def _raw(url: str, method: str, path: str, headers: list[tuple[str, str]], body: str | None = None) -> tuple[int, dict]:
    """One request with exactly ``headers``, repeated names included (http.client's dict form cannot
    repeat one); (status, JSON body)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for name, value in headers + ([("Content-Length", str(len(body.encode())))] if body is not None else []):
        conn.putheader(name, value)
    conn.endheaders(body.encode() if body is not None else None)
    response = conn.getresponse()
    return response.status, json.loads(response.read() or b"{}")


@pytest.fixture
def served(small_index, tmp_path):
    """(url, index folder): a server of its own over a private copy, stopped after the test."""
    index_dir = _copy_index(small_index, tmp_path / "companies")
    url, server = _start(create_app({"companies": Index(index_dir)}))
    yield url, index_dir
    server.should_exit = True


@pytest.mark.parametrize("repeated", [
    [("Origin", ATTACKER), ("Origin", "{url}")],  # the foreign one hidden before the page's
    [("Origin", "{url}"), ("Origin", ATTACKER)],
    [("Origin", "{url}"), ("Origin", "{url}")],  # a request says once where it comes from
    [("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Site", "same-origin"), ("Origin", "{url}")],
])
def test_a_request_that_repeats_where_it_comes_from_is_refused(served, repeated):
    url, _ = served
    headers = [(name, value.replace("{url}", url)) for name, value in repeated]
    base = [("Host", url.removeprefix("http://")), ("Content-Type", "application/json")]
    documents = _raw(url, "GET", "/health", base[:1])[1]["indexes"]["companies"]["documents"]
    for path, body in [("/search", '{"text": "x", "k": 1}'), ("/documents", NEW_DOC)]:
        status, payload = _raw(url, "POST", path, base + headers, body)
        assert status == 403 and payload["error"]["field"] == headers[0][0].lower(), payload
        assert "more than once" in payload["error"]["message"] and "other origins" in payload["error"]["message"]
    assert _raw(url, "GET", "/health", base[:1])[1]["indexes"]["companies"]["documents"] == documents
    # the page's own request, its headers once each, is answered
    once = base + [("Origin", url), ("Sec-Fetch-Site", "same-origin")]
    assert _raw(url, "POST", "/search", once, '{"text": "x", "k": 1}')[0] == 200


def test_health_reports_a_served_generation_missing_on_disk(served):
    """The generation the server serves removed under it (the server still answers from the files
    it holds open, but a restart would fail): /health is 503, "degraded", naming what is missing;
    with the files back it is ok again. A file of it missing is named the same way."""
    url, index_dir = served
    base = [("Host", url.removeprefix("http://"))]
    status, answer = _raw(url, "GET", "/health", base)
    assert status == 200 and answer["status"] == "ok" and "problem" not in answer["indexes"]["companies"], answer
    assert _raw(url, "POST", "/search", base + [("Content-Type", "application/json")], '{"id": "MMM", "k": 2}')[0] == 200
    gen = Path(gen_of(index_dir))
    shutil.move(gen, index_dir / "elsewhere")
    status, answer = _raw(url, "GET", "/health", base)
    assert status == 503 and answer["status"] == "degraded", answer
    entry = answer["indexes"]["companies"]
    assert entry["generation"] == gen.name and str(gen / store.MANIFEST) in entry["problem"], entry
    assert answer["error"] == {"field": "index", "message": f"companies: {entry['problem']}"}
    shutil.move(index_dir / "elsewhere", gen)
    assert _raw(url, "GET", "/health", base)[0] == 200
    (gen / store.VECTORS_FILE).unlink()
    status, answer = _raw(url, "GET", "/health", base)
    assert status == 503 and f"{gen / store.VECTORS_FILE} is missing" in answer["indexes"]["companies"]["problem"]
