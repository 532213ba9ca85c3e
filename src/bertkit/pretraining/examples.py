"""Tokenised documents -> pre-training examples: `[CLS] A [SEP] B [SEP]` pairs (NSP / SOP) or packed text (none).

google-research's create_pretraining_data.py algorithm, streaming; its eight deviations, each with its reason, are
listed in docs/pretraining.md ("Examples"). Labels follow transformers' NSP head: 0 = B follows A, 1 = B is random /
swapped."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import Iterator

import numpy as np

from bertkit.errors import ConfigError
from bertkit.pretraining.corpus import Counts
from bertkit.tokenizer.inputs import wrap_array

__all__ = ["ExampleConfig", "Example", "TokenizedDocument", "ExampleBuilder", "BuildStats", "TASKS"]

TASKS = ("nsp", "sop", "none")


@dataclass
class ExampleConfig:
    seq_len: int = 128                 # max_seq_length: every row has exactly this width on disk
    task: str = "nsp"                  # nsp (BERT) | sop (ALBERT) | none (RoBERTa-style packing, MLM only)
    short_seq_prob: float = 0.1        # BERT: 10% of rows get a shorter random target, to match fine-tuning
    dupe_factor: int = 1               # static masking: copies of the data with different masks (BERT used 10)
    buffer_docs: int = 1000            # NotNext pool: recent documents kept in memory...
    buffer_tokens: int = 1_000_000     # ...and at most this many tokens of them (bounds RAM on long documents)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ConfigError(f"task {self.task!r} is not one of {TASKS}")
        if not 8 <= self.seq_len <= 65535:          # shards store positions as uint16
            raise ConfigError(f"seq_len={self.seq_len} must be in [8, 65535]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"short_seq_prob={self.short_seq_prob} must be in [0, 1]")
        for name, least in (("dupe_factor", 1), ("buffer_docs", 2)):
            if getattr(self, name) < least:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= {least}")


@dataclass
class TokenizedDocument:
    """A document as one flat id array plus sentence boundaries: sentence k = tokens[bounds[k]:bounds[k+1]]."""
    id: int
    tokens: np.ndarray     # (n_tokens,) int32
    bounds: np.ndarray     # (n_sentences + 1,) int64

    @classmethod
    def from_sentences(cls, doc_id: int, sentences: list[list[int]]) -> "TokenizedDocument":
        sentences = [s for s in sentences if len(s)]
        lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        bounds = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=bounds[1:])
        flat = np.array(list(chain.from_iterable(sentences)), dtype=np.int32).reshape(-1)
        return cls(doc_id, flat, bounds)

    @property
    def n_sentences(self) -> int:
        return len(self.bounds) - 1

    def span(self, first: int, stop: int) -> np.ndarray:
        """Tokens of sentences [first, stop)."""
        return self.tokens[self.bounds[first]:self.bounds[stop]]


@dataclass
class Example:
    tokens: np.ndarray     # (length,) int32: [CLS] A [SEP] B [SEP]  (or [CLS] text [SEP])
    a_len: int             # tokens of type 0: [CLS] A [SEP]; == len(tokens) for task none
    label: int             # 0 IsNext / in order, 1 NotNext / swapped, -1 for task none
    doc_a: int             # test hook: id of the document A came from (first document of a packed row)
    doc_b: int             # ... and B (== doc_a unless NotNext)


@dataclass
class BuildStats(Counts):
    examples: int = 0
    tokens: int = 0                     # non-pad tokens in examples, specials included
    padding: int = 0                    # pad positions in examples (seq_len - length, summed)
    is_next: int = 0
    not_next: int = 0
    split_sentence_pairs: int = 0       # IsNext / SOP pairs made by splitting one sentence (rule 3)
    forced_not_next: int = 0            # IsNext wanted but impossible (one-token last sentence)
    skipped_chunks: int = 0             # SOP chunks of one token: no pair possible
    no_other_document: int = 0          # NotNext wanted but the whole stream has one document


@dataclass
class _Buffer:
    """Recent documents for NotNext draws, bounded in documents and tokens; a full buffer drops a random older one,
    so a document's chance to stay decays geometrically with its age."""
    max_docs: int
    max_tokens: int
    docs: list = field(default_factory=list)
    n_tokens: int = 0

    def add(self, doc: TokenizedDocument, rng: random.Random) -> None:
        """Append `doc`; while over a bound, a random older document leaves (the newest stays last)."""
        self.docs.append(doc)
        self.n_tokens += len(doc.tokens)
        while len(self.docs) > 2 and (len(self.docs) > self.max_docs or self.n_tokens > self.max_tokens):
            gone = self.docs.pop(rng.randrange(len(self.docs) - 1))
            self.n_tokens -= len(gone.tokens)

    def other_than(self, doc_id: int, rng: random.Random) -> TokenizedDocument | None:
        """A random buffered document other than `doc_id` (None when there is none)."""
        for _ in range(32):                    # with >= 2 documents, almost always the first draw
            d = self.docs[rng.randrange(len(self.docs))] if self.docs else None
            if d is not None and d.id != doc_id:
                return d
        rest = [d for d in self.docs if d.id != doc_id]
        return rng.choice(rest) if rest else None


