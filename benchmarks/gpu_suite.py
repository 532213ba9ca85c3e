"""The GPU suite: bertkit against transformers on one GPU, every figure in one short run (benchmarks/gpu_suite.sh).

    bash benchmarks/gpu_suite.sh                      # one H100 / H200: under 8 minutes, one JSON line per figure
    bash benchmarks/gpu_suite.sh --quick              # fewer timed steps, same figures
    bash benchmarks/gpu_suite.sh --device cpu --quick # dry run of the same code with tiny shapes (1-2 minutes)

Figures, in this order (each a JSON line with "figure"; a case that fails or runs out of time prints its line with
"error" / "not_run" and the suite goes on):
  env        the device, its bf16 dense peak (the MFU denominator), torch / transformers versions, the reference's
             attention: flash_attention_2 where the flash_attn package imports, else sdpa
  tests      the test suite's CUDA tests (`pytest -m cuda` over the test files that mark any): pass / fail counts
  pretrain   BERT-base (BertForPreTraining: MLM + NSP) and ModernBERT-base (MLM) at seq 128 and 1024 (the dry
             run: 32, 128), full rows, 15% masked, bf16 autocast, AdamW: ours is bertkit's training loop as
             `bertkit pretrain` runs it (train() + pretraining_step, masked-only logits); the reference
             transformers' model of the family in a plain loop (autocast, fused AdamW, clipping at 1.0; ModernBERT
             with its own sparse_prediction)
  finetune   sequence classification, ragged batches (16..256 tokens), padded to each batch's longest; ours through
             train(), the reference in the same plain loop
  infer      variable-length encoder inference (16..512 tokens, batches of 64), bf16 weights, inference mode
Each side gets the same weights (the reference's random init, saved and loaded by bertkit) and the same batches,
a warm-up round, then its timed steps (ours, then the reference). tokens/s counts real (non-padding) tokens;
peak memory is torch.cuda.max_memory_allocated over the timed round; "ratio" = ours / reference tokens/s.

MFU = model FLOPs per token x tokens/s / the device's bf16 dense peak (bertkit.train.monitor.peak_flops: 989
TFLOP/s on H100 SXM and H200, 312 on A100; --peak-tflops for any other). Model FLOPs per token, training
(bertkit.train.monitor.estimate_flops_per_token, the one place the formula lives): 6 x non-embedding parameters
(forward 2, backward 4) + 12 x hidden x the keys each query attends, summed over layers (the score and value
matmuls: forward 4, backward 8), the keys being the sequence length, or the window for a local layer (ModernBERT).
Ragged batches use sum(len^2) / sum(len) as the length. Inference counts the forward third of the same.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertkit import heads, runtime  # noqa: E402
from bertkit.families import bert_class_name  # noqa: E402
from bertkit.model import BertModel  # noqa: E402
from bertkit.train import TrainConfig, train  # noqa: E402
from bertkit.train import monitor  # noqa: E402
from bertkit.train.monitor import estimate_flops_per_token, peak_flops  # noqa: E402
from bertkit.train.steps import pretraining_step  # noqa: E402

# the published base shapes (bert-base-uncased, ModernBERT-base), BERT's positions widened for seq 1024
BASE = {"bert": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                     intermediate_size=3072, max_position_embeddings=1024),
        "modernbert": dict(vocab_size=50368, hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
                           intermediate_size=1152, local_attention=128, global_attn_every_n_layers=3,
                           max_position_embeddings=8192)}
# the dry run's: a global and a local layer (window shorter than the rows) for ModernBERT
TINY = {"bert": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=1024),
        "modernbert": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                           intermediate_size=96, local_attention=16, global_attn_every_n_layers=3,
                           max_position_embeddings=1024)}
SPECIALS = {"bert": dict(pad_token_id=0), "modernbert": dict(pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                                             cls_token_id=1, sep_token_id=2, sparse_prediction=True)}
MASK_ID = 4                      # any non-special id: random weights read every id alike
# {sequence length: sequences per batch}: 32K tokens a step on the GPU; the dry run's lengths are short
PRETRAIN = {"base": {128: 256, 1024: 32}, "tiny": {32: 4, 128: 2}}
RAGGED = {"base": dict(finetune=(32, 256), infer=(64, 512)), "tiny": dict(finetune=(4, 64), infer=(4, 96))}


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_memory(device: torch.device) -> None:
    """Peak memory counted from here; a warm-up's optimizer freed first, so it does not count."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def best_attention() -> str:
    try:
        import flash_attn  # noqa: F401
        return "flash_attention_2"
    except ImportError:
        return "sdpa"


