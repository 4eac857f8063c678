"""Hook purity (contract.md#hook-purity): the findings every hook's purity invariants share.

A hook changes nothing it is given, and answers the same input the same way
on the same instance and on a fresh one.  Each hook's invariants state the
rule in their own words; the judging is the same and is written here once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from conformance.check.catalog import flag
from conformance.check.observations import CallResult
from conformance.check.violations import Violation

__all__ = ["changed_input", "unstable"]


def changed_input(mutations: Sequence[str], hook: str, rule: str) -> list[Violation]:
    """The finding that ``hook`` made ``mutations`` to its input (none: no finding).

    The message names the first four changes (layer, field, old -> new) and
    how many more there are, then ``rule``: what the hook may and may not change.
    """
    if not mutations:
        return []
    changes = "; ".join(mutations[:4])
    more = f" (and {len(mutations) - 4} more)" if len(mutations) > 4 else ""
    return [flag(f"{hook} changed its input: {changes}{more}. {rule}")]


def unstable(
    base: CallResult | None,
    repeat: CallResult,
    fresh: CallResult,
    *,
    again: str,
    anew: str,
    value: Callable[[Any], Any] = lambda answer: answer,
) -> list[Violation] | None:
    """Findings of a hook that answered one input differently: ``None`` when a call failed.

    ``again``: the message when the repeat call on the same instance differs
    from ``base``; ``anew``: when a fresh instance's call does.  Answers are
    compared as ``value`` makes them.
    """
    if base is None or not (base.ok and repeat.ok and fresh.ok):
        return None
    want = value(base.value)
    return [
        flag(message)
        for answer, message in ((repeat, again), (fresh, anew))
        if value(answer.value) != want
    ]
