"""The BERT encoder: embeddings, self-attention with three interchangeable backends, post-LN layers, tanh pooler.

The maths is the BERT paper's (Devlin et al. 2018) and google-research/bert's `modeling.py`:

    x = LayerNorm(word[ids] + type[token_type] + position[0..S-1]);  dropout          # (batch, seq, hidden)
    for each layer:                                                                      # post-LN
        a = softmax(Q K^T / sqrt(head_dim) + padding_mask) V                             # per head
        x = LayerNorm(x + dropout(a W_o))
        x = LayerNorm(x + dropout(GELU(x W_1) W_2))                                      # GELU = exact erf form
    pooled = tanh(x[:, 0] W_p)                                                           # [CLS]

Module and parameter names follow the Hugging Face BERT state_dict (`embeddings.word_embeddings.weight`,
`encoder.layer.3.attention.self.query.weight`, `pooler.dense.bias`, ...), so checkpoints need no rename table.

Attention backends (`config.attn_implementation`), all computing the same function:
  * "eager":    explicit scores -> masked softmax -> dropout -> weighted sum. The only one that returns the
                attention probabilities; `output_attentions=True` forces it.
  * "sdpa":     `torch.nn.functional.scaled_dot_product_attention` on the padded batch (no mask at all when the
                batch has no padding, so the fused kernel takes its fastest path).
  * "unpadded": MosaicBERT-style. Padding is removed once, before the embeddings: the batch becomes a packed
                (total_tokens, hidden) matrix plus `cu_seqlens`, and every dense op (embeddings, Q/K/V and output
                projections, FFN, LayerNorms) runs on real tokens only. Only attention needs sequence structure:
                the rows are sorted by length into up to 4 buckets (`length_buckets`), each layer scatters the
                packed Q/K/V into one (rows, bucket_len) grid per bucket where every sequence is a left-aligned
                prefix, runs attention there with a key-padding mask, and gathers the real rows back. Bucketing
                cuts the attention padding (and its cost) roughly in half on real text; the scatter and gather are
                O(tokens * hidden), small next to the O(tokens * hidden^2) dense work they save.
                Padding is restored (with zeros) at the end; padded positions of `last_hidden_state` are 0.
  * "auto":     eager if attention maps are requested; else unpadded if real tokens are fewer than
                `UNPAD_MIN_FILL` of the padded batch; else sdpa. (0.95: a cost model, see below.)

Precision: device-agnostic code; fp32, bf16 autocast (fp32 weights) and bf16 weights all work on CPU and CUDA.
Softmax / LayerNorm statistics are computed by PyTorch's kernels in fp32 internally; losses are taken in fp32.

torch.compile: works for the padded backends ("sdpa"/"eager"): the per-forward value checks are skipped while
compiling (one graph). The "unpadded" backend is data-dependent (nonzero, max length) and graph-breaks there.
Measured once on the 2-core dev CPU (shared with other jobs, outside the benchmark lock, so indicative only;
BERT-small MLM train step 32 x 128, bf16 autocast, median of 3 interleaved): compiled encoder 12.5 s vs eager
14.2 s per step (1.14x) after 165 s of compilation. Not the default; `torch.compile(model.bert)` it yourself for
long fixed-shape runs (`benchmarks/inference.py --cases compile` re-measures inference).

CPU inference fast paths (no grad; numerically the same maths, rounding as noted): linear layers run through
oneDNN with weights prepacked once and GELU fused into the FFN GEMM (`PACKED_LINEAR`); in bf16, attention on padded
rows of up to 256 tokens is computed explicitly (softmax computed in fp32 inside the kernel) instead of PyTorch's CPU
flash kernel, which has a large fixed cost per masked block (see `BertSelfAttention._attend`). On MiniLM-L6 and 64
BBC sentences the bf16
result's mean abs error against fp32 is 0.0016, as transformers' bf16 sdpa path's (0.0015).

CPU training fast paths: dropout masks come from 16 random bits per element (`dropout_keep_mask`: one int64 draw
gives four masks; PyTorch's per-element Bernoulli sampling was the largest single cost of CPU training at 256+
tokens); attention is computed explicitly in the autocast dtype with dropout, and without dropout up to 256
tokens (PyTorch's CPU SDPA has no dropout in its flash kernel and falls back to an fp32 math kernel; its flash
backward is slow on short rows); under bf16 autocast the residual stream stays in bf16 (`BF16_TRAIN_ACTIVATIONS`)
instead of being cast at every linear layer. MiniLM-L6 classification step, bf16: 32 x 256 8.3 vs 4.7 examples/s
for transformers; 16 x 128 22-23 vs 14-16.

Other differences from the textbook code, all exact: the three Q/K/V projections run as one matmul on the
concatenated weight (parameters stay separate so the checkpoint names are HF's); in inference (no grad) the
concatenated and autocast-cast weights are cached until a parameter changes (autocast would recast every weight on
every forward; the cache costs one bf16 copy of the encoder's matrices); token_type_ids=None adds the type-0 row by
broadcast instead of an embedding lookup; `first_token_only=True` (what sequence classification uses) runs the last
layer for position 0 only: keys and values over all tokens, one query row per sequence, so the attention output,
its LayerNorm and the FFN run on (batch, 1, hidden), the same values as the full layer's [CLS] row;
`output_rows=` (what MLM uses: the masked positions) runs the last layer's output projection, LayerNorms and FFN
for those rows and the [CLS] rows only (MosaicBERT's subset of the final layer).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.config import BertConfig
from bertkit.errors import ConfigError

__all__ = ["BertModel", "BertModelOutput", "BertPreTrainedModel", "Linear", "UNPAD_MIN_FILL", "activation"]

# "auto" unpads when real tokens are below this fraction of the padded batch. Cost model: unpadding adds ~3 memory
# passes of a (batch * max_len, 3 * hidden) grid per layer (~7 * hidden * 2 bytes per token) and saves the padded
# share of ~24 * hidden^2 FLOPs + ~20 elementwise passes per token; on a CPU at ~150 GFLOP/s and ~5 GB/s that breaks
# even at ~99% fill for BERT-base and ~93% for tiny, hence 0.95. (`benchmarks/inference.py --cases fill`
# measures it; the loaded 2-core dev machine gave no stable figure, see the closing note of issue 3.)
UNPAD_MIN_FILL = 0.95
PACKED_DTYPES = (torch.bfloat16, torch.float32)   # prepacked oneDNN inference GEMMs (see _onednn_ok)
# the explicit CPU bf16 inference attention (see BertSelfAttention._attend) materialises (rows, heads, len, len)
# scores; above this length the flash kernel's tiling wins and memory would grow quadratically
MANUAL_ATTENTION_MAX_LEN = 256
# CPU training with attention dropout uses the explicit attention with the fast dropout mask (see _attend)
EXPLICIT_TRAIN_ATTENTION = True
# CPU training under bf16 autocast carries the residual stream in bf16 (see BertModel.forward)
BF16_TRAIN_ACTIVATIONS = True


def activation(name: str):
    """The FFN non-linearity named in config.hidden_act (HF names)."""
    if name == "gelu":
        return F.gelu  # exact: 0.5 x (1 + erf(x / sqrt 2))
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ConfigError(f"BertConfig.hidden_act={name!r} is not supported")


@dataclass
class BertModelOutput:
    last_hidden_state: Tensor                  # (batch, seq, hidden); (n, hidden) with output_rows
    pooler_output: Tensor | None = None        # (batch, hidden)
    hidden_states: tuple[Tensor, ...] | None = None  # embeddings + each layer, each (batch, seq, hidden)
    attentions: tuple[Tensor, ...] | None = None     # each layer (batch, heads, seq, seq)


# ---------------------------------------------------------------------------------------------- batch layout
def length_buckets(batch: int) -> int:
    """How many attention buckets an unpadded batch of `batch` sequences is split into: rows sorted by length, equal
    counts per bucket, each bucket padded only to its own longest row. One bucket below 32 rows (the per-bucket
    launch cost outweighs the saved padding), 2 from 32, 4 from 64 (measured on BBC sentences, BERT-base, bf16:
    attention time 11.3 ms -> 5.2 ms per layer for 64 rows; `benchmarks/inference.py --cases bbc`)."""
    return 1 if batch < 32 else 2 if batch < 64 else 4


@dataclass
class Bucket:
    """Rows of an unpadded batch that share one attention grid: `rows` sequences of up to `length` tokens, stored
    at `offset` in the flat bucket grid; `mask` the (rows, 1, 1, length) key mask, None when all rows are full."""
    offset: int
    rows: int
    length: int
    mask: Tensor | None


@dataclass
class Layout:
    """How a batch is laid out for the encoder layers, built once per forward.

    backend "eager"/"sdpa": hidden states are (batch, seq, hidden); `mask` is a bool (batch, 1, 1, seq) key mask
    (True = attend) or None when nothing is padded.
    backend "unpadded": hidden states are (tokens, hidden); `indices` (tokens,) are the flat positions in the
    (batch * seq) grid of the real tokens; for attention the rows are sorted by length into `buckets` (see
    `length_buckets`), each a (rows, length) grid where every sequence is a left-aligned prefix, all stored one
    after another in a flat grid of `grid_size` slots; `grid_index` (tokens,) is each token's slot there.
    `cu_seqlens` (batch + 1,) are the cumulative lengths (the varlen-attention convention).
    """
    backend: str
    batch: int
    seq: int
    mask: Tensor | None = None
    indices: Tensor | None = None
    grid_index: Tensor | None = None
    grid_size: int = 0
    buckets: tuple[Bucket, ...] = ()
    cu_seqlens: Tensor | None = None

    @classmethod
    def build(cls, backend: str, attention_mask: Tensor | None, batch: int, seq: int,
              device: torch.device | None = None) -> "Layout":
        if backend != "unpadded":
            if attention_mask is None:
                return cls(backend, batch, seq)
            mask = attention_mask.bool()
            if backend == "sdpa" and mask.device.type == "cpu" and bool(mask.all()):
                mask = None  # no padding: let SDPA run unmasked (cheap check on CPU, skipped on GPU: no sync)
            else:
                mask = mask[:, None, None, :]
            return cls(backend, batch, seq, mask=mask)
        if attention_mask is None:
            attention_mask = torch.ones(batch, seq, dtype=torch.bool, device=device)
        mask = attention_mask.bool()
        lengths = mask.sum(1)                                          # (batch,)
        indices = mask.reshape(-1).nonzero().squeeze(1)                # (tokens,)
        rank = mask.cumsum(1, dtype=torch.long) - 1                    # position of each token inside its row
        cu = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        # attention buckets: rows by decreasing length, equal counts; one host sync for the bucket shapes
        order = torch.argsort(lengths, descending=True, stable=True)   # (batch,)
        sorted_len = lengths[order].tolist()
        k = min(length_buckets(batch), batch)
        bounds = [round(i * batch / k) for i in range(k + 1)]
        buckets, base_sorted, offset = [], [], 0
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            n, length = hi - lo, sorted_len[lo]
            bmask = None
            if sorted_len[hi - 1] != length:
                blen = lengths[order[lo:hi]]
                bmask = (torch.arange(length, device=mask.device)[None, :] < blen[:, None])[:, None, None, :]
            buckets.append(Bucket(offset, n, length, bmask))
            base_sorted += [offset + j * length for j in range(n)]
            offset += n * length
        base = torch.empty(batch, dtype=torch.long, device=mask.device)
        base[order] = torch.tensor(base_sorted, dtype=torch.long, device=mask.device)   # (batch,) row -> slot 0
        grid_index = base[indices // seq] + rank.reshape(-1)[indices]  # (tokens,)
        return cls(backend, batch, seq, indices=indices, grid_index=grid_index, grid_size=offset,
                   buckets=tuple(buckets), cu_seqlens=cu)

    def key_mask(self) -> Tensor | None:
        """The (batch, 1, 1, seq) bool key mask of the padded grid (True = real token), None when nothing is padded."""
        if self.backend != "unpadded":
            return self.mask
        if self.indices.numel() == self.batch * self.seq:
            return None
        m = torch.zeros(self.batch * self.seq, dtype=torch.bool, device=self.indices.device)
        return m.index_fill(0, self.indices, True).view(self.batch, 1, 1, self.seq)

    def first_rows(self, x: Tensor) -> Tensor:
        """Each sequence's position 0 of the layer input: (batch, ..., hidden) or packed (tokens, hidden) ->
        (batch, hidden). For the packed layout this is each row's first real token (`cu_seqlens`), which is
        position 0 when the attention mask's first column is all ones (checked by the caller)."""
        if self.backend != "unpadded":
            return x[:, 0]
        return x.index_select(0, self.cu_seqlens[:-1].long())

    def rows_of(self, flat: Tensor) -> Tensor:
        """Flat (batch * seq) positions of real tokens -> their row index in the layer's (rows, hidden) view: the
        same for the padded layout, the packed index for "unpadded"."""
        if self.backend != "unpadded":
            return flat
        inv = torch.full((self.batch * self.seq,), -1, dtype=torch.long, device=self.indices.device)
        inv[self.indices] = torch.arange(self.indices.numel(), device=self.indices.device)
        return inv.index_select(0, flat)

    def pad(self, x: Tensor) -> Tensor:
        """(tokens, hidden) -> (batch, seq, hidden) with zeros at padded positions (identity when padded)."""
        if self.backend != "unpadded":
            return x
        out = x.new_zeros(self.batch * self.seq, x.shape[-1])
        out.index_copy_(0, self.indices, x)                   # in place: no copy of the zeros
        return out.view(self.batch, self.seq, x.shape[-1])


