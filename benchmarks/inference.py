"""Speed of bertkit's encoder against transformers, same machine, same run, same weights, same batches.

Run (one JSON line per case; ratios survive background load because the two models alternate repeats):

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/inference.py
    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/inference.py --cases fixed_bf16,bbc --repeats 5

Cases
  peak         a big bf16 (and fp32) matmul: the machine's measured peak, the denominator of "mfu"
  fixed_fp32   BERT-base shape, 32 x 128 (no padding), inference, fp32
  fixed_bf16   same, bf16 (policy --bf16-policy: "autocast" = fp32 weights under torch.autocast, or "weights" =
               bf16 weights); the reference runs under the same policy
  bbc          BERT-base shape, real BBC sentences (bertkit tokenizer or the bert-base-uncased vocab) in batches of
               64 padded to the longest, bf16: what unpadding is for
  train        MLM training step (forward + backward + AdamW), BERT-small shape, 32 x 128, 15% masked, NSP labels,
               bf16, vs transformers.BertForPreTraining; both use torch.optim.AdamW, fused when available; two
               bf16 policies, each applied to both models alike: "autocast" (fp32 weights under torch.autocast)
               and "master" (bf16 weights, fp32 master copies in the optimizer: no casts inside the model)
  fill         (opt-in) ours only: unpadded vs sdpa at fill levels 1.0 .. 0.6 (the "auto" threshold)
  compile      (opt-in) torch.compile of our model vs eager ours, fixed 32 x 128 bf16

Every figure is tokens/s of *real* (non-padding) tokens; "ratio" = ours / reference; "mfu" = model FLOP/s (the
useful FLOPs of the real tokens, as in nanoGPT's estimate_mfu) over the measured bf16 matmul peak (the fp32 peak
where the CPU has no native bf16: there --precision auto runs the bf16 cases in fp32, see --precision).
The reference is transformers' BertModel / BertForPreTraining with attn_implementation="sdpa" (its fastest CPU path).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bertkit.config import BertConfig  # noqa: E402
from bertkit.heads import BertForPreTraining  # noqa: E402
from bertkit.model import BertModel  # noqa: E402
from bertkit import runtime  # noqa: E402


# ---------------------------------------------------------------------------------------------- helpers
def emit(record: dict) -> None:
    record.setdefault("threads", torch.get_num_threads())
    record.setdefault("torch", torch.__version__)
    print(json.dumps(record), flush=True)


def interleaved(fns: dict, repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each fn, calls alternating between fns (order reversed every repeat)."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(v) for n, v in times.items()}


def measure_peak(n: int = 4096, repeats: int = 5, bf16: bool = True) -> dict[str, float]:
    out = {}
    for dtype in ((torch.bfloat16, torch.float32) if bf16 else (torch.float32,)):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        best = min(_time(lambda: a @ b) for _ in range(repeats))
        out[str(dtype).replace("torch.", "")] = 2 * n ** 3 / best
    return out


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def forward_flops(cfg: BertConfig, lengths: list[int]) -> float:
    """Useful forward FLOPs of the encoder on sequences of these real lengths (matmuls only)."""
    h, layers, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    per_token = 2 * layers * (4 * h * h + 2 * h * inter)        # Q, K, V, O projections + FFN
    attn = sum(4 * layers * h * n * n for n in lengths)         # QK^T and PV, per sequence
    return per_token * sum(lengths) + attn


def hf_config(shape: str, **kw):
    import transformers
    cfg = BertConfig.preset(shape)
    return transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, intermediate_size=cfg.intermediate_size,
        attn_implementation="sdpa", **kw)


def load_pair(hf_cls, ours_cls, shape: str, dtype=None, **kw):
    """A random transformers model and ours with the same weights (saved by transformers, loaded by bertkit)."""
    torch.manual_seed(0)
    ref = hf_cls(hf_config(shape, **kw))
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        ours = ours_cls.from_pretrained(d)
    assert ref.config._attn_implementation == "sdpa"
    if dtype is not None:
        ref, ours = ref.to(dtype), ours.to(dtype)
    return ref, ours


def autocast(policy: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if policy == "autocast" else nullcontext()


AUTOCAST = "autocast"   # the policy of the compile / fill cases: "fp32" where bf16 is emulated (see main)


def bbc_sentences(limit: int) -> list[str]:
    from bertkit.datasets import bbc_articles
    out = []
    for art in bbc_articles():
        for para in art.paragraphs:
            out += [s for s in re.split(r"(?<=[.!?])\s+", para) if len(s.split()) >= 3]
    # a deterministic spread over the corpus, not the first articles only
    step = max(1, len(out) // limit)
    return out[::step][:limit]


def tokenize(texts: list[str], batch: int) -> list[dict[str, torch.Tensor]]:
    from bertkit.datasets import minilm_dir
    try:
        from bertkit.tokenizer import Tokenizer
        tok = Tokenizer.from_pretrained(minilm_dir())
        call = lambda t: tok(t, padding=True, truncation=True, max_length=512, return_tensors="pt")  # noqa: E731
        call(texts[:2])
    except Exception:  # tokenizer not ready: the oracle's (timing excludes tokenisation either way)
        import transformers
        tok = transformers.BertTokenizerFast(str(minilm_dir() / "vocab.txt"))
        call = lambda t: tok(t, padding=True, truncation=True, max_length=512, return_tensors="pt")  # noqa: E731
    batches = []
    for i in range(0, len(texts), batch):
        enc = call(texts[i:i + batch])
        batches.append({k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return batches


# ---------------------------------------------------------------------------------------------- cases
def infer_case(name: str, shape: str, batches: list[dict], dtype_policy: str, repeats: int, peak: float) -> None:
    import transformers
    weights_dtype = torch.bfloat16 if dtype_policy == "weights" else None
    ref, ours = load_pair(transformers.BertModel, BertModel, shape, dtype=weights_dtype)
    ref.eval()
    ours = runtime.freeze(ours)           # what bertkit's inference entry points run: this machine's plan
    ctx = autocast(dtype_policy) if dtype_policy != "fp32" else nullcontext()
    # the reference at its best: a batch without padding goes in without a mask (its SDPA then runs unmasked)
    batches = [{k: v for k, v in b.items() if not (k == "attention_mask" and bool(v.all()))} for b in batches]

    def run_ref():
        with torch.inference_mode(), ctx:
            for b in batches:
                ref(**b)

    def run_ours():
        with torch.inference_mode(), ctx:
            for b in batches:
                ours(**b)

    with torch.inference_mode(), ctx:   # same function: check before timing
        b = batches[0]
        real = b["attention_mask"].bool() if "attention_mask" in b else torch.ones_like(b["input_ids"], dtype=torch.bool)
        diff = (ref(**b).last_hidden_state - ours(**b).last_hidden_state)[real].abs().max().item()
    secs = interleaved({"ours": run_ours, "ref": run_ref}, repeats)
    lengths = [int(n) for b in batches for n in b.get("attention_mask", torch.ones_like(b["input_ids"])).sum(1)]
    tokens = sum(lengths)
    padded = sum(b["input_ids"].numel() for b in batches)
    flops = forward_flops(ours.config, lengths)
    emit({"case": name, "shape": shape, "dtype": "fp32" if dtype_policy == "fp32" else "bf16",
          "bf16_policy": None if dtype_policy == "fp32" else dtype_policy,
          "batches": len(batches), "real_tokens": tokens, "padded_tokens": padded,
          "backend": _backend(ours.plan(batches[0]["input_ids"], batches[0].get("attention_mask"))),
          "ours_tok_s": round(tokens / secs["ours"], 1), "ref_tok_s": round(tokens / secs["ref"], 1),
          "ratio": round(secs["ref"] / secs["ours"], 3),
          "ours_mfu": round(flops / secs["ours"] / peak, 4), "ref_mfu": round(flops / secs["ref"] / peak, 4),
          "max_abs_diff_real_tokens": diff, "repeats": repeats})


def _backend(plan) -> str:
    """The name earlier results used: "unpadded", else the padded batch's attention function."""
    return "unpadded" if plan.layout.unpadded else plan.masked


