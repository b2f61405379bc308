"""The indexes one app serves, as every router reads them: one :class:`Batcher` each (made when the
app starts), the limits, the metrics, the writer thread, and the lookup of a request's ``index``."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from starlette.exceptions import HTTPException

from ..api import Index, RequestError
from ..retrieval.paging import SearchStopped
from .batching import Batcher
from .metrics import Metrics
from .models import ServeLimits


class Served:
    """``indexes``: name → opened Index, the first the default. Mutations run on ``writer``, one at a time."""

    def __init__(self, indexes: dict[str, Index], limits: ServeLimits, metrics: Metrics):
        self.indexes, self.limits, self.metrics = indexes, limits, metrics
        self.batchers: dict[str, Batcher] = {}
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="relsearch-writer")  # one mutation at a time

    def start(self) -> list[Batcher]:
        """A Batcher per index, made in the running event loop (the app's lifespan runs each)."""
        for name, index in self.indexes.items():
            self.batchers[name] = Batcher(index, self.limits, self.metrics)
        return list(self.batchers.values())

    def pick(self, name: str | None) -> tuple[str, Batcher]:
        name = name or next(iter(self.indexes))
        if name not in self.batchers:
            raise RequestError("index", f"no index {name[:80]!r}; served: {', '.join(self.indexes)}", 404)
        return name, self.batchers[name]

    async def on_search_thread(self, index: str | None, fn: Callable, *args):
        """``fn(searcher, *args)`` on the model thread (the generation a search uses now)."""
        name, batcher = self.pick(index)
        deadline = time.monotonic() + self.limits.timeout_s
        try:
            answer = await asyncio.wait_for(batcher.call(lambda: fn(batcher.index.searcher(), *args), deadline=deadline),
                                            self.limits.timeout_s)
        except (asyncio.TimeoutError, SearchStopped):
            raise HTTPException(503, f"the request did not finish within {self.limits.timeout_s} s") from None
        return name, answer