# ---------------------------------------------------------------------------------------------- modules
def _inference_dtype(x: Tensor, weight: Tensor) -> torch.dtype | None:
    """The dtype a cached weight copy should have, or None when caching does not apply (training: gradients must
    flow to the real parameters)."""
    if torch.is_grad_enabled():
        return None
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return weight.dtype


# Bumped by every BertPreTrainedModel.train()/.eval() call: cached weights never outlive a switch between training
# and inference. (The version counter alone is not enough: fused optimizers such as AdamW(fused=True) update
# parameters in place without bumping it.)
_GENERATION = [0]


class _WeightCache:
    """A derived copy of some parameters (cast, concatenated and/or prepacked) reused across inference calls until a
    parameter changes (its version counter or storage moves) or any model switches between train and eval mode.
    Autocast would otherwise recast every weight on every forward; values are bit-identical to the uncached path.
    Parameters edited in place while in eval mode by code that does not bump version counters (a fused optimizer
    step) are not seen: call model.eval() again after such edits."""

    def __init__(self):
        self.key = None
        self.value: tuple[Tensor | None, ...] = ()

    # copies and pickles start empty: the cache is derived data, and prepacked oneDNN tensors cannot be copied
    def __deepcopy__(self, memo) -> "_WeightCache":
        return _WeightCache()

    def __getstate__(self) -> dict:
        return {"key": None, "value": ()}

    def get(self, params: tuple[Tensor | None, ...], tag, make) -> tuple[Tensor | None, ...]:
        key = (tag, _GENERATION[0], *((p._version, p.data_ptr(), p.device) for p in params if p is not None))
        if key != self.key:
            self.value, self.key = make(), key
        return self.value


