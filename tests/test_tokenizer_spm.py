"""A SentencePiece `.model` file alone in a directory (older XLM-R, ALBERT, DeBERTa-v2/v3 uploads), read by bertkit's
own protobuf reader into a `tokenizers` pipeline: ids equal the sentencepiece library's own encoder (the oracle) on
a fuzz corpus and text in seven scripts, for Unigram and BPE models that sentencepiece's trainer builds here, with
each family's vocabulary layout and special tokens around them."""

from __future__ import annotations

import io
import json
import unicodedata

import pytest

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

from bertkit.errors import VocabError  # noqa: E402
from bertkit.tokenizer import LibraryTokenizer, Tokenizer  # noqa: E402
from test_tokenizer_json import REAL, TRAIN, fuzz_corpus  # noqa: E402

# family -> (file name, sentencepiece trainer options, ids in front of spm's own)
FAMILIES = {
    "xlm-roberta": ("sentencepiece.bpe.model", {}, 1),
    "albert": ("spiece.model", dict(user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], pad_id=0, unk_id=1,
                                    bos_id=-1, eos_id=-1), 0),
    "deberta-v2": ("spm.model", dict(user_defined_symbols=["[CLS]", "[SEP]"], pad_id=0, unk_id=3, bos_id=-1,
                                     eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]"), 0),
}
SPECIAL_SPELLINGS = ("<s>", "</s>", "<mask>", "[CLS]", "[SEP]", "[MASK]")


def _grapheme_safe(text: str) -> bool:
    """No mark or joiner right after a character that is not a letter or digit: there the library's Precompiled
    normalizer maps the whole grapheme by its first character and drops the mark, where sentencepiece keeps it."""
    return not any((unicodedata.category(b).startswith("M") or b in "\u200c\u200d") and not a.isalnum()
                   for a, b in zip(text, text[1:]))


TEXTS = [t for t in fuzz_corpus(400, 7) + REAL + ["  lead", "trail  ", "a\nb", "\tx\t", "▁x", "a  ▁  b", "x\u3000y",
                                                 "ＡＢＣ１２３ ﬁ", "café naïve", ""]
         if not any(s in t for s in SPECIAL_SPELLINGS)]


@pytest.fixture(scope="module", params=[("xlm-roberta", "unigram"), ("xlm-roberta", "bpe"), ("albert", "unigram"),
                                        ("deberta-v2", "unigram")], ids=lambda p: "-".join(p))
def spm_dir(request, tmp_path_factory):
    family, kind = request.param
    name, options, _ = FAMILIES[family]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TRAIN), model_writer=buf, vocab_size=300, model_type=kind,
                                   character_coverage=0.9995, hard_vocab_limit=False, minloglevel=2, **options)
    root = tmp_path_factory.mktemp(f"{family}-{kind}")
    (root / name).write_bytes(buf.getvalue())
    (root / "config.json").write_text(json.dumps({"model_type": family}))
    # ALBERT's tokenizer lowercases and strips accents by default; compared with the raw encoder, they are off
    if family == "albert":
        (root / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "keep_accents": True}))
    return family, root, spm.SentencePieceProcessor(model_proto=buf.getvalue())


def _spm_ids(family: str, sp, text: str, unk_id: int) -> list[int]:
    shift = FAMILIES[family][2]
    return [unk_id if i == sp.unk_id() else i + shift for i in sp.encode(text)]


def test_ids_equal_the_sentencepiece_encoder(spm_dir):
    family, root, sp = spm_dir
    ours = Tokenizer.from_pretrained(root)
    assert isinstance(ours, LibraryTokenizer)
    texts = [t for t in TEXTS if _grapheme_safe(t)]
    assert len(texts) > 200
    got = ours(texts, add_special_tokens=False)["input_ids"]
    wrong = [t for t, g in zip(texts, got) if g != _spm_ids(family, sp, t, ours.unk_token_id)]
    assert wrong == [], (len(wrong), wrong[:3])
    assert [ours.convert_ids_to_tokens(g) for g in got[-12:]] == \
        [[sp.id_to_piece(i) if i != sp.unk_id() else ours.unk_token for i in sp.encode(t)] for t in texts[-12:]]


