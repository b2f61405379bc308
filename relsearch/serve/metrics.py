"""The server's counters and histograms (``GET /metrics``), in the Prometheus text format (version 0.0.4)."""
from __future__ import annotations

import math
from collections import Counter, defaultdict

from ..api import Index

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """Counters and histograms, rendered in the Prometheus text format (version 0.0.4)."""

    def __init__(self):
        self.requests: Counter = Counter()  # (path, status) → count
        self.latency: dict[str, list[int]] = defaultdict(lambda: [0] * (len(LATENCY_BUCKETS) + 1))
        self.latency_sum: Counter = Counter()
        self.batches = [0] * (len(BATCH_BUCKETS) + 1)
        self.batch_queries = 0

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        self.requests[(path, status)] += 1
        self.latency[path][_bucket(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum[path] += seconds

    def observe_batch(self, size: int) -> None:
        self.batches[_bucket(BATCH_BUCKETS, size)] += 1
        self.batch_queries += size

    def render(self, indexes: dict[str, Index]) -> str:
        lines = ["# HELP relsearch_requests_total HTTP requests by path and status.",
                 "# TYPE relsearch_requests_total counter"]
        lines += [f'relsearch_requests_total{{path="{p}",status="{s}"}} {n}' for (p, s), n in sorted(self.requests.items())]
        lines += ["# HELP relsearch_request_seconds HTTP request latency.", "# TYPE relsearch_request_seconds histogram"]
        for path, counts in sorted(self.latency.items()):
            lines += _histogram("relsearch_request_seconds", f'path="{path}",', LATENCY_BUCKETS, counts,
                                self.latency_sum[path])
        lines += ["# HELP relsearch_batch_queries Queries answered per encoder pass (micro-batching).",
                  "# TYPE relsearch_batch_queries histogram"]
        lines += _histogram("relsearch_batch_queries", "", BATCH_BUCKETS, self.batches, self.batch_queries)
        lines += ["# HELP relsearch_index_documents Live documents of the generation served.",
                  "# TYPE relsearch_index_documents gauge"]
        lines += [f'relsearch_index_documents{{index="{n}",generation="{i.generation}"}} {i.documents}'
                  for n, i in indexes.items()]
        lines += ["# HELP relsearch_generations_opened_total Index generations opened since start.",
                  "# TYPE relsearch_generations_opened_total counter"]
        lines += [f'relsearch_generations_opened_total{{index="{n}"}} {i.generations_opened}' for n, i in indexes.items()]
        return "\n".join(lines) + "\n"


def _bucket(bounds: tuple, value: float) -> int:
    return next((i for i, b in enumerate(bounds) if value <= b), len(bounds))


def _histogram(name: str, labels: str, bounds: tuple, counts: list[int], total: float) -> list[str]:
    out, running = [], 0
    for bound, n in zip([*bounds, math.inf], counts):
        running += n
        out.append(f'{name}_bucket{{{labels}le="{"+Inf" if bound == math.inf else bound}"}} {running}')
    return out + [f"{name}_sum{{{labels.rstrip(',')}}} {total:.6f}", f"{name}_count{{{labels.rstrip(',')}}} {running}"]
