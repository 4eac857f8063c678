"""Efficiency warnings (never a verdict): each ``core`` plan against the reference's.

The extension's hooks: after each judged ``core`` example, compare its plan
(:class:`~conformance.extensions.waste.meter.WasteMeter`); at the end of
the run, the report's ``waste`` section when the run judged ``core``
(records.py), and its section of the text report.
"""

from __future__ import annotations

from typing import Any

import attrs

from conformance.check.observations import CoreObservation
from conformance.extensions.base import Extension, Judged, RunView
from conformance.extensions.waste.meter import WasteMeter
from conformance.extensions.waste.records import section_lines

__all__ = ["WASTE"]


@attrs.define
class _Waste:
    """The run's meter, made at its first ``core`` example.

    The meter asks whether the prepared builder is the reference, and the
    builder is prepared after the extensions start.
    """

    meter: WasteMeter | None = None


def _start(_run_options: Any, _options: None) -> _Waste:
    return _Waste()


def _after_example(state: _Waste, run: RunView, judged: Judged) -> None:
    if not isinstance(judged.observation, CoreObservation):
        return
    if state.meter is None:
        state.meter = WasteMeter.for_builder(run.builder)
    state.meter.add(judged.observation, judged.example)


def _end(state: _Waste, run: RunView, report: Any) -> Any:
    if "core" not in run.drawn:
        return attrs.evolve(report, waste=None)
    meter = state.meter or WasteMeter.for_builder(run.builder)
    return attrs.evolve(report, waste=meter.summary())


def _render(report: Any) -> list[str]:
    return section_lines(report.waste)


WASTE = Extension(
    name="waste", start=_start, after_example=_after_example, end=_end, render=_render
)
