"""Integer helpers shared by the planner (exact, no floats)."""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["cdiv", "lcm_all", "round_up"]


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ``a`` by positive ``b``."""
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is at least ``x``."""
    # cdiv inlined: placement calls this once per layer and per block stride.
    return -(-x // multiple) * multiple


def lcm_all(values: Iterable[int]) -> int:
    """Least common multiple of ``values`` (1 for none)."""
    result = 1
    for v in values:
        result = math.lcm(result, v)
    return result
