"""int8 inference: bertkit against the anchors on real variable-length text, and fp32 vs int8 accuracy.

Run (one JSON line per case, then one line with every figure):

    flock /tmp/bertkit-bench.lock .venv/bin/python benchmarks/quantize.py --cases speed
    nice .venv/bin/python benchmarks/quantize.py --cases accuracy --work /tmp/q-acc     # fine-tunes; no timing

speed: BBC News sentences (bertkit.datasets, split at sentence ends, up to 128 tokens) in batches of 32 (padded to
the longest in the batch) and one at a time, through MiniLM-L6 (the real all-MiniLM-L6-v2 weights) and BERT-base
shape (random weights, saved once so every runner reads the same file):
  transformers fp32 (sdpa) | transformers + torch.ao dynamic int8 | onnxruntime fp32 | onnxruntime dynamic int8
  (quantize_dynamic, per-channel QInt8 weights, on bertkit's own ONNX export) | bertkit fp32 | bertkit bf16
  (where the CPU has native bf16: what precision "auto" runs) | bertkit int8 (as `predict` / `serve` run it here:
  the int8 kernel with fp32 activations where the runtime probe found it faster than the fastest float GEMM, else
  the int8 weights dequantized to float under "auto") | bertkit int8_kernel (the int8 kernel forced on, fp32
  activations) | bertkit int8 kernel under bf16 autocast (native bf16 only: int8 GEMMs on fp32 activations, bf16
  attention and residual stream) | bertkit int8_bf16_kernel (native bf16 and oneDNN's int8 GEMM: int8 GEMMs on
  bf16 activations, runtime.int8.qlinear_bf16, forced on). `--no-anchors` leaves out transformers and onnxruntime (bertkit's own paths only).
Each variant runs the whole text set per repeat, variants alternating (order reversed every repeat); the figure is
sequences/s from the median repeat; "ratios" divide bertkit int8 by each, "int8_vs_best_float" by the faster of
bertkit fp32 and bf16 (the target: >= 1.5x at batch 32, >= 1.2x at batch 1). Every runner gets the same
thread count.

accuracy: MiniLM-L6 fine-tuned by `bertkit finetune` (lr 5e-5, settings in ACCURACY_TASKS) on the sentiment
(Rotten Tomatoes), topic (BBC), NER (silver BBC tags; entity F1) and cloze QA (BBC; SQuAD F1, EM alongside) task
data, then `bertkit quantize --check TEST` with fp32 and "auto" activations: the test-split scores of fp32 and
int8 in points of the task's main metric, and the sizes on disk.

predict: the whole `bertkit predict` command on 1,000 unseen sentence pairs through a MiniLM-L6 pair classifier
(a short fine-tune, --work keeps it) and its int8 copy, at predict's default precision and at auto: seconds per
command (median of --repeats, alternating) and int8's speed-up (the target: >= 1.3x at the default precision).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import bbc_sentences  # noqa: E402

from bertkit import runtime  # noqa: E402
from bertkit.hardware import cpu_model, native_bf16  # noqa: E402


def emit(record: dict) -> dict:
    record.setdefault("threads", torch.get_num_threads())
    print(json.dumps(record), flush=True)
    return record


def work_dir(args, prefix: str) -> Path:
    """--threads applied, and the --work directory (a fresh temp one by default), made."""
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return work


def emit_all(records: list[dict]) -> dict:
    """The closing record: the machine, torch, this CPU's int8 plan and every record of the run."""
    return emit({"case": "all", "cpu": cpu_model(), "machine": platform.machine(), "torch": torch.__version__,
                 "int8_plan": [x for x in runtime.describe(runtime.plan("cpu")) if x.startswith("int8")],
                 "records": records})


