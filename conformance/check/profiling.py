"""Resolution invariant: a platform's qualname resolves to a fresh, stateless builder per call.

vLLM never keeps a builder: every phase (planning, each worker's profiling
call) calls ``get_kv_cache_config_builder()``, which imports the class the
platform names and instantiates it (contract.md#builder-resolution).  The
profiling scenario obtains its builders that way; this check reads what
resolution gave.  The grouping and placement answers of the profiling path
are judged by the hook-answer invariants (declared ``in_core``).
"""

from __future__ import annotations

from conformance.check.catalog import Unjudged, invariant
from conformance.check.catalog import violation as _v
from conformance.check.observations import ProfilingObservation
from conformance.check.violations import Violation

__all__: list[str] = []

_ID = "KV-CALL-FRESH"


def _stateless(obs: ProfilingObservation) -> list[Violation]:
    first, again = obs.first_grouping, obs.again
    if first is None or again is None or not (first.ok and again.ok):
        return []
    if list(first.value) == list(again.value):
        return []
    return [
        _v(
            _ID,
            "a builder resolved after the workers' grouped worker 0's layers differently from "
            "the first one: state carried from one resolved instance to the next",
            worker=0,
        )
    ]


@invariant(
    _ID,
    "resolving the builder's qualname gives a fresh instance of that class per call, stateless",
    anchor="builder-resolution",
    scenario="profiling",
)
def _resolve_fresh(obs: ProfilingObservation) -> list[Violation] | Unjudged | None:
    if not isinstance(obs, ProfilingObservation):
        return None
    if obs.qualname is None:
        return Unjudged(obs.qualname_note, applicable=False)
    if not obs.resolutions:
        return Unjudged("the problem has no worker to resolve a builder for")
    out: list[Violation] = []
    seen: dict[int, int] = {}
    for index, resolution in enumerate(obs.resolutions):
        if not resolution.identity:
            continue  # no object: the builder hung earlier (KV-CALL-TIMEOUT)
        if not resolution.is_named_class:
            out.append(
                _v(
                    _ID,
                    f"resolving {obs.qualname!r} gave a {resolution.type_name}, not an instance "
                    "of the class the qualname names",
                )
            )
        if resolution.identity in seen:
            out.append(
                _v(
                    _ID,
                    f"resolution {index} returned the same object as resolution "
                    f"{seen[resolution.identity]}: vLLM expects a new instance per call",
                )
            )
        seen.setdefault(resolution.identity, index)
    return (out + _stateless(obs))[:3]
