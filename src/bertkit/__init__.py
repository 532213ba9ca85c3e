"""bertkit: BERT, whole and fast, on PyTorch.

    from bertkit import Tokenizer, BertConfig, BertForMaskedLM
    tok = Tokenizer.from_pretrained("path/to/model_or_vocab.txt")
    model = BertForMaskedLM.from_pretrained("path/to/model")

Public names are imported lazily, so `import bertkit` (and the tokenizer alone) does not pay for importing torch.
"""

from __future__ import annotations

import importlib

from bertkit.errors import (BertkitError, CheckpointError, ConfigError, DataError, DatasetUnavailable,
                            VocabError)

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "Tokenizer": "bertkit.tokenizer",
    "train_vocab": "bertkit.vocab",
    "BertConfig": "bertkit.config",
    "BertModel": "bertkit.model",
    "BertForPreTraining": "bertkit.heads",
    "BertForMaskedLM": "bertkit.heads",
    "BertForSequenceClassification": "bertkit.heads",
    "BertForTokenClassification": "bertkit.heads",
    "BertForQuestionAnswering": "bertkit.heads",
    "BertForReplacedTokenDetection": "bertkit.heads",
    "FinetuneConfig": "bertkit.tasks.runner",
    "finetune": "bertkit.tasks.runner",
    "extract_features": "bertkit.tasks.features",
    "ShardReader": "bertkit.pretraining.shards",
    "Predictor": "bertkit.infer",
    "cosine_search": "bertkit.infer",
    "TrainConfig": "bertkit.train",
    "resolve_model_dir": "bertkit.hub",
    "load": "bertkit.auto",
    "pipeline": "bertkit.pipelines",
    "train": "bertkit.train",          # the package itself, callable as its train() (bertkit/train/__init__.py)
}

__all__ = ["BertkitError", "CheckpointError", "ConfigError", "DataError", "DatasetUnavailable", "VocabError",
           "__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bertkit' has no attribute {name!r}")
    value = importlib.import_module(module)
    if name != "train":
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
