"""Model outputs that also index and unpack as transformers' `ModelOutput` does, and the forward flags that
transformers callers pass.

    out = model(**batch)
    out.logits;  out["logits"];  out[0];  loss, logits = out;  out.to_tuple();  out.keys()
    model(**batch, return_dict=False)          # the tuple itself

Positions, iteration, `keys()` and `to_tuple()` run over the fields that are not None, in declaration order, and
only over the fields transformers' output of the same model has: bertkit's extras (`masked_positions`, `mlm_loss`,
`nsp_loss`, marked `extra_field()`) are reached by attribute or by name, so `out[1]` and `a, b = out` mean what they
mean in transformers. Unlike transformers (an OrderedDict, whose iteration yields the names), iterating yields the
values: `a, b = out` unpacks tensors.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bertkit.errors import ConfigError

__all__ = ["ENCODER_INPUTS", "ModelOutput", "extra_field", "finish", "forward_flags"]


def extra_field(default=None):
    """A bertkit-only output field: by attribute or name only, not in the tuple view (see the module docstring)."""
    return dataclasses.field(default=default, metadata={"extra": True})


class ModelOutput:
    """Mixin for the @dataclass outputs (see the module docstring)."""

    def items(self) -> list[tuple[str, Any]]:
        """(name, value) of the tuple view: transformers' fields that are not None, in order."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None and not f.metadata.get("extra")]

    def keys(self) -> list[str]:
        return [name for name, _ in self.items()]

    def values(self) -> list[Any]:
        return [value for _, value in self.items()]

    def to_tuple(self) -> tuple:
        return tuple(self.values())

    def get(self, key: str, default=None):
        value = getattr(self, key, None) if key in self._field_names() else None
        return default if value is None else value

    def _field_names(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self)}

    def __getitem__(self, key):
        if isinstance(key, str):
            if key not in self._field_names() or getattr(self, key) is None:
                raise KeyError(f"{type(self).__name__} has no {key!r} here; it holds {self.keys()}")
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self):
        return iter(self.to_tuple())

    def __len__(self) -> int:
        return len(self.items())

    def __contains__(self, key) -> bool:
        return key in self.keys()


# transformers' forward arguments that bertkit takes only at their do-nothing value
_NONE_ONLY = ("head_mask",)
# what a head passes on to its encoder (BertModel.forward)
ENCODER_INPUTS = ("position_ids", "inputs_embeds")


def forward_flags(owner: str, flags: dict[str, Any], allowed: tuple[str, ...] = ()) -> dict[str, Any]:
    """The accepted **flags of a forward: `return_dict`, the names in `allowed`, and transformers' head_mask when
    None; anything else raises ConfigError naming it."""
    out = {}
    for name, value in flags.items():
        if name == "return_dict" or name in allowed:
            out[name] = value
        elif name in _NONE_ONLY:
            if value is not None:
                raise ConfigError(f"{owner}.forward: head_mask is not supported (only None): every head runs in "
                                  f"bertkit's fused attention, as in transformers 5's BERT, which dropped it")
        else:
            raise ConfigError(f"{owner}.forward got an unexpected argument {name!r}; it takes return_dict"
                              f"{''.join(', ' + a for a in allowed)} besides its named arguments")
    return out


def finish(output: ModelOutput, flags: dict[str, Any]):
    """The output, or its tuple when return_dict=False."""
    return output.to_tuple() if flags.get("return_dict") is False else output
