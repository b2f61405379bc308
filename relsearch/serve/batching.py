"""Micro-batching: concurrent search requests of one index answered by one ``Index.search_batch`` call.

Requests wait in an asyncio queue; one worker per index takes everything that queued up while the
previous pass ran (up to ``ServeLimits.micro_batch`` queries) and answers it with one
``Index.search_batch`` call on the process's one model thread (encoder/threads.py), so one encoder
pass serves many clients and the event loop keeps accepting requests. Each request has a cost in
hits (:func:`request_cost`), bounded per request and per pass; a request whose time ran out is not
searched further (its deadline is checked before the pass and between collapse rounds).
"""
from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable
from typing import NamedTuple

from ..api import Index, SearchRequest
from ..encoder.threads import model_executor
from ..retrieval.paging import SearchStopped, collapse_depth
from ..retrieval.rerank import DEFAULT_DEPTH as RERANK_DEFAULT_DEPTH
from .metrics import Metrics
from .models import ServeLimits


def request_cost(req: SearchRequest) -> int:
    """What one query may cost, in hits: the candidates it can fetch (``k + offset``; with
    ``rerank`` at least ``rerank_depth``; with ``collapse`` the widened depth of
    retrieval/paging.py ``collapse_depth``), doubled with ``explain``. Bounded per request and per
    micro-batch pass by ``ServeLimits.max_hits``."""
    candidates = req.k + req.offset
    # a named field; an index's recorded collapse field (collapse None) is not counted: the request does not say it
    if isinstance(req.collapse, str):
        candidates = collapse_depth(candidates)
    if req.rerank is not None:
        candidates = max(candidates, req.rerank_depth or RERANK_DEFAULT_DEPTH)
    return candidates * (2 if req.explain else 1)


class Pending(NamedTuple):
    """One HTTP request's queries waiting for a pass."""

    requests: list[SearchRequest]
    future: asyncio.Future | None
    deadline: float = math.inf  # time.monotonic() after which nobody waits for the answer
    cost: int = 0  # Σ request_cost


class Batcher:
    """Queues search requests for one index and answers them in batches on the model thread."""

    def __init__(self, index: Index, limits: ServeLimits, metrics: Metrics):
        self.index, self.limits, self.metrics = index, limits, metrics
        self.queue: asyncio.Queue = asyncio.Queue()
        self.held: Pending | None = None  # an item over the last pass's budget: it starts the next pass
        self.thread = model_executor()  # torch, FAISS, SQLite reads: one thread for every index (encoder/threads.py)

    async def search(self, requests: list[SearchRequest], deadline: float = math.inf):
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(Pending(requests, future, deadline, sum(map(request_cost, requests))))
        return await future

    async def call(self, fn: Callable, *args, deadline: float = math.inf):
        """Run ``fn`` on the model thread, after the batch in progress; not at
        all when ``deadline`` passed while it waited."""
        def when_wanted():
            if time.monotonic() > deadline:
                raise SearchStopped("the request's time ran out before it ran")
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self.thread, when_wanted)

    async def gather(self, expected: int) -> list[Pending]:
        """The queued items of the next pass: whatever queued up, and up to ``refill_wait_ms`` more
        waiting until ``expected`` queries are there; at most ``micro_batch`` queries and
        ``max_hits`` of cost (a first item above either still runs, alone)."""
        loop = asyncio.get_running_loop()
        items = [self.held if self.held is not None else await self.queue.get()]
        self.held = None
        if self.limits.batch_wait_ms > 0:
            await asyncio.sleep(self.limits.batch_wait_ms / 1000)
        size, cost = len(items[0].requests), items[0].cost
        deadline = loop.time() + self.limits.refill_wait_ms / 1000
        while size < self.limits.micro_batch:
            if not self.queue.empty():
                item = self.queue.get_nowait()
            elif size >= expected or loop.time() >= deadline:
                break
            else:
                try:
                    item = await asyncio.wait_for(self.queue.get(), deadline - loop.time())
                except asyncio.TimeoutError:
                    break
            if cost + item.cost > self.limits.max_hits:
                self.held = item
                break
            items.append(item)
            size += len(item.requests)
            cost += item.cost
        return items

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        expected = 1
        while True:
            items = await self.gather(expected)
            items = [item for item in items if item.future is None or not item.future.done()]
            if not items:
                continue
            flat = [r for item in items for r in item.requests]
            deadlines = [item.deadline for item in items for _ in item.requests]
            expected = len(flat)
            self.metrics.observe_batch(len(flat))
            try:
                answer = await loop.run_in_executor(
                    self.thread, functools.partial(self.index.search_batch, flat, deadlines=deadlines))
            except Exception as e:  # noqa: BLE001 - delivered to every waiting request (a 500 each)
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(e)
                continue
            start = 0
            for item in items:
                if not item.future.done():  # a request that timed out is no longer waiting
                    item.future.set_result((answer.generation, answer.results[start:start + len(item.requests)]))
                start += len(item.requests)
