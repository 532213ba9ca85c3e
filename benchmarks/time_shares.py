"""Where the inference time goes: achieved FLOP/s against this CPU's peak, and the share of time per op class.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/time_shares.py [--models minilm,base] [--repeats 3]

For MiniLM-L6 (the real all-MiniLM-L6-v2 weights) and BERT-base shape (random weights), at batch 32 and 1, on real
BBC sentences (bertkit.datasets, up to 128 tokens, as benchmarks/quantize.py): bertkit frozen fp32, bf16 autocast
(where the CPU has native bf16) and int8 (runtime.int8, fp32 activations, the int8 kernel forced on even where the
probe would run float here: this is the kernel's profile). One JSON line per (model, batch, precision):
  seq_per_s          median of `repeats` timed passes over the texts (no profiler)
  gflop_per_s        useful FLOPs (linear layers on real tokens + attention over each sentence's own length, no
                     padding) over that time
  peak_gflop_per_s   this CPU's peak for the dtype, measured, not computed from a spec sheet: fp32 and bf16 the
                     best 2048^3 matmul rate (bertkit.train.monitor.peak_flops, cached in ~/.cache/bertkit), int8
                     the best 2048^3 int8 GEMM rate of PyTorch's int8 kernels (quantized::linear_dynamic on each
                     engine, activation quantization included)
  of_peak            gflop_per_s / peak; "linear_of_peak": the linear layers' FLOPs over the time the profile
                     gives the linear ops alone, against the same peak
  share              of the profiled forward's time per op class (profiler self CPU time of each op): linear,
                     attention (SDPA, softmax, batched matmuls), norm, activation, quantize (outside a kernel:
                     quantized::linear_dynamic quantizes inside and counts as linear), layout (bucket grids:
                     copies, index ops, cat, fill), other ops, and python: wall time no op accounts for (module
                     calls, dispatch, the padding layout's Python)
The machine's other load moves every figure; the shares and fractions move less than the rates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quantize import batches_of, bbc_sentences, emit, emit_all, model_dir_for, work_dir  # noqa: E402

from bertkit import runtime  # noqa: E402
from bertkit.hardware import native_bf16  # noqa: E402

# op class -> substrings of profiler op names, first match wins (checked in this order)
CLASSES = {
    "linear": ("linear", "addmm", "aten::mm", "matmul", "qlinear", "_int_mm"),
    "attention": ("scaled_dot_product", "flash_attention", "softmax", "bmm", "baddbmm"),
    "norm": ("layer_norm", "rms_norm"),
    "activation": ("gelu", "tanh", "relu", "silu"),
    "quantize": ("quantize", "aminmax", "int_repr"),
    "layout": ("index", "copy_", "cat", "fill_", "zero_", "gather", "scatter", "masked", "nonzero", "pad"),
}


def int8_peak(n: int = 2048) -> float:
    """The best rate of an n^3 int8 GEMM through PyTorch's int8 kernels here (activation quantization included),
    kept as the best ever seen on this CPU and thread count, as peak_flops keeps the float ones (load reads low)."""
    from bertkit.hardware import cpu_signature
    from bertkit.runtime.int8 import ENGINES, Int8Linear, int8_kernel_ok
    from bertkit.train.monitor import _remember_peak
    g = torch.Generator().manual_seed(0)
    x, lin = torch.randn(n, n, generator=g), torch.nn.Linear(n, n)
    best = 0.0
    with torch.inference_mode():
        for engine in [e for e in ENGINES if int8_kernel_ok(e)]:
            q = Int8Linear.from_float(lin)
            q.engine = engine
            q(x)
            for _ in range(3):
                t = time.perf_counter()
                q(x)
                best = max(best, 2.0 * n ** 3 / (time.perf_counter() - t))
    return _remember_peak(f"{cpu_signature()}|threads={torch.get_num_threads()}|int8", best)


def peaks() -> dict[str, float]:
    from bertkit.train.monitor import peak_flops
    out = {"fp32": peak_flops(torch.device("cpu"), torch.float32), "int8": int8_peak()}
    if native_bf16("cpu"):
        out["bf16"] = peak_flops(torch.device("cpu"), torch.bfloat16)
    return out


def useful_flops(config, batches: list[dict]) -> tuple[float, float]:
    """(linear, attention) FLOPs of the encoder on the batches' real tokens: each sentence attends over its own
    length only, as the unpadded path computes it."""
    h, f, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    lengths = torch.cat([b["attention_mask"].sum(1) for b in batches]).double()
    linear = 2.0 * float(lengths.sum()) * (4 * h * h + 2 * h * f) * layers
    attention = 4.0 * float((lengths ** 2).sum()) * h * layers        # QK^T and PV
    return linear, attention


def op_class(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CLASSES.items() if any(k in low for k in keys)), "other")


def profile_shares(fn, bs: list[dict]) -> tuple[dict[str, float], float]:
    """Share of one pass's wall time per op class (self CPU time, top-level profiler events), and that wall time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for b in bs:
            fn(b)
        wall = time.perf_counter() - t
    spent = dict.fromkeys([*CLASSES, "other"], 0.0)
    for e in prof.key_averages():
        spent[op_class(e.key)] += e.self_cpu_time_total / 1e6
    spent["python"] = max(wall - sum(spent.values()), 0.0)    # self times are the calling thread's wall times
    total = sum(spent.values())
    return {k: round(v / total, 3) for k, v in spent.items()}, total


