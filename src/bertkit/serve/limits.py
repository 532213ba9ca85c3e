"""What one request may cost: the serving limits (`ServeConfig`), their checks, and a JSON reader that enforces them.

Standard library only, so `bertkit serve --help` and the core library work without the `serve` extra.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass

from bertkit.errors import BertkitError, ConfigError

__all__ = ["ServeConfig", "RequestError", "MissingServeExtra", "parse_json", "require_serve_extra"]

class MissingServeExtra(BertkitError):
    """FastAPI / uvicorn are not installed."""


def require_serve_extra() -> None:
    """One line naming the extra to install, instead of a traceback from deep inside an import."""
    missing = []
    for name in ("fastapi", "uvicorn", "pydantic"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingServeExtra(f"serving needs {', '.join(missing)}: pip install 'bertkit[serve]'")


DEFAULT_MAX_LENGTH = 256                # tokens per text where neither --max-length nor the model says


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"            # loopback by default: exposing a model is the user's explicit choice
    port: int = 8000
    max_batch: int = 32                # texts per forward; 1 = batching off
    max_wait_ms: float = 5.0           # how long the first request of a batch waits for company
    timeout_s: float = 30.0            # per request, queueing included -> 504 (and the queued work is dropped)
    max_length: int | None = None      # tokens per text; None: DEFAULT_MAX_LENGTH, and for embeddings the model's
                                       # max_seq_length (as SentenceTransformer and `bertkit embed` read it)
    max_body_bytes: int = 64 * 1024    # counted while the body streams in -> 413
    max_text_chars: int = 10_000       # per string in a body -> 413
    max_inputs: int = 32               # texts per request (TEI `inputs`, OpenAI `input`, rerank `texts`) -> 422
    max_masks: int = 8                 # [MASK]s per fill-mask: joint decoding costs a forward per mask and beam
    max_top_k: int = 50                # fill-mask top_k
    max_beam_size: int = 16            # fill-mask beam_size
    max_json_depth: int = 32           # nesting of arrays / objects -> 400
    max_int: int = 1_000_000_000       # any integer literal beyond +-max_int -> 400
    read_timeout_s: float = 10.0       # to receive a whole request (headers and body) once it is awaited
    keep_alive_s: int = 5              # an idle keep-alive connection is closed after this
    max_connections: int = 256         # open connections (or in-flight requests) before 503
    max_batch_tokens: int = 2048       # tokens (texts x longest) per forward, as TEI's --max-batch-tokens
    max_client_connections: int = 64   # open connections per client address; more are answered 503 and closed
    max_client_tokens: int = 32768     # tokens a client address may have queued -> 429 with Retry-After
    max_queue_tokens: int = 262144     # tokens queued in all -> 503 with Retry-After
    max_client_errors: int = 20        # 4xx answers a second an address may cause (over ten seconds) before its
                                       # new connections are held a second and answered 429; 0: no brake
    api_key: str | None = None         # required as "Authorization: Bearer KEY" on every request (401 otherwise)

    def validate(self) -> "ServeConfig":
        """Raise a one-line ConfigError naming the first bad option (by its command-line flag)."""
        at_least = {"max_batch": 1, "max_length": 3, "max_body_bytes": 2, "max_text_chars": 1, "max_inputs": 1,
                    "max_masks": 1, "max_top_k": 1, "max_beam_size": 1, "max_json_depth": 2, "max_int": 1,
                    "keep_alive_s": 1, "max_connections": 1, "max_batch_tokens": 1, "max_client_connections": 1,
                    "max_client_tokens": 1, "max_queue_tokens": 1, "max_client_errors": 0}
        for name, low in at_least.items():
            value = getattr(self, name)
            if value is None and name == "max_length":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{flag(name)} must be an integer >= {low}, got {value!r}")
        for name, bound in (("timeout_s", "> 0"), ("read_timeout_s", "> 0"), ("max_wait_ms", ">= 0")):
            value = getattr(self, name)
            finite = isinstance(value, (int, float)) and math.isfinite(value)
            if not finite or not (value >= 0 if bound == ">= 0" else value > 0):
                raise ConfigError(f"{flag(name)} must be a finite number {bound}, got {value!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535, got {self.port!r}")
        if not isinstance(self.host, str) or not self.host.strip() or any(c.isspace() for c in self.host):
            raise ConfigError(f"--host must be a host name or address, got {self.host!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()
                                         or any(c.isspace() or not c.isprintable() for c in self.api_key)):
            raise ConfigError("--api-key must be a non-empty string without spaces")
        return self

    def describe(self) -> str:
        """The limits in one line, printed when the server starts."""
        shown = {**asdict(self), "max_length": self.max_length or f"model's (embeddings) / {DEFAULT_MAX_LENGTH}",
                 "api_key": "set" if self.api_key else "none"}       # never the key itself: logs are read by others
        return "limits: " + " ".join(f"{k}={v}" for k, v in shown.items() if k not in ("host", "port"))


_FLAGS = {"timeout_s": "--timeout", "read_timeout_s": "--read-timeout", "keep_alive_s": "--keep-alive"}


def flag(name: str) -> str:
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


class RequestError(Exception):
    """A client mistake: becomes a 4xx JSON response {"error": message}."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after      # seconds, sent as Retry-After (429 / 503: busy, not broken)


# ------------------------------------------------------------------------------------------------- bounded JSON

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _nesting(text: str) -> int:
    """Deepest nesting of arrays / objects, counted without parsing (strings removed first)."""
    depth = deepest = 0
    for c in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _bounded_int(limit: int):
    def parse(s: str) -> int:
        if len(s.lstrip("-")) > len(str(limit)) or abs(int(s)) > limit:
            raise RequestError(400, f"integer {s[:24]}{'...' if len(s) > 24 else ''} is beyond the limit of {limit}")
        return int(s)
    return parse


def _finite_float(s: str) -> float:
    value = float(s)
    if not math.isfinite(value):
        raise RequestError(400, f"number {s[:24]} is too large")
    return value


def _no_constant(s: str):
    raise RequestError(400, f"{s} is not JSON")


def parse_json(body: bytes, config: ServeConfig):
    """The body as JSON within the config's nesting / number / string limits (RequestError otherwise)."""
    if not body.strip():
        raise RequestError(400, "empty body: send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"malformed JSON: the body is not UTF-8 ({e.reason} at byte {e.start})") from None
    depth = _nesting(text)   # before parsing: the parser recurses once per level
    if depth > config.max_json_depth:
        raise RequestError(400, f"JSON nested {depth} deep; the limit is {config.max_json_depth}")
    try:
        value = json.loads(text, parse_int=_bounded_int(config.max_int), parse_float=_finite_float,
                           parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    _check_strings(value, config.max_text_chars, "")
    return value


def _check_strings(value, limit: int, where: str) -> None:
    if isinstance(value, str):
        if len(value) > limit:
            raise RequestError(413, f"field {where or 'body'!r} has {len(value)} characters; the limit is {limit}")
    elif isinstance(value, (dict, list)):
        for k, v in value.items() if isinstance(value, dict) else enumerate(value):
            _check_strings(v, limit, f"{where}.{k}" if where else str(k))
