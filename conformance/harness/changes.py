"""In-place changes a builder made to its arguments in its worker, mirrored on the kit's.

The worker's arguments are unpickled copies of the kit's.  Both sides walk
their copy in the same order (:func:`conformance.harness.worker_side.walk`),
so an object's index names it on both sides; the worker reports each walked
object whose contents it finds changed, with references to walked objects
kept as indices, and :func:`apply_changes` makes the kit's own arguments show
them (so the input-unchanged invariants see them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from conformance.harness import wire
from conformance.harness.worker_side import Ref, walk

__all__ = ["IsolationError", "apply_changes"]


class IsolationError(RuntimeError):
    """A value could not cross the process boundary (it does not pickle)."""


def apply_changes(args: Any, changes: Sequence[tuple[int, list[Ref]]]) -> None:
    """Make the kit's own arguments show the changes the builder made to its copies."""
    if not changes:
        return
    objects = walk(args)
    for i, encoded in changes:
        if type(i) is not int or not 0 <= i < len(objects):
            raise IsolationError(f"the worker reported a change of argument object {i!r:.40}")
        values = [_changed_value(objects, kind, v) for kind, v in encoded]
        obj = objects[i]
        if isinstance(obj, list):
            obj[:] = values
        elif isinstance(obj, dict):
            obj.clear()
            obj.update(zip(values[::2], values[1::2], strict=True))
        else:
            for field, value in zip(attrs.fields(type(obj)), values, strict=True):
                object.__setattr__(obj, field.name, value)
            forget = getattr(obj, "_forget_memoised", None)
            if callable(forget):
                forget()


def _changed_value(objects: Sequence[Any], kind: str, value: Any) -> Any:
    if kind == "ref":
        if type(value) is not int or not 0 <= value < len(objects):
            raise IsolationError(f"the worker reported a reference {value!r:.40}")
        return objects[value]
    if kind != "val":
        raise IsolationError(f"the worker reported a change of kind {kind!r:.40}")
    return wire.decode(value, "changed argument")
