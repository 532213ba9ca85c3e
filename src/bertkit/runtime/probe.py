"""Short measurements that decide which fast paths this machine gets, cached per CPU (hardware.cpu_signature), torch
version and thread count.

Each probe times a fast path against the plain PyTorch op it would replace, at shapes typical of BERT-base and
MiniLM, alternating the two; the fast path is used only where it wins by `MARGIN`. Results live in
$BERTKIT_CACHE/runtime/ as JSON; delete the file to measure again.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bertkit.atomic import write_json
from bertkit.attention import dropout_drop_mask, explicit_attention, sdpa_attention
from bertkit.errors import BertkitError
from bertkit.hardware import cpu_signature, load_per_cpu
from bertkit.padding import Layout
from bertkit.runtime.int8 import BF16_KERNEL_ALWAYS, ENGINES, Int8Linear, int8_kernel_ok, qlinear_bf16_ok
from bertkit.runtime.linear import FrozenLinear, onednn_linear_ok, pack, packed_linear

__all__ = ["MARGIN", "measure", "cached_measurements"]

MARGIN = 0.95           # a fast path must take under 95% of the plain path's time


def _time(fns: dict, repeats: int = 5) -> dict[str, float]:
    """Seconds per call of each fn, the fastest of `repeats` calls alternating between them (one warm-up each): on
    a shared machine the minimum is the figure least moved by other work."""
    times = {k: [] for k in fns}
    for k, fn in fns.items():
        fn()
    for i in range(repeats):
        for k in (list(fns) if i % 2 == 0 else list(reversed(fns))):
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()}


def _probe_packed_linear(dtype: torch.dtype) -> dict:
    if not onednn_linear_ok(dtype):
        return {"fast": None, "plain": None, "why": f"oneDNN linear unavailable for {dtype}"}
    g = torch.Generator().manual_seed(0)
    cases = [((1024, 384), (1536, 384)), ((512, 768), (3072, 768))]        # MiniLM FFN-in, base FFN-in
    fast = plain = 0.0
    with torch.no_grad():
        for xs, ws in cases:
            x, w = torch.randn(*xs, generator=g).to(dtype), torch.randn(*ws, generator=g).to(dtype)
            b = torch.zeros(ws[0], dtype=dtype)
            pw = pack(w, dtype)
            t = _time({"fast": lambda: packed_linear(x, pw, b, None), "plain": lambda: F.linear(x, w, b)})
            fast, plain = fast + t["fast"], plain + t["plain"]
    return {"fast": fast, "plain": plain}


SHORT_ROWS = range(12, 60, 3)     # rows of the int8 probe's short case: one sentence of 12-57 pieces
LAYER_WIDTHS = (384, 768)         # its encoder layer's widths, MiniLM's and BERT-base's: int8 gains with width


def _float_gemms(xs: list, lin: torch.nn.Linear, bf16_native: bool) -> dict:
    """name -> fn: the float GEMMs of `lin` over `xs` that a float model runs here, int8's competition: fp32, and
    where the CPU has native bf16 (what precision "auto" runs) bf16, prepacked where oneDNN runs it."""
    fns = {"fp32": lambda: [lin(x) for x in xs]}
    if bf16_native:
        xb, wb, bb = [x.bfloat16() for x in xs], lin.weight.bfloat16(), lin.bias.bfloat16()
        if onednn_linear_ok(torch.bfloat16):
            pw = pack(wb, torch.bfloat16)
            fns["bf16"] = lambda: [packed_linear(x, pw, bb, None) for x in xb]
        else:
            fns["bf16"] = lambda: [F.linear(x, wb, bb) for x in xb]
    return fns


def _probe_int8_linear(bf16_native: bool) -> dict:
    """The int8 kernel (bertkit.runtime.int8, activations quantized inside) of each engine against the float GEMMs
    this machine has (`_float_gemms`: fp32, and bf16 where native), at batch-32 rows and at short sequences of
    changing lengths (one sentence at batch 1: the libraries differ most there, oneDNN pays per new shape; int8
    can lose there while batches win, e.g. oneDNN without VNNI). "engine": the first of ENGINES unless another has
    a mean log speed-up over fp32 better by the margin; "fast" / "plain": the engine's and fp32's time on the
    batch cases, "short_*" the same on the short ones; where the CPU has native bf16, "layer<width>_*": a whole
    encoder layer's at each of LAYER_WIDTHS (`_probe_int8_encoder`)."""
    engines = [e for e in ENGINES if int8_kernel_ok(e)]
    if not engines:
        return {"fast": None, "plain": None, "why": "no int8 linear kernel in this PyTorch build"}
    g = torch.Generator().manual_seed(0)
    cases = {"minilm": ((1024,), 384, 1536), "base": ((512,), 768, 3072), "short": (SHORT_ROWS, 384, 1536)}
    timed = {}
    with torch.no_grad():
        for case, (rows, k, n) in cases.items():
            xs, lin = [torch.randn(r, k, generator=g) for r in rows], torch.nn.Linear(k, n)
            fns = _float_gemms(xs, lin, bf16_native)
            for e in engines:
                q = Int8Linear.from_float(lin)
                q.engine = e
                fns[e] = lambda q=q: [q(x) for x in xs]
            timed[case] = _time(fns)
    score = {e: sum(math.log(t[e] / t["fp32"]) for t in timed.values()) for e in engines}
    # the first library (PyTorch's x86 default) unless another is faster by the margin on the mean log ratio: a
    # near tie measured under other load once cached oneDNN, which ran batch 1 1.5x slower (docs/performance.md)
    engine = engines[0]
    for e in engines[1:]:
        if (score[e] - score[engine]) / len(cases) < math.log(MARGIN):
            engine = e
    out = {"engine": engine}
    for key, name in (("fast", engine), ("plain", "fp32")):
        out[key] = timed["minilm"][name] + timed["base"][name]
        out[f"short_{key}"] = timed["short"][name]
    for h in LAYER_WIDTHS if bf16_native else ():     # what "auto" would run instead: bf16 through the whole layer
        out.update({f"layer{h}_{k}": v for k, v in _probe_int8_encoder(engine, h).items()})
    return out


