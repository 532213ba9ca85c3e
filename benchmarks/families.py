"""Inference speed of every encoder family against transformers: same machine, same run, same weights, same batches.

Run (one JSON line per family):

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/families.py
    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/families.py --families roberta,mpnet --repeats 5
    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/families.py --int8 --threads 1

Each family at its published base shape (roberta-base, xlm-roberta-base, mpnet-base, distilbert-base,
electra-base-discriminator, albert-base-v2, DeBERTa-v3-base, ModernBERT-base: 22 layers, GLU width 1152, a 128-token window in two
layers of three, nomic-embed-text-v1.5: BERT-base with rotary base 1000 and SwiGLU, gte-base-en-v1.5: rotary base
500000, GeGLU, no token types), random weights saved by transformers and loaded by bertkit; real BBC
sentences in batches of 64 padded to the longest, fp32. The ids are the MiniLM WordPiece ids of the sentences
(random weights read any ids alike; only the lengths matter for speed). Ours: the bare encoder after
`runtime.freeze` (what bertkit's inference entry points run). The reference: transformers' model of the family at
each CPU attention setting it offers ("sdpa", "eager"), the faster counted; "ratio" = reference seconds / ours.

--int8: no transformers model is timed; bertkit's int8 model (`runtime.int8.quantize`, what `bertkit quantize`
writes, then `runtime.freeze`: the runtime keeps the int8 layers' weights in float where its probe found int8
slower here) against bertkit's fp32 frozen model, same weights, same batches, interleaved; "ratio" = fp32 seconds /
int8 seconds, "int8_path" = the engine the int8 layers ran (None: float GEMMs of the dequantized weights),
"int8_activations" = the precision `predict` gives the int8 model here (bf16 where the CPU has native bf16 and the
runtime measured bf16 GEMMs faster than int8: then its layers run bf16); "ratio_int8_fp32" = the int8 kernel with
fp32 activations, whatever "auto" chose.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from inference import bbc_sentences, emit, interleaved, tokenize  # noqa: E402

from bertkit import runtime  # noqa: E402
from bertkit.precision import autocast, for_model, resolve  # noqa: E402
from bertkit.runtime import int8  # noqa: E402
from bertkit.model import BertModel  # noqa: E402

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
SHAPES = {
    "roberta": dict(BASE, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1),
    "xlm-roberta": dict(BASE, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1),
    "mpnet": dict(BASE, max_position_embeddings=514, pad_token_id=1),
    "distilbert": dict(dim=768, n_layers=6, n_heads=12, hidden_dim=3072),
    "electra": dict(BASE, embedding_size=768),
    "albert": dict(BASE, embedding_size=128, num_hidden_groups=1),
    "deberta-v2": dict(BASE, relative_attention=True, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
                       norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False,
                       position_buckets=256, type_vocab_size=0),
    "modernbert": dict(hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152,
                       local_attention=128, global_attn_every_n_layers=3, pad_token_id=0),
    "nomic_bert": dict(BASE, max_position_embeddings=2048, pad_token_id=0),
    "gte": dict(BASE, max_position_embeddings=8192, type_vocab_size=0, pad_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 500_000.0}),
}


def load(model_type: str, attn: str):
    """transformers' model of the family with this attention setting, or None where it refuses it (MPNet and
    DeBERTa-v2 have no SDPA path)."""
    import transformers
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=30522, **SHAPES[model_type])
    torch.manual_seed(0)
    try:
        return transformers.AutoModel.from_config(cfg, attn_implementation=attn).eval()
    except ValueError:
        return None


def batches_for(pad: int, sentences: list[str]) -> list[dict]:
    """MiniLM's ids, with the family's padding id at padding (and no real token on it)."""
    out = []
    for b in tokenize(sentences, 64):
        ids, mask = b["input_ids"].clone(), b["attention_mask"]
        ids[(ids == pad) & mask.bool()] = 100                            # [UNK]: a real token, not padding
        out.append({"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask})
    return out


def case(model_type: str, sentences: list[str], repeats: int) -> None:
    refs = {attn: m for attn in ("sdpa", "eager") if (m := load(model_type, attn)) is not None}
    first = next(iter(refs.values()))
    with tempfile.TemporaryDirectory() as d:
        first.save_pretrained(d)
        ours = runtime.freeze(BertModel.from_pretrained(d))
    for m in refs.values():
        m.load_state_dict(first.state_dict())
    batches = batches_for(ours.config.pad_token_id, sentences)
    with torch.inference_mode():                                        # same function: check before timing
        b = batches[0]
        real = b["attention_mask"].bool()
        diff = (first(**b).last_hidden_state - ours(**b).last_hidden_state)[real].abs().max().item()

    def run(model):
        def f():
            with torch.inference_mode():
                for b in batches:
                    model(**b)
        return f

    secs = interleaved({"ours": run(ours), **{a: run(m) for a, m in refs.items()}}, repeats)
    best = min(refs, key=lambda a: secs[a])
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    emit({"case": "family", "family": model_type, "dtype": "fp32", "batches": len(batches), "real_tokens": tokens,
          "ours_tok_s": round(tokens / secs["ours"], 1), "ref_tok_s": round(tokens / secs[best], 1),
          "ref_attention": best, "ref_tok_s_each": {a: round(tokens / secs[a], 1) for a in refs},
          "ratio": round(secs[best] / secs["ours"], 3), "max_abs_diff_real_tokens": diff,
          "repeats": repeats, "cpu": platform.processor() or platform.machine()})


def int8_case(model_type: str, sentences: list[str], repeats: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        load(model_type, "eager").save_pretrained(d)
        fp32 = runtime.freeze(BertModel.from_pretrained(d))
        q = runtime.freeze(int8.quantize(BertModel.from_pretrained(d)))
    batches = batches_for(fp32.config.pad_token_id, sentences)
    precision = resolve(for_model("auto", q))                           # the activations `predict` gives it here
    engines = sorted({str(m.engine) for m in q.modules() if isinstance(m, int8.Int8Linear)})

    def run(model, prec):
        def f():
            with torch.inference_mode(), autocast(prec):
                for b in batches:
                    model(**b)
        return f

    with torch.inference_mode():
        b = batches[0]
        real = b["attention_mask"].bool()
        diff = (fp32(**b).last_hidden_state - q(**b).last_hidden_state)[real].abs().max().item()
    secs = interleaved({"fp32": run(fp32, "fp32"), "int8": run(q, precision), "int8_fp32": run(q, "fp32")}, repeats)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    plan = runtime.plan("cpu")
    emit({"case": "family_int8", "family": model_type, "batches": len(batches), "real_tokens": tokens,
          "fp32_tok_s": round(tokens / secs["fp32"], 1), "int8_tok_s": round(tokens / secs["int8"], 1),
          "ratio": round(secs["fp32"] / secs["int8"], 3), "int8_path": engines, "int8_activations": precision,
          "int8_fp32_tok_s": round(tokens / secs["int8_fp32"], 1), "ratio_int8_fp32": round(secs["fp32"] / secs["int8_fp32"], 3),
          "plan_int8_engine": plan.int8_engine, "plan_int8_float_below": plan.int8_float_below,
          "plan_int8_why": plan.reasons.get("int8_linear"),
          "max_abs_diff_real_tokens": diff, "repeats": repeats, "threads": torch.get_num_threads(),
          "cpu": platform.processor() or platform.machine()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(SHAPES))
    ap.add_argument("--batches", type=int, default=2, help="batches of 64 sentences per timed repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--int8", action="store_true", help="bertkit int8 against bertkit fp32 (no transformers timing)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads for both (0: torch's default); 1 on a CPU other jobs share, where "
                         "threads waiting on each other swamp the kernels")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sentences = bbc_sentences(64 * args.batches)
    for model_type in args.families.split(","):
        (int8_case if args.int8 else case)(model_type, sentences, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
