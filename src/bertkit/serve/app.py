"""The ASGI app: routes, request validation, errors as JSON, metrics. Served by uvicorn (bertkit.serve.server).

Each POST route is an `Endpoint`: a pydantic request type (its schema goes to /openapi.json), a batch function, and
optional per-request limits. A request's path through the app: the body is read while counting (413 past
max_body_bytes), refused unless its Content-Type is JSON (415), parsed within the nesting / number / string limits
(400 / 413), validated (400 for a wrong type, missing or unknown field; 422 for a value out of range), checked against
the endpoint's limits (422), queued on the endpoint's batcher and awaited for at most timeout_s (504, and the queued
work is dropped). Every error is one line, in the shape of the route's API: OpenAI's `{"error": {"message", "type",
"param", "code"}}` under /v1 (where a bad value is 400, as OpenAI answers it), else text-embeddings-inference's
`{"error", "error_type"}`; a response never carries NaN or Inf (503 instead).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import os
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Callable

from fastapi import Body, FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

import bertkit
from bertkit.serve import schemas as S
from bertkit.serve.batcher import Batcher, Budget, Part
from bertkit.serve.limits import RequestError, ServeConfig, parse_json
from bertkit.serve.metrics import CONTENT_TYPE, Metrics

__all__ = ["Endpoint", "FieldError", "make_app", "json_response", "error_response", "tei_error"]

NON_FINITE = "the response would contain non-finite numbers (NaN or Inf): the model's output is not usable"
_ERRORS = {"4XX": {"model": S.ErrorBody, "description": "a client mistake (400 bad JSON or field, 413 too large, "
                                                       "415 not JSON, 422 out of range or over a limit)"},
           "5XX": {"model": S.ErrorBody, "description": "503 non-finite model output, 504 timeout"}}
_OPENAI_ERRORS = {k: {**v, "model": S.OpenAIError} for k, v in _ERRORS.items()}
# curl -d sends a form content type with the JSON the docs show: read as JSON too, as a missing Content-Type is
_JSON_TYPES = {"application/json", "application/x-www-form-urlencoded", ""}


@dataclass
class Endpoint:
    """One POST route. run(list of validated requests) -> list of JSON-able results, same order and length; an
    entry that is an exception fails only its own request (RequestError: its status; ValueError: 422)."""
    name: str                                          # the path without its leading "/"
    request: Any                                       # a pydantic model, or an annotated union of them
    run: Callable[[list], list]
    response: Any = None                               # the 200 body's type, for /openapi.json
    summary: str = ""
    weight: Callable[[Any], int] | None = None         # texts in a request: max_inputs at most (422); a batch
                                                       # holds max_batch texts
    check: Callable[[Any], None] | None = None         # limits checked before queueing (raises RequestError)
    split: Callable[[Any, int], list[Part]] | None = None   # (request, quantum) -> its parts, token-counted
    join: Callable[[Any, list], Any] | None = None     # (request, its parts' results) -> its result


def json_response(status: int, payload: Any, headers: dict | None = None) -> Response:
    try:
        body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:   # the last guard: a non-finite float must not reach a client as NaN
        status, body = 503, json.dumps(tei_error(503, NON_FINITE))
    return Response(body.encode("utf-8"), status_code=status, media_type="application/json", headers=headers)


class FieldError(RequestError):
    """A RequestError about one request field, which OpenAI's error body names as its `param`."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(status, message)
        self.param = param


def error_response(path: str, status: int, message: str, headers: dict | None = None,
                   param: str | None = None) -> Response:
    """An error in the shape of the API the path belongs to: OpenAI's under /v1 (its clients read
    error.message / .param; OpenAI answers a bad value 400, never 422), else text-embeddings-inference's."""
    if path.startswith("/v1/"):
        status = 400 if status == 422 else status
        kind = "invalid_request_error" if status < 500 else "server_error"
        return json_response(status, {"error": {"message": message, "type": kind, "param": param, "code": None}},
                             headers)
    return json_response(status, tei_error(status, message), headers)


