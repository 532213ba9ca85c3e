"""An HTTP JSON API over a model, with dynamic batching. Standard library only (http.server + threads).

    bertkit serve MODEL --port 8000
    curl -s localhost:8000/health
    curl -s localhost:8000/fill-mask -d '{"text": "Paris is the [MASK] of France."}'

Endpoints depend on the model's head: `fill-mask` (a masked-LM head), `classify` (sequence classification), `tag`
(token classification), `answer` (question answering); `embed` is always there (every model has an encoder).
`GET /health` and `GET /openapi.json` (an OpenAPI 3 description generated from the same endpoint specs that validate
the requests).

Dynamic batching. Each endpoint owns a `Batcher`: HTTP handler threads validate a request, put it on a queue and wait
on its future. One worker thread per endpoint takes the first queued request, then keeps taking requests until it
has `max_batch` of them or `max_wait_ms` have passed since the first one arrived, runs the model once on the padded
batch, and hands each request its own result. Under load the batch fills before the wait runs out, so the wait costs
nothing; a request that comes more than `max_wait_ms` after the one before it (sparse traffic) does not wait at all.
`max_batch=1` turns batching off (one forward per request).

Limits: a body larger than `max_body_bytes` gets 413 before it is read; a text longer than `max_text_chars` gets
413; malformed JSON, a missing field or a value of the wrong type gets 400 (422 for a value out of range), each
with `{"error": message}`. A request not answered within `timeout_s` gets 504. A user mistake never gets a 500.
"""

from __future__ import annotations

import json
import math
import queue
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

__all__ = ["ServeConfig", "Field", "Endpoint", "Batcher", "RequestError", "make_server", "serve_model",
           "model_endpoints"]


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"            # loopback by default: exposing a model is the user's explicit choice
    port: int = 8000
    max_batch: int = 32                # one forward for up to this many requests; 1 = batching off
    max_wait_ms: float = 5.0           # how long the first request of a batch waits for company
    max_body_bytes: int = 64 * 1024    # bodies beyond this get 413 without being read
    max_text_chars: int = 10_000       # per text field; a model sees at most max_length tokens anyway
    timeout_s: float = 30.0            # per request, queueing included -> 504
    max_length: int = 256              # tokens per text; longer inputs are truncated


