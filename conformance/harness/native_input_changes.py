"""Changes a hook made to inputs the kit cannot compare with a pristine copy itself.

The kit hands a kvref-native builder kvref records and compares them after
each call (:mod:`conformance.harness.hooks`).  A vLLM-native builder gets a
``VllmConfig`` the vLLM adapter builds for the call, which the kit never
sees: the adapter compares that object's state before and after the hook
(:func:`object_state`, :func:`state_changes`) and records each change here.
The guard collects what a call recorded into its result; an isolated worker
sends it with the answer, so the judging process records it the same way.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["drain", "object_state", "record", "state_changes"]

_LOCK = threading.Lock()
_CHANGES: list[str] = []

#: Values compared as they are; anything else is walked or named by its type.
_SCALARS = (int, float, str, bytes, bool, type(None), enum.Enum)

#: How deep a config object is walked: ``vllm_config.model_config.hf_config.x``
#: is three levels; what a hook could change below that is not planning's.
_DEPTH = 3


def record(*changes: str) -> None:
    """Remember changes a hook made to an input the kit does not compare itself."""
    with _LOCK:
        _CHANGES.extend(changes)


def drain() -> tuple[str, ...]:
    """The changes recorded since the last call, forgotten as they are returned."""
    with _LOCK:
        out = tuple(_CHANGES)
        _CHANGES.clear()
    return out


def _members(obj: Any) -> Iterable[tuple[str, Any]] | None:
    """The named parts of a config object (dataclass fields, or its ``__dict__``)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items()]
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict) and not isinstance(obj, type):
        return [(k, v) for k, v in state.items() if not k.startswith("_")]
    return None


def object_state(root: Any, name: str) -> dict[str, Any]:
    """``{dotted path: value}`` for the scalar leaves of ``root``, walked a few levels deep.

    A part that is neither a scalar nor walkable (or lies deeper) is kept as
    its type's name, so replacing it with another kind of object still shows.
    """
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any, int]] = [(name, root, 0)]
    seen: set[int] = set()
    while stack:
        path, obj, depth = stack.pop()
        if isinstance(obj, _SCALARS):
            out[path] = obj
            continue
        if isinstance(obj, (tuple, list)) and all(isinstance(v, _SCALARS) for v in obj):
            out[path] = (type(obj).__name__, tuple(obj))
            continue
        members = _members(obj) if depth < _DEPTH and id(obj) not in seen else None
        out[path] = f"<{type(obj).__qualname__}>"
        if members is None:
            continue
        seen.add(id(obj))
        # Reversed, so the first name of a part shared by two (hf_config, hf_text_config) wins.
        stack.extend(reversed([(f"{path}.{k}", v, depth + 1) for k, v in members]))
    return out


def state_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One ``path: old -> new`` line per leaf that differs, appears or disappears."""
    changed = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path, "<absent>"), after.get(path, "<absent>")
        if old is new:
            continue
        try:
            same = bool(old == new) and type(old) is type(new)
        except Exception:
            same = False
        if not same:
            changed.append(f"{path}: {old!r:.60} -> {new!r:.60}")
    return changed
