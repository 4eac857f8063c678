"""Draw one of a few values through a strategy built once per value list.

``draw(st.sampled_from([...]))`` inside a composite makes a new strategy at
every draw, which Hypothesis then validates and labels; across a default
run's thousands of draws that was a noticeable share of generation.
:func:`pick` draws exactly what that expression draws (the same strategy,
with the same elements and so the same label), built once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from hypothesis import strategies as st

__all__ = ["pick"]

T = TypeVar("T")

#: Lists longer than this (layer names, say) are not kept: few repeat.
_MOST_VALUES = 32
#: Value lists kept at once; the cache starts again past it.
_MOST_LISTS = 1024

_BUILT: dict[tuple[type, tuple[Any, ...]], st.SearchStrategy[Any]] = {}


def pick(draw: st.DrawFn, values: Sequence[T]) -> T:
    """``draw(st.sampled_from(values))``, with the strategy built once per ``values``."""
    if type(values) not in (list, tuple) or len(values) > _MOST_VALUES:
        return draw(st.sampled_from(values))
    key = (type(values), tuple(values))
    try:
        strategy = _BUILT.get(key)
    except TypeError:  # an unhashable value
        return draw(st.sampled_from(values))
    if strategy is None:
        if len(_BUILT) >= _MOST_LISTS:
            _BUILT.clear()
        # A copy: the caller may change its list later.
        copy: Sequence[T] = list(key[1]) if isinstance(values, list) else tuple(key[1])
        strategy = _BUILT[key] = st.sampled_from(copy)
    drawn: T = draw(strategy)
    return drawn
