"""The scenarios of a run, in the order a run judges them.

Adding a scenario is one module that declares a
:class:`~conformance.scenarios.base.Scenario`, listed here (or, for an
extension's, in :data:`conformance.extensions.contributions.CONTRIBUTIONS`);
the invariants that read its observations name it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from conformance.extensions.contributions import contributed_scenarios
from conformance.generate.engine_paths import EnginePath
from conformance.generate.limits import NO_LIMITS, Limits
from conformance.generate.records import Model
from conformance.harness.hooks import Context, observe
from conformance.scenarios.base import Draw, Scenario
from conformance.scenarios.core import CORE
from conformance.scenarios.grouping import GROUPING
from conformance.scenarios.host import HOST
from conformance.scenarios.placement import PLACEMENT
from conformance.scenarios.processes import PROCESSES
from conformance.scenarios.profiling import PROFILING

__all__ = ["SCENARIOS", "examples", "get", "names", "observe_in", "scenarios"]

#: Every scenario, in the order a run judges them: the core's, with the
#: extensions' in the places they name (device and serve before processes).
SCENARIOS: tuple[Scenario, ...] = contributed_scenarios(
    (GROUPING, PLACEMENT, HOST, CORE, PROFILING, PROCESSES)
)


def scenarios() -> tuple[Scenario, ...]:
    """Every scenario, in run order."""
    return SCENARIOS


def names() -> tuple[str, ...]:
    """The scenarios' names, in run order."""
    return tuple(s.name for s in SCENARIOS)


def get(name: str) -> Scenario:
    """The scenario called ``name``.

    Raises:
        KeyError: no scenario has that name (the message lists those that exist).
    """
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    raise KeyError(f"no scenario {name!r}; the scenarios are {', '.join(names())}")


def examples(
    name: str,
    models: st.SearchStrategy[Model] | None = None,
    profile: str = "ci",
    limits: Limits = NO_LIMITS,
    paths: frozenset[EnginePath] | None = None,
    lean: bool | None = None,
) -> st.SearchStrategy[Any]:
    """The examples of scenario ``name``, drawn from ``models`` (default: the built-in families).

    ``profile`` sizes what grows with it (the request streams of ``serve``);
    ``limits`` says what the builder cannot be given (never drawn for it);
    ``paths``: only problems on these engine paths (conformance.extensions.focus);
    ``lean``: towards block-outermost layouts (``True``) or away from them.
    """
    return get(name).examples(
        Draw(models=models, profile=profile, limits=limits, paths=paths, lean=lean)
    )


def observe_in(ctx: Context, name: str, example: Any) -> Any:
    """Observe ``example`` in scenario ``name`` (a builder that cannot be constructed too)."""
    return observe(ctx, get(name).observe, example)
