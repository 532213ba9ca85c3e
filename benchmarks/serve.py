"""Load test of `bertkit serve` (FastAPI + uvicorn): requests/s and p50/p99 latency at 1, 8 and 32 concurrent
clients, batching on (max_batch=32) and off (max_batch=1), against the stdlib server bertkit had before (its
serve.py taken from git history into a temp dir, batching on), on 127.0.0.1 only.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/serve.py [--model DIR] [--endpoint embed]

Each setting starts its own server subprocess on a free loopback port (so the clients' threads do not share the
server's GIL) and fires a bounded number of requests (--requests per level, at most --max-seconds per level): it
always stops by itself. The settings alternate level by level, repeated --repeats times, each repeat starting the
level at another setting (a fixed order biases: repeats a multiple of the settings' number balance it); medians are
reported. The default model is MiniLM-L6 on /embed with BBC sentences of realistic length, sent as {"text": ...},
which both servers take. Every response must be a 200: the benchmark reports the failure count and exits 1 if it is
not zero.
One JSON line at the end: per concurrency, ours (batched), ours one by one, the stdlib reference (batched), and
ratio_rps = ours / reference (and batching_ratio = ours / ours one by one). --baseline SRC adds bertkit served from
another checkout's src (same options): ratio_to_baseline_rps = ours / it, and cpu_ratio_to_baseline = its server's
CPU time per request / ours (Linux): on a shared machine other jobs move requests/s far more than CPU per request.
Beside it, per server: its event loop's share of that CPU, and model forwards per request (from /health), which say
whether a difference is the request path's or the batching's.

    .venv/bin/python benchmarks/serve.py --attack [--normal 16] [--seconds 15] [--baseline /path/to/old/src]

--attack is the fairness test: one server with its default limits, --normal clients (each from its own loopback
address, 127.0.1.N) alone, then beside 2 heavy clients sending the largest legal /embed request (32 texts cut at
256 tokens; 127.0.0.2, .3), a 300-socket idle flood (127.0.0.4) and a malformed-request flood (127.0.0.5), each in
its own process, then alone again. It exits 1 unless the normal clients got no refusal and no 5xx and their p50
stayed within max(3x, +100 ms) of the quiet p50 under attack and after it.
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
            "--max-batch", str(max_batch), "--max-wait-ms", "5", "--threads", str(threads)]


def start_server(kind: str, args, max_batch: int, ref_dir: Path | None, src: Path = REPO / "src",
                 extra: tuple = ("--max-length", "128")) -> tuple[subprocess.Popen, int]:
    """A server subprocess of `kind` running bertkit from `src`; waits for its /health."""
    port = free_port()
    cmd = server_command(kind, args.model, port, max_batch, args.threads, ref_dir) + list(extra)
    # a file, not a pipe: a server logging every malformed request would block on a full pipe nobody reads
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log,
                            env={**os.environ, "PYTHONPATH": str(src)})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise SystemExit(f"server exited: {log.read().decode()[-2000:]}")
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


def cpu_seconds(pid: int, main_thread: bool = False) -> float | None:
    """User + system CPU seconds a process has used, all its threads or its main one (the server's event loop;
    the rest is the batchers' and the forwards') (Linux's /proc; None elsewhere)."""
    try:
        stat = f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat"
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def forwards(port: int) -> int | None:
    """Model forwards a bertkit server has run so far, all routes (its /health counters; None for the reference)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        batches = json.loads(conn.getresponse().read()).get("batches")
        conn.close()
    except (OSError, ValueError):
        return None
    return sum(b["batches"] for b in batches.values()) if isinstance(batches, dict) else None


def meters(proc: subprocess.Popen, port: int) -> tuple:
    """(CPU seconds of all its threads, of its event loop, forwards run) of a server so far."""
    return cpu_seconds(proc.pid), cpu_seconds(proc.pid, main_thread=True), forwards(port)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:     # still closing connections: it has been measured, so stop it hard
        proc.kill()
        proc.wait(timeout=10)


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


SETTINGS = {"ours": ("ours", 32), "ours_one_by_one": ("ours", 1), "reference": ("reference", 32),
            "baseline": ("ours", 32)}


def run_levels(args, bodies: list[bytes], clients: list[int], ref_dir: Path | None) -> dict:
    """setting -> clients -> one load() result per repeat; the settings alternate so background load hits all."""
    names = [n for n in SETTINGS if (n != "reference" or ref_dir is not None) and (n != "baseline" or args.baseline)]
    servers = {}
    try:
        for n in names:
            src = Path(args.baseline) if n == "baseline" else REPO / "src"
            servers[n] = start_server(SETTINGS[n][0], args, SETTINGS[n][1], ref_dir, src)
        results: dict[str, dict[int, list[dict]]] = {n: {c: [] for c in clients} for n in servers}
        for _, port in servers.values():        # warm-up: first forwards allocate
            load(port, args.endpoint, bodies, 4, 16, 30)
        order = list(servers.items())
        for rep in range(args.repeats):
            for i, c in enumerate(clients):
                # each repeat starts the level at another setting: the one measured first after a level change can
                # read dearer (the same code's event loop, first: 1.35-1.51 ms a request; last: 0.94-1.20)
                k = (rep + i) % len(order)
                for name, (proc, port) in order[k:] + order[:k]:
                    before = meters(proc, port)
                    r = load(port, args.endpoint, bodies, c, args.requests, args.max_seconds)
                    n = max(r["requests"], 1)
                    # per request: CPU ms in all threads and in the event loop, forwards (fewer: fuller batches)
                    for key, a, b, scale in zip(("cpu_ms", "loop_cpu_ms", "forwards"), meters(proc, port), before,
                                                (1000, 1000, 1)):
                        r[key] = None if a is None or b is None else (a - b) * scale / n
                    results[name][c].append(r)
                    print(f"rep {rep} {name:>16s} clients={c:>2d}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                          f"p99 {r['p99_ms']:7.1f} ms  cpu/request {r['cpu_ms'] or 0:6.2f} ms (event loop "
                          f"{r['loop_cpu_ms'] or 0:5.2f})  forwards/request {r['forwards'] or 0:5.3f}  "
                          f"ok {r['requests']}  "
                          f"failed {r['failed']}", file=sys.stderr)
        return results
    finally:
        for proc, _ in servers.values():
            stop_server(proc)


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
            for key, out in (("cpu_ms", "cpu_ms_per_request"), ("loop_cpu_ms", "event_loop_cpu_ms_per_request"),
                             ("forwards", "forwards_per_request")):
                if all(r[key] is not None for r in rs):
                    lvl[name][out] = round(statistics.median(r[key] for r in rs), 3 if key == "forwards" else 2)
        lvl["batching_ratio"] = round(lvl["ours"]["rps"] / lvl["ours_one_by_one"]["rps"], 2)
        if "reference" in lvl:
            lvl["ratio_rps"] = round(lvl["ours"]["rps"] / lvl["reference"]["rps"], 2)
        if "baseline" in lvl:
            lvl["ratio_to_baseline_rps"] = round(lvl["ours"]["rps"] / lvl["baseline"]["rps"], 2)
            if "cpu_ms_per_request" in lvl["baseline"] and "cpu_ms_per_request" in lvl["ours"]:
                lvl["cpu_ratio_to_baseline"] = round(lvl["baseline"]["cpu_ms_per_request"]
                                                     / lvl["ours"]["cpu_ms_per_request"], 2)
        levels[str(c)] = lvl
    return {"levels": levels, "failed_total": failed}


# ------------------------------------------------------------------------------------------- --attack: fairness

MALFORMED = [b"GARBAGE / HTTP/1.1\r\n\r\n",
             b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{\"inputs\"",
             b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n"
             b"{\"text\": 5}}",
             b"POST /embed HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
             b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n"]


def _post_loop(port: int, source: str, bodies: list[bytes], stop: threading.Event, out: list) -> None:
    """One client at `source` posting to /embed back to back on a keep-alive connection: (status, seconds) each; a
    connection error counts as status 0 (a refusal)."""
    conn, i = None, 0
    while not stop.is_set():
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120, source_address=(source, 0))
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/embed", body=bodies[i % len(bodies)], headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            status = resp.status
            if (resp.getheader("connection") or "").lower() == "close":
                conn.close()
                conn = None
        except OSError:
            status = 0
            conn.close()
            conn = None
        out.append((status, time.perf_counter() - t0))
        i += 1
    if conn is not None:
        conn.close()


def _idle_flood(port: int, source: str, n: int, stop: threading.Event, counts: dict) -> None:
    """Holds n sockets that never send a byte, and opens a new one whenever the server closes one."""
    import selectors
    sel = selectors.DefaultSelector()

    def open_one():
        s = socket.socket()
        s.setblocking(False)
        try:
            s.bind((source, 0))
            s.connect_ex(("127.0.0.1", port))
            sel.register(s, selectors.EVENT_READ)
            counts["opened"] = counts.get("opened", 0) + 1
        except OSError:
            s.close()
            counts["open_errors"] = counts.get("open_errors", 0) + 1
            time.sleep(0.01)
    for _ in range(n):
        open_one()
    while not stop.is_set():
        for key, _ in sel.select(0.2):
            sel.unregister(key.fileobj)
            key.fileobj.close()
            counts["closed_by_server"] = counts.get("closed_by_server", 0) + 1
            open_one()
    for key in list(sel.get_map().values()):
        key.fileobj.close()


def _malformed_flood(port: int, source: str, stop: threading.Event, counts: dict) -> None:
    i = 0
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
                s.sendall(MALFORMED[i % len(MALFORMED)])
                status = s.recv(4096)[9:12].decode(errors="replace") or "closed"
            counts[status] = counts.get(status, 0) + 1
        except OSError:
            counts["error"] = counts.get("error", 0) + 1
        i += 1


def _latency(lat: list[float]) -> dict:
    lat = sorted(lat)
    q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 1) if lat else None  # noqa: E731
    return {"p50_ms": q(0.5), "p99_ms": q(0.99)}


def _attacker(kind: str, port: int, source: str, heavy: bytes, seconds: float, results) -> None:
    """One attacker in its own process (the clients' GIL is not the server's bottleneck), for `seconds`."""
    stop, out = threading.Event(), {}
    if kind == "heavy":
        done: list = []
        threads = [threading.Thread(target=_post_loop, args=(port, source, [heavy], stop, done))]
    elif kind == "idle":
        threads = [threading.Thread(target=_idle_flood, args=(port, source, 300, stop, out))]
    else:
        threads = [threading.Thread(target=_malformed_flood, args=(port, source, stop, out))]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    if kind == "heavy":
        out = {"requests": len(done), "ok": sum(s == 200 for s, _ in done),
               **_latency([dt for s, dt in done if s == 200]), "statuses": sorted({s for s, _ in done})}
    results.put((f"{kind} {source}", out))


ATTACKERS = {"heavy": ("127.0.0.2", "127.0.0.3"), "idle": ("127.0.0.4",), "malformed": ("127.0.0.5",)}


def attack_phase(port: int, bodies: list[bytes], heavy: bytes, args, attackers: list[str]) -> dict:
    """args.normal clients (each at its own address 127.0.1.N) for args.seconds, beside the attackers: 2 heavy
    clients (127.0.0.2, .3), a 300-socket idle flood (127.0.0.4), a malformed-request flood (127.0.0.5)."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    stop, normal, results = threading.Event(), [], ctx.Queue()
    procs = [ctx.Process(target=_attacker, args=(kind, port, source, heavy, args.seconds, results))
             for kind in attackers for source in ATTACKERS[kind]]
    threads = [threading.Thread(target=_post_loop, args=(port, f"127.0.1.{i + 1}", bodies[i::args.normal], stop,
                                                         normal)) for i in range(args.normal)]
    for p in procs:
        p.start()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    statuses = [s for s, _ in normal]
    out = {"normal": {"requests": len(normal), "rps": round(len(normal) / wall, 1),
                      **_latency([dt for s, dt in normal if s == 200]),
                      "refused": sum(s in (0, 429, 503) for s in statuses), "5xx": sum(s >= 500 for s in statuses),
                      "other_failed": sum(s not in (0, 200, 429) and s < 500 for s in statuses)}}
    out.update(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    return out


def attack_server(args, src: Path, bodies: list[bytes], heavy: bytes) -> dict:
    """Quiet, attacked, quiet again, on one server running bertkit from src with its default limits."""
    proc, port = start_server("ours", args, 32, None, src, extra=())
    try:
        load(port, "embed", bodies, 4, 16, 30)                                            # warm-up
        attackers = args.attackers.split(",")
        phases = {name: attack_phase(port, bodies, heavy, args, attackers if name == "attack" else [])
                  for name in ("quiet", "attack", "after")}
    finally:
        stop_server(proc)
    quiet = phases["quiet"]["normal"]["p50_ms"]
    bound = max(3 * quiet, quiet + 100) if quiet else None
    holds = {phase: bool(bound) and phases[phase]["normal"]["p50_ms"] is not None
             and phases[phase]["normal"]["p50_ms"] <= bound and not phases[phase]["normal"]["refused"]
             and not phases[phase]["normal"]["5xx"] for phase in ("attack", "after")}
    print(f"{src}: {json.dumps(phases)}", file=sys.stderr)
    return {**phases, "p50_bound_ms": bound, "holds": holds}


def attack_main(args) -> None:
    texts = sentences(256)
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    long = " ".join(texts)[:1900]                  # ~400 tokens: cut to the model's 256 by truncate
    heavy = json.dumps({"inputs": [long] * 32, "truncate": True}).encode()
    result = {"benchmark": "serve --attack", "model": Path(args.model).name, "normal_clients": args.normal,
              "seconds_per_phase": args.seconds, "ours": attack_server(args, REPO / "src", bodies, heavy)}
    if args.baseline:
        result["baseline"] = attack_server(args, Path(args.baseline), bodies, heavy)
    print(json.dumps(result))
    if not all(result["ours"]["holds"].values()):
        raise SystemExit(1)


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
    ap.add_argument("--baseline", metavar="SRC", help="also serve bertkit from this src directory (an earlier "
                                                      "checkout's), same options: ratio_to_baseline_rps")
    ap.add_argument("--attack", action="store_true", help="the fairness test instead (see serve_attack)")
    ap.add_argument("--seconds", type=float, default=15.0, help="--attack: seconds per phase")
    ap.add_argument("--normal", type=int, default=16, help="--attack: normal clients")
    ap.add_argument("--attackers", default="heavy,idle,malformed", help="--attack: which attackers run")
    args = ap.parse_args()
    if args.model is None:
        from bertkit.datasets import minilm_dir
        args.model = str(minilm_dir())
    if args.attack:
        return attack_main(args)
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
