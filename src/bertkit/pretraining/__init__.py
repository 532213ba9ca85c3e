"""Pre-training data: raw text -> documents -> sentence-pair examples -> masks -> numpy shards -> batches.

    corpus.py    documents from text files (Google's one-sentence-per-line or prose + sentence splitter), gzip
    examples.py  NSP / SOP pairs and packed rows, google-research's algorithm (deviations listed there)
    masking.py   token / whole-word / n-gram masking, 80-10-10, static or dynamic, counter-based randomness
    shards.py    .npy shards + manifest.json (crash-safe), ShardReader: memory-mapped, shuffled, ranked batches
    packing.py   PackedReader: batches by a token budget, each example its own sequence (~1% padding)
    build.py     prepare(): the pipeline, parallel over processes

    from bertkit.pretraining import PrepareConfig, ShardReader, prepare
    prepare(PrepareConfig("corpus/*.txt.gz", "vocab.txt", "shards/", seq_len=128, task="nsp", masking="wwm"))
    for batch in ShardReader("shards/", batch_size=32, seed=0): ...
"""

from __future__ import annotations

from bertkit.pretraining.build import PrepareConfig, PrepareSummary, prepare
from bertkit.pretraining.corpus import CorpusStats, Document, iter_documents, split_sentences
from bertkit.pretraining.examples import Example, ExampleBuilder, ExampleConfig, TokenizedDocument
from bertkit.pretraining.masking import MaskingConfig, VocabTables, example_keys, mask_batch
from bertkit.pretraining.packing import PackedReader
from bertkit.pretraining.shards import ReaderOptions, ShardReader, read_manifest

__all__ = ["prepare", "PrepareConfig", "PrepareSummary", "ShardReader", "PackedReader", "ReaderOptions", "read_manifest",
           "iter_documents", "split_sentences", "Document", "CorpusStats", "ExampleConfig", "ExampleBuilder", "Example",
           "TokenizedDocument", "MaskingConfig", "VocabTables", "mask_batch", "example_keys"]