# ---------------------------------------------------------------------------------------------- models
def pair(family: str, head: str, shape: str, attn: str, tmp: Path, **extra):
    """(ours, reference): transformers' `head` model of the family, random weights, and bertkit's load of them."""
    import transformers
    transformers.utils.logging.disable_progress_bar()
    kw = {**(BASE if shape == "base" else TINY)[family], **SPECIALS[family], **extra}
    cfg = transformers.AutoConfig.for_model(family, attn_implementation=attn, **kw)
    cls = getattr(transformers, {"bert": "Bert", "modernbert": "ModernBert"}[family] + head)
    torch.manual_seed(0)
    ref = cls(cfg)
    ref.save_pretrained(tmp / f"{family}-{head}")
    name = bert_class_name(cls.__name__)
    ours = (BertModel if name == "BertModel" else getattr(heads, name)).from_pretrained(tmp / f"{family}-{head}")
    return ours, ref


# ---------------------------------------------------------------------------------------------- batches
def lengths(n: int, low: int, high: int, g: torch.Generator) -> list[int]:
    return torch.randint(low, high + 1, (n,), generator=g).tolist()


def batch(family: str, lens: list[int], vocab: int, g: torch.Generator, task: str) -> dict:
    """Rows of random ids padded to the longest; pre-training: 15% masked (labels elsewhere -100) and BERT's NSP
    label; classification: a label per row."""
    width = max(lens)
    ids = torch.randint(5, vocab, (len(lens), width), generator=g)
    mask = (torch.arange(width)[None, :] < torch.tensor(lens)[:, None]).long()
    out = {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}
    if task == "pretrain":
        masked = (torch.rand(ids.shape, generator=g) < 0.15) & mask.bool()
        out["labels"] = ids.masked_fill(~masked, -100)
        out["input_ids"] = out["input_ids"].masked_fill(masked, MASK_ID)
        if family == "bert":
            out["token_type_ids"] = torch.zeros_like(ids)
            out["next_sentence_label"] = torch.randint(0, 2, (len(lens),), generator=g)
    elif task == "finetune":
        out["labels"] = torch.randint(0, 2, (len(lens),), generator=g)
    return out


def mean_keys(batches: list[dict]) -> float:
    """The sequence length behind the attention FLOPs of ragged rows: sum(len^2) / sum(len)."""
    lens = torch.cat([b["attention_mask"].sum(1) for b in batches]).double()
    return float((lens ** 2).sum() / lens.sum())


def real_tokens(batches: list[dict]) -> int:
    return sum(int(b["attention_mask"].sum()) for b in batches)


# ---------------------------------------------------------------------------------------------- timing
def ours_training(model, batches: list[dict], steps: int, device, precision: str, tmp: Path, step_fn) -> dict:
    """bertkit's loop: a warm-up call, then a timed call of `steps` + 1 steps (the first one's time left out)."""
    from bertkit.train.steps import default_step
    cfg = dict(lr=1e-4, warmup=0, schedule="constant", precision=precision, progress=False, plot=False,
               tensorboard=False, save_final=False, device=str(device), peak_flops=1.0, flops_per_token=1.0)
    train(model, batches, TrainConfig(max_steps=2, **cfg), tmp / "warm", step_fn=step_fn or default_step)
    reset_memory(device)
    h = train(model, batches, TrainConfig(max_steps=steps + 1, **cfg), tmp / "timed",
              step_fn=step_fn or default_step).history
    return {"tokens_per_s": sum(r["tokens"] for r in h[1:]) / (h[-1]["elapsed_s"] - h[0]["elapsed_s"]),
            "peak_memory_gib": peak_memory_gib(device)}