class ExampleBuilder:
    """Feed documents with `add(doc)`, then call `finish()`; both yield `Example`s (docs/pretraining.md, "Examples")."""

    def __init__(self, cfg: ExampleConfig, cls_id: int, sep_id: int, seed: int = 0):
        self.cfg = cfg
        self.cls_id, self.sep_id = cls_id, sep_id
        self.rng = random.Random(seed)
        self.stats = BuildStats()
        self._buffer = _Buffer(cfg.buffer_docs, cfg.buffer_tokens)
        self._pending: deque[TokenizedDocument] = deque()
        self._pack: list[np.ndarray] = []          # task none: pieces of the row being filled
        self._pack_len = 0
        self._pack_doc = -1

    # ------------------------------------------------------------------------------------------------- stream

    def add(self, doc: TokenizedDocument) -> Iterator[Example]:
        if doc.n_sentences == 0:
            return
        if self.cfg.task == "none":
            yield from self._pack_document(doc)
            return
        if self.cfg.task == "sop":
            yield from self._pair_document(doc)
            return
        self._buffer.add(doc, self.rng)
        self._pending.append(doc)
        if len(self._buffer.docs) < 2:
            return                                  # the first document waits for a second to draw NotNext from
        while self._pending:
            yield from self._pair_document(self._pending.popleft())

    def finish(self) -> Iterator[Example]:
        while self._pending:                         # a one-document stream
            yield from self._pair_document(self._pending.popleft())
        if self._pack_len:
            yield from self._emit_pack()

    # ----------------------------------------------------------------------------------------- pairs: nsp / sop

    def _pair_document(self, doc: TokenizedDocument) -> Iterator[Example]:
        for _ in range(self.cfg.dupe_factor):
            yield from self._pairs_once(doc)

    def _pairs_once(self, doc: TokenizedDocument) -> Iterator[Example]:
        rng, cfg = self.rng, self.cfg
        max_tokens = cfg.seq_len - 3
        target = max_tokens
        if rng.random() < cfg.short_seq_prob:
            target = rng.randint(2, max_tokens)
        n = doc.n_sentences
        lengths = np.diff(doc.bounds)
        first, i, chunk_len = 0, 0, 0              # chunk = sentences [first, i]
        while i < n:
            chunk_len += int(lengths[i])
            if i == n - 1 or chunk_len >= target:
                ex, i = self._make_pair(doc, first, i + 1, target, max_tokens)
                if ex is not None:
                    yield ex
                first, chunk_len = i + 1, 0
            i += 1

    def _make_pair(self, doc, first, stop, target, max_tokens):
        """Chunk = sentences [first, stop). Returns (example or None, index of the last sentence consumed)."""
        rng, task = self.rng, self.cfg.task
        swap_or_random = rng.random() < 0.5
        n_chunk = stop - first
        if task == "nsp" and swap_or_random:
            other = self._buffer.other_than(doc.id, rng)
            if other is None:
                self.stats.no_other_document += 1
                swap_or_random = False
            else:
                a_end = first + (rng.randint(1, n_chunk - 1) if n_chunk >= 2 else 1)
                a = doc.span(first, a_end)
                b = self._random_segment(other, target - len(a))
                ex = self._pack_pair(a, b, 1, max_tokens, doc.id, other.id)
                return ex, a_end - 1                      # sentences after A are put back
        if n_chunk == 1 and stop < doc.n_sentences:       # one sentence: take the next one as B
            stop += 1
            n_chunk = 2
        if n_chunk >= 2:
            a_end = first + rng.randint(1, n_chunk - 1)
            a, b = doc.span(first, a_end), doc.span(a_end, stop)
        else:                                               # last sentence alone: split it inside
            s = doc.span(first, stop)
            if len(s) < 2:
                if task == "nsp":
                    other = self._buffer.other_than(doc.id, rng)
                    if other is not None:
                        self.stats.forced_not_next += 1
                        b = self._random_segment(other, target - len(s))
                        return self._pack_pair(s, b, 1, max_tokens, doc.id, other.id), stop - 1
                self.stats.skipped_chunks += 1
                return None, stop - 1
            cut = rng.randint(1, len(s) - 1)
            a, b = s[:cut], s[cut:]
            self.stats.split_sentence_pairs += 1
        if task == "sop" and swap_or_random:
            return self._pack_pair(b, a, 1, max_tokens, doc.id, doc.id), stop - 1
        return self._pack_pair(a, b, 0, max_tokens, doc.id, doc.id), stop - 1

    def _random_segment(self, doc: TokenizedDocument, target_len: int) -> np.ndarray:
        start = self.rng.randrange(doc.n_sentences)
        stop = start + 1
        while stop < doc.n_sentences and doc.bounds[stop] - doc.bounds[start] < target_len:
            stop += 1
        return doc.span(start, stop)

    def _pack_pair(self, a, b, label, max_tokens, doc_a, doc_b) -> Example:
        a0, a1, b0, b1 = truncate_seq_pair(len(a), len(b), max_tokens, self.rng)
        a, b = a[a0:a1], b[b0:b1]
        tokens = wrap_array(a, b, self.cls_id, self.sep_id)
        self._count(tokens, label)
        return Example(tokens, len(a) + 2, label, doc_a, doc_b)

    def _count(self, tokens, label):
        st = self.stats
        st.examples += 1
        st.tokens += len(tokens)
        st.padding += self.cfg.seq_len - len(tokens)
        if label == 0:
            st.is_next += 1
        elif label == 1:
            st.not_next += 1

    # -------------------------------------------------------------------------------------------- packing: none

    def _pack_document(self, doc: TokenizedDocument) -> Iterator[Example]:
        room_total = self.cfg.seq_len - 2
        rest = doc.tokens
        if self._pack_len == 0:
            self._pack_doc = doc.id
        while len(rest):
            room = room_total - self._pack_len
            piece, rest = rest[:room], rest[room:]
            self._pack.append(piece)
            self._pack_len += len(piece)
            if self._pack_len == room_total:
                yield from self._emit_pack()
                self._pack_doc = doc.id

    def _emit_pack(self) -> Iterator[Example]:
        tokens = wrap_array(np.concatenate(self._pack), None, self.cls_id, self.sep_id)
        self._pack, self._pack_len = [], 0
        for _ in range(self.cfg.dupe_factor):
            self._count(tokens, -1)
            yield Example(tokens, len(tokens), -1, self._pack_doc, self._pack_doc)


def truncate_seq_pair(len_a: int, len_b: int, max_tokens: int, rng: random.Random) -> tuple[int, int, int, int]:
    """google-research's truncate_seq_pair on lengths: returns the kept ranges (a0, a1, b0, b1).

    While the pair is too long, one token goes from the longer side (B on a tie), from its front or its back with
    probability 1/2. Runs of removals from one side are done at once: k removals with a binomial(k, 1/2) count
    from the front, which is the same distribution as k coin flips, in O(1) Python steps.
    """
    a0, a1, b0, b1 = 0, len_a, 0, len_b
    while (a1 - a0) + (b1 - b0) > max_tokens:
        la, lb = a1 - a0, b1 - b0
        excess = la + lb - max_tokens
        k = min(excess, abs(la - lb)) or 1
        front = bin(rng.getrandbits(k)).count("1")
        if la > lb:
            a0, a1 = a0 + front, a1 - (k - front)
        else:
            b0, b1 = b0 + front, b1 - (k - front)
    return a0, a1, b0, b1
