"""Files the tokenizer reads and writes: vocab.txt (one token per line, id = line number - 1; a bad byte, blank line,
duplicate or missing special token is a VocabError naming file and line), JSON objects and text files (lenient)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from bertkit.errors import VocabError
from bertkit.textfiles import parse_json

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
    if not isinstance(data, dict):
        raise VocabError(f"{path}: expected a JSON object")
    return data
