"""ONNX export of an encoder or a task model, with dynamic batch and sequence axes, checked with onnxruntime
(onnx / onnxruntime are optional: imported here only, lazily, with an install hint).

The graph takes `input_ids`, `attention_mask`, `token_type_ids` (none for a family without token types) and returns
the head's outputs under stable names (OUTPUTS). It is traced with the "eager" attention backend: the others take
data-dependent shortcuts (skip the mask when nothing is padded, unpad when padding is heavy) that a traced graph
would freeze for one input.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

import torch

from bertkit.atomic import replacing
from bertkit.errors import BertkitError
from bertkit.infer import Predictor
from bertkit.quantize import quantize_dir
from bertkit.runtime.int8 import Int8Linear, is_int8_dir
from bertkit.tokenizer.inputs import pad_batch

__all__ = ["export_onnx", "export_onnx_int8", "check_onnx", "onnx_session", "OUTPUTS"]

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def inputs_of(model) -> tuple[str, ...]:
    """The graph's inputs: a family without token types (DistilBERT, MPNet, ModernBERT, DeBERTa-v3) takes none,
    as transformers' own ONNX exports of them do."""
    return INPUTS if model.config.type_vocab_size else INPUTS[:2]


OUTPUTS = {"encoder": ["last_hidden_state", "pooler_output"], "mlm": ["logits"], "classify": ["logits"],
           "tag": ["logits"], "answer": ["start_logits", "end_logits"]}


def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise BertkitError(f"ONNX export needs the optional package {module!r}: pip install onnx onnxruntime "
                           f"(or: pip install 'bertkit[test]')") from None


class _Wrapped(torch.nn.Module):
    """Positional inputs, a tuple of named outputs: what the ONNX exporter wants."""

    def __init__(self, model, task: str):
        super().__init__()
        self.model = model
        self.task = task
        self.training = False       # the exporter restores this mode afterwards; a frozen model cannot train

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        if self.task == "encoder":
            pooled = out.pooler_output if out.pooler_output is not None else out.last_hidden_state[:, 0]
            return out.last_hidden_state, pooled
        if self.task == "mlm":
            return (out.logits if getattr(out, "logits", None) is not None else out.prediction_logits,)
        return tuple(getattr(out, name) for name in OUTPUTS[self.task])


def _sample_inputs(tok, batch: int, seq: int, pad_from: int | None = None, seed: int = 0) -> dict:
    """Random pieces laid out as the tokenizer lays out a pair ([CLS] a [SEP] b [SEP] for BERT): (batch, seq)
    inputs whose rows after the first are cut to about `pad_from` tokens and padded (the graph must honour the
    mask)."""
    g = torch.Generator().manual_seed(seed)
    rows, types = [], []
    for r in range(batch):
        n = seq if pad_from is None or r == 0 else min(pad_from, seq)
        body = torch.randint(5, len(tok), (max(n - tok.template.n_special(True), 2),), generator=g).tolist()
        a, b = body[:len(body) // 2], body[len(body) // 2:]
        rows.append(tok.template.wrap(a, b))
        types.append(tok.template.types(len(a), len(b)))
    return pad_batch(rows, types, tok.pad_token_id)


def export_onnx(model_dir: str | Path, out_path: str | Path, opset: int = 17) -> Path:
    """Export the model in `model_dir` (head detected like bertkit.infer) to `out_path` (.onnx)."""
    _require("onnx")
    pred = Predictor.load(model_dir)
    model = pred.model.eval()
    old = pred.encoder.config.attn_implementation
    pred.encoder.config.attn_implementation = "eager"
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        sample = _sample_inputs(pred.tokenizer, 2, 16, pad_from=10)
        names = OUTPUTS[pred.task]
        inputs = inputs_of(model)
        no_seq = {"pooler_output", *(names if pred.task == "classify" else ())}    # pooled / per-sequence outputs
        dynamic_axes = {n: {0: "batch"} if n in no_seq else {0: "batch", 1: "seq"} for n in (*inputs, *names)}
        with replacing(out_path) as tmp, torch.no_grad(), warnings.catch_warnings():
            # input checks in the model (ids in range, shapes) run once at trace time; they are not graph ops
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(_Wrapped(model, pred.task), tuple(sample[n] for n in inputs), str(tmp),
                              input_names=list(inputs), output_names=names, dynamic_axes=dynamic_axes,
                              opset_version=opset, dynamo=False)
    finally:
        pred.encoder.config.attn_implementation = old
    return out_path


@contextlib.contextmanager
def _quiet_root_logger():
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def export_onnx_int8(model_dir: str | Path, out_path: str | Path, opset: int = 17, check: bool = True
                     ) -> tuple[Path, dict | None]:
    """A dynamically quantized ONNX model (int8 weights per output channel, activations quantized in the graph,
    dynamic batch and sequence axes) from bertkit's int8 model (`model_dir` quantized first if it is fp32):
    its graph exported with the int8 weights' float values, then onnxruntime.quantization.quantize_dynamic, which
    recovers the same int8 weights. With `check`, `check_onnx` against bertkit's int8 model."""
    _require("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic
    out_path = Path(out_path)
    with tempfile.TemporaryDirectory(prefix="bertkit-int8-") as tmp:
        reference = Path(model_dir)
        if not is_int8_dir(reference):               # an fp32 model: its int8 copy first (bertkit quantize)
            reference = Path(tmp) / "model"
            quantize_dir(model_dir, reference, force=True)
        float_graph = export_onnx(reference, Path(tmp) / "float.onnx", opset=opset)
        with replacing(out_path) as part, warnings.catch_warnings(), _quiet_root_logger():
            warnings.simplefilter("ignore")    # it also logs a pre-processing hint to the root logger
            quantize_dynamic(str(float_graph), str(part), weight_type=QuantType.QInt8, per_channel=True,
                             extra_options={"MatMulConstBOnly": True})      # attention stays float, as ours
        return out_path, (check_onnx(reference, out_path) if check else None)


def onnx_session(onnx_path: str | Path, threads: int | None = None):
    ort = _require("onnxruntime")
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])


