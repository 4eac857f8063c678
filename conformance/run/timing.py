"""Where a run's time goes: per invariant, and per scenario for what invariants share.

The runner observes the builder once per example and lets every selected
invariant of the scenario judge that one observation, so the observation's
cost belongs to no single invariant.  :class:`InvariantClock` therefore
measures two things apart, with ``time.perf_counter``:

- per invariant, the time spent on it alone: its check on every example's
  observation, its shrinking (which observes again, for that invariant
  only), the re-observation of its minimal counterexample, its inherited and
  upstream comparisons and its replays (:mod:`conformance.extensions.flakes`);
- per scenario, the time spent observing the builder on the shared examples.

The JUnit file's per-testcase ``time`` is the first; the second is reported
beside it (``observe_seconds``), never split among invariants by a guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["InvariantClock"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class InvariantClock:
    """Accumulates the seconds of calls, per invariant and per scenario."""

    def __init__(self) -> None:
        self._judging: dict[str, float] = {}
        self._observing: dict[str, float] = {}

    @staticmethod
    def _timed(
        into: dict[str, float],
        key: str,
        call: Callable[_P, _T],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _T:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            # Counted even when the call raises: a check that crashes took that long too.
            into[key] = into.get(key, 0.0) + time.perf_counter() - started

    def judge(
        self, invariant: str, call: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> _T:
        """Run ``call`` and count its time as spent on ``invariant`` alone."""
        return self._timed(self._judging, invariant, call, *args, **kwargs)

    def observe(
        self, scenario: str, call: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> _T:
        """Run ``call`` and count its time as ``scenario``'s shared observation."""
        return self._timed(self._observing, scenario, call, *args, **kwargs)

    def seconds(self, invariant: str) -> float:
        """Seconds spent on ``invariant`` alone so far."""
        return self._judging.get(invariant, 0.0)

    def observe_seconds(self) -> dict[str, float]:
        """Seconds of shared observation per scenario."""
        return dict(self._observing)
