"""Micro-batching: concurrent search requests of one index answered by one ``Index.search_batch`` call.

Requests wait in an asyncio queue; one worker per index takes everything that queued up while the
previous pass ran (up to ``ServeLimits.micro_batch`` queries) and answers it with one
``Index.search_batch`` call on the process's one model thread (encoder/threads.py), so one encoder
pass serves many clients and the event loop keeps accepting requests. Each request has a cost in
hits (:func:`request_cost`), bounded per request and per pass. A request is answered a slice at a
time, each pass taking a slice of every waiting request in turn (:class:`Pending`), so one heavy
batch cannot hold the model thread while light searches wait; a request whose time ran out is not
searched further (its remaining slices are dropped, and its deadline is checked before the pass and
between collapse rounds).
"""
from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from ..api import MAX_K, Index, SearchRequest
from ..encoder.threads import model_executor
from ..retrieval.paging import SearchStopped, collapse_depth
from ..retrieval.rerank import DEFAULT_DEPTH as RERANK_DEFAULT_DEPTH
from .metrics import Metrics
from .models import ServeLimits


def request_cost(req: SearchRequest) -> int:
    """What one query may cost, in hits: the candidates it can fetch (``k + offset``; with
    ``rerank`` at least ``rerank_depth``; with ``collapse`` the widened depth of
    retrieval/paging.py ``collapse_depth``; with ``why_not`` the whole answer, up to MAX_K), doubled
    with ``explain`` (and ``why_not``, which explains every hit). Bounded per request and per
    micro-batch pass by ``ServeLimits.max_hits``."""
    candidates = req.k + req.offset
    # a named field; an index's recorded collapse field (collapse None) is not counted: the request does not say it
    if isinstance(req.collapse, str):
        candidates = collapse_depth(candidates)
    if req.rerank is not None:
        candidates = max(candidates, req.rerank_depth or RERANK_DEFAULT_DEPTH)
    if req.why_not is not None:
        candidates = max(candidates, MAX_K)
    return candidates * (2 if req.explain or req.why_not is not None else 1)


FIRST_SLICE = 1  # queries of a new request in its first pass: doubled while its passes stay short
SLICE_SECONDS = 0.25  # a pass longer than this shrinks the slices of the requests in it


@dataclass(eq=False)
class Pending:
    """One HTTP request's queries, answered a slice at a time: each pass takes a slice of every
    waiting request in turn (fair share), so a heavy batch interleaves with others' light searches
    instead of holding the model thread for its whole length."""

    requests: list[SearchRequest]
    future: asyncio.Future | None
    deadline: float = math.inf  # time.monotonic() after which nobody waits for the answer
    cost: int = 0  # Σ request_cost
    sent: int = 0  # queries handed to passes so far
    results: list = field(default_factory=list)
    generation: str | None = None  # the generation its answered slices came from
    size: int = FIRST_SLICE  # queries per slice, adapted to how long its passes take

    @property
    def wanted(self) -> bool:
        """False once nobody waits for the answer (the request timed out or its client left)."""
        return (self.future is None or not self.future.done()) and time.monotonic() <= self.deadline


class Slice(NamedTuple):
    """Queries ``start:stop`` of a pending request, answered in one pass."""

    pending: Pending
    start: int
    stop: int

    @property
    def requests(self) -> list[SearchRequest]:
        return self.pending.requests[self.start:self.stop]

    @property
    def cost(self) -> int:
        return sum(map(request_cost, self.requests))


