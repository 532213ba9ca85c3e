"""The inference engine's parts on their own: inputs cut longest-first as the per-text rule did, the forward loop's
order and mode, and the decoders every front door shares."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertkit.predict import (class_scores, encode, forward_batches, hidden_states, relevance, score_function,
                             word_ids, word_labels)

WORDS = ["the", "a", "man", "is", "eating", "food", "bread", "of", "paris", "cap", "##ital", "##s", "dog", "."]


@pytest.fixture(scope="module")
def tok():
    from bertkit import Tokenizer
    return Tokenizer({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)})


def _cut_one_at_a_time(tok, a: str, b: str | None, max_length: int) -> list[int]:
    """The rule the engine replaces: pop from the longer side (the first on a tie) until the pair fits."""
    x = tok.convert_tokens_to_ids(tok.tokenize(a))
    y = tok.convert_tokens_to_ids(tok.tokenize(b)) if b is not None else None
    while len(x) + (len(y) if y is not None else 0) > max_length - (3 if y is not None else 2):
        (y if y is not None and len(y) > len(x) else x).pop()
    return tok.build_inputs([x], [y] if y is not None else None)["input_ids"][0]


@pytest.mark.parametrize("max_length", [5, 7, 9, 64])
def test_encode_cuts_longest_first_like_the_per_text_rule(tok, max_length):
    texts = ["the man is eating food .", "a dog", "paris capitals of the dog . the man"]
    pairs = ["a dog is eating bread of paris .", "the man is eating", "a"]
    batch = encode(tok, texts, pairs, max_length)
    for i, (a, b) in enumerate(zip(texts, pairs)):
        n = int(batch["attention_mask"][i].sum())
        assert batch["input_ids"][i, :n].tolist() == _cut_one_at_a_time(tok, a, b, max_length)
    single = encode(tok, texts, None, max_length)
    for i, a in enumerate(texts):
        n = int(single["attention_mask"][i].sum())
        assert single["input_ids"][i, :n].tolist() == _cut_one_at_a_time(tok, a, None, max_length)


def test_a_token_left_over_goes_to_the_longer_side_as_in_bert_tokenizer_fast(tok):
    # 10 pieces + 1 piece into 1 slot: the per-text rule gave it to the pair, BertTokenizerFast to the longer text
    batch = encode(tok, ["paris capitals of the dog . the man"], ["a"], 4)
    assert batch["input_ids"].tolist() == [[2, tok.vocab["paris"], 3, 3]]


def test_forward_batches_sorts_by_length_keeps_indices_and_restores_training_mode():
    seen = []

    class Echo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x):
            seen.append(self.training)
            return x * self.w

    model = Echo().train()
    lengths = [5, 1, 3, 2]
    out = {}
    for idx, batch, y in forward_batches(model, lengths, lambda idx: {"x": torch.tensor(idx, dtype=torch.float)}, 2,
                                         "fp32"):
        assert not y.requires_grad
        out.update(zip(idx, y.tolist()))
    assert [i for i in sorted(range(4), key=lengths.__getitem__)] == [1, 3, 2, 0]
    assert out == {i: float(i) for i in range(4)} and seen == [False, False] and model.training


def test_class_scores_follow_the_transformers_rule():
    class C:
        def __init__(self, n, problem=None):
            self.num_labels, self.problem_type = n, problem
    logits = np.array([[2.0, -1.0, 0.5]], dtype=np.float32)
    assert score_function(C(3)) == "softmax" and score_function(C(1)) == "sigmoid"
    assert score_function(C(3, "multi_label_classification")) == "sigmoid"
    assert score_function(C(1, "regression")) == "none" and score_function(C(1, "regression"), "sigmoid") == "sigmoid"
    soft = class_scores(logits, "softmax")
    assert isinstance(soft, np.ndarray) and soft.sum() == pytest.approx(1.0)
    assert class_scores(torch.tensor(logits), "sigmoid")[0, 0].item() == pytest.approx(1 / (1 + np.exp(-2.0)))
    assert (class_scores(logits, "none") == logits).all()
    with pytest.raises(ValueError, match="function_to_apply"):
        class_scores(logits, "tanh")


@pytest.mark.parametrize("labels", [1, 2, 3])
def test_relevance_is_the_activation_on_the_positive_label(labels):
    logits = torch.randn(5, labels)
    got = relevance(logits.numpy(), torch.nn.Sigmoid(), positive=labels - 1)
    assert got.dtype == np.float32 and np.allclose(got, torch.sigmoid(logits[:, labels - 1]).numpy(), atol=1e-7)
    want = logits.softmax(-1)[:, 0] if labels > 1 else logits[:, 0]       # several raw logits: softmaxed
    assert np.allclose(relevance(logits.numpy(), torch.nn.Identity(), 0), want.numpy(), atol=1e-7)


def test_word_ids_and_first_piece_labels(tok):
    ids = tok.convert_tokens_to_ids(["paris", "cap", "##ital", "##s", "is"])
    assert tok.continues_word(ids) == [False, False, True, True, False]
    words = word_ids([None, *tok.continues_word(ids), None])
    assert words == [None, 0, 1, 1, 1, 2, None]
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4], [0.6, 0.4], [0.1, 0.9], [1.0, 0.0]])
    assert word_labels(probs, words) == {0: (1, pytest.approx(0.8)), 1: (1, pytest.approx(0.7)),
                                         2: (1, pytest.approx(0.9))}
    # transformers' other aggregation rules: the mean of a word's pieces, or its most confident piece
    assert word_labels(probs, words, "average")[1] == (0, pytest.approx(0.5))
    assert word_labels(probs, words, "max")[1] == (1, pytest.approx(0.7))


def test_hidden_states_averages_chosen_layers_and_names_a_bad_one():
    class Out:
        last_hidden_state = torch.full((1, 2, 3), 3.0)
        hidden_states = (torch.zeros(1, 2, 3), torch.full((1, 2, 3), 2.0), torch.full((1, 2, 3), 3.0))
    assert torch.equal(hidden_states(Out()), Out.last_hidden_state)
    assert torch.equal(hidden_states(Out(), [-1, -2]), torch.full((1, 2, 3), 2.5))
    with pytest.raises(ValueError, match="out of range: the model has 2 layers"):
        hidden_states(Out(), [7])
