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

Files: hfjson.py (vocab.txt, tokenizer.json and the configs of HF model directories), spm.py (a SentencePiece .model
alone); hfcall.py holds transformers' call habits (BatchEncoding, pre-split words, pad). Offsets and the invalid input
policy (any str is accepted and never crashes; a bad vocab is a VocabError naming file and line): docs/tokenizers.md.
"""

from bertkit.tokenizer.encode import EncodeOptions, Tokenizer
from bertkit.tokenizer.inputs import TRUNCATION_STRATEGIES
from bertkit.tokenizer.library import LibraryTokenizer  # registers itself as the reader of other pipelines
from bertkit.tokenizer.hfjson import SPECIAL_TOKENS, load_vocab, read_text_file
from bertkit.tokenizer.wordpiece import MAX_INPUT_CHARS_PER_WORD, PieceArrays

__all__ = ["Tokenizer", "LibraryTokenizer", "EncodeOptions", "PieceArrays", "SPECIAL_TOKENS", "MAX_INPUT_CHARS_PER_WORD",
           "TRUNCATION_STRATEGIES", "load_vocab", "read_text_file"]
