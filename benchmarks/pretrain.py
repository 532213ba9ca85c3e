"""Pre-training: our loop vs transformers.BertForPreTraining in a plain torch loop, on the same BBC shards.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/pretrain.py                 # speed, small + base
    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/pretrain.py --mode faithful # held-out MLM loss
    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/pretrain.py --mode packing  # --packing vs rows

Data: BBC articles (95% train / 5% held out, split by seed 0) -> shards (seq 128, NSP, dynamic token masking) with
the bert-base-uncased vocabulary (speed) or a vocab trained on the training articles (faithful); both sides read the
same shards through the same ShardReader, so data loading is in both measurements.

speed     end-to-end training tokens/s (non-padding tokens / wall time, data loading, forward, backward, clipping
          and the optimizer step included; our loop's logging and metrics too) at the `small` and `base` shapes,
          seq 128, --precision (auto: bf16 autocast where the CPU has native bf16, AMX / AVX-512 BF16, else fp32:
          emulated bf16 is ~100x slower on both sides). The reference at its best: attn_implementation="sdpa", the
          same precision, fused AdamW
          (CPU fused kernel), grad clipping 1.0, the same param groups. Ours and the reference alternate in the same
          process (--repeats rounds of --steps timed steps each, after a warm-up round); medians reported; one JSON
          line per shape with ratio = ours / reference tokens/s.
faithful  the same initial weights (ours copied into the transformers model: same parameter names), config, seed,
          data order and hyperparameters (AdamW 0.9/0.999/1e-6, wd 0.01 off biases/LayerNorm, linear warmup+decay,
          clip 1.0, dropout 0.1), --steps steps each; held-out MLM loss (mean over masked tokens of fixed held-out
          batches) at equal steps. One JSON line with both curves and the largest relative gap.
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

BENCH = Path(__file__).resolve().parent
CACHE = Path(tempfile.gettempdir()) / "bertkit-bench-pretrain"


# ---------------------------------------------------------------------------------------------- data
def bbc_shards(kind: str) -> tuple[Path, Path]:
    """(train shards, held-out shards) for vocab `kind` ("bert" | "bbc"), built once and cached."""
    from bertkit.datasets import bbc_articles, minilm_dir, split_by_seed
    from bertkit.pretraining import PrepareConfig, prepare
    root = CACHE / kind
    train_dir, held_dir = root / "shards128", root / "heldout128"
    if (train_dir / "manifest.json").exists() and (held_dir / "manifest.json").exists():
        return train_dir, held_dir
    root.mkdir(parents=True, exist_ok=True)
    train, held, _ = split_by_seed(bbc_articles(), seed=0, fractions=(0.95, 0.05, 0.0))
    for name, arts in (("train", train), ("heldout", held)):
        (root / f"{name}.txt").write_text("".join("\n".join([a.title, *a.paragraphs]) + "\n\n" for a in arts))
    if kind == "bert":
        vocab = str(minilm_dir())
    else:
        from bertkit.vocab import train_vocab
        train_vocab([str(root / "train.txt")], vocab_size=8000).save(root / "vocab")
        vocab = str(root / "vocab")
    prepare(PrepareConfig(str(root / "train.txt"), vocab, str(train_dir), seq_len=128, task="nsp", dynamic=True,
                          corpus_format="prose", overwrite=True))
    prepare(PrepareConfig(str(root / "heldout.txt"), vocab, str(held_dir), seq_len=128, task="nsp",
                          corpus_format="prose", overwrite=True))
    return train_dir, held_dir


# ---------------------------------------------------------------------------------------------- reference loop
def hf_model(our_model, attn: str = "sdpa"):
    """transformers.BertForPreTraining with our config and our initial weights (same parameter names)."""
    from transformers import BertConfig as HFConfig
    from transformers import BertForPreTraining as HFPreTraining
    c = our_model.config
    hc = HFConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
                  num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
                  hidden_act=c.hidden_act, hidden_dropout_prob=c.hidden_dropout_prob,
                  attention_probs_dropout_prob=c.attention_probs_dropout_prob,
                  max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size,
                  initializer_range=c.initializer_range, layer_norm_eps=c.layer_norm_eps, attn_implementation=attn)
    m = HFPreTraining(hc)
    missing, unexpected = m.load_state_dict(our_model.state_dict(), strict=False)
    missing = [k for k in missing if "decoder." not in k and "position_ids" not in k]  # tied to the embeddings / cls.predictions.bias
    assert not missing and not unexpected, (missing, unexpected)
    m.tie_weights()
    return m


def hf_optimizer(model, lr: float, fused: bool = True):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name or name.endswith("bias") else decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, **kw)


def hf_steps(model, opt, sched, it, n: int, bf16: bool) -> tuple[int, float, list[float]]:
    """n plain training steps; (non-padding tokens, wall seconds, losses)."""
    tokens, losses = 0, []
    t0 = time.perf_counter()
    for _ in range(n):
        batch = next(it)
        tokens += int(batch["attention_mask"].sum())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(**batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
    return tokens, time.perf_counter() - t0, losses


def endless(reader):
    while True:
        yield from reader


# ---------------------------------------------------------------------------------------------- speed
def speed(shape: str, batch: int, steps: int, repeats: int, precision: str) -> dict:
    from bertkit.config import BertConfig
    from bertkit.heads import BertForPreTraining
    from bertkit.pretraining import ShardReader
    from bertkit.train import TrainConfig, train
    train_dir, _ = bbc_shards("bert")
    torch.manual_seed(0)
    ours = BertForPreTraining(BertConfig.preset(shape, vocab_size=30522))
    ours.masked_logits_only = True           # as bertkit pretrain runs it
    ref = hf_model(ours)
    ref.train()
    ref_opt = hf_optimizer(ref, 1e-4)
    ref_it = endless(ShardReader(train_dir, batch, seed=1))
    our_reader = ShardReader(train_dir, batch, seed=0)
    ours_tps, ref_tps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats + 1):  # round 0 warms both up (allocations, first fused-kernel calls)
            n = 2 if r == 0 else steps + 1
            res = train(ours, our_reader, TrainConfig(max_steps=n, lr=1e-4, warmup=0, schedule="constant",
                                                      precision=precision, progress=False, plot=False,
                                                      tensorboard=False, save_final=False, peak_flops=1.0),
                        Path(tmp) / f"r{r}")
            h = res.history
            if r:  # wall time from the end of the first step to the end of the last (one step of warm-up)
                ours_tps.append(sum(x["tokens"] for x in h[1:]) / (h[-1]["elapsed_s"] - h[0]["elapsed_s"]))
            tok, sec, _ = hf_steps(ref, ref_opt, None, ref_it, 2 if r == 0 else steps, precision == "bf16")
            if r:
                ref_tps.append(tok / sec)
    o, f = statistics.median(ours_tps), statistics.median(ref_tps)
    return {"benchmark": "pretrain_speed", "shape": shape, "seq": 128, "batch": batch, "dtype": precision,
            "steps_per_round": steps, "rounds": repeats, "threads": torch.get_num_threads(),
            "ours_tokens_per_s": round(o, 1), "reference_tokens_per_s": round(f, 1), "ratio": round(o / f, 3),
            "reference": f"transformers.BertForPreTraining sdpa + {precision} + fused AdamW, plain loop",
            "ours_rounds": [round(x, 1) for x in ours_tps], "reference_rounds": [round(x, 1) for x in ref_tps]}


def our_rounds(model, readers: dict, steps: int, repeats: int, precision: str) -> dict:
    """{name: [tokens/s per round]}: our loop on each reader in turn, alternating in the same process (round 0
    warms up); wall time from the end of each round's first step to the end of its last."""
    from bertkit.train import TrainConfig, train
    tps = {name: [] for name in readers}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats + 1):
            for name, reader in readers.items():
                res = train(model, reader, TrainConfig(max_steps=2 if r == 0 else steps + 1, lr=1e-4, warmup=0,
                                                       schedule="constant", precision=precision, progress=False,
                                                       plot=False, tensorboard=False, save_final=False,
                                                       peak_flops=1.0), Path(tmp) / f"{name}{r}")
                h = res.history
                if r:
                    tps[name].append(sum(x["tokens"] for x in h[1:]) / (h[-1]["elapsed_s"] - h[0]["elapsed_s"]))
    return tps


