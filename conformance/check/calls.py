"""Hook-call invariants: every hook returns, in time, a value of its documented type.

They read the guarded calls of every scenario, so a hook that fails is
reported once, here, whichever scenario made the call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from conformance.check.catalog import Check, Invariant, Unjudged, register
from conformance.check.catalog import violation as _v
from conformance.check.observations import CallResult
from conformance.check.violations import Violation

#: The construction of the builder, which KV-CALL-CONSTRUCT judges alone.
_INIT = "__init__"


def _all_calls(obs: Any) -> Iterable[CallResult]:
    for field in attrs.fields(type(obs)):
        value = getattr(obs, field.name)
        if isinstance(value, CallResult):
            yield value
        elif isinstance(value, Mapping):
            yield from (v for v in value.values() if isinstance(v, CallResult))
        elif isinstance(value, tuple):
            yield from (v for v in value if isinstance(v, CallResult))


def _failed(kind: str, call: CallResult) -> bool:
    if call.not_called:
        return False  # the hang that stopped the calls is reported once, where it happened
    if kind == "construct":
        return call.hook == _INIT and not call.ok
    if call.hook == _INIT:
        return False
    if kind == "raises":
        # Core may refuse a problem with its own typed error; that is not the
        # builder's ("core-builder": the flow stopped on a hook, reported below).
        return call.error is not None and call.hook not in ("core", "core-builder")
    if kind == "type":
        return call.wrong_type is not None
    return call.timed_out


def _call_check(kind: str, invariant: str) -> Check:
    def check(obs: Any) -> list[Violation] | Unjudged:
        calls = list(_all_calls(obs))
        if not calls:
            return Unjudged("the example made no builder call")
        out = []
        for call in calls:
            failed = _failed(kind, call)
            if failed:
                out.append(
                    _v(
                        invariant,
                        call.describe()
                        + (f"\n{call.traceback}" if call.traceback and kind == "raises" else ""),
                    )
                )
        return out[:1]

    return check


def _call(kind: str, id_: str, title: str) -> Invariant:
    # The call invariants judge every call of every scenario that calls the
    # builder; grouping, the first scenario of a run, is their own.
    return register(
        Invariant(
            id=id_,
            title=title,
            anchor="hook-calls",
            scenarios=("grouping",),
            check=_call_check(kind, id_),
            everywhere=True,
        )
    )


_call("raises", "KV-CALL-RAISES", "hooks return on every valid input instead of raising")
_call("type", "KV-CALL-RETURN-TYPE", "hooks return the documented types")
_call("timeout", "KV-CALL-TIMEOUT", "every hook returns within the per-call deadline")
_call("construct", "KV-CALL-CONSTRUCT", "the builder constructs with no arguments, in time")
