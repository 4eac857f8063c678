"""The device invariants: :mod:`conformance.extensions.device.checks` checks as catalog members.

They read the same observations as the other invariants: the placement of
one generated example (``device`` scenario) and, for host residency, the
host scenario's config, each carrying the device and allocation cap of the
run.  A check the device cannot carry out (no memory counter on cpu/meta)
is not applicable there, with the device's reason; a config above the
allocation cap or one the paper invariants already reject is not judged.
"""

from __future__ import annotations

from typing import Any

from conformance.check.bounds import tensor_problems
from conformance.check.catalog import Invariant, Unjudged, register
from conformance.check.observations import HostObservation, PlacementObservation
from conformance.check.violations import Violation
from conformance.extensions.device.checks import DEVICE_CHECKS, KV_DEV_HOST, check_device
from kvref.records import KVCacheConfig

__all__: list[str] = []


def _config(obs: Any) -> KVCacheConfig | None:
    if isinstance(obs, PlacementObservation):
        return obs.config_at(obs.num_blocks)
    if isinstance(obs, HostObservation) and obs.placed is not None and obs.placed.ok:
        value: Any = obs.placed.value
        return value if isinstance(value, KVCacheConfig) else None
    return None


def _refused(config: KVCacheConfig) -> str | None:
    """Why ``config`` is not allocated at all (``None``: it is tried)."""
    if not config.kv_cache_tensors:
        return "the config has no tensor to allocate"
    problems = tensor_problems(config)
    if problems:
        # Never handed to torch; KV-PLACE-SIZE-BOUND reports the sizes.
        return f"the config's byte counts cannot be allocated: {problems[0]}"
    return None


def _make(invariant: str) -> Any:
    def check(obs: PlacementObservation | HostObservation) -> list[Violation] | Unjudged:
        config = _config(obs)
        if config is None:
            return Unjudged("the builder returned no config for this example", spoiled=True)
        refused = _refused(config)
        if refused is not None:
            # No tensor at all is an attention-free plan; sizes torch cannot take are the builder's.
            return Unjudged(refused, spoiled=bool(config.kv_cache_tensors))
        try:
            (result,) = check_device(
                config,
                obs.device,
                layout=obs.config.kv_cache_layout,
                cap=obs.max_alloc_bytes,
                select=(invariant,),
            )
        except ValueError as exc:
            # The plan cannot even be laid out for allocation; the paper invariants say why.
            return Unjudged(f"the config cannot be laid out for allocation: {exc}", spoiled=True)
        if result.violations:
            return list(result.violations)
        if not result.measured:
            note = "; ".join(result.notes) or f"not measurable on {obs.device}"
            return Unjudged(note, applicable=False)
        return []

    return check


for _id, (_title, _anchor, _fn) in DEVICE_CHECKS.items():
    _host = _id == KV_DEV_HOST
    register(
        Invariant(
            id=_id,
            title=_title,
            anchor="device-checks",
            scenarios=("host",) if _host else ("device",),
            check=_make(_id),
            requires=frozenset({"host_resident"}) if _host else frozenset(),
        )
    )
