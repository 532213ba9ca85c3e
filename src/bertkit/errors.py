"""The one exception family users see.

Every error a user can cause (a bad file, a bad config value, text of the wrong type, a vocab that does not fit)
raises a subclass of `BertkitError` whose message names the file / field / value at fault. The CLI prints it in one
line and exits 2; library callers can catch `BertkitError` (it is also a `ValueError`).
"""

from __future__ import annotations


class BertkitError(ValueError):
    """Base class of every user-facing bertkit error."""


class VocabError(BertkitError):
    """A vocabulary file is missing, empty or malformed."""


class ConfigError(BertkitError):
    """A config value or config file is invalid."""


class CheckpointError(BertkitError):
    """A checkpoint is missing, corrupt, or does not fit the model."""


class DataError(BertkitError):
    """An input data file (corpus, shard, task file) is missing or malformed."""


class DatasetUnavailable(BertkitError):
    """A real corpus / weight package is neither cached nor downloadable (offline)."""
