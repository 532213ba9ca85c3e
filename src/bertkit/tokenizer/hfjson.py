"""The files of HF-format model directories: vocab.txt (one token per line, id = line number - 1; a bad byte, blank
line, duplicate or missing special token is a VocabError naming file and line), tokenizer.json, tokenizer_config.json,
special_tokens_map.json. tokenizer.json is read and written here for BERT's own pipeline (WordPiece, BertNormalizer,
BertPreTokenizer, [CLS] A [SEP] (B [SEP])); is_bert_pipeline says whether a directory is it; any other is
library.py's."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from bertkit.atomic import write_json, write_text
from bertkit.errors import VocabError
from bertkit.textfiles import check_fields, parse_json
from bertkit.tokenizer.inputs import SIDES
from bertkit.tokenizer.wordpiece import MAX_INPUT_CHARS_PER_WORD

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """Read a vocab.txt (one token per line, id = line number - 1). Raises VocabError naming file and line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise VocabError(f"{path}: vocab file not found") from None
    except IsADirectoryError:
        raise VocabError(f"{path}: is a directory, expected a vocab.txt (or use Tokenizer.from_pretrained)") from None
    except OSError as e:
        raise VocabError(f"{path}: cannot read vocab file: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise VocabError(f"{path}:{line}: invalid UTF-8 at byte offset {e.start}") from None
    if not text.strip():
        raise VocabError(f"{path}: vocab file is empty")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline
    vocab: dict[str, int] = {}
    for i, line in enumerate(lines):
        token = line.rstrip("\r")
        if token == "" or token != token.strip():
            raise VocabError(f"{path}:{i + 1}: blank line or token with surrounding whitespace: {line!r}")
        if token in vocab:
            raise VocabError(f"{path}:{i + 1}: duplicate entry {token!r} (first on line {vocab[token] + 1})")
        vocab[token] = i
    _check_specials(vocab, str(path))
    return vocab


def check_vocab_dict(vocab: dict[str, int]) -> dict[str, int]:
    """A copy of a vocab given as a dict, checked as load_vocab checks a file (VocabError)."""
    vocab = dict(vocab)
    if any(not isinstance(i, int) or isinstance(i, bool) for i in vocab.values()):
        raise VocabError("vocab dict: ids must be integers")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise VocabError("vocab dict: ids must be exactly 0..len-1, each once")
    if any(not isinstance(t, str) or not t or t != t.strip() for t in vocab):
        raise VocabError("vocab dict: tokens must be non-empty strings without surrounding whitespace")
    _check_specials(vocab, "vocab dict")
    return vocab


def _check_specials(vocab: dict[str, int], where: str) -> None:
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise VocabError(f"{where}:{len(vocab) + 1}: vocab lacks the special token(s) {', '.join(missing)} "
                         f"(checked to the end of the file, line {len(vocab)})")


def vocab_hash(tokens: list[str]) -> str:
    """sha256 of the vocab.txt that holds tokens (in id order)."""
    return hashlib.sha256(("\n".join(tokens) + "\n").encode("utf-8")).hexdigest()


def read_text_file(path: str | os.PathLike) -> str:
    """Read a text file under the tokenizer's policy: UTF-8, each invalid byte -> U+FFFD, which cleaning then drops
    (as BERT does), so offsets index the decoded text."""
    return Path(path).read_bytes().decode("utf-8", errors="replace")


def read_json_object(path: Path) -> dict:
    """A JSON file holding an object (tokenizer.json, tokenizer_config.json, ...); VocabError naming the file."""
    try:
        data = parse_json(path.read_bytes(), str(path), VocabError)
    except OSError as e:
        raise VocabError(f"{path}: cannot read: {e.strerror}") from None
    check_fields(data, {}, str(path), VocabError)
    return data


# what transformers writes for "no limit"; bertkit reads anything this large as None
NO_LIMIT = int(1e30)
# the WordPiece model bertkit runs, as tokenizer.json's "model" names it (less its vocab)
_WORDPIECE = {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": MAX_INPUT_CHARS_PER_WORD}
_SPECIAL_FIELDS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                   "mask_token": "[MASK]"}


def read_model_dir(path: Path) -> tuple[Path | dict[str, int], dict]:
    """The vocab (vocab.txt's path, else tokenizer.json's token -> id) of a model directory and the Tokenizer
    options its files set; tokenizer_config.json overrides tokenizer.json, as in transformers."""
    vocab_file, json_file = path / "vocab.txt", path / "tokenizer.json"
    if vocab_file.is_file():
        vocab, kwargs = vocab_file, {}
    elif json_file.is_file():
        vocab, kwargs = read_structured(json_file, read_tokenizer_json)
    else:
        raise VocabError(f"{path}: model directory has no vocab.txt and no tokenizer.json")
    map_file = path / "special_tokens_map.json"
    if map_file.is_file():
        read_structured(map_file, lambda f: _check_bert_config(f, read_json_object(f)))
    cfg_file = path / "tokenizer_config.json"
    if cfg_file.is_file():
        kwargs.update(read_structured(cfg_file, _read_config))
    return vocab, kwargs


def is_bert_pipeline(path: Path) -> bool:
    """Is this model directory BERT's WordPiece pipeline, read exactly by bertkit's Tokenizer: a tokenizer.json of that
    pipeline (or vocab.txt alone) and BERT's special tokens in its configs? Unreadable files count as BERT's, so that
    the Tokenizer reports them."""
    json_file = path / "tokenizer.json"
    if not json_file.is_file():     # vocab.txt, or nothing: the Tokenizer reads it or names what is missing
        return (path / "vocab.txt").is_file() or not any(path.glob("*.model"))
    try:
        read_tokenizer_json(json_file)
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            if (path / name).is_file():
                _check_bert_config(path / name, read_json_object(path / name))
    except VocabError as e:
        return any(m in str(e) for m in ("not valid JSON", "JSON nested too deeply", "cannot read"))
    except (AttributeError, TypeError, KeyError, ValueError, IndexError):
        return False
    return True


def read_structured(path: Path, read):
    """read(path), with a member of an unexpected JSON type (a list where an object belongs, ...) reported as one
    VocabError line naming the file rather than whatever the access raised."""
    try:
        return read(path)
    except VocabError:
        raise
    except (AttributeError, TypeError, KeyError, ValueError, IndexError) as e:
        raise VocabError(f"{path}: malformed or unsupported tokenizer file ({type(e).__name__}: "
                         f"{str(e)[:100]})") from None


def _read_config(cfg_file: Path) -> dict:
    """The Tokenizer options a tokenizer_config.json sets (do_lower_case, strip_accents, model_max_length)."""
    cfg = read_json_object(cfg_file)
    _check_bert_config(cfg_file, cfg)
    kwargs = {"model_max_length": read_max_length(cfg)}
    for name in ("do_lower_case", "strip_accents"):     # "maybe" would read as True
        if not isinstance(cfg.get(name, False), (bool, type(None))):
            raise VocabError(f"{cfg_file}: {name} must be true, false or null, got {str(cfg[name])[:40]!r}")
    if "do_lower_case" in cfg:
        kwargs["lowercase"] = bool(cfg["do_lower_case"])
    if cfg.get("strip_accents") is not None:
        kwargs["strip_accents"] = bool(cfg["strip_accents"])
    return {**kwargs, **read_sides(cfg, cfg_file)}


def read_max_length(cfg: dict) -> int | None:
    """A tokenizer config's model_max_length; None for transformers' 1e30 ("no limit")."""
    mml = cfg.get("model_max_length")
    return mml if isinstance(mml, int) and 0 < mml < 1_000_000 else None


def read_sides(cfg: dict, where) -> dict[str, str]:
    """padding_side and truncation_side where a tokenizer config sets them ("right" or "left", as transformers reads
    them); VocabError naming the file, field and value otherwise."""
    sides = {name: cfg[name] for name in ("padding_side", "truncation_side") if cfg.get(name) is not None}
    for name, side in sides.items():
        if side not in SIDES:
            raise VocabError(f"{where}: {name} must be \"right\" or \"left\", got {json.dumps(side)[:40]}")
    return sides


def _check_bert_config(path: Path, cfg: dict) -> None:
    """bertkit's special tokens are fixed and CJK is always isolated: a file asking otherwise cannot be honoured."""
    if cfg.get("tokenize_chinese_chars", True) is not True:
        raise _unsupported(path, "tokenize_chinese_chars", cfg["tokenize_chinese_chars"])
    for field, expected in _SPECIAL_FIELDS.items():
        value = cfg.get(field, expected)
        content = value.get("content") if isinstance(value, dict) else value
        if content != expected:
            raise _unsupported(path, field, value)
    for field in ("additional_special_tokens", "extra_special_tokens"):
        extra = [t for t in (cfg.get(field) or []) if (t.get("content") if isinstance(t, dict) else t)
                 not in SPECIAL_TOKENS]
        if extra:
            raise _unsupported(path, field, extra)


def write_model_dir(directory: Path, vocab: dict[str, int], tokens: list[str], lowercase: bool,
                    strip_accents: bool, model_max_length: int | None, sides: dict) -> tuple[Path, ...]:
    """Write vocab.txt, tokenizer.json and tokenizer_config.json into directory (created); returns the files."""
    spec = tokenizer_json(vocab, lowercase, strip_accents)
    cfg = {"do_lower_case": lowercase, "strip_accents": None if strip_accents == lowercase else strip_accents,
           "tokenize_chinese_chars": True, **_SPECIAL_FIELDS, "tokenizer_class": "BertTokenizer",
           "model_max_length": NO_LIMIT if model_max_length is None else model_max_length,
           "vocab_hash": vocab_hash(tokens), **sides}
    return write_files(directory, {"vocab.txt": "\n".join(tokens) + "\n",
                                   "tokenizer.json": json.dumps(spec, indent=2, ensure_ascii=False) + "\n",
                                   "tokenizer_config.json": cfg})


def write_files(directory: Path, files: dict[str, str | dict]) -> tuple[Path, ...]:
    """Write each file (text, or an object as JSON) into directory (created); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        (write_text if isinstance(body, str) else write_json)(directory / name, body)
    return tuple(directory / name for name in files)


def _unsupported(path: Path, field: str, value) -> VocabError:
    return VocabError(f"{path}: {field} = {json.dumps(value)[:80]} is not supported by bertkit's tokenizer "
                      f"(it runs WordPiece with BertNormalizer, BertPreTokenizer and [CLS]/[SEP])")


def read_tokenizer_json(path: Path) -> tuple[dict[str, int], dict]:
    """The vocab of a tokenizer.json and the Tokenizer options (lowercase, strip_accents) its normalizer sets."""
    data = read_json_object(path)
    vocab = _read_model(path, data.get("model"))
    options = _read_normalizer(path, data.get("normalizer"))
    pre = data.get("pre_tokenizer")
    if pre is not None and pre.get("type") == "Sequence" and len(pre.get("pretokenizers") or []) == 1:
        pre = pre["pretokenizers"][0]
    if not isinstance(pre, dict) or pre.get("type") != "BertPreTokenizer":
        raise _unsupported(path, "pre_tokenizer", pre)
    _check_post_processor(path, data.get("post_processor"), vocab)
    for i, added in enumerate(data.get("added_tokens") or []):
        content = added.get("content") if isinstance(added, dict) else None
        if content not in SPECIAL_TOKENS or vocab.get(content) != added.get("id"):
            raise _unsupported(path, f"added_tokens[{i}]", added)
    return vocab, options


def _read_model(path: Path, model) -> dict[str, int]:
    if not isinstance(model, dict):
        raise _unsupported(path, "model.type", model)
    for field, value in _WORDPIECE.items():
        if model.get(field, value) != value:
            raise _unsupported(path, f"model.{field}", model[field])
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise VocabError(f"{path}: model.vocab must be an object of token -> id")
    try:
        return check_vocab_dict(vocab)
    except VocabError as e:
        raise VocabError(f"{path}: model.{e}") from None


def _read_normalizer(path: Path, normalizer) -> dict:
    field = "normalizer"
    if isinstance(normalizer, dict) and normalizer.get("type") == "Sequence":
        parts = normalizer.get("normalizers") or []
        if len(parts) != 1:
            raise _unsupported(path, "normalizer.normalizers", parts)
        normalizer, field = parts[0], "normalizer.normalizers[0]"
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        raise _unsupported(path, field, normalizer)
    for flag in ("clean_text", "handle_chinese_chars"):
        if normalizer.get(flag, True) is not True:
            raise _unsupported(path, f"{field}.{flag}", normalizer[flag])
    options = {"lowercase": bool(normalizer.get("lowercase", True))}
    if normalizer.get("strip_accents") is not None:
        options["strip_accents"] = bool(normalizer["strip_accents"])
    return options


def _check_post_processor(path: Path, post, vocab: dict[str, int]) -> None:
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    if isinstance(post, dict) and post.get("type") == "BertProcessing":
        if list(post.get("cls") or []) != ["[CLS]", cls] or list(post.get("sep") or []) != ["[SEP]", sep]:
            raise _unsupported(path, "post_processor", post)
        return
    if not isinstance(post, dict) or post.get("type") != "TemplateProcessing":
        raise _unsupported(path, "post_processor", post)
    if [_template(post.get("single")), _template(post.get("pair"))] != [_template(t) for t in _bert_templates()]:
        raise _unsupported(path, "post_processor", {k: post.get(k) for k in ("single", "pair")})
    for name, info in (post.get("special_tokens") or {}).items():
        if info.get("ids") != [vocab.get(name)]:
            raise _unsupported(path, f"post_processor.special_tokens.{name}", info)


def _template(items) -> list[tuple]:
    """A template as comparable (kind, id, type_id) rows."""
    return [(kind, body.get("id"), body.get("type_id", 0)) for item in items or [] for kind, body in item.items()]


def _bert_templates() -> tuple[list[dict], list[dict]]:
    """[CLS] A [SEP] and [CLS] A [SEP] B [SEP] (types 0, then 1 from B) as TemplateProcessing writes them."""
    def part(kind: str, name: str, type_id: int) -> dict:
        return {kind: {"id": name, "type_id": type_id}}
    single = [part("SpecialToken", "[CLS]", 0), part("Sequence", "A", 0), part("SpecialToken", "[SEP]", 0)]
    return single, [*single, part("Sequence", "B", 1), part("SpecialToken", "[SEP]", 1)]


def tokenizer_json(vocab: dict[str, int], lowercase: bool, strip_accents: bool) -> dict:
    """The tokenizer.json object of a bertkit Tokenizer (loadable by tokenizers.Tokenizer.from_file)."""
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in SPECIAL_TOKENS]
    single, pair = _bert_templates()
    post = {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {t: {"id": t, "ids": [vocab[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")}}
    normalizer = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                  "strip_accents": None if strip_accents == lowercase else strip_accents, "lowercase": lowercase}
    model = {**_WORDPIECE, "vocab": vocab}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": post,
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True}, "model": model}
