"""Which head a model directory carries: its config.json "architectures" (of any family), else its weight names.

    model_class, task = head_of(model_dir)      # e.g. (BertForSequenceClassification, "classify")
"""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from bertkit import heads
from bertkit.config import read_json_config
from bertkit.errors import CheckpointError
from bertkit.families import bert_class_name
from bertkit.model import BertModel

__all__ = ["ARCHITECTURES", "architecture", "head_of"]

# config.json "architectures" -> (bertkit class, task)
ARCHITECTURES = {
    "BertForMaskedLM": (heads.BertForMaskedLM, "mlm"),
    "BertForPreTraining": (heads.BertForPreTraining, "mlm"),
    "BertForSequenceClassification": (heads.BertForSequenceClassification, "classify"),
    "BertForTokenClassification": (heads.BertForTokenClassification, "tag"),
    "BertForQuestionAnswering": (heads.BertForQuestionAnswering, "answer"),
    "BertModel": (BertModel, "encoder"),
}
# a checkpoint without "architectures": its head by the first weight-name prefix it has
_BY_WEIGHTS = (("cls.seq_relationship", "BertForPreTraining"), ("cls.predictions", "BertForMaskedLM"),
               ("qa_outputs", "BertForQuestionAnswering"))


def architecture(model_dir: Path) -> str:
    """The head a checkpoint carries: config.json "architectures", else the weight names."""
    cfg_path = model_dir / "config.json"
    if model_dir.is_file():
        raise CheckpointError(f"{model_dir}: is a file; expected an HF-format model directory (config.json + weights)")
    if not cfg_path.is_file():
        raise CheckpointError(f"{model_dir}: no config.json (expected an HF-format model directory)")
    cfg = read_json_config(cfg_path, CheckpointError)
    for arch in cfg.get("architectures") or []:
        arch = bert_class_name(arch)                    # RobertaForMaskedLM -> BertForMaskedLM
        if arch in ARCHITECTURES:
            return arch
    keys: list[str] = []
    st = model_dir / "model.safetensors"
    if st.is_file():
        with safe_open(str(st), framework="pt") as f:
            keys = list(f.keys())
    for prefix, arch in _BY_WEIGHTS:
        if any(k.startswith(prefix) for k in keys):
            return arch
    if any(k.startswith("classifier") for k in keys):
        return "BertForTokenClassification" if cfg.get("task") == "tag" else "BertForSequenceClassification"
    return "BertModel"


def head_of(model_dir: Path) -> tuple[type, str]:
    """(bertkit model class, task) of the checkpoint in `model_dir`."""
    return ARCHITECTURES[architecture(Path(model_dir))]
