"""WordPiece vocabulary training from raw text files (byte-level BPE and Unigram: learn_library_vocab, which streams
the same files into the `tokenizers` library's trainers: train_library_vocab).

    from bertkit import train_vocab
    tok = train_vocab(["corpus/*.txt", "more.txt.gz"], vocab_size=30_000)   # -> bertkit Tokenizer
    tok.save("my-bert/")                                                    # vocab.txt + tokenizer_config.json

Three passes, only the first reading the corpus (docs/tokenizers.md, "How WordPiece training works"): count words
with the tokenizer's own basic_tokenize, streaming, the word table bounded by pruning the rarest; every character
seen and its ## form; then BPE-like frequency-driven pair merges until vocab_size. Bad input raises DataError naming
the file or pattern; impossible settings raise ConfigError naming the value.
"""

from __future__ import annotations

import codecs
import glob as _glob
import gzip
import zlib
import heapq
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from bertkit.errors import BertkitError, ConfigError, DataError
from bertkit.options import with_options
from bertkit.progress import bar as progress_bar
from bertkit.tokenizer import MAX_INPUT_CHARS_PER_WORD, SPECIAL_TOKENS, Tokenizer
from bertkit.tokenizer.library import LibraryTokenizer

__all__ = ["SPECIAL_TOKENS", "VocabTrainingConfig", "VocabTrainingResult", "train_vocab", "learn_vocab",
           "count_words", "learn_wordpieces", "expand_files", "iter_text", "tokenizer_from_tokens"]

_LIBRARY_MODELS = ("bpe", "unigram")
_LIBRARY_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")   # RoBERTa's ids 0-4
_CHUNK_BYTES = 1 << 20  # longest piece of a line decoded at once: bounds memory on files without newlines
_PREFIX = "##"


@dataclass
class VocabTrainingConfig:
    vocab_size: int = 30_522          # bert-base's size; the result has exactly this many entries if the corpus allows
    lowercase: bool = True            # uncased (lowercase + strip accents), like bert-base-uncased
    min_frequency: int = 2            # a pair seen once is noise, not a piece (HF's BertWordPieceTokenizer default)
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS
    limit_alphabet: int | None = None  # None keeps every character seen: full coverage, no [UNK] on the corpus
    max_word_chars: int = MAX_INPUT_CHARS_PER_WORD  # BERT encodes longer words as [UNK]: they do not train
    # word-table cap (the rarest words are pruned beyond it): memory bounded at any corpus size; docs/performance.md
    max_distinct_words: int = 1_000_000

    def validate(self) -> None:
        for name, least, what in (("vocab_size", 1, "a positive integer"), ("min_frequency", 0, "an integer >= 0"),
                                  ("max_distinct_words", 2, "an integer >= 2"),
                                  ("max_word_chars", 1, "a positive integer")):
            value = getattr(self, name)
            if not isinstance(value, int) or value < least:
                raise ConfigError(f"{name} must be {what}, got {value!r}")
        if self.limit_alphabet is not None and (not isinstance(self.limit_alphabet, int) or self.limit_alphabet < 1):
            raise ConfigError(f"limit_alphabet must be a positive integer or None, got {self.limit_alphabet!r}")
        specials = list(self.special_tokens)
        for s in specials:
            if not isinstance(s, str) or not s or any(ch.isspace() for ch in s):
                raise ConfigError(f"special token {s!r} must be a non-empty string without whitespace")
        dup = sorted({s for s in specials if specials.count(s) > 1})
        if dup:
            raise ConfigError(f"special_tokens has duplicates: {dup}")
        missing = [s for s in SPECIAL_TOKENS if s not in specials]   # the Tokenizer finds all five by name
        if missing:
            raise ConfigError(f"special_tokens must include {list(SPECIAL_TOKENS)}; missing {missing}")


@dataclass
class VocabTrainingResult:
    tokens: list[str]                  # the vocabulary in id order
    lowercase: bool
    stats: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- reading the corpus

