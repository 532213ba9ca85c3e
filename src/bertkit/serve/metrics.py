"""Prometheus metrics for `GET /metrics`: requests by route / method / status, request latency, batch sizes and
queue depths, written in the text exposition format (version 0.0.4), so serving needs no extra package for metrics.
"""

from __future__ import annotations

import bisect
import threading
from typing import Callable

__all__ = ["Metrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

_HELP = {
    "bertkit_requests_total": "HTTP requests by route, method and status",
    "bertkit_request_duration_seconds": "time from request to response, by route",
    "bertkit_batch_size": "texts per model forward, by endpoint",
    "bertkit_queue_depth": "requests waiting for a batch, by endpoint",
}


class _Histogram:
    def __init__(self, buckets: tuple):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)     # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value


class Metrics:
    """Thread-safe recording (the event loop records requests, batcher threads record batches). depths() ->
    {endpoint: queued requests}, read at scrape time."""

    def __init__(self, depths: Callable[[], dict[str, int]]):
        self.depths = depths
        self._lock = threading.Lock()
        self.requests: dict[tuple, int] = {}
        self.latency: dict[tuple, _Histogram] = {}
        self.batches: dict[tuple, _Histogram] = {}

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            key = (route, method, str(status))
            self.requests[key] = self.requests.get(key, 0) + 1
            self.latency.setdefault((route,), _Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, endpoint: str, size: int) -> None:
        with self._lock:
            self.batches.setdefault((endpoint,), _Histogram(BATCH_BUCKETS)).observe(size)

    def render(self) -> bytes:
        with self._lock:
            lines = _family("bertkit_requests_total", "counter")
            lines += [f"bertkit_requests_total{_labels(('route', 'method', 'status'), k)} {v}"
                      for k, v in sorted(self.requests.items())]
            lines += _histogram("bertkit_request_duration_seconds", ("route",), self.latency)
            lines += _histogram("bertkit_batch_size", ("endpoint",), self.batches)
        lines += _family("bertkit_queue_depth", "gauge")
        lines += [f"bertkit_queue_depth{_labels(('endpoint',), (k,))} {v}" for k, v in sorted(self.depths().items())]
        return ("\n".join(lines) + "\n").encode("utf-8")


def _labels(names: tuple, values: tuple, extra: str = "") -> str:
    def esc(v: str) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    parts = [f'{n}="{esc(v)}"' for n, v in zip(names, values)] + ([extra] if extra else [])
    return "{" + ",".join(parts) + "}"


def _family(name: str, kind: str) -> list[str]:
    return [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} {kind}"]


def _histogram(name: str, label_names: tuple, series: dict[tuple, _Histogram]) -> list[str]:
    lines = _family(name, "histogram")
    for key, h in sorted(series.items()):
        total = 0
        for le, n in zip([*h.buckets, "+Inf"], h.counts):
            total += n
            le_label = f'le="{le if le == "+Inf" else repr(float(le))}"'
            lines.append(f"{name}_bucket{_labels(label_names, key, le_label)} {total}")
        lines.append(f"{name}_sum{_labels(label_names, key)} {float(h.sum)!r}")
        lines.append(f"{name}_count{_labels(label_names, key)} {total}")
    return lines
