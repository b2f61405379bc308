"""One thread per process for the model's forward passes; short probes in a thread of their own.

PyTorch's CPU kernels run on libgomp (OpenMP) thread pools: one pool per thread that has run a
kernel, kept until that thread ends. Once the pooled threads outnumber the CPUs, libgomp stops
spinning between parallel regions and sleeps instead, so every small kernel pays a wake-up. On 2
cores a one-query encode took 10.3–11.4 ms once a second thread had run kernels, against 5.0 ms
when one thread ran them all (Xeon with AMX, bf16; fp32 7 ms against 13–14). A server whose
search thread was not the thread that probed the CPU, or an application calling ``Index.search``
from many threads, paid that on every query.

So :class:`~relsearch.api.Index` runs its searches, scores and document encodings on
:func:`model_executor`'s one thread (it serialised them under its lock already), the server's
batchers submit to that same thread, and the bf16 probe runs :func:`in_passing`.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

_local = threading.local()
_executor: tuple[int, ThreadPoolExecutor] | None = None  # (pid, executor): a forked child makes its own
_lock = threading.Lock()


def _mark() -> None:
    _local.model_thread = True


def model_executor() -> ThreadPoolExecutor:
    """This process's model thread, as a one-thread executor (for ``loop.run_in_executor``)."""
    global _executor
    with _lock:
        if _executor is None or _executor[0] != os.getpid():
            _executor = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="relsearch-model", initializer=_mark))
        return _executor[1]


def on_model_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run on the model thread and waited for; called there, run directly."""
    if getattr(_local, "model_thread", False):
        return fn(*args, **kwargs)
    return model_executor().submit(fn, *args, **kwargs).result()


def in_passing(fn, *args):
    """``fn(*args)`` in a thread that ends when it returns, taking the kernel pool it made with it."""
    with ThreadPoolExecutor(1, thread_name_prefix="relsearch-probe") as one:
        return one.submit(fn, *args).result()