class MasterBf16:
    """bf16 weights for compute, fp32 master copies for AdamW (the Megatron / NVIDIA "bf16 + fp32 main params"
    policy): no per-step weight casts and no fp32<->bf16 activation casts inside the model."""

    def __init__(self, model, fused: bool, lr: float = 1e-4):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        model.to(torch.bfloat16)
        self.opt = torch.optim.AdamW(self.master, lr=lr, fused=fused or None)

    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = p.grad.float()
            p.grad = None
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)


def train_case(repeats: int, peak: float, policies: list[str], batch: int = 32, seq: int = 128,
               shape: str = "small") -> None:
    """Both models under each bf16 policy, all variants interleaved in one loop. policy "autocast": fp32 weights +
    torch.autocast(bf16) + AdamW; "master": MasterBf16. One JSON line per policy (same policy both sides) and one
    for ours-best vs reference-best."""
    import transformers
    fused = _fused_adamw_ok()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (batch, seq), generator=g)
    types = torch.zeros_like(ids)
    types[:, seq // 2:] = 1
    mask = torch.ones_like(ids)
    masked = torch.rand(batch, seq, generator=g) < 0.15
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    inputs = ids.masked_fill(masked, 103)
    nsp = torch.randint(0, 2, (batch,), generator=g)

    def make_step(model, policy, is_ref):
        model.train()
        if policy == "master":
            opt, ctx = MasterBf16(model, fused), nullcontext
        elif policy == "fp32":
            opt, ctx = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None), nullcontext
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
            ctx = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731

        def step():
            with ctx():
                if is_ref:
                    loss = model(input_ids=inputs, token_type_ids=types, attention_mask=mask, labels=labels,
                                 next_sentence_label=nsp).loss
                else:
                    loss = model(inputs, types, mask, labels=labels, next_sentence_label=nsp).loss
            loss.backward()
            opt.step()
            if policy != "master":
                opt.zero_grad(set_to_none=True)
        return step

    steps = {}
    for policy in policies:
        ref, ours = load_pair(transformers.BertForPreTraining, BertForPreTraining, shape)
        ours.masked_logits_only = True       # as bertkit pretrain runs it
        steps[f"ours_{policy}"] = make_step(runtime.apply(ours), policy, False)
        steps[f"ref_{policy}"] = make_step(ref, policy, True)
    secs = interleaved(steps, repeats)
    cfg = ours.config
    n_masked = int(masked.sum())
    # training FLOPs = 3 x forward (backward ~ 2x); MLM head counted at masked positions only (the useful work)
    fwd = forward_flops(cfg, [seq] * batch) + n_masked * 2 * (cfg.hidden_size ** 2 + cfg.hidden_size * cfg.vocab_size)
    tokens = batch * seq

    def line(label, ours_key, ref_key):
        emit({"case": label, "shape": shape, "batch": batch, "seq": seq, "masked": n_masked,
              "dtype": "fp32" if ours_key.endswith("fp32") else "bf16",
              "ours_policy": ours_key.split("_", 1)[1], "ref_policy": ref_key.split("_", 1)[1], "fused_adamw": fused,
              "ours_tok_s": round(tokens / secs[ours_key], 1), "ref_tok_s": round(tokens / secs[ref_key], 1),
              "ratio": round(secs[ref_key] / secs[ours_key], 3),
              "ours_mfu": round(3 * fwd / secs[ours_key] / peak, 4),
              "ref_mfu": round(3 * fwd / secs[ref_key] / peak, 4), "repeats": repeats})
    for policy in policies:
        line("train", f"ours_{policy}", f"ref_{policy}")
    if len(policies) > 1:
        best_ours = min((k for k in secs if k.startswith("ours")), key=secs.get)
        best_ref = min((k for k in secs if k.startswith("ref")), key=secs.get)
        line("train_best_vs_best", best_ours, best_ref)


