"""A bertkit model and tokenizer where transformers' training code expects its own: Trainer, the data collators,
overflowing windows, position_ids / inputs_embeds, save_pretrained's formats; and the runtime plan reaching a model
trained outside bertkit's loop."""

from __future__ import annotations

import json

import pytest
import torch

from bertkit import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel, runtime
from bertkit.attention import ExecutionOptions
from bertkit.errors import ConfigError
from bertkit.tokenizer import Tokenizer
from test_families import REFERENCED, TINY, _pair

transformers = pytest.importorskip("transformers")

WORDS = ("the a cat dog sat on mat ran fast slow big small red blue green house river tree stone bird fish who "
         "where when what is was are ##s ##ing ##ed ##ly , . ?").split()
TEXTS = ["the cat sat on the mat", "a dog ran fast", "big red dogs sat", "the small blue cats ran slowly .",
         "who sat on the green stone ?", "the bird was big", "fish are red", "where is the river house ?"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    cfg = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, num_labels=2,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)   # no dropout stream to differ
    torch.manual_seed(0)
    BertForMaskedLM(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def toks(model_dir):
    return Tokenizer.from_pretrained(model_dir), transformers.BertTokenizerFast.from_pretrained(model_dir)


def _equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])), k


# ---------------------------------------------------------------------------------------------- Trainer
def _trainer_losses(model, tok, head: str, out) -> list[float]:
    pytest.importorskip("accelerate")
    if head == "mlm":
        rows = [{k: v for k, v in tok(t).items()} for t in TEXTS]
        collator = transformers.DataCollatorForLanguageModeling(tok, mlm_probability=0.3)
    else:
        rows = [{**tok(t), "labels": int("?" in t)} for t in TEXTS]
        collator = transformers.DataCollatorWithPadding(tok)
    args = transformers.TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=20,
                                          learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True,
                                          save_strategy="no", seed=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, data_collator=collator)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("head", ["cls", "mlm"])
def test_trainer_losses_equal_transformers(model_dir, toks, tmp_path, head):
    ours_cls, ref_cls = {"cls": (BertForSequenceClassification, transformers.BertForSequenceClassification),
                         "mlm": (BertForMaskedLM, transformers.BertForMaskedLM)}[head]
    ours_cls.from_pretrained(model_dir).save_pretrained(tmp_path / "start")     # the head's new weights too
    ours = _trainer_losses(ours_cls.from_pretrained(tmp_path / "start"), toks[0], head, tmp_path / "ours")
    ref = _trainer_losses(ref_cls.from_pretrained(tmp_path / "start"), toks[1], head, tmp_path / "ref")
    assert len(ours) == len(ref) == 20
    assert max(abs(a - b) for a, b in zip(ours, ref)) <= 1e-4
    assert max(ref) - min(ref) > 1e-3                        # the updates moved the loss: they were compared too


# ---------------------------------------------------------------------------------------------- collators
def test_collators_give_transformers_batches(toks):
    ours, ref = toks
    feats = {name: [tok(t) for t in TEXTS] for name, tok in (("ours", ours), ("ref", ref))}
    padded = {n: transformers.DataCollatorWithPadding(t, pad_to_multiple_of=8)(
        [{**f, "label": i % 2} for i, f in enumerate(feats[n])]) for n, t in (("ours", ours), ("ref", ref))}
    _equal(padded["ours"], padded["ref"])
    tagged = {n: transformers.DataCollatorForTokenClassification(t)(
        [{**f, "labels": list(range(len(f["input_ids"])))} for f in feats[n]])
        for n, t in (("ours", ours), ("ref", ref))}
    _equal(tagged["ours"], tagged["ref"])
    for special in (False, True):                              # the mask read from the tokenizer, or given
        masked = {}
        for n, t in (("ours", ours), ("ref", ref)):
            rows = [t(x, return_special_tokens_mask=special) for x in TEXTS]
            torch.manual_seed(0)
            masked[n] = transformers.DataCollatorForLanguageModeling(t, mlm_probability=0.5)(rows)
        _equal(masked["ours"], masked["ref"])
        assert (masked["ours"]["labels"] != -100).any()


def test_left_padding_and_special_tokens_mask(toks):
    ours, ref = toks
    ours.padding_side = ref.padding_side = "left"
    try:
        a = ours(TEXTS[:3], TEXTS[3:6], padding=True)
        b = ref(TEXTS[:3], TEXTS[3:6], padding=True)
        assert a["input_ids"] == b["input_ids"] and a["attention_mask"] == b["attention_mask"]
        assert [a.word_ids(i) for i in range(3)] == [b.word_ids(i) for i in range(3)]
        assert [a.sequence_ids(i) for i in range(3)] == [b.sequence_ids(i) for i in range(3)]
    finally:
        ours.padding_side = ref.padding_side = "right"
    ids = ours("the cat", "a dog")["input_ids"]
    assert ours.get_special_tokens_mask(ids, already_has_special_tokens=True) == \
        ref.get_special_tokens_mask(ids, already_has_special_tokens=True)
    assert ours.get_special_tokens_mask([7, 8], [9]) == [1, 0, 0, 1, 0, 1]        # as the template lays them out


# ---------------------------------------------------------------------------------------------- overflow
CONTEXT = "the big red dog sat on the mat where the small cats ran fast . the bird was blue ."


