"""Real fine-tuning data sets (`bertkit task-data`), built from the corpora in `bertkit.datasets` and written as
ordinary task files. Splits are fixed 80/10/10 by `seed`, over *articles* for the BBC sets, with BBC's duplicate
articles dropped (counted), else a copy could land in train and its twin in test. The sets: docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections import defaultdict
from pathlib import Path

from bertkit import datasets
from bertkit.atomic import write_json
from bertkit.errors import ConfigError, DataError
from bertkit.tasks import ner_silver
from bertkit.tasks.metrics import get_entities
from bertkit.tasks.readers import SquadExample, read_conll, write_conll, write_squad, write_table

__all__ = ["TASKS", "build", "first_sentence", "ner_file"]

TASKS = ("sentiment", "sentiment-regress", "topic", "pairs", "retrieval", "ner", "qa", "qa2")
PLACEHOLDER = "@placeholder"
# entity types worth asking about (numbers / dates make poor cloze answers)
_QA_TYPES = {"PERSON", "ORG", "GPE", "NORP", "LOC", "FAC", "EVENT", "PRODUCT", "WORK_OF_ART", "LAW"}

_SENT_END = re.compile(r"(?<=[.!?])[\"']?\s+(?=[\"'A-Z0-9£$])")


def first_sentence(paragraph: str) -> str:
    """The first sentence of a paragraph (split after . ! ? before a capital, a digit or a quote)."""
    m = _SENT_END.search(paragraph)
    return paragraph[:m.start() + (1 if paragraph[m.start()] in "\"'" else 0)].strip() if m else paragraph.strip()


def ner_file() -> Path:
    """The silver NER CoNLL file: $BERTKIT_NER_FILE when set, else rebuilt once into the bertkit cache from the
    shipped annotations and the BBC corpus (fetched like every other data set)."""
    env = os.environ.get("BERTKIT_NER_FILE")
    if env:
        if not Path(env).is_file():
            raise DataError(f"BERTKIT_NER_FILE={env}: no such file")
        return Path(env)
    digest = hashlib.sha256(ner_silver.ANNOTATIONS.read_bytes()).hexdigest()[:12]
    path = datasets.cache_dir() / f"bbc_ner_silver-{digest}.conll"
    return path if path.is_file() else ner_silver.rebuild(path)


def _unique_articles() -> tuple[list, dict[str, str]]:
    """BBC articles without duplicates (same first sentence; first by name kept), and name -> kept name."""
    kept, first, alias = [], {}, {}
    for a in datasets.bbc_articles():
        key = " ".join(first_sentence(a.paragraphs[0]).split()) if a.paragraphs else a.title
        if key not in first:
            first[key] = a.name
            kept.append(a)
        alias[a.name] = first[key]
    return kept, alias


def _three_ways(items: list, seed: int) -> dict[str, list]:
    """{"train", "dev", "test"}: the fixed 80/10/10 split of `items` by seed."""
    return dict(zip(("train", "dev", "test"), datasets.split_by_seed(items, seed)))


def _write_csvs(out: Path, splits: dict[str, list[dict]]) -> dict:
    """SPLIT.csv for each split's rows: the stats' files and counts."""
    return {"files": {name: str(write_table(out / f"{name}.csv", rows)) for name, rows in splits.items()},
            "counts": {name: len(rows) for name, rows in splits.items()}}


def _sentiment(out: Path, seed: int, regress: bool) -> dict:
    items = datasets.rotten_tomatoes()
    kept = [s for s in items if s.score != 0]
    rows = {k: [{"text": s.text, "label": (s.score if regress else ("pos" if s.score > 0 else "neg"))} for s in v]
            for k, v in _three_ways(kept, seed).items()}
    return {**_write_csvs(out, rows), "dropped_zero_score": len(items) - len(kept), "total": len(items)}


def _topic(out: Path, seed: int) -> dict:
    arts, alias = _unique_articles()
    rows = {k: [{"text": f"{a.title}. {' '.join(a.paragraphs)}", "label": a.topic} for a in v]
            for k, v in _three_ways(arts, seed).items()}
    return {**_write_csvs(out, rows), "duplicate_articles_dropped": len(alias) - len(arts)}


def _pairs(out: Path, seed: int) -> dict:
    uniq, alias = _unique_articles()
    arts = [a for a in uniq if a.paragraphs]
    parts = _three_ways(arts, seed)
    rng = random.Random(seed)
    rows = {}
    for name, split in parts.items():
        by_topic = defaultdict(list)
        for a in split:
            by_topic[a.topic].append(a)
        r = []
        for a in split:
            r.append({"text": a.title, "text_pair": first_sentence(a.paragraphs[0]), "label": 1})
            other = rng.choice([b for b in by_topic[a.topic] if b.name != a.name])
            r.append({"text": a.title, "text_pair": first_sentence(other.paragraphs[0]), "label": 0})
        rng.shuffle(r)
        rows[name] = r
    return {**_write_csvs(out, rows), "duplicate_articles_dropped": len(alias) - len(uniq)}


def _retrieval(out: Path, seed: int) -> dict:
    uniq, alias = _unique_articles()
    arts = [a for a in uniq if a.paragraphs and a.title.strip()]
    parts = _three_ways(arts, seed)
    files = {"train": str(write_table(out / "train.jsonl", [{"anchor": a.title, "positive": a.paragraphs[0]}
                                                            for a in parts["train"]]))}
    for split in ("dev", "test"):
        arts = parts[split]
        write_table(out / split / "queries.jsonl", [{"id": a.name, "text": a.title} for a in arts])
        write_table(out / split / "corpus.jsonl", [{"id": a.name, "text": a.paragraphs[0]} for a in arts])
        write_table(out / split / "qrels.jsonl", [{"query_id": a.name, "corpus_id": a.name, "score": 1}
                                                  for a in arts])
        files[split] = str(out / split)
    return {"files": files, "counts": {k: len(v) for k, v in parts.items()},
            "duplicate_articles_dropped": len(alias) - len(uniq)}


def _ner_sentences() -> tuple[list, int]:
    """The silver NER sentences without the duplicate articles (those whose text an earlier doc already has)."""
    _, alias = _unique_articles()
    sents = read_conll(ner_file())
    first: dict[str, str] = {}              # kept article name -> the first doc of its text
    drop = {d for d in dict.fromkeys(s.doc for s in sents) if first.setdefault(alias.get(d, d), d) != d}
    return [s for s in sents if s.doc not in drop], len(drop)


def _doc_split(sentences, seed: int):
    docs = list(dict.fromkeys(s.doc for s in sentences))
    parts = _three_ways(docs, seed)
    where = {d: name for name, ds in parts.items() for d in ds}
    return {name: [s for s in sentences if where[s.doc] == name] for name in parts}, parts


def _ner(out: Path, seed: int) -> dict:
    sents, dropped = _ner_sentences()
    parts, docs = _doc_split(sents, seed)
    files = {k: str(write_conll(out / f"{k}.conll", v)) for k, v in parts.items()}
    return {"files": files, "counts": {k: len(v) for k, v in parts.items()},
            "articles": {k: len(v) for k, v in docs.items()}, "duplicate_articles_dropped": dropped}


def _entities_by_doc() -> dict[str, list[tuple[str, str]]]:
    """doc -> [(entity text, type)] from the silver NER file (tokens joined by spaces, then re-matched)."""
    out = defaultdict(list)
    for s in read_conll(ner_file()):
        for typ, a, b in get_entities(s.tags):
            if typ in _QA_TYPES:
                out[s.doc].append((" ".join(s.words[a:b + 1]), typ))
    return out


def _find(entity: str, text: str) -> re.Match | None:
    """The first whole-word occurrence of `entity` in `text` (spaces may be any white space), or None."""
    return re.search(r"(?<!\w)" + r"\s+".join(map(re.escape, entity.split())) + r"(?!\w)", text)


def _cloze(q_text: str, context: str, entities: list[str]) -> tuple[str, str, int] | None:
    """Blank the longest entity that occurs in both question text and context: (question, answer, start)."""
    # ties go to the first seen: a set would order them by string hash, which changes from process to process
    for ent in sorted(dict.fromkeys(entities), key=len, reverse=True):
        q, c = _find(ent, q_text), _find(ent, context)
        if q and c:
            return q_text[:q.start()] + PLACEHOLDER + q_text[q.end():], c.group(), c.start()
    return None


def _qa(out: Path, seed: int, version_2: bool) -> dict:
    ents = _entities_by_doc()
    arts = {a.name: a for a in datasets.bbc_articles()}
    sents, dropped = _ner_sentences()
    _, docs = _doc_split(sents, seed)
    rng = random.Random(seed)
    files, counts, skipped = {}, {}, defaultdict(int)
    for split, names in docs.items():
        exs: list[SquadExample] = []
        for name in names:
            a = arts.get(name)
            if a is None or not a.paragraphs:
                skipped["article missing from corpus"] += 1
                continue
            e_texts = [t for t, _ in ents.get(name, [])]
            for kind, q_text, ctx in (("headline", a.title, "\n".join(a.paragraphs)),
                                      ("lead", first_sentence(a.paragraphs[0]), "\n".join(a.paragraphs[1:]))):
                if not ctx:
                    skipped[f"{kind}: no context"] += 1
                    continue
                c = _cloze(q_text, ctx, e_texts)
                if c is None:
                    skipped[f"{kind}: no entity shared with the context"] += 1
                    continue
                q, ans, start = c
                exs.append(SquadExample(f"{name}#{kind}", q, ctx, [(ans, start)], False, name))
        if version_2:
            by_topic = defaultdict(list)
            for e in exs:
                by_topic[e.title.split("/")[0]].append(e)
            for i, e in enumerate(exs):
                if i % 3 != 2:
                    continue
                pool = [o for o in by_topic[e.title.split("/")[0]]
                        if o.title != e.title and _find(e.answers[0][0], o.context) is None]
                if not pool:
                    continue
                o = rng.choice(pool)
                exs[i] = SquadExample(e.id + "#unanswerable", e.question, o.context, [], True, o.title)
        files[split] = str(write_squad(out / f"{split}.json", exs, "2.0" if version_2 else "1.1"))
        counts[split] = len(exs)
        if version_2:
            counts[f"{split}_unanswerable"] = sum(e.is_impossible for e in exs)
    return {"files": files, "counts": counts, "skipped": dict(skipped), "duplicate_articles_dropped": dropped}


def build(name: str, out_dir: str | Path, seed: int = 0) -> dict:
    """Write the train/dev/test files of task `name` into out_dir; returns (and writes stats.json) the file paths
    and counts, including everything left out and why."""
    if name not in TASKS:
        raise ConfigError(f"unknown task data set {name!r}; choose from {', '.join(TASKS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    builders = {"sentiment": lambda: _sentiment(out, seed, regress=False),
                "sentiment-regress": lambda: _sentiment(out, seed, regress=True),
                "topic": lambda: _topic(out, seed), "pairs": lambda: _pairs(out, seed),
                "retrieval": lambda: _retrieval(out, seed), "ner": lambda: _ner(out, seed),
                "qa": lambda: _qa(out, seed, version_2=False), "qa2": lambda: _qa(out, seed, version_2=True)}
    stats = builders[name]()
    stats.update(task=name, seed=seed)
    write_json(out / "stats.json", stats, indent=1)
    if not stats["files"]:
        raise DataError(f"task {name}: nothing written")
    return stats