# ---------------------------------------------------------------------------------------------- CPU inference GEMMs
# In CPU inference the linear layers go through oneDNN with their weights reordered once into its blocked layout
# ("prepacked", as torch.compile's CPU freezing does) instead of being reordered inside every call, and the FFN's
# GELU runs in the GEMM's epilogue (one pass over the (tokens, 4 * hidden) activation saved). Same maths; measured
# 3-11% faster per GEMM in bf16 (1,771 tokens) and 25-35% in fp32 (4,096 tokens: oneDNN beats MKL here). Falls
# back to F.linear wherever oneDNN or its bf16 support is missing, on other devices, and when gradients are
# needed. Set PACKED_LINEAR = False to switch off.
PACKED_LINEAR = True
_ONEDNN_ACT = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"), "gelu_pytorch_tanh": ("gelu", "tanh"),
               "relu": ("relu", "")}


@functools.cache
def _onednn_ok(dtype: torch.dtype) -> bool:
    """Whether prepacked oneDNN linears work here for `dtype` (checked once against F.linear)."""
    if dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    try:
        if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
        g = torch.Generator().manual_seed(0)            # a private generator: the global RNG stream is untouched
        x, w, b = (torch.randn(*shape, generator=g).to(dtype) for shape in ((4, 16), (8, 16), (8,)))
        y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, None), b, "none", [], "")
        return bool(torch.allclose(y.float(), F.linear(x, w, b).float(), atol=1e-2, rtol=1e-2))
    except (RuntimeError, AttributeError, TypeError):
        return False


