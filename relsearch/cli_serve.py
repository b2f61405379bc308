"""``relsearch serve``: parse options, open the indexes, run the HTTP server (relsearch/serve/).

Registered in :mod:`relsearch.cli`; kept free of imports from it so either module can load first.
"""
from __future__ import annotations

import ipaddress
import os

import click

MAX_API_KEY_FILE_BYTES = 64 << 10


def _named_indexes(specs: tuple[str, ...]) -> dict[str, str]:
    """``DIR`` or ``NAME=DIR`` → {name: dir}; a bare DIR is named after its folder."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = os.path.basename(os.path.normpath(spec)), spec
        if not name or not path:
            raise click.BadParameter(f"expects DIR or NAME=DIR, got {spec!r}", param_hint="--index")
        if name in out:
            raise click.BadParameter(f"index name {name!r} given twice; name them with NAME=DIR", param_hint="--index")
        out[name] = path
    return out


def _es_options(backend: str, index_specs: tuple[str, ...], url, alias, credentials, ca_certs, num_candidates):
    """``--backend es``'s options (retrieval/es_backend.py), None for faiss; a usage error for a
    missing URL or alias, and for several indexes (one --es-index names one mirror)."""
    if backend != "es":
        given = [flag for flag, v in (("--es-url", url), ("--es-index", alias), ("--num-candidates", num_candidates))
                 if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} apply to --backend es")
        return None
    if not (url and alias):
        raise click.UsageError("--backend es needs --es-url and --es-index")
    if len(index_specs) > 1:
        raise click.UsageError("--backend es serves one --index (its mirror is --es-index)")
    from relsearch.retrieval.es_backend import EsQueryOptions

    return EsQueryOptions(url=url, index=alias, credentials_file=credentials, ca_certs=ca_certs,
                          num_candidates=num_candidates)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@click.command()
@click.option("--index", "index_specs", required=True, multiple=True, metavar="[NAME=]DIR",
              help="Published index to serve; repeat for several (requests pick one with \"index\": NAME; "
                   "the first is the default).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; the default accepts connections from this machine only.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0: any free port.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME[:PORT]",
              help="Also accept requests whose Host header is NAME (any port, or PORT), e.g. the name a reverse proxy "
                   "forwards; repeat for several. By default only the bound names are accepted (for 127.0.0.1: "
                   "127.0.0.1, localhost and [::1] on --port), so a page whose DNS name was made to point here "
                   "(DNS rebinding) is refused (421).")
@click.option("--model", default=None, help="Relation bundle to query with (default: each index's own bundle).")
@click.option("--api-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="File whose first line is the API key clients must send (default: $RELSEARCH_API_KEY; "
                   "neither: no key).")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=None, help="Request body limit (default 4 MiB).")
@click.option("--max-batch", type=click.IntRange(1, 4096), default=None, help="Queries per /search/batch (default 256).")
@click.option("--max-hits", type=click.IntRange(min=1), default=None,
              help="Cost one request may have, in hits: per query k + offset candidates (64x with collapse, at most "
                   "10,000; at least rerank_depth with rerank), doubled with explain (default 100,000; 422 beyond). "
                   "Also what one micro-batch pass may hold.")
@click.option("--max-response-bytes", type=click.IntRange(min=1024), default=None,
              help="JSON bytes one search response may hold (default 32 MiB; 422 naming k beyond).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.001), default=None,
              help="Seconds a search may wait and run (default 30); then 503 and its work stops (before its pass, or "
                   "between collapse rounds).")
@click.option("--body-timeout", "body_timeout_s", type=click.FloatRange(min=0.001), default=None,
              help="Seconds a request body may take to arrive (default 10); then 408 and the connection is closed.")
@click.option("--micro-batch", type=click.IntRange(min=1), default=None,
              help="Queries per encoder pass across concurrent requests (default 64).")
@click.option("--refill-wait-ms", type=click.FloatRange(min=0), default=None,
              help="Milliseconds a pass may wait for as many queries as the previous pass answered (default 5; "
                   "0: take what queued up).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch intra-op threads (default: torch's, one per core). On 2 quiet cores the default "
                   "serves 32 clients faster; where other jobs hold a core, 1 served about 2x more at 1 and 32 "
                   "clients (docs/performance.md, \"Serving under load\").")
@click.option("--access-log/--no-access-log", default=True, show_default=True,
              help="One line per request on stderr: time, method, path, status, latency (never bodies or keys).")
@click.option("--backend", type=click.Choice(["faiss", "es"]), default="faiss", show_default=True,
              help="es: /search answers from the index's Elasticsearch mirror (the local index still supplies the "
                   "bundle, --id vectors and documents), and /documents writes re-mirror it.")
@click.option("--es-url", default=None, help="Elasticsearch URL for --backend es (credentials from the environment).")
@click.option("--es-index", default=None, help="Elasticsearch alias or index for --backend es.")
@click.option("--es-credentials", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--es-ca-certs", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--num-candidates", type=click.IntRange(min=1), default=None,
              help="Elasticsearch kNN candidates per shard (default max(100, 2k)).")
def serve(index_specs, host, port, allowed_hosts, model, api_key_file, max_body_bytes, max_batch, max_hits,
          max_response_bytes, timeout_s, body_timeout_s, micro_batch, refill_wait_ms, threads, access_log,
          backend, es_url, es_index, es_credentials, es_ca_certs, num_candidates):
    """Serve indexes over HTTP (JSON; OpenAPI at /docs): search, relations, score, add/delete, health, metrics."""
    es = _es_options(backend, index_specs, es_url, es_index, es_credentials, es_ca_certs, num_candidates)
    if threads:
        import torch

        torch.set_num_threads(threads)
    from relsearch.api import Index
    from relsearch.files import check_regular_file
    from relsearch.serve import Hosts, ServeLimits, read_api_key
    from relsearch.serve import serve as run_server

    given = {"max_body_bytes": max_body_bytes, "max_batch": max_batch, "max_hits": max_hits,
             "max_response_bytes": max_response_bytes, "timeout_s": timeout_s, "body_timeout_s": body_timeout_s,
             "micro_batch": micro_batch, "refill_wait_ms": refill_wait_ms}
    limits = ServeLimits(**{k: v for k, v in given.items() if v is not None})
    try:
        Hosts.bound(host, port, allowed_hosts)
    except ValueError as e:  # before the model loads
        raise click.BadParameter(str(e).removeprefix("--allowed-host "), param_hint="--allowed-host") from None
    try:
        if api_key_file:  # a FIFO or device would hang the start-up, a huge file fill memory
            check_regular_file(api_key_file, limit=MAX_API_KEY_FILE_BYTES, what=f"--api-key-file {api_key_file}")
        api_key = read_api_key(api_key_file)
        indexes = {name: Index(path, model, es=es) for name, path in _named_indexes(index_specs).items()}
    except (OSError, ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    if es is not None:
        from relsearch.cli_query import _warn_if_stale_mirror
        from relsearch.indexer.elastic import display_url

        for index in indexes.values():
            _warn_if_stale_mirror(index.searcher().files.manifest, es.index)
        click.echo(f"backend: Elasticsearch {es.index} at {display_url(es.url)}", err=True)
    if not _loopback(host) and api_key is None:
        click.echo(f"warning: serving on {host} without an API key: anyone who can reach it can read and change "
                   "the indexes (set RELSEARCH_API_KEY or --api-key-file)", err=True)
    from relsearch.encoder.precision import precision_line

    lines = set()
    for index in indexes.values():  # load the transformers now, not in the first request
        encoder = index.searcher().encoder
        lines.add(precision_line(encoder.device, encoder.dtype, encoder.precision_reason))
    for line in sorted(lines):  # once, however many indexes share it; stderr, with the log (stdout's first line: the URL)
        click.echo(f"encoder: {line}", err=True)

    _log_to_stderr()  # with the access log: "started" and "stopped after N requests" lines

    def ready(url: str) -> None:
        names = ", ".join(f"{n} ({i.documents} documents)" for n, i in indexes.items())
        click.echo(f"serving {names} on {url} (API docs: {url}/docs{'; API key required' if api_key else ''}"
                   f"{'' if access_log else '; no access log'})")

    try:
        run_server(indexes, host=host, port=port, api_key=api_key, limits=limits, ready=ready, access_log=access_log,
                   allowed_hosts=allowed_hosts)
    except OSError as e:  # the port is taken, the address is not ours
        raise click.ClickException(f"cannot bind {host}:{port}: {e.strerror or e}") from None


def _log_to_stderr() -> None:
    """The server's own lines (the access log, failures with their tracebacks) on stderr, timestamped."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    for name in ("relsearch.access", "relsearch.serve", "relsearch.api"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False
