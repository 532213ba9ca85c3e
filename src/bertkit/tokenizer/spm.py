"""A SentencePiece `.model` file where it is a directory's only tokenizer file (older XLM-R, ALBERT and DeBERTa-v2/v3
uploads): read without the sentencepiece or protobuf packages (bertkit.protobuf reads the few fields needed), and
rebuilt as the `tokenizers` pipeline that encodes as SentencePieceProcessor does (docs/tokenizers.md)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

from bertkit.errors import VocabError
from bertkit.protobuf import Malformed, fields as wire_fields

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4
_UNIGRAM, _BPE = 1, 2
_BERT_LAYOUT = ("[CLS]:0 $A:0 [SEP]:0", "[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1", "[CLS]", "[SEP]", "[MASK]")
# family -> (the file its uploads name, single template, pair template, cls, sep, mask)
_FAMILIES = {
    "xlm-roberta": ("sentencepiece.bpe.model", "<s> $A </s>", "<s> $A </s> </s> $B </s>", "<s>", "</s>", "<mask>"),
    "albert": ("spiece.model", *_BERT_LAYOUT),
    "deberta-v2": ("spm.model", *_BERT_LAYOUT),
}
# what the family's transformers tokenizer does to a text before SentencePiece, where tokenizer_config.json is silent
_FAMILY_DEFAULTS = {"albert": {"do_lower_case": True, "keep_accents": False}, "deberta-v2": {"do_lower_case": False}}
_CLASSES = {"XLMRobertaTokenizer": "xlm-roberta", "AlbertTokenizer": "albert", "DebertaV2Tokenizer": "deberta-v2"}


def sentencepiece_json(path: Path, config: dict, model_type: str | None) -> tuple[str, dict]:
    """(tokenizer.json text, tokenizer config with the family's special tokens) of a `.model` file; the family is
    config.json's model_type, else tokenizer_config.json's tokenizer_class, else the file's name."""
    family = _family(path, config, model_type)
    config = {**_FAMILY_DEFAULTS.get(family, {}), **config}
    _, single, pair, cls, sep, mask = _FAMILIES[family]
    pieces, trainer, normalizer = read_model_proto(path)
    if family == "xlm-roberta":     # fairseq's layout: its own four specials first, spm's ids moved up by one
        pieces = [("<s>", 0.0, _CONTROL), ("<pad>", 0.0, _CONTROL), ("</s>", 0.0, _CONTROL),
                  ("<unk>", 0.0, _UNKNOWN), *pieces[3:]]
        trainer["unk"] = 3
    if mask not in {p[0] for p in pieces}:
        pieces.append((mask, 0.0, _CONTROL))
    specials = {cls, sep, mask, *(p[0] for p in pieces if p[2] in (_CONTROL, _UNKNOWN))}
    tok = _pipeline(pieces, trainer, normalizer, specials, _family_normalizers(path, family, config))
    ids = {p[0]: i for i, p in enumerate(pieces)}
    from tokenizers import processors
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                       special_tokens=[(cls, ids[cls]), (sep, ids[sep])])
    names = {"cls_token": cls, "sep_token": sep, "mask_token": mask, "unk_token": pieces[trainer["unk"]][0],
             "pad_token": next((t for t in ("<pad>", "[PAD]") if t in ids), None)}
    if family == "xlm-roberta":
        names.update(bos_token="<s>", eos_token="</s>")
    return tok.to_str(), {**{k: v for k, v in names.items() if v}, **config}


def _family(path: Path, config: dict, model_type: str | None) -> str:
    family = model_type if model_type in _FAMILIES else _CLASSES.get(config.get("tokenizer_class"))
    family = family or next((f for f, spec in _FAMILIES.items() if spec[0] == path.name), None)
    if family is None:
        raise VocabError(f"{path}: a SentencePiece model of no family bertkit knows (model_type {model_type!r}); "
                         f"the families whose .model files load: {', '.join(_FAMILIES)}")
    return family