def batches_of(model_dir: Path, texts: list[str], batch: int) -> list[dict]:
    from bertkit.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(model_dir)
    out = []
    for i in range(0, len(texts), batch):
        enc = tok(texts[i:i + batch], padding=True, truncation=True, max_length=128, return_tensors="pt")
        out.append({k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return out


def model_dir_for(name: str, work: Path) -> Path:
    from bertkit.datasets import minilm_dir
    if name == "minilm":
        return minilm_dir()
    from bertkit.config import BertConfig
    from bertkit.model import BertModel
    from bertkit.tokenizer import Tokenizer
    d = work / "base"
    if not (d / "model.safetensors").is_file():
        torch.manual_seed(0)
        BertModel(BertConfig.preset("base")).save_pretrained(d, tokenizer=Tokenizer.from_pretrained(minilm_dir()))
    return d


def torch_fn(m, precision="fp32"):
    from bertkit.precision import autocast

    def run(b):
        with torch.inference_mode(), autocast(precision):
            return m(**b).last_hidden_state
    return run


def anchors(model_dir: Path, work: Path, threads: int) -> dict:
    """transformers and onnxruntime, fp32 and dynamic int8, from the same weights file."""
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bertkit.export import export_onnx, onnx_session
    hf = transformers.BertModel.from_pretrained(str(model_dir), attn_implementation="sdpa").eval()
    hf_q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(hf), {torch.nn.Linear}, dtype=torch.qint8)
    onnx_fp = export_onnx(model_dir, work / f"{model_dir.name}.onnx")
    onnx_q = work / f"{model_dir.name}.int8.onnx"
    quantize_dynamic(str(onnx_fp), str(onnx_q), weight_type=QuantType.QInt8, per_channel=True)
    sessions = {"onnxruntime_fp32": onnx_session(onnx_fp, threads), "onnxruntime_int8": onnx_session(onnx_q, threads)}

    def ort(name):
        return lambda b: sessions[name].run(["last_hidden_state"], {k: v.numpy() for k, v in b.items()})
    return {"transformers_fp32": torch_fn(hf), "transformers_int8": torch_fn(hf_q),
            "onnxruntime_fp32": ort("onnxruntime_fp32"), "onnxruntime_int8": ort("onnxruntime_int8")}


def runners(model_dir: Path, work: Path, threads: int, with_anchors: bool = True) -> dict:
    """name -> fn(batch) for every variant, all built from the same weights file."""
    from bertkit.model import BertModel
    from bertkit.precision import for_model
    from bertkit.runtime import int8

    plan = runtime.plan("cpu")
    ours = runtime.freeze(BertModel.from_pretrained(model_dir))
    ours_q = runtime.freeze(int8.quantize(BertModel.from_pretrained(model_dir)))     # as the commands run it
    kernel = runtime.freeze(int8.quantize(BertModel.from_pretrained(model_dir)))
    int8.set_engine(kernel, plan.int8_engine)          # the int8 kernel, even where float measured faster here
    out = anchors(model_dir, work, threads) if with_anchors else {}
    out.update({"bertkit_fp32": torch_fn(ours), "bertkit_int8": torch_fn(ours_q, for_model("auto", ours_q)),
                "bertkit_int8_kernel": torch_fn(kernel)})
    if native_bf16("cpu"):                            # what precision "auto" runs here, float and int8
        out["bertkit_bf16"] = torch_fn(ours, "bf16")
        out["bertkit_int8_bf16"] = torch_fn(kernel, "bf16")
    if native_bf16("cpu") and int8.qlinear_bf16_ok():  # int8 GEMMs on bf16 activations, even where bf16 won here
        bf16_kernel = runtime.freeze(int8.quantize(BertModel.from_pretrained(model_dir)))
        int8.set_engine(bf16_kernel, plan.int8_engine, under_bf16=((1, True, int8.BF16_KERNEL_ALWAYS),))
        out["bertkit_int8_bf16_kernel"] = torch_fn(bf16_kernel, "bf16")
    return out


def interleaved(fns: dict, work, repeats: int) -> dict[str, float]:
    """Median seconds of `work(fn)` per variant, variants alternating, order reversed every repeat."""
    names = list(fns)
    for n in names:
        work(fns[n])
    times = {n: [] for n in names}
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            work(fns[n])
            times[n].append(time.perf_counter() - t)
    return {n: statistics.median(v) for n, v in times.items()}


def speed(args, work: Path) -> list[dict]:
    records = []
    texts = bbc_sentences(max(args.sentences, args.base_sentences))
    for name in args.models.split(","):
        model_dir = model_dir_for(name, work)
        fns = runners(model_dir, work, torch.get_num_threads(), not args.no_anchors)
        for batch in (32, 1):
            n = args.sentences if name == "minilm" else args.base_sentences
            n = n if batch > 1 else max(8, n // 4)
            bs = batches_of(model_dir, texts[:n], batch)

            def run_all(fn):
                for b in bs:
                    fn(b)
            t = interleaved(fns, run_all, args.repeats)
            seq_s = {k: round(n / v, 2) for k, v in t.items()}
            tokens = sum(int(b["attention_mask"].sum()) for b in bs)
            padded = sum(b["attention_mask"].numel() for b in bs)
            records.append(emit({
                "case": "speed", "model": name, "batch": batch, "sequences": n, "fill": round(tokens / padded, 3),
                "seq_per_s": seq_s, "ratios": {f"int8_vs_{k}": round(seq_s["bertkit_int8"] / v, 2)
                                               for k, v in seq_s.items() if k != "bertkit_int8"},
                "int8_vs_best_float": {k: round(seq_s[k] / max(seq_s["bertkit_fp32"], seq_s.get("bertkit_bf16", 0)), 2)
                                       for k in ("bertkit_int8", "bertkit_int8_kernel", "bertkit_int8_bf16_kernel")
                                       if k in seq_s}}))
    return records


# task data set -> (bertkit task kind, file extension, fine-tune settings); the NER and QA training sets are capped
# (and QA windows kept to 256 pieces) so each fine-tune stays short on one niced thread; dev and test are whole
ACCURACY_TASKS = {
    "sentiment": ("classify", "csv", {"max_length": 64, "epochs": 2}),
    "topic": ("classify", "csv", {"max_length": 128, "epochs": 3}),
    "ner": ("tag", "conll", {"max_length": 128, "epochs": 2, "max_train_examples": 6000}),
    "qa": ("qa", "json", {"max_length": 256, "epochs": 2, "max_train_examples": 600}),
}


def held_out(kind: str, data: Path, ext: str, settings: dict) -> tuple[Path, str]:
    """The file int8 is checked on and what it holds: test, plus for QA (184 test questions: one answer moves F1 by
    ~0.5 points) the training questions past max_train_examples whose articles the fine-tune never read."""
    test = data / f"test.{ext}"
    if kind != "qa" or not settings.get("max_train_examples"):
        return test, "test"
    from bertkit.tasks.qa import QATask
    from bertkit.tasks.readers import write_squad
    train = QATask().read(data / f"train.{ext}")
    seen = {e.title for e in train[:settings["max_train_examples"]]}
    unseen = [e for e in train[settings["max_train_examples"]:] if e.title not in seen]
    return write_squad(data / f"heldout.{ext}", QATask().read(test) + unseen), "test + the unseen training articles"


def accuracy(args, work: Path) -> list[dict]:
    from bertkit.datasets import minilm_dir
    from bertkit.quantize import quantize_dir
    from bertkit.tasks.data import build
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    records = []
    for task in args.tasks.split(","):
        kind, ext, s = ACCURACY_TASKS[task]
        data = work / "data" / task
        if not (data / f"test.{ext}").is_file():
            build(task, data)
        run = work / "runs" / task
        if not (run / "model.safetensors").is_file():
            finetune(FinetuneConfig(task=kind, model=str(minilm_dir()), train=str(data / f"train.{ext}"),
                                    dev=str(data / f"dev.{ext}"), out=str(run), max_length=s["max_length"],
                                    max_train_examples=s.get("max_train_examples"), quiet=True,
                                    training=finetune_recipe(lr=5e-5, epochs=s["epochs"])))
        summary = json.loads((run / "summary.json").read_text())
        check, split = held_out(kind, data, ext, s)
        for precision in ("fp32", "auto"):
            out = work / "int8" / f"{task}-{precision}"
            report = quantize_dir(run, out, check=check, max_drop=100.0, precision=precision,
                                  keep_float=tuple(args.keep_float), overwrite=True)
            records.append(emit({"case": "accuracy", "task": task, "model": "minilm-l6", "split": split,
                                 "finetune": {**s, "train_examples": summary["data"].get(
                                     "train_examples_used", summary["data"]["train_examples_in_file"])},
                                 **report["check"], "keep_float": args.keep_float,
                                 "size_bytes": report["size_bytes"]}))
    return records


def pair_model(work: Path) -> tuple[Path, Path, Path]:
    """A MiniLM-L6 pair classifier (a short fine-tune on the BBC pairs task), its int8 copy, and 1,000 pairs it
    never saw (the train split past the fine-tune's examples, then test), built once in `work`."""
    import csv

    from bertkit.datasets import minilm_dir
    from bertkit.quantize import quantize_dir
    from bertkit.tasks.data import build
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    data, run, q, pairs = work / "data" / "pairs", work / "runs" / "pairs", work / "int8" / "pairs", work / "pairs.csv"
    if not (data / "test.csv").is_file():
        build("pairs", data)
    if not (run / "model.safetensors").is_file():
        finetune(FinetuneConfig(task="pair", model=str(minilm_dir()), train=str(data / "train.csv"),
                                dev=str(data / "dev.csv"), out=str(run), max_length=96, max_train_examples=400,
                                quiet=True, training=finetune_recipe(lr=5e-5, epochs=1)))
    if not (q / "model.safetensors").is_file():
        quantize_dir(run, q, overwrite=True)
    rows = []
    for split in ("train", "test"):
        with open(data / f"{split}.csv", newline="", encoding="utf-8") as f:
            rows += list(csv.DictReader(f))[400 if split == "train" else 0:]
    with open(pairs, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["text", "text_pair"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows[:1000])
    return run, q, pairs


def predict_command(args, work: Path) -> list[dict]:
    """The whole `bertkit predict` command (a fresh process: start, model load, tokenization, inference, writing)
    on 1,000 unseen pairs, the int8 model against the float one, each at predict's default precision and at auto,
    alternating, `repeats` times: seconds (median) and int8's speed-up."""
    import subprocess
    import os
    run, q, pairs = pair_model(work)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    cmds = {f"{name}_{p}": [sys.executable, "-m", "bertkit", "predict", "--model", str(d), "--data", str(pairs),
                            "--out", str(work / f"{name}-{p}.jsonl"), "--overwrite", "--no-progress",
                            *(["--precision", p] if p != "default" else [])]
            for name, d in (("float", run), ("int8", q)) for p in ("default", "auto")}
    t = interleaved(cmds, lambda cmd: subprocess.run(cmd, env=env, check=True, capture_output=True), args.repeats)
    return [emit({"case": "predict", "pairs": 1000, "seconds": {k: round(v, 2) for k, v in t.items()},
                  "int8_speedup": {p: round(t[f"float_{p}"] / t[f"int8_{p}"], 2) for p in ("default", "auto")},
                  "int8_default_vs_float_best": round(min(t["float_default"], t["float_auto"]) / t["int8_default"],
                                                      2)})]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="speed", help="speed,accuracy,predict")
    p.add_argument("--models", default="minilm,base")
    p.add_argument("--sentences", type=int, default=256, help="MiniLM texts per repeat at batch 32 (1/4 at batch 1)")
    p.add_argument("--base-sentences", type=int, default=96, help="BERT-base texts per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="intra-op threads for every runner (default torch's)")
    p.add_argument("--no-anchors", action="store_true", help="speed: bertkit's own paths only")
    p.add_argument("--tasks", default="sentiment,topic,ner,qa", help="accuracy case: task data sets")
    p.add_argument("--keep-float", action="append", default=[], metavar="PATTERN",
                   help="accuracy case: layers kept in float (as `bertkit quantize --keep-float`)")
    p.add_argument("--work", default=None, help="directory for ONNX files, the base weights and fine-tuned runs")
    args = p.parse_args()
    work = work_dir(args, "bertkit-quantize-")
    records = []
    for case in args.cases.split(","):
        records += {"speed": speed, "accuracy": accuracy, "predict": predict_command}[case](args, work)
    emit_all(records)


if __name__ == "__main__":
    main()
