"""`bertkit.load(dir_or_name)`: the model class a checkpoint names, as transformers' Auto classes pick it.

    model = bertkit.load("runs/sentiment/seed-1")                 # -> BertForSequenceClassification
    model = bertkit.load("org/name", dtype="bfloat16")            # any from_pretrained keyword

The class comes from config.json's `architectures`, in any family bertkit reads (`RobertaForMaskedLM` is
BertForMaskedLM with config.model_type "roberta"). A name bertkit has no class for (BertForMultipleChoice,
BertLMHeadModel, ...) or none at all loads the encoder, BertModel, and logs a warning saying so.
"""

from __future__ import annotations

import logging

import bertkit
from bertkit.config import read_config
from bertkit.families import SUFFIXES, bert_class_name
from bertkit.hub import resolve_model_dir

__all__ = ["load", "ARCHITECTURES"]

log = logging.getLogger("bertkit.auto")

# the config.json "architectures" names bertkit has a class of that name for
ARCHITECTURES = tuple(f"Bert{suffix}" for suffix in SUFFIXES)


def load(name_or_path, *, revision: str | None = None, **kwargs):
    """The model in `name_or_path` (a directory or a Hugging Face repo id, see bertkit.hub), built as the class its
    config.json `architectures` names; `kwargs` go to from_pretrained (dtype, device, config fields...)."""
    directory = resolve_model_dir(name_or_path, revision=revision)
    names = read_config(directory, {}).extra.get("architectures") or []
    known = [n for n in map(bert_class_name, names) if n in ARCHITECTURES]
    if not known:
        log.warning("%s: config.json architectures %s names no bertkit model class (%s); loading BertModel, the "
                    "encoder without its head", directory, names or "(none)", ", ".join(ARCHITECTURES))
    return getattr(bertkit, known[0] if known else "BertModel").from_pretrained(directory, **kwargs)