def _family_normalizers(path: Path, family: str, config: dict) -> list:
    """What the family's transformers tokenizer does to a text before SentencePiece sees it, as tokenizer_config.json
    sets it: AlbertTokenizer lowercases and strips accents by default, DebertaV2Tokenizer lowercases where
    do_lower_case says so; XLMRobertaTokenizer does neither."""
    from tokenizers import normalizers

    for name in _FAMILY_DEFAULTS.get(family, {}):
        if not isinstance(config[name], (bool, type(None))):    # "maybe" would read as True; null reads as false,
                                                                  # as transformers' tokenizers read it
            raise VocabError(f"{path.parent / 'tokenizer_config.json'}: {name} must be true or false, "
                             f"got {str(config[name])[:40]!r}")
    steps = []
    if family == "albert":
        steps += [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
        if not config["keep_accents"]:
            steps += [normalizers.NFKD(), normalizers.StripAccents()]
    if family in _FAMILY_DEFAULTS and config["do_lower_case"]:
        steps.append(normalizers.Lowercase())
    return steps


def _pipeline(pieces: list, trainer: dict, spec: dict, specials: set, family_steps: list):
    """The `tokenizers` pipeline that segments as SentencePieceProcessor (docs/tokenizers.md), after the family's own
    normalizers."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    user = [p[0] for p in pieces if p[2] == _USER_DEFINED and p[0] not in specials]
    if trainer["model_type"] == _UNIGRAM:
        tok = Tokenizer(models.Unigram([(p, s) for p, s, _ in pieces], trainer["unk"], trainer["byte_fallback"]))
    else:
        vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
        tok = Tokenizer(models.BPE(vocab, _merges(pieces), unk_token=pieces[trainer["unk"]][0], fuse_unk=True,
                                   byte_fallback=trainer["byte_fallback"], ignore_merges=bool(user)))
    steps = list(family_steps)
    if spec["charsmap"]:
        steps.append(normalizers.Precompiled(spec["charsmap"]))
    if spec["remove_extra_whitespaces"]:   # spaces only: SentencePiece leaves newlines and tabs to the charsmap
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec["escape_whitespaces"]:
        steps.append(normalizers.Replace(" ", "▁"))
    if spec["add_dummy_prefix"]:   # Metaspace adds no dummy "▁" before a text that starts with one; SentencePiece does
        steps.append(normalizers.Replace(Regex(r"\A▁"), "▁▁"))
    tok.normalizer = normalizers.Sequence(steps)
    pre = [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)] \
        if spec["add_dummy_prefix"] else []
    if user:    # SentencePiece emits a user-defined piece whole, never merged with its neighbours
        pattern = "|".join(re.escape(p) for p in sorted(user, key=len, reverse=True))
        pre.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    if pre:
        tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always" if spec["add_dummy_prefix"] else "never")
    tok.add_special_tokens([AddedToken(p[0], normalized=False, special=True) for p in pieces if p[0] in specials])
    return tok


def _merges(pieces: list) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece BPE model: every split of a normal piece into two normal pieces, the merged
    piece's score ranking it (higher first, then its id), as SentencePiece merges by score."""
    normal = {p: (s, i) for i, (p, s, t) in enumerate(pieces) if t == _NORMAL}
    ranked = sorted((-score, i, piece[:k], piece[k:]) for piece, (score, i) in normal.items()
                    for k in range(1, len(piece)) if piece[:k] in normal and piece[k:] in normal)
    return [(left, right) for _, _, left, right in ranked]


def read_model_proto(path: Path) -> tuple[list[tuple[str, float, int]], dict, dict]:
    """(pieces as (piece, score, type), trainer settings, normalizer settings) of a `.model` file; VocabError naming
    the file where it is not a SentencePiece model."""
    try:    # a scalar field's last value wins, as protobuf reads it (dict keeps the last)
        model = list(wire_fields(path.read_bytes()))
        pieces = []
        for raw in (value for number, value in model if number == 1):
            f = dict(wire_fields(raw))
            score = struct.unpack("<f", f.get(2, 0).to_bytes(4, "little"))[0]
            pieces.append((f.get(1, b"").decode("utf-8"), score, f.get(3, _NORMAL)))
        trainer, norm = (dict(wire_fields(dict(model).get(n, b""))) for n in (2, 3))
    except (Malformed, struct.error, UnicodeDecodeError, TypeError, AttributeError, OverflowError):
        raise VocabError(f"{path}: not a SentencePiece model file (its protobuf does not parse)") from None
    except OSError as e:
        raise VocabError(f"{path}: cannot read: {e.strerror}") from None
    unk = trainer.get(40, 0)
    unk = unk - (1 << 64) if unk >= 1 << 63 else unk    # an int32 written as a 64-bit two's complement varint
    if not pieces or not 0 <= unk < len(pieces) or trainer.get(3, _UNIGRAM) not in (_UNIGRAM, _BPE):
        raise VocabError(f"{path}: not a Unigram or BPE SentencePiece model with its pieces and unk id")
    settings = {"model_type": trainer.get(3, _UNIGRAM), "unk": unk, "byte_fallback": bool(trainer.get(35, 0))}
    normalizer = {"charsmap": norm.get(2, b""), "add_dummy_prefix": bool(norm.get(3, 1)),
                  "remove_extra_whitespaces": bool(norm.get(4, 1)), "escape_whitespaces": bool(norm.get(5, 1))}
    return pieces, settings, normalizer

