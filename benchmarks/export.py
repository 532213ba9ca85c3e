"""ONNX export of MiniLM-L6 (encoder): accuracy vs PyTorch and CPU speed of onnxruntime beside ours.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/export.py

Exports with bertkit.export (dynamic batch/seq axes), checks max |onnxruntime - PyTorch| over three batch shapes
(padding included), then times one forward of each at (batch, seq) = (1, 32) and (8, 128), alternating PyTorch and
onnxruntime in the same process (median of --repeats). Ours runs with its default attention backend ("auto"); the
reference is onnxruntime with all graph optimisations on, both with the same number of threads (torch's default).
One JSON line: ours, the reference, and ratio = ours_s / onnxruntime_s (> 1: onnxruntime is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def time_both(model_dir: str | Path, onnx_path: str | Path, batch: int = 8, seq: int = 128, repeats: int = 10,
              threads: int | None = None) -> dict:
    """Median seconds per forward of PyTorch (our default backend) and onnxruntime, alternating, same inputs."""
    from bertkit.export import OUTPUTS, _Wrapped, _sample_inputs, inputs_of, onnx_session
    from bertkit.infer import Predictor
    pred = Predictor.load(model_dir)
    sess = onnx_session(onnx_path, threads=threads)
    wrapped = _Wrapped(pred.model.eval(), pred.task)
    names = OUTPUTS[pred.task]
    x = _sample_inputs(pred.tokenizer, batch, seq)
    args = tuple(x[n] for n in inputs_of(pred.model))
    feed = {n: a.numpy() for n, a in zip(inputs_of(pred.model), args)}
    runs = {"torch_s": lambda: wrapped(*args), "onnxruntime_s": lambda: sess.run(names, feed)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    with torch.inference_mode():
        for i in range(2 + repeats):                 # the first two: warm-up
            for key, run in runs.items():
                t0 = time.perf_counter()
                run()
                if i >= 2:
                    times[key].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="model directory (default: MiniLM-L6)")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    from bertkit.export import check_onnx, export_onnx
    if args.model is None:
        from bertkit.datasets import minilm_dir
        args.model = str(minilm_dir())
    default_threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        path = export_onnx(args.model, Path(tmp) / "model.onnx")
        check = check_onnx(args.model, path)
        speed = {}
        # 1 thread and torch's default: on a shared machine the 2-thread numbers swing with background load
        for threads in sorted({1, default_threads}):
            torch.set_num_threads(threads)
            for b, s in ((1, 32), (8, 128)):
                t = time_both(args.model, path, batch=b, seq=s, repeats=args.repeats, threads=threads)
                speed[f"{b}x{s}_threads{threads}"] = {
                    "ours_ms": round(t["torch_s"] * 1e3, 2), "onnxruntime_ms": round(t["onnxruntime_s"] * 1e3, 2),
                    "ratio": round(t["torch_s"] / t["onnxruntime_s"], 3)}
        torch.set_num_threads(default_threads)
        threads = default_threads
    print(json.dumps({"benchmark": "export", "model": Path(args.model).parent.name if Path(args.model).name == "model"
                      else Path(args.model).name, "threads": threads, "max_abs_diff": check["max_abs_diff"],
                      "task": check["task"], "speed": speed}))


if __name__ == "__main__":
    main()
