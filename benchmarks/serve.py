"""Load test of `bertkit serve`: requests/s and p50/p99 latency at 1, 8 and 32 concurrent clients, batching on
(max_batch=32) vs off (max_batch=1), on 127.0.0.1 only.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/serve.py [--model DIR] [--endpoint embed]

Each setting starts its own `python -m bertkit serve` subprocess on a free loopback port (so the clients' threads do
not share the server's GIL) and fires a bounded number of requests (--requests per level, at most --max-seconds per
level): it always stops by itself. Batching on and off alternate level by level, repeated --repeats times; medians
are reported. The default model is MiniLM-L6 on /embed with BBC sentences of realistic length. Every response must be
a 200: the benchmark reports the failure count and exits 1 if it is not zero.
One JSON line at the end: ours (batching) vs reference (one-by-one) throughput and the ratio, per concurrency.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, max_batch: int, threads: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "bertkit", "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "--max-batch", str(max_batch), "--max-wait-ms", "5", "--threads", str(threads), "--max-length", "128"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not come up within 120 s")


def load(port: int, endpoint: str, bodies: list[bytes], clients: int, n_requests: int, max_seconds: float) -> dict:
    """`clients` threads, each with one keep-alive connection, share `n_requests` requests (or stop at max_seconds)."""
    lat: list[float] = []
    failures: list[str] = []
    counter = iter(range(n_requests))
    lock = threading.Lock()
    stop_at = time.monotonic() + max_seconds

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while time.monotonic() < stop_at:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            body = bodies[i % len(bodies)]
            t0 = time.perf_counter()
            try:
                conn.request("POST", f"/{endpoint}", body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                dt = time.perf_counter() - t0
                with lock:
                    if resp.status == 200:
                        lat.append(dt)
                    else:
                        failures.append(f"{resp.status}: {data[:200]!r}")
            except OSError as e:
                with lock:
                    failures.append(repr(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")  # noqa: E731
    return {"requests": len(lat), "failed": len(failures), "rps": len(lat) / wall, "p50_ms": q(0.50),
            "p99_ms": q(0.99), "first_failure": failures[0] if failures else None}


def sentences(n: int) -> list[str]:
    from bertkit.datasets import bbc_articles
    out = []
    for a in bbc_articles():
        for p in a.paragraphs:
            if 60 <= len(p) <= 300:
                out.append(p)
            if len(out) >= n:
                return out
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="model directory (default: MiniLM-L6)")
    ap.add_argument("--endpoint", default="embed")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=192, help="requests per (setting, concurrency, repeat)")
    ap.add_argument("--max-seconds", type=float, default=40.0, help="time cap per (setting, concurrency, repeat)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads in the server")
    args = ap.parse_args()
    if args.model is None:
        from bertkit.datasets import minilm_dir
        args.model = str(minilm_dir())
    field = {"embed": "text", "fill-mask": "text", "classify": "text", "tag": "text"}.get(args.endpoint, "text")
    texts = sentences(256)
    if args.endpoint == "fill-mask":
        texts = [" ".join(t.split()[:12] + ["[MASK]"] + t.split()[13:30]) for t in texts]
    bodies = [json.dumps({field: t}).encode() for t in texts]
    clients = [int(c) for c in args.clients.split(",")]
    servers = {name: start_server(args.model, mb, args.threads) for name, mb in (("batched", 32), ("one_by_one", 1))}
    results: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in clients} for n in servers}
    try:
        for _, port in servers.values():        # warm-up: first forwards allocate
            load(port, args.endpoint, bodies, 4, 16, 30)
        for rep in range(args.repeats):
            for c in clients:
                for name, (_, port) in servers.items():    # interleaved: background load hits both alike
                    r = load(port, args.endpoint, bodies, c, args.requests, args.max_seconds)
                    results[name][c].append(r)
                    print(f"rep {rep} {name:>10s} clients={c:>2d}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                          f"p99 {r['p99_ms']:7.1f} ms  ok {r['requests']}  failed {r['failed']}", file=sys.stderr)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=10)
    name = Path(args.model).parent.name if Path(args.model).name == "model" else Path(args.model).name
    summary = {"benchmark": "serve", "model": name, "endpoint": args.endpoint,
               "server_threads": args.threads, "levels": {}}
    failed = 0
    for c in clients:
        lvl = {}
        for name in servers:
            rs = results[name][c]
            failed += sum(r["failed"] for r in rs)
            lvl[name] = {"rps": round(statistics.median(r["rps"] for r in rs), 1),
                         "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 1),
                         "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 1),
                         "requests": sum(r["requests"] for r in rs), "failed": sum(r["failed"] for r in rs)}
        lvl["ratio_rps"] = round(lvl["batched"]["rps"] / lvl["one_by_one"]["rps"], 2)
        summary["levels"][str(c)] = lvl
    summary["failed_total"] = failed
    print(json.dumps(summary))
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
