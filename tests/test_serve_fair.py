"""Serving stays fair: the batcher budgets forwards by padded tokens and takes clients in turn (a heavy request is
split and waits its turn), admission is bounded (429 / 503 with Retry-After), connections are capped per address,
idle ones dropped, a huge declared chunk is answered 413 at once, and --api-key requires a Bearer token."""

from __future__ import annotations

import json
import socket
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from bertkit.serve import Batcher, RequestError, ServeConfig  # noqa: E402
from bertkit.serve.batcher import Budget, Part, chunks  # noqa: E402
from test_serve import _echo_endpoints, _raw_exchange, _request, server  # noqa: E402,F401


def _one(b: Batcher, item, weight: int = 1, **kw):
    return b.submit([Part(item, weight)], **kw)


def test_batcher_groups_concurrent_requests():
    sizes = []
    b = Batcher(lambda items: (sizes.append(len(items)), [x["v"] * 2 for x in items])[1], max_batch=8, max_wait_ms=50)
    futs = [_one(b, {"v": i}) for i in range(20)]
    assert [f.result(timeout=5) for f in futs] == [[2 * i] for i in range(20)]
    assert sum(sizes) == 20 and max(sizes) == 8 and len(sizes) <= 4
    b.close()
    one = Batcher(lambda items: [len(items)] * len(items), max_batch=1)
    assert {_one(one, {}).result(timeout=5)[0] for _ in range(5)} == {1}
    one.close()


def test_batcher_counts_texts_not_requests():
    sizes = []
    b = Batcher(lambda items: (sizes.append(sum(items)), items)[1], max_batch=8, max_wait_ms=100)
    futs = [_one(b, w, weight=w) for w in (5, 5, 3, 20, 1)]
    assert [f.result(timeout=5)[0] for f in futs] == [5, 5, 3, 20, 1]
    assert max(sizes) == 20 and all(s <= 8 for s in sizes if s != 20), sizes    # an oversized request goes alone
    b.close()


def test_batcher_lone_request_does_not_wait():
    """Sparse traffic, or one client at a time: a request that comes while no other is in flight runs at once, not
    after max_wait_ms, even right after the one before it."""
    b = Batcher(lambda items: [len(items)] * len(items), max_batch=8, max_wait_ms=400)
    for pause in (0.0, 0.0, 0.45):
        t0 = time.monotonic()
        assert _one(b, {}).result(timeout=5) == [1]
        assert time.monotonic() - t0 < 0.2
        time.sleep(pause)
    # a burst still batches: the first goes alone at once, the rest wait for each other
    futs = [_one(b, {}) for _ in range(6)]
    assert sum(f.result(timeout=5)[0] > 1 for f in futs) >= 4
    b.close()


def test_batcher_isolates_per_item_errors_and_drops_expired():
    b = Batcher(lambda items: [ValueError("bad") if x["v"] < 0 else x["v"] for x in items], max_batch=4, max_wait_ms=20)
    good, bad = _one(b, {"v": 1}), _one(b, {"v": -1})
    assert good.result(timeout=5) == [1]
    with pytest.raises(ValueError, match="bad"):
        bad.result(timeout=5)
    b.close()
    ran = []
    slow = Batcher(lambda items: (ran.extend(items), time.sleep(0.3), items)[2], max_batch=1)
    first, late = _one(slow, "first", timeout=5), _one(slow, "late", timeout=0.1)
    assert first.result(timeout=5) == ["first"]
    time.sleep(0.2)
    assert ran == ["first"] and late.cancelled() and slow.expired == 1
    slow.close()


def test_chunks_keep_each_run_within_the_quantum():
    assert chunks([10, 10, 10, 10], 20) == [(0, 2, 10), (2, 4, 10)]
    assert chunks([5, 30, 5], 20) == [(0, 1, 5), (1, 2, 30), (2, 3, 5)]      # a text over the quantum goes alone
    assert chunks([3, 3, 3], 0) == [(0, 3, 3)] and chunks([], 8) == []


