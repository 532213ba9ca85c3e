"""Property-based parity with transformers' BertTokenizerFast (oracle) on arbitrary Unicode, and no-crash fuzzing.

Each property runs FUZZ_EXAMPLES examples by default (env BERTKIT_FUZZ_EXAMPLES, default 150) and 20x as many under
`-m slow`. Text is drawn from any code point plus a pool of characters BERT treats specially: accents and combining
marks, CJK, Hangul, emoji with joiners and modifiers, control and zero-width chars, every whitespace kind, Unicode
punctuation (old and new), characters Unicode assigned after 8.0 or whose category changed, special tokens, and very
long words. Compared: input_ids, token_type_ids, attention_mask and offsets, uncased and cased, single texts,
batches (which mix our fast and general paths), and pairs under every truncation strategy and padding mode.
"""

from __future__ import annotations

import os
import string

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bertkit.errors import BertkitError  # noqa: E402
from bertkit.tokenizer import Tokenizer  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("BERTKIT_FUZZ_EXAMPLES", "150"))

_POOL = (
    list("aAzZ09 ,.!?'\"-_[]()#$%&*+/:;<=>@\\^`{|}~")
    + list("éÉñüÜİıßẞΣσςǅﬁÅøØæœÞðŁł") + ["A\u030a", "e\u0301\u0301", "a\u0308\u0323"]
    + [chr(c) for c in range(0x300, 0x370, 7)] + ["\u0483", "\u0591", "\u093c", "\u0e31", "\u1ab0", "\u20dd",
                                                 "\U0001d165", "\U0001d16d", "\u0f39", "\u1734", "\u1885"]
    + ["中", "文", "\u3400", "\U00020000", "\U0002a700", "\U0002b820", "\U0002b91f", "\U0002b920", "\uf900",
       "\U0002f800", "한", "국", "カ", "ｶ", "ﾟ", "ー"]
    + ["😀", "👍", "🏽", "\u200d", "🇬", "🇧", "\ufe0f", "👨\u200d👩\u200d👧", "\u20e3"]
    + [chr(c) for c in range(0x00, 0x20)] + ["\x7f", "\x85", "\x9f", "\ufffd", "\u200b", "\u200c", "\u200e",
                                              "\u2060", "\ufeff", "\U000e0001", "\U000e0041", "\ue000",
                                              "\U000f0000", "\u00ad", "\u061c", "\u180e", "\u08e2", "\u0890"]
    + ["\xa0", "\u1680", "\u2000", "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\t",
       "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f"]
    + list("—–«»‘’“”…、。؟¿¡·•†‰′※⁂") + ["\u2e43", "\u2e52", "\u166d", "\U000111c9", "\u0f3a", "\ufe10", "\uff01"]
    + list("£€$¥©®°±×÷§¶") + ["\u0378", "\U000e0080", "\ua7cb", "\U00010d50", "\u1c89", "\U00016ea0", "\U0001fffe"]
    + ["[MASK]", "[SEP]", "[CLS]", "[PAD]", "[UNK]", "[mask]", "[unused1]", "[MASK", "MASK]", "##", "##ing"]
)

_word = st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=10)
_piece = st.one_of(st.sampled_from(_POOL), st.characters(exclude_categories=("Cs",)), _word, _word.map(str.upper),
                   st.just(" "))
_long_word = st.builds(lambda n, c: c * n, st.integers(95, 130), st.sampled_from(["a", "é", "e\u0301", "中", "x1"]))
texts = st.one_of(
    st.lists(_piece, max_size=40).map("".join),
    st.text(max_size=60),  # any code point but surrogates (the oracle cannot take surrogates)
    st.builds(lambda a, w, b: a + w + b, st.lists(_piece, max_size=5).map("".join), _long_word,
              st.lists(_piece, max_size=5).map("".join)),
)
ascii_texts = st.text(alphabet=string.printable, max_size=80)
# dense combining marks: NFD reorders marks of different combining classes across characters (alignment changes)
_MARKS = ["\u0300", "\u0301", "\u0315", "\u0323", "\u0345", "\u05ae", "\u05b0", "\u0591", "\u0f39", "\u302a",
          "\U0001d165", "\U0001d166", "\U0001d16d", "\U0001d16e", "\U0001d15f", "\u093c", "\u094d", "\u1dce"]
mark_texts = st.text(alphabet=st.sampled_from(_MARKS + list("aeoAÅéệṩǖ ,\x00\u200b中")), max_size=30)


@pytest.fixture(scope="module")
def toks(bert_vocab_file):
    transformers = pytest.importorskip("transformers")
    return {False: (Tokenizer(bert_vocab_file), transformers.BertTokenizerFast(str(bert_vocab_file))),
            True: (Tokenizer(bert_vocab_file, lowercase=False),
                   transformers.BertTokenizerFast(str(bert_vocab_file), do_lower_case=False))}