def _encoder_layer(x: torch.Tensor, layout: Layout, linears: list, norms: list, heads: int) -> torch.Tensor:
    """A post-norm BERT layer as the frozen model runs it, on packed tokens (tokens, h): fused Q/K/V, SDPA in the
    layout's buckets, output + residual + LayerNorm, FFN with its GELU in the first GEMM, output + residual +
    LayerNorm."""
    qkv, out, ffn_in, ffn_out = linears
    ctx = layout.from_buckets([_bucket_attention(g, b.mask, heads) for g, b in zip(layout.to_buckets(qkv(x)),
                                                                                    layout.buckets)])
    x = norms[0](x + out(ctx))
    return norms[1](x + ffn_out(ffn_in(x)))


def _probe_int8_encoder(engine: str, h: int = 384) -> dict:
    """One encoder layer of width `h` (12 heads, random weights) on 32 sentences of 6-90 tokens, mostly short,
    unpadded as the model runs them: int8 layers through `engine` with fp32 activations (as int8 models run)
    against the float layer under bf16 autocast with prepacked bf16 GEMMs (as "auto" runs a float model), and where
    oneDNN's int8 GEMM takes bf16 here, the int8 layers under bf16 autocast (`qlinear_bf16`): "int8", "bf16",
    "int8_bf16"; the last two again on one sentence of changing length ("short_bf16", "short_int8_bf16"). The GEMMs
    alone miss that bf16 also speeds the rest of the layer (attention, norms, residual adds); a padded layer
    misjudged BERT-base width, where padding's extra rows favour bf16's GEMMs (docs/performance.md)."""
    g = torch.Generator().manual_seed(0)
    heads = 12
    lengths = (torch.rand(32, generator=g) ** 2 * 84 + 6).long()
    mask = torch.arange(int(lengths.max()))[None] < lengths[:, None]
    batch = (torch.randn(int(lengths.sum()), h, generator=g), Layout.build("unpadded", mask, *mask.shape))
    shorts = [(torch.randn(n, h, generator=g).bfloat16(), Layout.build("unpadded", None, 1, n)) for n in SHORT_ROWS]
    shapes = ((h, 3 * h, None), (h, h, None), (h, 4 * h, "gelu"), (4 * h, h, None))
    floats = [(torch.nn.Linear(i, o), act) for i, o, act in shapes]
    packed = frozenset({torch.bfloat16}) if onednn_linear_ok(torch.bfloat16) else frozenset()
    layers = {"bf16": [FrozenLinear(lin.weight, lin.bias, act, packed) for lin, act in floats],
              "int8": [Int8Linear.from_float(lin, act) for lin, act in floats]}
    for q in layers["int8"]:
        q.engine = engine
    if qlinear_bf16_ok():
        layers["int8_bf16"] = [Int8Linear.from_float(lin, act) for lin, act in floats]
        for q in layers["int8_bf16"]:
            q.bf16_kernel_below = BF16_KERNEL_ALWAYS
    norms = [torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)]

    def run(name, inputs):
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=name != "int8"):
            for t, layout in inputs:
                _encoder_layer(t.float() if name == "int8" else t.bfloat16(), layout, layers[name], norms, heads)
    out = _time({name: lambda name=name: run(name, [batch]) for name in layers})
    if "int8_bf16" in layers:
        short = _time({name: lambda name=name: run(name, shorts) for name in ("bf16", "int8_bf16")})
        out.update({f"short_{k}": v for k, v in short.items()})
    return out


