"""Model inputs, the last stage, and the Tokenizer that runs the whole pipeline: pieces truncated, wrapped in
[CLS] a [SEP] (b [SEP]), padded and made tensors, as BertTokenizerFast does."""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from bertkit.errors import BertkitError
from bertkit.hub import resolve_model_dir
from bertkit.tokenizer.hfcall import (BatchEncoding, as_id_list, hf_text_args, overflow, pad_encodings,
                                      split_words_pieces, to_tensors, uncut_words)
from bertkit.tokenizer.hfjson import (SPECIAL_TOKENS, check_vocab_dict, is_bert_pipeline, load_vocab, read_model_dir,
                                     read_sides, vocab_hash, write_model_dir)
from bertkit.tokenizer.inputs import Template, cut, truncated_lengths, truncation_strategy
from bertkit.tokenizer.pretokenize import PreTokenizer
from bertkit.tokenizer.wordpiece import PieceArrays, PieceEncoder, WordPiece, PieceTable, decode_pieces


@dataclass(frozen=True)
class EncodeOptions:
    """The keyword options of Tokenizer.__call__ (see there for their semantics)."""
    max_length: int | None = None
    padding: bool | str = False
    truncation: bool | str | None = None
    pad_to_multiple_of: int | None = None
    return_offsets: bool = False
    return_tensors: str | None = None
    # transformers' names: offsets under "offset_mapping", specials off, keys left out, words given pre-split
    return_offsets_mapping: bool = False
    add_special_tokens: bool = True
    return_attention_mask: bool | None = None
    return_token_type_ids: bool | None = None
    is_split_into_words: bool = False
    return_special_tokens_mask: bool = False
    return_overflowing_tokens: bool = False     # long inputs as windows (hfcall.overflow), stride pieces shared
    stride: int = 0
    padding_side: str | None = None             # this call's "right" / "left" (transformers' option); None: the tokenizer's

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> "EncodeOptions":
        if not kwargs:
            return _DEFAULT_OPTIONS
        for name in kwargs:
            if name not in _OPTION_NAMES:
                raise TypeError(f"Tokenizer got an unexpected keyword argument {name!r} "
                                f"(options: {', '.join(_OPTION_NAMES)})")
        return cls(**kwargs)


_OPTION_NAMES = tuple(f.name for f in fields(EncodeOptions))
_DEFAULT_OPTIONS = EncodeOptions()