def tei_error(status: int, message: str) -> dict:
    """text-embeddings-inference's error body: the message and the error_type of the HTTP status."""
    return {"error": message,
            "error_type": "Overloaded" if status == 429 else "Backend" if status >= 500 else "Validation"}


# ------------------------------------------------------------------------------------------------- validation

_EXPECTED = {"string_type": "a string", "int_type": "an integer", "bool_type": "a boolean", "float_type": "a number",
             "list_type": "a list", "dict_type": "a JSON object", "model_type": "a JSON object",
             "model_attributes_type": "a JSON object"}
_RANGE = ("greater_than_equal", "less_than_equal", "greater_than", "less_than")


def _json_type(value: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _describe(err: dict, skip: int) -> RequestError:
    """One pydantic error -> RequestError: 400 for the request's shape, 422 for a value out of range."""
    loc = err["loc"][skip:]
    field, kind, value = ".".join(str(p) for p in loc), err["type"], err.get("input")
    if not loc and kind in _EXPECTED:
        return RequestError(400, f"request body must be a JSON object, got {_json_type(value)}")
    param = str(loc[0])
    if kind == "missing":
        return FieldError(400, f"missing required field {field!r}", param)
    if kind == "extra_forbidden":
        return FieldError(400, f"unknown field {field!r} (see /openapi.json for this endpoint's fields)", param)
    if kind in _EXPECTED:
        return FieldError(400, f"field {field!r} must be {_EXPECTED[kind]}, got {_json_type(value)}", param)
    if kind.endswith("_type"):
        return FieldError(400, f"field {field!r} has the wrong type: {err['msg']}", param)
    if kind in _RANGE:
        return FieldError(422, f"field {field!r} = {value!r} is outside the allowed range: {err['msg'].lower()}",
                          param)
    if kind == "value_error":
        return FieldError(422, f"field {field!r} {err['ctx']['error']}", param)
    return FieldError(422, f"field {field!r}: {err['msg']}", param)


# --------------------------------------------------------------------------------------------------- runtime

class Runtime:
    """The batchers and metrics of one app, and the request path through them."""

    def __init__(self, endpoints: dict[str, Endpoint], config: ServeConfig):
        self.config = config
        self.endpoints = dict(endpoints)
        self.batchers: dict[str, Batcher] = {}
        self.metrics = Metrics(lambda: {n: b.depth for n, b in self.batchers.items()})
        for name, ep in self.endpoints.items():
            self.batchers[name] = Batcher(ep.run, config.max_batch, config.max_wait_ms, name=f"batch-{name}",
                                          on_batch=partial(self.metrics.batch, name),
                                          budget=Budget(config.max_batch_tokens, config.max_client_tokens,
                                                        config.max_queue_tokens))

    def close(self) -> None:
        for b in self.batchers.values():
            b.close()

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"body of {declared} bytes exceeds the limit of {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():    # counted as it streams: a chunked body has no length up front
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _result(self, fut, request: Request):
        """The batcher's answer; on timeout (504) or when the client hangs up, the still-queued job is cancelled so
        the batcher drops it unrun."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_s
        answer = asyncio.wrap_future(fut)
        gone = asyncio.ensure_future(request.receive())   # the body is read: the next message is the disconnect
        left = False
        try:
            while not answer.done() and not left and loop.time() < deadline:
                await asyncio.wait({answer} if gone.done() else {answer, gone}, timeout=deadline - loop.time(),
                                   return_when=asyncio.FIRST_COMPLETED)
                left = not answer.done() and _hung_up(gone)
        finally:
            gone.cancel()
        if answer.done():
            return answer.result()
        fut.cancel()
        if left:
            raise ClientDisconnect()
        raise RequestError(504, f"no answer within {self.config.timeout_s:g} s")

    async def call(self, ep: Endpoint, validate: Callable[[Any], Any], request: Request) -> Response:
        try:
            body = await self.read_body(request)
            media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media not in _JSON_TYPES and not media.endswith("+json"):
                raise RequestError(415, f"Content-Type {media[:60]!r} is not JSON: send application/json")
            item = validate(parse_json(body, self.config))
            batcher, texts = self.batchers[ep.name], ep.weight(item) if ep.weight else 1
            if texts > self.config.max_inputs:
                raise RequestError(422, f"{texts} inputs in one request; the limit is {self.config.max_inputs}")
            if ep.check is not None:
                ep.check(item)
            if ep.split is None:
                parts = [Part(item, texts)]
            else:   # counting many long texts' tokens takes a while: off the event loop, which serves everyone
                split = partial(ep.split, item, batcher.budget.quantum)
                parts = split() if texts == 1 else await asyncio.to_thread(split)
            client = request.client.host if request.client else ""
            results = await self._result(batcher.submit(parts, client, timeout=self.config.timeout_s), request)
            return json_response(200, ep.join(item, results) if ep.join else results[0])
        except RequestError as e:
            # the rest of an oversized body is never read: close rather than parse it as the next request
            headers = {"Connection": "close"} if e.status == 413 else {}
            if e.retry_after is not None:
                headers["Retry-After"] = str(e.retry_after)
            return error_response(request.url.path, e.status, e.message, headers or None, getattr(e, "param", None))
        except ClientDisconnect:      # nobody to answer; 499 ("client closed request") is what the metrics see
            return Response(status_code=499)
        except ValueError as e:       # BertkitError is a ValueError: a user mistake found by the model code
            return error_response(request.url.path, 422, str(e).splitlines()[0] if str(e) else type(e).__name__)


def _hung_up(receiving: asyncio.Future) -> bool:
    return (receiving.done() and not receiving.cancelled() and receiving.exception() is None
            and receiving.result().get("type") == "http.disconnect")


class _BatchRoute(APIRoute):
    """A route whose handler is ours (body read and parsed within limits), while FastAPI still derives the OpenAPI
    schema from the stub endpoint's signature."""

    def get_route_handler(self):
        handler = getattr(self.endpoint, "bertkit_handler", None)
        return handler if handler is not None else super().get_route_handler()


def _add_post(app: FastAPI, runtime: Runtime, ep: Endpoint) -> None:
    adapter = TypeAdapter(ep.request)
    skip = 0 if isinstance(ep.request, type) and issubclass(ep.request, BaseModel) else 1   # loc[0]: a union member

    def validate(data: Any) -> Any:
        try:
            return adapter.validate_python(data)
        except ValidationError as e:
            raise _describe(e.errors(include_url=False)[0], skip) from None

    async def documented(body):
        """The route as /openapi.json describes it (its typed body); _BatchRoute serves it with bertkit_handler."""

    documented.__signature__ = inspect.Signature([inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                                    annotation=Annotated[ep.request, Body()])])
    documented.bertkit_handler = partial(runtime.call, ep, validate)
    app.router.add_api_route(f"/{ep.name}", documented, methods=["POST"], name=ep.name, summary=ep.summary,
                             response_model=ep.response, route_class_override=_BatchRoute,
                             responses=_OPENAI_ERRORS if ep.name.startswith("v1/") else _ERRORS)


