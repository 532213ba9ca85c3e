"""bertkit.runtime.int8: int8 linear layers close to fp32, saved and loaded as int8, inference-only."""

from __future__ import annotations

import copy

import pytest
import torch

from bertkit import runtime
from bertkit.config import BertConfig
from bertkit.errors import ConfigError
from bertkit.heads import BertForSequenceClassification
from bertkit.model import BertModel
from bertkit.runtime import int8
from bertkit.runtime.int8 import Int8Linear

pytestmark = pytest.mark.skipif(not int8.int8_kernel_ok(), reason="no int8 linear kernel in this PyTorch build")


def _tiny(cls=BertModel, **kw):
    torch.manual_seed(0)
    return cls(BertConfig.preset("tiny", vocab_size=3000, max_position_embeddings=64, **kw)).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 3000, (6, 40), generator=g)
    mask = (torch.arange(40)[None] < torch.tensor([40, 3, 9, 1, 12, 25])[:, None]).long()
    return ids * mask, mask


def _hidden(model, ids, mask):
    with torch.no_grad():
        out = model(ids, attention_mask=mask).last_hidden_state
    return out[mask.bool()]                                             # (real tokens, hidden)


@pytest.mark.parametrize("force", ["all", "none"])                     # "all": unpadded attention and packed GEMMs
def test_int8_hidden_states_close_to_fp32(force):
    """Tolerance: every real token's final hidden state within cosine 0.995 of fp32 and 0.15 absolute (the
    LayerNorm outputs are O(1)); quantizing weights and activations at 8 bits costs ~1% of the values."""
    ids, mask = _batch()
    plain = runtime.freeze(_tiny(), runtime.plan(force=force))
    q = runtime.freeze(int8.quantize(_tiny()), runtime.plan(force=force))
    assert sum(type(m) is Int8Linear for m in q.modules()) == 2 * 6 + 1   # 2 layers x (q k v o in out) + pooler
    a, b = _hidden(plain, ids, mask), _hidden(q, ids, mask)
    assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.995
    assert (a - b).abs().max() < 0.15
    assert (a - b).abs().max() > 0                                     # it really ran in int8


def test_int8_round_trip_and_size(tmp_path):
    ids, mask = _batch()
    fp = _tiny(BertForSequenceClassification, num_labels=3)
    fp.save_pretrained(tmp_path / "fp32")
    q = int8.quantize(copy.deepcopy(fp))
    q.save_pretrained(tmp_path / "int8")
    loaded = BertForSequenceClassification.from_pretrained(tmp_path / "int8")
    assert isinstance(loaded.classifier, Int8Linear) and loaded.classifier.weight.dtype == torch.int8
    with torch.no_grad():
        expect = q(ids, attention_mask=mask).logits
        assert torch.equal(loaded(ids, attention_mask=mask).logits, expect)
        # inference commands freeze what they load; the forced plan keeps the default engine at every length (a
        # measured plan may pick another engine or the float path for short inputs: other rounding, not an error)
        frozen = runtime.freeze(loaded, runtime.plan(force="all"))
        assert isinstance(frozen.bert.encoder.layer[0].attention.self.query, Int8Linear)
        assert torch.allclose(frozen(ids, attention_mask=mask).logits, expect, atol=1e-5)
    size = lambda d: (tmp_path / d / "model.safetensors").stat().st_size   # noqa: E731
    assert size("int8") <= 0.30 * size("fp32")
    with pytest.raises(ConfigError, match="inference"):
        loaded.train()


def test_keep_float_patterns():
    q = int8.quantize(_tiny(BertForSequenceClassification, num_labels=2),
                      keep_float=["classifier", "bert.encoder.layer.1.output.*"])
    assert isinstance(q.classifier, torch.nn.Linear)
    assert isinstance(q.bert.encoder.layer[1].output.dense, torch.nn.Linear)
    assert isinstance(q.bert.encoder.layer[1].intermediate.dense, Int8Linear)
    assert q.config.extra["quantization_config"]["keep_float"] == ["classifier", "bert.encoder.layer.1.output.*"]


