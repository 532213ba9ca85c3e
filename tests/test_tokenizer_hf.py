"""Tokenizer <-> the Hugging Face ecosystem: directories transformers / tokenizers write load in bertkit and the other
way round (ids equal), settings bertkit cannot honour are errors, and transformers' call habits work."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from bertkit.errors import VocabError  # noqa: E402
from bertkit.tokenizer.hfjson import is_bert_pipeline, read_tokenizer_json  # noqa: E402
from bertkit.tokenizer import SPECIAL_TOKENS, Tokenizer  # noqa: E402

WORDS = ["hello", "world", "un", "##aff", "##able", "cafe", "café", "Cafe", "naive", "naïve", "中", "国", "the",
         "The", "##s", "a", "##b", "long", "##er", "!", ",", ".", "?", "'", "-", "(", ")", "é", "e", "##é"]
TRICKY = ["Hello, World!", "unaffable café naïve", "Café NAÏVE résumé", "中国 the 中国人", "the [MASK] is here",
          "x" * 150, "longerlonger" * 3, "a.b,c!d?(e)-f'g", "  spaces\tand\nnewlines  ", "", "[MASK][SEP]a",
          "Ångström ﬁne", "The\u0301 cafe\u0301"]
PAIRS = [("Hello, World!", "the café"), ("中国", "a" * 120), ("", "world")]


def hf_dir(tmp_path, **kwargs):
    """A directory saved by transformers 5 from a small vocab (it writes tokenizer.json + tokenizer_config.json)."""
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *WORDS])}
    ref = transformers.BertTokenizerFast(vocab=vocab, **kwargs)
    out = tmp_path / "hf"
    ref.save_pretrained(str(out))
    return ref, out


def ids_equal(ours: Tokenizer, ref) -> None:
    for text in TRICKY:
        assert ours(text)["input_ids"] == ref(text)["input_ids"], text
    for a, b in PAIRS:
        assert ours(a, b)["input_ids"] == ref(a, b)["input_ids"], (a, b)
        assert ours(a, b)["token_type_ids"] == ref(a, b)["token_type_ids"], (a, b)


@pytest.mark.parametrize("kwargs", [{}, {"do_lower_case": False}, {"strip_accents": False},
                                    {"do_lower_case": False, "strip_accents": True}],
                         ids=["uncased", "cased", "lower-keep-accents", "cased-strip-accents"])
def test_transformers_dir_roundtrip(tmp_path, kwargs):
    ref, out = hf_dir(tmp_path, **kwargs)
    assert not (out / "vocab.txt").exists()
    ours = Tokenizer.from_pretrained(out)
    ids_equal(ours, ref)
    saved = tmp_path / "bk"
    files = ours.save_pretrained(saved)
    assert {os.path.basename(f) for f in files} == {"vocab.txt", "tokenizer.json", "tokenizer_config.json"}
    assert "model_max_length" in json.loads((saved / "tokenizer_config.json").read_text())
    ids_equal(ours, transformers.AutoTokenizer.from_pretrained(str(saved)))
    raw = tokenizers.Tokenizer.from_file(str(saved / "tokenizer.json"))
    for text in TRICKY:
        assert raw.encode(text).ids == ours(text)["input_ids"], text
    # bertkit reads its own tokenizer.json alone just as well
    (saved / "vocab.txt").unlink()
    ids_equal(Tokenizer.from_pretrained(saved), ref)


def test_config_overrides_tokenizer_json(tmp_path):
    """transformers lets tokenizer_config.json's do_lower_case win over tokenizer.json's normalizer; so does bertkit."""
    _, out = hf_dir(tmp_path)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.update(do_lower_case=False, model_max_length=7)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours, ref = Tokenizer.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(str(out))
    assert ours.lowercase is False and ours.model_max_length == 7
    ids_equal(ours, ref)


def test_bert_processing_and_sequence_normalizer(tmp_path):
    _, out = hf_dir(tmp_path)
    spec = json.loads((out / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Sequence", "normalizers": [spec["normalizer"]]}
    spec["post_processor"] = {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}
    (out / "tokenizer.json").write_text(json.dumps(spec))
    ids_equal(Tokenizer.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(str(out)))


@pytest.mark.parametrize("edit, field", [
    (lambda s: s["model"].update(type="BPE"), "model.type"),
    (lambda s: s["model"].update(continuing_subword_prefix="@@"), "model.continuing_subword_prefix"),
    (lambda s: s["model"].update(max_input_chars_per_word=50), "model.max_input_chars_per_word"),
    (lambda s: s.update(normalizer={"type": "NFKC"}), "normalizer"),
    (lambda s: s["normalizer"].update(handle_chinese_chars=False), "normalizer.handle_chinese_chars"),
    (lambda s: s.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer"),
    (lambda s: s.update(post_processor=None), "post_processor"),
    (lambda s: s["added_tokens"].append({"id": 40, "content": "<new>", "special": True}), "added_tokens[5]"),
    (lambda s: s["model"]["vocab"].pop("[MASK]"), "model.vocab"),
])
def test_other_tokenizer_json_goes_to_the_library(tmp_path, edit, field):
    """Not BERT's pipeline: the check names the file and field, and the directory loads as transformers loads it
    (through the tokenizers library), or fails in one line where transformers fails too."""
    _, out = hf_dir(tmp_path)
    spec = json.loads((out / "tokenizer.json").read_text())
    edit(spec)
    (out / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(VocabError, match=r"tokenizer\.json: " + field.replace(".", r"\.").replace("[", r"\[")):
        read_tokenizer_json(out / "tokenizer.json")
    assert not is_bert_pipeline(out)
    try:
        ref = _as_file_says(out)
    except Exception:
        with pytest.raises(VocabError, match=r"tokenizer\.json: the tokenizers library cannot read it"):
            Tokenizer.from_pretrained(out)
        return
    _same_ids(Tokenizer.from_pretrained(out), ref)


@pytest.mark.parametrize("name, field, value", [
    ("tokenizer_config.json", "tokenize_chinese_chars", False),
    ("tokenizer_config.json", "mask_token", "<mask>"),
    ("special_tokens_map.json", "unk_token", {"content": "<unk>"}),
    ("special_tokens_map.json", "additional_special_tokens", ["<extra>"]),
])
def test_other_special_tokens_go_to_the_library(tmp_path, name, field, value):
    _, out = hf_dir(tmp_path)
    path = out / name
    cfg = json.loads(path.read_text()) if path.exists() else {}
    cfg[field] = value
    path.write_text(json.dumps(cfg))
    assert not is_bert_pipeline(out)
    ref = _as_file_says(out)
    _same_ids(Tokenizer.from_pretrained(out), ref)


def _same_ids(ours, ref) -> None:
    for a, b in [(t, None) for t in TRICKY] + PAIRS:
        got, want = ours(a, b), ref(a, b, return_token_type_ids=True)
        assert (got["input_ids"], got["token_type_ids"]) == (want["input_ids"], want["token_type_ids"]), (a, b)


def _as_file_says(out):
    """transformers' reading of the directory's tokenizer.json itself (its BertTokenizer class would rebuild BERT's
    pipeline from vocab.txt instead)."""
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return transformers.AutoTokenizer.from_pretrained(str(out))


def test_from_pretrained_paths_and_repo_ids(tmp_path, monkeypatch, bert_vocab_file):
    assert Tokenizer.from_pretrained(bert_vocab_file).vocab_file == str(bert_vocab_file)
    with pytest.raises(VocabError, match="no vocab.txt and no tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(VocabError, match="not found"):
        Tokenizer.from_pretrained(tmp_path / "missing" / "vocab.txt")
    # a repo id goes through the hub cache
    _, out = hf_dir(tmp_path)
    snap = tmp_path / "cache" / "models--org--tiny" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    for f in out.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (snap / "config.json").write_text("{}")
    (tmp_path / "cache" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "cache" / "models--org--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert Tokenizer.from_pretrained("org/tiny").vocab_size == len(SPECIAL_TOKENS) + len(WORDS)


# ---------------------------------------------------------------------------------------------------- call habits

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    ref, out = hf_dir(tmp_path_factory.mktemp("habits"))
    return Tokenizer.from_pretrained(out), ref


def as_lists(enc) -> dict:
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in enc.items()}


@pytest.mark.parametrize("kwargs", [
    dict(text="Hello, World! café", text_pair="the 中国", return_offsets_mapping=True),
    dict(text=TRICKY, padding=True, return_offsets_mapping=True),
    dict(text=TRICKY, padding="longest", truncation=True, max_length=6),
    dict(text=TRICKY[:4], text_pair=TRICKY[4:8], padding="max_length", truncation="only_second", max_length=24),
    dict(text=TRICKY[:3], text_pair=TRICKY[3:6], truncation="longest_first", max_length=7, padding=True),
    dict(text=["Hello, World!", "a"], add_special_tokens=False, padding=True),
    dict(text="hello", text_pair="world", add_special_tokens=False, max_length=1, truncation=True),
    dict(text=TRICKY[:3], padding=True, return_attention_mask=False, return_token_type_ids=False),
    dict(text=[["Hello,", "World"], ["café", "x" * 120]], is_split_into_words=True, return_offsets_mapping=True,
         padding=True),
    dict(text=["Hello,", "World"], text_pair=["the", "中国"], is_split_into_words=True),
    dict(text=TRICKY[:5], padding=True, return_tensors="pt"),
    dict(text=TRICKY[:5], text_pair=TRICKY[5:10], padding=True, return_tensors="np", truncation=True, max_length=9),
])
def test_call_like_transformers(pair, kwargs):
    ours, ref = pair
    a, b = ours(**kwargs), ref(**kwargs)
    assert as_lists(a) == as_lists(b)
    assert a.input_ids is a["input_ids"]
    rows = as_lists(a)["input_ids"]
    for i in range(len(rows) if rows and isinstance(rows[0], list) else 1):
        assert a.word_ids(i) == b.word_ids(i), i


def test_bertkit_names_still_work(pair):
    ours, ref = pair
    enc = ours(TRICKY[:3], pairs=TRICKY[3:6], return_offsets=True, padding=True)
    theirs = ref(TRICKY[:3], TRICKY[3:6], return_offsets_mapping=True, padding=True)
    assert enc["offsets"] == [[tuple(o) for o in row] for row in theirs["offset_mapping"]]
    assert "offset_mapping" not in enc and type(enc).__name__ == "BatchEncoding"
    with pytest.raises(TypeError, match="unexpected keyword argument 'return_lengths'"):
        ours("a", return_lengths=True)


def test_to_decode_pad_and_ids(pair):
    torch = pytest.importorskip("torch")
    ours, ref = pair
    enc = ours(TRICKY[:4], padding=True, return_tensors="pt").to("cpu")
    assert enc.input_ids.device == torch.device("cpu")
    rows = ref(TRICKY[:4], padding=True)["input_ids"]
    for skip in (True, False):
        assert ours.batch_decode(enc.input_ids, skip_special_tokens=skip) == ref.batch_decode(
            rows, skip_special_tokens=skip)
        assert ours.decode(rows[0], skip_special_tokens=skip) == ref.decode(rows[0], skip_special_tokens=skip)
    singles = [ours(t) for t in TRICKY[:4]]
    theirs = [ref(t) for t in TRICKY[:4]]
    for kwargs in (dict(), dict(padding="max_length", max_length=40), dict(pad_to_multiple_of=8)):
        assert as_lists(ours.pad(singles, **kwargs)) == as_lists(ref.pad(theirs, **kwargs))
    assert as_lists(ours.pad(singles, return_tensors="pt")) == as_lists(ref.pad(theirs, return_tensors="pt"))
    no_types = [{"input_ids": s["input_ids"]} for s in singles]
    assert as_lists(ours.pad(no_types)) == as_lists(ref.pad([{"input_ids": s["input_ids"]} for s in theirs]))
    assert ours.convert_tokens_to_ids(["hello", "zzz"]) == ref.convert_tokens_to_ids(["hello", "zzz"])
    assert ours.convert_ids_to_tokens([5, 6]) == ref.convert_ids_to_tokens([5, 6])
    assert len(ours) == len(ref)


def test_batch_encoding_pickles_as_data(pair):
    import pickle
    ours, _ = pair
    enc = pickle.loads(pickle.dumps(ours(TRICKY[:2], padding=True)))
    assert type(enc).__name__ == "BatchEncoding" and enc.input_ids == ours(TRICKY[:2], padding=True)["input_ids"]
    assert len(pickle.dumps(enc)) < 2000


FULL = dict(return_offsets_mapping=True, return_special_tokens_mask=True, return_token_type_ids=True)


def assert_same_sides(ours, ref, texts, pairs, **options) -> None:
    """ids, types, masks, offsets and word ids equal transformers' with the directory's padding / truncation side."""
    a, b = ours(texts, pairs, **FULL, **options), ref(texts, pairs, **FULL, **options)
    for k in ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "offset_mapping"):
        assert [list(map(tuple, r)) if k == "offset_mapping" else r for r in a[k]] == \
            [list(map(tuple, r)) if k == "offset_mapping" else r for r in b[k]], (k, options)
    for i in range(len(texts)):
        assert a.word_ids(i) == b.word_ids(i), (i, options)
        assert a.sequence_ids(i) == b.sequence_ids(i), (i, options)


@pytest.mark.parametrize("padding_side, truncation_side", [("left", "left"), ("right", "left"), ("left", "right")])
def test_padding_and_truncation_side_from_tokenizer_config(tmp_path, padding_side, truncation_side):
    ref, out = hf_dir(tmp_path)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.update(padding_side=padding_side, truncation_side=truncation_side)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours, ref = Tokenizer.from_pretrained(out), transformers.AutoTokenizer.from_pretrained(str(out))
    assert (ours.padding_side, ours.truncation_side) == (ref.padding_side, ref.truncation_side)
    texts, pairs = TRICKY, [p[1] for p in PAIRS] * 5
    assert_same_sides(ours, ref, texts[:8], pairs[:8], truncation="longest_first", max_length=11, padding=True)
    long, short = ["unaffable café naïve, the longer world!", "中国 the 中国人 hello world"], ["the", "a b"]
    assert_same_sides(ours, ref, long, short, truncation="only_first", max_length=9, padding=True)
    assert_same_sides(ours, ref, short, long, truncation="only_second", max_length=9, padding=True)
    assert_same_sides(ours, ref, texts, None, truncation=True, max_length=6, padding="max_length")
    words = [t.split() or ["x"] for t in TRICKY]
    assert_same_sides(ours, ref, words, None, is_split_into_words=True, truncation=True, max_length=5, padding=True)
    saved = ours.save_pretrained(tmp_path / "bk")      # the sides travel with the directory
    again = Tokenizer.from_pretrained(tmp_path / "bk")
    assert (again.padding_side, again.truncation_side) == (padding_side, truncation_side) and saved


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_calls_padding_side_wins_over_the_tokenizers(tmp_path, side):
    """padding_side= on the call (and on pad) as transformers takes it: that call pads there, word ids follow."""
    ref, out = hf_dir(tmp_path)
    ours = Tokenizer.from_pretrained(out)
    ours.padding_side = ref.padding_side = "left" if side == "right" else "right"
    texts, pairs = TRICKY[:6], ([p[1] for p in PAIRS] * 2)[:6]
    a, b = ours(texts, pairs, padding=True, padding_side=side), ref(texts, pairs, padding=True, padding_side=side)
    assert (a["input_ids"], a["attention_mask"]) == (b["input_ids"], b["attention_mask"])
    assert [a.word_ids(i) for i in range(6)] == [b.word_ids(i) for i in range(6)]
    singles = [ours(t) for t in texts]
    assert ours.pad(singles, padding_side=side)["input_ids"] == ref.pad([ref(t) for t in texts],
                                                                        padding_side=side)["input_ids"]


def test_inference_pads_on_the_right_whatever_the_tokenizers_side(tmp_path):
    """The heads read [CLS] at position 0: a tokenizer that pads on the left (tokenizer_config.json) must not move
    it in bertkit's own batches."""
    import torch

    from bertkit.heads import BertForSequenceClassification
    from bertkit.predict.engine import encode, forward
    _, out = hf_dir(tmp_path)
    tok = Tokenizer.from_pretrained(out)
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64, num_labels=3)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(cfg).save_pretrained(tmp_path / "clf")
    model = BertForSequenceClassification.from_pretrained(tmp_path / "clf")
    texts = ["a dog", "the unaffable man is eating food in paris"]
    logits = {}
    for side in ("right", "left"):
        tok.padding_side = side
        logits[side] = forward(model, encode(tok, texts)).logits
    torch.testing.assert_close(logits["left"], logits["right"], atol=0, rtol=0)


def test_a_bad_side_in_tokenizer_config_is_one_line(tmp_path):
    _, out = hf_dir(tmp_path)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**cfg, "truncation_side": "middle"}))
    with pytest.raises(VocabError, match=r'tokenizer_config\.json: truncation_side must be "right" or "left", '
                                         r'got "middle"'):
        Tokenizer.from_pretrained(out)
