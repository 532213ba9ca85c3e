"""What a run reports as it goes: metrics.jsonl, the progress bar, curves.png, and the FLOP/s and
model-FLOP utilisation (MFU) of each step."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from pathlib import Path

import torch
from torch import nn

from bertkit.atomic import write_json
from bertkit.datasets import cache_dir
from bertkit.errors import BertkitError
from bertkit.hardware import cpu_signature, native_bf16
from bertkit.modern import parts
from bertkit.plots import plot_run
from bertkit.progress import bar as progress_bar

__all__ = ["RunLog", "FlopMeter", "estimate_flops_per_token", "peak_flops", "jsonable"]

log = logging.getLogger("bertkit.train")


def jsonable(obj):
    """`obj` as plain JSON: non-finite floats -> null, tuples -> lists, anything else unknown -> str."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


# ---------------------------------------------------------------------------------------------- logging
class RunLog:
    """metrics.jsonl lines and the tqdm bar; only rank 0 writes (`main`), the others no-op."""

    def __init__(self, out: Path, cfg, main: bool, total: int, step: int):
        self.out, self.cfg, self.main = out, cfg, main
        self.file = open(out / "metrics.jsonl", "a") if main else None
        self.bar = (progress_bar(total=total, initial=step, desc="train", mininterval=0.5, show=True)
                    if main and cfg.progress else None)
        self.window_tokens, self.window_time = 0, 0.0   # recent tokens/s for the bar

    def train(self, rec: dict, dt: float, total: int) -> None:
        """One optimizer step's record (written every cfg.log_every_steps steps and at the last)."""
        self.window_tokens += rec["tokens"]
        self.window_time += dt
        if not self.main:
            return
        step = rec["step"]
        if step % self.cfg.log_every_steps == 0 or step == total:
            self._write(rec)
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(1)
            self.bar.set_postfix(_postfix(rec, self.window_tokens / max(self.window_time, 1e-9)), refresh=False)
            if self.window_time > 5:
                self.window_tokens, self.window_time = 0, 0.0

    def eval(self, rec: dict, metrics: dict) -> None:
        """An evaluation's record ({"split": "eval", "step", **metrics}); curves.png is redrawn."""
        if not (self.main and metrics):
            return
        self._write(rec)
        log.info("eval at step %d: %s", rec["step"], " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
        if self.cfg.plot:
            self.plot()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
        if self.main and self.cfg.plot:
            self.plot()

    def plot(self) -> None:
        try:
            plot_run(self.out, self.out / "curves.png")
        except Exception as e:  # matplotlib missing or no records yet: the run itself is fine
            log.info("no curves.png: %s", e)

    def _write(self, rec: dict) -> None:
        self.file.write(json.dumps(jsonable(rec)) + "\n")
        self.file.flush()


def _postfix(rec: dict, tok_s: float) -> dict:
    out = {k: f"{rec[k]:.3f}" for k in ("loss", "mlm_acc", "nsp_acc", "rtd_acc") if k in rec}
    out.update({"lr": f"{rec['lr']:.2e}", "tok/s": f"{tok_s:,.0f}"})
    if "mfu" in rec:
        out["mfu"] = f"{100 * rec['mfu']:.1f}%"
    return out


# ---------------------------------------------------------------------------------------------- FLOP/s
class FlopMeter:
    """Adds flops_per_s and mfu to step records; the FLOPs per token and the peak are found on first use."""

    def __init__(self, flops_per_token: float | None, peak: float | None, device: torch.device, dtype: torch.dtype,
                 world: int):
        self.flops_per_token, self.peak = flops_per_token, peak
        self.device, self.dtype, self.world = device, dtype, world

    def add(self, rec: dict, dt: float, model: nn.Module, seq_len: int | None) -> None:
        if self.flops_per_token is None:
            self.flops_per_token = estimate_flops_per_token(model, seq_len or 128) or 0.0
        if not self.flops_per_token:
            return
        fps = self.flops_per_token * rec["tokens"] / max(dt, 1e-9)
        rec["flops_per_s"] = fps
        if self.peak is None:
            self.peak = peak_flops(self.device, self.dtype)
        rec["mfu"] = fps / (self.peak * self.world)


def estimate_flops_per_token(model: nn.Module, seq_len: int) -> float | None:
    """Training FLOPs per token of a BERT-like model, as nanoGPT's estimate_mfu: 6 x non-embedding parameters
    (forward 2, backward 4) + 12 x hidden x the keys each query attends, summed over the layers (the score and
    value matmuls, forward + backward): seq_len, or a local layer's window where shorter (ModernBERT's sliding
    layers). None when unknown."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        return None
    n = sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name)
    layout = parts(config)
    local = layout.local_layers or (False,) * config.num_hidden_layers
    keys = sum(min(seq_len, 2 * layout.window + 1) if is_local else seq_len for is_local in local)
    return 6.0 * n + 12.0 * config.hidden_size * keys


_GPU_BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12, "4090": 165e12}
_measured_peak: dict[str, float] = {}


def peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> float:
    """The machine's peak FLOP/s in `dtype`: $BERTKIT_PEAK_FLOPS, else a table for known GPUs (bf16 dense; half for
    fp32's TF32), else on CPU the best measured matmul rate. A busy machine measures low, so the best rate seen on
    this CPU / thread count / dtype is kept in ~/.cache/bertkit/peak_flops.json and only ever raised."""
    env = os.environ.get("BERTKIT_PEAK_FLOPS")
    if env:
        return float(env)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in _GPU_BF16_PEAK.items() if k in name), 312e12)
        return peak if dtype in (torch.bfloat16, torch.float16) else peak / 2
    dname = str(dtype).removeprefix("torch.")
    key = f"{cpu_signature()}|threads={torch.get_num_threads()}" + ("" if dtype == torch.bfloat16 else f"|{dname}")
    if key not in _measured_peak:
        n = 2048 if dtype != torch.bfloat16 or native_bf16(device) else 256
        _measured_peak[key] = _remember_peak(key, _matmul_rate(n, dtype))
    return _measured_peak[key]


def _matmul_rate(n: int, dtype: torch.dtype) -> float:
    """The best of three n^3 matmuls, in FLOP/s."""
    g = torch.Generator().manual_seed(0)    # its own generator: the global RNG (dropout) stays untouched, so
    a = torch.randn(n, n, dtype=dtype, generator=g)     # a run does not depend on whether this ran before
    b = torch.randn(n, n, dtype=dtype, generator=g)
    a @ b
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2.0 * n ** 3 / (time.perf_counter() - t0))
    return best


def _remember_peak(key: str, rate: float) -> float:
    """max(rate, the best rate cached for `key`), cached again."""
    with contextlib.suppress(OSError, ValueError, BertkitError):     # the cache is best effort
        cache = cache_dir() / "peak_flops.json"               # beside the runtime plans: one cache rule
        known = json.loads(cache.read_text()) if cache.exists() else {}
        rate = max(rate, float(known.get(key, 0.0)))
        known[key] = rate
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache, known, indent=None)
    return rate