def packing(shape: str, batch: int, steps: int, repeats: int, precision: str) -> dict:
    """Our loop on the BBC shards with --packing against without it, in the same process: the padded share of the
    batch grids and tokens/s (ratio = packed / rows)."""
    from bertkit.config import BertConfig
    from bertkit.heads import BertForPreTraining
    from bertkit.pretraining import PackedReader, ShardReader
    from bertkit.pretraining.packing import padding_share
    train_dir, _ = bbc_shards("bert")
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset(shape, vocab_size=30522))
    model.masked_logits_only = True
    rows, packed = ShardReader(train_dir, batch, seed=0), PackedReader(ShardReader(train_dir, batch, seed=0))
    grids = [rows.indices(0, i * batch, (i + 1) * batch) for i in range(len(rows))]
    pad_rows = padding_share(packed.lengths, grids, width=rows.seq_len)
    pad_packed = padding_share(packed.lengths, packed.batches(0))
    tps = our_rounds(model, {"rows": rows, "packed": packed}, steps, repeats, precision)
    o, f = statistics.median(tps["packed"]), statistics.median(tps["rows"])
    return {"benchmark": "pretrain_packing", "shape": shape, "seq": rows.seq_len, "batch": batch, "dtype": precision,
            "steps_per_round": steps, "rounds": repeats, "threads": torch.get_num_threads(),
            "padding_rows": round(pad_rows, 4), "padding_packed": round(pad_packed, 4),
            "rows_tokens_per_s": round(f, 1), "packed_tokens_per_s": round(o, 1), "ratio": round(o / f, 3),
            "packed_rounds": [round(x, 1) for x in tps["packed"]], "rows_rounds": [round(x, 1) for x in tps["rows"]],
            # each round's two runs are neighbours in time: on a loaded machine their ratio is the steadier figure
            "round_ratios": [round(p / r, 3) for p, r in zip(tps["packed"], tps["rows"])]}


