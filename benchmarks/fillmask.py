"""Joint multi-mask fill vs independent per-mask argmax, on held-out BBC sentences with 2-3 masked words.

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/fillmask.py [--model runs/demo/pretrain/model]

The model must know English and have a masked-LM head: MiniLM-L6 has none, so the default is the `mini` model that
`make demo` pre-trains on the BBC training articles (runs/demo/pretrain/model). A stronger one: MiniLM-L6 with
continued MLM pre-training on the BBC training articles (`bertkit prepare --task none --masking wwm --dynamic` on
its vocab, then `bertkit pretrain SHARDS --init MINILM_DIR --objective mlm --budget 15m --lr 1e-4`). The sentences come from the BBC
*test* articles of the same split (datasets.split_by_seed(articles, seed=0)), which pre-training never saw. In each
sentence 2 or 3 words that the vocabulary holds as one piece are replaced by [MASK]: adjacent words ("contiguous",
where the masks depend on each other most) and words anywhere ("scattered"). Exact match = all masks right.
Ours = bertkit joint decoding (beam search over the masks + pseudo-likelihood re-ranking, each mask a word-start
piece); the reference = the argmax of each mask from one forward pass (what transformers' fill-mask pipeline returns
per mask); also shown: that argmax restricted to word-start pieces ("independent_words"), so the gain of decoding
jointly shows apart from the gain of the constraint. "all" sums both span kinds. Both run on the same
sentences in the same process. One JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def heldout_sentences(seed: int = 0) -> list[str]:
    from bertkit import datasets
    from bertkit.pretraining import split_sentences
    _, _, test = datasets.split_by_seed(datasets.bbc_articles(), seed=seed)
    out = []
    for a in test:
        for p in a.paragraphs:
            out.extend(s for s in split_sentences(p) if 8 <= len(s.split()) <= 40)
    return out


def adapt_minilm(out_dir: Path, steps: int, seed: int = 0) -> Path:
    """MiniLM-L6 + a new masked-LM head (decoder tied to MiniLM's word embeddings), the head trained for `steps`
    steps of MLM on the BBC *train* articles with the encoder frozen. Written as an HF-format directory."""
    import torch
    from bertkit import BertForMaskedLM, Tokenizer, datasets
    from bertkit.pretraining import PrepareConfig, ShardReader, prepare
    from bertkit.precision import autocast
    d = datasets.minilm_dir()
    train, _, _ = datasets.split_by_seed(datasets.bbc_articles(), seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = out_dir / "bbc_train.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for a in train:
            f.write("\n".join([a.title, *a.paragraphs]) + "\n\n")
    prepare(PrepareConfig(str(corpus), str(d / "vocab.txt"), out_dir / "shards", seq_len=128, task="none",
                          masking="wwm", dynamic=True, overwrite=True, seed=seed))
    torch.manual_seed(seed)
    model = BertForMaskedLM.from_pretrained(str(d))
    for p in model.bert.parameters():
        p.requires_grad_(False)
    head = [p for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(head, lr=1e-3)
    batches = iter(ShardReader(out_dir / "shards", batch_size=32, seed=seed, infinite=True))
    for step in range(steps):
        b = next(batches)
        b.pop("next_sentence_label", None)
        with autocast(None, "cpu"):           # bf16 where the CPU has it natively, else fp32
            loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 20 == 0 or step == steps - 1:
            print(f"adapt step {step}: loss {float(loss):.3f}", file=sys.stderr, flush=True)
    model.save_pretrained(out_dir / "model", tokenizer=Tokenizer.from_pretrained(d))
    return out_dir / "model"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="runs/demo/pretrain/model")
    ap.add_argument("--sentences", type=int, default=300, help="per span kind")
    ap.add_argument("--beam-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--adapt-minilm", type=int, default=0, metavar="STEPS",
                    help="instead of --model: MiniLM-L6 with a new MLM head trained STEPS steps on BBC train "
                         "articles (encoder frozen), saved under runs/fillmask-minilm-mlm")
    args = ap.parse_args()
    if args.adapt_minilm:
        args.model = str(adapt_minilm(Path("runs/fillmask-minilm-mlm"), args.adapt_minilm, args.seed))
    from bertkit.fillmask_eval import MultiMaskOptions, multi_mask_eval
    from bertkit.infer import Predictor
    if not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"{args.model}: no model (run `make demo` first, or pass --model DIR with an MLM head)")
    import torch
    torch.set_num_threads(max(1, torch.get_num_threads()))
    p = Predictor.load(args.model)
    sents = heldout_sentences(args.seed)
    res = {}
    for span in ("contiguous", "scattered"):
        t0 = time.perf_counter()
        r = multi_mask_eval(p, sents, MultiMaskOptions(span=span, limit=args.sentences, beam_size=args.beam_size,
                                                       seed=args.seed))
        r["seconds"] = round(time.perf_counter() - t0, 1)
        res[span] = r
    summary = {"benchmark": "fillmask", "model": args.model, "beam_size": args.beam_size}
    for span, r in res.items():
        summary[span] = {"sentences": r["sentences"], "masks": r["masks"],
                         "ours_joint_exact": round(r["joint_exact"], 4),
                         "reference_independent_exact": round(r["independent_exact"], 4),
                         "ratio": round(r["joint_exact"] / r["independent_exact"], 3) if r["independent_exact"] else None,
                         "joint_per_mask": round(r["joint_per_mask"], 4),
                         "independent_per_mask": round(r["independent_per_mask"], 4),
                         "joint_exact_count": r["joint_exact_count"],
                         "independent_exact_count": r["independent_exact_count"],
                         "independent_words_exact_count": r["independent_words_exact_count"],
                         "independent_words_per_mask": round(r["independent_words_per_mask"], 4),
                         "seconds": r["seconds"]}
    both = {k: sum(summary[span][k] for span in res) for k in
            ("sentences", "joint_exact_count", "independent_exact_count", "independent_words_exact_count")}
    summary["all"] = {**both, "ours_joint_exact": round(both["joint_exact_count"] / both["sentences"], 4),
                      "reference_independent_exact": round(both["independent_exact_count"] / both["sentences"], 4)}
    print(json.dumps(summary))
    for e in res["contiguous"]["examples"][:5]:
        print(f"  {e['masked']}\n    truth {e['truth']}  joint {e['joint']}  independent {e['independent']}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
