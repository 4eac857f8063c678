"""The serving invariants: what a request stream over the builder's configs must never show.

The ``serve`` scenario (:mod:`conformance.extensions.serve.scenario`) serves
the stream and records the violations of the first step that broke a rule in
a :class:`ServeObservation`; these invariants read them.
"""

from __future__ import annotations

from typing import Any

import attrs

from conformance.check.catalog import Invariant, Unjudged, register
from conformance.check.observations import CallResult
from conformance.check.violations import Violation
from kvref.records import KVCacheConfig

__all__ = ["INVARIANTS", "ISOLATION", "POOL", "ServeObservation"]

#: A request reads back only its own KV.
ISOLATION = "KV-SERVE-ISOLATION"
#: A block ID has one holder; kernels write only blocks their request holds.
POOL = "KV-SERVE-POOL"


@attrs.frozen(kw_only=True)
class ServeObservation:
    """What serving one stream over the builder's configs showed.

    Attributes:
        example: the example served (a serving example: problem, pool, stream).
        configs: the builder's config of each worker (empty when placement failed).
        groups_source: ``builder`` or ``reference`` (the builder's groups broke a
            grouping invariant, reported there).
        violations: the violations of the step that broke an invariant (empty:
            the stream ran clean), or ``None`` when nothing could be served.
        reason: why nothing was served, when it was not.
        calls: the guarded placement calls (the ``KV-CALL-*`` invariants read them).
    """

    example: Any
    configs: tuple[KVCacheConfig, ...]
    groups_source: str
    violations: tuple[Violation, ...] | None
    reason: str | None = None
    calls: tuple[CallResult, ...] = ()


def _serving(invariant_id: str, title: str, anchor: str) -> Invariant:
    """Register a serving invariant: the serve scenario's violations of ``invariant_id``."""

    def check(obs: ServeObservation) -> list[Violation] | Unjudged:
        if obs.violations is None:
            return Unjudged(obs.reason or "nothing was served")
        return [v for v in obs.violations if v.invariant == invariant_id]

    return register(
        Invariant(id=invariant_id, title=title, anchor=anchor, scenarios=("serve",), check=check)
    )


INVARIANTS = (
    _serving(
        ISOLATION,
        "under a request stream, every request reads back only its own KV",
        "serving-isolation",
    ),
    _serving(
        POOL,
        "a block ID has one holder; kernels write only blocks their request holds",
        "serving-pool",
    ),
)
