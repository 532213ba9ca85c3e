"""Every other tokenizer.json (byte-level BPE: RoBERTa, ModernBERT; SentencePiece Unigram / BPE with Metaspace:
XLM-R, ALBERT, DeBERTa-v3; WordPiece with other specials: MPNet), read by the `tokenizers` library, the ecosystem's
reader of these files. Its pieces, offsets and words are the file's by construction; everything after the pieces
(truncation, the post-processor's layout as a Template, padding, tensors, word ids) is the Tokenizer's own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from bertkit.errors import VocabError
from bertkit.tokenizer.encode import Tokenizer, gc_paused
from bertkit.tokenizer.hfcall import as_id_list
from bertkit.tokenizer.hfjson import (NO_LIMIT, read_json_object, read_max_length, read_sides, read_structured,
                                     write_files)
from bertkit.tokenizer.inputs import Template
from bertkit.tokenizer.spm import sentencepiece_json
from bertkit.tokenizer.wordpiece import PieceArrays, DECODE_CLEANUP

_SPECIALS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
# a special token a directory does not name is looked up under these names (the post-processor names cls and sep)
_USUAL = {"pad": ("<pad>", "[PAD]"), "unk": ("<unk>", "[UNK]"), "mask": ("<mask>", "[MASK]"),
          "bos": ("<s>",), "eos": ("</s>",)}


class LibraryTokenizer(Tokenizer, reads_other_pipelines=True):
    """A tokenizer.json of any model, read by the `tokenizers` library; the Tokenizer's interface and layout."""

    def __init__(self, spec: str | dict, config: dict | None = None, source: str = "tokenizer.json"):
        from tokenizers import Tokenizer as Backend  # deferred: the Rust extension loads only for these models

        config = dict(config or {})
        spec = json.loads(spec) if isinstance(spec, str) else spec
        _apply_config(spec, config)
        try:
            self._backend = Backend.from_str(json.dumps(spec))
        except Exception as e:  # the library's own error type is not importable as a class
            raise VocabError(f"{source}: the tokenizers library cannot read it: {str(e)[:160]}") from None
        self._backend.no_truncation()
        self._backend.no_padding()
        self.config, self.vocab_file, self.lowercase = config, None, bool(config.get("do_lower_case", False))
        self._set_vocab(self._backend.get_vocab(with_added_tokens=True))
        try:
            self.template = _template(self._backend)
        except Exception as e:  # it reads a file it cannot run (a WordPiece vocab without its unk_token)
            raise VocabError(f"{source}: the tokenizers library cannot encode with it: {str(e)[:160]}") from None
        self._set_specials(config, source)
        self.__dict__.update(read_sides(config, source))    # else the class's "right"
        self.model_max_length = read_max_length(config)
        self._cleanup = bool(config.get("clean_up_tokenization_spaces", False))
        # a "##"-style prefix marks pieces inside words (WordPiece); BPE / Unigram mark word starts instead
        self.continuing_subword_prefix = (spec.get("model") or {}).get("continuing_subword_prefix")
        self._continuation = _continuation_flags(spec, self.ids_to_tokens)
        self._continuation[list(self._special_ids)] = False     # a special token is a word of its own

    def _set_specials(self, config: dict, source: str) -> None:
        """cls_token / cls_token_id ... as the directory names them; the post-processor's first and last specials
        stand in for cls and sep, and the usual spellings for the rest, where it names none."""
        (pre, post), ids_to_tokens = self.template.single, self.ids_to_tokens
        implied = {"cls": ids_to_tokens[pre[0]] if pre else None, "sep": ids_to_tokens[post[-1]] if post else None}
        for name in _SPECIALS:
            value = config.get(f"{name}_token")
            token = value.get("content") if isinstance(value, dict) else value
            if not isinstance(token, (str, type(None))):
                raise VocabError(f"{Path(source).parent}: {name}_token in tokenizer_config.json / "
                                 f"special_tokens_map.json is {value!r:.60}, not a token")
            if token is None:
                token = implied.get(name) or next((t for t in _USUAL.get(name, ()) if t in self.vocab), None)
            setattr(self, f"{name}_token", token)
            setattr(self, f"{name}_token_id", None if token is None else self.vocab.get(token))
        self._special_ids = {i for i, a in self._backend.get_added_tokens_decoder().items() if a.special}

    # ------------------------------------------------------------------ loading / saving

    @classmethod
    def from_dir(cls, path: Path, **overrides) -> "LibraryTokenizer":
        """A model directory: tokenizer.json, with tokenizer_config.json and special_tokens_map.json where present."""
        json_file = path / "tokenizer.json"
        config = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins, as in transformers
            if (path / name).is_file():
                config.update(read_structured(path / name, read_json_object))
        config.update({("do_lower_case" if k == "lowercase" else k): v for k, v in overrides.items()})
        if json_file.is_file():
            return cls(read_structured(json_file, read_json_object), config, str(json_file))
        models = sorted(path.glob("*.model"))
        if not models:
            raise VocabError(f"{path}: model directory has no vocab.txt and no tokenizer.json")
        model_cfg = read_json_object(path / "config.json") if (path / "config.json").is_file() else {}
        spec, config = sentencepiece_json(models[0], config, model_cfg.get("model_type"))
        return cls(spec, config, str(models[0]))

    def save_pretrained(self, directory: str | os.PathLike) -> tuple[str, ...]:
        """tokenizer.json, tokenizer_config.json and special_tokens_map.json, as transformers' AutoTokenizer loads
        them; returns their paths."""
        specials = {f"{n}_token": getattr(self, f"{n}_token") for n in _SPECIALS if getattr(self, f"{n}_token")}
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **self.config, **specials, **self.sides(),
               "model_max_length": NO_LIMIT if self.model_max_length is None else self.model_max_length}
        files = write_files(Path(directory), {"tokenizer.json": self._backend.to_str(pretty=True) + "\n",
                                              "tokenizer_config.json": cfg, "special_tokens_map.json": specials})
        return tuple(str(f) for f in files)

    def __getstate__(self) -> dict:
        return {"spec": self._backend.to_str(), "config": {**self.config, **self.sides()}}  # sides set since too

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["spec"], state["config"])

    def __repr__(self) -> str:
        return f"LibraryTokenizer(model={type(self._backend.model).__name__}, vocab_size={self.vocab_size})"

    # ------------------------------------------------------------------ pieces

    def basic_tokenize(self, text: str) -> list[str]:
        """Words as the file's normalizer and pre-tokenizer split text (special tokens not split out)."""
        self._check_text(text)
        if self._backend.normalizer is not None:
            text = self._backend.normalizer.normalize_str(text)
        pre = self._backend.pre_tokenizer
        return [w for w, _ in pre.pre_tokenize_str(text)] if pre is not None else [text]

    def tokenize(self, text: str) -> list[str]:
        """The pieces of text, without special tokens around it."""
        self._check_text(text)
        return self._backend.encode(text, add_special_tokens=False).tokens

    def _encode_texts(self, texts: list[str], pairs: list[str] | None, opts, single: bool):
        """The library's pieces, offsets and words; then the Tokenizer's layout."""
        offsets, words = opts.return_offsets or opts.return_offsets_mapping, opts.is_split_into_words
        # without offsets the library can skip tracking them (encode_batch_fast, tokenizers >= 0.20)
        encode = self._backend.encode_batch if offsets else getattr(self._backend, "encode_batch_fast",
                                                                    self._backend.encode_batch)
        with gc_paused():
            encs = encode(texts, add_special_tokens=False, is_pretokenized=words)
            pair_encs = None if pairs is None else encode(pairs, add_special_tokens=False, is_pretokenized=words)
            first = [(e.ids, e.offsets if offsets else None) for e in encs]
            second = None if pairs is None else [(e.ids, e.offsets if offsets else None) for e in pair_encs]
            return self._assemble(first, second, opts, single, _Words(encs, pair_encs))

    _encode_words = _encode_texts   # is_split_into_words: the library pre-tokenizes each word on its own

    def encode_pieces(self, texts: Sequence[str], processes: int = 1, chunk_size: int = 2000) -> PieceArrays:
        """The pieces of every text as flat numpy arrays (no special tokens, no truncation); the library spreads
        the batch over its own threads, so processes and chunk_size are not needed."""
        texts = self._check_batch(texts, "texts")
        with gc_paused():
            encs = self._backend.encode_batch(texts, add_special_tokens=False)
            ids = [e.ids for e in encs]
            offs = [o for e in encs for o in e.offsets]
        spans = np.asarray(offs, dtype=np.int64).reshape(-1, 2)
        bounds = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(x) for x in ids], out=bounds[1:])
        flat = np.fromiter((i for x in ids for i in x), dtype=np.int64, count=int(bounds[-1]))
        return PieceArrays(flat, spans[:, 0].copy(), spans[:, 1].copy(), bounds)

    def encode_batch_parallel(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
                              processes: int | None = None, chunk_size: int = 2000, **kwargs) -> dict:
        """The tokenizer call: the library already encodes a batch on all cores."""
        return self(list(texts), None if pairs is None else list(pairs), **kwargs)

    def continues_word(self, ids: Sequence[int]) -> list[bool]:
        """Per piece: does it continue the word before it: a "##" piece (WordPiece), or one without the word-start
        mark ("Ġ" byte-level, "▁" Metaspace) that follows a piece that is not special."""
        flags, specials, out, prev = self._continuation, self._special_ids, [], None
        for i in ids:
            out.append(bool(flags[i]) and prev is not None and prev not in specials)
            prev = i
        return out

    def join(self, ids: Sequence[int]) -> str:
        """Pieces back to text by the file's decoder ("Ġ" / "▁" marks become spaces), without clean-up."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=False).strip()

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """Text of ids as the file's decoder makes it (transformers' clean-up where tokenizer_config.json asks)."""
        text = self._backend.decode([int(i) for i in as_id_list(ids)], skip_special_tokens=skip_special_tokens)
        if self._cleanup:
            for dirty, clean in DECODE_CLEANUP:
                text = text.replace(dirty, clean)
        return text


class _Words:
    """Word ids of the library's encodings, read only when BatchEncoding.word_ids asks."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __getitem__(self, i: int) -> tuple[list, list]:
        return self.first[i].word_ids, self.second[i].word_ids if self.second is not None else []