# ------------------------------------------------------------------------------------------------------- app

class _Front:
    """Every request's first stop. A known path with a trailing slash is served as the path (not redirected with an
    empty 307), and HEAD on a GET route as the GET (the server sends the headers only). Refused before any route, in
    text-embeddings-inference's shape with the connection closed so nothing after it is read: both Content-Length and
    Transfer-Encoding (how bodies get smuggled past a proxy that reads the other header, RFC 9112 6.3), and with
    --api-key a request without "Authorization: Bearer KEY" (as text-embeddings-inference's; compared in constant
    time, so the answer's timing does not leak the key). Every response is counted by route (known paths only, so
    hostile paths cannot grow the label set)."""

    def __init__(self, app, metrics: Metrics, paths: set[str], gets: set[str], key: str | None):
        self.app, self.metrics, self.paths, self.gets = app, metrics, paths, gets
        self.expected = key and f"Bearer {key}".encode()

    def _refusal(self, headers: dict) -> Response | None:
        if b"content-length" in headers and b"transfer-encoding" in headers:
            return json_response(400, tei_error(400, "both Content-Length and Transfer-Encoding: send one"),
                                 {"Connection": "close"})
        if self.expected and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            return json_response(401, tei_error(401, "missing or wrong API key: send the header Authorization: "
                                                     "Bearer KEY"), {"Connection": "close", "WWW-Authenticate": "Bearer"})
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] not in self.paths and scope["path"].rstrip("/") in self.paths:
            scope = dict(scope, path=scope["path"].rstrip("/"))
        if scope["method"] == "HEAD" and scope["path"] in self.gets:
            scope = dict(scope, method="GET")
        t0, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await (self._refusal(dict(scope["headers"])) or self.app)(scope, receive, send_status)
        finally:
            known = scope["method"] in ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD")
            method = scope["method"] if known else "other"
            route = scope["path"] if scope["path"] in self.paths else "other"
            self.metrics.request(route, method, status[0], time.perf_counter() - t0)


