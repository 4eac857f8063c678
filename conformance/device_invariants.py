"""The device rows of the catalog: :mod:`conformance.device` checks as invariants.

They read the same observations as the paper invariants: the placement of
one generated example (``device`` scenario) and, for host residency, the
host scenario's config.  A check that could not be carried out on the
device (no memory counter on cpu/meta, or a config above the allocation
cap) makes the example inconclusive instead of passing it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.device import DEVICE_CHECKS, check_device
from conformance.invariants import Invariant
from conformance.observations import HostObservation, PlacementObservation
from conformance.violations import Violation
from kvref.records import KVCacheConfig

__all__ = ["invariants"]


def _config(obs: Any) -> KVCacheConfig | None:
    if isinstance(obs, PlacementObservation):
        return obs.config_at(obs.num_blocks)
    if isinstance(obs, HostObservation) and obs.placed is not None and obs.placed.ok:
        value: Any = obs.placed.value
        return value if isinstance(value, KVCacheConfig) else None
    return None


def _make(invariant: str, device: str, cap: int | None, notes: dict[str, str]) -> Any:
    def check(obs: Any) -> list[Violation] | None:
        config = _config(obs)
        if config is None or not config.kv_cache_tensors:
            return None
        layout = obs.config.kv_cache_layout
        try:
            (result,) = check_device(config, device, layout=layout, cap=cap, select=(invariant,))
        except ValueError as exc:
            # The plan cannot even be laid out for allocation; the paper invariants say why.
            del exc
            return None
        if result.violations:
            return list(result.violations)
        if not result.measured:
            notes[invariant] = "; ".join(result.notes) or f"not measurable on {device}"
            return None
        return []

    return check


def _explainer(invariant: str, notes: dict[str, str]) -> Callable[[], str | None]:
    def explain() -> str | None:
        return notes.get(invariant)

    return explain


def invariants(device: str, max_alloc_bytes: int | None) -> list[Invariant]:
    """The device invariants for ``device``, allocations capped at ``max_alloc_bytes``."""
    out = []
    notes: dict[str, str] = {}
    for invariant, (title, spec, _fn) in DEVICE_CHECKS.items():
        host = invariant == "KV-DEV-HOST"
        out.append(
            Invariant(
                id=invariant,
                title=title,
                spec=spec,
                scenario="host" if host else "device",
                check=_make(invariant, device, max_alloc_bytes, notes),
                requires=frozenset({"host_resident"}) if host else frozenset(),
                why_unmeasured=_explainer(invariant, notes),
            )
        )
    return out
