"""Load test of `bertkit serve` (FastAPI + uvicorn): requests/s and p50/p99 latency at 1, 8 and 32 concurrent
clients, batching on (max_batch=32) and off (max_batch=1), against the stdlib server bertkit had before (its
serve.py taken from git history into a temp dir, batching on), on 127.0.0.1 only.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/serve.py [--model DIR] [--endpoint embed]

Each setting starts its own server subprocess on a free loopback port (so the clients' threads do not share the
server's GIL) and fires a bounded number of requests (--requests per level, at most --max-seconds per level): it
always stops by itself. The settings alternate level by level, repeated --repeats times; medians are reported. The
default model is MiniLM-L6 on /embed with BBC sentences of realistic length, sent as {"text": ...}, which both servers
take. Every response must be a 200: the benchmark reports the failure count and exits 1 if it is not zero.
One JSON line at the end: per concurrency, ours (batched), ours one by one, the stdlib reference (batched), and
ratio_rps = ours / reference (and batching_ratio = ours / ours one by one).
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
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# runs the pre-FastAPI server (a copy of its serve.py, importable as `stdlib_serve`) with the same options as ours
REFERENCE_RUNNER = """
import sys
sys.path.insert(0, sys.argv[1])
import torch
import stdlib_serve as s
torch.set_num_threads(int(sys.argv[5]))
s.serve_model(sys.argv[2], s.ServeConfig(host="127.0.0.1", port=int(sys.argv[3]), max_batch=int(sys.argv[4]),
                                         max_wait_ms=5, max_length=128))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference_source(tmp: Path) -> Path | None:
    """The stdlib serve.py from before FastAPI, written to tmp/stdlib_serve.py (None outside a git checkout)."""
    git = ["git", "-C", str(REPO)]
    gone = subprocess.run(git + ["rev-list", "-n", "1", "HEAD", "--", "src/bertkit/serve.py"], capture_output=True,
                          text=True)
    if gone.returncode != 0 or not gone.stdout.strip():
        return None
    src = subprocess.run(git + ["show", f"{gone.stdout.strip()}^:src/bertkit/serve.py"], capture_output=True, text=True)
    if src.returncode != 0:
        return None
    (tmp / "stdlib_serve.py").write_text(src.stdout, encoding="utf-8")
    return tmp


def server_command(kind: str, model: str, port: int, max_batch: int, threads: int, ref_dir: Path | None) -> list:
    if kind == "reference":
        return [sys.executable, "-c", REFERENCE_RUNNER, str(ref_dir), model, str(port), str(max_batch), str(threads)]
    return [sys.executable, "-m", "bertkit", "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--max-batch", str(max_batch), "--max-wait-ms", "5", "--threads", str(threads), "--max-length", "128"]


def start_server(kind: str, args, max_batch: int, ref_dir: Path | None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = server_command(kind, args.model, port, max_batch, args.threads, ref_dir)
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


SETTINGS = {"ours": ("ours", 32), "ours_one_by_one": ("ours", 1), "reference": ("reference", 32)}


def run_levels(args, bodies: list[bytes], clients: list[int], ref_dir: Path | None) -> dict:
    """setting -> clients -> one load() result per repeat; the settings alternate so background load hits all."""
    names = [n for n in SETTINGS if n != "reference" or ref_dir is not None]
    servers = {}
    try:
        for n in names:
            servers[n] = start_server(SETTINGS[n][0], args, SETTINGS[n][1], ref_dir)
        results: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in clients} for n in servers}
        for _, port in servers.values():        # warm-up: first forwards allocate
            load(port, args.endpoint, bodies, 4, 16, 30)
        for rep in range(args.repeats):
            for c in clients:
                for name, (_, port) in servers.items():
                    r = load(port, args.endpoint, bodies, c, args.requests, args.max_seconds)
                    results[name][c].append(r)
                    print(f"rep {rep} {name:>16s} clients={c:>2d}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                          f"p99 {r['p99_ms']:7.1f} ms  ok {r['requests']}  failed {r['failed']}", file=sys.stderr)
        return results
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=10)


def summarize(results: dict, clients: list[int]) -> dict:
    levels, failed = {}, 0
    for c in clients:
        lvl = {}
        for name, per_level in results.items():
            rs = per_level[c]
            failed += sum(r["failed"] for r in rs)
            lvl[name] = {"rps": round(statistics.median(r["rps"] for r in rs), 1),
                         "p50_ms": round(statistics.median(r["p50_ms"] for r in rs), 1),
                         "p99_ms": round(statistics.median(r["p99_ms"] for r in rs), 1),
                         "requests": sum(r["requests"] for r in rs), "failed": sum(r["failed"] for r in rs)}
        lvl["batching_ratio"] = round(lvl["ours"]["rps"] / lvl["ours_one_by_one"]["rps"], 2)
        if "reference" in lvl:
            lvl["ratio_rps"] = round(lvl["ours"]["rps"] / lvl["reference"]["rps"], 2)
        levels[str(c)] = lvl
    return {"levels": levels, "failed_total": failed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="model directory (default: MiniLM-L6)")
    ap.add_argument("--endpoint", default="embed")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=192, help="requests per (setting, concurrency, repeat)")
    ap.add_argument("--max-seconds", type=float, default=40.0, help="time cap per (setting, concurrency, repeat)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads in the server")
    ap.add_argument("--no-reference", action="store_true", help="skip the stdlib server from git history")
    args = ap.parse_args()
    if args.model is None:
        from bertkit.datasets import minilm_dir
        args.model = str(minilm_dir())
    texts = sentences(256)
    if args.endpoint == "fill-mask":
        texts = [" ".join(t.split()[:12] + ["[MASK]"] + t.split()[13:30]) for t in texts]
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    clients = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        ref_dir = None if args.no_reference else reference_source(Path(tmp))
        if ref_dir is None and not args.no_reference:
            print("no reference: src/bertkit/serve.py is not in this checkout's git history", file=sys.stderr)
        results = run_levels(args, bodies, clients, ref_dir)
    name = Path(args.model).parent.name if Path(args.model).name == "model" else Path(args.model).name
    summary = {"benchmark": "serve", "model": name, "endpoint": args.endpoint, "server_threads": args.threads,
               "reference": "stdlib http.server (bertkit before FastAPI)" if ref_dir else None,
               **summarize(results, clients)}
    print(json.dumps(summary))
    if summary["failed_total"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
