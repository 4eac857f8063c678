"""Whether a vLLM-native hook's answer is made only of what vLLM's own classes hold.

The vLLM adapter converts a hook's answer to kvref records.  When that
conversion raises on an answer of the documented type, the converter is at
fault (a kit error) only if the answer holds nothing but plain values: a
builder that plants a value whose truth, order or text raises (an ``int``
subclass, an object of its own) would otherwise turn its own failure into
the kit's.  :func:`odd_part` finds such a value without calling any of its
methods: only ``type()``, the members of vLLM's own record classes and the
instance fields of a vendor's subclass of one are read.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import Any

__all__ = ["odd_part"]

#: Values taken as they are, by exact type (a subclass may override anything).
_LEAVES = frozenset({int, float, str, bool, bytes, type(None)})

#: Containers walked, by exact type.
_SEQUENCES = frozenset({list, tuple})

#: How much of an answer is walked: far more than any answer of vLLM's holds.
_MAX_DEPTH = 8
_MAX_PARTS = 100_000


def _trusted_module(cls: type) -> bool:
    """Whether ``cls`` is vLLM's or torch's own: defined there and found there by name."""
    module = cls.__dict__.get("__module__")
    if not isinstance(module, str) or module.partition(".")[0] not in ("vllm", "torch"):
        return False
    return getattr(sys.modules.get(module), cls.__name__, None) is cls


def _plain_leaf(value: Any) -> bool:
    cls = type(value)
    if cls in _LEAVES:
        return True
    # torch dtypes and vLLM's enums (a layout, a role) hold nothing a builder chose.
    return _trusted_module(cls) and (isinstance(value, enum.Enum) or cls.__name__ == "dtype")


def odd_part(answer: Any) -> str | None:
    """Where ``answer`` holds a value that is not vLLM's or a plain value (``None``: nowhere).

    Plain: ``int``, ``float``, ``str``, ``bool``, ``bytes`` and ``None`` of
    exactly those types, torch dtypes, vLLM's enums, lists, tuples and dicts
    of plain values, and instances of vLLM's own dataclasses, or of a
    vendor's dataclass subclass of one, whose fields are plain.  The answer
    is ``"answer..."``, e.g. ``"answer.kv_cache_tensors[0].size (a _RaisingInt)"``.
    """
    stack: list[tuple[str, Any, int]] = [("answer", answer, 0)]
    parts = 0
    while stack:
        path, value, depth = stack.pop()
        parts += 1
        if parts > _MAX_PARTS or depth > _MAX_DEPTH:
            return f"{path} (nested past what vLLM's records hold)"
        if _plain_leaf(value):
            continue
        cls = type(value)
        if cls in _SEQUENCES:
            stack.extend((f"{path}[{i}]", v, depth + 1) for i, v in enumerate(value))
        elif cls is dict:
            for key, item in value.items():
                if type(key) not in _LEAVES:
                    return f"{path} (a key of type {type(key).__name__})"
                stack.append((f"{path}[{key!r:.40}]", item, depth + 1))
        elif _trusted_module(cls) and dataclasses.is_dataclass(cls):
            stack.extend(
                (f"{path}.{f.name}", getattr(value, f.name), depth + 1)
                for f in dataclasses.fields(cls)
            )
        elif _vendor_record(cls):
            # A vendor's subclass of a vLLM record is legal (vLLM plans it as
            # its base): its fields are judged, read from the instance itself.
            try:
                state = object.__getattribute__(value, "__dict__")
            except AttributeError:
                return f"{path} (a {cls.__name__} without instance fields)"
            names = [f.name for f in dataclasses.fields(cls)]
            if type(state) is not dict or any(name not in state for name in names):
                return f"{path} (a {cls.__name__} without its fields)"
            stack.extend((f"{path}.{name}", state[name], depth + 1) for name in names)
        else:
            return f"{path} (a {cls.__name__})"
    return None


def _vendor_record(cls: type) -> bool:
    """Whether ``cls`` is a dataclass subclass of one of vLLM's dataclasses."""
    return dataclasses.is_dataclass(cls) and any(
        _trusted_module(base) and dataclasses.is_dataclass(base) for base in cls.__mro__[1:]
    )