def _same(ours: dict, theirs, batched: bool) -> None:
    assert ours["input_ids"] == theirs["input_ids"]
    assert ours["token_type_ids"] == theirs["token_type_ids"]
    assert ours["attention_mask"] == theirs["attention_mask"]
    if batched:
        assert ours["offsets"] == [[tuple(o) for o in seq] for seq in theirs["offset_mapping"]]
    else:
        assert ours["offsets"] == [tuple(o) for o in theirs["offset_mapping"]]


def _call_both(ours_tok, ref_tok, a, b, **kw):
    """Call both; when the oracle refuses (a truncation it cannot do), ours must refuse too."""
    try:
        theirs = ref_tok(a, b, return_offsets_mapping=True, **kw)
    except Exception:
        with pytest.raises(BertkitError):
            ours_tok(a, b, return_offsets=True, **kw)
        return None, None
    return ours_tok(a, b, return_offsets=True, **kw), theirs


# ------------------------------------------------------------------------------------------ properties

def prop_single(toks, text, cased):
    ours, ref = toks[cased]
    _same(ours(text, return_offsets=True), ref(text, return_offsets_mapping=True), batched=False)
    assert ours.tokenize(text) == ref.tokenize(text)


def prop_batch(toks, batch, cased):
    ours, ref = toks[cased]
    theirs = ref(batch, return_offsets_mapping=True)
    _same(ours(batch, return_offsets=True), theirs, batched=True)
    ours._small_batch_chars = 0  # force the whole-batch (numpy) path that large batches take
    try:
        _same(ours(batch, return_offsets=True), theirs, batched=True)
    finally:
        ours._small_batch_chars = Tokenizer(ours.vocab)._small_batch_chars


def prop_pairs(toks, pairs, max_length, truncation, padding, multiple, cased):
    ours, ref = toks[cased]
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    kw = dict(max_length=max_length, truncation=truncation, padding=padding, pad_to_multiple_of=multiple)
    o, t = _call_both(ours, ref, a, b, **kw)
    if o is not None:
        _same(o, t, batched=True)
    if pairs and pairs[0][1]:  # unbatched pair call (an empty pair string means "no pair" there)
        o, t = _call_both(ours, ref, a[0], b[0], max_length=max_length, truncation=truncation)
        if o is not None:
            _same(o, t, batched=False)


def prop_decode(toks, ids, skip):
    ours, ref = toks[False]
    assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def prop_no_crash(toks, text):
    """Any str at all (lone surrogates included): valid ids, offsets inside the text, same as without surrogates."""
    ours, _ = toks[False]
    enc = ours([text, text + " tail"], return_offsets=True)
    for ids, offsets in zip(enc["input_ids"], enc["offsets"]):
        assert all(0 <= i < ours.vocab_size for i in ids)
        assert all(0 <= s <= e <= len(text) + 5 for s, e in offsets)
        starts = [s for s, e in offsets[1:-1]]
        assert starts == sorted(starts)
    clean = "".join(c for c in text if not 0xD800 <= ord(c) <= 0xDFFF)
    assert ours.tokenize(text) == ours.tokenize(clean)
    ours.decode(enc["input_ids"][0])


# ------------------------------------------------------------------------------------------ tests

_pair_args = dict(
    pairs=st.lists(st.tuples(texts, texts), min_size=1, max_size=4),
    max_length=st.one_of(st.none(), st.integers(0, 40)),
    truncation=st.sampled_from([None, True, False, "longest_first", "only_first", "only_second"]),
    padding=st.sampled_from([False, True, "longest", "max_length"]),
    multiple=st.one_of(st.none(), st.integers(1, 8)),
    cased=st.booleans(),
)
# any id, with extra weight on the low ids (specials, punctuation, symbols, "...": what decode's clean-up touches)
_decode_ids = st.one_of(st.integers(0, 30521), st.integers(0, 2200), st.sampled_from([1005, 1010, 1012, 1029, 999,
                                                                                      1055, 1049, 2094, 2133]))
_surrogate_texts = st.lists(st.one_of(_piece, st.characters(categories=("Cs",))), max_size=30).map("".join)


def _make(n: int):
    cfg = settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])
    return {
        "single": cfg(given(text=texts, cased=st.booleans())(prop_single)),
        "ascii": cfg(given(text=ascii_texts, cased=st.booleans())(prop_single)),
        "marks": cfg(given(text=mark_texts, cased=st.booleans())(prop_single)),
        "batch": cfg(given(batch=st.lists(st.one_of(texts, ascii_texts), min_size=1, max_size=8),
                           cased=st.booleans())(prop_batch)),
        "pairs": cfg(given(**_pair_args)(prop_pairs)),
        "decode": cfg(given(ids=st.lists(_decode_ids, max_size=20), skip=st.booleans())(prop_decode)),
        "no_crash": cfg(given(text=_surrogate_texts)(prop_no_crash)),
    }


_FAST = _make(FUZZ_EXAMPLES)
_SLOW = _make(20 * FUZZ_EXAMPLES)


@pytest.mark.parametrize("name", list(_FAST))
def test_fuzz_parity(name, toks):
    _FAST[name](toks)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_SLOW))
def test_fuzz_parity_long(name, toks):
    _SLOW[name](toks)