def test_a_heavy_client_is_split_and_takes_turns():
    """Client "heavy" queues 8 parts of 2 x 16 tokens (the quantum of a 128-token budget is 16: a part each turn)
    before a light client sends one short text: the light one rides in the next forward, not after the heavy
    request's eight."""
    batches = []

    def run(items):
        batches.append(list(items))
        time.sleep(0.05)
        return items
    b = Batcher(run, max_batch=32, max_wait_ms=0, budget=Budget(max_batch_tokens=128))
    heavy = b.submit([Part(f"h{i}", 2, 16) for i in range(8)], client="heavy")
    time.sleep(0.01)
    light = b.submit([Part("light", 1, 8)], client="light")
    assert light.result(timeout=5) == ["light"]
    assert heavy.result(timeout=5) == [f"h{i}" for i in range(8)]         # the parts come back in order
    at = next(i for i, batch in enumerate(batches) if "light" in batch)
    assert at <= 1 and len(batches[0]) > 1, batches          # alone, the heavy client filled the first forward
    # padded size (texts x longest) never passes the budget
    assert all(len(batch) * 2 * 16 <= 128 for batch in batches if "light" not in batch), batches
    b.close()


def _gated(max_batch: int = 8, max_wait_ms: float = 0, budget: Budget | None = None):
    """A batcher whose forwards are recorded and held until the gate opens, and its first forward, "x", running."""
    import threading
    gate, batches = threading.Event(), []

    def run(items):
        batches.append(list(items))
        gate.wait(5)
        return items
    b = Batcher(run, max_batch=max_batch, max_wait_ms=max_wait_ms, budget=budget)
    busy = b.submit([Part("x", 1)], client="x")
    while not batches:
        time.sleep(0.005)
    return b, gate, batches, busy


def test_the_budget_doubles_only_while_all_queued_work_is_within_it():
    """With 54 tokens queued under a 64-token budget the next forward takes all four texts though they pad to
    4 x 30 = 120: their real tokens are within the budget, and a cut would only leave the fourth a forward of its
    own. With 100 queued, every forward stays within 64 padded tokens."""
    for extra, expect in ((0, [["a", "b", "c", "d"]]), (46, [["a", "b", "c"], ["d"], ["e"]])):
        b, gate, batches, busy = _gated(budget=Budget(max_batch_tokens=64))
        futs = [b.submit([Part(c, 1, n)], client=c) for c, n in zip("abcd", (8, 8, 8, 30))]
        if extra:
            futs.append(b.submit([Part("e", 1, extra)], client="e"))
        gate.set()
        assert [f.result(timeout=5) for f in futs] == [[c] for c in "abcde"[:len(futs)]]
        assert busy.result(timeout=5) == ["x"] and batches[1:] == expect, batches
        b.close()


def test_clients_answered_together_are_waited_for():
    """Four requests answered by one forward: their clients' next requests, 10 ms apart, make one batch (not a
    first one alone and a second of three), which goes as soon as the fourth is in, long before max_wait_ms."""
    b, gate, batches, busy = _gated(max_wait_ms=1000)
    futs = [b.submit([Part(c, 1)], client=c) for c in "abcd"]
    gate.set()
    assert [f.result(timeout=5) for f in futs] == [[c] for c in "abcd"] and batches[1:] == [list("abcd")]
    t0, again = time.monotonic(), []
    for c in "efgh":
        again.append(b.submit([Part(c, 1)], client=c))
        time.sleep(0.01)
    assert [f.result(timeout=5) for f in again] == [[c] for c in "efgh"]
    assert batches[2:] == [list("efgh")] and time.monotonic() - t0 < 0.8, batches
    b.close()


def test_a_request_after_the_answered_clients_went_quiet_does_not_wait():
    """Two requests answered together, one client comes back and the other never does: once the quiet has lasted
    past the window, a lone request goes at once instead of waiting max_wait_ms for the one that left."""
    b, gate, batches, busy = _gated(max_wait_ms=2000)
    futs = [b.submit([Part(c, 1)], client=c) for c in "ab"]
    gate.set()
    assert [f.result(timeout=5) for f in futs] == [["a"], ["b"]]
    b._answered_at -= 2 * b._recent()                # the quiet, without sleeping through it
    t0 = time.monotonic()
    assert b.submit([Part("c", 1)], client="a").result(timeout=5) == ["c"]
    assert time.monotonic() - t0 < 1.0
    b.close()


def test_clients_take_turns_in_round_order():
    """Three clients queue four one-text parts each while the model is busy: each batch of three then takes one part
    from each, in the order the clients came, and a client that came later joins the round at its back."""
    import threading
    gate, batches = threading.Event(), []

    def run(items):
        batches.append(list(items))
        gate.wait(5)
        return items
    b = Batcher(run, max_batch=3, max_wait_ms=0)
    busy = b.submit([Part("x", 1)], client="x")
    while not batches:
        time.sleep(0.005)
    futs = [b.submit([Part(f"{c}{i}", 1) for i in range(4)], client=c) for c in "abc"]
    late = b.submit([Part("d0", 1)], client="d")
    gate.set()
    assert [f.result(timeout=5) for f in futs] == [[f"{c}{i}" for i in range(4)] for c in "abc"]
    assert busy.result(timeout=5) == ["x"] and late.result(timeout=5) == ["d0"]
    assert batches[1:] == [["a0", "b0", "c0"], ["d0", "a1", "b1"], ["c1", "a2", "b2"], ["c2", "a3", "b3"], ["c3"]]
    b.close()


