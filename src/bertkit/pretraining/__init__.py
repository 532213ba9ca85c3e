"""Pre-training data: raw text -> documents -> sentence-pair examples -> masks -> numpy shards -> batches
(docs/pretraining.md, "How `bertkit prepare` builds shards")."""

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
