"""The invariant catalog: one object, filled by the check modules where each check is written.

Each check is declared once, next to its function, with :func:`invariant`
(or :func:`register` for checks made by a factory).  Everything that needs
the catalog (the runner, ``--list``, xfail validation, the pytest plugin,
the generated docs) reads :func:`catalog`.

A check takes one observation (:mod:`conformance.check.observations`) and
returns an :data:`Outcome`:

- a list of violations: the example judged the invariant (empty: it held);
- :class:`Unjudged` (or ``None``): the example could not judge it, because
  a call it needs failed (the ``KV-CALL-*`` invariants report that) or the
  example does not reach it;
- :class:`Unjudged` with ``applicable=False``: the invariant cannot apply
  to this run at all (the device has no memory counter).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import attrs

from conformance.check.violations import Violation
from conformance.extensions.contributions import check_modules

__all__ = [
    "CONTRACT",
    "Check",
    "Invariant",
    "Outcome",
    "Unjudged",
    "by_id",
    "catalog",
    "flag",
    "invariant",
    "invariant_on",
    "judged_on",
    "register",
    "violation",
]

#: The contract document every invariant cites (shipped in the repository's docs).
CONTRACT = "docs/contract.md"

#: The core's check modules, imported in this order; their registration order
#: is the catalog's.  The extensions' check modules join them in the places
#: they name (:func:`modules`).
_MODULES = (
    "conformance.check.calls",
    "conformance.check.grouping",
    "conformance.check.placement",
    "conformance.check.placement_safety",
    "conformance.check.placement_views",
    "conformance.check.worker_accept",
    "conformance.check.extensible",
    "conformance.check.host",
    "conformance.check.core",
    "conformance.check.meaning",
    "conformance.check.drafts",
    "conformance.check.tp_shards",
    "conformance.check.pitch",
    "conformance.check.processes",
    "conformance.check.profiling",
)


def modules() -> tuple[str, ...]:
    """Every check module in catalog order: the core's, with the extensions' in place."""
    return check_modules(_MODULES)


@attrs.frozen
class Unjudged:
    """An example that said nothing about an invariant.

    Attributes:
        reason: why, in a sentence.
        applicable: ``False`` when the invariant cannot apply to this run at all
            (the device cannot measure it), as opposed to this one example not
            reaching it.
        spoiled: the builder's own answer made the example unjudgeable (a
            config that cannot be allocated, sizes that do not grow with the
            block count...): counted as the builder's, so an invariant no
            example judged is INCONCLUSIVE, never N/A (contract.md#verdicts).
    """

    reason: str
    applicable: bool = True
    spoiled: bool = False


Outcome = "list[Violation] | Unjudged | None"
Check = Callable[[Any], Any]
_F = TypeVar("_F", bound=Callable[..., Any])
_S = TypeVar("_S")


@attrs.frozen(kw_only=True)
class Invariant:
    """One promise of the builder contract.

    Attributes:
        id: stable id, e.g. ``"KV-GROUP-PARTITION"``; vendors put ids in xfail files.
        title: one line.
        anchor: the section of the contract document that states the promise.
        scenarios: the scenarios whose observations it reads (the first is its own).
        check: the pure check.
        requires: capabilities the builder must have for it to apply; a builder
            that declares one unsupported gets the invariant skipped.
        everywhere: it also reads every other scenario's observations (the
            call invariants judge every call the kit makes).
    """

    id: str
    title: str
    anchor: str
    scenarios: tuple[str, ...]
    check: Check
    requires: frozenset[str] = frozenset()
    everywhere: bool = False

    def reads(self, scenario: str) -> bool:
        """Whether it judges the observations of ``scenario``."""
        return self.everywhere or scenario in self.scenarios

    @property
    def reference(self) -> str:
        """Where the contract states the promise, e.g. ``docs/contract.md#grouping-partition``."""
        return f"{CONTRACT}#{self.anchor}"

    @property
    def scenario(self) -> str:
        """The first scenario it reads (the only one, except for the call invariants)."""
        return self.scenarios[0]


_REGISTRY: dict[str, Invariant] = {}
#: Where each id was declared: (its module, its place among that module's declarations).
_DECLARED: dict[str, tuple[str, int]] = {}


def register(inv: Invariant, *, module: str | None = None) -> Invariant:
    """Add ``inv`` to the catalog (``module``: the declaring module; default: the caller's).

    Raises:
        ValueError: another invariant has the same id.
    """
    known = _REGISTRY.get(inv.id)
    if known is not None and known.check is not inv.check:
        raise ValueError(f"invariant id {inv.id!r} is declared twice")
    if module is None:
        module = str(sys._getframe(1).f_globals.get("__name__", ""))
    if inv.id not in _DECLARED:
        place = sum(1 for m, _ in _DECLARED.values() if m == module)
        _DECLARED[inv.id] = (module, place)
    _REGISTRY[inv.id] = inv
    return inv


