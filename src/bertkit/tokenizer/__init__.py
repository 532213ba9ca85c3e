"""Tokenizers. BERT's WordPiece is bertkit's own (Tokenizer): exact, fast, and impossible to crash, identical to
transformers' BertTokenizerFast (the test oracle). Every other tokenizer.json (byte-level BPE, Unigram / Metaspace,
WordPiece with other specials) is read by the `tokenizers` library (LibraryTokenizer, library.py), behind the same
interface; Tokenizer.from_pretrained picks the class a directory needs. The WordPiece pipeline, a module per stage
(normalize.py, pretokenize.py, wordpiece.py, encode.py; inputs.py lays out model inputs for every caller):

    text ─> special tokens split out ─> clean ─> [NFD + strip Mn] ─> [lowercase] ─> split on whitespace and
            ("[MASK]" etc., verbatim,     (drop NUL,   (uncased)          (uncased)      punctuation, CJK ideographs
             case-sensitive, never split)  U+FFFD,                                        isolated
                                           controls)                                         │
    ids, offsets <─ [CLS] A [SEP] (B [SEP]) <─ truncation / padding <─ WordPiece (greedy longest match, "##") <─┘

Files: formats.py (vocab.txt, JSON, text), hfjson.py (HF model directories), spm.py (a SentencePiece .model alone);
hfcall.py holds transformers' call habits (BatchEncoding, pre-split words, pad).

Offsets are (start, end) character positions into the ORIGINAL text for every token, (0, 0) for [CLS] / [SEP] /
[PAD]. A normalised character inherits the position of the original character it came from (an accent stripped from
"é" leaves "e" covering the original "é"). The one exception, the Rust tokenizer's: when NFD reorders combining marks
across characters, positions follow the sequence, not the characters (Normalizer._normalize_reordered).

Invalid input policy:
  * non-str text raises TypeError naming the type given; any str (any length, any code points, lone surrogates
    included) is accepted and never crashes.
  * text files are decoded as UTF-8 with errors="replace"; each invalid byte becomes U+FFFD, which cleaning drops.
  * a missing, empty or malformed vocab (invalid UTF-8, blank line, duplicate entry, missing
    [PAD]/[UNK]/[CLS]/[SEP]/[MASK]) raises VocabError naming the file and line.
"""

from bertkit.tokenizer.encode import EncodeOptions, Tokenizer
from bertkit.tokenizer.inputs import TRUNCATION_STRATEGIES
from bertkit.tokenizer.library import LibraryTokenizer  # registers itself as the reader of other pipelines
from bertkit.tokenizer.formats import SPECIAL_TOKENS, load_vocab, read_text_file
from bertkit.tokenizer.wordpiece import MAX_INPUT_CHARS_PER_WORD, PieceArrays

__all__ = ["Tokenizer", "LibraryTokenizer", "EncodeOptions", "PieceArrays", "SPECIAL_TOKENS", "MAX_INPUT_CHARS_PER_WORD",
           "TRUNCATION_STRATEGIES", "load_vocab", "read_text_file"]
