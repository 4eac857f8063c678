"""Arithmetic only the gated path of :mod:`reach_pkg.gated` uses."""

from __future__ import annotations


def acme_page(pages: list[int]) -> int:
    """The page of a fused Acme tuple: the pages side by side, on a 512-byte granule."""
    total = sum(pages)
    return -(-total // 512) * 512


def other_page(pages: list[int]) -> int:
    """Another vendor builder's helper: no code of :mod:`reach_pkg.gated` names it."""
    return max(pages)