def compile_case(repeats: int, peak: float) -> None:
    """torch.compile(ours) vs ours, fixed 32 x 128 bf16 autocast, BERT-base shape."""
    import transformers
    _, ours = load_pair(transformers.BertModel, BertModel, "base")
    ours.eval()
    ours.config.attn_implementation = "sdpa"
    compiled = torch.compile(ours, dynamic=False)
    ids = torch.randint(1000, 30000, (32, 128))
    t0 = time.perf_counter()
    with torch.inference_mode(), autocast(AUTOCAST):
        compiled(ids)
    compile_s = time.perf_counter() - t0

    def run(m):
        def f():
            with torch.inference_mode(), autocast(AUTOCAST):
                m(ids)
        return f
    secs = interleaved({"compiled": run(compiled), "eager": run(ours)}, repeats)
    emit({"case": "compile", "shape": "base", "dtype": "bf16" if AUTOCAST == "autocast" else "fp32", "compile_s": round(compile_s, 1),
          "compiled_tok_s": round(4096 / secs["compiled"], 1), "eager_tok_s": round(4096 / secs["eager"], 1),
          "ratio": round(secs["eager"] / secs["compiled"], 3), "repeats": repeats})


def fill_case(repeats: int, shape: str) -> None:
    """The "auto" rule: unpadded vs sdpa (ours only) on 32 x 128 batches at several fill levels, bf16 autocast."""
    torch.manual_seed(0)
    model = BertModel(BertConfig.preset(shape)).eval()
    g = torch.Generator().manual_seed(0)
    for target in (1.0, 0.95, 0.9, 0.8, 0.6):
        cut = (torch.rand(32, generator=g) * 2 * (1 - target) * 128).long().clamp(max=127)
        mask = (torch.arange(128)[None] < (128 - cut)[:, None]).long()
        ids = torch.randint(1000, 30000, (32, 128), generator=g) * mask

        def run(backend):
            def f():
                model.config.attn_implementation = backend
                with torch.inference_mode(), autocast(AUTOCAST):
                    model(ids, None, mask)
            return f
        secs = interleaved({"sdpa": run("sdpa"), "unpadded": run("unpadded")}, repeats)
        emit({"case": "fill", "shape": shape, "fill": round(mask.float().mean().item(), 3),
              "sdpa_s": round(secs["sdpa"], 3), "unpadded_s": round(secs["unpadded"], 3),
              "unpadded_speedup": round(secs["sdpa"] / secs["unpadded"], 3), "repeats": repeats})


