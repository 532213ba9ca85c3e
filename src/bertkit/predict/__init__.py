"""The inference engine every front door calls: text -> model inputs -> one forward loop (engine.py) -> one decoder
per head (decode.py, answers.py). docs/architecture.md, "The inference engine".
"""

from bertkit.predict.answers import Windows, best_spans
from bertkit.predict.decode import (FillVocab, class_scores, hidden_states, join_pieces, relevance, score_function,
                                    top_fills, word_ids, word_labels)
from bertkit.predict.engine import PRECISION, encode, forward, forward_batches

__all__ = ["encode", "forward", "forward_batches", "PRECISION", "class_scores", "relevance", "score_function",
           "word_ids", "word_labels", "hidden_states", "Windows", "best_spans", "FillVocab", "top_fills",
           "join_pieces"]
