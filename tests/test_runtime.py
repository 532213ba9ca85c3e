"""bertkit.runtime: fast paths applied from outside the model, chosen by measurement, never stale."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from bertkit import runtime
from bertkit.config import BertConfig
from bertkit.errors import ConfigError
from bertkit.heads import BertForSequenceClassification
from bertkit.model import BertModel


def _tiny(cls=BertModel, **kw):
    torch.manual_seed(0)
    return cls(BertConfig.preset("tiny", vocab_size=99, max_position_embeddings=64, **kw))


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 99, (5, 17), generator=g)
    mask = (torch.arange(17)[None] < torch.tensor([17, 3, 9, 1, 12])[:, None]).long()
    return ids * mask, mask


@pytest.mark.parametrize("force", ["all", "none"])
@pytest.mark.parametrize("autocast", [False, True])
def test_frozen_model_equals_plain(force, autocast):
    ids, mask = _batch()
    plain = _tiny(BertForSequenceClassification, num_labels=3).eval()
    frozen = runtime.freeze(copy.deepcopy(plain), runtime.plan(force=force))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        a, b = plain(ids, None, mask).logits, frozen(ids, None, mask).logits
        again = frozen(ids, None, mask).logits                          # derived weights reused
    assert torch.equal(b, again)
    assert (a.float() - b.float()).abs().max() <= (1e-5 if not autocast else 3e-2)
    assert not any(p.requires_grad for p in frozen.parameters())
    assert set(frozen.state_dict()) == set(plain.state_dict())         # the checkpoint's names, nothing fused


def test_frozen_model_cannot_go_stale():
    """A frozen model refuses training, and new weights through load_state_dict replace every derived copy."""
    ids, mask = _batch()
    frozen = runtime.freeze(_tiny().eval(), runtime.plan(force="all"))
    with torch.no_grad():
        before = frozen(ids, None, mask).last_hidden_state
    with pytest.raises(ConfigError, match="frozen for inference"):
        frozen.train()
    other = _tiny()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn_like(p))
    other.eval()
    state = runtime.freeze(copy.deepcopy(other), runtime.plan(force="none")).state_dict()
    frozen.load_state_dict(state)
    with torch.no_grad():
        after = frozen(ids, None, mask).last_hidden_state
        expected = other(ids, None, mask).last_hidden_state
    assert not torch.allclose(before, after)
    assert (after - expected).abs().max() <= 1e-5


def test_training_model_never_sees_stale_weights():
    """A trained (not frozen) model has no derived weights: evaluation between fused AdamW steps, which update
    parameters without bumping their version counters, always matches a fresh copy."""
    ids, mask = _batch()
    model = runtime.apply(_tiny(), runtime.plan(force="all"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for _ in range(3):
        model.train()
        model(ids, None, mask).last_hidden_state.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        model.eval()
        with torch.no_grad():
            ours = model(ids, None, mask).last_hidden_state
            fresh = copy.deepcopy(model)(ids, None, mask).last_hidden_state
        assert torch.equal(ours, fresh)


def test_apply_swaps_dropout_only_where_chosen():
    model = _tiny()
    runtime.apply(model, runtime.plan(force="none"))
    assert not any(isinstance(m, runtime.FastDropout) for m in model.modules())
    runtime.apply(model, runtime.plan(force="all"))
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all(isinstance(m, runtime.FastDropout) and m.training for m in drops)
    assert model.execution.fast_dropout


def test_measured_plan_is_cached_and_printable(tmp_path, monkeypatch):
    """The probe runs once per CPU model and torch version; describe() gives each choice with its figures."""
    from bertkit.runtime import int8, probe
    monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path))
    monkeypatch.delenv("BERTKIT_FAST_PATHS", raising=False)
    runtime._measured_plan.cache_clear()                       # the process keeps its plan: measure afresh here
    calls = []
    fake = {"fast": 1.0, "plain": 2.0}
    slow = {"fast": 2.0, "plain": 1.0}
    na = {"fast": None, "plain": None, "why": "n/a"}
    monkeypatch.setattr(probe, "measure", lambda bf16: calls.append(bf16) or {
        "packed_linear_fp32": slow, "packed_linear_bf16": na, "int8_linear": {**fake, "engine": "onednn"}, "fast_dropout": fake,
        "explicit_train_attention": fake, "explicit_train_short": slow, "explicit_masked_inference": na,
        "cost_buckets": {**fake, "overhead": 3.0e5}})
    first = runtime.plan()
    second = runtime.plan()
    assert len(calls) == 1 and first == second
    assert first.options.fast_dropout and first.options.explicit_train_attention
    assert not first.options.explicit_train_short and not first.packed_dtypes and first.int8_engine == "onednn"
    assert first.bucket_overhead == 3.0e5 and first.int8_float_below == 0      # no short-input figures: int8
    model = runtime.apply(_tiny(), first)
    assert model.execution.bucket_overhead == 3.0e5 / model.config.hidden_size      # per model: row * length^2
    lines = runtime.describe(first)
    assert any(line.startswith("fast_dropout: on (1000.00 ms vs plain 2000.00 ms)") for line in lines)
    assert any(line.startswith("packed_linear_fp32: off") for line in lines)
    with pytest.raises(ConfigError, match="BERTKIT_FAST_PATHS"):
        monkeypatch.setenv("BERTKIT_FAST_PATHS", "fastest")
        runtime.plan()
    monkeypatch.delenv("BERTKIT_FAST_PATHS")
    # int8 that wins on batches but loses on one short sentence: int8 stays on, short inputs run the float GEMM
    for short, below in (({"short_fast": 2.0, "short_plain": 1.0}, 64), ({"short_fast": 1.0, "short_plain": 2.0}, 0)):
        runtime._measured_plan.cache_clear()
        monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path / str(below)))
        monkeypatch.setattr(probe, "measure", lambda bf16, short=short: {
            "packed_linear_fp32": slow, "packed_linear_bf16": na, "fast_dropout": fake,
            "int8_linear": {**fake, "engine": "fbgemm", **short}, "explicit_train_attention": fake,
            "explicit_train_short": slow, "explicit_masked_inference": na, "cost_buckets": {**fake, "overhead": 3.0e5}})
        got = runtime.plan()
        assert got.int8_engine == "fbgemm" and got.int8_float_below == below and not got.int8_under_bf16
        line = next(x for x in runtime.describe(got) if x.startswith("int8_linear: on"))
        assert ("under 64 rows the int8 layers run a float GEMM" in line) == bool(below), line
    # int8 against bf16 where the CPU has it: int8 beats fp32 but not bf16, so bf16 runs take the float GEMM
    for bf16, faster in ((0.5, True), (1.5, False)):
        runtime._measured_plan.cache_clear()
        monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path / f"bf16-{bf16}"))
        monkeypatch.setattr(probe, "measure", lambda native, bf16=bf16: {
            "packed_linear_fp32": slow, "packed_linear_bf16": fake, "fast_dropout": fake,
            "int8_linear": {"fast": 1.0, "plain": 3.0, "layer384_int8": 1.0, "layer384_bf16": bf16,
                            "engine": "onednn"},
            "explicit_train_attention": fake, "explicit_train_short": slow, "explicit_masked_inference": fake,
            "cost_buckets": {**fake, "overhead": 3.0e5}})
        got = runtime.plan()
        assert got.int8_engine == "onednn" and got.int8_under_bf16 == ((384, faster, 0),)
        line = next(x for x in runtime.describe(got) if x.startswith("int8_linear: on"))
        assert f"1000.00 ms vs fp32 3000.00 ms, onednn; one encoder layer of width 384 1000.00 ms vs bf16 " \
               f"{bf16 * 1e3:.2f} ms" in line, line
        assert ("under bf16 autocast the int8 layers run bf16" in line) == faster, line
    # int8 GEMMs with bf16 activations against bf16, per layer width: on every input where they won the batch, on
    # one sentence's rows where they won only there, nowhere where they lost both
    for kernel, short, below in ((0.4, 0.9, int8.BF16_KERNEL_ALWAYS), (2.0, 0.5, 64), (2.0, 2.0, 0)):
        runtime._measured_plan.cache_clear()
        monkeypatch.setenv("BERTKIT_CACHE", str(tmp_path / f"kernel-{kernel}-{short}"))
        monkeypatch.setattr(probe, "measure", lambda native, kernel=kernel, short=short: {
            "packed_linear_fp32": slow, "packed_linear_bf16": fake, "fast_dropout": fake,
            "int8_linear": {"fast": 1.0, "plain": 3.0, "layer384_int8": 1.0, "layer384_bf16": 0.5, "engine": "onednn",
                            "layer384_int8_bf16": 2.0, "layer384_short_bf16": 1.0, "layer384_short_int8_bf16": 2.0,
                            "layer768_int8": 1.0, "layer768_bf16": 0.5, "layer768_int8_bf16": kernel,
                            "layer768_short_bf16": 1.0, "layer768_short_int8_bf16": short},
            "explicit_train_attention": fake, "explicit_train_short": slow, "explicit_masked_inference": fake,
            "cost_buckets": {**fake, "overhead": 3.0e5}})
        got = runtime.plan()
        assert got.int8_under_bf16 == ((384, True, 0), (768, True, below)), kernel
        line = next(x for x in runtime.describe(got) if x.startswith("int8_linear: on"))
        assert f"width 768 1000.00 ms vs bf16 500.00 ms: under bf16 autocast the int8 layers run bf16; with bf16 " \
               f"activations {kernel * 1e3:.2f} ms vs bf16 500.00 ms" in line, line
    runtime._measured_plan.cache_clear()                       # later tests measure with the real probes


def test_frozen_fused_weights_follow_their_parts():
    """The fused Q/K/V weight derives from the three checkpoint tensors: after `.to()`, a pickle round trip or a
    load with assign=True, new weights reach the output."""
    import pickle
    ids, mask = _batch()
    other = _tiny().eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01 * torch.randn_like(p))
    for how in ("to", "pickle", "assign"):
        frozen = runtime.freeze(_tiny().eval(), runtime.plan(force="all"))
        with torch.no_grad():
            frozen(ids, None, mask)                                      # derived copies built
        if how == "to":
            frozen = frozen.to(torch.float64).to(torch.float32)
        elif how == "pickle":
            frozen = pickle.loads(pickle.dumps(frozen))
        state = {k: v.clone() for k, v in other.state_dict().items()}
        frozen.load_state_dict(state, assign=how == "assign")
        with torch.no_grad():
            diff = (frozen(ids, None, mask).last_hidden_state - other(ids, None, mask).last_hidden_state).abs().max()
        assert diff <= 1e-5, (how, diff)


def test_replaced_projection_is_the_one_that_runs():
    """Swapping attention.self.query (LoRA, quantisation) changes the output: the fused projection looks it up."""
    ids, mask = _batch()
    model = _tiny().eval()
    with torch.no_grad():
        before = model(ids, None, mask).last_hidden_state
        att = model.encoder.layer[0].attention.self
        zero = torch.nn.Linear(att.query.in_features, att.query.out_features)
        torch.nn.init.zeros_(zero.weight), torch.nn.init.zeros_(zero.bias)
        att.query = zero
        after = model(ids, None, mask).last_hidden_state
    assert (before - after).abs().max() > 1e-3


def test_probe_leaves_the_global_rng_alone(monkeypatch, tmp_path):
    from bertkit.runtime import probe
    def draws(bf16):
        torch.rand(100)                                          # a probe draws random inputs
        return {name: {"fast": None, "plain": None, "why": "x"} for name in probe.PROBES}

    monkeypatch.setattr(probe, "_measure", draws)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    probe.measure(False)
    assert torch.equal(torch.rand(3), expected)


def test_bad_cache_files_are_measured_again(tmp_path, monkeypatch):
    from bertkit.runtime import probe
    fresh = {name: {"fast": 1.0, "plain": 2.0} for name in probe.PROBES}
    monkeypatch.setattr(probe, "measure", lambda bf16: fresh)
    path = probe._cache_file(tmp_path)
    path.parent.mkdir(parents=True)
    for bad in ('{"schema": 1, "probes": {}}', '{"probes": []}', "{not json", '{"schema": %d, "cpu": "x"}' % probe.SCHEMA):
        path.write_text(bad)
        assert probe.cached_measurements(tmp_path, False) == fresh
    assert probe.cached_measurements(None, False) == fresh              # no cache directory at all


def test_timings_taken_under_load_are_taken_again_once_quieter(tmp_path, monkeypatch):
    """A plan measured while other work held every core (5x slower, and the int8 library 2x slower when quiet was
    picked) must not stay cached for good; one measured quiet, or under load that has not eased, is kept."""
    from bertkit.runtime import probe
    calls, load = [], [3.0]
    monkeypatch.setattr(probe, "load_per_cpu", lambda: load[0])
    monkeypatch.setattr(probe, "measure", lambda bf16: calls.append(load[0]) or
                        {name: {"fast": 1.0, "plain": 2.0} for name in probe.PROBES})
    for now in (3.0, 2.0, 1.2, 0.2, 0.2, 2.5):
        load[0] = now
        probe.cached_measurements(tmp_path, False)
    assert calls == [3.0, 1.2, 0.2]
    assert json.loads(probe._cache_file(tmp_path).read_text())["load"] == 0.2


def test_a_swamped_bucket_probe_gives_no_cost_model(monkeypatch):
    from bertkit.runtime import probe
    monkeypatch.setattr(probe, "_time", lambda fns, repeats=5: {k: 1.0 for k in fns})
    t = probe._probe_cost_buckets()
    assert t["fast"] is None and t["plain"] is None and "why" in t


def test_each_schema_keeps_its_own_cache_file(tmp_path, monkeypatch):
    """Two bertkit versions sharing a cache (different probe schemas) must not re-probe over each other's file on
    every run: a probe costs ~1 s of the first training step's time."""
    from bertkit.runtime import probe
    calls = []
    monkeypatch.setattr(probe, "load_per_cpu", lambda: 0.0)           # the real load must not re-probe here
    monkeypatch.setattr(probe, "measure", lambda bf16: calls.append(1) or
                        {name: {"fast": 1.0, "plain": 2.0} for name in probe.PROBES})
    for schema in (probe.SCHEMA, probe.SCHEMA + 1, probe.SCHEMA, probe.SCHEMA + 1):
        monkeypatch.setattr(probe, "SCHEMA", schema)
        probe.cached_measurements(tmp_path, False)
    assert len(calls) == 2 and len(list((tmp_path / "runtime").glob("*.json"))) == 2


def test_int8_encoder_probe_times_both_layers():
    """The int8 probe's encoder layer (int8 kernel vs bf16 autocast) runs on any CPU with an int8 kernel (bf16
    emulated where not native: only its result is then unused)."""
    from bertkit.runtime import int8, probe
    if not int8.int8_kernel_ok():
        pytest.skip("no int8 linear kernel in this PyTorch build")
    t = probe._probe_int8_encoder(int8.default_engine(), 96)
    kernel = {"int8_bf16", "short_bf16", "short_int8_bf16"} if int8.qlinear_bf16_ok() else set()
    assert set(t) == {"int8", "bf16"} | kernel and all(v > 0 for v in t.values())
