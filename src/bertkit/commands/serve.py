"""`bertkit serve MODEL --port 8000`: the HTTP JSON API (thin over bertkit.serve; needs the `serve` extra)."""

from __future__ import annotations

import os

from bertkit.commands import add_model_argument, add_precision_argument, checks, config_from, inference_precision
from bertkit.serve.limits import ServeConfig, flag, require_serve_extra

# ServeConfig's limits as flags of the same dest (serve.limits.flag spells each), in -h order: (field, type, help)
_LIMITS = (
    ("port", int, None),
    ("max_batch", int, "texts per forward; 1 = no batching"),
    ("max_wait_ms", float, "how long a batch waits to fill"),
    ("max_body_bytes", int, None),
    ("max_text_chars", int, None),
    ("max_length", int, "tokens per text (default: the model's max_seq_length for embeddings, 256 otherwise)"),
    ("max_inputs", int, "texts per request"),
    ("max_masks", int, "[MASK]s per fill-mask request"),
    ("timeout_s", float, "seconds per request before 504"),
    ("read_timeout_s", float, "seconds to receive a whole request before the connection is closed"),
    ("keep_alive_s", int, "seconds an idle connection stays open"),
    ("max_connections", int, "open connections before 503"),
    ("max_batch_tokens", int, "tokens (texts x longest) per forward, padding up to twice it while all queued "
                              "work fits; longer requests are split and interleaved"),
    ("max_client_connections", int, "open connections per client address before 503"),
    ("max_client_tokens", int, "tokens a client address may have queued before 429 (with Retry-After)"),
    ("max_queue_tokens", int, "tokens queued in all before 503 (with Retry-After)"),
    ("max_client_errors", int, "4xx answers a second a client address may cause (over ten seconds) before its new "
                               "connections get 429; 0: off"),
)


def register(sub) -> None:
    d = ServeConfig()
    p = sub.add_parser("serve", help="serve a model over HTTP/JSON with dynamic batching (pip install 'bertkit[serve]')")
    add_model_argument(p, "model directory (endpoints follow its head)")
    p.add_argument("--host", default=d.host, help=f"bind address (default {d.host}: loopback only)")
    for name, kind, text in _LIMITS:
        option = flag(name)
        p.add_argument(option, dest=name, metavar=option[2:].upper().replace("-", "_"), type=kind,
                       default=getattr(d, name), help=text)
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request "
                                      "(default: $BERTKIT_API_KEY, else none)")
    # the options above are checked by ServeConfig.validate (one line naming the flag); this one is not
    p.add_argument("--threads", type=checks.number(int, 0, 1024), default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    add_precision_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    # the environment keeps the key out of `ps`; an empty variable means none, an empty --api-key is a mistake
    api_key = args.api_key if args.api_key is not None else os.environ.get("BERTKIT_API_KEY") or None
    cfg = config_from(ServeConfig, args, api_key=api_key).validate()
    require_serve_extra()
    # deferred: torch and the serve extra (uvicorn), loaded once the extra is checked
    from bertkit.serve.server import serve_model
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    serve_model(args.model, cfg, verbose=args.verbose, precision=inference_precision(args, "serve"))
    return 0