def _http_error(runtime: Runtime, absent: dict[str, str]):
    async def handler(request: Request, exc: HTTPException) -> Response:
        path = request.url.path
        if exc.status_code == 404:
            served = ", ".join("/" + n for n in sorted(runtime.endpoints))
            message = absent.get(path.strip("/")) or f"no such path {path[:100]!r}; this server has POST {served}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {path}; use {exc.headers.get('Allow', 'POST')}"
        else:
            message = str(exc.detail)
        return error_response(path, exc.status_code, message, exc.headers)
    return handler


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(request.url.path, 500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}")


def make_app(endpoints: dict[str, Endpoint], config: ServeConfig | None = None, model_name: str = "model",
             info: dict | None = None, absent: dict[str, str] | None = None) -> FastAPI:
    """The ASGI app over `endpoints`. info: the body of GET /info; absent: route -> why this model lacks it (404).
    The batchers live as long as the app's lifespan (or until app.state.runtime.close())."""
    config = (config or ServeConfig()).validate()
    runtime = Runtime(endpoints, config)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        runtime.close()

    if os.path.isabs(model_name) or os.path.isdir(model_name):    # a path: its directory's name, not where it is
        model_name = os.path.basename(os.path.normpath(model_name))
    app = FastAPI(title=f"bertkit: {model_name}", version=bertkit.__version__, redoc_url=None, lifespan=lifespan,
                  redirect_slashes=False)
    app.state.runtime = runtime
    for ep in runtime.endpoints.values():
        _add_post(app, runtime, ep)

    @app.get("/health", response_model=S.Health, summary="liveness, model, endpoints and batching counters")
    async def health() -> Response:
        return json_response(200, {"status": "ok", "model": model_name, "endpoints": sorted(runtime.endpoints),
                                   "max_batch": config.max_batch,
                                   "batches": {n: {"batches": b.batches, "requests": b.items, "expired": b.expired}
                                               for n, b in runtime.batchers.items()}})

    if info is not None:
        @app.get("/info", response_model=S.Info, summary="the model and the server's limits (TEI's /info)")
        async def get_info() -> Response:
            return json_response(200, info)

    @app.get("/metrics", summary="Prometheus metrics (text exposition format)",
             responses={200: {"content": {CONTENT_TYPE: {}}, "description": "metrics"}})
    async def metrics() -> Response:
        return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)

    app.add_exception_handler(HTTPException, _http_error(runtime, absent or {}))
    app.add_exception_handler(Exception, _internal_error)
    paths = {r.path for r in app.routes if hasattr(r, "path")}
    gets = {r.path for r in app.routes if "GET" in getattr(r, "methods", ())}
    app.add_middleware(_Front, metrics=runtime.metrics, paths=paths, gets=gets, key=config.api_key)
    return app
