"""Serving: the HTTP layer (FastAPI on a real uvicorn, 127.0.0.1, ephemeral port) answers every client mistake with
a 4xx and a one-line message (never a 500), timeouts give 504, and tiny real models serve bertkit's, text-embeddings-inference's and OpenAI's routes with the library's numbers."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from pydantic import Field  # noqa: E402

from bertkit.serve import Endpoint, ServeConfig, ServerThread, make_app  # noqa: E402
from bertkit.serve import schemas as S  # noqa: E402

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", ".", "who", "?"]


class EchoRequest(S.Request):
    text: S.Text
    n: int = Field(1, ge=1, le=10)


def _echo_endpoints(calls: list, delay: float = 0.0):
    def run(items):
        calls.append([it.text for it in items])
        time.sleep(delay)
        return [{"upper": it.text.upper(), "n": it.n} for it in items]
    return {"echo": Endpoint("echo", EchoRequest, run)}


@pytest.fixture()
def server():
    started = []

    def start(endpoints, app_kw=None, **cfg):
        srv = ServerThread(make_app(endpoints, ServeConfig(port=0, **cfg), **(app_kw or {})), ServeConfig(port=0, **cfg))
        started.append(srv.start())
        return srv.port
    yield start
    for srv in started:
        srv.stop()


def _request(port, method, path, body=None, headers=None, raw: bytes | None = None, full=False):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read()
    conn.close()
    payload = json.loads(text or b"null") if "json" in resp.getheader("content-type", "") else text.decode()
    return (resp.status, payload, resp) if full else (resp.status, payload)


# ------------------------------------------------------------------------------------------------- HTTP layer

def test_health_openapi_and_ok(server):
    port = server(_echo_endpoints([]))
    status, health = _request(port, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["endpoints"] == ["echo"]
    status, spec = _request(port, "GET", "/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    ref = spec["paths"]["/echo"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert schema["required"] == ["text"] and schema["properties"]["n"]["maximum"] == 10
    assert schema["additionalProperties"] is False
    assert _request(port, "POST", "/echo", {"text": "hi", "n": 3}) == (200, {"upper": "HI", "n": 3})
    # curl -d sends a form content type: the body is still read as JSON
    assert _request(port, "POST", "/echo", raw=b'{"text": "x"}',
                    headers={"Content-Type": "application/x-www-form-urlencoded"})[0] == 200


@pytest.mark.parametrize("raw, status, words", [
    (b"{not json", 400, "malformed JSON"),
    (b"\xff\xfe", 400, "malformed JSON"),
    (b"", 400, "empty body"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"text": 5}', 400, "must be a string"),
    (b'{"text": "a", "n": "3"}', 400, "must be an integer"),
    (b'{"text": "a", "n": true}', 400, "must be an integer"),
    (b'{"text": "a", "n": 11}', 422, "outside"),
    (b'{"text": "a", "n": 1.5}', 400, "must be an integer"),
    (b'{"text": "   "}', 422, "empty"),
    (b'{}', 400, "missing required field"),
    (b'{"text": "a", "extra": 1}', 400, "unknown field"),
    (b'{"text": "' + b"x" * 300 + b'"}', 413, "characters"),
    (b'{"text": "a", "n": 10000000000}', 400, "beyond the limit"),             # huge number
    (b'{"text": "a", "n": 1' + b"0" * 5000 + b"}", 400, "beyond the limit"),
    (b'{"text": "a", "x": 1e999}', 400, "too large"),
    (b'{"text": "a", "n": NaN}', 400, "NaN is not JSON"),
    (b'{"text": "a", "x": ' + b"[" * 33 + b"]" * 33 + b"}", 400, "nested 34 deep"),   # deep nesting
    (b"[" * 100_000, 400, "nested"),
])
def test_client_mistakes_get_4xx_with_message(server, raw, status, words):
    port = server(_echo_endpoints([]), max_text_chars=200, max_body_bytes=200_000)
    got, payload = _request(port, "POST", "/echo", raw=raw)
    assert got == status and words in payload["error"] and "\n" not in payload["error"], payload


def test_oversized_body_unknown_path_and_other_methods(server):
    port = server(_echo_endpoints([]), max_body_bytes=1000)
    got, payload = _request(port, "POST", "/echo", raw=json.dumps({"text": "x" * 5000}).encode())
    assert got == 413 and "exceeds" in payload["error"]
    got, payload = _request(port, "POST", "/nope", {"text": "a"})
    assert got == 404 and "/echo" in payload["error"]
    assert _request(port, "GET", "/nope")[0] == 404
    for method in ("PUT", "DELETE", "PATCH"):
        got, payload, resp = _request(port, method, "/echo", {"text": "a"}, full=True)
        assert got == 405 and "not allowed" in payload["error"] and resp.getheader("allow") == "POST"
    got, payload = _request(port, "POST", "/health")
    assert got == 405 and "GET" in payload["error"]


def _raw_exchange(port: int, data: bytes, wait: float = 1.0) -> bytes:
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            pass
    return got


def test_chunked_bodies_are_capped_and_never_smuggle(server):
    calls = []
    port = server(_echo_endpoints(calls), max_body_bytes=2000)
    inner = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b'{"text": "hi"}' + inner                      # a second request hidden in the chunk data
    req = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
           + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
    got = _raw_exchange(port, req)
    assert got.count(b"HTTP/1.1 ") == 1 and got.startswith(b"HTTP/1.1 400") and b'"status":"ok"' not in got
    # Content-Length and Transfer-Encoding together (the classic desync): refused, and the connection closes before
    # the bytes after it are read as a request
    both = (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"e\r\n" + b'{"text": "hi"}' + b"\r\n0\r\n\r\n" + inner)
    got = _raw_exchange(port, both)
    assert got.count(b"HTTP/1.1 ") == 1 and got.startswith(b"HTTP/1.1 400") and b'"status":"ok"' not in got
    # a chunked body over the cap: 413 while streaming, and the connection closes
    big = b"".join(b"400\r\n" + b"x" * 1024 + b"\r\n" for _ in range(8))
    got = _raw_exchange(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + big)
    assert got.startswith(b"HTTP/1.1 413") and b"connection: close" in got.lower()
    # a well-formed chunked body works
    ok = b'{"text": "chunked"}'
    got = _raw_exchange(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close"
                              b"\r\n\r\n" + f"{len(ok):x}\r\n".encode() + ok + b"\r\n0\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200") and b"CHUNKED" in got


def test_slow_and_idle_clients_are_closed(server):
    import socket
    port = server(_echo_endpoints([]), read_timeout_s=0.6, keep_alive_s=1)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:     # trickles its headers
        t0 = time.monotonic()
        closed = None
        for piece in b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n{}":
            try:
                s.sendall(bytes([piece]))
            except OSError:
                closed = time.monotonic() - t0
                break
            time.sleep(0.1)
        if closed is None:
            closed = time.monotonic() - t0 if s.recv(100) == b"" else None
        assert closed is not None and closed < 3.0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:     # connects, never sends
        t0 = time.monotonic()
        assert s.recv(100) == b"" and time.monotonic() - t0 < 2.0
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:     # a body that never completes
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        t0 = time.monotonic()
        s.recv(1000)
        assert time.monotonic() - t0 < 2.0


def test_connection_cap(server):
    import socket
    port = server(_echo_endpoints([]), max_connections=3)
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        assert _request(port, "POST", "/echo", {"text": "a"})[0] == 503
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert _request(port, "POST", "/echo", {"text": "a"})[0] == 200


def test_timeout_gives_504_and_drops_the_queued_request(server):
    calls = []
    port = server(_echo_endpoints(calls, delay=1.0), timeout_s=0.3, max_batch=1)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_request, port, "POST", "/echo", {"text": "first"})
        time.sleep(0.05)
        second = pool.submit(_request, port, "POST", "/echo", {"text": "second"})
        for fut in (first, second):
            got, payload = fut.result()
            assert got == 504 and "no answer" in payload["error"]
    time.sleep(1.2)                      # the worker finishes "first", then must skip "second"
    assert calls == [["first"]]
    health = _request(port, "GET", "/health")[1]
    assert health["batches"]["echo"]["expired"] == 1


def test_a_client_that_hangs_up_has_its_queued_request_dropped(server):
    import socket
    calls = []
    port = server(_echo_endpoints(calls, delay=0.5), max_batch=1)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_request, port, "POST", "/echo", {"text": "first"})
        time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n{"text": "gone"}')
            time.sleep(0.1)
        assert first.result()[0] == 200
    time.sleep(0.7)
    assert calls == [["first"]] and _request(port, "GET", "/health")[1]["batches"]["echo"]["expired"] == 1


def test_concurrent_requests_share_forwards(server):
    calls = []
    port = server(_echo_endpoints(calls, delay=0.02), max_batch=16, max_wait_ms=20)
    with ThreadPoolExecutor(16) as pool:
        res = list(pool.map(lambda i: _request(port, "POST", "/echo", {"text": f"t{i}"}), range(48)))
    assert all(s == 200 and p["upper"] == f"T{i}" for i, (s, p) in enumerate(res))
    sizes = [len(c) for c in calls]
    assert sum(sizes) == 48 and len(sizes) < 48 and max(sizes) > 1


def test_metrics_move(server):
    parser = pytest.importorskip("prometheus_client.parser")
    port = server(_echo_endpoints([]))

    def scrape():
        status, text = _request(port, "GET", "/metrics")
        assert status == 200
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in parser.text_string_to_metric_families(text) for s in fam.samples}
    before = scrape()
    for body in ({"text": "a"}, {"text": "b"}, {"text": 5}):
        _request(port, "POST", "/echo", body)
    _request(port, "PUT", "/echo", {"text": "a"})
    _request(port, "GET", "/no/such/path")
    after = scrape()
    ok = ("bertkit_requests_total", (("method", "POST"), ("route", "/echo"), ("status", "200")))
    assert before.get(ok, 0) == 0 and after[ok] == 2
    assert after[("bertkit_requests_total", (("method", "POST"), ("route", "/echo"), ("status", "400")))] == 1
    assert after[("bertkit_requests_total", (("method", "PUT"), ("route", "/echo"), ("status", "405")))] == 1
    assert after[("bertkit_requests_total", (("method", "GET"), ("route", "other"), ("status", "404")))] == 1
    assert after[("bertkit_request_duration_seconds_count", (("route", "/echo"),))] >= 4
    assert after[("bertkit_batch_size_count", (("endpoint", "echo"),))] >= 1
    assert after[("bertkit_queue_depth", (("endpoint", "echo"),))] == 0
