"""Running the app under uvicorn: the listening socket (bad host / busy port found before the model loads), a read
deadline per request, the keep-alive and connection limits, and a server in a thread for tests and benchmarks.

uvicorn closes a keep-alive connection that stays idle, but not one that trickles its request a byte at a time, nor
a fresh connection that never sends anything: `_ReadDeadline` closes a connection whose request has not fully
arrived `read_timeout_s` after the server started waiting for it.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from bertkit.errors import ConfigError
from bertkit.infer import Predictor
from bertkit.predict.engine import PRECISION
from bertkit.serve.app import make_app
from bertkit.serve.endpoints import absent_routes, model_endpoints, model_info
from bertkit.serve.limits import ServeConfig

__all__ = ["listen", "uvicorn_config", "ServerThread", "serve_model"]


class _ReadDeadline(H11Protocol):
    read_timeout_s = 10.0

    def connection_made(self, transport):  # type: ignore[override]
        super().connection_made(transport)
        self._read_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(self.read_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _expire(self) -> None:
        self._read_timer = None
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()        # the request is in (or the connection is done): the batcher's timeout governs

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()           # the next request on this connection gets its own deadline

    def connection_lost(self, exc):
        self._disarm()
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
    protocol = type("ReadDeadlineProtocol", (_ReadDeadline,), {"read_timeout_s": float(config.read_timeout_s)})
    return uvicorn.Config(app, http=protocol, ws="none", lifespan="on", log_level="info" if verbose else "warning",
                          access_log=verbose, timeout_keep_alive=config.keep_alive_s,
                          limit_concurrency=config.max_connections, server_header=False, proxy_headers=False,
                          timeout_graceful_shutdown=2)


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