def _tracing() -> bool:
    """Inside torch.jit / ONNX export tracing or torch.compile: graphs want the plain aten ops (the compiler does
    its own weight packing; ONNX has no oneDNN ops)."""
    return torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()


def _packed(x: Tensor, dtype: torch.dtype) -> bool:
    return PACKED_LINEAR and x.device.type == "cpu" and not _tracing() and _onednn_ok(dtype)


def _linear_packed(x: Tensor, w: Tensor, b: Tensor | None, act: str | None) -> Tensor:
    attr, algorithm = _ONEDNN_ACT[act] if act else ("none", "")
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, attr, [], algorithm)


def _pack(weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    return (torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), None),
            None if bias is None else bias.detach().to(dtype))


def _inference_linear(x: Tensor, cache: "_WeightCache", params: tuple[Tensor | None, ...], weight_and_bias,
                      dtype: torch.dtype, act: str | None = None) -> Tensor:
    """act(x W^T + b) in inference, W and b = weight_and_bias() (built from `params`, e.g. concatenated), kept in
    `cache` as prepacked oneDNN weights on CPU or as `dtype` copies elsewhere (see _WeightCache)."""
    if _packed(x, dtype) and (act is None or act in _ONEDNN_ACT):
        w, b = cache.get(params, ("packed", dtype), lambda: _pack(*weight_and_bias(), dtype))
        return _linear_packed(x.to(dtype), w, b, act)
    w, b = cache.get(params, dtype, lambda: tuple(None if t is None else t.to(dtype) for t in weight_and_bias()))
    y = F.linear(x.to(dtype), w, b)
    return y if act is None else activation(act)(y)


# ---------------------------------------------------------------------------------------------- CPU dropout
def dropout_keep_mask(shape: tuple[int, ...], p: float, device: torch.device) -> tuple[Tensor, float]:
    """A dropout keep-mask drawn from 16 random bits per element, and the matching 1 / P(keep) scale.

    PyTorch's CPU dropout draws one Bernoulli sample per element through its scalar Mersenne Twister: ~10 ns an
    element, which made attention dropout (a (batch, heads, seq, seq) tensor per layer) the largest cost of CPU
    training at 256+ tokens (263 ms of a 510 ms attention forward+backward per MiniLM layer at 32 x 256, bf16).
    Here one 64-bit draw (`torch.randint` over the full int64 range, same generator, so seeding and checkpointed
    RNG state work as before) yields four 16-bit uniforms: 46 ms for the same mask. The drop probability is p
    rounded to a multiple of 1/65536 (0.1 -> 0.1000061), and the scale uses that exact probability, so the
    output's expectation is exactly the input's."""
    drop, scale = dropout_drop_mask(shape, p, device)
    return ~drop, scale