def test_int8_layers_cannot_go_stale():
    """Prepacked int8 weights (and the fused Q/K/V rows they come from) are derived data: new weights through an
    in-place copy, load_state_dict (copy or assign), `.to()` or a replaced layer reach the output."""
    ids, mask = _batch()
    other = _tiny()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = int8.quantize(other).state_dict()
    expected = _hidden(runtime.freeze(int8.quantize(_tiny()), runtime.plan(force="all")).eval(), ids, mask)
    for how in ("copy", "assign", "to", "in_place", "replaced"):
        q = runtime.freeze(int8.quantize(_tiny()), runtime.plan(force="all"))
        before = _hidden(q, ids, mask)                                 # prepacked weights built
        assert torch.equal(before, expected)
        if how in ("copy", "assign", "to"):
            if how == "to":
                q = q.to(torch.float64).to(torch.float32)
            q.load_state_dict(state, assign=how == "assign")
            target = state
        else:
            att = q.encoder.layer[0].attention.self
            if how == "in_place":
                with torch.no_grad():
                    att.key.weight.copy_(-att.key.weight)
            else:
                att.key = Int8Linear.from_float(torch.nn.Linear(att.key.in_features, att.key.out_features))
            target = q.state_dict()
        fresh = int8.quantize(_tiny())
        fresh.load_state_dict(target)
        fresh = runtime.freeze(fresh, runtime.plan(force="all"))
        after = _hidden(q, ids, mask)
        assert not torch.equal(after, before), how
        assert torch.equal(after, _hidden(fresh, ids, mask)), how


def test_graphs_get_the_float_product_of_the_int8_weights():
    """Under torch.export (as under ONNX export's tracing) an int8 layer runs plain aten ops on its dequantized
    weights: graphs cannot hold the prepacked kernel."""
    torch.manual_seed(0)
    q = Int8Linear.from_float(torch.nn.Linear(32, 16), act="gelu")
    x = torch.randn(4, 32)
    program = torch.export.export(q, (x,))
    assert "quantized" not in str(program.graph)
    w, b = q.dequantized()
    assert torch.allclose(program.module()(x), torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b)))
    traced = torch.jit.trace(q, (x,), check_trace=False)
    assert "quantized" not in str(traced.graph)


def test_quantize_a_frozen_model_keeps_the_fused_activation():
    ids, mask = _batch()
    frozen = runtime.freeze(_tiny(), runtime.plan(force="all"))
    direct = int8.quantize(_tiny())
    q = int8.quantize(frozen)
    assert q.encoder.layer[0].intermediate.dense.act == "gelu"
    assert torch.equal(_hidden(q, ids, mask), _hidden(direct, ids, mask))


def test_plan_reports_int8_and_freeze_sets_the_engine():
    from bertkit.runtime.int8 import ENGINES, int8_kernel_ok
    assert any(line.startswith("int8_linear: on") for line in runtime.describe(runtime.plan(force="all")))
    ids, mask = _batch()
    outs = []
    for engine in [e for e in ENGINES if int8_kernel_ok(e)]:             # both libraries compute the same product
        plan = runtime.RuntimePlan(runtime.plan(force="none").options, int8_engine=engine)
        q = runtime.freeze(int8.quantize(_tiny()), plan)
        assert {m.engine for m in q.modules() if isinstance(m, Int8Linear)} == {engine}
        outs.append(_hidden(q, ids, mask))
    assert all((o - outs[0]).abs().max() < 0.02 for o in outs)


def test_freeze_warns_where_int8_measured_slower(caplog):
    slower = runtime.RuntimePlan(runtime.plan(force="none").options, reasons={"int8_linear": "9 ms vs plain 3 ms"})
    with caplog.at_level("WARNING", logger="bertkit.runtime.int8"):
        runtime.freeze(_tiny(), slower)                                # a float model: nothing to say
        assert not caplog.records
        runtime.freeze(int8.quantize(_tiny()), slower)
    assert "slower than fp32" in caplog.text


