"""Running the app under uvicorn: the listening socket (bad host / busy port found before the model loads), the
connection guards, and a server in a thread for tests and benchmarks.

uvicorn closes a keep-alive connection that stays idle, but not one that trickles its request a byte at a time, nor
a fresh connection that never sends anything, nor counts connections per client. `_Guarded` does, so that idle and
slow clients are dropped by the server rather than starving the others: a connection that has sent nothing of its
next request within keep_alive_s, or not all of it within read_timeout_s, is closed; an address holding
max_client_connections gets 503; an address that causes more than max_client_errors 4xx answers a second (a flood
of malformed requests) gets 429 on its new connections and its kept-alive ones closed, so its share of the event
loop is bounded; a chunk declared larger than the body limit is answered 413 at once instead of being waited for.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import sys
import threading
import time
from http import HTTPStatus

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from bertkit.errors import ConfigError
from bertkit.infer import Predictor
from bertkit.predict.engine import PRECISION
from bertkit.serve.app import make_app, tei_error
from bertkit.serve.endpoints import absent_routes, model_endpoints, model_info
from bertkit.serve.limits import ServeConfig

__all__ = ["listen", "uvicorn_config", "ServerThread", "serve_model"]


class _Brake:
    """4xx answers per address as a token bucket: each takes a token, `rate` come back a second, ten seconds' worth
    are kept (a client's burst of mistakes is not a flood); an address with none left is braked. rate 0: never."""

    def __init__(self, rate: int):
        self.rate, self.burst = rate, 10 * rate
        self.tokens: dict[str, tuple[float, float]] = {}     # address -> (tokens, when); absent: a full bucket

    def _left(self, address: str, now: float) -> float:
        tokens, then = self.tokens.get(address, (self.burst, now))
        return min(self.burst, tokens + (now - then) * self.rate)

    def spend(self, address: str, now: float) -> None:
        if not self.rate:
            return
        if len(self.tokens) > 4096:             # forget the addresses whose bucket has filled up again
            self.tokens = {a: v for a, v in self.tokens.items() if self._left(a, now) < self.burst}
        # down to -rate: a brake lasts at most two seconds after the errors stop
        self.tokens[address] = (max(-self.rate, self._left(address, now) - 1), now)

    def braked(self, address: str, now: float) -> bool:
        return self.rate > 0 and self._left(address, now) < 1


class _Sparse(logging.Filter):
    """uvicorn's warning for each malformed request, at most one a second: a flood of them is not a flood of lines."""

    def __init__(self):
        super().__init__()
        self.last = -1.0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != "Invalid HTTP request received.":
            return True
        now = time.monotonic()
        if now - self.last < 1.0:
            return False
        self.last = now
        return True


class _Guarded(H11Protocol):
    limits = ServeConfig()
    clients: dict[str, int] = {}      # address -> open connections; one dict per server (see uvicorn_config)
    brake = _Brake(0)                 # address -> 4xx answers it caused; one per server

    def connection_made(self, transport):  # type: ignore[override]
        super().connection_made(transport)
        self._read_timer: asyncio.TimerHandle | None = None
        self._held = False
        self._address = self.client[0] if self.client else ""
        self.clients[self._address] = self.clients.get(self._address, 0) + 1
        send = self.conn.send
        self.conn.send = lambda event: (self._counted(getattr(event, "status_code", 200)), send(event))[1]
        if self.clients[self._address] > self.limits.max_client_connections:
            self._hold(503, f"this address already has {self.limits.max_client_connections} connections open")
        elif self.brake.braked(self._address, self.loop.time()):
            self._hold(429, "this address sent too many bad requests; send fewer")
        else:
            self._arm()

    def _counted(self, status: int) -> None:
        if 400 <= status < 500 and status != 429:       # a client's mistake, not the server's refusal
            self.brake.spend(self._address, self.loop.time())

    def _hold(self, status: int, message: str) -> None:
        # held a second, unread and outside uvicorn's count, before the answer: a client that reconnects as soon as
        # it is answered spins slowly instead of making the server accept thousands of sockets a second
        self.connections.discard(self)
        self._held = True                  # what it sends meanwhile is dropped unread: pause_reading can come late
        self.transport.pause_reading()
        self._read_timer = self.loop.call_later(1.0, self._answer, status, message, 1)

    def _arm(self) -> None:
        self._disarm()
        self._since, self._heard = self.loop.time(), False
        idle = min(self.limits.keep_alive_s, self.limits.read_timeout_s)
        self._read_timer = self.loop.call_later(idle, self._expire)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _expire(self) -> None:
        self._read_timer = None
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY) or self.transport.is_closing():
            return
        left = self._since + self.limits.read_timeout_s - self.loop.time()
        if self._heard and left > 0:        # the request is coming: it has until read_timeout_s in all
            self._read_timer = self.loop.call_later(left, self._expire)
        else:
            self.transport.close()

    def _answer(self, status: int, message: str, retry_after: int | None = None) -> None:
        """An error written straight to the socket, which is then closed: for what the app never sees, in the shape
        the app's own errors have."""
        body = json.dumps(tei_error(status, message)).encode()
        extra = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n")
        self._disarm()
        self._counted(status)
        self.transport.write(head.encode() + body)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._held:
            return
        self._heard = True
        super().data_received(data)
        if self.transport.is_closing():
            return
        declared = getattr(getattr(self.conn, "_reader", None), "_bytes_in_chunk", 0)   # h11's chunked reader
        if isinstance(declared, int) and declared > self.limits.max_body_bytes:
            self._answer(413, f"a chunk of {declared} bytes exceeds the body limit of {self.limits.max_body_bytes}")
        elif self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()        # the request is in (or the connection is done): the batcher's timeout governs

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.brake.braked(self._address, self.loop.time()):
            self.transport.close()     # a braked address's next request waits at a new connection, held
        elif not self.transport.is_closing():
            self._arm()           # the next request on this connection gets its own deadline

    def connection_lost(self, exc):
        self._disarm()
        self.clients[self._address] -= 1
        if not self.clients[self._address]:
            del self.clients[self._address]
        super().connection_lost(exc)


