"""tokenizer.json files of every family (byte-level BPE, Unigram / Metaspace, WordPiece with other specials), read by
LibraryTokenizer: ids, offsets, special-token masks, token types and word ids equal transformers' fast tokenizer on
the same directory, with pairs, every truncation strategy and padding, on a fuzz corpus and real text in six
scripts; saved directories load back in transformers identically."""

from __future__ import annotations

import json
import os
import pickle
import random

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from bertkit.errors import BertkitError, VocabError  # noqa: E402
from bertkit.tokenizer import Tokenizer  # noqa: E402
from bertkit.tokenizer.library import LibraryTokenizer  # noqa: E402
from bertkit.vocab import train_library_vocab  # noqa: E402

REAL = [
    "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it?",
    "Résumé of the naïve café owner: Zoë's crème brûlée won't last.",
    "Москва — столица России. Съешь же ещё этих мягких французских булок!",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο. Καλημέρα σας!",
    "اللغة العربية هي إحدى أكثر اللغات انتشاراً في العالم. مرحبا بكم!",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "हिन्दी भारत की राजभाषा है। नमस्ते, आप कैसे हैं?",
    "Ελληνικά and English mixed with русский текст, 中文 and عربى in one line.",
]


def fuzz_corpus(n: int = 160, seed: int = 0) -> list[str]:
    """Random Unicode: whitespace runs, accents and combining marks, CJK, emoji, controls, specials in the text."""
    rng = random.Random(seed)
    pools = ["abcdefghij KLMNOP", "  \t\n\u3000\u00a0", "éèêëñçÅøß\u0301\u0308", "日本語中文한국어", "😀🎉👍🏽🇫🇷",
             "\x00\x07\x1b\u200b\u200d\ufeff", ".,;:!?'\"()[]-", "Ωψжщعربهिन्दी", "<s></s><mask>[CLS][SEP]"]
    out = []
    for _ in range(n):
        k = rng.randint(0, 40)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(k)))
    return out + ["", " ", "   a   ", "<mask>", "a <mask> b", "\u0301x"]


TRAIN = REAL * 30 + fuzz_corpus(300, 1)


def _metaspace_unigram(template: tuple[str, str], specials: list[str], lowercase: bool = False):
    tok = tokenizers.Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), *([normalizers.Lowercase()] if lowercase else [])])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.decoder = decoders.Metaspace(prepend_scheme="always")
    tok.train_from_iterator(TRAIN, trainers.UnigramTrainer(vocab_size=400, special_tokens=specials,
                                                           unk_token=specials[specials.index("[UNK]") if "[UNK]"
                                                                              in specials else 3]))
    tok.post_processor = processors.TemplateProcessing(
        single=template[0], pair=template[1], special_tokens=[(t, tok.token_to_id(t)) for t in specials[:4]])
    return tok