def expand_files(files: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Paths and glob patterns -> existing files, in the given order (each glob sorted). Raises DataError naming a
    path that is missing, a directory, or a pattern that matches nothing."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    out: list[Path] = []
    for spec in files:
        if not isinstance(spec, (str, os.PathLike)):
            raise TypeError(f"files must be paths or glob patterns, got {type(spec).__name__}: {spec!r}")
        s = os.fspath(spec)
        if _glob.has_magic(s):
            matches = sorted(p for p in _glob.glob(os.path.expanduser(s), recursive=True) if os.path.isfile(p))
            if not matches:
                raise DataError(f"{s}: the pattern matches no file")
            out.extend(Path(p) for p in matches)
            continue
        p = Path(s).expanduser()
        if not p.exists():
            raise DataError(f"{s}: no such file")
        if p.is_dir():
            raise DataError(f"{s}: is a directory (give files or a glob such as {os.path.join(s, '*.txt')})")
        out.append(p)
    if not out:
        raise DataError("no training files given")
    return out


def iter_text(path: Path, on_bytes: Callable[[int], None] | None = None) -> Iterator[str]:
    """The decoded text of `path` in chunks of O(_CHUNK_BYTES): whole lines, or pieces of a very long line cut after
    a space. `on_bytes(n)` gets the (compressed) bytes read since its last call, for progress bars."""
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise DataError(f"{path}: cannot open ({e.strerror or e})") from None
    f = gzip.GzipFile(fileobj=raw, mode="rb") if path.suffix == ".gz" else raw
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # the tokenizer's text-file policy
    line_no, carry, last_pos = 1, "", 0
    try:
        while True:
            try:
                chunk = f.readline(_CHUNK_BYTES)
            except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
                raise DataError(f"{path}:{line_no}: cannot read ({e})") from None
            final = not chunk
            text = decoder.decode(chunk, final=final)
            if on_bytes is not None:
                pos = raw.tell()
                on_bytes(pos - last_pos)
                last_pos = pos
            text = carry + text
            carry = ""
            if final:
                if text:
                    yield text
                return
            if text.endswith("\n"):
                line_no += 1
                yield text
            else:  # a piece of a long line: cut after the last space so no word is split
                cut = max(text.rfind(" "), text.rfind("\t"))
                if cut < 0 and len(text) < 4 * _CHUNK_BYTES:
                    carry = text  # one enormous word so far; keep reading (bounded: flushed at 4 chunks)
                elif cut < 0:
                    yield text
                else:
                    carry = text[cut + 1:]
                    yield text[:cut + 1]
    finally:
        f.close()
        raw.close()


# ----------------------------------------------------------------------------------------------------- word counts

def _fold_chars(words: Iterable[tuple[str, int]], char_counts: Counter, skip: frozenset[str]) -> None:
    for word, n in words:
        if word in skip:
            continue
        for ch in word:
            char_counts[ch] += n


def _prune(counts: Counter, char_counts: Counter, target: int, skip: frozenset[str]) -> int:
    """Drop every word with count <= t for the smallest t that leaves at most `target` words; return how many were
    dropped. Their characters are folded into `char_counts` first, so coverage is unaffected."""
    histogram = Counter(counts.values())
    keep, t = len(counts), 0
    for c in sorted(histogram):
        if keep <= target:
            break
        keep -= histogram[c]
        t = c
    dropped = [(w, n) for w, n in counts.items() if n <= t]
    _fold_chars(dropped, char_counts, skip)
    for w, _ in dropped:
        del counts[w]
    return len(dropped)


def count_words(texts: Iterable[str], basic_tokenize: Callable[[str], list[str]], max_distinct_words: int,
                special_tokens: Iterable[str] = SPECIAL_TOKENS, stats: dict | None = None) -> tuple[Counter, Counter]:
    """Stream `texts` through `basic_tokenize` into (word counts, character counts), the word table bounded by
    `max_distinct_words` (docs/tokenizers.md). Special tokens found verbatim are not counted."""
    skip = frozenset(special_tokens)
    counts: Counter = Counter()
    char_counts: Counter = Counter()
    n_words = n_pruned = prune_rounds = n_replaced = 0
    for text in texts:
        n_replaced += text.count("\ufffd")
        words = basic_tokenize(text)
        n_words += len(words)
        counts.update(words)
        if len(counts) > max_distinct_words:
            n_pruned += _prune(counts, char_counts, max_distinct_words // 2, skip)
            prune_rounds += 1
    for s in skip:
        n_words -= counts.pop(s, 0)
    _fold_chars(counts.items(), char_counts, skip)
    if stats is not None:
        stats.update(words_seen=n_words, distinct_words=len(counts), pruned_words=n_pruned, prune_rounds=prune_rounds,
                     replacement_chars=n_replaced)
    return counts, char_counts


# ---------------------------------------------------------------------------------------------------------- merges

def _merge_word(syms: tuple[int, ...], a: int, b: int, new: int) -> tuple[int, ...]:
    out, i, n = [], 0, len(syms)
    while i < n:
        if i + 1 < n and syms[i] == a and syms[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(syms[i])
            i += 1
    return tuple(out)


def _alphabet(char_counts: dict[str, int], limit_alphabet: int | None) -> list[str]:
    """Every character (or the `limit_alphabet` most frequent), sorted by code point for stable ids."""
    chars = sorted(char_counts)
    if limit_alphabet is not None and len(chars) > limit_alphabet:
        chars = sorted(sorted(char_counts, key=lambda c: (-char_counts[c], c))[:limit_alphabet])
    return chars


def _base_vocabulary(chars: list[str], config: VocabTrainingConfig) -> list[str]:
    """The special tokens, then every character, then its ## form; ConfigError if vocab_size has no room for them."""
    tokens: list[str] = list(config.special_tokens)
    for piece in [*chars, *(_PREFIX + c for c in chars)]:
        if piece not in tokens:  # a special token could be a single char / ##char in principle
            tokens.append(piece)
    if config.vocab_size < len(tokens):
        raise ConfigError(
            f"vocab_size={config.vocab_size} is smaller than the {len(config.special_tokens)} special tokens + "
            f"{len(chars)} characters x 2 (with their ## forms) = {len(tokens)}; use vocab_size >= {len(tokens)}"
            + ("" if config.limit_alphabet else " or set limit_alphabet"))
    return tokens


def _trainable_words(word_counts: dict[str, int], token_id: dict[str, int], chars: list[str],
                     config: VocabTrainingConfig) -> tuple[list[tuple[int, ...]], list[int]]:
    """Each distinct word that takes part in merges as piece ids (first char, then ##chars), and its count."""
    alphabet = set(chars)
    words: list[tuple[int, ...]] = []
    freqs: list[int] = []
    for w, n in word_counts.items():
        if (len(w) < 2 or len(w) > config.max_word_chars
                or (config.limit_alphabet is not None and not alphabet.issuperset(w))):
            continue  # single chars have no pairs; over-long words encode as [UNK]
        words.append((token_id[w[0]], *(token_id[_PREFIX + c] for c in w[1:])))
        freqs.append(n)
    return words, freqs


class _PairMerges:
    """The words as piece-id tuples with the counts of their adjacent pairs (weighted by word frequency), updated merge
    by merge. pair -> indices of the words holding it is append-only (a stale entry is skipped when visited): memory
    O(total symbols), not a set per pair. The heap of (-count, a, b) is lazy: a stale count is re-queued when popped."""

    def __init__(self, words: list[tuple[int, ...]], freqs: list[int]):
        self.words, self.freqs = words, freqs
        pair_counts: dict[tuple[int, int], int] = defaultdict(int)
        where: dict[tuple[int, int], list[int]] = defaultdict(list)
        for wi, syms in enumerate(words):
            f = freqs[wi]
            for p in zip(syms, syms[1:]):
                pair_counts[p] += f
                where[p].append(wi)
        self.pair_counts, self.where = pair_counts, where
        self.heap = [(-c, a, b) for (a, b), c in pair_counts.items()]
        heapq.heapify(self.heap)

    def pop_best(self) -> tuple[tuple[int, int], int] | None:
        """The most frequent pair and its count (ties: the lower piece ids), or None when no pair is left."""
        heap, pair_counts = self.heap, self.pair_counts
        while heap:
            negc, a, b = heapq.heappop(heap)
            count = pair_counts.get((a, b), 0)
            if count == -negc:
                return (a, b), count
            if count > 0:  # stale entry: re-queue with the true (lower) count
                heapq.heappush(heap, (-count, a, b))
        return None

    def merge(self, a: int, b: int, new: int) -> None:
        """Replace (a, b) by `new` in the words that hold it: only their pairs change."""
        words, freqs, pair_counts, where = self.words, self.freqs, self.pair_counts, self.where
        grown: set[tuple[int, int]] = set()   # pairs next to the new piece: counts can only have grown
        shrunk: set[tuple[int, int]] = set()  # pairs that lost occurrences: counts may have reached zero
        for wi in where.pop((a, b)):
            syms = words[wi]
            merged = _merge_word(syms, a, b, new)
            if len(merged) == len(syms):  # listed twice, already merged
                continue
            f = freqs[wi]
            for p in zip(syms, syms[1:]):
                pair_counts[p] -= f
                shrunk.add(p)
            for p in zip(merged, merged[1:]):
                pair_counts[p] += f
                if p[0] == new or p[1] == new:
                    where[p].append(wi)
                    grown.add(p)
            words[wi] = merged
        for p in shrunk:
            if pair_counts[p] <= 0:
                del pair_counts[p]
                where.pop(p, None)
        for p in grown:  # queue the true counts of the pairs that grew
            heapq.heappush(self.heap, (-pair_counts[p], p[0], p[1]))


def _merge_until_full(pairs: _PairMerges, tokens: list[str], token_id: dict[str, int], config: VocabTrainingConfig,
                      progress: bool) -> tuple[int, str]:
    """Merge the best pair into a new piece (appended to `tokens` and `token_id`) until vocab_size, min_frequency or
    no pair left stops it; returns the number of merges and why it stopped."""
    budget = config.vocab_size - len(tokens)
    n_merges = 0
    stop_reason = "vocab_size reached"
    with progress_bar(total=budget, desc="merges", unit="piece", show=progress and budget > 0) as bar:
        while len(tokens) < config.vocab_size:
            best = pairs.pop_best()
            if best is None:
                stop_reason = "no pairs left"
                break
            (a, b), count = best
            if count < config.min_frequency:
                stop_reason = f"best pair count {count} < min_frequency {config.min_frequency}"
                break
            new_piece = tokens[a] + tokens[b][len(_PREFIX):]
            new = token_id.get(new_piece)
            if new is None:  # the same string could arise from two different pairs; it is one piece
                new = len(tokens)
                tokens.append(new_piece)
                token_id[new_piece] = new
                bar.update(1)
            n_merges += 1
            pairs.merge(a, b, new)
    return n_merges, stop_reason


def learn_wordpieces(word_counts: dict[str, int], char_counts: dict[str, int], config: VocabTrainingConfig,
                     progress: bool = False, stats: dict | None = None) -> list[str]:
    """The vocabulary (in id order) learned from word counts by frequency-driven pair merges (docs/tokenizers.md).
    Uses config's vocab_size, special_tokens, min_frequency, limit_alphabet and max_word_chars."""
    chars = _alphabet(char_counts, config.limit_alphabet)
    tokens = _base_vocabulary(chars, config)
    base_size = len(tokens)
    token_id = {t: i for i, t in enumerate(tokens)}
    words, freqs = _trainable_words(word_counts, token_id, chars, config)
    n_merges, stop_reason = _merge_until_full(_PairMerges(words, freqs), tokens, token_id, config, progress)
    if stats is not None:
        stats.update(alphabet=len(chars), base_size=base_size, merges=n_merges, trained_words=len(words),
                     vocab_size=len(tokens), stop_reason=stop_reason)
    return tokens


# ------------------------------------------------------------------------------------------------------ front door

def learn_vocab(files, config: VocabTrainingConfig | None = None, progress: bool = False) -> VocabTrainingResult:
    """Count words in `files` (streaming) and learn a vocabulary; returns the tokens in id order and stats."""
    config = config or VocabTrainingConfig()
    config.validate()
    paths = expand_files(files)
    # the tokenizer's own pre-tokenization, so training sees the words encoding will see
    tokenize = tokenizer_from_tokens(list(SPECIAL_TOKENS), config.lowercase).basic_tokenize
    stats: dict = {"files": len(paths)}
    t0 = time.perf_counter()

    total = sum(p.stat().st_size for p in paths) if progress else None
    with progress_bar(total=total, desc="counting words", unit="B", unit_scale=True, show=progress) as bar:
        on_bytes = bar.update if progress else None
        texts = (text for p in paths for text in iter_text(p, on_bytes))
        counts, char_counts = count_words(texts, tokenize, config.max_distinct_words, config.special_tokens, stats)
    stats["count_seconds"] = round(time.perf_counter() - t0, 3)
    if not char_counts:
        names = ", ".join(str(p) for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
        raise DataError(f"{names}: the corpus has no words (empty or whitespace/control characters only)")

    t1 = time.perf_counter()
    tokens = learn_wordpieces(counts, char_counts, config, progress=progress, stats=stats)
    stats["merge_seconds"] = round(time.perf_counter() - t1, 3)
    return VocabTrainingResult(tokens=tokens, lowercase=config.lowercase, stats=stats)


def train_vocab(files, config: VocabTrainingConfig | None = None, *, progress: bool = False, **options):
    """A bertkit Tokenizer over a WordPiece vocabulary learned from text files (paths or globs; .gz read
    transparently). Settings: a VocabTrainingConfig, or its fields as keywords (`vocab_size=8000`), which replace
    those of `config`; an unknown keyword is a ConfigError naming it."""
    config = with_options(VocabTrainingConfig, config, options, "train_vocab")
    result = learn_vocab(files, config, progress=progress)
    return tokenizer_from_tokens(result.tokens, lowercase=config.lowercase)


def tokenizer_from_tokens(tokens: list[str], lowercase: bool = True):
    """A bertkit Tokenizer over `tokens` (in id order)."""
    return Tokenizer({t: i for i, t in enumerate(tokens)}, lowercase=lowercase)


def learn_library_vocab(files, model: str, vocab_size: int, lowercase: bool = False, min_frequency: int = 2,
                        limit_alphabet: int | None = None, progress: bool = False):
    """A byte-level BPE or Unigram tokenizer (train_library_vocab) learned from `files`, read as learn_vocab
    reads them (streaming, .gz, globs); returns (LibraryTokenizer, stats)."""
    paths = expand_files(files)
    stats: dict = {"files": len(paths), "characters": 0}
    t0 = time.perf_counter()

    def texts() -> Iterator[str]:
        for p in paths:
            for text in iter_text(p):
                stats["characters"] += len(text)
                yield text

    tok = train_library_vocab(texts(), model, vocab_size, lowercase, min_frequency, limit_alphabet, progress)
    if not stats["characters"]:
        raise DataError(f"{', '.join(str(p) for p in paths[:3])}: the corpus has no text")
    stats.update(vocab_size=len(tok), seconds=round(time.perf_counter() - t0, 3))
    return tok, stats


def train_library_vocab(texts: Iterable[str], model: str = "bpe", vocab_size: int = 30_000, lowercase: bool = False,
                        min_frequency: int = 2, limit_alphabet: int | None = None,
                        progress: bool = False) -> LibraryTokenizer:
    """A byte-level BPE or Unigram tokenizer learned from texts (an iterable of str, streamed), by the `tokenizers`
    library's trainers: BPE as RoBERTa's (<s> A </s></s> B </s>); Unigram with Metaspace as XLM-R's / ALBERT's (NFKC,
    runs of spaces collapsed; <s> A </s></s> B </s>). Its save_pretrained writes a directory that bertkit and
    transformers' AutoTokenizer both load."""
    from tokenizers import Regex, Tokenizer as Pipeline, decoders, models, normalizers, pre_tokenizers, processors, \
        trainers

    if model not in _LIBRARY_MODELS:
        raise ConfigError(f"model must be one of {', '.join(_LIBRARY_MODELS)} (or WordPiece: train_vocab), "
                          f"got {model!r}")
    least = len(_LIBRARY_SPECIALS) + (256 if model == "bpe" else 2)   # byte-level BPE starts from all 256 bytes
    if vocab_size < least:    # checked before the corpus is read
        raise ConfigError(f"vocab_size must be at least {least} for {model} ({len(_LIBRARY_SPECIALS)} special tokens"
                          f"{' + 256 bytes' if model == 'bpe' else ''}), got {vocab_size}")
    lower = [normalizers.Lowercase()] if lowercase else []
    if model == "bpe":
        tok = Pipeline(models.BPE())
        tok.normalizer = normalizers.Sequence([normalizers.NFC(), *lower])
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=[*_LIBRARY_SPECIALS], show_progress=progress,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      **({"limit_alphabet": limit_alphabet} if limit_alphabet else {}))
    else:
        tok = Pipeline(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), *lower,
                                               normalizers.Replace(Regex(" {2,}"), " ")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=[*_LIBRARY_SPECIALS], unk_token="<unk>",
                                          show_progress=progress)
    try:
        tok.train_from_iterator(texts, trainer)
    except BertkitError:
        raise       # the corpus reader's own (a missing or corrupt file)
    except Exception as e:  # the library raises plain Exception
        raise ConfigError(f"{model} training failed (vocab_size={vocab_size}): {str(e)[:160]}") from None
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    if model == "bpe":
        tok.post_processor = processors.RobertaProcessing(("</s>", eos), ("<s>", bos), trim_offsets=True,
                                                          add_prefix_space=False)
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    config = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
              "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>", "do_lower_case": lowercase}
    return LibraryTokenizer(tok.to_str(), config)
