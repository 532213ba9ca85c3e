"""Files the tokenizer reads and writes: vocab.txt (one token per line, id = line number - 1), an HF-format model
directory (vocab.txt + tokenizer_config.json), and text files.

A vocab is structure, not text: it must be valid UTF-8, and a bad byte, a blank line, a duplicate entry or a missing
special token raises VocabError naming the file and line. Text files are decoded leniently (see read_text_file).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from bertkit.errors import VocabError

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


def read_model_dir(path: Path) -> tuple[Path, dict]:
    """The vocab.txt of an HF-format model directory and the Tokenizer options its tokenizer_config.json sets
    (do_lower_case, strip_accents, model_max_length)."""
    vocab_file = path / "vocab.txt"
    if not vocab_file.is_file():
        raise VocabError(f"{path}: model directory has no vocab.txt")
    kwargs = {}
    cfg_file = path / "tokenizer_config.json"
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise VocabError(f"{cfg_file}: not valid JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise VocabError(f"{cfg_file}: expected a JSON object")
        if "do_lower_case" in cfg:
            kwargs["lowercase"] = bool(cfg["do_lower_case"])
        if cfg.get("strip_accents") is not None:
            kwargs["strip_accents"] = bool(cfg["strip_accents"])
        mml = cfg.get("model_max_length")
        if isinstance(mml, int) and 0 < mml < 1_000_000:  # HF writes 1e30 for "no limit"
            kwargs["model_max_length"] = mml
    return vocab_file, kwargs


def write_model_dir(directory: Path, tokens: list[str], lowercase: bool, strip_accents: bool,
                    model_max_length: int | None) -> Path:
    """Write vocab.txt and an HF-compatible tokenizer_config.json into directory (created); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    cfg = {"do_lower_case": lowercase, "strip_accents": None if strip_accents == lowercase else strip_accents,
           "tokenize_chinese_chars": True, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
           "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenizer_class": "BertTokenizer",
           "vocab_hash": vocab_hash(tokens)}
    if model_max_length is not None:
        cfg["model_max_length"] = model_max_length
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return directory