def _wordpiece_mpnet():
    tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(TRAIN, trainers.WordPieceTrainer(vocab_size=500,
                                                             special_tokens=["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def _byte_level_bert_template():
    """ModernBERT's shape: byte-level BPE with [CLS] A [SEP] (B [SEP]), all types 0."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "[CLS]", "[SEP]",
                                                                                       "[PAD]", "[MASK]"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    return tok


def _write(directory, tok, config: dict):
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                 "model_max_length": 64, **config}))
    return directory


ROBERTA_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
                    "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>"}
BERT_SPECIALS = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                 "mask_token": "[MASK]"}


@pytest.fixture(scope="module", params=["roberta_bpe", "xlmr_unigram", "deberta_unigram", "mpnet_wordpiece",
                                        "modernbert_bpe"])
def family_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "roberta_bpe":
        train_library_vocab(TRAIN, "bpe", vocab_size=700, min_frequency=1).save_pretrained(root)
    elif request.param == "xlmr_unigram":
        train_library_vocab(TRAIN, "unigram", vocab_size=500).save_pretrained(root)
    elif request.param == "deberta_unigram":
        tok = _metaspace_unigram(("[CLS] $A [SEP]", "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1"),
                                 ["[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"], lowercase=False)
        _write(root, tok, BERT_SPECIALS)
    elif request.param == "mpnet_wordpiece":
        _write(root, _wordpiece_mpnet(), {**ROBERTA_SPECIALS, "unk_token": "[UNK]", "do_lower_case": True})
    else:
        _write(root, _byte_level_bert_template(), BERT_SPECIALS)
    return root


def _pair(family_dir):
    ours = Tokenizer.from_pretrained(family_dir)
    assert isinstance(ours, LibraryTokenizer)
    return ours, transformers.AutoTokenizer.from_pretrained(str(family_dir))


KEYS = ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "offset_mapping")
FULL = dict(return_offsets_mapping=True, return_special_tokens_mask=True, return_token_type_ids=True)


def assert_same(ours, ref, texts, pairs=None, **options):
    a, b = ours(texts, pairs, **FULL, **options), ref(texts, pairs, **FULL, **options)
    for k in KEYS:
        got = [list(map(tuple, r)) for r in a[k]] if k == "offset_mapping" else a[k]
        want = [list(map(tuple, r)) for r in b[k]] if k == "offset_mapping" else b[k]
        assert got == want, (k, options)
    for i in range(len(texts)):
        assert a.word_ids(i) == b.word_ids(i), (i, options)


def test_fuzz_and_real_text_equal_transformers(family_dir):
    ours, ref = _pair(family_dir)
    texts = fuzz_corpus() + REAL
    assert_same(ours, ref, texts)
    assert_same(ours, ref, texts, texts[::-1])
    for t in REAL + texts[:40]:
        assert ours.tokenize(t) == ref.tokenize(t), t
        ids = ours(t)["input_ids"]
        assert ours.decode(ids) == ref.decode(ids) and ours.decode(ids, True) == ref.decode(ids, True)
        assert ours.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second", True])
@pytest.mark.parametrize("max_length", [7, 12, 24])
def test_truncation_and_padding_equal_transformers(family_dir, strategy, max_length):
    ours, ref = _pair(family_dir)
    texts, pairs = REAL[:5], REAL[3:8]
    for padding in (False, True, "max_length"):
        try:
            expected = ref(texts, pairs, truncation=strategy, max_length=max_length, padding=padding, **FULL)
        except Exception:
            with pytest.raises(BertkitError):
                ours(texts, pairs, truncation=strategy, max_length=max_length, padding=padding)
            continue
        assert_same(ours, ref, texts, pairs, truncation=strategy, max_length=max_length, padding=padding)
        assert expected["input_ids"] == ours(texts, pairs, truncation=strategy, max_length=max_length,
                                             padding=padding)["input_ids"]
    if strategy != "only_second":
        assert_same(ours, ref, texts, truncation=strategy, max_length=max_length, padding=True)
    assert_same(ours, ref, texts, pairs, padding=True, pad_to_multiple_of=8)


def test_layout_follows_the_post_processor(family_dir):
    ours, _ = _pair(family_dir)
    enc = ours("a b", "c d")
    kind = family_dir.name.rstrip("0123456789")
    first, *_, last = enc["input_ids"]
    assert first == ours.cls_token_id and last == ours.sep_token_id
    if kind in ("roberta_bpe", "xlmr_unigram", "mpnet_wordpiece"):       # <s> A </s></s> B </s>, types 0
        assert enc["input_ids"].count(ours.sep_token_id) == 3 and set(enc["token_type_ids"]) == {0}
        assert ours.bos_token_id == ours.cls_token_id and ours.eos_token_id == ours.sep_token_id
    elif kind == "deberta_unigram":                                      # [CLS] A [SEP] B [SEP], types 0/1
        assert enc["input_ids"].count(ours.sep_token_id) == 2 and enc["token_type_ids"][-1] == 1
    rows = ours.build_inputs([ours.encode_pieces(["a b"]).text(0)[0]], [ours.encode_pieces(["c d"]).text(0)[0]])
    assert rows["input_ids"][0] == enc["input_ids"]


def test_continues_word_marks_pieces_inside_words(family_dir):
    ours, ref = _pair(family_dir)
    text = "unbelievably transformational internationalisation"
    enc = ref(text)
    flags = ours.continues_word(enc["input_ids"])
    words = enc.word_ids()
    assert flags[0] is False and flags[-1] is False                     # specials are words of their own
    for k in range(1, len(words) - 1):
        if flags[k]:                                                    # a continuation is inside its word
            assert words[k] == words[k - 1], k


def test_split_words_save_load_pickle_and_pad(family_dir, tmp_path):
    ours, ref = _pair(family_dir)
    words = [["Hello", "wörld", "!"], ["東京", "は"]]
    a = ours(words, is_split_into_words=True, return_offsets_mapping=True)
    b = ref(words, is_split_into_words=True, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"] and a.word_ids(1) == b.word_ids(1)
    ours.save_pretrained(tmp_path / "saved")
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    texts = REAL + fuzz_corpus(40, 3)
    assert back(texts, texts[::-1])["input_ids"] == ref(texts, texts[::-1])["input_ids"]
    assert back.all_special_tokens == ref.all_special_tokens and len(back) == len(ours) == len(ref)
    again = pickle.loads(pickle.dumps(Tokenizer.from_pretrained(tmp_path / "saved")))
    assert again(texts)["input_ids"] == ours(texts)["input_ids"]
    padded = ours.pad([ours(t) for t in REAL[:3]], return_tensors="pt")
    assert padded["input_ids"].tolist() == ref.pad([ref(t) for t in REAL[:3]])["input_ids"]
    assert (ours.model_max_length or int(1e30)) == ref.model_max_length   # trained directories set no limit


def test_bert_directories_still_load_bertkits_wordpiece(tmp_path):
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "##c"])}
    ref = transformers.BertTokenizerFast(vocab=vocab)
    ref.save_pretrained(str(tmp_path / "bert"))
    ours = Tokenizer.from_pretrained(tmp_path / "bert")
    assert type(ours) is Tokenizer
    texts = ["a b abc", "bc [MASK] a", "ab" * 30, ""]
    assert_same(ours, ref, texts, texts[::-1], truncation="longest_first", max_length=9, padding=True)
    assert ours.continues_word(ours("ac a")["input_ids"]) == [False, False, True, False, False]


@pytest.mark.parametrize("model", ["bpe", "unigram"])
def test_vocab_command_trains_a_directory_both_load(tmp_path, model, capsys):
    from bertkit.cli import main as cli_main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TRAIN), encoding="utf-8")
    out = tmp_path / model
    assert cli_main(["vocab", "--model", model, "--files", str(corpus), "--vocab-size", "400", "--out", str(out),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["vocab_size"] == 400
    ours, ref = _pair(out)
    assert_same(ours, ref, REAL + fuzz_corpus(60, 5), (REAL + fuzz_corpus(60, 5))[::-1])
    assert ours.mask_token == "<mask>" and ours.pad_token_id == 1
    too_small = ["--vocab-size", "100"] if model == "bpe" else ["--vocab-size", "7"]
    assert cli_main(["vocab", "--model", model, "--files", str(corpus), *too_small, "--out", str(tmp_path / "x")]) == 2
    assert cli_main(["vocab", "--model", model, "--files", str(tmp_path / "missing.txt"), "--out",
                     str(tmp_path / "y")]) == 2
    assert "error:" in capsys.readouterr().err


def test_masking_tables_follow_continues_word(tmp_path):
    from bertkit.pretraining.masking import VocabTables

    bert = Tokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b", "[x]"])})
    a, b = VocabTables.from_tokenizer(bert), VocabTables.from_tokens(bert.ids_to_tokens)
    assert (a.continuation == b.continuation).all() and (a.never_mask == b.never_mask).all()
    tok = train_library_vocab(TRAIN, "bpe", vocab_size=600, min_frequency=1)
    t = VocabTables.from_tokenizer(tok)
    ids = tok("unbelievable transformations")["input_ids"]
    assert t.continuation[ids][2:-1].tolist() == tok.continues_word(ids)[2:-1]   # (the first piece after <s> is
    assert t.continuation[ids[1]] and not tok.continues_word(ids)[1]            # a word: masking checks its neighbour)
    assert t.never_mask[[tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id]].all()


def test_padding_and_truncation_side_from_tokenizer_config(family_dir, tmp_path):
    import shutil

    root = tmp_path / "left"
    shutil.copytree(family_dir, root)
    cfg = json.loads((root / "tokenizer_config.json").read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({**cfg, "padding_side": "left", "truncation_side": "left"}))
    ours, ref = _pair(root)
    assert (ours.padding_side, ours.truncation_side) == (ref.padding_side, ref.truncation_side) == ("left", "left")
    for strategy in ("longest_first", "only_first"):
        assert_same(ours, ref, REAL[:5], ["a b", "c", "d e f", "g", "h"], truncation=strategy, max_length=12,
                    padding=True)
    assert_same(ours, ref, REAL, None, truncation=True, max_length=9, padding="max_length")


def test_sides_set_on_the_tokenizer_survive_a_pickle(family_dir):
    """A collator sets padding_side / truncation_side on the tokenizer; worker processes get a pickled copy that
    pads and cuts as the original does."""
    ours = Tokenizer.from_pretrained(family_dir)
    ours.padding_side, ours.truncation_side = "left", "left"
    again = pickle.loads(pickle.dumps(ours))
    assert (again.padding_side, again.truncation_side) == ("left", "left")
    texts = REAL[:3]
    assert again(texts, padding=True, truncation=True, max_length=7)["input_ids"] == \
        ours(texts, padding=True, truncation=True, max_length=7)["input_ids"]