def test_the_tokenizer_is_shared_safely_between_threads():
    """The server tokenizes on its event loop, in worker threads and in each route's batcher at once: words new to
    the tokenizer's table, met by eight threads together, get the pieces one thread alone gives them."""
    import random
    import string
    import sys
    import threading
    from bertkit.tokenizer import Tokenizer
    letters = list(string.ascii_lowercase)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *("##" + c for c in letters)]
    rng = random.Random(0)
    batches = [[" ".join("".join(rng.choices(letters, k=7)) for _ in range(40)) for _ in range(10)] for _ in range(8)]
    expected = [Tokenizer({t: i for i, t in enumerate(vocab)}).encode_pieces(b).ids.tolist() for b in batches]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)                 # threads switch often: the table grows under each of them
    try:
        for _ in range(10):                     # a fresh table each round: its every growth is a chance to lose rows
            shared, got = Tokenizer({t: i for i, t in enumerate(vocab)}), [None] * len(batches)

            def work(i: int) -> None:
                got[i] = shared.encode_pieces(batches[i]).ids.tolist()
            threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert got == expected
    finally:
        sys.setswitchinterval(interval)


def test_a_long_embed_request_is_split_and_joined_unchanged(tmp_path):
    """With a 16-token budget (quantum 4: one text per part) a TEI and an OpenAI request are answered in pieces,
    and the answers equal the library's in one piece."""
    import numpy as np
    from test_serve_models import TEXTS, _save, _serve
    from bertkit.infer import Predictor
    pred = Predictor.load(_save(tmp_path / "m", "BertForMaskedLM"))
    srv = _serve(pred, max_batch_tokens=16)
    try:
        texts = TEXTS * 2
        batcher = srv.server.config.app.state.runtime.batchers["embed"]
        status, got = _request(srv.port, "POST", "/embed", {"inputs": texts})
        assert status == 200 and np.abs(np.array(got) - pred.embed(texts, normalize=True)).max() < 1e-5
        assert batcher.batches >= 4 and batcher.items == len(texts)        # at most two short texts per forward
        status, got = _request(srv.port, "POST", "/v1/embeddings", {"input": texts, "model": "m"})
        counts = [len(pred.tokenizer.tokenize(t)) + 2 for t in texts]
        assert status == 200 and [d["index"] for d in got["data"]] == list(range(len(texts)))
        assert got["usage"] == {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}
        assert np.abs(np.array([d["embedding"] for d in got["data"]]) - pred.embed(texts, normalize=True)).max() < 1e-5
    finally:
        srv.stop()


def test_admission_is_bounded_with_retry_after():
    b = Batcher(lambda items: (time.sleep(0.3), items)[1], max_batch=1,
                budget=Budget(max_client_tokens=100, max_queue_tokens=150))
    first = b.submit([Part("a", 4, 20)], client="x")                      # 80 tokens: a client's first always goes in
    with pytest.raises(RequestError) as e:
        b.submit([Part("b", 2, 20)], client="x")                          # 80 + 40 > 100
    assert e.value.status == 429 and e.value.retry_after >= 1
    with pytest.raises(RequestError) as e:
        b.submit([Part("c", 4, 20)], client="y")                          # 80 + 80 > 150 in all
    assert e.value.status == 503 and e.value.retry_after >= 1
    assert first.result(timeout=5) == ["a"]
    assert b.submit([Part("b", 2, 20)], client="x").result(timeout=5) == ["b"]   # served again once it drained
    b.close()


def test_a_busy_client_gets_429_over_http(server):
    from concurrent.futures import ThreadPoolExecutor
    port = server(_echo_endpoints([], delay=0.5), max_client_tokens=1, max_batch=1)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_request, port, "POST", "/echo", {"text": "a"})
        time.sleep(0.15)
        status, body, resp = _request(port, "POST", "/echo", {"text": "b"}, full=True)
        assert first.result()[0] == 200
    assert status == 429 and resp.getheader("Retry-After", "").isdigit() and "limit" in body["error"]


