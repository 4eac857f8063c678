"""The record every check of the kit returns: one broken promise, with where it broke."""

from __future__ import annotations

import attrs

__all__ = ["TEXT_LIMIT", "Violation", "bounded"]

#: The most characters a violation's message or layer name keeps.  A message
#: quotes what the builder raised or answered (an exception's text, a layer
#: name it made up), and every report format shows it whole.
TEXT_LIMIT = 8000


def bounded(text: str) -> str:
    """``text``, cut to :data:`TEXT_LIMIT` characters with a note of how many were cut."""
    if len(text) <= TEXT_LIMIT:
        return text
    return f"{text[:TEXT_LIMIT]}... [{len(text) - TEXT_LIMIT} more characters cut]"


def _bounded_name(text: str | None) -> str | None:
    return None if text is None else bounded(text)


@attrs.frozen(kw_only=True)
class Violation:
    """One violation of one invariant.

    Attributes:
        invariant: the stable invariant id, e.g. ``"KV-PARTITION"``.
        message: what is wrong and what to look at, in a sentence a vendor can act on.
        worker: index of the worker whose config broke it, when there are several.
        layer: the layer concerned, when one is.
        block: the block ID concerned, when one is.
        byte_range: ``(start, end)`` of the bytes concerned, end exclusive, when known.
    """

    invariant: str
    message: str = attrs.field(converter=bounded)
    worker: int | None = None
    layer: str | None = attrs.field(default=None, converter=_bounded_name)
    block: int | None = None
    byte_range: tuple[int, int] | None = None

    def __str__(self) -> str:
        where = []
        if self.worker is not None:
            where.append(f"worker {self.worker}")
        if self.layer is not None:
            where.append(f"layer {self.layer!r}")
        if self.block is not None:
            where.append(f"block {self.block}")
        if self.byte_range is not None:
            where.append(f"bytes [{self.byte_range[0]}, {self.byte_range[1]})")
        prefix = f"[{self.invariant}] "
        return prefix + (f"{', '.join(where)}: " if where else "") + self.message
