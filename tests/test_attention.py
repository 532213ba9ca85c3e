"""Every attention function and execution plan computes the eager function: train / inference x fp32 / bf16, with
gradients, and the plan picks what its options and the mode say."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bertkit.attention import ATTENTION_FUNCTIONS, ExecutionOptions, ExecutionPlan, Mode
from bertkit.config import BertConfig
from bertkit.model import BertModel

FUNCTIONS = sorted(ATTENTION_FUNCTIONS)


def _qkv(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, 4, 9, 16, generator=g).to(dtype).requires_grad_() for _ in range(3))
    mask = (torch.arange(9)[None] < torch.tensor([9, 5, 2])[:, None])[:, None, None, :]
    return q, k, v, mask


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [True, False])
def test_function_equals_eager_with_gradients(name, dtype, masked):
    plan = SimpleNamespace(fast_dropout=False)
    results = []
    for fn in (ATTENTION_FUNCTIONS["eager"], ATTENTION_FUNCTIONS[name]):
        q, k, v, mask = _qkv(dtype)
        ctx, _ = fn(q, k, v, mask if masked else None, 0.25, 0.0, plan)
        ctx.float().pow(2).sum().backward()
        results.append((ctx.float(), q.grad.float(), k.grad.float(), v.grad.float()))
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for a, b in zip(*results):
        assert (a - b).abs().max().item() <= tol * max(1.0, a.abs().max().item())


def _tiny(**kw):
    torch.manual_seed(0)
    return BertModel(BertConfig.preset("tiny", vocab_size=99, max_position_embeddings=64,
                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kw))


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (6, 20), generator=g)
    mask = (torch.arange(20)[None] < torch.tensor([20, 3, 9, 1, 12, 20])[:, None]).long()
    return ids * mask, mask


ALL_ON = ExecutionOptions(explicit_train_attention=True, explicit_train_short=True,
                          explicit_masked_inference=True, fast_dropout=True, bf16_residual=True,
                          bucket_overhead=1.0)          # cheap buckets: inference splits the 6 rows into several


@pytest.mark.parametrize("impl", ["sdpa", "unpadded", "auto"])
@pytest.mark.parametrize("options", [ExecutionOptions(), ALL_ON], ids=["plain", "all"])
@pytest.mark.parametrize("training", [False, True])
def test_model_plans_equal_eager_fp32(impl, options, training):
    """Each layout x attention function x options, fp32: outputs <= 1e-5 of the eager model, gradients too."""
    ids, mask = _batch()
    ref, other = _tiny(attn_implementation="eager"), _tiny(attn_implementation=impl)
    other.execution = options
    ref.train(training), other.train(training)
    real = mask.bool()
    a, b = ref(ids, None, mask), other(ids, None, mask)
    assert (a.last_hidden_state - b.last_hidden_state)[real].abs().max() <= 1e-5
    (a.last_hidden_state[real].sum() + a.pooler_output.sum()).backward()
    (b.last_hidden_state[real].sum() + b.pooler_output.sum()).backward()
    for (name, p), q in zip(ref.named_parameters(), other.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("impl", ["sdpa", "unpadded"])
@pytest.mark.parametrize("training", [False, True])
def test_model_plans_close_to_eager_bf16(impl, training):
    """Under bf16 autocast with every fast path on (explicit kernels, bf16 residual stream): close to fp32 eager."""
    ids, mask = _batch()
    ref, other = _tiny(attn_implementation="eager"), _tiny(attn_implementation=impl)
    other.execution = ALL_ON
    ref.train(training), other.train(training)
    real = mask.bool()
    a = ref(ids, None, mask).last_hidden_state
    with torch.autocast("cpu", dtype=torch.bfloat16):
        b = other(ids, None, mask).last_hidden_state
    assert (a - b.float())[real].abs().max() < 0.1


def test_plan_choices():
    """Which function the plan picks, from the options and the mode (CPU)."""
    cpu = torch.device("cpu")
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 4:] = 0

    def build(options, training, dtype=torch.float32, p=0.1, tracing=False, impl="sdpa", maps=False, grad=None):
        mode = Mode(cpu, dtype, training, tracing, dtype != torch.float32, training if grad is None else grad)
        return ExecutionPlan.build(options, impl, mask, (2, 8), mode, maps, p)

    plain = ExecutionOptions()
    assert (build(plain, True).masked, build(plain, True).unmasked) == ("sdpa", "sdpa")
    assert build(ALL_ON, True).masked == "explicit"
    assert build(ALL_ON, True, p=0.0).masked == "explicit"              # short rows, no dropout
    assert build(ALL_ON.with_(explicit_max_len=4), True, p=0.0).masked == "sdpa"
    assert build(ALL_ON, True, tracing=True).masked == "sdpa"          # graphs get plain aten ops
    assert build(ALL_ON, False).masked == "sdpa"                       # fp32 inference
    bf16 = build(ALL_ON, False, dtype=torch.bfloat16)
    assert (bf16.masked, bf16.unmasked) == ("explicit", "sdpa")
    assert build(ALL_ON, True, dtype=torch.bfloat16).residual_dtype == torch.bfloat16
    assert build(plain, True, dtype=torch.bfloat16).residual_dtype is None
    assert build(ALL_ON, False).dropout_p == 0.0 and build(ALL_ON, True).dropout_p == 0.1
    no_grad_train = build(ALL_ON, True, grad=False)          # train() under no_grad: dropout still applies
    assert no_grad_train.dropout_p == 0.1 and no_grad_train.masked == "sdpa"
    assert build(plain, False, maps=True).masked == "eager"
    assert build(plain, False, impl="auto").layout.kind == "unpadded"   # 75% real tokens
    # buckets by cost in inference only; training steps keep length_buckets (one bucket below 32 rows)
    assert len(build(ALL_ON, False, impl="unpadded").layout.buckets) == 2
    assert len(build(ALL_ON, True, impl="unpadded").layout.buckets) == 1
    assert len(build(plain, False, impl="unpadded").layout.buckets) == 1


def test_cost_buckets():
    """The bucket count minimises rows * length^2 plus the per-bucket cost."""
    from bertkit.padding import Layout, cost_buckets
    assert cost_buckets([50] * 32, 0.0) == 1                                  # nothing to save
    assert cost_buckets([90, 90, 10, 10], 10.0) == 2                          # 2*8100 + 2*100 + 20 < 4*8100 + 10
    assert cost_buckets([90, 90, 10, 10], 1e6) == 1
    assert cost_buckets(list(range(64, 0, -1)), 0.0) == 32                    # capped at MAX_COST_BUCKETS
    lengths = torch.tensor([7, 30, 2, 19, 30, 11])
    mask = torch.arange(30)[None] < lengths[:, None]
    layout = Layout.build("unpadded", mask, 6, 30, bucket_overhead=300.0)
    assert [b.length for b in layout.buckets] == [30, 19, 7]                  # 6 rows, k = 3: 2 rows a bucket
    x = torch.randn(int(lengths.sum()), 5)
    assert torch.equal(layout.from_buckets(layout.to_buckets(x)), x)
