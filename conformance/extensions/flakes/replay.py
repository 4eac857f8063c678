"""Replaying a failure: is it deterministic, or flaky?

After the run has shrunk a failure and observed its minimal
counterexample once more (``findings.Findings._failure``), :func:`replay_failure` runs
that same observation and judgement ``runs`` more times, at the end of the run, each on a freshly
constructed builder as every observation is.  A failure that breaks the
invariant on every replay is ``deterministic``; one that held, or could not
be judged, on some replay is ``flaky`` (its verdict depends on something
besides the inputs: time, threads, global state, memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.check.catalog import Unjudged
from conformance.report.model import Replays

__all__ = ["DEFAULT_REPLAYS", "replay_failure"]

#: Replays of each failure unless ``--replays`` says otherwise.
DEFAULT_REPLAYS = 2


def replay_failure(judge_again: Callable[[], Any], runs: int, *, callable_again: bool) -> Replays:
    """Judge a failure's minimal counterexample ``runs`` more times.

    Args:
        judge_again: observes the minimal counterexample afresh and returns the
            invariant's outcome (violations, ``Unjudged`` or nothing).
        runs: how many replays (0: none).
        callable_again: whether the builder may be called again (``False``
            when it hung, or the run was stopped): then nothing is replayed.
    """
    if runs <= 0 or not callable_again:
        return Replays(runs=0, failed=0, verdict="not-replayed")
    failed = 0
    for _ in range(runs):
        outcome = judge_again()
        if outcome and not isinstance(outcome, Unjudged):
            failed += 1
    return Replays(runs=runs, failed=failed, verdict="deterministic" if failed == runs else "flaky")
