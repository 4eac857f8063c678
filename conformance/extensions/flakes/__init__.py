"""Flakes: each failure's minimal counterexample judged again (deterministic or flaky).

The extension's one hook is at the end of the run: every failed
invariant's result gets its :class:`~conformance.report.model.Replays`
(:func:`~conformance.extensions.flakes.replay.replay_failure`).
"""

from __future__ import annotations

from typing import Any

import attrs

from conformance.extensions.base import Extension, RunView, run_option
from conformance.extensions.flakes.replay import replay_failure

__all__ = ["FLAKES", "FlakeOptions"]


@attrs.frozen(kw_only=True)
class FlakeOptions:
    """The flakes extension's options: the run's options of the same names.

    Attributes:
        replays: times each failure's minimal counterexample is judged again (0: none).
    """

    replays: int = run_option("replays")


def _end(options: FlakeOptions, run: RunView, report: Any) -> Any:
    # A builder that hung, or a stopped run, is not called again.
    callable_again = run.guard.hung is None and not run.interrupted
    results = tuple(
        attrs.evolve(
            r,
            replays=replay_failure(
                run.rejudge[r.id], options.replays, callable_again=callable_again
            ),
        )
        if r.id in run.rejudge
        else r
        for r in report.results
    )
    return attrs.evolve(report, results=results)


FLAKES = Extension(name="flakes", options=FlakeOptions, end=_end)
