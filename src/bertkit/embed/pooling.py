"""Token states -> one vector per text: pooling, optional Dense projections, optional L2 normalisation, with the
maths of sentence-transformers' `Pooling`, so its checkpoints give the same vectors.

    Pooling("mean")(hidden, mask)                 (batch, seq, hidden) + (batch, seq) -> (batch, hidden)
    SentenceEncoder(bert, Pooling("mean"), normalize=True)(input_ids, token_type_ids, attention_mask)
                                                  -> (batch, dim)

Modes: cls / last_token (the first / last attended token), max, mean, mean_sqrt_len (the sum over sqrt(count)),
weighted_mean (weights 1, 2, 3, ... from the first attended token); several concatenate in the order given. A
Pooling with include_prompt=False leaves a prompt's tokens ([CLS] included) out of the pooled ones, the weighted
mean's weights still counted from the first token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.errors import ConfigError
from bertkit.predict.decode import hidden_states
from bertkit.predict.engine import PRECISION, encode, forward_batches, id_batch
from bertkit.progress import bar as progress_bar

__all__ = ["MODES", "Pooling", "Dense", "SentenceEncoder", "Prompts", "ACTIVATIONS"]

MODES = ("cls", "max", "mean", "mean_sqrt_len", "weighted_mean", "last_token")
# sentence-transformers' spellings (and short forms) of the same modes
_ALIASES = {"mean_tokens": "mean", "mean_sqrt_len_tokens": "mean_sqrt_len", "weightedmean": "weighted_mean",
            "lasttoken": "last_token", "last": "last_token", "max_tokens": "max", "cls_token": "cls",
            "mean-sqrt-len": "mean_sqrt_len", "weighted-mean": "weighted_mean", "last-token": "last_token"}

ACTIVATIONS = {"identity": nn.Identity, "tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def _canonical(mode: str) -> str:
    name = _ALIASES.get(mode, mode)
    if name not in MODES:
        raise ConfigError(f"pooling mode {mode!r} is not one of {', '.join(MODES)}")
    return name


def _first_attended(mask: Tensor) -> Tensor:
    """(batch, seq) mask -> (batch,) index of the first 1 (0 for an all-zero row)."""
    return mask.to(torch.int32).argmax(dim=1)


def _last_attended(mask: Tensor) -> Tensor:
    """(batch, seq) mask -> (batch,) index of the last 1 (seq - 1 for an all-zero row)."""
    seq = mask.shape[1]
    found, from_end = mask.to(torch.int32).flip(1).max(dim=1)
    return torch.where(found == 0, seq - 1, seq - 1 - from_end)


def _gather_rows(hidden: Tensor, index: Tensor) -> Tensor:
    """(batch, seq, hidden), (batch,) -> (batch, hidden): one position per row."""
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


class Pooling(nn.Module):
    """(batch, seq, hidden) token states and a (batch, seq) attention mask -> (batch, len(modes) * hidden)."""

    def __init__(self, mode: str | Sequence[str] = "mean", hidden_size: int | None = None,
                 include_prompt: bool = True):
        super().__init__()
        modes = [mode] if isinstance(mode, str) else list(mode)
        if not modes:
            raise ConfigError("Pooling needs at least one mode")
        self.modes = tuple(dict.fromkeys(_canonical(m) for m in modes))     # concatenated in the order given
        self.hidden_size = hidden_size
        self.include_prompt = include_prompt       # False: a prompt's tokens are not pooled

    @property
    def mode(self) -> str:
        return "+".join(self.modes)

    def output_dim(self) -> int:
        if self.hidden_size is None:
            raise ConfigError("Pooling.output_dim needs the hidden size")
        return self.hidden_size * len(self.modes)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"

    def forward(self, hidden: Tensor, attention_mask: Tensor | None = None,
                prompt_length: int | Tensor = 0) -> Tensor:
        """prompt_length: the prompt's tokens at the start of each text ([CLS] included; an int, or one per row),
        left out of the pooled tokens where include_prompt is False."""
        if attention_mask is None:
            attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        first = _first_attended(attention_mask)                                     # (batch,)
        if not self.include_prompt and (torch.is_tensor(prompt_length) or prompt_length):
            pos = torch.arange(hidden.shape[1], device=hidden.device)
            attention_mask = attention_mask * (pos >= (first + prompt_length).unsqueeze(1))
        # half-precision sums lose digits over long sequences: accumulate in fp32, return the input dtype
        acc = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
        m = attention_mask.unsqueeze(-1).to(acc)                                    # (batch, seq, 1)
        out = []
        for mode in self.modes:
            if mode == "cls":
                out.append(_gather_rows(hidden, _first_attended(attention_mask)))
            elif mode == "last_token":
                out.append(_gather_rows(hidden, _last_attended(attention_mask)))
            elif mode == "max":
                out.append(hidden.masked_fill(m == 0, float("-inf")).amax(dim=1))
            elif mode in ("mean", "mean_sqrt_len"):
                total = (hidden.to(acc) * m).sum(dim=1)                              # (batch, hidden)
                count = m.sum(dim=1).clamp(min=1e-9)                                 # (batch, 1)
                out.append((total / (count if mode == "mean" else count.sqrt())).to(hidden.dtype))
            else:                                                                    # weighted_mean
                out.append(self._weighted_mean(hidden, first, m, acc))
        return out[0] if len(out) == 1 else torch.cat(out, dim=-1)

    @staticmethod
    def _weighted_mean(hidden: Tensor, first: Tensor, m: Tensor, acc: torch.dtype) -> Tensor:
        seq = hidden.shape[1]
        pos = torch.arange(1, seq + 1, device=hidden.device, dtype=acc).view(1, seq, 1)   # (1, seq, 1)
        # weights count from the first attended token, so left padding (or a left-out prompt) does not shift them
        w = (pos - first.view(-1, 1, 1).to(acc)) * m                                       # (batch, seq, 1)
        total = (hidden.to(acc) * w).sum(dim=1)                                            # (batch, hidden)
        return (total / w.sum(dim=1).clamp(min=1e-9)).to(hidden.dtype)


class Dense(nn.Module):
    """activation(x W^T + b): (batch, in_features) -> (batch, out_features). Parameter names `linear.*`, the
    sentence-transformers Dense's, so its weights files load as they are."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str = "tanh"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(f"Dense activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.in_features, self.out_features, self.bias = in_features, out_features, bias
        self.activation_name = activation
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = ACTIVATIONS[activation]()

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.linear(x))


