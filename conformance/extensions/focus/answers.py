"""Focus: more examples where the builder's own code acts.

A vendor builder answers with ``super()`` for most problems and acts on a
few: one model family, and within it only the engine paths its gates accept
(a block-outermost layout, the hybrid manager on, no HiSparse connector, no
model-declared grouping).  The first deal of a scenario (strata.py) gives
every family an equal share, two or three examples at 50 per scenario, and
only some of those take the path the gate wants; a bug that needs one more
feature of the model (an MTP draft layer, every layer indexed) is then found
at some seeds and not at others.

So the run learns, from the first deal of every scenario, the families on
whose examples the builder's answer differed from its baseline's (another
grouping, placement, pool-bytes answer or Core plan, or an answer where the
reference refuses, or the other way round) and the engine paths of those
examples (:func:`~conformance.generate.engine_paths.engine_path`: layout, hybrid
manager, HiSparse).  After every first deal, each scenario declared
``focused`` (:class:`~conformance.scenarios.base.Scenario`) draws
:data:`FOCUS_SHARE` more of its examples, dealt equally over those families
and restricted to those paths; models, splits, memory and block counts are
drawn afresh, so the builder's code is entered again on other structures of
the same family.  Learning from every scenario, not only the one that draws,
matters: a family gets two or three examples per scenario, and a gate that
one scenario's few examples missed, another's opened.

The baseline is the builder's parent when it specialises one (vLLM's
``DefaultKVCacheConfigBuilder`` for a vLLM-native subclass of it), else
kvref's reference: a vLLM-native builder that calls ``super()`` answers as
vLLM does, and where vLLM's answers differ from the reference's (its
documented defects, ``docs/vllm.md``) every such builder differs alike; a
focus learned against the reference would spread over those families and
starve the one where the vendor's own code acts.

Why a difference from the baseline is the signal: a wrong answer always
differs from a conforming one, so the examples on which an answer invariant
can fail lie where the builder's answers differ; it is measured in every
front end, with or without coverage.py, from answers the kit already has.
It is a hint for where to look, never a verdict: a legal builder may answer
differently everywhere, and then every family is focused on, which spreads
the extra examples as the first deal did.  A builder that answers as the
reference does everywhere (the reference itself) draws no extra example.

A run of one invariant runs fewer scenarios and could learn another focus,
so the reproduce lines name the run's focus (``--focus``), which a run then
uses instead of learning one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from conformance.check.observations import (
    CallResult,
    CoreObservation,
    GroupingObservation,
    HostObservation,
    PlacementObservation,
    ProfilingObservation,
)
from conformance.errors import KitError
from conformance.generate.engine_paths import EnginePath, engine_path
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import KVRefError
from kvref.planning import plan_kv_cache

__all__ = ["FOCUS_SHARE", "REFERENCE", "Baseline", "Focus", "answers_differ"]

#: Extra examples a scenario deals to the families where the builder acted,
#: as a share of its examples per scenario.
FOCUS_SHARE = 0.4


@attrs.frozen
class Baseline:
    """What the builder's answers are compared with.

    Attributes:
        builder: a builder instance answering the hooks (kvref's records in and out).
        core: Core's flow for it, with :func:`~kvref.planning.plan_kv_cache`'s signature.
        refusals: the exceptions that mean it refuses a problem (any answer
            then differs; a refusal of the builder's is the same answer).
    """

    builder: Any
    core: Callable[..., Any] = plan_kv_cache
    refusals: tuple[type[BaseException], ...] = (KVRefError,)

    @classmethod
    def of(cls, parent: type[Any] | None) -> Baseline:
        """The baseline of a builder whose parent builder is ``parent`` (``None``: none)."""
        if parent is None or parent is ReferenceKVCacheConfigBuilder:
            return REFERENCE
        # vLLM's default refuses with vLLM's errors (ValueError, AssertionError, ...).
        return cls(parent(), getattr(parent, "kvref_core", None) or plan_kv_cache, (Exception,))


#: kvref's reference, the baseline of builders that specialise no default.
REFERENCE = Baseline(ReferenceKVCacheConfigBuilder())


def _differs(
    result: CallResult | None, expected: Callable[[], Any], baseline: Baseline = REFERENCE
) -> bool:
    """Whether the builder's call answered otherwise than the baseline would.

    Both refusing (an admission error, say) is the same answer whatever the
    errors' types: a vLLM-native builder raises vLLM's.
    """
    if result is None:
        return False
    refused, want = _answer(expected, baseline)
    if refused:
        return result.ok
    if not result.ok:
        return True
    got = result.value
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        return list(got) != list(want)
    return bool(got != want)


def _answer(call: Callable[[], Any], baseline: Baseline) -> tuple[bool, Any]:
    """``(True, None)`` when the baseline refuses ``call``'s problem, else ``(False, answer)``.

    The kit's own errors are not a refusal: they propagate.
    """
    try:
        return False, call()
    except KitError:
        raise
    except baseline.refusals:
        return True, None


def _placement_differs(obs: PlacementObservation, baseline: Baseline) -> bool:
    groups = list(obs.groups)
    if obs.groups_source != "builder":
        # The builder's own groups broke the grouping invariants.
        return True
    config, parent = obs.config, baseline.builder
    placed = obs.results.get(obs.num_blocks)
    refused, theirs = _answer(lambda: obs.groups_by(parent), baseline)
    return (
        refused
        or groups != theirs
        or _differs(
            placed,
            lambda: parent.get_kv_cache_config_from_groups(config, groups, obs.num_blocks),
            baseline,
        )
        or _differs(
            obs.pool_bytes, lambda: parent._get_pool_bytes_per_block(config, groups), baseline
        )
    )


def _host_differs(obs: HostObservation, baseline: Baseline) -> bool:
    parent = baseline.builder
    regrouped = lambda: parent.get_kv_cache_groups(obs.config, dict(obs.specs))  # noqa: E731
    if _differs(obs.groups, regrouped, baseline):
        return True
    groups = list(obs.groups.value)
    return _differs(
        obs.placed,
        lambda: parent.get_kv_cache_config_from_groups(obs.config, groups, obs.num_blocks),
        baseline,
    )


def _profiling_differs(obs: ProfilingObservation, baseline: Baseline) -> bool:
    # The calls run worker by worker: a grouping, then a placement of its groups
    # unless the grouping failed, broke a rule or gave no group.
    parent, calls = baseline.builder, list(obs.calls)
    for specs in obs.workers:
        if not calls:
            return False
        grouped = calls.pop(0)
        regrouped = functools.partial(parent.get_kv_cache_groups, obs.config, dict(specs))
        if _differs(grouped, regrouped, baseline):
            return True
        if calls and calls[0].hook == "get_kv_cache_config_from_groups":
            placed, groups = calls.pop(0), list(grouped.value)
            replaced = functools.partial(
                parent.get_kv_cache_config_from_groups, obs.config, groups, obs.num_blocks
            )
            if _differs(placed, replaced, baseline):
                return True
    return False


def answers_differ(obs: Any, baseline: Baseline = REFERENCE) -> bool | None:
    """Whether the builder answered ``obs``'s example otherwise than ``baseline``.

    ``None`` for observations with no comparable answer (serving, the twin
    process): those scenarios draw no focus.  The profiling path's
    groupings and placements of each worker's own slice count: a family
    that has few examples per scenario opens a builder's gate in one
    scenario's and not another's.
    """
    if isinstance(obs, GroupingObservation):
        return _differs(
            obs.first,
            lambda: baseline.builder.get_kv_cache_groups(obs.config, dict(obs.specs)),
            baseline,
        )
    if isinstance(obs, PlacementObservation):
        return _placement_differs(obs, baseline)
    if isinstance(obs, HostObservation):
        return _host_differs(obs, baseline)
    if isinstance(obs, ProfilingObservation):
        return _profiling_differs(obs, baseline)
    if isinstance(obs, CoreObservation):
        return _differs(
            obs.result,
            lambda: baseline.core(baseline.builder, obs.config, obs.workers, obs.available_memory),
            baseline,
        )
    return None


class Focus:
    """The families and engine paths on which the builder's answers differed from its baseline's.

    Learned from the first deal of every scenario (:meth:`note`), then used
    by every scenario's focus; or given (``--focus``, a reproduce line), in
    which case nothing is learned and the run replays those pins.
    """

    def __init__(
        self,
        given: Mapping[str, frozenset[EnginePath]] | None = None,
        baseline: Baseline = REFERENCE,
    ) -> None:
        self.given = given
        self.baseline = baseline
        self._paths: dict[str, set[EnginePath]] = {}
        #: Per scenario, the extra examples dealt to each family.
        self.extra: dict[str, dict[str, int]] = {}

    def note(self, stratum: str, config: PlanningConfig, obs: Any) -> None:
        """Record one first-deal example of ``stratum``."""
        if self.given is None and answers_differ(obs, self.baseline):
            self._paths.setdefault(stratum, set()).add(engine_path(config))

    def pins(self) -> dict[str, frozenset[EnginePath]]:
        """The families focused on, each with its engine paths."""
        if self.given is not None:
            return dict(self.given)
        return {s: frozenset(p) for s, p in self._paths.items()}

    def adopt(self, pins: Mapping[str, frozenset[EnginePath]]) -> None:
        """Use ``pins``, the union of what every shard of the run learned, from now on."""
        self._paths = {s: set(p) for s, p in pins.items()}

    def drew(self, scenario: str, counts: Sequence[tuple[str, int]]) -> None:
        """Record the extra examples dealt in ``scenario`` (the report's ``coverage``)."""
        if counts:
            self.extra[scenario] = dict(counts)
