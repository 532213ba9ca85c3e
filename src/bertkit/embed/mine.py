"""Hard-negative mining with a bi-encoder: for each (anchor, positive) pair, the corpus texts (the distinct positives
plus `corpus`) the encoder ranks closest to the anchor become its negatives, never the anchor's text or a positive of
a row with the same anchor (false negatives); `skip_top` leaves out the first ranked ones too (near-duplicates).

    rows = mine_hard_negatives(encoder, tokenizer, pairs, negatives=3)   # [{"anchor", "positive", "negative_1"..}]
    pair_label_rows(rows)          # [{"text", "text_pair", "label"}]: a cross-encoder's pointwise training file
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from bertkit.embed.index import search_vectors
from bertkit.errors import ConfigError, DataError

__all__ = ["mine_hard_negatives", "pair_label_rows"]


def mine_hard_negatives(encoder, tokenizer, pairs: Sequence[tuple[str, str]], negatives: int = 1,
                        skip_top: int = 0, corpus: Sequence[str] = (), batch_size: int = 64) -> list[dict]:
    if negatives <= 0 or skip_top < 0:
        raise ConfigError(f"negatives must be > 0 and skip_top >= 0, got {negatives}, {skip_top}")
    texts = list(dict.fromkeys([p for _, p in pairs] + [c for c in corpus if c.strip()]))
    positives: dict[str, set[str]] = defaultdict(set)
    for a, p in pairs:
        positives[a].add(p)
    anchors = list(positives)
    excluded = max(len(v) for v in positives.values()) + 1          # its positives and its own text at most
    k = min(len(texts), negatives + skip_top + excluded)
    q = encoder.encode(tokenizer, anchors, batch_size)                                 # (anchors, dim)
    c = encoder.encode(tokenizer, texts, batch_size)                                   # (corpus, dim)
    _, rows = search_vectors(q, c, k=k, cosine=True)                                   # (anchors, k)
    chosen: dict[str, list[str]] = {}
    for a, ranked in zip(anchors, rows):
        found = [texts[r] for r in ranked if texts[r] not in positives[a] and texts[r] != a][skip_top:]
        if len(found) < negatives:
            raise DataError(f"anchor {a[:60]!r}: only {len(found)} candidate(s) after its positives and "
                            f"--skip-top {skip_top}, {negatives} wanted: give a larger --corpus or fewer negatives")
        chosen[a] = found[:negatives]
    return [{"anchor": a, "positive": p, **{f"negative_{i + 1}": n for i, n in enumerate(chosen[a])}}
            for a, p in pairs]


def pair_label_rows(rows: Sequence[dict]) -> list[dict]:
    """(anchor, positive, negative_1..n) rows -> (text, text_pair, label) rows for a pair classifier."""
    out = []
    for r in rows:
        out.append({"text": r["anchor"], "text_pair": r["positive"], "label": 1})
        out.extend({"text": r["anchor"], "text_pair": v, "label": 0} for k, v in r.items() if k.startswith("negative"))
    return out
