"""A compact word-embedding table for fine-tuning: train only the rows the training data uses, exactly.

A row no training example contains gets a zero gradient at every step, so AdamW only multiplies it by
(1 - lr * weight_decay). The compact table's one parameter holds the used rows plus a *sentinel* row of ones that no
id maps to: it gets that same zero gradient, so it holds the product of the decay factors applied, and an unused row
is its initial value times the sentinel. The state dict is the full table under the usual name. docs/training.md
has the whole argument and the limits (AdamW only, untied tables, fp32 parameters).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import ConfigError

__all__ = ["CompactEmbedding", "compact_word_embeddings", "restore_word_embeddings"]


class CompactEmbedding(nn.Module):
    """Stands in for an `nn.Embedding(vocab, hidden, padding_idx)` whose rows outside `used` get no gradient."""

    def __init__(self, embedding: nn.Embedding, used: Tensor):
        super().__init__()
        full = embedding.weight.detach()
        vocab, hidden = full.shape
        used = torch.unique(used.to(torch.long).cpu())
        if used.numel() and (used.min() < 0 or used.max() >= vocab):
            raise ConfigError(f"compact embedding: token ids must lie in [0, {vocab}), got {used.min()}..{used.max()}")
        self.num_embeddings, self.embedding_dim = vocab, hidden
        index = torch.full((vocab,), -1, dtype=torch.long)
        index[used] = torch.arange(used.numel())
        self.register_buffer("index", index.to(full.device), persistent=False)          # (vocab,) id -> row or -1
        self.register_buffer("used", used.to(full.device), persistent=False)            # (rows,)
        self.register_buffer("full", full, persistent=False)        # (vocab, hidden) at the start (shares storage)
        rows = torch.cat([full[self.used], torch.ones(1, hidden, dtype=full.dtype, device=full.device)])
        self.rows = nn.Parameter(rows)                            # (rows + 1, hidden): the last is the sentinel
        pad = embedding.padding_idx
        self.padding_idx = pad
        self._row_padding_idx = int(index[pad]) if pad is not None and index[pad] >= 0 else None
        self.rows.requires_grad_(embedding.weight.requires_grad)             # a frozen table stays frozen

    @property
    def weight(self) -> Tensor:
        """The full (vocab, hidden) table as it stands (a new tensor each call; differentiable through the rows)."""
        return (self.full * self.rows[-1]).index_copy(0, self.used, self.rows[:-1])

    def forward(self, input_ids: Tensor) -> Tensor:
        idx = self.index[input_ids]
        known = idx >= 0
        if bool(known.all()):                                     # every id is a trained row: the compact table
            return F.embedding(idx, self.rows, padding_idx=self._row_padding_idx)
        if torch.is_grad_enabled() and self.rows.requires_grad:
            # an untrained row would feed the sentinel a gradient, and it would stop tracking the decay
            bad = torch.unique(input_ids[~known])[:5].tolist()
            raise ConfigError(f"compact embedding: ids {bad} are not among the {self.used.numel()} trained rows; a "
                              "training batch may only hold ids given to compact_word_embeddings (evaluate under "
                              "torch.no_grad)")
        # no grad (dev / test text): trained rows from the table, the others decayed by the sentinel's factor
        trained = F.embedding(idx.clamp(min=0), self.rows)
        other = F.embedding(input_ids, self.full) * self.rows[-1]
        return torch.where(known.unsqueeze(-1), trained, other)

    # -- state_dict as a plain embedding: `<prefix>weight` is the full table. Reading it folds the decay so far into
    # the start (the same numbers): a run resumed from that table then rounds exactly as the unbroken run does.
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        with torch.no_grad():
            destination[prefix + "weight"] = self.weight
            self.full = self.full * self.rows[-1]
            self.rows[-1].fill_(1.0)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "weight"
        if key not in state_dict:
            missing_keys.append(key)
            return
        w = state_dict[key]
        if tuple(w.shape) != tuple(self.full.shape):
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(w.shape)}, the model "
                              f"has {tuple(self.full.shape)}")
            return
        with torch.no_grad():
            self.full.copy_(w)
            self.rows[:-1].copy_(self.full[self.used])
            self.rows[-1].fill_(1.0)
        if strict:
            for k in state_dict:
                if k.startswith(prefix) and k != key and "." not in k[len(prefix):]:
                    unexpected_keys.append(k)

    def release(self) -> nn.Embedding:
        """A plain nn.Embedding holding the current full table (trainable), on this module's device."""
        with torch.no_grad():
            table = self.weight
        return nn.Embedding.from_pretrained(table, freeze=False, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, trained rows={self.used.numel()}"


def _embeddings(model: nn.Module) -> nn.Module | None:
    """The module holding `word_embeddings` (BertEmbeddings of a head model or of a bare encoder)."""
    return getattr(getattr(model, "bert", model), "embeddings", None)


def compact_word_embeddings(model: nn.Module, used_ids: Tensor, optimizer: str = "adamw") -> CompactEmbedding:
    """Swap the model's word-embedding table for a CompactEmbedding over `used_ids` (in place); returns it.
    `restore_word_embeddings(model)` puts a plain nn.Embedding with the trained table back."""
    if optimizer != "adamw":
        raise ConfigError(f"a compact embedding table is exact for AdamW only, not {optimizer!r}")
    owner = _embeddings(model)
    emb = getattr(owner, "word_embeddings", None)
    if not isinstance(emb, nn.Embedding):
        raise ConfigError(f"{type(model).__name__}: no bert.embeddings.word_embeddings nn.Embedding to compact")
    for m in model.modules():                                   # a tied output layer gives every row a gradient
        if m.__dict__.get("_word_embeddings") is emb:
            raise ConfigError(f"{type(model).__name__}: the word embeddings are tied to an output layer; every row "
                              "is trained, so a compact table would change the maths")
    owner.word_embeddings = CompactEmbedding(emb, used_ids)
    return owner.word_embeddings


def restore_word_embeddings(model: nn.Module) -> None:
    """Undo `compact_word_embeddings`: a plain nn.Embedding with the trained table (no-op if not compacted)."""
    owner = _embeddings(model)
    if isinstance(getattr(owner, "word_embeddings", None), CompactEmbedding):
        owner.word_embeddings = owner.word_embeddings.release()
