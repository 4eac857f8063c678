"""``pick`` draws what ``draw(st.sampled_from(values))`` draws, with one strategy per list."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import find, given, seed, settings
from hypothesis import strategies as st

from conformance.generate import sampled_from_cache
from conformance.generate.sampled_from_cache import pick

LISTS: list[Any] = [[4, 2, 3], ("none", "align", "all"), [torch.bfloat16, torch.float32]]


def _run(use_pick: bool) -> list[Any]:
    seen: list[Any] = []

    @st.composite
    def three(draw: st.DrawFn) -> tuple[Any, ...]:
        if use_pick:
            return tuple(pick(draw, values) for values in LISTS)
        return tuple(draw(st.sampled_from(values)) for values in LISTS)

    @settings(max_examples=60, database=None)
    @seed(11)
    @given(three())
    def record(value: tuple[Any, ...]) -> None:
        seen.append(value)

    record()
    return seen


def test_the_same_values_as_a_fresh_strategy() -> None:
    assert _run(use_pick=True) == _run(use_pick=False)


def test_one_strategy_per_list_and_a_copy_of_it() -> None:
    values = [7, 8, 9]

    @st.composite
    def one(draw: st.DrawFn) -> int:
        return pick(draw, values)

    find(one(), lambda _: True)
    key = (list, (7, 8, 9))
    built = sampled_from_cache._BUILT[key]
    find(one(), lambda _: True)
    assert sampled_from_cache._BUILT[key] is built
    values.append(10)  # the caller's list changes: the kept strategy does not
    assert list(built.elements) == [7, 8, 9]  # type: ignore[attr-defined]
