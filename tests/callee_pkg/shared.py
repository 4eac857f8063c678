"""Helpers shared by several builders: each counts only where some builder's code names it."""

from __future__ import annotations

from typing import Any


class Plan:
    """Named by the builder: every method counts (methods are dispatch targets)."""

    def used(self) -> int:
        return _inner()

    def also_counts(self) -> int:
        return 0


class OnlyAnnotated:
    """Named only in an annotation: a type, not code that runs."""

    def never(self) -> int:
        return 0


def _inner() -> int:
    return 1


def registered() -> int:
    return 2


def unnamed() -> int:
    """Named by no code of the builder: another builder's helper."""
    return 3


REGISTRY: dict[str, Any] = {"r": registered}