def _template(backend) -> Template:
    """The post-processor's layout, read off what it does to a probe sequence (special_tokens_mask marks what it
    added; the first len(probe) other tokens are a, the rest b)."""
    probe = backend.encode("a", add_special_tokens=False)
    if backend.post_processor is None or not probe.ids:
        return Template.none()
    s_parts, s_types = _split(backend.post_process(probe, None, True), len(probe.ids), 1)
    p_parts, p_types = _split(backend.post_process(probe, probe, True), len(probe.ids), 2)
    return Template(tuple(s_parts), tuple(p_parts), tuple(s_types), tuple(p_types))


def _split(enc, n: int, n_seq: int) -> tuple[list[tuple[int, ...]], list]:
    """(the specials before, between and after the n_seq sequences of n tokens each, [the specials' types, a
    sequence's type, ...]) of a post-processed encoding."""
    parts, types, run, run_types, seen = [], [], [], [], 0
    for tid, ttype, special in zip(enc.ids, enc.type_ids, enc.special_tokens_mask):
        if special:
            run.append(tid)
            run_types.append(ttype)
            continue
        if seen % n == 0:   # the first token of a sequence closes the specials before it
            parts.append(tuple(run))
            types += [tuple(run_types), ttype]
            run, run_types = [], []
        seen += 1
    parts.append(tuple(run))
    types.append(tuple(run_types))
    if seen != n * n_seq:
        raise VocabError(f"post_processor lays out {seen} tokens of sequences where {n * n_seq} were given")
    return parts, types