def invariant(
    id: str,
    title: str,
    *,
    anchor: str,
    scenario: str | Iterable[str],
    requires: Iterable[str] = (),
    in_core: bool = False,
) -> Callable[[_F], _F]:
    """Declare the decorated function as the check of invariant ``id``.

    With ``in_core``, the invariant also judges the hook answers made inside
    Core's flow (the Core proxy runs the same check on each of them) and on
    the one-worker profiling path (the ``profiling`` scenario does likewise).
    """
    scenarios = (scenario,) if isinstance(scenario, str) else tuple(scenario)

    def declare(fn: _F) -> _F:
        check = stamped(id, fn)
        register(
            module=fn.__module__,
            inv=Invariant(
                id=id,
                title=title,
                anchor=anchor,
                scenarios=(*scenarios, "core", "profiling") if in_core else scenarios,
                check=judged_in_core(id, check) if in_core else check,
                requires=frozenset(requires),
            ),
        )
        return cast(_F, check)

    return declare


def judged_on(
    subject: Callable[[Any], _S | Unjudged | None],
    check: Callable[[Any, _S], Any],
    *,
    gate: Callable[[Any], Unjudged | None] | None = None,
) -> Check:
    """``check(obs, found)``, judging what ``subject`` finds in an observation.

    Many checks read one thing out of their observation first (the groups a
    call returned, the configs placed) and judge nothing where it is missing:
    ``subject`` then answers ``None`` (the call failed, ``KV-CALL-*`` reports
    that) or :class:`Unjudged` (why not), and that is the outcome.  ``gate``,
    asked before ``subject``, says why an example cannot judge the invariant
    at all (``None``: it can).
    """

    @functools.wraps(check)
    def judge(obs: Any) -> Any:
        if gate is not None:
            skip = gate(obs)
            if skip is not None:
                return skip
        found = subject(obs)
        if found is None or isinstance(found, Unjudged):
            return found
        return check(obs, found)

    return judge


def invariant_on(
    subject: Callable[[Any], _S | Unjudged | None],
    id: str,
    title: str,
    *,
    gate: Callable[[Any], Unjudged | None] | None = None,
    **declared: Any,
) -> Callable[[Callable[[Any, _S], Any]], Check]:
    """Declare the decorated ``fn(obs, found)`` as the check of ``id``, judged on ``subject``.

    ``subject`` and ``gate`` are :func:`judged_on`'s; ``declared`` are
    :func:`invariant`'s keyword arguments (``anchor``, ``scenario``...).
    """

    def declare(fn: Callable[[Any, _S], Any]) -> Check:
        return invariant(id, title, **declared)(judged_on(subject, fn, gate=gate))

    return declare


def stamped(invariant_id: str, check: Check) -> Check:
    """``check``, with its :func:`flag` violations stamped with ``invariant_id``.

    A check states its invariant's id once, in its declaration; violations
    it takes from a shared helper keep the id the helper gave them.
    """

    @functools.wraps(check)
    def judge(obs: Any) -> Any:
        outcome = check(obs)
        if isinstance(outcome, (list, tuple)):
            return [v if v.invariant else attrs.evolve(v, invariant=invariant_id) for v in outcome]
        return outcome

    return judge


def judged_in_core(invariant_id: str, check: Check) -> Check:
    """``check``, answering for Core's flow and the profiling path from the recorded verdicts."""

    def judge(obs: Any) -> Any:
        verdicts = getattr(obs, "hook_verdicts", None)
        if verdicts is None:
            return check(obs)
        if invariant_id in verdicts:
            return list(verdicts[invariant_id])
        return Unjudged("the flow made no hook call this invariant judges")

    return judge


def catalog() -> tuple[Invariant, ...]:
    """Every invariant, in catalog order: by declaring module, then by declaration.

    The order does not depend on which check module happened to be imported first.
    """
    ordered = modules()
    for module in ordered:
        importlib.import_module(module)
    rank = {m: i for i, m in enumerate(ordered)}

    def key(inv: Invariant) -> tuple[int, int]:
        module, place = _DECLARED.get(inv.id, ("", 0))
        return (rank.get(module, len(rank)), place)

    return tuple(sorted(_REGISTRY.values(), key=key))


def by_id() -> dict[str, Invariant]:
    """The catalog keyed by id."""
    return {inv.id: inv for inv in catalog()}


def flag(message: str, **where: Any) -> Violation:
    """A violation of the invariant whose declared check returns it (the declaration stamps the id).

    ``where``: worker, layer, block, byte_range.
    """
    return Violation(invariant="", message=message, **where)


def violation(invariant: str, message: str, **where: Any) -> Violation:
    """A :class:`Violation` of ``invariant`` (``where``: worker, layer, block, byte_range)."""
    return Violation(invariant=invariant, message=message, **where)