class Tokenizer:
    """WordPiece tokenizer with BERT semantics: the stages of the bertkit.tokenizer package, and the model inputs."""

    padding_side = "right"          # or "left": where padding goes (transformers' attribute; collators read it)
    truncation_side = "right"       # or "left": truncation keeps the end of a sequence (tokenizer_config.json)

    def __init__(self, vocab: str | os.PathLike | dict[str, int], lowercase: bool = True,
                 strip_accents: bool | None = None, model_max_length: int | None = None,
                 padding_side: str | None = None, truncation_side: str | None = None):
        if isinstance(vocab, (str, os.PathLike)):
            self.vocab_file: str | None = str(vocab)
            vocab = load_vocab(vocab)
        elif isinstance(vocab, dict):
            self.vocab_file = None
            vocab = check_vocab_dict(vocab)
        else:
            raise TypeError(f"vocab must be a path or a dict[str, int], got {type(vocab).__name__}")
        self._set_vocab(vocab)
        self.lowercase = bool(lowercase)
        # None follows lowercase, as in BERT / BertTokenizerFast
        self.strip_accents = self.lowercase if strip_accents is None else bool(strip_accents)
        for name, token in zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS):
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", vocab[token])
        self.bos_token = self.eos_token = self.bos_token_id = self.eos_token_id = None
        self.continuing_subword_prefix = "##"
        self.template = Template.bert(self.cls_token_id, self.sep_token_id)
        self._special_ids = {vocab[t] for t in SPECIAL_TOKENS}
        sides = {"padding_side": padding_side, "truncation_side": truncation_side}
        self.__dict__.update(read_sides(sides, "tokenizer"))       # unset: the class's "right", as transformers
        # used by truncation=True / padding="max_length" without max_length; None: they then do nothing (as HF does)
        self.model_max_length = model_max_length
        self._pretok = PreTokenizer(self.lowercase, self.strip_accents, SPECIAL_TOKENS)
        self._wordpiece = WordPiece(vocab, self.unk_token_id, SPECIAL_TOKENS).pieces
        self._pieces = PieceTable(self._wordpiece, self.vocab)
        self._encoder = PieceEncoder(self._pretok, self._wordpiece, self._pieces)
        # batches shorter than this (in chars) take the per-text path: same results, less fixed overhead
        self._small_batch_chars = 2048

    def _set_vocab(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab
        self.ids_to_tokens = [""] * (max(vocab.values(), default=-1) + 1)
        for t, i in vocab.items():
            self.ids_to_tokens[i] = t
        self.vocab_size = len(self.ids_to_tokens)
        self.vocab_hash = vocab_hash(self.ids_to_tokens)

    _other_pipelines: type["Tokenizer"]    # reads every other tokenizer.json: the subclass that says so (library.py)

    def __init_subclass__(cls, reads_other_pipelines: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        if reads_other_pipelines:
            Tokenizer._other_pipelines = cls

    # ------------------------------------------------------------------ loading / saving

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, revision: str | None = None, **overrides) -> "Tokenizer":
        """Load a vocab.txt, or an HF-format model directory (vocab.txt or tokenizer.json, with tokenizer_config.json
        and special_tokens_map.json), or a Hub repo id found through bertkit.hub.resolve_model_dir."""
        # a vocab file path stays a path, so a missing one is still reported as a missing vocab
        path = Path(path) if Path(path).suffix == ".txt" else resolve_model_dir(path, revision)
        if path.is_dir():
            if cls is not Tokenizer or not is_bert_pipeline(path):
                return Tokenizer._other_pipelines.from_dir(path, **overrides)
            vocab, kwargs = read_model_dir(path)
            kwargs.update(overrides)
            return cls(vocab, **kwargs)
        return cls(path, **overrides)

    def save(self, directory: str | os.PathLike) -> Path:
        """save_pretrained; returns the directory."""
        self.save_pretrained(directory)
        return Path(directory)

    def save_pretrained(self, directory: str | os.PathLike) -> tuple[str, ...]:
        """Write vocab.txt, tokenizer.json and tokenizer_config.json (transformers / tokenizers load the directory);
        returns their paths."""
        files = write_model_dir(Path(directory), self.vocab, self.ids_to_tokens, self.lowercase, self.strip_accents,
                                self.model_max_length, self.sides())
        return tuple(str(f) for f in files)

    def __getstate__(self) -> dict:  # caches hold closures; ship only what rebuilds the tokenizer
        return {"vocab": self.vocab, "lowercase": self.lowercase, "strip_accents": self.strip_accents,
                "model_max_length": self.model_max_length, **self.sides(), "vocab_file": self.vocab_file}

    def __setstate__(self, state: dict) -> None:
        vocab_file = state.pop("vocab_file")
        self.__init__(**state)
        self.vocab_file = vocab_file

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"

    # ------------------------------------------------------------------ words and pieces

    @staticmethod
    def _check_text(text, what: str = "text") -> str:
        if not isinstance(text, str):
            raise TypeError(f"{what} must be str, got {type(text).__name__}: {_short_repr(text)}")
        return text

    def basic_tokenize(self, text: str) -> list[str]:
        """Words after cleaning, CJK isolation, lowercasing / accent stripping and punctuation split; special tokens
        ("[MASK]", ...) appearing verbatim stay whole words."""
        self._check_text(text)
        return self._pretok.basic_tokenize(text)

    def tokenize(self, text: str) -> list[str]:
        """WordPiece pieces of text (continuation pieces start with "##"), without [CLS] / [SEP]."""
        self._check_text(text)
        itt = self.ids_to_tokens
        return [itt[i] for i in self._pieces_batch([text], offsets=False)[0][0]]

    def _pieces_batch(self, texts: Sequence[str], offsets: bool) -> list[tuple[list[int], list | None]]:
        if sum(map(len, texts)) < self._small_batch_chars:  # numpy's per-call overhead would dominate
            out = []
            for t in texts:
                ids, starts, ends = self._encoder.general(t)
                out.append((ids, list(zip(starts, ends)) if offsets else None))
            return out
        return self._encoder.flat(texts).lists(offsets)

    # ------------------------------------------------------------------ model inputs

    def encode(self, text: str, pair: str | None = None, max_length: int | None = None,
               truncation: bool | str | None = None) -> list[int]:
        """Ids of [CLS] text [SEP] (pair [SEP]), truncated to max_length when given."""
        return self(text, pair, max_length=max_length, truncation=truncation)["input_ids"]

    def __call__(self, texts: str | Sequence[str] | None = None, pairs: str | Sequence[str] | None = None,
                 text=None, text_pair=None, **options) -> BatchEncoding:
        """Model inputs for one text (or pair) or a batch: a BatchEncoding (a dict with attribute access, .to(device),
        .word_ids(i)) of input_ids, token_type_ids, attention_mask[, offsets]. A single str gives flat lists; tensors
        always have a batch dimension. The keyword options are EncodeOptions' fields, as BertTokenizerFast reads them:

        truncation: None -> "longest_first" when max_length is given and padding is off, else none; True =
          "longest_first"; or "only_first" / "only_second". max_length counts the special tokens. A strategy that
          cannot reach max_length raises BertkitError; a max_length below the special tokens leaves inputs uncut.
        padding: True / "longest", or "max_length" (default model_max_length); pad_to_multiple_of rounds up.
        offsets: (start, end) into the original text, (0, 0) for special and pad tokens (key "offset_mapping" with
          transformers' return_offsets_mapping). return_tensors="pt" / "np" needs equal lengths.
        """
        opts = EncodeOptions.from_kwargs(options)
        if texts is None or text is not None or text_pair is not None:
            texts, pairs = hf_text_args(texts, pairs, text, text_pair)
        if opts.is_split_into_words:
            texts, pairs, single = self._word_lists(texts, pairs)
        else:
            single = isinstance(texts, str)
            if single:
                if pairs is not None:
                    self._check_text(pairs, "pair")
                    # BertTokenizerFast treats an empty pair string in an unbatched call as no pair
                    pairs = [pairs] if pairs else None
                texts = [texts]
            else:
                texts = self._check_batch(texts, "texts")
                pairs = None if pairs is None else self._check_batch(pairs, "pairs")
        if pairs is not None and len(pairs) != len(texts):
            raise BertkitError(f"pairs has {len(pairs)} entries, texts has {len(texts)}")
        return (self._encode_words if opts.is_split_into_words else self._encode_texts)(texts, pairs, opts, single)

    def _encode_texts(self, texts: list[str], pairs: list[str] | None, opts: EncodeOptions, single: bool):
        offsets = opts.return_offsets or opts.return_offsets_mapping
        with gc_paused():
            first = self._pieces_batch(texts, offsets)
            second = self._pieces_batch(pairs, offsets) if pairs is not None else None
            return self._assemble(first, second, opts, single)

    @staticmethod
    def _word_lists(texts, pairs) -> tuple[list[list[str]], list[list[str]] | None, bool]:
        """is_split_into_words: texts (and pairs) are lists of words, or batches of them."""
        if not isinstance(texts, (list, tuple)):
            raise BertkitError(f"is_split_into_words=True needs a list of words (or of word lists), got "
                               f"{type(texts).__name__}: {_short_repr(texts)}")
        single = not texts or isinstance(texts[0], str)
        texts = [list(texts)] if single else [list(t) for t in texts]
        if pairs is not None:
            pairs = [list(pairs)] if single else [list(p) for p in pairs]
        return texts, pairs, single

    def _encode_words(self, texts: list[list[str]], pairs: list[list[str]] | None, opts: EncodeOptions,
                      single: bool) -> BatchEncoding:
        offsets = opts.return_offsets or opts.return_offsets_mapping
        first, words_a = split_words_pieces(self, texts, offsets)
        second, words_b = split_words_pieces(self, pairs, offsets) if pairs is not None else (None, None)
        words = [(a, words_b[i] if words_b else []) for i, a in enumerate(words_a)]
        return self._assemble(first, second, opts, single, words)

    def build_inputs(self, first: Sequence[list[int]], second: Sequence[list[int]] | None = None, **options) -> dict:
        """Model inputs from piece ids (per text, without [CLS] / [SEP]: from tokenize + convert_tokens_to_ids,
        encode_pieces, or a caller's own pieces, e.g. with [MASK] ids spliced in): what __call__ does after WordPiece,
        with the same options except return_offsets. A batch: lists per row, or tensors with return_tensors."""
        opts = EncodeOptions.from_kwargs(options)
        if opts.return_offsets or opts.return_offsets_mapping:
            raise BertkitError("build_inputs has no character offsets: use the tokenizer call for return_offsets")
        if second is not None and len(second) != len(first):
            raise BertkitError(f"second has {len(second)} entries, first has {len(first)}")
        pairs = None if second is None else [(list(b), None) for b in second]
        return self._assemble([(list(a), None) for a in first], pairs, opts, single=False)

    def _assemble(self, first, second, opts: EncodeOptions, single: bool, words=None) -> BatchEncoding:
        """Truncate, add [CLS] / [SEP], token types, mask, pad: pieces -> model inputs."""
        max_length, padding, truncation = opts.max_length, opts.padding, opts.truncation
        pad_to_multiple_of = opts.pad_to_multiple_of
        return_offsets = opts.return_offsets or opts.return_offsets_mapping
        if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool)
                                       or max_length < 0):
            raise BertkitError(f"max_length must be a non-negative int, got {max_length!r}")
        if max_length is None and self.model_max_length is not None and (
                truncation not in (None, False, "do_not_truncate") or padding == "max_length"):
            max_length = self.model_max_length
        strategy = truncation_strategy(truncation, max_length, padding)
        mapping = None
        sides = self.sides({"padding_side": opts.padding_side})     # checked once a call, for the cut and the pad
        left = strategy is not None and sides["truncation_side"] == "left"
        if left and opts.return_overflowing_tokens:
            raise BertkitError("return_overflowing_tokens windows run from the start: they need truncation_side "
                               "'right'")
        if left and words is None:      # word ids count from the text's first word, cut or not (as transformers)
            words = uncut_words(self, first, second)
        if opts.return_overflowing_tokens:         # windows: the rows come already cut to max_length
            n_special = (self.template if opts.add_special_tokens else Template.none()).n_special(second is not None)
            first, second, words, mapping = overflow(
                self, first, second, words, lambda na, nb: truncated_lengths(na, nb, max_length, strategy, n_special)
                if strategy else (na, nb or 0), opts.stride)
            strategy, single = None, False
        if (strategy is not None and padding not in (False, None, "do_not_pad") and pad_to_multiple_of
                and max_length is not None and max_length % pad_to_multiple_of):
            raise BertkitError(f"max_length={max_length} (truncation with padding) must be a multiple of "
                               f"pad_to_multiple_of={pad_to_multiple_of}")
        out_ids, out_types, out_offsets, lengths = self._lay_out(first, second, strategy, max_length,
                                                                 opts.add_special_tokens, return_offsets)
        out_mask = [[1] * len(x) for x in out_ids]
        specials = [self._special_mask(*n, opts.add_special_tokens) for n in lengths] \
            if opts.return_special_tokens_mask else None
        side = sides["padding_side"]
        self._pad((out_ids, out_types, out_mask, out_offsets if return_offsets else None, specials), padding,
                  max_length, pad_to_multiple_of, side)
        result = {"input_ids": out_ids, "token_type_ids": out_types, "attention_mask": out_mask}
        if specials is not None:
            result["special_tokens_mask"] = specials
        if return_offsets:
            result["offset_mapping" if opts.return_offsets_mapping else "offsets"] = out_offsets
        if mapping is not None:
            result["overflow_to_sample_mapping"] = mapping
        if opts.return_tensors is not None:
            result = to_tensors(result, opts.return_tensors)
        elif single:
            result = {k: v[0] for k, v in result.items()}
        # what word_ids() needs, kept as it is: a _Layout is only built when asked for
        layout = (self, result["input_ids"], lengths, opts.add_special_tokens, words, side)
        if opts.return_token_type_ids is False:
            del result["token_type_ids"]
        if opts.return_attention_mask is False:
            del result["attention_mask"]
        enc = BatchEncoding(result)
        enc._layout = layout
        return enc

    def _lay_out(self, first, second, strategy, max_length, special: bool, offsets: bool):
        """Per row: ids, token types and offsets of the template around a (and b), or of a b when not special, a and
        b truncated by strategy; and the lengths of a and b kept."""
        template, side = self.template if special else Template.none(), self.truncation_side
        wrap, types, n_special = template.wrap, template.types, (template.n_special(False), template.n_special(True))
        out_ids, out_types, out_offsets, lengths = [], [], [], []
        for i, (a_ids, a_off) in enumerate(first):
            b_ids, b_off = second[i] if second is not None else (None, None)
            if strategy is not None:
                na, nb = truncated_lengths(len(a_ids), None if b_ids is None else len(b_ids), max_length, strategy,
                                            n_special[b_ids is not None])
                a_ids, a_off = cut(a_ids, na, side), cut(a_off, na, side) if a_off is not None else None
                if b_ids is not None:
                    b_ids, b_off = cut(b_ids, nb, side), cut(b_off, nb, side) if b_off is not None else None
            nb = None if b_ids is None else len(b_ids)
            lengths.append((len(a_ids), nb))
            out_ids.append(wrap(a_ids, b_ids))
            out_types.append(types(len(a_ids), nb))
            if offsets:
                out_offsets.append(wrap(a_off, b_off, (0, 0)))
        return out_ids, out_types, out_offsets, lengths

    def _special_mask(self, len_a: int, len_b: int | None, special: bool) -> list[int]:
        """1 where the template put a special token (as transformers' return_special_tokens_mask)."""
        if not special:
            return [0] * (len_a + (len_b or 0))
        return self.template.wrap([0] * len_a, None if len_b is None else [0] * len_b, 1)

    def _check_batch(self, texts, what: str) -> list[str]:
        if isinstance(texts, (str, bytes)) or not hasattr(texts, "__len__"):
            raise TypeError(f"{what} must be a str or a list of str, got {type(texts).__name__}: "
                            f"{_short_repr(texts)}")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"{what}[{i}] must be str, got {type(t).__name__}: {_short_repr(t)}")
        return texts

    def _pad(self, rows: tuple, padding, max_length, multiple, side: str) -> None:
        """Pad (ids, token types, mask, offsets, specials mask; None where absent) in place on `side`."""
        ids, types, mask, offsets, specials = rows
        if padding is False or padding is None or padding == "do_not_pad" or not ids:
            return
        if padding is True or padding == "longest":
            target = max(len(x) for x in ids)
        elif padding == "max_length":
            if max_length is None:
                return  # no length to pad to (BertTokenizerFast: "Default to no padding")
            target = max_length
        else:
            raise BertkitError(f"padding must be False, True, 'longest' or 'max_length', got {padding!r}")
        if multiple is not None:
            if not isinstance(multiple, int) or multiple <= 0:
                raise BertkitError(f"pad_to_multiple_of must be a positive int, got {multiple!r}")
            target = -(-target // multiple) * multiple
        if self.pad_token_id is None:
            raise BertkitError("padding needs a pad token, and this tokenizer has none (pad_token in "
                               "tokenizer_config.json)")
        fills = [(rows, fill) for rows, fill in ((ids, self.pad_token_id), (types, 0), (mask, 0), (offsets, (0, 0)),
                                                (specials, 1)) if rows is not None]
        left = side == "left"
        for i in range(len(ids)):
            n = target - len(ids[i])
            for rows, fill in fills if n > 0 else ():
                at = 0 if left else len(rows[i])
                rows[i][at:at] = [fill] * n

    def sides(self, call: dict | None = None) -> dict[str, str]:
        """padding_side and truncation_side, checked ("right" or "left"), as tokenizer_config.json writes them; a
        call's own choice (`call`, None values left out) wins."""
        given = {k: v for k, v in (call or {}).items() if v is not None}
        return read_sides({"padding_side": self.padding_side, "truncation_side": self.truncation_side, **given},
                          "tokenizer")

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of ids (or of one id) as BertTokenizerFast's WordPiece decoder makes it (decode_pieces). Special
        tokens stay unless skip_special_tokens, as in transformers. Lowercasing / accent stripping is not undone."""
        skip = self._special_ids if skip_special_tokens else ()
        return decode_pieces([self._id_to_token(i) for i in map(int, as_id_list(ids)) if i not in skip])

    def join(self, ids: Sequence[int]) -> str:
        """Pieces back to text without transformers' clean-up: joined by spaces, a word's "##" continuations glued
        on ("cap ##ital" -> "capital")."""
        return " ".join(self.convert_ids_to_tokens(list(ids))).replace(" ##", "")

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens: bool = False
                                ) -> list[int]:
        """transformers' name: 1 at each special token of the ids (already_has_special_tokens), or of the row the
        template would make of them."""
        if already_has_special_tokens:
            return [int(int(i) in self._special_ids) for i in as_id_list(token_ids_0)]
        return self._special_mask(len(token_ids_0), None if token_ids_1 is None else len(token_ids_1), True)

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(self._special_ids)

    @property
    def special_ids(self) -> frozenset[int]:
        """Every special token's id ([CLS], [SEP], ...; RoBERTa's <s>, </s>, ...)."""
        return frozenset(self._special_ids)

    def batch_decode(self, sequences, skip_special_tokens: bool = False) -> list[str]:
        """decode for each row of sequences (lists, or a 2-D tensor / array)."""
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in as_id_list(sequences)]

    def pad(self, encodings, padding: bool | str = True, max_length: int | None = None,
            pad_to_multiple_of: int | None = None, return_tensors: str | None = None,
            padding_side: str | None = None) -> BatchEncoding:
        """Pad encodings made earlier (a list of single encodings, or one batch dict) as transformers' pad does:
        input_ids with [PAD], token_type_ids (when present) with 0, and an attention_mask (made when absent), on
        `padding_side` (None: the tokenizer's)."""
        side = self.sides({"padding_side": padding_side})["padding_side"]
        return pad_encodings(self, encodings, (padding, max_length, pad_to_multiple_of, side), return_tensors)

    def encode_batch_parallel(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                              processes: int | None = None, chunk_size: int = 2000, **kwargs) -> dict:
        """`self(texts, pairs, **kwargs)`, identical, with chunks of texts split into pieces by `processes` worker
        processes (default: all cores). The Python lists are built here, which bounds the speed-up (encode_pieces)."""
        opts = EncodeOptions.from_kwargs(kwargs)
        texts = self._check_batch(texts, "texts")
        if pairs is not None:
            pairs = self._check_batch(pairs, "pairs")
        processes = processes or os.cpu_count() or 1
        if processes <= 1 or len(texts) <= chunk_size:
            return self(texts, pairs, **kwargs)
        offsets = bool(opts.return_offsets or opts.return_offsets_mapping)
        flats = self._map_chunks(texts + (pairs or []), processes, chunk_size)
        with gc_paused():
            pieces = [p for f in flats for p in f.lists(offsets)]
            first = pieces[:len(texts)]
            second = pieces[len(texts):] if pairs is not None else None
            return self._assemble(first, second, opts, single=False)

    def encode_pieces(self, texts: Sequence[str], processes: int = 1, chunk_size: int = 2000) -> PieceArrays:
        """WordPiece pieces of every text as flat numpy arrays (no [CLS] / [SEP], no truncation), for corpora: with
        processes > 1, chunks are encoded by worker processes and only concatenated here, so it scales with cores."""
        texts = self._check_batch(texts, "texts")
        if processes <= 1 or len(texts) <= chunk_size:
            with gc_paused():
                return self._encoder.flat(texts)
        return PieceArrays.concatenate(self._map_chunks(texts, processes, chunk_size))

    def _map_chunks(self, texts: list[str], processes: int, chunk_size: int) -> list[PieceArrays]:
        import multiprocessing as mp
        chunks = [texts[i:i + chunk_size] for i in range(0, len(texts), chunk_size)]
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with mp.get_context(method).Pool(min(processes, len(chunks)), initializer=_worker_init,
                                         initargs=(self,)) as pool:
            return pool.map(_worker_encode, chunks, chunksize=1)

    # ------------------------------------------------------------------ ids <-> tokens

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self.vocab.get(tokens, self.unk_token_id)
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        if isinstance(ids, (int, np.integer)):
            return self._id_to_token(int(ids))
        return [self._id_to_token(int(i)) for i in as_id_list(ids)]

    def continues_word(self, ids: Sequence[int]) -> list[bool]:
        """For each token id: does the piece continue the word before it (WordPiece: a "##" piece)."""
        itt = self.ids_to_tokens
        return [itt[i].startswith("##") for i in ids]

    def _id_to_token(self, i: int) -> str:
        if not 0 <= i < self.vocab_size:
            raise IndexError(f"token id {i} is outside the vocab (size {self.vocab_size})")
        return self.ids_to_tokens[i]


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic GC: encoding a batch allocates millions of small lists / tuples / ints (none cyclic), and
    each allocation burst would otherwise trigger collections that walk every live object again and again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _short_repr(x, limit: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[:limit] + "..."


_WORKER_TOKENIZER: "Tokenizer | None" = None


def _worker_init(tok: "Tokenizer") -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tok


def _worker_encode(texts: list[str]) -> PieceArrays:
    gc.disable()
    return _WORKER_TOKENIZER._encoder.flat(texts)
