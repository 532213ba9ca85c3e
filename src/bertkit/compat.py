"""What transformers' PreTrainedModel offers beyond the maths, for BertModel and the heads (`BertPreTrainedModel`
mixes this in): input-embedding access and resizing, weight tying, gradient checkpointing (docs/transformers.md).

    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8)   # new rows: the mean of the old rows
    model.gradient_checkpointing_enable()                                  # each encoder layer recomputed in backward

Resizing keeps the `nn.Embedding` object and gives it a new weight, so everything that holds it (the tied MLM
decoder, ELECTRA's shared embeddings) follows. New rows are the mean of the old ones: the deterministic version of
transformers' `mean_resizing`, a normal centred there with a vanishing covariance.
"""

from __future__ import annotations

import torch
from torch import nn

from bertkit.errors import ConfigError

__all__ = ["PreTrainedMixin"]


class PreTrainedMixin:
    """transformers' PreTrainedModel conveniences; the host has `config`, `base_model_prefix` and is an nn.Module."""

    supports_gradient_checkpointing = True

    @property
    def base_model(self) -> nn.Module:
        """The BertModel inside a head model (`.bert`), or the model itself."""
        return getattr(self, self.base_model_prefix, self)

    def get_input_embeddings(self) -> nn.Module:
        return self.base_model.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """Use `value` as the word embeddings (the tied MLM decoder follows; config.vocab_size becomes its size)."""
        if not isinstance(value, nn.Embedding) or value.embedding_dim != self.config.hidden_size:
            raise ConfigError(f"set_input_embeddings needs an nn.Embedding(n, {self.config.hidden_size}), got "
                              f"{value!r}")
        self.config.replace(vocab_size=value.num_embeddings)
        self.base_model.embeddings.word_embeddings = value
        self._vocab_resized(value.num_embeddings)

    def tie_weights(self) -> None:
        """Point every MLM decoder at the current word embeddings (they are tied by reference, not by copy)."""
        embedding = self.get_input_embeddings()
        for m in self.modules():
            if hasattr(m, "tie_to"):
                m.tie_to(embedding)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """Give the word embeddings `new_num_tokens` rows (rounded up to a multiple of `pad_to_multiple_of`); see
        docs/transformers.md for how rows are kept and initialised. mean_resizing=False: new rows drawn as at init
        (normal(0, initializer_range)). Returns the embedding module."""
        embedding = self.get_input_embeddings()
        if any(getattr(m, "inference_only", False) for m in self.modules()):
            raise ConfigError("this model is frozen for inference (bertkit.runtime.freeze): load it again to resize")
        if not isinstance(embedding, nn.Embedding):
            raise ConfigError(f"resize_token_embeddings needs an nn.Embedding, the model has "
                              f"{type(embedding).__name__} (restore it first)")
        n = _target_size(embedding.num_embeddings if new_num_tokens is None else new_num_tokens, pad_to_multiple_of)
        self.config.replace(vocab_size=n)                # checked before anything changes (e.g. pad_token_id)
        old = embedding.weight
        with torch.no_grad():
            weight = old.new_empty(n, old.shape[1])
            keep = min(n, old.shape[0])
            weight[:keep] = old[:keep]
            if n > keep and mean_resizing:
                weight[keep:] = old.float().mean(0).to(old.dtype)
            elif n > keep:
                weight[keep:].normal_(0.0, self.config.initializer_range)
        embedding.weight = nn.Parameter(weight, requires_grad=old.requires_grad)
        embedding.num_embeddings = n
        self._vocab_resized(n)
        return embedding

    def _vocab_resized(self, n: int) -> None:
        self.config.vocab_size = n
        self.tie_weights()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each encoder layer in backward instead of keeping its activations (see docs/transformers.md).
        gradient_checkpointing_kwargs: transformers' argument; only use_reentrant=False is supported."""
        kwargs = dict(gradient_checkpointing_kwargs or {})
        if kwargs.pop("use_reentrant", False) or kwargs:
            raise ConfigError(f"gradient_checkpointing_kwargs={gradient_checkpointing_kwargs!r}: bertkit "
                              f"checkpoints with use_reentrant=False and takes no other option")
        self._checkpoint_layers(True)

    def gradient_checkpointing_disable(self) -> None:
        self._checkpoint_layers(False)

    @property
    def is_gradient_checkpointing(self) -> bool:
        return any(m.execution.checkpoint_layers for m in self._encoders())

    def _encoders(self) -> list[nn.Module]:
        return [m for m in self.modules() if hasattr(m, "execution")]

    def _checkpoint_layers(self, on: bool) -> None:
        for m in self._encoders():
            m.execution = m.execution.with_(checkpoint_layers=on)


def _target_size(n, multiple) -> int:
    """n rounded up to a multiple of `multiple` (None: n itself); errors name the bad value."""
    for name, value in (("new_num_tokens", n), ("pad_to_multiple_of", 1 if multiple is None else multiple)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"resize_token_embeddings: {name} must be a positive int, got {value!r}")
    return n if multiple is None else -(-n // multiple) * multiple