class RequestError(Exception):
    """A client mistake: becomes a 4xx JSON response {"error": message}."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# ------------------------------------------------------------------------------------------------ request schemas

@dataclass(frozen=True)
class Field:
    name: str
    type: str                     # "string" | "integer" | "boolean"
    required: bool = True
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple | None = None
    description: str = ""

    def openapi(self) -> dict:
        s: dict[str, Any] = {"type": self.type}
        if self.description:
            s["description"] = self.description
        if self.default is not None:
            s["default"] = self.default
        if self.minimum is not None:
            s["minimum"] = self.minimum
        if self.maximum is not None:
            s["maximum"] = self.maximum
        if self.choices is not None:
            s["enum"] = list(self.choices)
        return s


_PY_TYPES = {"string": (str,), "integer": (int,), "boolean": (bool,)}


@dataclass
class Endpoint:
    """One POST route: its request fields, a batch function and a description for OpenAPI.

    run(list of validated request dicts) -> list of JSON-able results, same order and length; an entry that is an
    exception fails only its own request (a ValueError becomes 422).
    """
    name: str
    fields: list[Field]
    run: Callable[[list[dict]], list[Any]]
    summary: str = ""
    example: dict = field(default_factory=dict)

    def validate(self, body: Any, max_text_chars: int) -> dict:
        if not isinstance(body, dict):
            raise RequestError(400, f"request body must be a JSON object, got {type(body).__name__}")
        known = {f.name for f in self.fields}
        unknown = sorted(set(body) - known)
        if unknown:
            raise RequestError(400, f"unknown field(s) {unknown}; this endpoint takes {sorted(known)}")
        out = {}
        for f in self.fields:
            if f.name not in body:
                if f.required:
                    raise RequestError(400, f"missing required field {f.name!r} ({f.type})")
                out[f.name] = f.default
                continue
            value = body[f.name]
            ok = isinstance(value, _PY_TYPES[f.type]) and not (f.type == "integer" and isinstance(value, bool))
            if not ok:
                raise RequestError(400, f"field {f.name!r} must be a {f.type}, got {type(value).__name__}")
            if f.type == "string":
                if len(value) > max_text_chars:
                    raise RequestError(413, f"field {f.name!r} has {len(value)} characters; the limit is {max_text_chars}")
                if not value.strip():
                    raise RequestError(422, f"field {f.name!r} is empty")
            if f.type == "integer":
                if f.minimum is not None and value < f.minimum or f.maximum is not None and value > f.maximum:
                    raise RequestError(422, f"field {f.name!r} = {value} is outside [{f.minimum}, {f.maximum}]")
            if f.choices is not None and value not in f.choices:
                raise RequestError(422, f"field {f.name!r} = {value!r} is not one of {list(f.choices)}")
            out[f.name] = value
        return out


# ------------------------------------------------------------------------------------------------------- batching

class Batcher:
    """Collects concurrent requests into batches for `run` (see the module docstring)."""

    def __init__(self, run: Callable[[list[dict]], list[Any]], max_batch: int = 32, max_wait_ms: float = 5.0,
                 name: str = "batcher"):
        self.run = run
        self.max_batch = max(1, int(max_batch))
        self.max_wait = max(0.0, max_wait_ms) / 1000.0
        self.queue: queue.Queue[tuple[dict, Future, float]] = queue.Queue()
        self._last_submit = -math.inf
        self._lock = threading.Lock()
        self.batches = 0        # counters, for /health and the benchmark
        self.items = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: dict) -> Future:
        fut: Future = Future()
        with self._lock:
            now = time.monotonic()
            gap, self._last_submit = now - self._last_submit, now
        self.queue.put((item, fut, gap))    # gap: seconds since the request before it
        return fut

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _take_batch(self) -> list[tuple[dict, Future, float]]:
        try:
            first = self.queue.get(timeout=0.1)
        except queue.Empty:
            return []
        batch = [first]
        # sparse traffic (the request before this one came more than max_wait earlier): waiting for company would
        # only add latency, so take what is already queued and go; under load the gaps are short and it waits
        deadline = time.monotonic() + (self.max_wait if first[2] <= self.max_wait else 0.0)
        while len(batch) < self.max_batch:
            left = deadline - time.monotonic()
            try:
                batch.append(self.queue.get(timeout=left) if left > 0 else self.queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _loop(self) -> None:
        while not self._stop.is_set():
            batch = self._take_batch()
            batch = [(item, fut) for item, fut, _ in batch if fut.set_running_or_notify_cancel()]
            if not batch:
                continue
            try:
                results = self.run([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batch function returned {len(results)} results for {len(batch)} requests")
            except Exception as e:  # noqa: BLE001 - handed to every waiting request
                for _, fut in batch:
                    fut.set_exception(e)
                continue
            self.batches += 1
            self.items += len(batch)
            for (_, fut), res in zip(batch, results):
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)


# ----------------------------------------------------------------------------------------------------------- HTTP

def openapi_spec(endpoints: dict[str, Endpoint], title: str = "bertkit") -> dict:
    paths: dict[str, Any] = {
        "/health": {"get": {"summary": "liveness, model name, endpoints and batching counters",
                            "responses": {"200": {"description": "ok"}}}},
        "/openapi.json": {"get": {"summary": "this description", "responses": {"200": {"description": "ok"}}}},
    }
    err = {"description": "client error", "content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"}}}}}}
    for ep in endpoints.values():
        schema = {"type": "object", "additionalProperties": False,
                  "required": [f.name for f in ep.fields if f.required],
                  "properties": {f.name: f.openapi() for f in ep.fields}}
        if ep.example:
            schema["example"] = ep.example
        paths[f"/{ep.name}"] = {"post": {
            "summary": ep.summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {"200": {"description": "result", "content": {"application/json": {"schema": {"type": "object"}}}},
                          "400": err, "413": err, "422": err, "504": err},
        }}
    return {"openapi": "3.0.3", "info": {"title": title, "version": "1"}, "paths": paths}


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"   # keep-alive: the load benchmark reuses connections

    def log_message(self, fmt, *args):  # quiet by default; --verbose turns it on
        if self.server.verbose:
            super().log_message(fmt, *args)

    def setup(self):
        super().setup()
        # no Nagle: a response written as headers then body would otherwise wait for the client's delayed ACK of
        # the headers (~40 ms on Linux) on a keep-alive connection
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # not a TCP socket (tests may hand in others)
            pass

    def _reply(self, status: int, payload: Any) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        path = self.path.split("?", 1)[0]
        srv = self.server
        if path == "/health":
            self._reply(200, {"status": "ok", "model": srv.model_name, "endpoints": sorted(srv.endpoints),
                              "max_batch": srv.config.max_batch,
                              "batches": {n: {"batches": b.batches, "requests": b.items} for n, b in srv.batchers.items()}})
        elif path == "/openapi.json":
            self._reply(200, srv.spec)
        else:
            self._reply(404, {"error": f"no such path {path!r}; GET /health, GET /openapi.json, "
                                       f"POST {', '.join('/' + n for n in sorted(srv.endpoints))}"})

    def do_POST(self):  # noqa: N802
        srv = self.server
        name = self.path.split("?", 1)[0].strip("/")
        try:
            body = self._read_body()          # size checked before routing so an oversized body is never read
            ep = srv.endpoints.get(name)
            if ep is None:
                raise RequestError(404, f"no endpoint /{name}; this model serves "
                                        f"{', '.join('/' + n for n in sorted(srv.endpoints))}")
            try:
                parsed = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(400, f"malformed JSON: {e}") from None
            item = ep.validate(parsed, srv.config.max_text_chars)
            fut = srv.batchers[name].submit(item)
            try:
                result = fut.result(timeout=srv.config.timeout_s)
            except TimeoutError:
                fut.cancel()
                raise RequestError(504, f"no answer within {srv.config.timeout_s:g} s") from None
            except RequestError:
                raise
            except ValueError as e:   # BertkitError is a ValueError: a user mistake found by the model code
                raise RequestError(422, str(e)) from None
            self._reply(200, result)
        except RequestError as e:
            if e.status == 413:
                self.close_connection = True   # the unread body would poison the next request on this socket
            self._reply(e.status, {"error": e.message})
        except Exception as e:  # noqa: BLE001 - a server bug: still answer JSON, with the cause
            self._reply(500, {"error": f"internal error: {type(e).__name__}: {e}"})

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            raise RequestError(411, "Content-Length header required")
        try:
            n = int(length)
        except ValueError:
            raise RequestError(400, f"bad Content-Length {length!r}") from None
        if n < 0:
            raise RequestError(400, f"bad Content-Length {length!r}")
        if n > self.server.config.max_body_bytes:
            raise RequestError(413, f"body of {n} bytes exceeds the limit of {self.server.config.max_body_bytes}")
        return self.rfile.read(n)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256      # the listen backlog: 32+ clients connect at once in the load test


def make_server(endpoints: dict[str, Endpoint], config: ServeConfig | None = None, model_name: str = "model",
                verbose: bool = False) -> _Server:
    """A ready-to-run server (call `.serve_forever()`; `.shutdown()` + `close_server()` to stop). Port 0 = any free."""
    config = config or ServeConfig()
    srv = _Server((config.host, config.port), _Handler)
    srv.config = config
    srv.endpoints = dict(endpoints)
    srv.model_name = model_name
    srv.verbose = verbose
    srv.spec = openapi_spec(srv.endpoints, title=f"bertkit: {model_name}")
    srv.batchers = {n: Batcher(ep.run, config.max_batch, config.max_wait_ms, name=f"batch-{n}")
                    for n, ep in srv.endpoints.items()}
    return srv


def close_server(srv: _Server) -> None:
    srv.shutdown()
    srv.server_close()
    for b in srv.batchers.values():
        b.close()


# ----------------------------------------------------------------------------------------------- model endpoints

def model_endpoints(predictor, config: ServeConfig | None = None) -> dict[str, Endpoint]:
    """The endpoints a `bertkit.infer.Predictor` supports, each running one padded forward per batch."""
    config = config or ServeConfig()
    L = config.max_length
    eps: dict[str, Endpoint] = {}
    text = Field("text", "string", description="input text")
    eps["embed"] = Endpoint(
        "embed", [text, Field("pooling", "string", required=False, default="mean", choices=("mean", "cls")),
                  Field("normalize", "boolean", required=False, default=True)],
        lambda items: _embed_batch(predictor, items, L), summary="sentence embedding",
        example={"text": "A man is eating food."})
    if predictor.has_mlm:
        eps["fill-mask"] = Endpoint(
            "fill-mask", [Field("text", "string", description="text with one or more [MASK]"),
                          Field("top_k", "integer", required=False, default=5, minimum=1, maximum=50)],
            lambda items: [_fill(predictor, it, L) for it in items],
            summary="fill [MASK] tokens (several masks are decoded jointly)",
            example={"text": "Paris is the [MASK] of France."})
    if predictor.task == "classify":
        eps["classify"] = Endpoint(
            "classify", [text, Field("pair", "string", required=False, description="second text (pair tasks)")],
            lambda items: _classify_batch(predictor, items, L),
            summary="sequence classification (of a text, or of a text pair)", example={"text": "a gripping, funny film"})
    if predictor.task == "tag":
        eps["tag"] = Endpoint("tag", [text], lambda items: predictor.tag([it["text"] for it in items], max_length=L),
                              summary="token classification (per word)", example={"text": "Tony Blair visited Paris."})
    if predictor.task == "answer":
        eps["answer"] = Endpoint(
            "answer", [Field("question", "string"), Field("context", "string")],
            lambda items: predictor.answer([it["question"] for it in items], [it["context"] for it in items], max_length=L),
            summary="extractive question answering",
            example={"question": "Who visited Paris?", "context": "Tony Blair visited Paris."})
    return eps


def _embed_batch(predictor, items: list[dict], max_length: int) -> list[dict]:
    out: list[dict | None] = [None] * len(items)
    groups: dict[tuple, list[int]] = {}
    for i, it in enumerate(items):   # requests with the same options share one forward
        groups.setdefault((it["pooling"], it["normalize"]), []).append(i)
    for (pooling, normalize), idx in groups.items():
        vecs = predictor.embed([items[i]["text"] for i in idx], pooling=pooling, normalize=normalize,
                               max_length=max_length)
        for i, v in zip(idx, vecs):
            out[i] = {"embedding": [round(float(x), 6) for x in v]}
    return out  # type: ignore[return-value]


def _classify_batch(predictor, items: list[dict], max_length: int) -> list:
    out: list = [None] * len(items)
    single = [i for i, it in enumerate(items) if it["pair"] is None]
    paired = [i for i, it in enumerate(items) if it["pair"] is not None]
    if single:
        for i, r in zip(single, predictor.classify([items[i]["text"] for i in single], max_length=max_length)):
            out[i] = r
    if paired:
        res = predictor.classify([items[i]["text"] for i in paired], max_length=max_length,
                                 pairs=[items[i]["pair"] for i in paired])
        for i, r in zip(paired, res):
            out[i] = r
    return out


def _fill(predictor, item: dict, max_length: int):
    try:
        return predictor.fill_mask(item["text"], top_k=item["top_k"], max_length=max_length)
    except ValueError as e:   # e.g. no [MASK] in the text: that request alone gets 422
        return e


def serve_model(model_path: str, config: ServeConfig, verbose: bool = False) -> None:
    """Load a model directory and serve it until interrupted."""
    from bertkit.infer import Predictor
    predictor = Predictor.load(model_path)
    srv = make_server(model_endpoints(predictor, config), config, model_name=str(model_path), verbose=verbose)
    host, port = srv.server_address[:2]
    print(f"bertkit serve: {model_path} on http://{host}:{port}  endpoints: "
          f"{', '.join('/' + n for n in sorted(srv.endpoints))}  (max_batch={config.max_batch}, "
          f"max_wait_ms={config.max_wait_ms:g})", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        close_server(srv)
