"""Beam runner plumbing shared by the index and lookup jobs: options from pass-through arguments,
running a pipeline to the end, and a worker's heap set aside from the garbage collector once its
model is loaded (:func:`freeze_long_lived`).

Both jobs have the same runner-neutral shape, ``Create(chunks) → Reshuffle → ParDo(chunk → shard
files)``, because that is what every runner executes faithfully (the Reshuffle left out where there
is one in-process worker and nothing to spread: :func:`one_local_worker`). Beam 2.77's ``DaskRunner`` in
particular (apache_beam/runners/dask) computes only the last leaf of a graph, hands every tagged
output of a ParDo to every consumer, drops what a DoFn emits in ``finish_bundle`` (so
``BatchElements`` loses the tail of each bundle) and treats ``Reshuffle`` as a no-op, leaving the
partitioning to ``Create`` (128 elements per partition by default). A single-leaf graph of plain
ParDos avoids the first three; :func:`pipeline_options` sets one chunk per Dask partition for the
fourth, so the chunks spread over the cluster's workers.
"""
from __future__ import annotations

import gc
import logging
import shutil
import tempfile
import threading

# Runner names Beam does not resolve by itself (create_runner knows a fixed list) → their class path.
RUNNER_ALIASES = {"DaskRunner": "apache_beam.runners.dask.dask_runner.DaskRunner"}
DASK_PARTITION_OPTIONS = ("--dask_npartitions", "--dask_partition_size")


class RunnerUnavailable(ValueError):
    """The requested runner cannot run here (its packages are missing)."""


def _named(args: list[str], name: str) -> str | None:
    """The value of ``--name`` / ``--name=value`` in ``args`` (the last one wins, as in argparse)."""
    value = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def runner_name(beam_args: list[str]) -> str | None:
    return _named(list(beam_args), "--runner")


def is_dask(beam_args: list[str]) -> bool:
    return (runner_name(beam_args) or "") in ("DaskRunner", RUNNER_ALIASES["DaskRunner"])


def pipeline_options(beam_args: list[str]):
    """Beam options from pass-through args.

    - no ``--runner``: the in-process FnApiRunner (the DirectRunner would first try to download the
      Prism runner, which fails offline);
    - ``--runner DaskRunner``: Beam's DaskRunner by its class path; each chunk its own Dask
      partition unless ``--dask_npartitions`` / ``--dask_partition_size`` is given. Its own options
      (``--dask_client_address tcp://HOST:PORT``, ``--dask_scheduler_file``, ...) pass through.
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    args = list(beam_args)
    name = runner_name(args)
    if name is None:
        args.append("--runner=FnApiRunner")
    elif name in RUNNER_ALIASES:
        args.append(f"--runner={RUNNER_ALIASES[name]}")  # argparse: the last --runner wins
    if is_dask(args):
        try:
            import dask.distributed  # noqa: F401
        except ImportError:
            raise RunnerUnavailable("--runner DaskRunner needs dask.distributed: "
                                    "pip install 'relsearch[dask]' (or 'dask[distributed]')") from None
        logging.getLogger("apache_beam.runners.dask.transform_evaluator").setLevel(logging.ERROR)  # partition notice
        if not any(a.split("=", 1)[0] in DASK_PARTITION_OPTIONS for a in args):
            args.append("--dask_partition_size=1")
    return PipelineOptions(args)


def local_workers(options) -> int:
    """Local worker processes this run starts (``--direct_num_workers``), 1 for other runners."""
    return options.get_all_options().get("direct_num_workers") or 1


def one_local_worker(options) -> bool:
    """The default runner with one worker: the in-process FnApiRunner, where a ``Reshuffle`` has no
    workers to spread chunks over and only adds a stage (~0.07 s a job)."""
    from apache_beam.options.pipeline_options import StandardOptions

    return options.view_as(StandardOptions).runner == "FnApiRunner" and local_workers(options) == 1


def new_pipeline(options, scratch_parent):
    """A Beam pipeline whose scratch folder lies in ``scratch_parent`` (the job's build folder):
    Beam makes it in /tmp, where every killed run would leave one behind; there the next run of
    the job removes it."""
    import apache_beam as beam

    p = beam.Pipeline(options=options)
    shutil.rmtree(p.local_tempdir, ignore_errors=True)
    p.local_tempdir = tempfile.mkdtemp(prefix="beam-", dir=scratch_parent)
    return p


def run_to_end(p) -> None:
    """Run pipeline ``p`` and wait; raise the first worker error. A Dask client the runner opened
    is closed afterwards (Beam leaves it connected, and with no address it owns a local cluster)."""
    result = p.run()
    try:
        result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)
        if client is not None:
            client.close()


_frozen = threading.Lock()
_frozen_done = False


def freeze_long_lived() -> None:
    """Move every object alive now out of the cyclic garbage collector's reach (``gc.freeze``), once
    per process, after one last collection: by an index worker once its model is loaded, by a
    lookup job once its index is open.

    Why: with torch, transformers, FAISS and Beam loaded a process tracks ~465,000 objects, and
    each full collection walks them all: 0.2 s apiece on a 2-core Xeon. A job allocates per record
    (parsed lines, shard rows, docstore rows), which triggers such collections: 7 of them (0.8 s)
    in a 20,000-document ``relsearch index`` run. With the freeze that command took 19.1-19.5 s
    instead of 20.5-20.6 (interleaved runs, 2026-11-26). Reference counting still frees frozen
    objects; only cycles among them stay. Once only: a later freeze would also pin the cyclic
    garbage of the work done since."""
    global _frozen_done
    with _frozen:
        if not _frozen_done:
            gc.collect()
            gc.freeze()
            _frozen_done = True
