"""Interrupts that Hypothesis reports as an error of its own.

A KeyboardInterrupt that lands while Hypothesis sets up or tears down a
run (its engine not yet built, a health check, the shrinker's bookkeeping)
can come out as one of Hypothesis' own exceptions, with the interrupt as its
cause or context.  Every place the kit runs Hypothesis and catches
exceptions must turn that back into the interrupt: the user asked the run to
stop, and nothing failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["interrupts_unmasked", "masked_interrupt"]


def masked_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while handling a KeyboardInterrupt."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


@contextlib.contextmanager
def interrupts_unmasked() -> Iterator[None]:
    """Around a Hypothesis run: an error :func:`masked_interrupt` recognises is the interrupt."""
    try:
        yield
    except Exception as exc:
        if masked_interrupt(exc):
            raise KeyboardInterrupt from exc
        raise
