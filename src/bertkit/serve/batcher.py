"""Dynamic batching: requests queue per endpoint, one worker thread per endpoint runs the model on batches of them.

The worker takes the first queued request, then keeps taking requests until the batch holds `max_batch` texts or
`max_wait_ms` have passed since the first one arrived, runs the model once on the padded batch and hands each request
its own result. Under load the batch fills before the wait runs out, so the wait costs nothing; a request that comes
while no other is in flight (sparse traffic, or one client at a time) does not wait at all. `max_batch=1` turns
batching off. A request carries a deadline: one whose client has given up (504) is dropped before the model runs, never
computed for nobody.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Batcher"]


@dataclass
class _Job:
    item: Any
    future: Future
    weight: int          # texts in the request: a batch holds at most max_batch texts
    busy: bool           # other requests were in flight when it came: company is likely, worth waiting for
    deadline: float      # time.monotonic() after which nobody waits for the answer


class Batcher:
    """Collects concurrent requests into batches for `run` (see the module docstring).

    run(list of items) -> list of results, same order and length; an entry that is an exception fails only its own
    request. `on_batch(size)` is called after each forward (metrics)."""

    def __init__(self, run: Callable[[list], list], max_batch: int = 32, max_wait_ms: float = 5.0,
                 name: str = "batcher", on_batch: Callable[[int], None] | None = None):
        self.run = run
        self.max_batch = max(1, int(max_batch))
        self.max_wait = max(0.0, max_wait_ms) / 1000.0
        self.on_batch = on_batch
        self.queue: queue.Queue[_Job] = queue.Queue()
        self._carry: _Job | None = None     # taken from the queue but did not fit the batch before
        self._in_flight = 0
        self._lock = threading.Lock()
        self.batches = 0        # counters, for /health, /metrics and the tests
        self.items = 0
        self.expired = 0        # dropped unrun: their deadline passed or their client cancelled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: Any, weight: int = 1, timeout: float | None = None) -> Future:
        fut: Future = Future()
        with self._lock:
            busy = self._in_flight > 0
            self._in_flight += 1
        fut.add_done_callback(self._finished)
        deadline = time.monotonic() + timeout if timeout is not None else math.inf
        self.queue.put(_Job(item, fut, max(1, int(weight)), busy, deadline))
        return fut

    def _finished(self, _fut: Future) -> None:
        with self._lock:
            self._in_flight -= 1

    @property
    def depth(self) -> int:
        """Requests waiting for a batch."""
        return self.queue.qsize() + (self._carry is not None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _next(self, timeout: float | None) -> _Job:
        if self._carry is not None:
            job, self._carry = self._carry, None
            return job
        return self.queue.get(timeout=timeout) if timeout is None or timeout > 0 else self.queue.get_nowait()

    def _take_batch(self) -> list[_Job]:
        try:
            first = self._next(0.1)
        except queue.Empty:
            return []
        batch, weight = [first], first.weight
        # nothing else was in flight when it came (sparse traffic, one client at a time): waiting for company would
        # only add latency, so take what is already queued and go
        deadline = time.monotonic() + (self.max_wait if first.busy else 0.0)
        while weight < self.max_batch:
            try:
                job = self._next(deadline - time.monotonic())
            except queue.Empty:
                break
            if weight + job.weight > self.max_batch:
                self._carry = job
                break
            batch.append(job)
            weight += job.weight
        return batch

    def _live(self, batch: list[_Job]) -> list[_Job]:
        """The jobs still wanted: an expired or cancelled one is dropped here, before the model runs."""
        now, live = time.monotonic(), []
        for job in batch:
            if job.deadline < now:
                job.future.cancel()
            if job.future.set_running_or_notify_cancel():
                live.append(job)
            else:
                self.expired += 1
        return live

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._live(self._take_batch())
            if not batch:
                continue
            try:
                results = self.run([job.item for job in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} requests")
            except Exception as e:  # noqa: BLE001 - handed to every waiting request
                results = [e] * len(batch)
            else:
                self.batches += 1
                self.items += len(batch)
                if self.on_batch is not None:
                    self.on_batch(sum(job.weight for job in batch))
            for job, res in zip(batch, results):
                if isinstance(res, BaseException):
                    job.future.set_exception(res)
                else:
                    job.future.set_result(res)