def test_int8_layers_run_float_where_float_measured_faster():
    """Where the probe found fp32 faster than int8, a quantized model's layers multiply their dequantized weights
    in float (the same weights as on disk); where only bf16 was faster, they do so under bf16 autocast and "auto"
    is no longer held to fp32 activations, while fp32 runs keep the int8 kernel."""
    from bertkit.precision import for_model
    none = runtime.plan(force="none").options
    x = torch.randn(3, 50, 128)                                        # 150 rows: the kernel would run int8

    def first_layer(plan):
        frozen = runtime.freeze(int8.quantize(_tiny()), plan)
        layer = next(m for m in frozen.modules() if isinstance(m, Int8Linear) and m.in_features == 128)
        return frozen, layer, torch.nn.functional.linear(x, *layer.dequantized())

    with torch.no_grad():
        frozen, layer, ref = first_layer(runtime.RuntimePlan(none, reasons={"int8_linear": "9 ms vs fp32 3 ms"}))
        assert layer.engine is None and for_model("auto", frozen) == "auto"
        assert torch.allclose(layer(x), ref, atol=1e-5)
        frozen, layer, ref = first_layer(runtime.RuntimePlan(none, int8_engine=int8.default_engine(),
                                                             int8_under_bf16=((384, True, 0),)))
        assert for_model("auto", frozen) == "auto" and for_model("fp32", frozen) == "fp32"
        assert not torch.allclose(layer(x), ref, atol=1e-5)            # fp32: the int8 kernel
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        assert y.dtype == torch.bfloat16 and torch.allclose(y.float(), ref, atol=0.05)
        frozen = runtime.freeze(int8.quantize(_tiny()), runtime.plan(force="none"))
        assert for_model("auto", frozen) == "fp32"                     # int8 won everywhere: fp32 activations


def test_short_inputs_run_the_float_gemm_where_int8_lost_on_them(caplog):
    """A plan whose probe found int8 slower on short inputs: under `int8_float_below` rows the layers multiply
    their dequantized weights in float (the same weights), longer inputs keep the int8 kernel; the user is told."""
    lin = torch.nn.Linear(32, 16)
    torch.manual_seed(0)
    q = Int8Linear.from_float(lin)
    w, b = q.dequantized()
    short, long = torch.randn(2, 5, 32), torch.randn(4, 20, 32)         # 10 rows, 80 rows
    with torch.no_grad():
        int8_short, int8_long = q(short), q(long)
        q.float_below = 64
        assert torch.equal(q(short), torch.nn.functional.linear(short, w, b))
        assert not torch.equal(q(short), int8_short)
        assert torch.equal(q(long), int8_long)
    plan = runtime.RuntimePlan(runtime.plan(force="none").options, int8_engine=int8.default_engine(),
                               int8_float_below=64)
    ids, mask = _batch()                                               # 90 real tokens: int8 throughout
    with caplog.at_level("WARNING", logger="bertkit.runtime.int8"):
        model = runtime.freeze(int8.quantize(_tiny()), plan)
    assert "slower than fp32 on short inputs" in caplog.text and "under 64 tokens" in caplog.text
    assert {m.float_below for m in model.modules() if isinstance(m, Int8Linear)} == {64}
    one = ids[4:5, :12], mask[4:5, :12]                                # one sentence of 12 tokens: float GEMMs
    reference = copy.deepcopy(model)
    for m in reference.modules():
        if isinstance(m, Int8Linear):
            m.float_below = 0
    assert not torch.equal(_hidden(model, *one), _hidden(reference, *one))
    assert torch.equal(_hidden(model, ids, mask), _hidden(reference, ids, mask))