def reference_training(model, batches: list[dict], steps: int, device, bf16: bool) -> dict:
    """transformers' model in a plain loop: autocast, loss, backward, clipping at 1.0, fused AdamW."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-6, fused=True)

    def step(b):
        b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(**b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach().item()     # a host sync every step, as bertkit's loop logs every step

    for b in batches[:2]:
        step(b)
    sync(device)
    reset_memory(device)
    timed = [batches[i % len(batches)] for i in range(steps)]
    t0 = time.perf_counter()
    for b in timed:
        step(b)
    sync(device)
    return {"tokens_per_s": real_tokens(timed) / (time.perf_counter() - t0), "peak_memory_gib": peak_memory_gib(device)}


def inference(model, batches: list[dict], repeats: int, device) -> dict:
    """Seconds for all `batches` through the encoder (best of `repeats`, after one warm-up pass)."""
    def run():
        with torch.inference_mode():
            for b in batches:
                model(**{k: v.to(device, non_blocking=True) for k, v in b.items()})
        sync(device)
    run()
    reset_memory(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return {"tokens_per_s": real_tokens(batches) / best, "peak_memory_gib": peak_memory_gib(device)}


# ---------------------------------------------------------------------------------------------- cases
class Suite:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and self.device.index is None:     # torch.cuda.set_device needs the index
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.shape = args.shape or ("tiny" if self.device.type == "cpu" else "base")
        self.bf16 = self.device.type == "cuda"        # the dry run keeps fp32: emulated bf16 is slow on CPU
        self.precision = "bf16" if self.bf16 else "fp32"
        self.peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(self.device, torch.bfloat16
                                                                                 if self.bf16 else torch.float32)
        self.attn = best_attention()
        self.steps = 4 if args.quick else 12
        self.t0 = time.perf_counter()
        self.tmp = Path(tempfile.mkdtemp(prefix="bertkit-gpu-suite-"))

    def record(self, figure: str, family: str, ours: dict, ref: dict, flops_per_token: float, **more) -> dict:
        rec = {"figure": figure, "family": family, "shape": self.shape, **more, "dtype": self.precision,
               "reference_attention": self.attn}
        for side, r in (("ours", ours), ("reference", ref)):
            rec[f"{side}_tokens_per_s"] = round(r["tokens_per_s"], 1)
            rec[f"{side}_mfu"] = float(f"{flops_per_token * r['tokens_per_s'] / self.peak:.3g}")
            rec[f"{side}_peak_memory_gib"] = r["peak_memory_gib"]
        rec["ratio"] = round(ours["tokens_per_s"] / ref["tokens_per_s"], 3)
        return rec

    def pretrain(self, family: str, seq: int) -> dict:
        ours, ref = pair(family, "ForMaskedLM" if family == "modernbert" else "ForPreTraining", self.shape,
                         self.attn, self.tmp)
        ours.masked_logits_only = True                  # as `bertkit pretrain` runs it
        rows = PRETRAIN[self.shape][seq]
        g = torch.Generator().manual_seed(0)
        batches = [batch(family, [seq] * rows, ours.config.vocab_size, g, "pretrain") for _ in range(4)]
        per_token = estimate_flops_per_token(ours, seq)
        a = ours_training(ours, batches, self.steps, self.device, self.precision, self.tmp / f"pt{family}{seq}",
                          pretraining_step)
        ours.cpu()                              # the reference's peak memory is its own
        b = reference_training(ref, batches, self.steps, self.device, self.bf16)
        return self.record("pretrain", family, a, b, per_token, seq=seq, batch=rows, steps=self.steps)

    def finetune(self, family: str) -> dict:
        ours, ref = pair(family, "ForSequenceClassification", self.shape, self.attn, self.tmp, num_labels=2)
        rows, longest = RAGGED[self.shape]["finetune"]
        g = torch.Generator().manual_seed(1)
        batches = [batch(family, lengths(rows, 16, longest, g), ours.config.vocab_size, g, "finetune")
                   for _ in range(4)]
        per_token = estimate_flops_per_token(ours, round(mean_keys(batches)))
        a = ours_training(ours, batches, self.steps, self.device, self.precision, self.tmp / f"ft{family}", None)
        ours.cpu()                              # the reference's peak memory is its own
        b = reference_training(ref, batches, self.steps, self.device, self.bf16)
        return self.record("finetune", family, a, b, per_token, lengths=[16, longest], batch=rows, steps=self.steps)

    def infer(self, family: str) -> dict:
        ours, ref = pair(family, "Model", self.shape, self.attn, self.tmp)
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        ours = runtime.freeze(ours.to(self.device, dtype), runtime.plan(self.device))
        rows, longest = RAGGED[self.shape]["infer"]
        g = torch.Generator().manual_seed(2)
        batches = [batch(family, lengths(rows, 16, longest, g), ours.config.vocab_size, g, "infer")
                   for _ in range(4 if self.args.quick else 8)]
        per_token = estimate_flops_per_token(ours, round(mean_keys(batches))) / 3
        repeats = 2 if self.args.quick else 5
        a = inference(ours, batches, repeats, self.device)
        ours.cpu()                              # the reference's peak memory is its own
        b = inference(ref.to(self.device, dtype).eval(), batches, repeats, self.device)
        return self.record("infer", family, a, b, per_token, lengths=[16, longest], batch=rows,
                           batches=len(batches), repeats=repeats)

    def tests(self) -> dict:
        """The test files that mark any test `cuda`, run with `-m cuda`: every such test, nothing else."""
        files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                       if "pytest.mark.cuda" in p.read_text())
        if not files:
            return {"figure": "tests", "files": [], "error": "no test file marks a test pytest.mark.cuda"}
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *files],
                              cwd=ROOT, capture_output=True, text=True, timeout=self.left(),
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
                                  str(ROOT / "src"), os.environ.get("PYTHONPATH"))))})
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)",
                                                    proc.stdout.splitlines()[-1] if proc.stdout else "")}
        failed = [line.split(" ")[1] for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        return {"figure": "tests", "files": files, "rc": proc.returncode, **counts, "failures": failed,
                "seconds": round(time.perf_counter() - t0, 1)}

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def case(self, name: str, fn, *args) -> None:
        """One figure's line; an error or an exhausted time budget is the line instead, and the suite goes on."""
        tag = {"figure": name, **({"case": list(args)} if args else {})}
        if self.left() < 20:
            return emit({**tag, "not_run": f"time budget of {self.args.budget_s} s spent"})
        t0 = time.perf_counter()
        try:
            rec = fn(*args)
        except Exception as e:                       # a GPU run is scarce: the other figures still come
            rec = {**tag, "error": f"{type(e).__name__}: {str(e)[:300]}", "where": traceback.format_exc()[-600:]}
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        emit(rec)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def peak_source(self, name: str) -> str:
        if self.args.peak_tflops:
            return "--peak-tflops"
        if self.device.type != "cuda":
            return "measured"
        known = any(k in name for k in monitor._GPU_BF16_PEAK)
        return "table" if known else "not in the table: A100's assumed, pass --peak-tflops"

    def env(self) -> dict:
        try:
            import transformers
            tf = transformers.__version__
        except ImportError:
            tf = None
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else platform.processor()
        return {"figure": "env", "device": name or platform.machine(), "peak_tflops": round(self.peak / 1e12, 1),
                "peak_source": self.peak_source(name),
                "torch": torch.__version__, "transformers": tf, "reference_attention": self.attn,
                "shape": self.shape, "quick": self.args.quick, "python": platform.python_version(),
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="fewer timed steps and repeats (same figures)")
    ap.add_argument("--shape", choices=("base", "tiny"), help="default: base on a GPU, tiny on the CPU")
    ap.add_argument("--peak-tflops", type=float, help="the device's bf16 dense peak where the table lacks it")
    ap.add_argument("--budget-s", type=float, default=450, help="figures not started by then are skipped")
    ap.add_argument("--skip", default="", help="comma-separated figures to leave out: tests,pretrain,finetune,infer")
    ap.add_argument("--families", default="bert,modernbert", help="comma-separated: bert,modernbert")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default); 1 for a dry run on a CPU other jobs share")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    suite = Suite(args)
    skip = set(filter(None, args.skip.split(",")))
    emit(suite.env())
    if "tests" not in skip:
        suite.case("tests", suite.tests)
    for family in args.families.split(","):
        for seq in PRETRAIN[suite.shape]:
            if "pretrain" not in skip:
                suite.case("pretrain", suite.pretrain, family, seq)
        if "finetune" not in skip:
            suite.case("finetune", suite.finetune, family)
        if "infer" not in skip:
            suite.case("infer", suite.infer, family)
    emit({"figure": "total", "seconds": round(time.perf_counter() - suite.t0, 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
