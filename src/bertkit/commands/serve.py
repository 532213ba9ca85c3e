"""`bertkit serve MODEL --port 8000`: the HTTP JSON API (thin over bertkit.serve)."""

from __future__ import annotations


def register(sub) -> None:
    from bertkit.serve import ServeConfig
    d = ServeConfig()
    p = sub.add_parser("serve", help="serve a model over HTTP/JSON with dynamic batching")
    p.add_argument("model", help="model directory (endpoints follow its head)")
    p.add_argument("--host", default=d.host, help=f"bind address (default {d.host}: loopback only)")
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="requests per forward; 1 = no batching")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, help="how long a batch waits to fill")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars)
    p.add_argument("--max-length", type=int, default=d.max_length, help="tokens per text (longer is truncated)")
    p.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds per request before 504")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    p.set_defaults(func=run)


def run(args) -> int:
    from bertkit.serve import ServeConfig, serve_model
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    cfg = ServeConfig(host=args.host, port=args.port, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                      max_body_bytes=args.max_body_bytes, max_text_chars=args.max_text_chars,
                      timeout_s=args.timeout, max_length=args.max_length)
    serve_model(args.model, cfg, verbose=args.verbose)
    return 0