def test_bf16_kernel_runs_int8_gemms_on_bf16_activations_under_its_row_limit():
    """Where the plan found int8 GEMMs with bf16 activations faster than bf16 (`int8_under_bf16`), inputs
    of fewer rows under bf16 autocast run oneDNN's int8 GEMM (bf16 in and out, the activation in its epilogue) on
    the same int8 weights; longer ones, and every fp32 run, keep the path they had."""
    if not int8.qlinear_bf16_ok():
        pytest.skip("no oneDNN int8 GEMM with VNNI here")
    torch.manual_seed(0)
    q = Int8Linear.from_float(torch.nn.Linear(64, 48), act="gelu")
    q.bf16_faster = True
    w, b = q.dequantized()
    short, long = torch.randn(2, 5, 64).bfloat16(), torch.randn(4, 20, 64).bfloat16()     # 10 rows, 80 rows
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_short, bf16_long = q(short), q(long)
        model = runtime.freeze(int8.quantize(_tiny()), runtime.RuntimePlan(
            runtime.plan(force="none").options, int8_engine=int8.default_engine(),
            int8_under_bf16=((128, True, 64), (768, True, 0))))
        # the tiny model's layers (width 128) follow the probe nearest their width
        assert {m.bf16_kernel_below for m in model.modules() if isinstance(m, Int8Linear)} == {64}
        q.bf16_kernel_below = 64
        y = q(short)
        assert y.dtype == torch.bfloat16 and y.shape == (2, 5, 48) and not torch.equal(y, bf16_short)
        ref = torch.nn.functional.gelu(torch.nn.functional.linear(short.float(), w, b))
        assert (y.float() - ref).abs().max() < 0.03 * ref.abs().max()
        assert torch.equal(q(long), bf16_long)
        plain = copy.deepcopy(q)
        plain.bf16_kernel_below = 0
    with torch.no_grad():                                              # fp32: the int8 kernel as before
        assert torch.equal(q(short.float()), plain(short.float()))


def test_predictor_loads_an_int8_directory(tmp_path):
    """What every inference command and `serve` use (Predictor.load) reads the int8 directory as it is."""
    from bertkit import Tokenizer
    from bertkit.infer import Predictor
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(2995)]
    tok = Tokenizer({t: i for i, t in enumerate(vocab)})
    fp = _tiny(BertForSequenceClassification, num_labels=2)
    fp.save_pretrained(tmp_path / "fp32", tokenizer=tok)
    int8.quantize(fp).save_pretrained(tmp_path / "int8", tokenizer=tok)
    texts = ["w1 w2 w3", "w7 w8 w9 w10 w11 w12"]
    a, b = (Predictor.load(tmp_path / d) for d in ("fp32", "int8"))
    assert isinstance(b.model.classifier, Int8Linear)
    ea, eb = a.embed(texts), b.embed(texts)
    assert torch.nn.functional.cosine_similarity(torch.as_tensor(ea), torch.as_tensor(eb)).min() > 0.99


def test_keep_float_can_name_one_of_query_key_value():
    """A kept key (or query, value) stays float and runs on its own beside its int8 siblings; the model loads back
    the same way from its quantization_config."""
    ids, mask = _batch()
    q = int8.quantize(_tiny(), keep_float=["encoder.layer.0.attention.self.key"])
    att = q.encoder.layer[0].attention.self
    assert type(att.key) is torch.nn.Linear
    assert isinstance(att.query, Int8Linear) and isinstance(att.value, Int8Linear)
    assert isinstance(q.encoder.layer[1].attention.self.key, Int8Linear)
    a = _hidden(runtime.freeze(copy.deepcopy(q), runtime.plan(force="all")), ids, mask)
    assert torch.nn.functional.cosine_similarity(a, _hidden(_tiny(), ids, mask), dim=-1).min() > 0.995
    loaded = int8.prepare(_tiny(), q.config)
    loaded.load_state_dict(q.state_dict())
    assert type(loaded.encoder.layer[0].attention.self.key) is torch.nn.Linear
    assert torch.equal(_hidden(loaded, ids, mask), _hidden(q, ids, mask))


def test_loading_an_int8_model_quantizes_nothing(tmp_path, monkeypatch):
    """The int8 layers a load builds take the checkpoint's values as they are: quantizing the freshly initialised
    float weights first was work thrown away on every load (seconds of a `predict` command)."""
    ids, mask = _batch()
    q = int8.quantize(_tiny())
    q.save_pretrained(tmp_path)
    monkeypatch.setattr(int8, "quantize_rows", lambda w: pytest.fail("a load quantized weights"))
    loaded = BertModel.from_pretrained(tmp_path)
    assert torch.equal(_hidden(loaded, ids, mask), _hidden(q, ids, mask))