def test_the_familys_layout_and_special_tokens(spm_dir):
    family, root, sp = spm_dir
    ours = Tokenizer.from_pretrained(root)
    cls, sep, mask = ("<s>", "</s>", "<mask>") if family == "xlm-roberta" else ("[CLS]", "[SEP]", "[MASK]")
    assert (ours.cls_token, ours.sep_token, ours.mask_token) == (cls, sep, mask)
    a, b = _spm_ids(family, sp, REAL[0], ours.unk_token_id), _spm_ids(family, sp, REAL[2], ours.unk_token_id)
    enc = ours(REAL[0], REAL[2], return_special_tokens_mask=True, return_token_type_ids=True)
    c, s = ours.cls_token_id, ours.sep_token_id
    between = [s, s] if family == "xlm-roberta" else [s]
    assert enc["input_ids"] == [c, *a, *between, *b, s]
    assert enc["special_tokens_mask"] == [1] + [0] * len(a) + [1] * len(between) + [0] * len(b) + [1]
    second = 0 if family == "xlm-roberta" else 1
    assert enc["token_type_ids"] == [0] * (len(a) + 1 + len(between)) + [second] * (len(b) + 1)
    if family == "xlm-roberta":     # fairseq's layout: <s> <pad> </s> <unk> first, <mask> last
        assert [ours.convert_tokens_to_ids(t) for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
        assert ours.mask_token_id == len(ours) - 1 == sp.get_piece_size() + 1
    assert ours(f"x {mask} y", add_special_tokens=False)["input_ids"].count(ours.mask_token_id) == 1


def test_saved_directory_loads_in_transformers_with_equal_ids(spm_dir, tmp_path):
    family, root, _ = spm_dir
    ours = Tokenizer.from_pretrained(root)
    ours.save_pretrained(tmp_path)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    texts = REAL + [t for t in TEXTS[:60] if _grapheme_safe(t)]
    assert ref(texts, texts[::-1])["input_ids"] == ours(texts, texts[::-1])["input_ids"]


def _write_model(root, family: str) -> None:
    """A small Unigram model of the family's layout, under its usual file name."""
    name, options, _ = FAMILIES[family]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TRAIN), model_writer=buf, vocab_size=300,
                                   hard_vocab_limit=False, minloglevel=2, **options)
    (root / name).write_bytes(buf.getvalue())


def test_albert_lowercases_and_strips_accents_by_default(tmp_path):
    _write_model(tmp_path, "albert")
    ours = Tokenizer.from_pretrained(tmp_path)      # no config.json: the file's name names the family
    assert ours.tokenize("Résumé ``Zoë''") == ours.tokenize('resume "zoe"')
    assert ours.cls_token == "[CLS]"


@pytest.mark.parametrize("family", ["albert", "deberta-v2"])
@pytest.mark.parametrize("lower", [None, True, False], ids=["default", "lower", "cased"])
def test_do_lower_case_as_transformers_reads_it(tmp_path, family, lower):
    _write_model(tmp_path, family)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": family}))
    if lower is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
    ours, ref = Tokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    texts = REAL + ["Hello WORLD", "ÀÉÎ Ωμέγα ΣΊΣΥΦΟΣ", "MiXeD CaSe 42"]
    assert ours(texts)["input_ids"] == ref(texts)["input_ids"]
    assert (ours.tokenize("WORLD") == ours.tokenize("world")) == ref.do_lower_case


def test_do_lower_case_that_is_not_a_bool_is_one_line(tmp_path):
    _write_model(tmp_path, "deberta-v2")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": "maybe"}))
    with pytest.raises(VocabError, match=r"tokenizer_config\.json: do_lower_case must be true or false, got 'maybe'"):
        Tokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize("data, reason", [(b"", "not a Unigram or BPE SentencePiece model"),
                                          (b"\x0a\xff", "not a SentencePiece model file"),
                                          (b"\x0f", "not a SentencePiece model file")])
def test_a_broken_model_file_is_one_line_naming_it(tmp_path, data, reason):
    (tmp_path / "spiece.model").write_bytes(data)
    with pytest.raises(VocabError, match=rf"spiece\.model: {reason}"):
        Tokenizer.from_pretrained(tmp_path)