def _fused_adamw_ok() -> bool:
    try:
        p = torch.nn.Parameter(torch.zeros(2))
        p.grad = torch.zeros(2)
        torch.optim.AdamW([p], fused=True).step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="peak,fixed_fp32,fixed_bf16,bbc,train")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bf16-policy", default="autocast", choices=["autocast", "weights", "fp32"])
    ap.add_argument("--bbc-batches", type=int, default=3, help="batches of 64 sentences per timed repeat")
    ap.add_argument("--train-policies", default="autocast,master",
                    help="bf16 policies for the train case, each run for both models alike")
    ap.add_argument("--shape", default="base", help="model shape for fixed/bbc cases")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                    help="auto: the bf16 cases where the CPU has native bf16 (AMX / AVX-512 BF16); elsewhere bf16 "
                         "is emulated (~100x slower than fp32, both sides alike), so the bbc / train / fill / "
                         "compile cases run in fp32 and fixed_bf16 is skipped")
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    global AUTOCAST
    from bertkit.hardware import resolve_precision
    bf16 = resolve_precision(args.precision, "cpu") == "bf16"
    if not bf16:
        AUTOCAST = "fp32"
        args.bf16_policy = "fp32"
        args.train_policies = "fp32"
        if "fixed_bf16" in cases:
            cases.remove("fixed_bf16")
            emit({"case": "fixed_bf16", "skipped": "no native bf16 on this CPU (precision fp32)"})
    torch.manual_seed(0)
    peaks = measure_peak(bf16=bf16)
    peak = peaks["bfloat16" if bf16 else "float32"]
    if "peak" in cases:
        emit({"case": "peak", "bf16_matmul_gflops": round(peaks["bfloat16"] / 1e9, 1) if bf16 else None,
              "fp32_matmul_gflops": round(peaks["float32"] / 1e9, 1), "machine": platform.processor() or
              platform.machine(), "cpus": os.cpu_count()})
    fixed = [{"input_ids": torch.randint(1000, 30000, (32, 128), generator=torch.Generator().manual_seed(1)),
              "token_type_ids": torch.zeros(32, 128, dtype=torch.long),
              "attention_mask": torch.ones(32, 128, dtype=torch.long)}]
    if "fixed_fp32" in cases:
        infer_case("fixed_fp32", args.shape, fixed, "fp32", args.repeats, peak)
    if "fixed_bf16" in cases:
        infer_case("fixed_bf16", args.shape, fixed, args.bf16_policy, args.repeats, peak)
    if "bbc" in cases:
        batches = tokenize(bbc_sentences(64 * args.bbc_batches), 64)
        infer_case("bbc", args.shape, batches, args.bf16_policy, args.repeats, peak)
    if "train" in cases:
        train_case(args.repeats, peak, args.train_policies.split(","))
    if "fill" in cases:
        fill_case(args.repeats, args.shape)
    if "compile" in cases:
        compile_case(args.repeats, peak)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
