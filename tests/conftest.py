"""Shared fixtures. Tests that need ../shared or a real corpus skip with a reason when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent (a user's fresh clone has no ../shared)")
    return SHARED


def _dataset(fn):
    from bertkit.errors import DatasetUnavailable
    try:
        return fn()
    except DatasetUnavailable as e:
        pytest.skip(f"dataset unavailable offline: {e}")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from bertkit import datasets
    return _dataset(datasets.minilm_dir)


@pytest.fixture(scope="session")
def bbc_articles():
    from bertkit import datasets
    return _dataset(datasets.bbc_articles)


@pytest.fixture(scope="session")
def rotten_tomatoes():
    from bertkit import datasets
    return _dataset(datasets.rotten_tomatoes)


@pytest.fixture(scope="session")
def bert_vocab_file(minilm_dir) -> Path:
    """The real bert-base-uncased vocab.txt (shipped inside MiniLM-L6)."""
    return minilm_dir / "vocab.txt"