@dataclass
class Prompts:
    """sentence-transformers' prompts (config_sentence_transformers.json): texts put before the input, by name, and
    the name applied when none is asked for. "query" and "document" exist as "" unless the model says otherwise, as
    SentenceTransformer has them."""
    named: dict[str, str] = field(default_factory=lambda: {"query": "", "document": ""})
    default_name: str | None = None

    def text(self, prompt: str | None = None, name: str | None = None) -> str:
        """The prompt to put before each text: `prompt` itself, else the one called `name`, else the default's."""
        if prompt is not None:
            return prompt
        if name is not None and name not in self.named:
            raise ConfigError(f"prompt name {name!r} is not one of the model's prompts: {', '.join(self.named)}")
        name = self.default_name if name is None else name
        return self.named[name] if name is not None else ""


class SentenceEncoder(nn.Module):
    """BertModel -> Pooling -> Dense layers (optional) -> unit L2 norm (optional): tokenized text to (batch, dim).
    The one path from text to vector: `bertkit embed`, Predictor.embed, serve and the embedding evaluations encode
    through it. `layers`: hidden states to average before pooling (0 = embeddings; None = the last layer);
    `prompts`: the model's named prompts (`encode` puts one before each text)."""

    def __init__(self, bert: nn.Module, pooling: Pooling, normalize: bool = False,
                 dense: Dense | Sequence[Dense] | None = None, max_seq_length: int = 256,
                 do_lower_case: bool = False, layers: Sequence[int] | None = None, prompts: Prompts | None = None):
        super().__init__()
        self.bert = bert
        if getattr(bert, "pooler", None) is not None:      # unused here: no gradient, so DDP must not wait for one
            bert.pooler.requires_grad_(False)
        self.pooling = pooling
        if pooling.hidden_size is None:
            pooling.hidden_size = bert.config.hidden_size
        self.dense = nn.ModuleList([] if dense is None else [dense] if isinstance(dense, Dense) else list(dense))
        self.normalize = normalize
        limit = bert.config.max_input_length
        if not 0 < max_seq_length <= limit:
            raise ConfigError(f"max_seq_length={max_seq_length} must be in 1..{limit} (max_position_embeddings)")
        self.max_seq_length = max_seq_length
        self.do_lower_case = do_lower_case          # lowercase texts before the tokenizer (the format's flag)
        self.layers = None if layers is None or list(layers) == [-1] else list(layers)
        self.prompts = prompts or Prompts()

    @property
    def dim(self) -> int:
        return self.dense[-1].out_features if len(self.dense) else self.pooling.output_dim()

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, prompt_length: int | Tensor = 0) -> Tensor:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=self.layers is not None)
        x = self.pool(hidden_states(out, self.layers), attention_mask, prompt_length)     # (batch, dim)
        return F.normalize(x, p=2, dim=-1) if self.normalize else x

    def pool(self, hidden: Tensor, attention_mask: Tensor | None, prompt_length: int | Tensor = 0) -> Tensor:
        """(batch, seq, hidden) encoder output -> (batch, dim): pooling, then the Dense layers (no normalisation)."""
        x = self.pooling(hidden, attention_mask, prompt_length)                           # (batch, pooled)
        for layer in self.dense:
            x = layer(x)                                                                  # (batch, out)
        return x

    def tokenize(self, tokenizer, texts: Sequence[str], max_length: int | None = None) -> dict[str, Tensor]:
        """Model inputs for `texts`: truncated to max_length (default max_seq_length), padded to the longest,
        (batch, seq) tensors."""
        texts = [t.lower() for t in texts] if self.do_lower_case else list(texts)
        return encode(tokenizer, texts, max_length=max_length or self.max_seq_length,
                      device=next(self.parameters()).device)

    def prompt_length(self, tokenizer, prompt: str, max_length: int | None = None) -> int:
        """The prompt's tokens at the start of a prompted text that pooling leaves out: [CLS] and its pieces, as
        sentence-transformers counts them (the prompt tokenized alone, less a closing special token); 0 where the
        pooling includes the prompt."""
        if not prompt or self.pooling.include_prompt:
            return 0
        ids = self.tokenize(tokenizer, [prompt], max_length)["input_ids"][0].tolist()
        return len(ids) - (ids[-1] in tokenizer.special_ids)

    @torch.inference_mode()             # the pooling and Dense layers run outside the forward loop's no_grad too
    def encode(self, tokenizer, texts: Sequence[str], batch_size: int = 32, precision: str | bool | None = PRECISION,
               max_length: int | None = None, progress: bool = False, prompt: str | None = None,
               prompt_name: str | None = None) -> np.ndarray:
        """(n, dim) float32 vectors; texts of similar length share a batch (less padding). max_length: pieces per
        text (default max_seq_length); `prompt` (else the prompt called `prompt_name`, else the model's default
        prompt) goes before each text."""
        prompt = self.prompts.text(prompt, prompt_name)
        texts = [prompt + t for t in texts]
        skip = self.prompt_length(tokenizer, prompt, max_length)
        return self._vectors([len(t) for t in texts],
                             lambda idx: {**self.tokenize(tokenizer, [texts[i] for i in idx], max_length),
                                          "prompt_length": skip}, batch_size, precision, progress)

    @torch.inference_mode()
    def encode_ids(self, tokenizer, rows: Sequence[list[int]], batch_size: int = 32,
                   precision: str | bool | None = PRECISION, prompt_lengths: Sequence[int] | None = None) -> np.ndarray:
        """(n, dim) float32 vectors of model inputs given as ids, each row whole ([CLS] ... [SEP] as the caller put
        them) and already within the model's length; prompt_lengths: per row, the prompt tokens pooling leaves out
        (`prompt_length`; 0 for a row without a prompt)."""
        device = next(self.parameters()).device

        def batch(idx: list[int]) -> dict:
            out = id_batch(tokenizer, [rows[i] for i in idx], device)
            if prompt_lengths is not None:
                out["prompt_length"] = torch.tensor([prompt_lengths[i] for i in idx], device=device)
            return out
        return self._vectors([len(r) for r in rows], batch, batch_size, precision)

    def _vectors(self, lengths: list[int], make_batch, batch_size: int, precision, progress: bool = False):
        out = np.zeros((len(lengths), self.dim), dtype=np.float32)
        batches = forward_batches(self, lengths, make_batch, batch_size, precision)
        if progress:                    # no bar object at all otherwise: serve embeds one request's texts per call
            batches = progress_bar(batches, show=True, total=-(-len(lengths) // batch_size), desc="embed",
                                   unit="batch")
        for idx, _, vectors in batches:
            out[idx] = vectors.float().cpu().numpy()
        return out