def dropout_drop_mask(shape: tuple[int, ...], p: float, device: torch.device) -> tuple[Tensor, float]:
    """The complement of `dropout_keep_mask` from the same random draw (True = dropped): what `torch.where`
    needs, without the extra pass of inverting a keep mask."""
    n = math.prod(shape)
    drop = round(p * 65536)
    bits = torch.randint(-2 ** 63, 2 ** 63 - 1, (-(-n // 4),), dtype=torch.int64, device=device)
    dropped = bits.view(torch.int16)[:n].view(shape) < drop - 32768                # P(drop) = drop / 65536
    return dropped, 65536.0 / (65536 - drop)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout, with the fast mask of `dropout_keep_mask` on CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    dropped, scale = dropout_drop_mask(tuple(x.shape), p, x.device)
    return torch.where(dropped, 0.0, x * scale)                  # one pass each way (masked_fill clones first)


class Dropout(nn.Dropout):
    """nn.Dropout with the fast CPU mask (see `dropout_keep_mask`); same semantics, no parameters."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


class Linear(nn.Linear):
    """nn.Linear (same parameters and state_dict keys) that, in inference, reuses its cast (and on CPU prepacked)
    weight, and can apply an activation in the same call (`act`: a config.hidden_act name)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cast = _WeightCache()

    def forward(self, x: Tensor, act: str | None = None) -> Tensor:
        dtype = _inference_dtype(x, self.weight)
        if dtype is not None:
            return _inference_linear(x, self._cast, (self.weight, self.bias), lambda: (self.weight, self.bias),
                                     dtype, act)
        y = F.linear(x, self.weight, self.bias)
        return y if act is None else activation(act)(y)


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None, position_ids: Tensor) -> Tensor:
        # input_ids: (batch, seq) or packed (tokens,); position_ids broadcastable to it
        x = self.word_embeddings(input_ids)                            # (..., hidden)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = Dropout(config.attention_probs_dropout_prob)
        # inference copies of the fused weights: Q/K/V (every layer) and Q, K/V apart (the [CLS]-only last layer)
        self._fused = _WeightCache()
        self._fused_kv = _WeightCache()
        self._fused_q = _WeightCache()

    def _project(self, x: Tensor, mods: tuple[nn.Linear, ...], cache: _WeightCache) -> Tensor:
        """x through the given projections as one matmul on their concatenated weight: (..., hidden) ->
        (..., len(mods) * hidden). In inference the concatenated (and, under autocast, cast) weight is built once
        and reused until a parameter changes."""
        params = tuple(m.weight for m in mods) + tuple(m.bias for m in mods)

        def fused():                                    # (n * hidden, hidden) weight, (n * hidden,) bias
            if len(mods) == 1:
                return params
            return torch.cat(params[:len(mods)]), torch.cat(params[len(mods):])

        dtype = _inference_dtype(x, mods[0].weight)
        if dtype is None:
            return F.linear(x, *fused())
        return _inference_linear(x, cache, params, fused, dtype)

    def qkv(self, x: Tensor) -> Tensor:
        """One matmul for Q, K and V: (..., hidden) -> (..., 3 * hidden)."""
        return self._project(x, (self.query, self.key, self.value), self._fused)

    def forward(self, x: Tensor, layout: Layout, output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        qkv = self.qkv(x)                                   # (batch, seq, 3 * hidden) or (tokens, 3 * hidden)
        if layout.backend == "unpadded":
            return self._attend_buckets(qkv, layout), None
        b, s, _ = qkv.shape
        q, k, v = self._split(qkv.view(b, s, -1))          # each (batch, heads, seq, head_dim)
        probs = None
        if layout.backend == "eager" or output_attentions:
            scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale        # (batch, heads, seq, seq)
            if layout.mask is not None:
                scores = scores.masked_fill(~layout.mask, torch.finfo(scores.dtype).min)
            probs = torch.softmax(scores, dim=-1)
            ctx = torch.matmul(self.dropout(probs), v)                          # (batch, heads, seq, head_dim)
        else:
            ctx = self._attend(q, k, v, layout.mask)
        return ctx.transpose(1, 2).reshape(b, s, -1), probs                     # (batch, seq, hidden)

    def forward_first(self, x: Tensor, layout: Layout) -> tuple[Tensor, Tensor]:
        """Attention output for each sequence's first position only, against all keys: returns the context
        (batch, 1, hidden) and that position's input (batch, 1, hidden), the residual. Keys and values still
        cover every token (one (.., 2 * hidden) matmul); the query is one row per sequence."""
        kv = self._project(x, (self.key, self.value), self._fused_kv)   # (batch, seq, 2h) or (tokens, 2h)
        first = layout.first_rows(x)                                    # (batch, hidden)
        kv = layout.pad(kv)                                             # (batch, seq, 2 * hidden)
        b, s, _ = kv.shape
        k, v = kv.view(b, s, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q = self._project(first, (self.query,), self._fused_q)                          # (batch, hidden)
        q = q.view(b, self.num_heads, 1, self.head_dim)                                 # (batch, heads, 1, d)
        scores = torch.matmul(q * self.scale, k.transpose(-1, -2))                      # (batch, heads, 1, seq)
        mask = layout.key_mask()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = self.dropout(torch.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v)                                                    # (batch, heads, 1, d)
        return ctx.reshape(b, 1, -1), first[:, None]

    def _split(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(rows, len, 3 * hidden) -> q, k, v each (rows, heads, len, head_dim) (views, no copy)."""
        b, s, _ = qkv.shape
        return qkv.view(b, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(q k^T / sqrt(head_dim) + mask) v, (rows, heads, len, head_dim), with attention dropout in
        training. SDPA, except on CPU in two cases where the explicit form is faster:
          * bf16 inference on padded rows of up to MANUAL_ATTENTION_MAX_LEN: PyTorch's CPU flash kernel with a
            mask has a high fixed cost per (row, head) block (per BERT-base layer on 64 BBC sentences in 4 length
            buckets: 7.1 ms flash vs 5.2 ms explicit); without a mask flash is the faster one and is used;
          * training with attention dropout: the CPU flash kernel has no dropout, so SDPA falls back to its math
            kernel, in fp32 and with PyTorch's slow Bernoulli sampling; here the matmuls stay in the autocast
            dtype and the mask comes from `dropout_drop_mask` (MiniLM layer, 32 x 256, fwd+bwd: ~250 vs 658 ms);
          * training without dropout up to MANUAL_ATTENTION_MAX_LEN: the flash kernel's backward is slow on short
            rows (`mini` pre-training step, 64 x 128, bf16: 9.4-11.4k vs 8.5-8.8k tokens/s with flash).
        The explicit scores are the matmul's output (bf16 under autocast, as transformers' eager attention and
        Megatron's fused softmax). The softmax takes and returns that dtype: PyTorch's CPU kernel computes a bf16
        softmax in fp32 internally, so its output is bitwise the fp32 softmax rounded to bf16, at a fraction of the
        cost of `softmax(dtype=float32).to(bf16)` (32 x 12 x 128 x 128: ~13x faster, and its backward reads half
        the bytes; gradients round to bf16, relative error ~2e-3)."""
        short = q.shape[-2] <= MANUAL_ATTENTION_MAX_LEN
        training = EXPLICIT_TRAIN_ATTENTION and self.training and torch.is_grad_enabled()
        train_dropout = training and self.dropout.p > 0
        infer_masked = (q.dtype == torch.bfloat16 and not self.training and not torch.is_grad_enabled()
                        and mask is not None and short)
        if q.device.type == "cpu" and not _tracing() and (train_dropout or (training and short) or infer_masked):
            scores = torch.matmul(q * self.scale, k.transpose(-1, -2))          # (rows, heads, len, len)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)       # bf16 in and out, fp32 inside (see the docstring)
            if not train_dropout:
                return torch.matmul(probs, v)
            dropped, scale = dropout_drop_mask(tuple(probs.shape), self.dropout.p, probs.device)
            return torch.matmul(torch.where(dropped, 0.0, probs), v) * scale   # scale the small side
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              dropout_p=self.dropout.p if self.training else 0.0)

    def _attend_buckets(self, qkv: Tensor, layout: Layout) -> Tensor:
        """Unpadded attention: packed (tokens, 3 * hidden) -> per-bucket (rows, length) grids -> (tokens, hidden)."""
        grid = qkv.new_zeros(layout.grid_size, qkv.shape[-1])                 # zeros: padded v must not be NaN
        grid.index_copy_(0, layout.grid_index, qkv)        # in place: no copy of the zeros
        out = []
        for bk in layout.buckets:
            q, k, v = self._split(grid[bk.offset:bk.offset + bk.rows * bk.length].view(bk.rows, bk.length, -1))
            ctx = self._attend(q, k, v, bk.mask)                              # (rows, heads, length, head_dim)
            out.append(ctx.transpose(1, 2).reshape(bk.rows * bk.length, -1))
        ctx = out[0] if len(out) == 1 else torch.cat(out)                     # (grid_size, hidden)
        return ctx.index_select(0, layout.grid_index)                         # (tokens, hidden)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, ctx: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(ctx)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: Tensor, layout: Layout, output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        ctx, probs = self.self(x, layout, output_attentions)
        return self.output(ctx, x), probs


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.act_name = config.hidden_act
        activation(config.hidden_act)                                   # unknown names fail here, at build time

    def forward(self, x: Tensor) -> Tensor:
        return self.dense(x, act=self.act_name)                         # (..., intermediate)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: Tensor, layout: Layout, output_attentions: bool = False) -> tuple[Tensor, Tensor | None]:
        a, probs = self.attention(x, layout, output_attentions)
        return self.output(self.intermediate(a), a), probs

    def forward_first(self, x: Tensor, layout: Layout) -> Tensor:
        """The layer's output at each sequence's first position ([CLS]) only: (batch, 1, hidden). The same maths
        as `forward(...)[0][:, :1]`: position 0 depends on every key and value but on no other query, and the
        attention output, LayerNorms and FFN are per position. Skips ~5/6 of the layer's matmuls."""
        ctx, residual = self.attention.self.forward_first(x, layout)
        a = self.attention.output(ctx, residual)
        return self.output(self.intermediate(a), a)

    def forward_rows(self, x: Tensor, layout: Layout, rows: Tensor) -> Tensor:
        """The layer's output at the given rows only: `rows` (n,) index the layer's (rows, hidden) view (flat
        batch * seq positions, or packed token indices for "unpadded"); returns (n, hidden), the same values as
        `forward(...)[0].reshape(-1, hidden)[rows]`. Attention runs in full (every row is a key and value, and
        queries are cheap next to the dense work); the attention output projection, both LayerNorms and the FFN,
        3/4 of the layer's matmul FLOPs, run on the n rows only (MosaicBERT's last-layer subset for MLM)."""
        ctx, _ = self.attention.self(x, layout)                 # (batch, seq, hidden) or (tokens, hidden)
        h = x.shape[-1]
        ctx = ctx.reshape(-1, h).index_select(0, rows)          # (n, hidden)
        a = self.attention.output(ctx, x.reshape(-1, h).index_select(0, rows))
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: Tensor, layout: Layout, output_attentions: bool = False,
                output_hidden_states: bool = False, first_only: bool = False, rows: Tensor | None = None
                ) -> tuple[Tensor, list[Tensor] | None, list[Tensor] | None]:
        """first_only: the last layer runs for position 0 only and x comes back (batch, 1, hidden); rows: the last
        layer's output is computed for these rows only (see BertLayer.forward_rows) and comes back (n, hidden).
        Neither together with output_attentions / output_hidden_states."""
        hidden = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for i, layer in enumerate(self.layer):
            if first_only and i == len(self.layer) - 1:
                return layer.forward_first(x, layout), None, None
            if rows is not None and i == len(self.layer) - 1:
                return layer.forward_rows(x, layout, rows), None, None
            x, probs = layer(x, layout, output_attentions)
            if hidden is not None:
                hidden.append(x)
            if attentions is not None:
                attentions.append(probs)
        return x, hidden, attentions


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.dense(x[:, 0]))                          # (batch, hidden) from [CLS]


# ---------------------------------------------------------------------------------------------- base class
class BertPreTrainedModel(nn.Module):
    """Shared by BertModel and the heads: config, HF-style init, from_pretrained / save_pretrained."""

    base_model_prefix = "bert"
    # head parameters whose absence from a checkpoint is reported (newly initialised), not an error
    _head_prefixes: tuple[str, ...] = ()

    def __init__(self, config: BertConfig):
        super().__init__()
        if not isinstance(config, BertConfig):
            raise ConfigError(f"expected a BertConfig, got {type(config).__name__}")
        self.config = config
        self.loading_info: dict[str, list[str]] = {"missing_keys": [], "unexpected_keys": [], "ignored_keys": []}

    def train(self, mode: bool = True):
        _GENERATION[0] += 1          # invalidates every cached inference weight (see _WeightCache)
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
                nn.init.zeros_(m.bias)
        self._init_extra()

    def _init_extra(self) -> None:
        """Hook for parameters that are not inside a Linear/Embedding/LayerNorm (e.g. the MLM output bias)."""

    @classmethod
    def from_pretrained(cls, path, *, dtype: torch.dtype | None = None, device=None, **config_overrides):
        """Load an HF-format directory (config.json + model.safetensors or pytorch_model.bin). See checkpoint.py."""
        from bertkit.checkpoint import load_pretrained
        return load_pretrained(cls, path, dtype=dtype, device=device, **config_overrides)

    def save_pretrained(self, path, tokenizer=None) -> None:
        """Write config.json + model.safetensors (atomically) and, if given, the tokenizer's files."""
        from bertkit.checkpoint import save_pretrained
        save_pretrained(self, path, tokenizer=tokenizer)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= sum(p.numel() for name, p in self.named_parameters() if "embeddings" in name)
        return n


def _check_inputs(config: BertConfig, input_ids: Tensor, token_type_ids: Tensor | None,
                  attention_mask: Tensor | None) -> None:
    """Raise ConfigError naming the bad value. Value range checks run on CPU tensors only (no GPU sync)."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise ConfigError(f"input_ids must be a (batch, seq) tensor, got {shape}")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ConfigError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
    b, s = input_ids.shape
    if s > config.max_position_embeddings:
        raise ConfigError(f"sequence length {s} exceeds max_position_embeddings={config.max_position_embeddings}")
    for name, t in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if t is not None and tuple(t.shape) != (b, s):
            raise ConfigError(f"{name} has shape {tuple(t.shape)}, expected {(b, s)} like input_ids")
    if input_ids.device.type != "cpu" or input_ids.numel() == 0 or torch.compiler.is_compiling():
        return  # value checks need the values: not on a GPU (a sync per step) nor inside a compiled graph
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if hi >= config.vocab_size or lo < 0:
        bad = hi if hi >= config.vocab_size else lo
        where = (input_ids == bad).nonzero()[0].tolist()
        raise ConfigError(f"input_ids contains token id {bad} at position {where}, outside the vocab "
                          f"(vocab_size={config.vocab_size})")
    if token_type_ids is not None:
        hi, lo = int(token_type_ids.max()), int(token_type_ids.min())
        if hi >= config.type_vocab_size or lo < 0:
            bad = hi if hi >= config.type_vocab_size else lo
            raise ConfigError(f"token_type_ids contains {bad}, outside type_vocab_size={config.type_vocab_size}")


# ---------------------------------------------------------------------------------------------- BertModel
class BertModel(BertPreTrainedModel):
    _head_prefixes = ("pooler.",)

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def choose_backend(self, attention_mask: Tensor | None, output_attentions: bool) -> str:
        """The attention backend for this batch (see the module docstring for the "auto" rule)."""
        impl = self.config.attn_implementation
        if output_attentions:
            return "eager"
        if impl != "auto":
            return impl
        if attention_mask is None:
            return "sdpa"
        fill = float(attention_mask.sum()) / max(attention_mask.numel(), 1)
        return "unpadded" if fill < UNPAD_MIN_FILL else "sdpa"

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                output_attentions: bool = False, output_hidden_states: bool = False,
                first_token_only: bool = False, output_rows: Tensor | None = None) -> BertModelOutput:
        """first_token_only: compute the last layer at position 0 ([CLS]) only, for callers that read nothing but
        the pooler (sequence classification): `last_hidden_state` is then (batch, 1, hidden), the same values as
        the full forward's `[:, :1]`, and the pooler is unchanged.
        output_rows: (n,) flat (batch * seq) positions of real tokens, for callers that read the last layer at
        those positions only (MLM at its masked tokens): `last_hidden_state` is then (n, hidden), the same values
        as the full forward's `.reshape(-1, hidden)[output_rows]`, and the last layer's output projection and FFN
        run on those rows (plus [CLS] for the pooler) only.
        Both are ignored (the full last layer runs; output_rows still selects the returned rows) when attention
        maps or hidden states are requested, and for a packed batch whose attention mask does not start with a
        real token in every row."""
        _check_inputs(self.config, input_ids, token_type_ids, attention_mask)
        b, s = input_ids.shape
        backend = self.choose_backend(attention_mask, output_attentions)
        layout = Layout.build(backend, attention_mask, b, s, input_ids.device)
        subset = (first_token_only or output_rows is not None) and not (output_attentions or output_hidden_states)
        if subset and backend == "unpadded" and attention_mask is not None:
            subset = bool(attention_mask[:, 0].all())         # packed rows must start at position 0
        first_only = subset and first_token_only and output_rows is None
        rows = None
        if subset and output_rows is not None:
            flat = output_rows.reshape(-1)                                                   # (n,)
            if self.pooler is not None:                      # the [CLS] rows too: the pooler reads them
                flat = torch.cat([flat, torch.arange(b, device=input_ids.device) * s])
            rows = layout.rows_of(flat)
            if backend == "unpadded" and rows.numel() and int(rows.min()) < 0:
                # a requested position is padding (e.g. an MLM label there): not in the packed rows, so the full
                # layer runs and the padded output (zeros there) is selected, as without output_rows
                rows = None
        if backend == "unpadded":
            idx = layout.indices                                         # (tokens,)
            ids = input_ids.reshape(-1).index_select(0, idx)
            types = None if token_type_ids is None else token_type_ids.reshape(-1).index_select(0, idx)
            x = self.embeddings(ids, types, idx % s)                     # (tokens, hidden)
        else:
            positions = torch.arange(s, device=input_ids.device)
            x = self.embeddings(input_ids, token_type_ids, positions)    # (batch, seq, hidden)
        if (BF16_TRAIN_ACTIVATIONS and self.training and torch.is_grad_enabled() and x.device.type == "cpu"
                and torch.is_autocast_enabled("cpu") and not _tracing()):
            # CPU autocast leaves LayerNorm (and so the residual stream) in fp32: every linear layer would cast
            # its input to bf16 and every residual add its gradient back, passes over (tokens, hidden) that were
            # ~15% of a MiniLM training step at 128 tokens. One cast here keeps the stream in bf16; LayerNorm
            # still computes in fp32 internally with fp32 parameters, matmuls accumulate in fp32 (as before).
            x = x.to(torch.get_autocast_dtype("cpu"))
        x, hidden, attentions = self.encoder(x, layout, output_attentions, output_hidden_states, first_only, rows)
        if rows is not None:
            n = output_rows.numel()
            pooled = self.pooler(x[n:, None]) if self.pooler is not None else None   # (batch, hidden)
            return BertModelOutput(last_hidden_state=x[:n], pooler_output=pooled)    # (n, hidden)
        if not first_only:
            x = layout.pad(x)                                            # (batch, seq, hidden)
        pooled = self.pooler(x) if self.pooler is not None else None
        if output_rows is not None:                                      # the full layer ran: select the rows
            x = x.reshape(-1, x.shape[-1]).index_select(0, output_rows.reshape(-1))
        return BertModelOutput(
            last_hidden_state=x, pooler_output=pooled,
            hidden_states=tuple(layout.pad(h) for h in hidden) if hidden is not None else None,
            attentions=tuple(attentions) if attentions is not None else None)
