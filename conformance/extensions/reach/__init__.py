"""Reach: how much of the builder's code the run's examples ran, and when.

The harness measures the lines (``conformance.harness.reach``: traced here
and in the builder's worker); this extension reads the run's meter after
each phase of examples (the report's ``reach.over_time``) and puts the
meter's figures (figures.py) in the report at the end, and shows them in
the text report.
"""

from __future__ import annotations

from typing import Any

import attrs

from conformance.extensions.base import Extension, RunView
from conformance.extensions.reach.figures import summary

__all__ = ["REACH"]


@attrs.define
class _Curve:
    """``{"after": phase, "examples": judged so far, "lines": builder lines run}``, per phase."""

    points: list[dict[str, Any]] = attrs.field(factory=list)


def _start(_run_options: Any, _options: None) -> _Curve:
    return _Curve()


def _after_phase(curve: _Curve, run: RunView, label: str) -> None:
    if run.shared.meter is not None:
        judged = sum(len(examples) for examples in run.drawn.values())
        curve.points.append({"after": label, "examples": judged, "lines": run.shared.reach_lines()})


def _end(curve: _Curve, run: RunView, report: Any) -> Any:
    if run.shared.meter is None:
        return report
    reach = summary(run.shared.meter)
    reach["over_time"] = curve.points
    return attrs.evolve(report, reach=reach)


def _render(report: Any) -> list[str]:
    if report.reach:
        return ["", *report.reach.get("lines", [])]
    return ["", "Reach: not measured (--no-reach, or no coverage.py: pip install coverage)"]


REACH = Extension(name="reach", start=_start, after_phase=_after_phase, end=_end, render=_render)
