"""Which layers a planning config keeps on the host (read by the host-residency invariants).

Two settings put layers on the host: ``host_resident_layers`` names them,
and HiSparse (``PlanningConfig.hisparse``) keeps its sparse-MLA source
layers, the MLA layers with ``cache_role == "SPARSE"``, in its host pool
(contract.md#hisparse-host-pool).
"""

from __future__ import annotations

from collections.abc import Mapping

from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec, MLAAttentionSpec

__all__ = ["hisparse_source_layers", "host_layers"]


def hisparse_source_layers(
    config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
) -> frozenset[str]:
    """The layers HiSparse keeps on the host: sparse-MLA layers, when HiSparse is on."""
    if config.hisparse is None:
        return frozenset()
    return frozenset(
        n for n, s in specs.items() if isinstance(s, MLAAttentionSpec) and s.cache_role == "SPARSE"
    )


def host_layers(config: PlanningConfig, specs: Mapping[str, KVCacheSpec]) -> frozenset[str]:
    """Every layer ``config`` keeps on the host: ``host_resident_layers`` and HiSparse's sources."""
    return frozenset(config.host_resident_layers) | hisparse_source_layers(config, specs)
