"""The one encoder of every family: embeddings, self-attention, layers, pooler. The maths only.

The BERT paper's (Devlin et al. 2018) and google-research/bert's `modeling.py`:

    x = LayerNorm(word[ids] + type[token_type] + position[0..S-1]);  dropout          # (batch, seq, hidden)
    for each layer:                                                                      # post-LN
        a = softmax(Q K^T / sqrt(head_dim) + padding_mask) V                             # per head
        x = LayerNorm(x + dropout(a W_o))
        x = LayerNorm(x + dropout(GELU(x W_1) W_2))                                      # GELU = exact erf form
    pooled = tanh(x[:, 0] W_p)                                                           # [CLS]

Parameter names are the Hugging Face BERT state_dict's (`encoder.layer.3.attention.self.query.weight`, ...); other
families' checkpoint names map onto them at load and save (`bertkit.families`).

Other families choose parts of the same modules by config; the maths of each, how a forward is planned and the
exact changes from the textbook code: docs/architecture.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from bertkit.activations import Activation
from bertkit import disentangled, runtime
from bertkit.attention import ExecutionOptions, ExecutionPlan, Mode, dropout, with_bias
from bertkit.checkpoint import load_pretrained, save_pretrained
from bertkit.compat import PreTrainedMixin
from bertkit.config import BertConfig
from bertkit.errors import ConfigError
from bertkit.families import family
from bertkit.modern import GLU, init_family, parts, rotary_table, rotate, window_mask
from bertkit.outputs import ENCODER_INPUTS, ModelOutput, finish, forward_flags
from bertkit.padding import Layout, Rows, starts_full

__all__ = ["BertModel", "BertModelOutput", "BertPreTrainedModel", "Projection", "classifier_dropout"]


@dataclass
class BertModelOutput(ModelOutput):
    last_hidden_state: Tensor                  # (batch, seq, hidden); (n, hidden) with output_rows
    pooler_output: Tensor | None = None        # (batch, hidden)
    hidden_states: tuple[Tensor, ...] | None = None  # embeddings + each layer, each (batch, seq, hidden)
    attentions: tuple[Tensor, ...] | None = None     # each layer (batch, heads, seq, seq)


class Projection(nn.Module):
    """Sibling linear layers that read the same input, as one matmul on their concatenated weights:
    (..., in) -> (..., sum of outs). Looks the layers up on `owner` at every call, so a replaced layer (LoRA, a
    quantized one) is the one that runs; layers without a plain weight run one by one."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.__dict__["owner"] = owner                  # not a submodule: the layers are registered where they live
        self.names = names

    def forward(self, x: Tensor) -> Tensor:
        mods = [getattr(self.owner, n) for n in self.names]
        if len(mods) == 1:
            return mods[0](x)
        if not all(type(m) is nn.Linear for m in mods):
            return torch.cat([m(x) for m in mods], dim=-1)
        return F.linear(x, torch.cat([m.weight for m in mods]), torch.cat([m.bias for m in mods]))


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        dim = config.embedding_size or config.hidden_size             # ELECTRA: smaller, projected up by the model
        part = parts(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, dim, padding_idx=config.pad_token_id)
        # None: rotary (ModernBERT) or relative-only (DeBERTa-v3) positions are applied inside attention instead
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, dim) if config.position_table else None
        # DistilBERT has no segments at all; token_type_ids are then ignored
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, dim) if config.type_vocab_size else None
        self.LayerNorm = nn.LayerNorm(dim, eps=config.layer_norm_eps, bias=part.norm_bias)
        p = part.embedding_dropout
        self.dropout = nn.Dropout(config.hidden_dropout_prob if p is None else p)

    def forward(self, input_ids: Tensor | None, token_type_ids: Tensor | None, position_ids: Tensor,
                inputs_embeds: Tensor | None = None) -> Tensor:
        # input_ids: (batch, seq) or packed (tokens,); position_ids broadcastable to it; or the caller's word vectors
        x = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds      # (..., dim)
        if self.token_type_embeddings is None:
            pass
        elif token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig, index: int = 0):
        """index: the layer's, for families whose layers differ (ModernBERT's local / global ones)."""
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        spec = config.disentangled
        # DeBERTa scales every score term by 1 / sqrt(head_dim * (1 + relative terms)) and adds the terms per layer
        self.scale = (self.head_dim * (spec.scale if spec else 1.0)) ** -0.5
        self.relative = disentangled.Terms(config, spec, self) if spec and spec.relative_attention and spec.terms \
            else None
        self.theta = self.window = None
        h, part = config.hidden_size, parts(config)
        if family(config.model_type).rotary:                # one Wqkv weight in the rotary families' checkpoints
            self.Wqkv = nn.Linear(h, 3 * h, bias=part.attention_bias)
            self.qkv = Projection(self, ("Wqkv",))
            local = part.local_layers[index]
            self.theta = part.local_theta if local else part.global_theta
            self.window = part.window if local else None
            return
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.qkv = Projection(self, ("query", "key", "value"))        # every layer
        self.kv = Projection(self, ("key", "value"))                   # the [CLS]-only last layer
        self.q = Projection(self, ("query",))

    def forward(self, x: Tensor, plan: ExecutionPlan, rows: Rows | None = None) -> tuple[Tensor, Tensor | None]:
        """x (batch, seq, hidden) or packed (tokens, hidden) -> the attention context, same shape, and the
        probabilities ("eager" only). With rows: the context at those rows only (see `Layout.select`)."""
        if rows is not None and rows.first_only and self.theta is None:
            return self._first(x, plan), None
        qkv = self.qkv(x)                                   # (batch, seq, 3 * hidden) or (tokens, 3 * hidden)
        if self.theta is not None:                          # rotary: once on the packed tokens, not per bucket
            qkv = rotate(qkv, plan.rotary[self.theta], self.num_heads)
        layout = plan.layout
        pos = self._positions(plan, layout.seq)
        if layout.unpadded:
            grids = layout.to_buckets(qkv)                  # [(rows, length, 3 * hidden)]
            ctx = layout.from_buckets([self._attend(g, b.mask, plan, pos)[0]
                                       for g, b in zip(grids, layout.buckets)])
            probs = None
        else:
            ctx, probs = self._attend(qkv, layout.mask, plan, pos)
            ctx = ctx.reshape(*ctx.shape[:2], -1)
        return (ctx if rows is None else layout.select(ctx, rows)), probs

    def _positions(self, plan: ExecutionPlan, seq: int) -> tuple | None:
        """DeBERTa: this layer's projections of the relative-position embeddings, once for all its buckets."""
        return self.relative.project(plan.relative, seq) if self.relative is not None and plan.relative is not None \
            else None

    def _attend(self, qkv: Tensor, mask: Tensor | None, plan: ExecutionPlan, pos: tuple | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """(rows, len, 3 * hidden) -> a strided (rows, len, heads, head_dim), by the plan's attention function."""
        b, s, _ = qkv.shape
        q, k, v = qkv.view(b, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if plan.bias is not None:            # relative positions: rows start at position 0 in either layout
            mask = with_bias(plan.bias[..., :s, :s].to(q.dtype), mask)
        if self.window is not None:
            mask = window_mask(mask, s, self.window, q.device)
        if pos is not None:
            mask = with_bias(self.relative(q, k, pos), mask)
        ctx, probs = plan.attend(q, k, v, mask, self.scale)            # (rows, heads, len, head_dim)
        return ctx.transpose(1, 2), probs

    def _first(self, x: Tensor, plan: ExecutionPlan) -> Tensor:
        """The context at each sequence's first position only, against all keys: (batch, 1, hidden). Keys and
        values cover every token; the query is one row per sequence."""
        layout = plan.layout
        kv = layout.pad(self.kv(x))                                     # (batch, seq, 2 * hidden)
        b, s, _ = kv.shape
        k, v = kv.view(b, s, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q = self.q(layout.first_rows(x)).view(b, self.num_heads, 1, self.head_dim)     # (batch, heads, 1, d)
        scores = torch.matmul(q * self.scale, k.transpose(-1, -2))                      # (batch, heads, 1, seq)
        if plan.bias is not None:
            scores = scores + plan.bias[..., :1, :s]
        pos = self._positions(plan, s)
        if pos is not None:
            scores = scores + self.relative(q, k, pos)
        mask = layout.key_mask()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = dropout(torch.softmax(scores, dim=-1), plan.dropout_p, plan.dropout_p > 0, plan.fast_dropout)
        return torch.matmul(probs, v).reshape(b, 1, -1)                                 # (batch, 1, hidden)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__()
        part, pre_norm = parts(config), family(config.model_type).pre_norm
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=part.attention_bias)
        # pre-norm (ModernBERT): the norm before attention; the first layer has none (its input was just normed)
        self.LayerNorm = nn.Identity() if pre_norm and index == 0 else \
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=part.norm_bias)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob if pre_norm else config.hidden_dropout_prob)

    def forward(self, ctx: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(ctx)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__()
        self.self = BertSelfAttention(config, index)
        self.output = BertSelfOutput(config, index)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        part = parts(config)
        if family(config.model_type).glu:               # act(input) * gate: twice the width in (GeGLU, SwiGLU)
            self.dense = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=part.mlp_bias)
            p = config.hidden_dropout_prob if part.mlp_dropout is None else part.mlp_dropout
            self.intermediate_act_fn = GLU(config.hidden_act, p, part.glu_act_half)
            return
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = Activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.intermediate_act_fn(self.dense(x))                  # (..., intermediate)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        part = parts(config)
        bias = part.mlp_bias if part.mlp_out_bias is None else part.mlp_out_bias
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=part.norm_bias)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig, index: int = 0):
        super().__init__()
        self.attention = BertAttention(config, index)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)
        self.pre_norm = family(config.model_type).pre_norm

    def forward(self, x: Tensor, plan: ExecutionPlan, rows: Rows | None = None) -> tuple[Tensor, Tensor | None]:
        """rows: compute the output at those rows only. Position-wise work (output projection, LayerNorms, FFN:
        3/4 of the layer's matmuls) then runs on them alone."""
        if self.pre_norm:
            return self._pre_norm(x, plan, rows)
        ctx, probs = self.attention.self(x, plan, rows)
        residual = x if rows is None else plan.layout.select(x, rows)
        a = self.attention.output(ctx, residual)
        return self.output(self.intermediate(a), a), probs

    def _pre_norm(self, x: Tensor, plan: ExecutionPlan, rows: Rows | None) -> tuple[Tensor, Tensor | None]:
        """ModernBERT's order: x + attention(norm(x)), then + FFN(norm(that)); the same modules as post-norm."""
        attn, ffn = self.attention.output, self.output
        ctx, probs = self.attention.self(attn.LayerNorm(x), plan, rows)
        a = (x if rows is None else plan.layout.select(x, rows)) + attn.dropout(attn.dense(ctx))
        return a + ffn.dropout(ffn.dense(self.intermediate(ffn.LayerNorm(a)))), probs


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        # ALBERT shares its layers: num_hidden_groups distinct ones, each run for a run of consecutive layers
        groups = config.num_hidden_groups or config.num_hidden_layers
        self.layer = nn.ModuleList(BertLayer(config, i) for i in range(groups))
        self.schedule = [i * groups // config.num_hidden_layers for i in range(config.num_hidden_layers)]
        # pre-norm layers leave their sum un-normed: one LayerNorm after the last
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=parts(config).norm_bias) \
            if family(config.model_type).pre_norm else None
        # MPNet: a learned bias per head and bucket of relative distance, shared by every layer
        buckets = config.relative_attention_num_buckets
        self.relative_attention_bias = nn.Embedding(buckets, config.num_attention_heads) if buckets else None
        # DeBERTa: relative-position embeddings every layer projects into its own bias (bertkit.disentangled)
        spec = config.disentangled
        self.relative = disentangled.RelativeEmbeddings(config, spec) if spec and spec.relative_attention else None

    def position_bias(self, seq: int, device) -> Tensor:
        """(1, heads, seq, seq): the bias of key j for query i, by the bucket of j - i (T5's, bidirectional)."""
        pos = torch.arange(seq, device=device)
        buckets = relative_position_bucket(pos[None, :] - pos[:, None], self.relative_attention_bias.num_embeddings)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def forward(self, x: Tensor, plan: ExecutionPlan, rows: Rows | None = None, output_hidden_states: bool = False
                ) -> tuple[Tensor, list[Tensor] | None, list[Tensor] | None]:
        """rows: the last layer runs for these rows only (see BertLayer.forward). With plan.checkpoint_layers each
        layer's activations are recomputed in backward instead of kept."""
        hidden = [x] if output_hidden_states else None
        attentions = []
        if self.relative_attention_bias is not None:
            plan = replace(plan, bias=self.position_bias(plan.layout.seq, x.device))
        attention = self.layer[0].attention.self
        if attention.theta is not None:      # rotary: the cos / sin tables of each base, for every layer
            positions = plan.layout.positions(x.device)
            thetas = {layer.attention.self.theta for layer in self.layer}
            plan = replace(plan, rotary={t: rotary_table(positions, attention.head_dim, t, x.dtype) for t in thetas})
        if self.relative is not None:
            plan = replace(plan, relative=self.relative())
        for i, index in enumerate(self.schedule):
            layer = self.layer[index]
            layer_rows = rows if i == len(self.schedule) - 1 else None
            if plan.checkpoint_layers:
                x, probs = checkpoint(layer, x, plan, layer_rows, use_reentrant=False)
            else:
                x, probs = layer(x, plan, layer_rows)
            if hidden is not None:
                hidden.append(x)
            attentions.append(probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, hidden, attentions


class BertPooler(nn.Module):
    """[CLS] -> dense -> tanh: BERT's pooler. As a sequence classifier's hidden layer (`classifier=True`) it is the
    family's: RoBERTa's classifier.dense (dropout first), ELECTRA's (GELU), DistilBERT's pre_classifier (ReLU)."""

    def __init__(self, config: BertConfig, classifier: bool = False):
        super().__init__()
        fam, spec = family(config.model_type), config.disentangled
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = Activation((spec.pooler_act if spec else fam.classifier_act) if classifier else "tanh")
        first = classifier and fam.classifier_dropout_first
        self.dropout = (nn.Dropout(spec.pooler_dropout) if spec else classifier_dropout(config)) if first else None

    def forward(self, x: Tensor) -> Tensor:
        x = x[:, 0]                                                     # (batch, hidden) from [CLS]
        if self.dropout is not None:
            x = self.dropout(x)
        return self.act(self.dense(x))


def classifier_dropout(config: BertConfig) -> nn.Dropout:
    p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(p)


def relative_position_bucket(relative: Tensor, buckets: int, max_distance: int = 128) -> Tensor:
    """T5 / MPNet buckets of key - query distances: half the buckets a direction, exact up to a quarter of them,
    then logarithmic up to max_distance."""
    half = buckets // 2
    out = (relative > 0).long() * half                   # keys after the query take the upper half
    n = relative.abs()
    exact = half // 2
    far = exact + (torch.log(n.float().clamp_min(1) / exact) / math.log(max_distance / exact)
                   * (half - exact)).long()
    return out + torch.where(n < exact, n, far.clamp_max(half - 1))


def _positions_from_ids(input_ids: Tensor, pad: int) -> Tensor:
    """RoBERTa's positions: pad + 1, pad + 2, ... over the non-pad ids of each row; pad at padding. (batch, seq)"""
    real = (input_ids != pad).long()
    return torch.cumsum(real, dim=1) * real + pad


class BertPreTrainedModel(PreTrainedMixin, nn.Module):
    """Shared by BertModel and the heads: config, HF-style init, from_pretrained / save_pretrained, and
    transformers' embedding / gradient-checkpointing methods (bertkit.compat)."""

    base_model_prefix = "bert"
    # head parameters whose absence from a checkpoint is reported (newly initialised), not an error
    _head_prefixes: tuple[str, ...] = ()

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise ConfigError(f"expected a BertConfig, got {type(config).__name__}")
        self.config = config
        self.loading_info: dict[str, list[str]] = {"missing_keys": [], "unexpected_keys": [], "ignored_keys": []}

    # set once this machine's fast paths were given (bertkit.runtime.apply) or found chosen by hand
    runtime_planned = False

    def train(self, mode: bool = True):
        # checked before any module changes mode: a refused call leaves the model as it was
        if mode and any(getattr(m, "inference_only", False) for m in self.modules()):
            raise ConfigError("this model is frozen for inference (bertkit.runtime.freeze): load it again to train")
        if mode and not self.runtime_planned:   # any loop (a plain one, transformers.Trainer, PEFT) calls train()
            runtime.on_train(self)
        return super().train(mode)

    def init_weights(self, module: nn.Module | None = None) -> None:
        """HF BERT init: normal(0, initializer_range) for linear/embedding weights, zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        for m in (module or self).modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, std)
                if m.padding_idx is not None:
                    with torch.no_grad():
                        m.weight[m.padding_idx].zero_()
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        init_family(self, module or self)      # a family's own scheme (ModernBERT's) over BERT's
        self._init_extra()

    def _init_extra(self) -> None:
        """Hook for parameters that are not inside a Linear/Embedding/LayerNorm (e.g. the MLM output bias)."""

    @classmethod
    def from_pretrained(cls, path, *, dtype=None, torch_dtype=None, device=None, revision: str | None = None,
                        allow_non_finite: bool | None = None, **config_overrides):
        """Load an HF-format directory (config.json + model.safetensors or pytorch_model.bin) or a Hugging Face repo
        id from the local cache (see bertkit.hub). dtype / torch_dtype (transformers' older name): a torch.dtype, a
        name ("bfloat16") or "auto" (the checkpoint's). allow_non_finite=True loads NaN / Inf weights (with a warning)
        instead of refusing them. Keyword arguments that name BertConfig fields override the config."""
        if torch_dtype is not None and dtype is not None and torch_dtype != dtype:
            raise ConfigError(f"from_pretrained got dtype={dtype!r} and torch_dtype={torch_dtype!r}: give one")
        return load_pretrained(cls, path, dtype=dtype if dtype is not None else torch_dtype, device=device,
                               revision=revision, allow_non_finite=allow_non_finite, **config_overrides)

    def save_pretrained(self, path, tokenizer=None, safe_serialization: bool = True, max_shard_size=None) -> None:
        """Write config.json + model.safetensors (atomically) and, if given, the tokenizer's files;
        safe_serialization=False: pytorch_model.bin; max_shard_size: shards and an index (bertkit.checkpoint)."""
        save_pretrained(self, path, tokenizer, safe_serialization, max_shard_size)

    def shard_units(self) -> list[nn.Module]:
        """What FSDP shards one by one, each gathered just before it runs: the encoder layers."""
        return [m for m in self.modules() if isinstance(m, BertLayer)]

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= sum(p.numel() for name, p in self.named_parameters() if "embeddings" in name)
        return n


def _check_shapes(config: BertConfig, input_ids: Tensor | None, inputs_embeds: Tensor | None,
                  token_type_ids: Tensor | None, attention_mask: Tensor | None, position_ids: Tensor | None) -> None:
    if (input_ids is None) == (inputs_embeds is None):
        raise ConfigError("forward takes input_ids or inputs_embeds: give exactly one")
    if inputs_embeds is not None:
        dim = config.embedding_size or config.hidden_size
        if not isinstance(inputs_embeds, Tensor) or inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != dim:
            shape = tuple(inputs_embeds.shape) if isinstance(inputs_embeds, Tensor) else type(inputs_embeds).__name__
            raise ConfigError(f"inputs_embeds must be a (batch, seq, {dim}) tensor, got {shape}")
    elif not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise ConfigError(f"input_ids must be a (batch, seq) tensor, got {shape}")
    elif input_ids.dtype not in (torch.long, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ConfigError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
    b, s = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
    if s > config.max_input_length:
        offset = config.max_position_embeddings - config.max_input_length
        raise ConfigError(f"sequence length {s} exceeds max_position_embeddings={config.max_position_embeddings}"
                          + (f" less the {offset} positions {config.model_type} reserves" if offset else ""))
    for name, t in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if t is not None and tuple(t.shape) != (b, s):
            raise ConfigError(f"{name} has shape {tuple(t.shape)}, expected {(b, s)} like input_ids")
    if position_ids is not None and tuple(position_ids.shape) not in ((b, s), (1, s)):
        raise ConfigError(f"position_ids has shape {tuple(position_ids.shape)}, expected {(b, s)} or {(1, s)}")


def _check_values(config: BertConfig, input_ids: Tensor, token_type_ids: Tensor | None) -> None:
    """Raise ConfigError naming an id outside the vocab or type vocab (reads the values: the plan says when)."""
    if input_ids.numel() == 0:
        return
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if hi >= config.vocab_size or lo < 0:
        bad = hi if hi >= config.vocab_size else lo
        where = (input_ids == bad).nonzero()[0].tolist()
        raise ConfigError(f"input_ids contains token id {bad} at position {where}, outside the vocab "
                          f"(vocab_size={config.vocab_size})")
    if token_type_ids is not None and config.type_vocab_size:
        hi, lo = int(token_type_ids.max()), int(token_type_ids.min())
        if hi >= config.type_vocab_size or lo < 0:
            bad = hi if hi >= config.type_vocab_size else lo
            raise ConfigError(f"token_type_ids contains {bad}, outside type_vocab_size={config.type_vocab_size}")


class BertModel(BertPreTrainedModel):
    _head_prefixes = ("pooler.",)

    def __init__(self, config: BertConfig, add_pooling_layer: bool | None = None, classifier: bool = False):
        """classifier: the pooler is a sequence classifier's hidden layer (see BertPooler)."""
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        if config.embedding_size not in (None, config.hidden_size):      # ELECTRA's factorised embeddings
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
        else:
            self.embeddings_project = None
        self.encoder = BertEncoder(config)
        # None: as the family's bare encoder has it (BERT, RoBERTa: yes; ELECTRA, DistilBERT: no)
        pool = family(config.model_type).pooler if add_pooling_layer is None else add_pooling_layer
        self.pooler = BertPooler(config, classifier) if pool else None
        self.execution = ExecutionOptions()             # plain PyTorch; bertkit.runtime.apply sets measured paths
        self.init_weights()

    def plan(self, input_ids: Tensor, attention_mask: Tensor | None, output_attentions: bool = False
             ) -> ExecutionPlan:
        """How a forward of this batch runs (see attention.ExecutionPlan)."""
        # the weights' dtype from the LayerNorm: a swapped-in word table (train.compact) builds its `.weight` per call,
        # and DeBERTa-v3 has no position table
        mode = Mode.current(input_ids.device, self.embeddings.LayerNorm.weight.dtype, self.training)
        return ExecutionPlan.build(self.execution, self.config.attn_implementation, attention_mask,
                                   tuple(input_ids.shape[:2]), mode, output_attentions,
                                   self.config.attention_probs_dropout_prob)

    def forward(self, input_ids: Tensor | None = None, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, output_attentions: bool = False,
                output_hidden_states: bool = False, first_token_only: bool = False, output_rows: Tensor | None = None,
                **flags) -> BertModelOutput:
        """return_dict=False returns `BertModelOutput.to_tuple()` (see bertkit.outputs).
        first_token_only: the last layer runs at position 0 ([CLS]) only, for callers that read nothing but the
        pooler: `last_hidden_state` is then (batch, 1, hidden), the full forward's `[:, :1]`.
        output_rows: (n,) flat (batch * seq) positions the caller reads (MLM at its masked tokens):
        `last_hidden_state` is then (n, hidden), the full forward's `.reshape(-1, hidden)[output_rows]`, and the
        last layer's position-wise work runs on those rows (and [CLS], for the pooler) only.
        With attention maps or hidden states the full last layer runs (output_rows still selects the rows).
        **flags: return_dict, and transformers' position_ids (batch or 1, seq) and inputs_embeds (batch, seq,
        embedding width)."""
        flags = forward_flags("BertModel", flags, ENCODER_INPUTS)
        position_ids, inputs_embeds = flags.get("position_ids"), flags.get("inputs_embeds")
        _check_shapes(self.config, input_ids, inputs_embeds, token_type_ids, attention_mask, position_ids)
        plan = self.plan(input_ids if input_ids is not None else inputs_embeds, attention_mask, output_attentions)
        if plan.check_values and input_ids is not None:
            _check_values(self.config, input_ids, token_type_ids)
        layout = plan.layout
        rows = None
        if (first_token_only or output_rows is not None) and not (output_attentions or output_hidden_states):
            rows = self._rows(layout, attention_mask, output_rows)
        positions = self._positions(layout, input_ids, position_ids)
        x = self.embeddings(layout.unpad(input_ids), layout.unpad(token_type_ids), positions,
                            layout.unpad(inputs_embeds))
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        if plan.residual_dtype is not None:
            x = x.to(plan.residual_dtype)
        x, hidden, attentions = self.encoder(x, plan, rows, output_hidden_states)
        if rows is not None and not rows.first_only:
            n = output_rows.numel()
            pooled = self.pooler(x[n:, None]) if self.pooler is not None else None   # (batch, hidden)
            return finish(BertModelOutput(last_hidden_state=x[:n], pooler_output=pooled), flags)   # (n, hidden)
        if rows is None:
            x = layout.pad(x)                                            # (batch, seq, hidden)
        pooled = self.pooler(x) if self.pooler is not None else None
        if output_rows is not None and rows is None:                     # the full layer ran: select the rows
            x = x.reshape(-1, x.shape[-1]).index_select(0, output_rows.reshape(-1))
        return finish(BertModelOutput(
            last_hidden_state=x, pooler_output=pooled,
            hidden_states=tuple(layout.pad(h) for h in hidden) if hidden is not None else None,
            attentions=tuple(attentions) if output_attentions else None), flags)

    def _positions(self, layout: Layout, input_ids: Tensor | None, position_ids: Tensor | None) -> Tensor:
        """The position of every token: the caller's, the family's from the ids (RoBERTa), or 0.. per row."""
        pad = self.config.pad_token_id
        if position_ids is not None:
            if self.embeddings.position_embeddings is None:
                raise ConfigError(f"position_ids: {self.config.model_type} has no position table (its positions are "
                                  f"rotary or relative, counted from 0 in each row): leave it None")
            return layout.unpad(position_ids.expand(layout.batch, layout.seq))
        device = self.embeddings.LayerNorm.weight.device
        if not family(self.config.model_type).positions_from_ids:
            return layout.positions(device)
        if input_ids is None:                           # transformers' rule for inputs_embeds: every row is real
            return layout.positions(device) + pad + 1
        return layout.unpad(_positions_from_ids(input_ids, pad))

    def _rows(self, layout: Layout, attention_mask: Tensor | None, output_rows: Tensor | None) -> Rows | None:
        """The last layer's rows for first_token_only / output_rows, or None where the full layer must run."""
        if layout.unpadded and not starts_full(attention_mask):
            return None                                  # packed rows must start at position 0
        if output_rows is None:
            return Rows()
        flat = output_rows.reshape(-1)                                                   # (n,)
        if self.pooler is not None:                      # the [CLS] rows too: the pooler reads them
            flat = torch.cat([flat, torch.arange(layout.batch, device=flat.device) * layout.seq])
        index = layout.rows_of(flat)
        if layout.unpadded and index.numel() and int(index.min()) < 0:
            return None          # a requested position is padding (an MLM label there): it has no packed row
        return Rows(index)