def _continuation_flags(spec: dict, tokens: list[str]) -> np.ndarray:
    """Per vocab id: does the piece, after a piece that is not special, continue a word (continues_word)."""
    model = spec.get("model") or {}
    prefix = model.get("continuing_subword_prefix")
    if prefix:
        return np.array([t.startswith(prefix) for t in tokens], dtype=bool)
    marks = json.dumps(spec.get("pre_tokenizer"))
    mark = "Ġ" if '"ByteLevel"' in marks else "▁" if '"Metaspace"' in marks else None
    if mark is None:
        return np.zeros(len(tokens), dtype=bool)
    return np.array([not t.startswith(mark) for t in tokens], dtype=bool)


def _apply_config(spec: dict, config: dict) -> None:
    """What transformers' model classes (RobertaTokenizer, BertTokenizer, ...; not the generic
    PreTrainedTokenizerFast) change in the file from tokenizer_config.json: add_prefix_space on the byte-level /
    Metaspace pre-tokenizer and post-processor, do_lower_case and tokenize_chinese_chars on BertNormalizer."""
    if config.get("tokenizer_class") in (None, "PreTrainedTokenizerFast", "TokenizersBackend"):
        return
    space = config.get("add_prefix_space")
    for part in _components(spec.get("pre_tokenizer")) + _components(spec.get("post_processor")):
        if space is not None and part.get("type") in ("ByteLevel", "RobertaProcessing"):
            part["add_prefix_space"] = bool(space)
        if space is not None and part.get("type") == "Metaspace":
            part["prepend_scheme"] = "always" if space else "never"
    bert = {"lowercase": config.get("do_lower_case"), "handle_chinese_chars": config.get("tokenize_chinese_chars")}
    for part in _components(spec.get("normalizer")):
        if part.get("type") == "BertNormalizer":
            part.update({k: bool(v) for k, v in bert.items() if v is not None})


def _components(part) -> list[dict]:
    """A pipeline stage and, for a Sequence, its members."""
    if not isinstance(part, dict):
        return []
    members = part.get("pretokenizers") or part.get("processors") or part.get("normalizers")
    return [part, *(m for m in members or [] if isinstance(m, dict))]