class Batcher:
    """Queues search requests for one index and answers them in passes on the model thread: each
    pass a slice of every waiting request in turn, within ``micro_batch`` queries and ``max_hits``."""

    def __init__(self, index: Index, limits: ServeLimits, metrics: Metrics):
        self.index, self.limits, self.metrics = index, limits, metrics
        self.waiting: deque[Pending] = deque()  # the requests with queries left, served in turn
        self.arrived = asyncio.Event()
        self.thread = model_executor()  # torch, FAISS, SQLite reads: one thread for every index (encoder/threads.py)

    def put(self, pending: Pending) -> None:
        self.waiting.append(pending)
        self.arrived.set()

    async def search(self, requests: list[SearchRequest], deadline: float = math.inf):
        future = asyncio.get_running_loop().create_future()
        self.put(Pending(requests, future, deadline, sum(map(request_cost, requests))))
        return await future

    async def call(self, fn: Callable, *args, deadline: float = math.inf):
        """Run ``fn`` on the model thread, after the batch in progress; not at
        all when ``deadline`` passed while it waited."""
        def when_wanted():
            if time.monotonic() > deadline:
                raise SearchStopped("the request's time ran out before it ran")
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self.thread, when_wanted)

    def _queued(self) -> int:
        return sum(len(p.requests) - p.sent for p in self.waiting)

    async def gather(self, expected: int) -> list[Slice]:
        """The slices of the next pass: whatever waits, and up to ``refill_wait_ms`` more waiting
        until ``expected`` queries are there; a slice of each waiting request in turn, at most
        ``micro_batch`` queries and ``max_hits`` of cost (a first slice above either still runs).
        Requests nobody waits for any more are dropped, their remaining queries never run."""
        loop = asyncio.get_running_loop()
        while True:
            for pending in [p for p in self.waiting if not p.wanted]:
                self.waiting.remove(pending)
                if pending.future is not None and not pending.future.done():
                    pending.future.set_exception(SearchStopped("the request's time ran out"))
            if self.waiting:
                break
            self.arrived.clear()
            await self.arrived.wait()
        if self.limits.batch_wait_ms > 0:
            await asyncio.sleep(self.limits.batch_wait_ms / 1000)
        deadline = loop.time() + self.limits.refill_wait_ms / 1000
        while self._queued() < min(expected, self.limits.micro_batch) and loop.time() < deadline:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
        return self._slices()

    def _slices(self) -> list[Slice]:
        slices, size, cost = [], 0, 0
        for pending in list(self.waiting):
            stop = min(len(pending.requests), pending.sent + pending.size, pending.sent + self.limits.micro_batch - size)
            while stop > pending.sent and slices and cost + Slice(pending, pending.sent, stop).cost > self.limits.max_hits:
                stop -= 1
            if stop == pending.sent:
                continue  # over the pass's budget: it is first in line for the next pass
            piece = Slice(pending, pending.sent, stop)
            slices.append(piece)
            size, cost, pending.sent = size + len(piece.requests), cost + piece.cost, stop
            self.waiting.remove(pending)
            if pending.sent < len(pending.requests):
                self.waiting.append(pending)  # the rest after every other request's turn
            if size >= self.limits.micro_batch:
                break
        return slices

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        expected = 1
        while True:
            slices = await self.gather(expected)
            flat = [r for piece in slices for r in piece.requests]
            deadlines = [piece.pending.deadline for piece in slices for _ in piece.requests]
            expected = len(flat)
            self.metrics.observe_batch(len(flat))
            started = time.monotonic()
            try:
                answer = await loop.run_in_executor(
                    self.thread, functools.partial(self.index.search_batch, flat, deadlines=deadlines))
            except Exception as e:  # noqa: BLE001 - delivered to every waiting request (a 500 each)
                for piece in slices:
                    self._fail(piece.pending, e)
                continue
            self._deliver(slices, answer, time.monotonic() - started)

    def _fail(self, pending: Pending, error: Exception) -> None:
        if pending in self.waiting:
            self.waiting.remove(pending)
        if pending.future is not None and not pending.future.done():
            pending.future.set_exception(error)

    def _deliver(self, slices: list[Slice], answer, took: float) -> None:
        """Each slice's results to its request; a request whose slices are all answered gets them.
        A request whose slices came from two generations (a write published between them) starts
        again, so every answer comes from one generation. Slices shrink while passes run long."""
        start = 0
        for piece in slices:
            pending, results = piece.pending, answer.results[start:start + len(piece.requests)]
            start += len(piece.requests)
            if pending.generation not in (None, answer.generation):
                pending.sent, pending.results, pending.generation = 0, [], None
                if pending not in self.waiting:
                    self.waiting.append(pending)
                continue
            pending.generation = answer.generation
            pending.results.extend(results)
            scale = SLICE_SECONDS / max(took, 1e-6)
            pending.size = max(1, min(self.limits.micro_batch, int(len(piece.requests) * min(scale, 2.0))))
            if len(pending.results) == len(pending.requests) and pending.wanted and pending.future is not None:
                pending.future.set_result((pending.generation, pending.results))
