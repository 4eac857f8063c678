"""What a scenario is: a record of how it draws examples and how it observes a builder.

A scenario module declares one :class:`Scenario` and nothing else needs to
know its name: the runner, the strata, the focus and the Core gate read the
record's fields (:mod:`conformance.scenarios.registry` lists the scenarios
in the order a run judges them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st

from conformance.generate.engine_paths import EnginePath
from conformance.generate.limits import NO_LIMITS, Limits
from conformance.generate.records import Model
from conformance.harness.hooks import Context

__all__ = ["Draw", "Scenario", "any_problem", "every_family", "undrawable_reason"]


@attrs.frozen(kw_only=True)
class Draw:
    """What a run asks of a scenario's examples.

    Attributes:
        models: the models to draw from (``None``: the built-in families).
        profile: the run's profile (sizes what grows with it).
        limits: what the builder cannot be given (never drawn for it).
        paths: only problems on these engine paths (a focus; ``None``: any).
        lean: lean towards layouts whose blocks are outermost (``True``) or
            not (``False``) where the model allows them (``None``: no lean).
    """

    models: st.SearchStrategy[Model] | None = None
    profile: str = "ci"
    limits: Limits = NO_LIMITS
    paths: frozenset[EnginePath] | None = None
    lean: bool | None = None


def every_family(_family: str, _limits: Limits) -> bool:
    """A scenario every model family can serve."""
    return True


def _no_preparation(ctx: Context, _builder: object, _checks: Sequence[Any]) -> Context:
    return ctx


@attrs.frozen(kw_only=True)
class Scenario:
    """One way of observing a builder, and the examples it observes.

    Attributes:
        name: the scenario's name (invariants name the scenarios they read).
        examples: its examples for one run's :class:`Draw`.
        observe: calls the builder on one example and returns the observation
            the invariants read.
        admits: whether a model family can give the scenario a valid example
            under the builder's limits (a family that cannot is not dealt any).
        focused: a run's focus draws more of its examples where the builder's
            answers differ from its baseline's (conformance.extensions.focus).
        explored: ``--explore`` judges its candidates in this scenario.
        leans: its examples follow a :class:`Draw`'s layout lean (the first
            deal then draws each family half on block-outermost layouts).
        prepare: called once before the run's first example, with the
            invariants the run judges in this scenario; returns the run's
            context (e.g. with a helper process started).
        undrawable: why none of a run's models can give the scenario an
            example under the builder's limits (``None``: no reason of its
            own to add); see :func:`undrawable_reason`.
    """

    name: str
    examples: Callable[[Draw], st.SearchStrategy[Any]]
    observe: Callable[[Context, Any], Any]
    admits: Callable[[str, Limits], bool] = every_family
    focused: bool = False
    explored: bool = False
    leans: bool = True
    prepare: Callable[[Context, object, Sequence[Any]], Context] = _no_preparation
    undrawable: Callable[[Limits], str] | None = None


def any_problem(
    name: str,
    examples: Callable[[Draw], st.SearchStrategy[Any]],
    observe: Callable[[Context, Any], Any],
) -> Scenario:
    """A scenario that takes any planning problem as it is: ``focused`` and ``explored``."""
    return Scenario(name=name, examples=examples, observe=observe, focused=True, explored=True)


def undrawable_reason(scenario: Scenario, strata: Sequence[str], limits: Limits) -> str:
    """Why ``scenario``'s invariants cannot apply to a run whose ``strata`` drew it nothing.

    Every stratum dealt examples of the scenario (``strata``) could draw no
    valid one for this builder: the run's models and the builder's limits
    leave the scenario nothing to judge, whatever the builder answers.
    """
    text = (
        f"the {scenario.name} scenario could draw no valid example from this run's "
        f"models ({', '.join(strata)}) for this builder"
    )
    if scenario.undrawable is not None:
        text += f": {scenario.undrawable(limits)}"
    return text
