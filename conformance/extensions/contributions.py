"""What extensions add to the core's judging: scenarios, and check modules that declare invariants.

An extension that adds invariants lists them here, as module names: its
check modules (each registers its invariants with
:mod:`conformance.check.catalog`) and its scenarios (``"module:NAME"`` of a
:class:`~conformance.scenarios.base.Scenario`).  The catalog and the
scenarios' registry read this table and import what it names when first
asked; they never name an extension themselves.

The table imports nothing of the kit: the catalog and the scenarios sit below
the run, and the hooks of :data:`conformance.extensions.registry.EXTENSIONS`
import the run, so reading that list from the catalog would be an import
circle.  An extension with hooks and invariants is listed in both.

Deleting an extension's folder and its entry here leaves a kit without its
scenarios and invariants.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs

__all__ = ["CONTRIBUTIONS", "Contribution", "check_modules", "contributed_scenarios", "woven"]

_T = TypeVar("_T")


@attrs.frozen(kw_only=True)
class Contribution:
    """What one extension adds to the core's judging.

    Attributes:
        extension: the extension's name (its folder under ``conformance/extensions/``).
        scenarios: its scenarios, each ``"module:NAME"``, in run order.
        scenarios_before: the core scenario its scenarios are judged just
            before (``None``: after every core scenario).
        check_modules: its check modules, in catalog order.
        checks_before: the core check module its check modules come just
            before in the catalog (``None``: after every core check module).
    """

    extension: str
    scenarios: tuple[str, ...] = ()
    scenarios_before: str | None = None
    check_modules: tuple[str, ...] = ()
    checks_before: str | None = None


#: Every extension that adds invariants; several placed before one core
#: item keep this order (device's scenario is judged before serve's, and
#: hisparse's check modules come before serve's at the catalog's end).
CONTRIBUTIONS: tuple[Contribution, ...] = (
    Contribution(
        extension="device",
        scenarios=("conformance.extensions.device.scenario:DEVICE",),
        scenarios_before="processes",
        check_modules=(
            "conformance.extensions.device.rows",
            "conformance.extensions.device.kernel",
        ),
        checks_before="conformance.check.profiling",
    ),
    # No scenario of its own: judged on the core's grouping and host scenarios.
    # Listed before serve: both come after every core check module, in this order.
    Contribution(
        extension="hisparse",
        check_modules=(
            "conformance.extensions.hisparse.pool",
            "conformance.extensions.hisparse.groups",
            "conformance.extensions.hisparse.runs",
        ),
    ),
    Contribution(
        extension="serve",
        scenarios=("conformance.extensions.serve.scenario:SERVE_SCENARIO",),
        scenarios_before="processes",
        check_modules=("conformance.extensions.serve.invariants",),
    ),
)


def woven(
    core: Sequence[_T], name: Callable[[_T], str], placed: Iterable[tuple[Sequence[_T], str | None]]
) -> tuple[_T, ...]:
    """``core``, each placed run of items inserted just before the core item it names.

    ``placed``: (items, the ``name`` of the core item they precede, ``None``:
    the end); runs placed at one spot keep their order.

    Raises:
        ValueError: a run names no core item.
    """
    names = {name(item) for item in core}
    before: dict[str | None, list[_T]] = {}
    for items, anchor in placed:
        if anchor is not None and anchor not in names:
            raise ValueError(f"{anchor!r} is not among the core's {sorted(names)}")
        before.setdefault(anchor, []).extend(items)
    out: list[_T] = []
    for item in core:
        out.extend(before.get(name(item), ()))
        out.append(item)
    out.extend(before.get(None, ()))
    return tuple(out)


def check_modules(core: Sequence[str]) -> tuple[str, ...]:
    """The catalog's check modules: ``core``'s, with every extension's in place."""
    return woven(core, str, ((c.check_modules, c.checks_before) for c in CONTRIBUTIONS))


def contributed_scenarios(core: Sequence[Any]) -> tuple[Any, ...]:
    """The run's scenarios: ``core``'s, with every extension's (imported here) in place."""
    return woven(
        core,
        lambda s: str(s.name),
        ((tuple(_load(ref) for ref in c.scenarios), c.scenarios_before) for c in CONTRIBUTIONS),
    )


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
