"""The kit's draws depend on the seed and the kit's strategies, not on what else is imported.

Recent Hypothesis versions (6.131 on) sometimes draw an integer, float or
string from *local constants*: literals parsed out of the source of every
module in ``sys.modules`` that is not installed in site-packages.  For the
kit that pool holds its own modules when it runs from a checkout (not when
installed from a wheel), the vendor's builder modules when they are loaded
in the kit's process, and whatever a notebook or a pytest session imported
before.  A seed would then draw different examples in a checkout and in an
installed kit, before and after an unrelated edit, in the CLI and the
plugin, and a reproduce line would not replay what the report judged.
Parsing those modules also cost the default run about 0.7 s.

:func:`seed_only_draws` empties that pool while the kit draws, and restores
it after, so the user's own Hypothesis tests in the same process keep it.
It reaches into Hypothesis' internals; on a version without them it does
nothing (those versions have no such pool).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import attrs

__all__ = ["seed_only_draws"]


@attrs.define
class _Guard:
    """How many draws are inside the guard, and the function it stands in for."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
    depth: int = 0
    saved: Any = None


_GUARD = _Guard()


def _providers() -> tuple[Any, Any]:
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # a Hypothesis without local constants
        return None, None
    if not (
        callable(getattr(providers, "_get_local_constants", None))
        and hasattr(providers, "CONSTANTS_CACHE")
    ):
        return None, None
    return providers, Constants


@contextlib.contextmanager
def seed_only_draws() -> Iterator[None]:
    """Draw with no local constants for the duration (module docstring); re-entrant."""
    providers, constants = _providers()
    if providers is None:
        yield
        return
    with _GUARD.lock:
        if _GUARD.depth == 0:
            _GUARD.saved = providers._get_local_constants
            empty = constants()
            providers._get_local_constants = lambda: empty
            # The cache of permitted constants was filled from the old pool.
            providers.CONSTANTS_CACHE.cache.clear()
        _GUARD.depth += 1
    try:
        yield
    finally:
        with _GUARD.lock:
            _GUARD.depth -= 1
            if _GUARD.depth == 0:
                providers._get_local_constants = _GUARD.saved
                providers.CONSTANTS_CACHE.cache.clear()
                _GUARD.saved = None
