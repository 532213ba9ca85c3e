"""int8 against fp32 accuracy of every encoder family on a real task: BBC topic (5 classes, bertkit's own data).

Run (one JSON line per family; fine-tunes, no timing):

    nice .venv/bin/python benchmarks/families_int8_accuracy.py --work /tmp/fam-int8
    nice .venv/bin/python benchmarks/families_int8_accuracy.py --families roberta,modernbert --epochs 3

Per family: a small model of it (4 layers, hidden 256, transformers' config class, random init, saved with
save_pretrained next to MiniLM's WordPiece tokenizer: the tokenizer kind does not change what int8 does to the
weights), fine-tuned on the topic training split as `bertkit finetune --task classify` runs it, quantized as
`bertkit quantize --check TEST` runs it, the fp32 and int8 models scored on the same test split (the gate's own
evaluation): accuracy of both and the drop in points.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from families import SHAPES  # noqa: E402
from inference import emit  # noqa: E402

SMALL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def small_shape(model_type: str) -> dict:
    """The family's base-shape settings (families.SHAPES) at 4 layers and hidden 256, MiniLM's ids ([PAD] 0,
    [CLS] 101, [SEP] 102)."""
    if model_type == "distilbert":
        return dict(dim=256, n_layers=4, n_heads=4, hidden_dim=1024, pad_token_id=0)
    shape = {**SHAPES[model_type], **SMALL, "pad_token_id": 0}
    if model_type in ("electra", "albert"):
        shape["embedding_size"] = 128
    if model_type == "modernbert":
        shape.update(intermediate_size=384, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102)
    return shape


def build_model(model_type: str, out: Path, labels: list[str]) -> Path:
    import torch
    import transformers
    from bertkit.datasets import minilm_dir
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=30522, **small_shape(model_type),
                                            id2label=dict(enumerate(labels)),
                                            label2id={x: i for i, x in enumerate(labels)})
    torch.manual_seed(0)
    transformers.AutoModelForSequenceClassification.from_config(cfg).save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, out / name)
    return out


def family_case(model_type: str, data: Path, work: Path, args) -> dict:
    from bertkit.quantize import quantize_dir
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    labels = sorted({r["label"] for r in _rows(data / "train.csv")})
    start = build_model(model_type, work / "init" / model_type, labels)
    run = work / "runs" / model_type
    if not (run / "summary.json").is_file():
        finetune(FinetuneConfig(task="classify", model=str(start), train=str(data / "train.csv"),
                                dev=str(data / "dev.csv"), out=str(run), max_length=args.max_length,
                                max_train_examples=args.max_train_examples, quiet=True,
                                training=finetune_recipe(lr=args.lr, epochs=args.epochs)))
    trained = next(p.parent for p in run.rglob("model.safetensors"))
    report = quantize_dir(trained, work / "int8" / model_type, check=data / "test.csv", max_drop=100.0,
                          precision="fp32", overwrite=True)
    return emit({"case": "family_int8_accuracy", "family": model_type, "task": "topic", "split": "test",
                 "finetune": {"epochs": args.epochs, "lr": args.lr, "max_length": args.max_length,
                              "max_train_examples": args.max_train_examples, "shape": small_shape(model_type)},
                 **report["check"], "size_bytes": report["size_bytes"]})


def _rows(path: Path) -> list[dict]:
    import csv
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(SHAPES))
    ap.add_argument("--work", type=Path, default=Path("/tmp/bertkit-families-int8"))
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=5e-4, help="from random init: higher than the paper's 5e-5")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--max-train-examples", type=int, default=None)
    args = ap.parse_args(argv)
    from bertkit.tasks.data import build
    data = args.work / "data" / "topic"
    if not (data / "test.csv").is_file():
        build("topic", data)
    for model_type in args.families.split(","):
        family_case(model_type, data, args.work, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
