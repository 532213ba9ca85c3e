"""Speed of bertkit against transformers on an encoder family other than BERT: same machine, run, weights, batches.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/families.py --family modernbert [--threads 1]

ModernBERT-base shape (22 layers, hidden 768, GLU width 1152, a global layer every 3, a 128-token window elsewhere),
random weights saved by transformers and loaded by bertkit; real BBC sentences (tokenised with the MiniLM
WordPiece vocabulary: only the ids' lengths matter to speed) in batches of 64 padded to the longest; CPU, fp32,
inference. bertkit runs as its inference entry points do (`runtime.freeze`, attn_implementation "auto"), the
reference once per attention implementation. One JSON line per reference setting: real tokens/s and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import bbc_sentences, emit, interleaved, tokenize  # noqa: E402

from bertkit import runtime  # noqa: E402
from bertkit.model import BertModel  # noqa: E402

SHAPES = {"modernbert": dict(vocab_size=50368, hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
                             intermediate_size=1152, local_attention=128, global_attn_every_n_layers=3,
                             pad_token_id=0)}


def main(argv=None) -> int:
    import transformers
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="modernbert", choices=sorted(SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=3, help="batches of 64 sentences per timed repeat")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads for both (0: torch's default); 1 on a CPU other jobs share, where "
                         "threads waiting on each other swamp the kernels")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}
               for b in tokenize(bbc_sentences(64 * args.batches), 64)]
    cfg = transformers.AutoConfig.for_model(args.family, **SHAPES[args.family])
    torch.manual_seed(0)
    refs = {}
    with tempfile.TemporaryDirectory() as d:
        transformers.AutoModel.from_config(cfg).save_pretrained(d)
        ours = runtime.freeze(BertModel.from_pretrained(d))
        for impl in ("sdpa", "eager"):
            refs[impl] = transformers.AutoModel.from_pretrained(d, attn_implementation=impl).eval()

    def run(model):
        def go():
            with torch.inference_mode():
                for b in batches:
                    model(**b)
        return go

    lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1)]
    with torch.inference_mode():
        b = batches[0]
        real = b["attention_mask"].bool()
        diff = max((refs[i](**b).last_hidden_state - ours(**b).last_hidden_state)[real].abs().max().item()
                   for i in refs)
    secs = interleaved({"ours": run(ours)} | {i: run(m) for i, m in refs.items()}, args.repeats)
    tokens = sum(lengths)
    for impl in refs:
        emit({"case": f"{args.family}_bbc_fp32", "reference": impl, "batches": len(batches), "real_tokens": tokens,
              "padded_tokens": sum(b["input_ids"].numel() for b in batches),
              "ours_tok_s": round(tokens / secs["ours"], 1), "ref_tok_s": round(tokens / secs[impl], 1),
              "ratio": round(secs[impl] / secs["ours"], 3), "max_abs_diff_real_tokens": diff,
              "repeats": args.repeats})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
