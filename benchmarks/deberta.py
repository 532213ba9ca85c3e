"""DeBERTa-v3-base shape: bertkit (after runtime.freeze) against transformers' DebertaV2Model, same run, same weights.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/deberta.py [--batches 3] [--repeats 5]

CPU, fp32, random weights; real variable-length text: BBC sentences through the MiniLM WordPiece vocabulary (the
ids are what matter), batches of 64 padded to their longest. transformers runs with attn_implementation "eager", and
"sdpa" where it has it (5.24 refuses SDPA for DeBERTa-v2: the line says so); its best is the ratio's denominator.
Figures are real (non-padding) tokens per second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from inference import bbc_sentences, emit, interleaved, tokenize  # noqa: E402

from bertkit import runtime  # noqa: E402
from bertkit.model import BertModel  # noqa: E402

# microsoft/deberta-v3-base's config.json, with the MiniLM vocabulary the batches are tokenised with
V3_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
               max_position_embeddings=512, relative_attention=True, position_buckets=256, max_relative_positions=-1,
               pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
               position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7, hidden_act="gelu")


def main() -> int:
    import transformers
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=3, help="batches of 64 sentences per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    batches = [{k: b[k] for k in ("input_ids", "attention_mask")} for b in
               tokenize(bbc_sentences(64 * args.batches), 64)]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    torch.manual_seed(0)
    ref = transformers.DebertaV2Model(transformers.DebertaV2Config(**V3_BASE, attn_implementation="eager")).eval()
    models, skipped = {"transformers_eager": ref}, {}
    try:                                          # transformers 5.24 refuses SDPA for DeBERTa-v2: said, not timed
        models["transformers_sdpa"] = transformers.DebertaV2Model(transformers.DebertaV2Config(
            **V3_BASE, attn_implementation="sdpa")).eval()
        models["transformers_sdpa"].load_state_dict(ref.state_dict())
    except ValueError as e:
        skipped["transformers_sdpa"] = str(e).split(".")[0]
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        models["bertkit"] = runtime.freeze(BertModel.from_pretrained(d))
    with torch.inference_mode():                 # same weights, same outputs (real tokens)
        b = batches[0]
        diff = (models["bertkit"](**b).last_hidden_state - ref(**b).last_hidden_state)[b["attention_mask"].bool()]
        secs = interleaved({n: (lambda m=m: [m(**b) for b in batches]) for n, m in models.items()}, args.repeats)
    rate = {n: tokens / s for n, s in secs.items()}
    best = max(r for n, r in rate.items() if n != "bertkit")
    emit({"case": "deberta_v3_base_bbc_fp32", "real_tokens": tokens, "padded_tokens": sum(b["input_ids"].numel()
          for b in batches), **{f"{n}_tok_s": round(r) for n, r in rate.items()}, "not_run": skipped,
          "ratio_vs_best": round(rate["bertkit"] / best, 2), "max_abs_diff": float(diff.abs().max())})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
