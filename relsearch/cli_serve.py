"""``relsearch serve``: parse options, open the indexes, run the HTTP server (relsearch/serve.py).

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
@click.option("--model", default=None, help="Relation bundle to query with (default: each index's own bundle).")
@click.option("--api-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="File whose first line is the API key clients must send (default: $RELSEARCH_API_KEY; "
                   "neither: no key).")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=None, help="Request body limit (default 4 MiB).")
@click.option("--max-batch", type=click.IntRange(1, 4096), default=None, help="Queries per /search/batch (default 256).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.001), default=None,
              help="Seconds a search may wait and run (default 30).")
@click.option("--micro-batch", type=click.IntRange(min=1), default=None,
              help="Queries per encoder pass across concurrent requests (default 64).")
@click.option("--refill-wait-ms", type=click.FloatRange(min=0), default=None,
              help="Milliseconds a pass may wait for as many queries as the previous pass answered (default 5; "
                   "0: take what queued up).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch intra-op threads (default: torch's, one per core). On the 2-core test machine the "
                   "default served 32 clients faster than 1 thread did (README, Serving under load).")
def serve(index_specs, host, port, model, api_key_file, max_body_bytes, max_batch, timeout_s, micro_batch,
          refill_wait_ms, threads):
    """Serve indexes over HTTP (JSON; OpenAPI at /docs): search, relations, score, add/delete, health, metrics."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    from relsearch.api import Index
    from relsearch.files import check_regular_file
    from relsearch.serve import ServeLimits, read_api_key
    from relsearch.serve import serve as run_server

    given = {"max_body_bytes": max_body_bytes, "max_batch": max_batch, "timeout_s": timeout_s,
             "micro_batch": micro_batch, "refill_wait_ms": refill_wait_ms}
    limits = ServeLimits(**{k: v for k, v in given.items() if v is not None})
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
    for name, index in indexes.items():  # load the transformer now, not in the first request
        index.searcher().encoder  # noqa: B018

    def ready(url: str) -> None:
        names = ", ".join(f"{n} ({i.documents} documents)" for n, i in indexes.items())
        click.echo(f"serving {names} on {url} (API docs: {url}/docs{'; API key required' if api_key else ''})")

    try:
        run_server(indexes, host=host, port=port, api_key=api_key, limits=limits, ready=ready)
    except OSError as e:  # the port is taken, the address is not ours
        raise click.ClickException(f"cannot bind {host}:{port}: {e.strerror or e}") from None
