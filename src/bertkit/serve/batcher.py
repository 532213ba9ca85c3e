"""Dynamic batching, fair between clients: one worker thread per endpoint runs the model on batches of request parts.

A request arrives as one or more `Part`s (an embedding request with many long texts is cut into parts of at most
`quantum` padded tokens), queued per client (the client's address). The worker fills a batch round-robin over the
clients, taking from each at most `quantum` tokens per turn and one turn per batch while others wait (a client alone
takes as many as fit), until the batch holds `max_batch` texts or its padded size (texts x longest text) would pass
`max_batch_tokens` (twice that while all queued work is within it: only padding grows); a client whose part did not
fit keeps its place at the head of the round for the next batch (clients served go to its back), and a submit or a
fill costs the same however many clients wait. So a client sending the largest requests gets its share of the forwards
while everyone else's short requests wait for one short batch, not for its whole request. The first part of a batch
waits up to `max_wait_ms` for company when other requests were in flight as it came, or while the clients the last
forward answered are still coming back with their next requests (under load the batch fills first, so the wait costs
nothing); a request that comes alone, or after those clients have been quiet for a while, does not wait.
`max_batch=1` turns batching off.

Admission is bounded: a client holding `max_client_tokens` of queued work gets 429, a queue holding `max_queue_tokens`
answers 503, both with a Retry-After computed from the measured tokens per second: refused at once rather than
answered late. A request carries a deadline: one whose client has given up (504, hang-up) is dropped unrun.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from bertkit.serve.limits import RequestError

__all__ = ["Batcher", "Budget", "Part", "chunks"]


class Part(NamedTuple):
    """A piece of a request the batch function runs on its own: `texts` texts, the longest `tokens` long (0: the
    route does not count tokens, so only max_batch bounds its batch)."""
    item: Any
    texts: int = 1
    tokens: int = 0

    @property
    def cost(self) -> int:
        """Padded tokens it adds to a forward (its texts where tokens are not counted)."""
        return self.texts * self.tokens or self.texts


@dataclass
class Budget:
    """What one forward, one client and the whole queue may hold, in padded tokens (0: no bound)."""
    max_batch_tokens: int = 0
    max_client_tokens: int = 0
    max_queue_tokens: int = 0

    @property
    def quantum(self) -> int:
        """Tokens a client gets per turn (and the size of a request's parts): an eighth of a batch, so that the
        forward a short request may wait behind is a short one."""
        return max(1, self.max_batch_tokens // 8) if self.max_batch_tokens else 0


def chunks(tokens: list[int], quantum: int) -> list[tuple[int, int, int]]:
    """(start, stop, longest) runs of consecutive texts whose padded size stays within quantum (one text at least)."""
    out, start, longest = [], 0, 0
    for i, n in enumerate(tokens):
        if i > start and quantum and (i + 1 - start) * max(longest, n) > quantum:
            out.append((start, i, longest))
            start, longest = i, 0
        longest = max(longest, n)
    return out + [(start, len(tokens), longest)] if tokens else out


@dataclass(eq=False)
class _Job:
    future: Future
    client: str
    deadline: float      # time.monotonic() after which nobody waits for the answer
    busy: bool           # other requests were in flight when it came: company is likely, worth waiting for
    results: list = field(default_factory=list)
    left: int = 0

    def gone(self) -> bool:
        if self.deadline < time.monotonic():
            self.future.cancel()
        return self.future.done()

    def settle(self, index: int, result: Any) -> None:
        try:
            if isinstance(result, BaseException):
                self.future.set_exception(result)
                return
            self.results[index] = result
            self.left -= 1
            if self.left == 0:
                self.future.set_result(self.results)
        except InvalidStateError:        # cancelled (504, hang-up) or failed by an earlier part meanwhile
            pass


class _Queued(NamedTuple):
    job: _Job
    index: int
    part: Part


class _Batch:
    def __init__(self, max_batch: int, max_tokens: int):
        self.parts: list[_Queued] = []
        self.max_batch, self.max_tokens = max_batch, max_tokens
        self.texts = self.longest = 0

    def fits(self, part: Part) -> bool:
        texts = self.texts + part.texts
        padded = texts * max(self.longest, part.tokens)
        return not self.parts or (texts <= self.max_batch and (not self.max_tokens or padded <= self.max_tokens))

    def add(self, queued: _Queued) -> None:
        self.parts.append(queued)
        self.texts += queued.part.texts
        self.longest = max(self.longest, queued.part.tokens)

    @property
    def full(self) -> bool:
        return self.texts >= self.max_batch


class Batcher:
    """Collects concurrent requests into batches for `run` (see the module docstring).

    run(list of items) -> list of results, same order and length; an entry that is an exception fails only its own
    request. submit(parts) -> a Future of the parts' results, in order. `on_batch(texts)` is called after each
    forward (metrics)."""

    def __init__(self, run: Callable[[list], list], max_batch: int = 32, max_wait_ms: float = 5.0,
                 name: str = "batcher", on_batch: Callable[[int], None] | None = None, budget: Budget | None = None):
        self.run = run
        self.max_batch = max(1, int(max_batch))
        self.max_wait = max(0.0, max_wait_ms) / 1000.0
        self.on_batch = on_batch
        self.budget = budget or Budget()
        self._queues: dict[str, deque[_Queued]] = {}    # client -> its waiting parts (none: no entry)
        self._round: OrderedDict[str, None] = OrderedDict()   # clients with parts waiting, in turn order
        self._turned: dict[str, None] = {}              # clients served in the batch being filled, in order
        self._held: dict[str, int] = {}                 # client -> tokens queued or running
        self._held_total = 0                            # their sum
        self._seen: OrderedDict[str, float] = OrderedDict()   # client -> when it last sent a request, oldest first
        self._forward_s = 0.0                           # how long the last forward took
        self._cond = threading.Condition()
        self._in_flight = 0
        self._coming = 0        # requests the last forward answered whose clients have not sent another since
        self._answered_at = 0.0  # when that forward ended: after `_recent()` nobody is counted as coming back
        self._rate = 0.0        # tokens per second of recent forwards, for Retry-After
        self.batches = 0        # counters, for /health, /metrics and the tests
        self.items = 0
        self.expired = 0        # dropped unrun: their deadline passed or their client cancelled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, parts: list[Part], client: str = "", timeout: float | None = None) -> Future:
        fut: Future = Future()
        cost = sum(p.cost for p in parts)
        deadline = time.monotonic() + timeout if timeout is not None else math.inf
        with self._cond:
            self._admit(client, cost)
            self._coming = max(0, self._coming - 1)         # one of them is back (or a newcomer: as good)
            job = _Job(fut, client, deadline, self._in_flight > 0, [None] * len(parts), len(parts))
            self._in_flight += 1
            self._seen[client] = time.monotonic()
            self._seen.move_to_end(client)
            self._held[client] = self._held.get(client, 0) + cost
            self._held_total += cost
            self._queues.setdefault(client, deque()).extend(_Queued(job, i, p) for i, p in enumerate(parts))
            if client not in self._round and client not in self._turned:    # served this batch: back in after it
                self._round[client] = None
            self._cond.notify()
        fut.add_done_callback(self._finished)
        return fut

    def _admit(self, client: str, cost: int) -> None:
        """Refuse now (429 / 503 with Retry-After) what could only be answered late; a client with nothing queued
        always gets one request in, however large."""
        b, held, queued = self.budget, self._held.get(client, 0), self._held_total
        if b.max_client_tokens and held and held + cost > b.max_client_tokens:
            raise RequestError(429, f"this client already has {held} tokens queued; the limit is "
                                    f"{b.max_client_tokens}", retry_after=self._retry_after(held))
        if b.max_queue_tokens and queued and queued + cost > b.max_queue_tokens:
            raise RequestError(503, f"the server has {queued} tokens queued; the limit is {b.max_queue_tokens}",
                               retry_after=self._retry_after(queued))

    def _retry_after(self, tokens: int) -> int:
        return min(60, max(1, math.ceil(tokens / self._rate))) if self._rate > 0 else 1

    def _finished(self, _fut: Future) -> None:
        with self._cond:
            self._in_flight -= 1

    def _release(self, queued: _Queued) -> None:
        client = queued.job.client
        self._held[client] -= queued.part.cost
        self._held_total -= queued.part.cost
        if self._held[client] <= 0:
            del self._held[client]

    @property
    def depth(self) -> int:
        """Request parts waiting for a batch."""
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    # ----------------------------------------------------------------------------------------------- the worker

    def _fill(self, batch: _Batch) -> None:
        """One turn each to the clients in round order; a client whose part does not fit keeps its place at the head
        of the round. Only the round's first 2 x max_batch clients are looked at (at most max_batch take a turn), so a
        fill costs the same however many clients wait. Then more turns to those served while no other client is
        about (a heavy one fills a batch only when it has the server to itself)."""
        batch.max_tokens = self._batch_tokens()
        for client in list(itertools.islice(self._round, 2 * self.max_batch)):
            if batch.full:
                break
            took = self._turn(client, batch)
            if took or client not in self._queues:      # served, or all its parts expired: out of this round
                del self._round[client]
            if took:
                self._turned[client] = None
        progress = True
        while progress and not batch.full:
            progress = False
            for client in [c for c in self._turned if c in self._queues and not self._others_about(c)]:
                progress = self._turn(client, batch) or progress

    def _batch_tokens(self) -> int:
        """The padded size a forward may reach: max_batch_tokens, or twice it while all the queued work is within
        it. Then the batch's real tokens stay within the budget (only its padding grows, which an unpadded forward
        does not compute), and a batch cut at the budget would only leave the rest of the queue a forward of its own."""
        b = self.budget.max_batch_tokens
        return 2 * b if b and self._held_total <= b else b

    def _recent(self) -> float:
        """Seconds within which a client is taken to be between two requests of its own."""
        return max(1.0, 3 * self._forward_s)

    def _others_about(self, client: str) -> bool:
        """Another client sent a request lately: a client between two requests of its own is not queued, and a batch
        filled in that moment would be the long forward its next request waits behind."""
        since = time.monotonic() - self._recent()
        while self._seen and next(iter(self._seen.values())) < since:
            self._seen.popitem(last=False)
        return len(self._seen) > (client in self._seen)

    def _turn(self, client: str, batch: _Batch) -> bool:
        """Up to a quantum of the client's parts into the batch; True if it took any."""
        queue, spent, quantum = self._queues[client], 0, self.budget.quantum
        while queue:
            head = queue[0]
            if head.job.gone():                     # nobody waits for it: never computed
                self._release(queue.popleft())
                self.expired += head.index == 0
                continue
            if spent and not (quantum and spent + head.part.cost <= quantum) or not batch.fits(head.part):
                break
            batch.add(queue.popleft())
            spent += head.part.cost
        if not queue:
            del self._queues[client]
        return spent > 0

    def _end_turns(self) -> None:
        """The clients served in this batch go to the back of the round, in the order they were served."""
        for client in self._turned:
            if client in self._queues:
                self._round[client] = None
        self._turned.clear()

    def _take_batch(self) -> list[_Queued]:
        with self._cond:
            if not self._round:
                self._cond.wait(0.1)
            batch = _Batch(self.max_batch, self._batch_tokens())     # _fill renews the size as the queue moves
            if not self._round:
                return []
            first = self._queues[next(iter(self._round))][0]
            # nothing else in flight and nobody else answered lately (sparse traffic, one client at a time): waiting
            # for company would only add latency, so take what is already queued and go. Clients answered together
            # come back together, a request apart each: wait for them, or their requests make a small batch of
            # their own
            if self._coming and time.monotonic() - self._answered_at > self._recent():
                self._coming = 0                     # those clients left: a later request comes alone
            until = time.monotonic() + (self.max_wait if first.job.busy or self._coming else 0.0)
            self._fill(batch)
            while not batch.full and time.monotonic() < until and (first.job.busy or self._coming):
                self._cond.wait(until - time.monotonic())
                self._fill(batch)
            self._end_turns()
            return batch.parts

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._take_batch()
            if not batch:
                continue
            t0 = time.perf_counter()
            try:
                results = self.run([q.part.item for q in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} requests")
            except Exception as e:  # noqa: BLE001 - handed to every waiting request
                results = [e] * len(batch)
            else:
                self._count(batch, time.perf_counter() - t0)
            with self._cond:      # before the answers go out: a client answered may be back before this line
                for queued in batch:
                    self._release(queued)
                # a job whose client gave up (504, hang-up) or that failed brings nobody back
                failed = {q.job for q, r in zip(batch, results) if isinstance(r, BaseException)}
                self._coming = sum(n == job.left and job not in failed and not job.future.done()
                                   for job, n in Counter(q.job for q in batch).items())
                self._answered_at = time.monotonic()
            for queued, res in zip(batch, results):
                queued.job.settle(queued.index, res)

    def _count(self, batch: list[_Queued], seconds: float) -> None:
        self.batches += 1
        self.items += len(batch)
        tokens = sum(q.part.cost for q in batch)
        self._forward_s = seconds
        if seconds > 0:
            self._rate = 0.8 * self._rate + 0.2 * tokens / seconds if self._rate else tokens / seconds
        if self.on_batch is not None:
            self.on_batch(sum(q.part.texts for q in batch))
