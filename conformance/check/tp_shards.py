"""TP shard counts: a layer's group spec never claims KV replication the layer lacks.

An attention spec's ``max_tp_shards`` says over how many tensor-parallel
ranks the layer's KV is actually split: with ``tp`` ranks, ``tp //
max_tp_shards`` consecutive ranks hold identical KV (MLA's latent is one
shard: every rank holds all of it).  vLLM 0.33.0's Core reads it from the
*group* specs a builder returns, takes the gcd over layers, and writes it to
every config as ``kv_tp_replicas`` (``kv_cache_groups_tp_replicas``), which
KV connectors trust: the offloading connector stores one rank's KV for all
ranks it names identical.  A group spec that claims fewer shards than the
layer has (or a shard count the layer does not record) tells the connector
that ranks holding different heads hold the same bytes.  A group spec that
drops the field claims no replication: connectors then keep every rank's
copy, which costs memory and stays correct (contract.md#grouping-tp-shards).

The rule is judged statically, whatever the drawn tensor-parallel size: the
shard count is the model's fact, as its head count is, and a builder's
grouping that rewrites it is wrong at every size a deployment may choose.
"""

from __future__ import annotations

from conformance.check.catalog import Unjudged
from conformance.check.catalog import violation as _v
from conformance.check.grouping import each_group, given_specs
from conformance.check.observations import GroupingObservation
from conformance.check.violations import Violation
from kvref.records import KVCacheGroupSpec
from kvref.specs import AttentionSpec, KVCacheSpec

__all__ = ["shard_claim"]

_ID = "KV-GROUP-TP-SHARDS"


def shard_claim(spec: KVCacheSpec) -> int | None:
    """The TP shard count ``spec`` records (``None``: none, so no rank shares its KV)."""
    if not isinstance(spec, AttentionSpec):
        return None
    value = getattr(spec, "max_tp_shards", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _claims_more(layer: int | None, kept: int | None) -> bool:
    # Dropping the count claims no replication: always safe.  Any other change
    # claims ranks identical that the layer's own count does not.
    return kept is not None and kept != layer


def _attention_free(obs: GroupingObservation) -> Unjudged | None:
    if not any(isinstance(s, AttentionSpec) for s in obs.specs.values()):
        # No attention layer: no group spec can carry a shard count the layers lack,
        # unless it changes a layer's kind (KV-GROUP-SPEC-MEANING's finding).
        return Unjudged("no attention layer", applicable=False)
    return None


@each_group(
    _ID,
    "a layer's group spec keeps its TP shard count or drops it, never claims another",
    anchor="grouping-tp-shards",
    gate=_attention_free,
)
def _tp_shards(obs: GroupingObservation, index: int, group: KVCacheGroupSpec) -> list[Violation]:
    out = []
    for name, kept, given in given_specs(obs, group):
        layer, claimed = shard_claim(given), shard_claim(kept)
        if _claims_more(layer, claimed):
            out.append(
                _v(
                    _ID,
                    f"group {index} gives {name!r} max_tp_shards={claimed} where the layer "
                    f"records {layer}: Core's kv_tp_replicas would name TP ranks holding "
                    "different KV identical, and a KV connector would keep one rank's copy",
                    layer=name,
                )
            )
    return out
