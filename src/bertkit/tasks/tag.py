"""Token classification (NER and friends): the paper's figure 4 (d), one linear layer on every token.

A word's tag goes on its first piece (the others get -100, or its tag with `label_all_pieces`), and predictions are
read there, so they map back to words exactly. A sentence too long for `max_length` is cut into word windows and
stitched back, never truncated. The rules in full: docs/architecture.md.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.heads import IGNORE_INDEX, BertForTokenClassification
from bertkit.predict.decode import word_labels
from bertkit.tasks import metrics as M
from bertkit.tasks.batching import predict_batches
from bertkit.tasks.readers import LabelMap, Sentence, read_conll
from bertkit.tasks.task import Feature, Task, write_jsonl

__all__ = ["TokenTask", "WordsFeature", "word_pieces"]


@dataclass(kw_only=True)
class WordsFeature(Feature):
    """A window of a sentence's words: predictions are read at each word's first piece."""
    sentence: int                        # index of the sentence in the examples
    words: list[int | None]              # each position's word in the sentence (None: [CLS], [SEP])


def word_pieces(tok, words: list[str], cache: dict | None = None) -> tuple[list[list[int]], int]:
    """Piece ids per word (cached by word); words with no piece get [UNK]. Returns (pieces, n_empty_words)."""
    cache = {} if cache is None else cache
    out, empty = [], 0
    for w in words:
        if w not in cache:
            cache[w] = tok.convert_tokens_to_ids(tok.tokenize(w))
        empty += not cache[w]
        out.append(cache[w] or [tok.unk_token_id])
    return out, empty


@dataclass
class TokenTask(Task):
    max_length: int = 128
    label_all_pieces: bool = False
    convert_to: str | None = None        # None: keep the file's scheme; "IOB2" | "IOB1" | "BIOES"
    labels: LabelMap | None = None
    stats: dict = field(default_factory=lambda: {"windows_split": 0, "empty_words": 0, "long_words_cut": 0})
    kind = "tag"
    model_class = BertForTokenClassification
    main_metric = "f1"

    def read(self, path, require_label: bool = True) -> list[Sentence]:
        sents = read_conll(path, require_tags=require_label)
        if self.convert_to and require_label:
            for s in sents:
                s.tags = M.convert_tags(s.tags, self.convert_to)
        return sents

    def fit_labels(self, train: list[Sentence]) -> None:
        tags = {t for s in train for t in s.tags}
        # make sure every B-X has its I-X (continuation pieces under label_all_pieces, IOB1 readers)
        tags |= {"I-" + t[2:] for t in tags if t.startswith("B-")}
        self.labels = LabelMap(sorted(tags, key=lambda t: (t != "O", t[2:], t)))

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def features(self, tok, sents: list[Sentence], with_labels: bool = True) -> list[WordsFeature]:
        feats, cache = [], {}
        budget = self.max_length - 2
        for si, s in enumerate(sents):
            pieces, empty = word_pieces(tok, s.words, cache)
            self.stats["empty_words"] += empty
            tag_ids = [self.labels.id(t, s.source) for t in s.tags] if with_labels else None
            w = 0
            while w < len(s.words):
                body, labels, words = [], [], [None]       # the window's pieces, their labels, their words
                start = w
                while w < len(s.words) and (len(body) + len(pieces[w]) <= budget or w == start):
                    p = pieces[w][:budget]  # a single word longer than the window keeps its first pieces
                    self.stats["long_words_cut"] += len(p) < len(pieces[w])
                    body.extend(p)
                    words.extend([w] * len(p))
                    if tag_ids is not None:
                        labels.append(tag_ids[w])
                        labels.extend([self._continuation(tag_ids[w]) if self.label_all_pieces else IGNORE_INDEX]
                                      * (len(p) - 1))
                    w += 1
                self.stats["windows_split"] += start > 0         # a window after the sentence's first
                f = WordsFeature(input_ids=tok.template.wrap(body), token_type_ids=tok.template.types(len(body)),
                                 sentence=si, words=words + [None])
                if tag_ids is not None:
                    f.labels, f.token_labels = tok.template.wrap(labels, fill=IGNORE_INDEX), True
                feats.append(f)
        return feats

    def _continuation(self, tag_id: int) -> int:
        name = self.labels.name(tag_id)
        if name.startswith("B-") and ("I-" + name[2:]) in self.labels:
            return self.labels.id("I-" + name[2:])
        return tag_id

    def predict(self, model, examples, feats: list[WordsFeature], batch_size: int = 64,
                precision: str | bool | None = "auto") -> list[dict]:
        """Per feature: {word: (label index, logit)} of its words, read at each word's first piece."""
        out: list[dict] = [None] * len(feats)  # type: ignore[list-item]
        for idx, o in predict_batches(model, feats, batch_size, precision):
            lg = o.logits.float().cpu().numpy()                               # (batch, seq, labels)
            for row, i in enumerate(idx):
                out[i] = word_labels(lg[row], feats[i].words)
        return out

    def word_tags(self, sents: list[Sentence], feats: list[WordsFeature], raw: list[dict]) -> list[list[str]]:
        tags = [[None] * len(s.words) for s in sents]
        for f, best in zip(feats, raw):
            for w, (k, _) in best.items():
                tags[f.sentence][w] = self.labels.name(k)
        return tags

    def score(self, sents: list[Sentence], feats: list[WordsFeature], logits) -> dict:
        pred = self.word_tags(sents, feats, logits)
        out = M.entity_scores([s.tags for s in sents], pred)
        out["n"] = len(sents)
        return out

    def write_predictions(self, path: Path, sents: list[Sentence], feats: list[WordsFeature], logits) -> Path:
        """JSONL: words, predicted tags, entities with word and character spans (words joined by one space)."""
        return write_jsonl(path, (_record(s, tags) for s, tags in zip(sents, self.word_tags(sents, feats, logits))))


def _record(s: Sentence, tags: list[str]) -> dict:
    starts = list(itertools.accumulate((len(w) + 1 for w in s.words), initial=0))   # words joined by one space
    ents = [{"type": t, "words": [a, b + 1], "chars": [starts[a], starts[b] + len(s.words[b])],
             "text": " ".join(s.words[a:b + 1])} for t, a, b in M.get_entities(tags)]
    rec = {"words": s.words, "tags": tags, "entities": ents}
    if s.tags is not None:
        rec["gold"] = s.tags
    return rec
