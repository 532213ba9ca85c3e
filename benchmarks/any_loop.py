"""A bertkit model trained outside bertkit's loop: a plain PyTorch loop and transformers.Trainer, against
transformers' own model with the same weights in the same process.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/any_loop.py              # plain loop + Trainer
    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/any_loop.py --cases plain

BERT-small shape (4 layers, 512 hidden, 8 heads), batch 32 x 128, random weights saved by bertkit and loaded by
transformers (sdpa attention), autocast in the machine's fast dtype (bf16 where the CPU has native bf16, else fp32).

plain    BertForMaskedLM, 15% of the tokens labelled: autocast forward, backward, torch.optim.AdamW step (its
         defaults), zero_grad: what a user writes. Ours and the reference alternate step by step; median seconds a
         step after --warmup steps. `ours` is the model as loaded (the runtime plan reaches it when it is put in
         training mode), `ours_plain` the same model with BERTKIT_FAST_PATHS=none (plain PyTorch kernels).
trainer  BertForSequenceClassification (2 labels) under transformers.Trainer (bf16 on native-bf16 CPUs, AdamW,
         no logging or saving); the median step time from a callback's step timestamps after --warmup steps.
One JSON line per figure: ours / reference seconds a step, ratio = reference / ours (>1: ours faster), cpu.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bertkit import BertConfig, BertForMaskedLM, BertForSequenceClassification  # noqa: E402
from bertkit.hardware import cpu_signature, native_bf16  # noqa: E402

SEQ, VOCAB = 128, 30522


def batches(n: int, batch: int, labels: str, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1000, VOCAB, (batch, SEQ), generator=g)
        ids[:, 0], ids[:, -1] = 101, 102
        b = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        if labels == "mlm":
            pick = torch.rand(ids.shape, generator=g) < 0.15
            b["labels"] = torch.where(pick, ids, torch.full_like(ids, -100))
        else:
            b["labels"] = torch.randint(0, 2, (batch,), generator=g)
        out.append(b)
    return out


def models(head: str, directory: Path):
    """Ours (as loaded) and transformers' model, the same weights, both in fp32."""
    import transformers
    torch.manual_seed(0)
    cls = {"mlm": BertForMaskedLM, "cls": BertForSequenceClassification}[head]
    cls(BertConfig.preset("small", vocab_size=VOCAB, num_labels=2)).save_pretrained(directory)
    ref_cls = {"mlm": transformers.BertForMaskedLM, "cls": transformers.BertForSequenceClassification}[head]
    return cls.from_pretrained(directory), ref_cls.from_pretrained(directory, attn_implementation="sdpa")


def plain_step(model, opt, batch, dtype):
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def plain(args, dtype, directory: Path) -> dict:
    import os
    ours, ref = models("mlm", directory)
    os.environ["BERTKIT_FAST_PATHS"] = "none"
    bare = BertForMaskedLM.from_pretrained(directory).train()       # applied here: plain PyTorch
    del os.environ["BERTKIT_FAST_PATHS"]
    runs = {"ours": ours.train(), "ours_plain": bare, "reference": ref.train()}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in runs.items()}
    data = batches(4, args.batch, "mlm")
    times = {k: [] for k in runs}
    for i in range(args.warmup + args.steps):
        for k in (list(runs) if i % 2 else list(runs)[::-1]):    # alternate, order flipped every step
            t = time.perf_counter()
            plain_step(runs[k], opts[k], data[i % len(data)], dtype)
            if i >= args.warmup:
                times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"benchmark": "any_loop", "case": "plain_loop_mlm", "ours_s": round(med["ours"], 4),
            "ours_plain_s": round(med["ours_plain"], 4), "reference_s": round(med["reference"], 4),
            "ratio": round(med["reference"] / med["ours"], 3),
            "ratio_plain": round(med["reference"] / med["ours_plain"], 3)}


def trainer_step_s(model, data, args, dtype, out: Path) -> float:
    import transformers
    targs = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch, max_steps=args.warmup + args.steps,
        logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True, bf16=dtype == torch.bfloat16,
        dataloader_num_workers=0, seed=0, disable_tqdm=True)
    rows = [{k: v[i] for k, v in b.items()} for b in data for i in range(args.batch)]
    ends = []

    class StepTimes(transformers.TrainerCallback):
        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter())

    transformers.Trainer(model=model, args=targs, train_dataset=rows, callbacks=[StepTimes()]).train()
    gaps = [b - a for a, b in zip(ends[args.warmup:], ends[args.warmup + 1:])]
    return statistics.median(gaps)


def trainer(args, dtype, directory: Path) -> dict:
    ours, ref = models("cls", directory)
    data = batches(4, args.batch, "cls")
    med = {}
    for k, m in (("reference", ref), ("ours", ours), ("reference2", None)):   # the reference before and after
        if k == "reference2":
            med["reference"] = min(med["reference"], trainer_step_s(ref, data, args, dtype, directory / k))
        else:
            med[k] = trainer_step_s(m, data, args, dtype, directory / k)
    return {"benchmark": "any_loop", "case": "trainer_seq_cls", "ours_s": round(med["ours"], 4),
            "reference_s": round(med["reference"], 4), "ratio": round(med["reference"] / med["ours"], 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="plain,trainer")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    dtype = torch.bfloat16 if native_bf16("cpu") else torch.float32
    common = {"shape": "small", "batch": args.batch, "seq": SEQ, "dtype": str(dtype).split(".")[-1],
              "threads": torch.get_num_threads(), "torch": torch.__version__, "cpu": cpu_signature(),
              "reference": "transformers BERT, sdpa, same weights and autocast, same process"}
    for case in args.cases.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            record = {"plain": plain, "trainer": trainer}[case](args, dtype, Path(tmp))
        print(json.dumps({**record, **common}), flush=True)


if __name__ == "__main__":
    main()
