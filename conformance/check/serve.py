"""The serving invariants: what a request stream over the builder's configs must never show.

The ``serve`` scenario (:mod:`conformance.scenarios.serve`) serves the stream
and records the violations of the first step that broke a rule; these
invariants read them.
"""

from __future__ import annotations

from typing import Any

from conformance.check.catalog import Invariant, Unjudged, register
from conformance.check.observations import ServeObservation
from conformance.check.violations import Violation

__all__ = ["INVARIANTS", "ISOLATION", "POOL"]

#: A request reads back only its own KV.
ISOLATION = "KV-SERVE-ISOLATION"
#: A block ID has one holder; kernels write only blocks their request holds.
POOL = "KV-SERVE-POOL"


def _judge(invariant_id: str) -> Any:
    def check(obs: ServeObservation) -> list[Violation] | Unjudged:
        if obs.violations is None:
            return Unjudged(obs.reason or "nothing was served")
        return [v for v in obs.violations if v.invariant == invariant_id]

    return check


INVARIANTS = (
    register(
        Invariant(
            id=ISOLATION,
            title="under a request stream, every request reads back only its own KV",
            anchor="serving-isolation",
            scenarios=("serve",),
            check=_judge(ISOLATION),
        )
    ),
    register(
        Invariant(
            id=POOL,
            title="a block ID has one holder; kernels write only blocks their request holds",
            anchor="serving-pool",
            scenarios=("serve",),
            check=_judge(POOL),
        )
    ),
)
