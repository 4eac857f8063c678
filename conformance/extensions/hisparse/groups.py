"""HiSparse's groups as vLLM 0.33.0's runtime reads them: roles and hot-buffer sizes.

vLLM's KV cache coordinator finds HiSparse's host manager through the
group whose role is ``HISPARSE_SOURCE`` (and the indexer through
``HISPARSE_INDEXER``); a builder that rebuilds those groups with the default
role starts an engine with no host manager.  Each hot group's
``blocks_per_request`` is the hot buffer every request holds: the buffer has
``device_buffer_size`` rows when the setting gives one, else one
``index_topk`` per decode query token plus one, ``(max_decode_query_len +
1) x top_k`` (speculative decoding raises the query length), and a request
takes ``cdiv(rows, block_size)`` blocks of it (contract.md#hisparse).  The kit
computes the rows from the settings and the source layers' fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from conformance.check.catalog import Check, Unjudged
from conformance.check.catalog import violation as _v
from conformance.check.geometry import cdiv
from conformance.check.grouping import Groups, grouping_invariant
from conformance.check.observations import GroupingObservation
from conformance.check.residency import hisparse_source_layers
from conformance.check.violations import Violation
from kvref.config import PlanningConfig
from kvref.extra_specs import HiSparseHotSpec
from kvref.specs import KVCacheSpec, MLAAttentionSpec

__all__ = ["hot_rows"]

_HOT = "KV-GROUP-HISPARSE-HOT-BLOCKS"
_ROLES = "KV-GROUP-HISPARSE-ROLES"


def hot_rows(config: PlanningConfig, specs: Mapping[str, KVCacheSpec]) -> int | None:
    """Hot-buffer rows per request; ``None`` when no source layer says its top-k."""
    settings = config.hisparse
    if settings is None:
        return None
    if settings.device_buffer_size is not None:
        return settings.device_buffer_size
    widths = []
    for name in hisparse_source_layers(config, specs):
        spec = specs[name]
        width = spec.topk_buffer_width if isinstance(spec, MLAAttentionSpec) else None
        width = settings.index_topk if width is None else width
        if width is None:
            return None
        widths.append(width)
    return (settings.max_decode_query_len + 1) * max(widths) if widths else None


def _hisparse_groups(obs: GroupingObservation) -> Unjudged | None:
    """Why the example cannot judge HiSparse's groups, if it cannot."""
    if obs.config.hisparse is None:
        return Unjudged("the example does not turn HiSparse on", applicable=False)
    if not hisparse_source_layers(obs.config, obs.specs):
        return Unjudged("no sparse-MLA source layer: HiSparse's grouping does not apply")
    return None


def _hisparse_invariant(
    id: str, title: str
) -> Callable[[Callable[[GroupingObservation, Groups], Any]], Check]:
    """Declare a check of HiSparse's groups (contract.md#hisparse), where the example has them."""
    return grouping_invariant(id, title, anchor="hisparse", gate=_hisparse_groups)


@_hisparse_invariant(
    _HOT, "HiSparse's hot groups hold the hot buffer the settings size, in blocks per request"
)
def _hot_blocks(obs: GroupingObservation, groups: Groups) -> list[Violation] | Unjudged | None:
    rows = hot_rows(obs.config, obs.specs)
    if rows is None:
        return Unjudged("no top-k for the source layers: the hot buffer has no size")
    settings = obs.config.hisparse
    why = (
        f"device_buffer_size={settings.device_buffer_size}, max_decode_query_len="
        f"{settings.max_decode_query_len}"
        if settings is not None
        else ""
    )
    out = []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        if not isinstance(spec, HiSparseHotSpec):
            continue
        want = cdiv(rows, spec.block_size)
        if spec.blocks_per_request != want:
            out.append(
                _v(
                    _HOT,
                    f"hot group {i} holds blocks_per_request={spec.blocks_per_request}; a hot "
                    f"buffer of {rows} rows ({why}) takes cdiv({rows}, {spec.block_size}) = "
                    f"{want} blocks",
                )
            )
    return out[:3]


@_hisparse_invariant(_ROLES, "HiSparse's source and indexer layers sit in groups with their roles")
def _roles(obs: GroupingObservation, groups: Groups) -> list[Violation] | Unjudged | None:
    grouped = [n for g in groups for n in g.layer_names]
    if len(grouped) != len(set(grouped)) or set(grouped) != set(obs.specs):
        return None  # a layer missing or repeated is KV-GROUP-PARTITION's finding
    wanted = {
        "HISPARSE_SOURCE": hisparse_source_layers(obs.config, obs.specs),
        "HISPARSE_INDEXER": frozenset(
            n
            for n, s in obs.specs.items()
            if isinstance(s, MLAAttentionSpec) and s.cache_role == "INDEXER"
        ),
    }
    out = []
    for role, names in wanted.items():
        holders = [i for i, g in enumerate(groups) if names & set(g.layer_names)]
        wrong = [i for i in holders if groups[i].role != role]
        if names and (len(holders) != 1 or wrong):
            out.append(
                _v(
                    _ROLES,
                    f"the {len(names)} layers vLLM's coordinator finds by role {role} sit in "
                    f"groups {holders} with roles {[groups[i].role for i in holders]}; they "
                    f"must form one group with role {role}",
                    layer=min(names),
                )
            )
    return out