def _probe_dropout() -> dict:
    x = torch.randn(4, 12, 128, 128)
    return _time({"fast": lambda: torch.where(dropout_drop_mask(tuple(x.shape), 0.1, x.device)[0], 0.0, x * 1.1),
                  "plain": lambda: F.dropout(x, 0.1, True)})


def _probe_train_attention(dtype: torch.dtype, dropout_p: float) -> dict:
    """Forward + backward of one MiniLM-shaped attention block (8 x 12 heads x 128 x 32), with a padding mask."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 12, 128, 32, generator=g).to(dtype).requires_grad_() for _ in range(3))
    mask = (torch.arange(128)[None] < torch.randint(32, 129, (8,), generator=g)[:, None])[:, None, None, :]

    class _Plan:
        fast_dropout = False               # the mask is its own probe: compare the kernels alone

    def run(fn):
        ctx, _ = fn(q, k, v, mask, 32 ** -0.5, dropout_p, _Plan)
        ctx.sum().backward()

    return _time({"fast": lambda: run(explicit_attention), "plain": lambda: run(sdpa_attention)}, repeats=3)


def _probe_masked_inference_attention() -> dict:
    """bf16 inference attention on masked short rows (64 x 12 heads x 96 x 64)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(64, 12, 96, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    mask = (torch.arange(96)[None] < torch.randint(16, 97, (64,), generator=g)[:, None])[:, None, None, :]
    with torch.no_grad():
        return _time({"fast": lambda: explicit_attention(q, k, v, mask, 0.125, 0.0, None),
                      "plain": lambda: sdpa_attention(q, k, v, mask, 0.125, 0.0, None)})


def _bucket_attention(qkv: torch.Tensor, mask, heads: int) -> torch.Tensor:
    """One bucket's inference attention as the encoder runs it (BertSelfAttention._attend with SDPA)."""
    b, s, three_h = qkv.shape
    q, k, v = qkv.view(b, s, 3, heads, three_h // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)
    return sdpa_attention(q, k, v, mask, q.shape[-1] ** -0.5, 0.0, None)[0].transpose(1, 2).reshape(b, s, -1)


def _probe_cost_buckets() -> dict:
    """Unpadded inference attention of 32 ragged MiniLM-shaped rows (6-90 tokens, mostly short, as sentences are):
    buckets by `padding.cost_buckets` against `padding.length_buckets`. The cost model's per-bucket cost, "overhead"
    (row * length^2 * hidden units), is measured first: a 1 x 8 bucket's time over the time per unit of a 16 x 64
    one."""
    g = torch.Generator().manual_seed(0)
    heads, hidden = 12, 384
    small, big = torch.randn(1, 8, 3 * hidden, generator=g), torch.randn(16, 64, 3 * hidden, generator=g)
    lengths = (torch.rand(32, generator=g) ** 2 * 84 + 6).long()
    mask = torch.arange(int(lengths.max()))[None] < lengths[:, None]
    x = torch.randn(int(lengths.sum()), 3 * hidden, generator=g)

    def run(overhead):
        layout = Layout.build("unpadded", mask, *mask.shape, bucket_overhead=overhead)
        grids = layout.to_buckets(x)
        return layout.from_buckets([_bucket_attention(t, b.mask, heads) for t, b in zip(grids, layout.buckets)])

    with torch.no_grad():
        t = _time({"small": lambda: _bucket_attention(small, None, heads),
                   "big": lambda: _bucket_attention(big, None, heads)})
        if t["big"] <= t["small"]:                # other work swamped the timings: no cost model from them
            return {"fast": None, "plain": None, "why": "a 16 x 64 bucket timed no slower than a 1 x 8 one"}
        per_unit = (t["big"] - t["small"]) / ((16 * 64 ** 2 - 8 ** 2) * hidden)
        overhead = t["small"] / per_unit
        t = _time({"fast": lambda: run(overhead / hidden), "plain": lambda: run(None)})
    return {"fast": t["fast"], "plain": t["plain"], "overhead": overhead}


PROBES = ("packed_linear_fp32", "packed_linear_bf16", "int8_linear", "fast_dropout", "explicit_train_attention",
          "explicit_train_short", "explicit_masked_inference", "cost_buckets")
SCHEMA = 17               # bump when a probe is added or changes: older cache files are measured again


def measure(bf16_native: bool) -> dict[str, dict]:
    """Every probe on this machine: {name: {"fast": s, "plain": s} or a "why" where it cannot run}. Runs on a
    forked RNG: a seeded program draws the same numbers whether or not it probed; grad on, as the training probes
    run backward even when the first plan is asked for inside torch.no_grad()."""
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        return _measure(bf16_native)


def _measure(bf16_native: bool) -> dict[str, dict]:
    train_dtype = torch.bfloat16 if bf16_native else torch.float32
    out = {
        "packed_linear_fp32": _probe_packed_linear(torch.float32),
        "int8_linear": _probe_int8_linear(bf16_native),
        "fast_dropout": _probe_dropout(),
        "explicit_train_attention": _probe_train_attention(train_dtype, 0.1),
        "explicit_train_short": _probe_train_attention(train_dtype, 0.0),
        "cost_buckets": _probe_cost_buckets(),
    }
    if bf16_native:
        out["packed_linear_bf16"] = _probe_packed_linear(torch.bfloat16)
        out["explicit_masked_inference"] = _probe_masked_inference_attention()
    else:
        why = "no native bf16 on this CPU: bf16 is not used here"
        out["packed_linear_bf16"] = out["explicit_masked_inference"] = {"fast": None, "plain": None, "why": why}
    return out


def _cache_file(root: Path) -> Path:
    # the schema in the name: checkouts of different versions sharing a cache never re-probe over each other's file
    key = f"{cpu_signature()}-torch{torch.__version__}-threads{torch.get_num_threads()}-schema{SCHEMA}"
    name = "".join(c if c.isalnum() else "-" for c in key)
    return root / "runtime" / f"{name}.json"


def _valid(data) -> bool:
    """A cache file of this schema, CPU and torch, with a number (or null and a reason) for every probe."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("torch") != torch.__version__ \
            or data.get("cpu") != cpu_signature() or not isinstance(data.get("probes"), dict):
        return False
    for name in PROBES:
        p = data["probes"].get(name)
        if not isinstance(p, dict) or not all(isinstance(p.get(k), (int, float, type(None))) for k in ("fast", "plain")):
            return False
        if (p["fast"] is None) != (p["plain"] is None):
            return False
    return True


LOADED = 0.75            # load per core above which other work skewed a probe's timings (a 2-core machine
                         # measured 5x slower there, and picked the int8 library that is 2x slower when quiet)


def _quieter_now(load) -> bool:
    """Whether cached timings were taken under load and the machine is now at most half as loaded: they are taken
    again (each re-measure halves the load of record, so a busy machine re-probes a few times at most)."""
    return isinstance(load, (int, float)) and load > LOADED and load_per_cpu() < load / 2


def cached_measurements(root: Path | None, bf16_native: bool) -> dict[str, dict]:
    """`measure` once per CPU model, torch version and thread count; later calls read the file (an unreadable,
    outdated or malformed one is measured again, and one measured under load once the machine is quieter; an
    unwritable cache only costs a probe next time)."""
    path = _cache_file(root) if root is not None else None
    try:
        data = json.loads(path.read_text())
        if _valid(data) and not _quieter_now(data.get("load")):
            return data["probes"]
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    load = load_per_cpu()
    probes = measure(bf16_native)
    if path is None:
        return probes
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"schema": SCHEMA, "cpu": cpu_signature(), "torch": torch.__version__, "load": load,
                          "probes": probes}, indent=1)
    except (OSError, BertkitError):
        pass                                            # an unwritable cache only costs a probe next time
    return probes
