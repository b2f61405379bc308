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
def serve(index_specs, host, port, allowed_hosts, model, api_key_file, max_body_bytes, max_batch, max_hits,
          max_response_bytes, timeout_s, body_timeout_s, micro_batch, refill_wait_ms, threads, access_log):
    """Serve indexes over HTTP (JSON; OpenAPI at /docs): search, relations, score, add/delete, health, metrics."""
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
        indexes = {name: Index(path, model) for name, path in _named_indexes(index_specs).items()}
    except (OSError, ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    if not _loopback(host) and api_key is None:
        click.echo(f"warning: serving on {host} without an API key: anyone who can reach it can read and change "
                   "the indexes (set RELSEARCH_API_KEY or --api-key-file)", err=True)
    from relsearch.encoder.model import precision_line

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