def listen(config: ServeConfig) -> socket.socket:
    """A bound, listening socket for config.host:port; a bad host or a busy port is a one-line ConfigError."""
    try:
        infos = socket.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"--host {config.host!r} does not resolve: {getattr(e, 'strerror', None) or e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        what = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror or e})"
        raise ConfigError(f"{config.host}:{config.port} {what}") from None
    sock.set_inheritable(True)
    return sock


def uvicorn_config(app, config: ServeConfig, verbose: bool = False) -> uvicorn.Config:
    protocol = type("GuardedProtocol", (_Guarded,), {"limits": config, "clients": {},
                                                     "brake": _Brake(config.max_client_errors)})
    made = uvicorn.Config(app, http=protocol, ws="none", lifespan="on", log_level="info" if verbose else "warning",
                          access_log=verbose, timeout_keep_alive=config.keep_alive_s,
                          limit_concurrency=config.max_connections, server_header=False, proxy_headers=False,
                          timeout_graceful_shutdown=2)
    logger = logging.getLogger("uvicorn.error")       # after uvicorn.Config, which sets its logging up
    if not any(isinstance(f, _Sparse) for f in logger.filters):
        logger.addFilter(_Sparse())
    return made


class ServerThread:
    """uvicorn in a background thread on an already-bound socket; `.port`, `.url`, `.stop()`."""

    def __init__(self, app, config: ServeConfig, verbose: bool = False):
        self.sock = listen(config)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{config.host}:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, config, verbose))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="uvicorn")

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self.thread.start()
        for _ in range(int(timeout / 0.02)):
            if self.server.started or not self.thread.is_alive():
                break
            self.thread.join(0.02)                   # a pause that ends early if the server thread dies
        if not self.server.started:
            raise RuntimeError("the server did not start")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> "ServerThread":
        return self if self.thread.is_alive() else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_model(model_path: str, config: ServeConfig, verbose: bool = False, precision: str = PRECISION) -> None:
    """Load a model directory through `Predictor.load` (forwards in `precision`) and serve it until interrupted."""
    config.validate()
    sock = listen(config)          # before loading: a busy port fails at once, not after the model has loaded
    loopback = config.host in ("localhost", "::1") or config.host.startswith("127.")    # no one else can connect
    if not loopback and not config.api_key:
        print(f"bertkit serve: warning: --host {config.host} is reachable from other machines and no --api-key is "
              f"set: anyone who can connect can use the model", file=sys.stderr, flush=True)
    try:
        predictor = Predictor.load(model_path, precision=precision)
        endpoints = model_endpoints(predictor, config)
        app = make_app(endpoints, config, model_name=str(model_path), info=model_info(predictor, config),
                       absent=absent_routes(predictor))
        host, port = sock.getsockname()[:2]
        print(f"bertkit serve: {model_path} on http://{host}:{port}  endpoints: "
              f"{', '.join('/' + n for n in sorted(endpoints))}", flush=True)
        print(f"bertkit serve: {config.describe()}", flush=True)
        uvicorn.Server(uvicorn_config(app, config, verbose)).run(sockets=[sock])
    finally:
        sock.close()
