"""OUT/summary.json and OUT/summary.md at the end of `bertkit pretrain`: the plan, steps, tokens and time, the
held-out MLM accuracy and its curve, and the top 5 for one whole word masked in a few held-out rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bertkit.atomic import write_json, write_text
from bertkit.heads import BertForMaskedLM
from bertkit.predict.decode import top_fills
from bertkit.pretraining.shards import ShardReader
from bertkit.tokenizer.inputs import wrap_array
from bertkit.tokenizer.wordpiece import decode_pieces

__all__ = ["write_summary", "fill_mask_sample"]


def write_summary(out: Path, result, plan, sample_dir: str, objective: str) -> dict:
    """Write OUT/summary.json and OUT/summary.md for a finished run; returns the summary."""
    last = result.eval_history[-1] if result.eval_history else {}
    summary = {"steps": result.steps, "tokens": result.tokens, "elapsed_s": round(result.elapsed_s, 1),
               "stop": result.stop_reason, "objective": objective,
               "heldout": {k: v for k, v in last.items() if k not in ("split", "step")},
               "heldout_curve": [{"step": e["step"], "mlm_acc": e.get("mlm_acc")} for e in result.eval_history],
               "plan": plan.to_dict() if plan is not None else None,
               "fill_mask": {"rows_from": str(sample_dir),
                             "examples": [] if objective == "electra" else fill_mask_sample(out / "model", sample_dir)}}
    write_json(out / "summary.json", summary, indent=1)
    write_text(out / "summary.md", "\n".join(_markdown(summary)) + "\n")
    return summary


def _markdown(s: dict) -> list[str]:
    h = s["heldout"]
    lines = ["# Pre-training run", "",
             f"- {s['steps']:,} optimizer steps, {s['tokens'] / 1e6:.2f} M tokens in {s['elapsed_s']:.0f} s "
             f"(stopped: {s['stop']}); objective {s['objective']}"]
    if s["plan"]:
        p = s["plan"]
        settings = ", ".join(f"{k} {v}" for k, v in p["settings"].items() if v is not None)
        lines.append(f"- plan for the {p['budget_s']:g} s budget (plan.json has the reasons): estimated "
                     f"{p['estimated_steps']:,} steps; {settings}")
    if "mlm_acc" in h:
        lines.append(f"- **held-out MLM accuracy {h['mlm_acc']:.3f}** (loss {h.get('mlm_loss', float('nan')):.3f}) "
                     f"on {int(h.get('masked_tokens', 0)):,} masked tokens")
        curve = [f"{e['step']}: {e['mlm_acc']:.3f}" for e in s["heldout_curve"] if e.get("mlm_acc") is not None]
        lines.append("- held-out MLM accuracy by step: " + ", ".join(curve))
    else:
        lines.append("- no held-out evaluation (--eval-shards)")
    sample = s["fill_mask"]["examples"]
    if sample:
        lines += ["", f"## Fill-mask on rows of {s['fill_mask']['rows_from']} (one word masked, top 5)", ""]
        for e in sample:
            top = ", ".join(f"{c['token']} ({c['score']:.2f})" for c in e["top"])
            lines.append(f"- `{e['text']}` (truth: **{e['truth']}**) -> {top}")
    return lines


def fill_mask_sample(model_dir: Path, shard_dir: str, rows: int = 5, top_k: int = 5) -> list[dict]:
    """Up to `rows` rows of `shard_dir` spread over it, each with one whole word (a single piece) of its first
    segment masked: {"text" (around the mask), "truth", "top": [{"token", "score"}]}. [] without an MLM head."""
    reader = ShardReader(shard_dir, 1, shuffle=False, drop_last=False)
    model = BertForMaskedLM.from_pretrained(model_dir).eval()     # a pre-training model's NSP / SOP head unused
    if any(k.startswith("cls.predictions") for k in (getattr(model, "loading_info", None) or {}).get("missing_keys", ())):
        return []
    vocab = (Path(shard_dir) / "vocab.txt").read_text(encoding="utf-8").split("\n")
    t = reader.tables
    out = []
    for i in np.linspace(0, reader.num_examples - 1, num=min(reader.num_examples, rows * 4)).astype(int):
        tokens, meta, _, _ = reader.gather(np.array([i]))
        segment = tokens[0, 1:int(meta[0, 1]) - 1]                  # the first segment, without [CLS] / [SEP]
        while len(segment) and t.continuation[segment[0]]:          # a segment cut mid-word: from the next word
            segment = segment[1:]
        pos = _word_position(segment, vocab, t.continuation)
        if pos is None:
            continue
        ids = wrap_array(segment, None, t.cls_id, t.sep_id).astype(np.int64)
        ids[pos + 1] = t.mask_id
        with torch.no_grad():
            res = model(torch.from_numpy(ids)[None])
        logits = res.logits[0, pos + 1]
        score, top = top_fills(torch.softmax(logits.float(), -1), None, top_k)
        lo, hi = max(0, pos - _CONTEXT), min(len(segment), pos + _CONTEXT + 1)
        while lo > 0 and t.continuation[segment[lo]]:               # whole words at the window's edges
            lo -= 1
        while hi < len(segment) and t.continuation[segment[hi]]:
            hi += 1
        text = decode_pieces([vocab[j] for j in ids[1 + lo:1 + hi]])
        out.append({"text": ("… " if lo else "") + text + (" …" if hi < len(segment) else ""),
                    "truth": vocab[segment[pos]],
                    "top": [{"token": vocab[j], "score": round(float(p), 4)} for p, j in zip(score, top.tolist())]})
        if len(out) == rows:
            break
    return out


_CONTEXT = 12                 # pieces shown on each side of the masked word


def _word_position(segment: np.ndarray, vocab: list[str], continuation: np.ndarray) -> int | None:
    """The position of a whole alphabetic word of one piece nearest the middle of a segment of 8+ pieces."""
    if len(segment) < 8:
        return None
    pieces = [vocab[j] for j in segment]
    ok = [k for k, t in enumerate(pieces) if len(t) >= 3 and t.isalpha()
          and not (k + 1 < len(pieces) and continuation[segment[k + 1]])]
    return min(ok, key=lambda k: abs(k - len(pieces) // 2)) if ok else None
