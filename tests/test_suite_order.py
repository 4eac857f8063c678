"""The suite's own ordering (tests/conftest.py) names modules that exist."""

from __future__ import annotations

from pathlib import Path

from conftest import _LONG_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_long_first_modules_exist() -> None:
    """A renamed or removed module would silently lose its place at the front."""
    missing = [path for path in _LONG_FIRST if not (ROOT / path).is_file()]
    assert not missing, missing
    assert len(set(_LONG_FIRST)) == len(_LONG_FIRST)