# ---------------------------------------------------------------------------------------------- faithful
def heldout_mlm_loss(model, batches, bf16: bool) -> float:
    """Mean MLM cross-entropy over every masked token of the held-out batches (full logits: model-agnostic)."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for b in batches:
            kw = {k: b[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
            out = model(**kw)
            logits = out.prediction_logits.float()                           # (batch, seq, vocab)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["labels"].reshape(-1),
                                                     ignore_index=-100, reduction="sum")
            total += float(loss)
            count += int((b["labels"] != -100).sum())
    model.train()
    return total / count


def faithful(shape: str, batch: int, steps: int, every: int, lr: float, precision: str) -> dict:
    from bertkit.config import BertConfig
    from bertkit.heads import BertForPreTraining
    from bertkit.pretraining import ShardReader
    from bertkit.train import TrainConfig, train
    train_dir, held_dir = bbc_shards("bbc")
    vocab = int(json.loads((train_dir / "manifest.json").read_text())["vocab_size"])
    held = list(ShardReader(held_dir, 32, seed=0, shuffle=False))[:10]
    warmup = max(1, steps // 10)
    torch.manual_seed(0)
    ours = BertForPreTraining(BertConfig.preset(shape, vocab_size=vocab))
    ours.masked_logits_only = True           # as bertkit pretrain runs it
    ref = hf_model(ours)
    ref.train()
    bf16 = precision == "bf16"
    curve_ours, curve_ref = {0: heldout_mlm_loss(ours, held, bf16)}, {0: heldout_mlm_loss(ref, held, bf16)}
    t_ours = time.perf_counter()
    # one run, evaluated through eval_fn at every `every` steps
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(1)
        reader = ShardReader(train_dir, batch, seed=0)

        def eval_fn(model):
            return {"heldout_mlm_loss": heldout_mlm_loss(model, held, bf16)}
        res = train(ours, reader, TrainConfig(max_steps=steps, lr=lr, warmup=warmup, precision=precision,
                                              progress=False, plot=False, tensorboard=False, eval_every_steps=every,
                                              save_final=False), tmp, eval_fn=eval_fn)
        for rec in res.eval_history:
            curve_ours[rec["step"]] = rec["heldout_mlm_loss"]
    t_ours = time.perf_counter() - t_ours
    # the reference: same data order (same reader seed), same schedule shape as transformers' linear warmup
    t_ref = time.perf_counter()
    torch.manual_seed(1)
    opt = hf_optimizer(ref, lr)
    # the same per-step lr as ours: linear warmup whose first update already moves ((s + 1) / warmup), then
    # linear decay to 0 at `steps` (transformers' get_linear_schedule_with_warmup starts at lr 0 instead)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (steps - s) / (steps - warmup)))
    it = endless(ShardReader(train_dir, batch, seed=0))
    for upto in range(every, steps + 1, every):
        hf_steps(ref, opt, sched, it, every, bf16)
        curve_ref[upto] = heldout_mlm_loss(ref, held, bf16)
    t_ref = time.perf_counter() - t_ref
    gaps = {s: (curve_ours[s] - curve_ref[s]) / curve_ref[s] for s in curve_ref if s in curve_ours}
    return {"benchmark": "pretrain_faithful", "shape": shape, "batch": batch, "steps": steps, "lr": lr,
            "dtype": precision, "heldout_mlm_loss_ours": {s: round(v, 4) for s, v in curve_ours.items()},
            "heldout_mlm_loss_reference": {s: round(v, 4) for s, v in curve_ref.items()},
            "final_rel_gap": round(gaps[steps], 4), "max_abs_rel_gap": round(max(abs(g) for g in gaps.values()), 4),
            "wall_s_ours": round(t_ours, 1), "wall_s_reference": round(t_ref, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("speed", "faithful", "packing"), default="speed")
    ap.add_argument("--shapes", nargs="+", default=["small", "base"])
    ap.add_argument("--batch", type=int, default=None, help="speed: default 32 small / 16 base; faithful: 32")
    ap.add_argument("--steps", type=int, default=None, help="speed: timed steps per round (3); faithful: 200")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--every", type=int, default=50, help="faithful: evaluate every N steps")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                    help="both sides; auto: bf16 where the CPU has native bf16, else fp32")
    args = ap.parse_args()
    from bertkit.hardware import resolve_precision
    precision = resolve_precision(args.precision, "cpu")
    if args.mode in ("speed", "packing"):
        run = speed if args.mode == "speed" else packing
        for shape in args.shapes:
            b = args.batch or (16 if shape in ("base", "large") else 32)
            print(json.dumps(run(shape, b, args.steps or 3, args.repeats, precision)), flush=True)
    else:
        print(json.dumps(faithful("mini" if args.shapes == ["small", "base"] else args.shapes[0], args.batch or 32,
                                  args.steps or 200, args.every, args.lr, precision)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