def variants(model_dir: Path, engine: str | None) -> dict:
    """precision -> (model, autocast precision, compute dtype of its linears)."""
    from bertkit.model import BertModel
    from bertkit.runtime import int8
    plan = runtime.plan("cpu")
    ours = runtime.freeze(BertModel.from_pretrained(model_dir), plan)
    q = runtime.freeze(int8.quantize(BertModel.from_pretrained(model_dir)), plan)
    int8.set_engine(q, engine or plan.int8_engine)          # the int8 kernel, even where float measured faster
    out = {"fp32": (ours, "fp32"), "int8": (q, "fp32")}
    if native_bf16("cpu"):
        out["bf16"] = (ours, "bf16")
    return out


def run(args, work: Path, peak: dict) -> list[dict]:
    from bertkit.precision import autocast
    records = []
    texts = bbc_sentences(args.sentences)
    for name in args.models.split(","):
        model_dir = model_dir_for(name, work)
        models = variants(model_dir, args.int8_engine)
        for batch in (32, 1):
            n = args.sentences if batch > 1 else max(4, args.sentences // 8)
            bs = batches_of(model_dir, texts[:n], batch)
            for precision, (model, ac) in models.items():
                def fn(b, model=model, ac=ac):
                    with torch.inference_mode(), autocast(ac):
                        return model(**b).last_hidden_state
                for b in bs[:2]:
                    fn(b)                                              # warm-up: prepacked weights, caches
                times = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    for b in bs:
                        fn(b)
                    times.append(time.perf_counter() - t)
                wall = statistics.median(times)
                share, profiled = profile_shares(fn, bs)
                linear, attention = useful_flops(model.config, bs)
                p = peak[precision]
                records.append(emit({
                    "case": "profile", "model": name, "batch": batch, "precision": precision, "sequences": n,
                    "seq_per_s": round(n / wall, 2), "gflop_per_s": round((linear + attention) / wall / 1e9, 1),
                    "peak_gflop_per_s": round(p / 1e9, 1), "of_peak": round((linear + attention) / wall / p, 4),
                    "linear_of_peak": round(linear / max(share["linear"] * profiled, 1e-9) / p, 4),
                    "share": share}))
    return records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="minilm,base")
    p.add_argument("--sentences", type=int, default=64, help="texts per pass at batch 32 (1/8 at batch 1)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--int8-engine", default=None, help="fbgemm or onednn (default: the probe's, else PyTorch's)")
    p.add_argument("--work", default=None, help="directory for the BERT-base weights file")
    args = p.parse_args()
    work = work_dir(args, "bertkit-profile-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # int8 kernels' deprecation notes
        peak = peaks()
        emit({"case": "peak", "how": "measured: best 2048^3 GEMM per dtype ever seen here", **{k: round(v / 1e9, 1)
                                                                                for k, v in peak.items()}})
        records = run(args, work, peak)
    emit_all(records)


if __name__ == "__main__":
    main()