@pytest.mark.parametrize("case", [
    dict(text=["who sat on the mat ?", "what is red ?"], text_pair=[CONTEXT, CONTEXT + " fish are green"],
         truncation="only_second", max_length=16, stride=4, padding="max_length"),
    dict(text=[CONTEXT, "a cat"], truncation=True, max_length=9, stride=2),
    dict(text=CONTEXT, text_pair=CONTEXT, truncation="longest_first", max_length=19, stride=1),   # both cut
])
def test_overflowing_windows_equal_transformers(toks, case):
    ours, ref = toks
    kw = dict(return_overflowing_tokens=True, return_offsets_mapping=True, **case)
    a, b = ours(**kw), ref(**kw)
    assert set(a) == set(b) and len(a["input_ids"]) > 2
    for k in b:
        assert [list(map(tuple, r)) if k == "offset_mapping" else r for r in a[k]] == \
            [list(map(tuple, r)) if k == "offset_mapping" else r for r in b[k]], k
    for i in range(len(b["input_ids"])):
        assert a.sequence_ids(i) == b.sequence_ids(i) and a.word_ids(i) == b.word_ids(i)
    t = ours(**{**kw, "return_tensors": "pt", "padding": "max_length"})
    assert t["overflow_to_sample_mapping"].tolist() == b["overflow_to_sample_mapping"]


def test_stride_must_leave_room(toks):
    with pytest.raises(ValueError, match="stride=8"):
        toks[0](CONTEXT, truncation=True, max_length=8, stride=8, return_overflowing_tokens=True)


# ---------------------------------------------------------------------------------------------- model inputs
@pytest.mark.parametrize("model_type", ["bert", *REFERENCED])
def test_position_ids_and_inputs_embeds_equal_transformers(tmp_path, model_type):
    cfg, ref, ours = _pair(tmp_path, model_type, "Model", TINY)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 100, (2, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    embeds = ours.get_input_embeddings()(ids)
    with torch.no_grad():
        got = ours(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
        want = ref(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
        assert (got - want)[mask.bool()].abs().max() < 1e-5
        if ours.embeddings.position_embeddings is None:        # rotary / relative only: refused, not ignored
            with pytest.raises(ConfigError, match="position_ids"):
                ours(ids, attention_mask=mask, position_ids=torch.arange(10)[None])
            return
        pos = torch.randint(0, 40, (2, 10), generator=g)
        got = ours(ids, attention_mask=mask, position_ids=pos).last_hidden_state
        want = ref(ids, attention_mask=mask, position_ids=pos).last_hidden_state
        assert (got - want)[mask.bool()].abs().max() < 1e-5


def test_head_forwards_take_encoder_inputs(model_dir):
    m = BertForSequenceClassification.from_pretrained(model_dir)
    ids = torch.tensor([[2, 7, 8, 3]])
    with torch.no_grad():
        plain = m(ids).logits
        assert torch.allclose(m(inputs_embeds=m.get_input_embeddings()(ids)).logits, plain, atol=1e-6)
        assert torch.allclose(m(ids, position_ids=torch.arange(4)[None]).logits, plain, atol=1e-6)
    with pytest.raises(ConfigError, match="head_mask is not supported"):
        m(ids, head_mask=torch.ones(2, 4))
    with pytest.raises(ConfigError, match="exactly one"):
        m(ids, inputs_embeds=m.get_input_embeddings()(ids))
    with pytest.raises(ConfigError, match="position_ids has shape"):
        m(ids, position_ids=torch.arange(5)[None])


# ---------------------------------------------------------------------------------------------- save formats
def test_save_pretrained_bin_and_shards_load_both_ways(model_dir, tmp_path):
    m = BertForMaskedLM.from_pretrained(model_dir)
    ids = torch.tensor([[2, 7, 8, 9, 3]])
    with torch.no_grad():
        want = m(ids).logits
    m.save_pretrained(tmp_path, safe_serialization=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "pytorch_model.bin"]
    sd = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    m.save_pretrained(tmp_path, max_shard_size="20KB")        # the .bin goes: it would no longer be what loads
    names = sorted(p.name for p in tmp_path.iterdir())
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) > 2 and "pytorch_model.bin" not in names and "model.safetensors" not in names
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == shards
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in sd.values())
    for cls in (BertForMaskedLM, transformers.BertForMaskedLM):
        with torch.no_grad():
            assert torch.allclose(cls.from_pretrained(tmp_path).eval()(ids).logits, want, atol=1e-5)
    m.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    with pytest.raises(ConfigError, match="max_shard_size='big'"):
        m.save_pretrained(tmp_path, max_shard_size="big")


# ---------------------------------------------------------------------------------------------- the runtime plan
def test_train_mode_gets_the_runtime_plan_once(monkeypatch):
    monkeypatch.setenv("BERTKIT_FAST_PATHS", "all")
    m = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, intermediate_size=64))
    assert m.bert.execution == ExecutionOptions() and not m.runtime_planned
    m.eval()                                                    # inference mode: nothing applied
    assert m.bert.execution == ExecutionOptions()
    m.gradient_checkpointing_enable()
    m.train()
    want = runtime.plan("cpu", force="all").options
    assert m.bert.execution.fast_dropout and m.bert.execution.explicit_train_attention
    assert m.bert.execution.with_(bucket_overhead=None, checkpoint_layers=False) == \
        want.with_(bucket_overhead=None)
    assert m.bert.execution.checkpoint_layers                   # the caller's choice stays
    assert isinstance(m.dropout, runtime.FastDropout)
    m.bert.execution = ExecutionOptions()                       # chosen by hand after the first train(): kept
    m.train()
    assert m.bert.execution == ExecutionOptions()


def test_options_set_by_hand_are_kept_by_train(monkeypatch):
    monkeypatch.setenv("BERTKIT_FAST_PATHS", "all")
    m = BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                             intermediate_size=64))
    m.execution = ExecutionOptions(explicit_train_short=True)
    m.train()
    assert m.execution == ExecutionOptions(explicit_train_short=True) and m.runtime_planned