def _connect(port: int, source: str) -> socket.socket:
    s = socket.socket()
    s.settimeout(5)
    s.bind((source, 0))                       # Linux routes all of 127/8 to lo: another "client address"
    s.connect(("127.0.0.1", port))
    return s


def test_connections_are_capped_per_address_and_idle_ones_dropped(server):
    port = server(_echo_endpoints([]), max_client_connections=3, keep_alive_s=1, read_timeout_s=5)
    held = [_connect(port, "127.0.0.2") for _ in range(3)]
    try:
        extra = _connect(port, "127.0.0.2")
        got = extra.recv(1000)
        assert got.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in got.lower()
        extra.close()
        assert _request(port, "POST", "/echo", {"text": "a"})[0] == 200        # another address is served
        t0 = time.monotonic()                  # the held ones never sent a byte: dropped after keep_alive_s
        assert all(s.recv(100) == b"" for s in held) and time.monotonic() - t0 < 3
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    again = _connect(port, "127.0.0.2")
    again.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert again.recv(1000).startswith(b"HTTP/1.1 200")
    again.close()


def test_a_huge_declared_chunk_is_413_at_once(server):
    port = server(_echo_endpoints([]), read_timeout_s=10)
    t0 = time.monotonic()
    got = _raw_exchange(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"ffffffffffffffff\r\n{", wait=5)
    assert got.startswith(b"HTTP/1.1 413") and time.monotonic() - t0 < 2
    body = json.loads(got.split(b"\r\n\r\n", 1)[1])               # the shape of the app's own errors
    assert body["error_type"] == "Validation" and "body limit" in body["error"]


def test_api_key_is_required_as_bearer(server):
    port = server(_echo_endpoints([]), api_key="s3cret")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        status, body, resp = _request(port, "POST", "/echo", {"text": "a"},
                                      headers={"Content-Type": "application/json", **headers}, full=True)
        assert status == 401 and resp.getheader("WWW-Authenticate") == "Bearer" and "API key" in body["error"]
    assert _request(port, "GET", "/health", headers={"Authorization": "Bearer wrong"})[0] == 401
    ok = _request(port, "POST", "/echo", {"text": "a"},
                  headers={"Content-Type": "application/json", "Authorization": "Bearer s3cret"})
    assert ok == (200, {"upper": "A", "n": 1})


def test_binding_beyond_loopback_without_a_key_warns(tmp_path, capsys):
    from bertkit.serve import serve_model
    with pytest.raises(Exception):                # the model is missing: it stops right after the warning
        serve_model(str(tmp_path / "absent"), ServeConfig(host="0.0.0.0", port=0))
    assert "no --api-key" in capsys.readouterr().err
    with pytest.raises(Exception):
        serve_model(str(tmp_path / "absent"), ServeConfig(host="0.0.0.0", port=0, api_key="k"))
    assert "no --api-key" not in capsys.readouterr().err
    with pytest.raises(Exception, match="--api-key"):
        ServeConfig(api_key="two words").validate()


def test_an_address_flooding_malformed_requests_is_braked(server):
    """127.0.0.2 sends malformed requests back to back: past a burst of ten seconds' max_client_errors 4xx, its new
    connections are held a second and answered 429, so it gets few answers, while 127.0.0.3 is served at once; the brake wears off."""
    port = server(_echo_endpoints([]), max_client_errors=5)
    answers, t0 = [], time.monotonic()
    while time.monotonic() - t0 < 2.5:
        s = _connect(port, "127.0.0.2")
        s.sendall(b"GARBAGE / HTTP/1.1\r\n\r\n")
        answers.append((s.recv(1000)[:12], time.monotonic()))
        s.close()
    bad = [t for a, t in answers if a == b"HTTP/1.1 400"]
    held = [a for a, _ in answers if a == b"HTTP/1.1 429"]
    assert 50 <= len(bad) <= 50 + 5 * 3 and held and len(bad) + len(held) == len(answers), answers[:20]
    other = _connect(port, "127.0.0.3")                   # meanwhile another address: answered at once
    t1 = time.monotonic()
    other.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert other.recv(1000).startswith(b"HTTP/1.1 200") and time.monotonic() - t1 < 0.5
    other.close()
    time.sleep(2.1)                                       # quiet for two seconds: served again, at once
    again = _connect(port, "127.0.0.2")
    t2 = time.monotonic()
    again.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert again.recv(1000).startswith(b"HTTP/1.1 200") and time.monotonic() - t2 < 0.5
    again.close()
