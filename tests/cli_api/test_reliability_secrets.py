"""Secrets: Elasticsearch credentials come only from the environment or a file, and appear nowhere
else: not in any command's output or errors, not in logs, not in any file a run writes (manifest,
rejected files, locks, generations), not in what is stored in Elasticsearch."""
from __future__ import annotations

import base64
import json
import logging

import pytest
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.indexer import store

from es_server import EsTestServer
from synthetic_index import build, run_cli, write_ids

API_KEY = "c2VjcmV0LWtleS1mb3ItdGVzdHM6eHl6enk="
PASSWORD = "pa55-w0rd-never-printed"
BASIC = base64.b64encode(f"svc:{PASSWORD}".encode()).decode()
SECRETS = (API_KEY, PASSWORD, BASIC)


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a secret leaked into {where}"


@pytest.fixture
def server():
    with EsTestServer(lifetime_s=300) as srv:
        yield srv


def test_no_command_output_or_written_file_contains_a_secret(server, tmp_path, caplog):
    target = tmp_path / "idx"
    build(target, n=200)
    es = ["--es-url", server.url, "--es-index", "docs", "--es-index-type", "flat"]
    outputs = []

    def cli_run(*args, env, ok=True):
        proc = run_cli(*args, env=env)
        outputs.append((f"relsearch {args[0]}", proc.stdout + proc.stderr))
        assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
        return proc

    # the API key from the environment
    server.require_auth(f"ApiKey {API_KEY}")
    env = {"RELSEARCH_ES_API_KEY": API_KEY}
    cli_run("compact", "--index", target, *es, env=env)
    hits = cli_run("query", "--id", "d1", "--index", target, "--backend", "es", *es[:4], "--json", env=env)
    assert len(hits.stdout.splitlines()) == 10
    # user and password from a credentials file
    creds = tmp_path / "es.json"
    creds.write_text(json.dumps({"username": "svc", "password": PASSWORD}))
    creds.chmod(0o600)
    server.require_auth(f"Basic {BASIC}")
    cli_run("delete", "--index", target, "--ids", write_ids(tmp_path / "ids.txt", ["d1", "nope"]), *es,
            "--es-credentials", creds, env={})
    # failures: wrong credentials (401), a URL that embeds them, a damaged credentials file
    server.require_auth("ApiKey someone-else")
    denied = cli_run("compact", "--index", target, *es, env=env, ok=False)
    assert "Traceback" not in denied.stderr
    assert "Elasticsearch refused to load docs-" in denied.stderr and "401 AuthenticationException" in denied.stderr
    in_process = CliRunner(env={"RELSEARCH_ES_API_KEY": None})
    embedded = in_process.invoke(cli, ["compact", "--index", str(target), "--es-url",
                                       f"http://svc:{PASSWORD}@127.0.0.1:9", "--es-index", "docs"])
    assert embedded.exit_code != 0 and "must not embed credentials" in embedded.output
    broken = tmp_path / "broken.json"
    broken.write_text(f'{{"api_key": "{API_KEY}"')
    damaged = in_process.invoke(cli, ["compact", "--index", str(target), *es, "--es-credentials", str(broken)])
    assert damaged.exit_code != 0 and "not valid JSON" in damaged.output
    outputs += [("embedded-URL error", embedded.output), ("credentials-file error", damaged.output)]

    # the same commands in-process with every logger at DEBUG (the client's request logs included)
    server.require_auth(f"ApiKey {API_KEY}")
    with caplog.at_level(logging.DEBUG):
        out = CliRunner(env={"RELSEARCH_ES_API_KEY": API_KEY}).invoke(cli, ["compact", "--index", str(target), *es])
    assert out.exit_code == 0, out.output
    assert "Elasticsearch client for" in caplog.text  # the logs were captured
    outputs += [("compact output", out.output), ("logs at DEBUG", caplog.text)]

    for where, text in outputs:
        assert_no_secret(text, where)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p not in (creds, broken)]
    assert any(p.name == "manifest.json" for p in written) and any(p.name == "rejected.jsonl" for p in written)
    for path in written:
        assert_no_secret(path.read_bytes().decode("utf-8", "replace"), str(path))
    stored = json.dumps({name: vars(index) for name, index in server.indices.items()}, default=str)
    assert_no_secret(stored, "the Elasticsearch indices (mappings, _meta, documents)")
    manifest = json.loads((store.current_generation(target) / "manifest.json").read_text())
    assert manifest["backends"]["elasticsearch"]["alias"] == "docs" and "url" not in json.dumps(manifest).lower()


MALFORMED_URLS = [
    "elastic:{pw}@127.0.0.1:9200", "http//elastic:{pw}@127.0.0.1:9200", "http:/elastic:{pw}@127.0.0.1:9200",
    "http://elastic:{pw}@127.0.0.1:9200", "https://elastic:{pw}@h@127.0.0.1", "elastic:{pw}@",
    "ftp://elastic:{pw}@h:21", "http://elastic:{pw}", "https://elastic:{pw}/x@h:9200", "http://elastic:{pw}@[::1",
    "HTTPS:elastic:{pw}@h:9200/path?q=1", "//elastic:{pw}@h:9200",
]


@pytest.mark.parametrize("form", MALFORMED_URLS)
def test_an_es_url_with_a_password_is_never_echoed_however_malformed(form, tmp_path):
    from relsearch.indexer.elastic import connect, display_url

    url = form.format(pw=PASSWORD)
    assert PASSWORD not in display_url(url)
    with pytest.raises(ValueError) as info:
        connect(url, environ={})
    assert PASSWORD not in str(info.value)
    target = tmp_path / "idx"
    build(target, n=20)
    runner = CliRunner(env={"RELSEARCH_ES_API_KEY": None})
    for args in (["compact", "--index", str(target), "--es-url", url, "--es-index", "rs"],
                 ["query", "--id", "d1", "--index", str(target), "--backend", "es", "--es-url", url,
                  "--es-index", "rs"]):
        out = runner.invoke(cli, args)
        assert out.exit_code == 1 and "Traceback" not in out.output, out.output
        assert_no_secret(out.output, f"relsearch {args[0]} --es-url {form}")
