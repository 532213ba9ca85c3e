"""Keyword options checked against a config dataclass, for calls that take `config=None, **options`
(`train_vocab(files, vocab_size=8000)`): the dataclass stays the one list of the settings and their defaults."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from bertkit.errors import ConfigError

__all__ = ["with_options"]

C = TypeVar("C")


def with_options(config_type: type[C], config: C | None, options: dict[str, Any], caller: str) -> C:
    """`config` (default: `config_type()`) with the fields named in `options` replaced. A name that is not a field
    raises ConfigError naming it, the caller and the fields there are."""
    names = [f.name for f in dataclasses.fields(config_type) if f.init]
    unknown = [k for k in options if k not in names]
    if unknown:
        raise ConfigError(f"{caller}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          f"the options are the fields of {config_type.__name__}: {', '.join(names)}")
    if config is not None and not isinstance(config, config_type):
        raise ConfigError(f"{caller}: config must be a {config_type.__name__}, got {type(config).__name__}")
    base = config if config is not None else config_type()
    return dataclasses.replace(base, **options) if options else base