def _float_product(model: torch.nn.Module) -> torch.nn.Module | None:
    """A copy of an int8 model that multiplies its int8 weights in float (no activation rounding): what bertkit's
    int8 layers and an int8 ONNX graph of the same weights both approximate. None for a float model."""
    if not any(isinstance(m, Int8Linear) for m in model.modules()):
        return None
    floated = copy.deepcopy(model)
    for m in floated.modules():
        if isinstance(m, Int8Linear):
            m.float_below = sys.maxsize              # every input "short": the dequantized weights' float GEMM
    return floated


def check_onnx(model_dir: str | Path, onnx_path: str | Path,
               shapes: Sequence[tuple[int, int]] = ((1, 7), (3, 33), (8, 64))) -> dict:
    """Run PyTorch and onnxruntime on random batches of several shapes (rows after the first padded);
    return {"max_abs_diff": float, "per_output": {...}, "shapes": [...], "max_abs_output": float}. For an int8
    model also {"int8": {"onnx_vs_float", "bertkit_vs_float", "worst_ratio"}}: how far each int8 implementation is
    from the float product of the same int8 weights (the largest over every batch and output), and the largest
    ratio of the two on any one batch and output (two independent roundings differ by up to their sum)."""
    pred = Predictor.load(model_dir)
    sess = onnx_session(onnx_path)
    wrapped = _Wrapped(pred.model.eval(), pred.task)
    floated = _float_product(pred.model)
    floated = None if floated is None else _Wrapped(floated, pred.task)
    names = OUTPUTS[pred.task]
    worst = {n: 0.0 for n in names}
    vs_float = {"onnx_vs_float": 0.0, "bertkit_vs_float": 0.0, "worst_ratio": 0.0}
    scale = 0.0                                      # the largest |PyTorch output|: what a relative tolerance uses
    for i, (b, s) in enumerate(shapes):
        x = _sample_inputs(pred.tokenizer, b, s, pad_from=max(1, s * 2 // 3), seed=i + 1)
        args = tuple(x[n] for n in inputs_of(pred.model))
        with torch.no_grad():
            ref = wrapped(*args)
            flt = floated(*args) if floated is not None else [None] * len(ref)
        got = sess.run(names, {n: a.numpy() for n, a in zip(inputs_of(pred.model), args)})
        mask = x["attention_mask"].bool()
        for n, r, g, f in zip(names, ref, got, flt):
            r = r.float()
            g = torch.from_numpy(g).float()
            real = r.dim() >= 2 and r.shape[:2] == mask.shape     # per-token outputs: compare real tokens only
            if real:
                r, g = r[mask], g[mask]
            worst[n] = max(worst[n], float((r - g).abs().max()))
            scale = max(scale, float(r.abs().max()))
            if f is None:
                continue
            f = f.float()[mask] if real else f.float()
            far = {"onnx_vs_float": float((g - f).abs().max()), "bertkit_vs_float": float((r - f).abs().max())}
            far["worst_ratio"] = far["onnx_vs_float"] / max(far["bertkit_vs_float"], 1e-6 * (1 + scale))
            vs_float = {k: max(v, far[k]) for k, v in vs_float.items()}
    report = {"max_abs_diff": max(worst.values()), "per_output": worst, "shapes": [list(s) for s in shapes],
              "task": pred.task, "max_abs_output": scale}
    if floated is not None:
        report["int8"] = vs_float
    return report
