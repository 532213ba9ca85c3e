"""Exact top-k search over a large EmbeddingIndex: queries/s and the searching process's peak RSS.

Builds (once, reused) an index of random unit vectors, then searches it in a fresh process so the peak RSS is
the search's own (the index stays on disk, memory-mapped; the file is 768 MB at the defaults).

    python benchmarks/embed_index_search.py                              # 1M x 384 float16, 1000 queries, top 10
    python benchmarks/embed_index_search.py --count 200000 --dtype int8 --dir /tmp/idx-int8
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def _unit(rng, n: int, dim: int):
    import numpy as np
    v = rng.standard_normal((n, dim), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def build(directory: Path, count: int, dim: int, dtype: str) -> float:
    import numpy as np
    from bertkit.embed.index import IndexWriter
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    writer = IndexWriter(directory, count, dim, "sha256:benchmark", dtype)
    chunk = 100_000
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        writer.add(_unit(rng, n, dim), range(start, start + n))
    writer.commit()
    return time.perf_counter() - t0


def search(directory: Path, queries: int, k: int, block: int) -> dict:
    import numpy as np
    import psutil
    from bertkit.embed.index import EmbeddingIndex
    index = EmbeddingIndex.open(directory)
    q = _unit(np.random.default_rng(1), queries, index.dim)
    before = psutil.Process().memory_info().rss / 2 ** 20
    t0 = time.perf_counter()
    res = index.search(q, k=k, corpus_block=block)
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"count": len(index), "dim": index.dim, "dtype": index.manifest["dtype"], "queries": queries, "k": k,
            "corpus_block": block, "search_s": round(dt, 2), "queries_per_s": round(queries / dt, 1),
            "rss_before_search_mb": round(before), "peak_rss_mb": round(peak), "best_score_q0": float(res.scores[0, 0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--block", type=int, default=32768)
    ap.add_argument("--dir", default="/tmp/bertkit-bench-index")
    ap.add_argument("--search-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    directory = Path(args.dir)
    if args.search_only:
        print(json.dumps(search(directory, args.queries, args.k, args.block)))
        return
    manifest = directory / "manifest.json"
    want = {"count": args.count, "dim": args.dim, "dtype": args.dtype}
    if not manifest.is_file() or {k: json.loads(manifest.read_text())[k] for k in want} != want:
        print(json.dumps({"built_s": round(build(directory, args.count, args.dim, args.dtype), 1), **want}))
    out = subprocess.run([sys.executable, __file__, "--search-only", "--dir", str(directory), "--queries",
                          str(args.queries), "--k", str(args.k), "--block", str(args.block)],
                         capture_output=True, text=True, check=True)
    print(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
