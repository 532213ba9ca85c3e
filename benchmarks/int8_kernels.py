"""Which int8 GEMM runtime.int8 uses: every candidate at BERT's linear shapes, same run, one JSON line per shape.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/int8_kernels.py [--rows 2000] [--repeats 7]

Candidates, each (rows, in) fp32 activations x (out, in) weights -> (rows, out) fp32, with int8 weights per output
channel (symmetric) and activations quantized inside the timed call:
  fp32               F.linear
  fp32_packed        oneDNN prepacked fp32 (what runtime.freeze uses where it measured faster)
  bf16_packed        oneDNN prepacked bf16 on bf16 activations (native bf16 only: what precision "auto" runs
                     there, the float path int8 must beat; the timed call includes the cast back to fp32)
  dynamic_<engine>   quantized::linear_dynamic on weights prepacked for fbgemm / onednn / x86 (one activation
                     scale per call, uint8 with a zero point, full 8-bit range)
  qlinear_<dtype>    onednn::qlinear_pointwise (the oneDNN int8 GEMM Inductor's x86 quantization uses: AMX where the
                     CPU has it) on int8 activations with one symmetric scale, quantized in PyTorch ops inside the
                     timed call, output in fp32 or bf16 (from bf16 activations)
  int_mm_per_token   torch._int_mm on int8 activations with one scale per row, quantized and dequantized in
                     PyTorch ops around it
  weight_only        torch._weight_int8pack_mm: int8 weights, float activations (no int8 arithmetic)
The figure is the fastest of `repeats` alternating calls in ms; "rel_err" is max |y - fp32| / max |fp32|.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch
import torch.nn.functional as F

SHAPES = {"minilm_qkv": (384, 1152), "minilm_ffn_in": (384, 1536), "minilm_ffn_out": (1536, 384),
          "base_qkv": (768, 2304), "base_ffn_in": (768, 3072), "base_ffn_out": (3072, 768)}


def best_ms(fns: dict, repeats: int) -> dict[str, float]:
    times = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for r in range(repeats):
        for k in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            t = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t)
    return {k: round(min(v) * 1e3, 3) for k, v in times.items()}


def candidates(x, w, b) -> dict:
    n = w.shape[0]
    scale = w.abs().amax(1) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    fns = {"fp32": lambda: F.linear(x, w, b)}
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    fns["fp32_packed"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():          # the float path bf16 autocast runs where native
        xb, bb = x.bfloat16(), b.bfloat16()
        packed_bf16 = torch.ops.mkldnn._reorder_linear_weight(w.bfloat16(), None)
        fns["bf16_packed"] = lambda: torch.ops.mkldnn._linear_pointwise(xb, packed_bf16, bb, "none", [], "").float()
    for engine in ("fbgemm", "onednn", "x86"):
        if engine not in torch.backends.quantized.supported_engines:
            continue
        torch.backends.quantized.engine = engine
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros(n, dtype=torch.long), 0)
        p = torch.ops.quantized.linear_prepack(qw, b)
        fns[f"dynamic_{engine}"] = (lambda p=p: torch.ops.quantized.linear_dynamic(x, p, False))

    pw, wzp, zero = torch.ops.onednn.qlinear_prepack(q, None), torch.zeros(n, dtype=torch.long), torch.zeros(
        (), dtype=torch.long)

    def qlinear(xd):
        xs = (xd.abs().amax() / 127).float().clamp(min=1e-12)
        qx = torch.round(xd / xs).clamp(-127, 127).to(torch.int8)
        return torch.ops.onednn.qlinear_pointwise.tensor(qx, xs, zero, pw, scale, wzp, b.to(xd.dtype), 1.0, 0,
                                                         xd.dtype, "none", [], "").float()
    fns["qlinear_fp32"] = lambda: qlinear(x)
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        fns["qlinear_bf16"] = lambda: qlinear(xb)

    def int_mm():
        xs = x.abs().amax(1, keepdim=True) / 127
        return torch.addcmul(b, torch._int_mm(torch.round(x / xs).to(torch.int8), q.t()), xs * scale)
    fns["int_mm_per_token"] = int_mm
    fns["weight_only"] = lambda: torch._weight_int8pack_mm(x, q, scale) + b
    return fns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, (k, n) in SHAPES.items():
            x, w = torch.randn(args.rows, k, generator=g), torch.randn(n, k, generator=g) * 0.05
            b = torch.randn(n, generator=g) * 0.1
            fns = candidates(x, w, b)
            ref = fns["fp32"]()
            err = {}
            for key, fn in fns.items():
                try:
                    err[key] = round(float((fn() - ref).abs().max() / ref.abs().max()), 4)
                except RuntimeError as e:                  # a kernel this build lacks
                    err[key] = f"unavailable: {str(e).splitlines()[0][:80]}"
            ms = best_ms({k: f for k, f in fns.items() if isinstance(err[k], float)}, args.repeats)
            print(json.dumps({"shape": name, "rows": args.rows, "in": k, "out": n, "threads": torch.get_num_threads(),
                              "ms": ms, "speedup_vs_fp32": {k: round(ms["fp32"] / v, 2) for k, v in ms.items()},
                              "rel_err": err}), flush=True)


if __name__ == "__main__":
    main()
