"""`bertkit serve MODEL --port 8000`: the HTTP JSON API (thin over bertkit.serve; needs the `serve` extra)."""

from __future__ import annotations

import os

from bertkit.commands import add_model_argument, add_precision_argument, checks, inference_precision
from bertkit.serve.limits import ServeConfig, require_serve_extra


def register(sub) -> None:
    d = ServeConfig()
    p = sub.add_parser("serve", help="serve a model over HTTP/JSON with dynamic batching (pip install 'bertkit[serve]')")
    add_model_argument(p, "model directory (endpoints follow its head)")
    p.add_argument("--host", default=d.host, help=f"bind address (default {d.host}: loopback only)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="texts per forward; 1 = no batching")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, help="how long a batch waits to fill")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars)
    p.add_argument("--max-length", type=int, default=d.max_length,
                   help="tokens per text (default: the model's max_seq_length for embeddings, 256 otherwise)")
    p.add_argument("--max-inputs", type=int, default=d.max_inputs, help="texts per request")
    p.add_argument("--max-masks", type=int, default=d.max_masks, help="[MASK]s per fill-mask request")
    p.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds per request before 504")
    p.add_argument("--read-timeout", type=float, default=d.read_timeout_s,
                   help="seconds to receive a whole request before the connection is closed")
    p.add_argument("--keep-alive", type=int, default=d.keep_alive_s, help="seconds an idle connection stays open")
    p.add_argument("--max-connections", type=int, default=d.max_connections, help="open connections before 503")
    p.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens,
                   help="padded tokens (texts x longest) per forward; longer requests are split and interleaved")
    p.add_argument("--max-client-connections", type=int, default=d.max_client_connections,
                   help="open connections per client address before 503")
    p.add_argument("--max-client-tokens", type=int, default=d.max_client_tokens,
                   help="tokens a client address may have queued before 429 (with Retry-After)")
    p.add_argument("--max-queue-tokens", type=int, default=d.max_queue_tokens,
                   help="tokens queued in all before 503 (with Retry-After)")
    p.add_argument("--max-client-errors", type=int, default=d.max_client_errors,
                   help="4xx answers a second a client address may cause (over ten seconds) before its new "
                        "connections get 429; 0: off")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request "
                                      "(default: $BERTKIT_API_KEY, else none)")
    # the options above are checked by ServeConfig.validate (one line naming the flag); this one is not
    p.add_argument("--threads", type=checks.number(int, 0, 1024), default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    add_precision_argument(p)
    p.set_defaults(func=run)


def _api_key(args) -> str | None:
    # the environment keeps the key out of `ps`; an empty variable means none, an empty --api-key is a mistake
    return args.api_key if args.api_key is not None else os.environ.get("BERTKIT_API_KEY") or None


def run(args) -> int:
    cfg = ServeConfig(host=args.host, port=args.port, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                      max_body_bytes=args.max_body_bytes, max_text_chars=args.max_text_chars,
                      timeout_s=args.timeout, max_length=args.max_length, max_inputs=args.max_inputs,
                      max_masks=args.max_masks, read_timeout_s=args.read_timeout, keep_alive_s=args.keep_alive,
                      max_connections=args.max_connections, max_batch_tokens=args.max_batch_tokens,
                      max_client_connections=args.max_client_connections,
                      max_client_tokens=args.max_client_tokens, max_queue_tokens=args.max_queue_tokens,
                      max_client_errors=args.max_client_errors, api_key=_api_key(args)).validate()
    require_serve_extra()
    # deferred: torch and the serve extra (uvicorn), loaded once the extra is checked
    from bertkit.serve.server import serve_model
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    serve_model(args.model, cfg, verbose=args.verbose, precision=inference_precision(args, "serve"))
    return 0
