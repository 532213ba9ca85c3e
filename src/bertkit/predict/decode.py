"""The heads' decoders: pure functions from model outputs to answers, one per head, shared by every front door
(answer spans: answers.py; which decoder serves which door: docs/architecture.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Container, Sequence

import numpy as np
import torch

from bertkit.errors import BertkitError, ConfigError
from bertkit.tokenizer.hfcall import word_ids  # the tokenizer's word ids: one rule for both

__all__ = ["label_names", "FUNCTIONS", "score_function", "class_scores", "relevance", "WORD_RULES", "word_ids", "word_labels",
           "hidden_states", "FillVocab", "top_fills", "join_pieces"]

FUNCTIONS = ("softmax", "sigmoid", "none")


def label_names(config) -> list[str]:
    """A head's label names as transformers gives them: config.id2label's, LABEL_i where the config has none (the
    config keeps no id2label for those defaults, nor does transformers 5 write one for one or two labels)."""
    names = config.id2label or {}
    return [str(names.get(i, f"LABEL_{i}")) for i in range(config.num_labels)]


def score_function(config, regression: str = "none") -> str:
    """How a sequence classifier's logits become scores, as transformers' pipeline decides: the raw value for
    regression (`regression` names another rule: TEI's /predict takes "sigmoid"), sigmoid for a multi-label model or
    a single output, softmax otherwise."""
    problem = getattr(config, "problem_type", None)
    if problem == "regression":
        return regression
    if problem == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    return "softmax"


def class_scores(logits, function: str):
    """(n, labels) logits -> scores by `function` (softmax / sigmoid / none), numpy in numpy out, torch in torch out."""
    if function not in FUNCTIONS:
        raise ConfigError(f"function_to_apply={function!r}: use 'softmax', 'sigmoid' or 'none'")
    t = torch.as_tensor(logits).float()
    if function == "softmax":
        t = torch.softmax(t, -1)
    elif function == "sigmoid":
        t = torch.sigmoid(t)
    return t.numpy() if isinstance(logits, np.ndarray) else t


def relevance(logits, activation, positive: int = 0) -> np.ndarray:
    """(n, labels) logits -> (n,) float32 scores as sentence-transformers' CrossEncoder.predict gives them: its
    `activation` (a torch module: Sigmoid, Identity...) on the logits, then label `positive`'s column (a one-output
    model's only one). Two or more raw logits (Identity) are softmaxed first, as predict(apply_softmax=True): one
    label's logit alone does not rank pairs, since softmax lets every logit of a row move together."""
    with torch.no_grad():
        scores = activation(torch.as_tensor(logits).float())
        if isinstance(activation, torch.nn.Identity) and scores.shape[-1] > 1:
            scores = scores.softmax(-1)
        return scores[:, positive].numpy().astype(np.float32)


WORD_RULES = ("first", "average", "max")


def word_labels(scores, words: Sequence[int | None], rule: str = "first") -> dict[int, tuple[int, float]]:
    """(seq, labels) scores (torch or numpy) and the word of each position -> {word: (label index, score)}: the
    scores of the word's first piece (the paper's NER rule), their mean over its pieces ("average"), or those of its
    most confident piece ("max"), as transformers' aggregation strategies name them."""
    if rule not in WORD_RULES:
        raise ConfigError(f"word labels: rule={rule!r} is not one of {WORD_RULES}")
    pieces: dict[int, list[int]] = {}
    for pos, w in enumerate(words):
        if w is not None:
            pieces.setdefault(w, []).append(pos)
    out: dict[int, tuple[int, float]] = {}
    for w, ps in pieces.items():
        if rule == "first":
            row = scores[ps[0]]
        elif rule == "max":
            row = scores[max(ps, key=lambda p: float(scores[p].max()))]
        else:
            row = scores[ps].mean(0)
        j = int(row.argmax())
        out[w] = (j, float(row[j]))
    return out


def hidden_states(out, layers: Sequence[int] | None = None) -> torch.Tensor:
    """An encoder output -> (batch, seq, hidden) token states: the last layer's, or the mean of `layers`' (0 =
    embeddings, -1 = last; the output must carry hidden_states)."""
    if layers is None:
        return out.last_hidden_state
    hs = out.hidden_states                                               # (layers+1) x (batch, seq, hidden)
    try:
        return torch.stack([hs[i] for i in layers]).mean(0)
    except IndexError:
        raise BertkitError(f"layers {list(layers)} out of range: the model has {len(hs) - 1} layers "
                           f"(0 = embeddings, -1 = last)") from None


@dataclass(frozen=True)
class FillVocab:
    """The pieces a [MASK] may take, as (vocab,) bool masks: those that start a word (not a continuation, not special,
    not "[unused..]"), those that continue one, and anything but [PAD] / [UNK] / [CLS] / [SEP] / [MASK]."""
    word_start: torch.Tensor
    continuation: torch.Tensor
    not_special: torch.Tensor

    @classmethod
    def of(cls, tok) -> "FillVocab":
        itos = tok.ids_to_tokens
        special = {tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id,
                   *tok.special_ids}
        # whether a piece continues a word can depend on the piece before it: ask each after a plain piece
        plain = next(i for i in range(len(itos)) if i not in special)
        cont = torch.tensor(tok.continues_word([j for i in range(len(itos)) for j in (plain, i)])[1::2],
                            dtype=torch.bool)
        never = torch.tensor([i in special or t.startswith("[") and t.endswith("]") for i, t in enumerate(itos)],
                             dtype=torch.bool)
        return cls(~cont & ~never, cont, torch.tensor([i not in special for i in range(len(itos))]))

    def allowed(self, words: bool) -> torch.Tensor:
        """Word starts only (words=True: a mask stands for a whole word), else anything not special."""
        return self.word_start if words else self.not_special


def top_fills(scores: torch.Tensor, allowed: torch.Tensor | None, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., vocab) log-probabilities (or probabilities) at mask positions -> each row's k best pieces among
    `allowed` ((vocab,) bool; None: any): (scores, ids), best first. k=1 is the argmax (the first of equal scores)."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -math.inf)
    if k == 1:
        return scores.max(-1, keepdim=True)
    return scores.topk(min(k, scores.shape[-1]))


def join_pieces(tok, ids: Sequence[int], skip: Container[int] = ()) -> str:
    """Pieces back to text as the tokenizer joins them (WordPiece: "cap ##ital" -> "capital"; BPE / Unigram: by the
    file's decoder), without transformers' clean-up; ids in `skip` left out."""
    return tok.join([i for i in ids if i not in skip])
