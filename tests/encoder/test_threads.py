"""encoder/threads.py: every forward pass of an Index runs on the process's one model thread, whatever
thread asks, and the bf16 probe leaves no thread behind — so PyTorch keeps one kernel thread pool
(a second one halved small-query speed on 2 cores)."""
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from relsearch.api import Index
from relsearch.encoder import model, precision, threads
from conftest import copy_published


def _forward_threads(monkeypatch) -> list[str]:
    seen = []
    real = model.Encoder.forward

    def recording(self, tensors, n):
        seen.append(threading.current_thread().name)
        return real(self, tensors, n)

    monkeypatch.setattr(model.Encoder, "forward", recording)
    return seen


def test_searches_scores_and_adds_from_many_threads_run_on_one_model_thread(small_index, tmp_path, monkeypatch):
    index = Index(copy_published(small_index, tmp_path))
    seen = _forward_threads(monkeypatch)
    with ThreadPoolExecutor(4) as callers:  # a threaded web application calling the API
        hits = list(callers.map(lambda i: index.search(f"software company {i}", k=3), range(8)))
        scores = callers.submit(index.score, "a bank", "a lender").result(timeout=120)
        added = callers.submit(index.add, [{"id": "new-1", "text": "a maker of drones"}]).result(timeout=120)
    index.search("bank")  # and from this thread
    assert all(len(h) == 3 for h in hits) and "identity" in scores and added.added == 1
    assert len(seen) >= 11 and set(seen) == {seen[0]} and seen[0].startswith("relsearch-model")


def test_an_add_while_searches_wait_does_not_deadlock(small_index, tmp_path):
    """Index's lock is never held while waiting for the model thread: an add and searches from
    other threads, all at once, finish."""
    index = Index(copy_published(small_index, tmp_path))
    with ThreadPoolExecutor(6) as callers:
        futures = [callers.submit(index.search, f"oil {i}", k=2) for i in range(10)]
        futures.insert(5, callers.submit(index.add, [{"id": f"n{i}", "text": f"a retailer {i}"} for i in range(5)]))
        for f in futures:
            f.result(timeout=120)


def test_the_bf16_probe_runs_in_a_thread_that_ends(monkeypatch):
    ran = []

    def probe(hidden, ffn):
        ran.append(threading.current_thread())
        return 2.0, 1.0

    choice = precision.bf16_choice(111, 222, flags={"amx_bf16"}, probe=probe)
    assert choice.use and ran[0] is not threading.current_thread() and ran[0].name.startswith("relsearch-probe")
    ran[0].join(timeout=5)
    assert not ran[0].is_alive()


def _in_child(queue):
    queue.put(threads.on_model_thread(lambda: threading.current_thread().name))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_a_forked_child_gets_its_own_model_thread():
    """A child forked after the parent started its model thread (Beam, Dask workers) has no such
    thread: it must start its own, not wait forever on the parent's."""
    threads.on_model_thread(lambda: None)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0 and queue.get(timeout=5).startswith("relsearch-model")
