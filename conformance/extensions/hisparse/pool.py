"""HiSparse's host pool: the sparse-MLA source KV lives in a pinned pool the setting sizes.

With HiSparse on (``PlanningConfig.hisparse``), the sparse-MLA source layers
(MLA layers with ``cache_role == "SPARSE"``) are kept on the host
(contract.md#hisparse-host-pool): their pages go to host tensors backed by
a pool of ``host_pool_bytes``, addressed by ``host_num_blocks`` host block
IDs of ``host_block_stride`` bytes, and take no device memory.  The host
invariants (``KV-HOST-*``) read the layers a config keeps on the host from
:mod:`conformance.check.residency`; ``KV-HOST-HISPARSE-POOL`` checks the
pool's sizing.  The
kit computes every expectation from the specs: a host block holds a block
of every source layer, rounded up to the shared pool's alignment when
local ranks share one pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from conformance.check.bounds import tensor_problems
from conformance.check.catalog import Check, Unjudged, invariant_on
from conformance.check.catalog import violation as _v
from conformance.check.observations import HostObservation
from conformance.check.residency import hisparse_source_layers
from conformance.check.violations import Violation
from kvref.config import PlanningConfig
from kvref.records import KVCacheConfig
from kvref.specs import KVCacheSpec

__all__: list[str] = []

_ID = "KV-HOST-HISPARSE-POOL"


def _min_stride(config: PlanningConfig, specs: Mapping[str, KVCacheSpec], sources: Any) -> int:
    stride = sum(specs[n].page_size_bytes for n in sources)
    settings = config.hisparse
    if settings is not None and settings.shared_host_pool:
        align = settings.host_block_alignment
        stride = -(-stride // align) * align
    return stride


def sound_placement(obs: HostObservation) -> KVCacheConfig | None:
    """The host example's placement to read, or ``None`` where another invariant owns it."""
    if obs.placed is None or not obs.placed.ok:
        return None
    value: Any = obs.placed.value
    if not isinstance(value, KVCacheConfig) or tensor_problems(value):
        return None  # sizes no allocator takes: KV-PLACE-SIZE-BOUND's finding
    return value


@attrs.frozen
class HiSparsePlacement:
    """A HiSparse host example's :func:`sound_placement` and its source layers."""

    placed: KVCacheConfig
    sources: frozenset[str]


def _hisparse_placement(obs: Any) -> HiSparsePlacement | Unjudged | None:
    if not isinstance(obs, HostObservation):
        return None
    if obs.config.hisparse is None:
        return Unjudged("the example does not turn HiSparse on", applicable=False)
    sources = hisparse_source_layers(obs.config, obs.specs)
    placed = sound_placement(obs)
    if placed is None or not sources:
        return None
    return HiSparsePlacement(placed, sources)


def hisparse_host_invariant(
    id: str, title: str, *, anchor: str
) -> Callable[[Callable[[HostObservation, HiSparsePlacement], Any]], Check]:
    """Declare a check of a HiSparse host example's sound placement (host-resident builders)."""
    return invariant_on(
        _hisparse_placement,
        id,
        title,
        anchor=anchor,
        scenario="host",
        requires=("host_resident",),
    )


def _pool_findings(obs: HostObservation, placed: KVCacheConfig, sources: Any) -> list[str]:
    pool = obs.config.host_pool_bytes or 0
    blocks, stride = placed.host_num_blocks, placed.host_block_stride
    need = _min_stride(obs.config, obs.specs, sources)
    if stride is None or blocks is None:
        return [
            f"host_num_blocks={blocks} and host_block_stride={stride}: a HiSparse config must "
            "say how its host pool is cut into blocks"
        ]
    out = []
    if stride < need:
        out.append(
            f"host_block_stride={stride} B is smaller than one block of every source layer "
            f"({need} B)"
        )
    settings = obs.config.hisparse
    if settings is not None and placed.shared_host_pool != settings.shared_host_pool:
        out.append(f"shared_host_pool={placed.shared_host_pool} is not the setting's")
    if stride and blocks != pool // stride:
        out.append(
            f"host_num_blocks={blocks}, but host_pool_bytes={pool} holds {pool // stride} host "
            f"blocks of {stride} B: the pool is sized by the host pool setting"
        )
    # Host tensors are views of one host backing, as device tensors are of theirs.
    backing = max((t.size for t in placed.host_tensors), default=0)
    if backing > pool:
        out.append(f"the host backing takes {backing} B, more than host_pool_bytes={pool}")
    return out


@hisparse_host_invariant(
    _ID,
    "HiSparse's source layers fill a host pool sized by host_pool_bytes, in host blocks that fit",
    anchor="hisparse-host-pool",
)
def _hisparse_pool(obs: HostObservation, got: HiSparsePlacement) -> list[Violation]:
    return [_v(_ID, message) for message in _pool_findings(obs, got.placed, got.sources)][:3]
