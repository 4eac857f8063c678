"""What a run's examples covered: distinct models, families, layouts, block counts, kinds, dtypes.

:func:`coverage` summarises the examples one scenario drew (anything with
``workers``, ``config``, ``num_blocks`` and ``description``, as
:class:`conformance.scenarios.examples.Example` has), so a report can say how much
of the input space a run reached, and a change to the generators can be
measured (``benchmarks/example_coverage.py``).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch

from kvref.axes import KVCacheLayout
from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec

__all__ = ["BLOCK_BUCKETS", "block_bucket", "coverage", "family_of"]

#: Block-count buckets, in report order.
BLOCK_BUCKETS = ("1", "2-4", "5-16", "17-1024", ">1024")
#: A placement whose backing passes this many bytes needs 64-bit offsets.
_FOUR_GIB = 1 << 32
_LAYER_OUTER = {KVCacheLayout.LBNHC, KVCacheLayout.LBHNC, KVCacheLayout.LHBNC}
# Problem descriptions start with the model's "<family>: ..." (families.models).
_FAMILY = re.compile(r"^PlanningProblem\('(?:vendor )?([A-Za-z0-9_\-]+):")


class _ExampleLike(Protocol):
    @property
    def config(self) -> PlanningConfig: ...

    @property
    def workers(self) -> tuple[Mapping[str, KVCacheSpec], ...]: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def description(self) -> str: ...


def block_bucket(num_blocks: int) -> str:
    """The :data:`BLOCK_BUCKETS` entry ``num_blocks`` falls in."""
    if num_blocks <= 1:
        return "1"
    if num_blocks <= 4:
        return "2-4"
    if num_blocks <= 16:
        return "5-16"
    if num_blocks <= 1024:
        return "17-1024"
    return ">1024"


def family_of(description: str) -> str:
    """The model family named at the start of an example's description (``unknown`` if none)."""
    match = _FAMILY.match(description)
    return match[1] if match else "unknown"


def _dtype_names(spec: KVCacheSpec) -> list[str]:
    values: list[Any] = [getattr(spec, "dtype", None), *getattr(spec, "dtypes", ())]
    return [str(v).removeprefix("torch.") for v in values if isinstance(v, torch.dtype)]


def _model_key(merged: Mapping[str, KVCacheSpec]) -> tuple[Any, ...]:
    return tuple((name, type(s).__name__, s, s.is_draft) for name, s in merged.items())


def _merged(ex: _ExampleLike) -> dict[str, KVCacheSpec]:
    """Every worker's layers of ``ex``, in one mapping."""
    merged: dict[str, KVCacheSpec] = {}
    for worker in ex.workers:
        merged.update(worker)
    return merged


def coverage_sets(examples: Iterable[_ExampleLike]) -> dict[str, list[Any]]:
    """The distinct models (as digests) and block counts of ``examples``.

    :func:`coverage` counts them; a sharded run's report carries the sets
    themselves, so that the merge counts the distinct values of all shards.
    """
    models: set[str] = set()
    blocks: set[int] = set()
    for ex in examples:
        key = repr(_model_key(_merged(ex)))
        models.add(hashlib.sha256(key.encode()).hexdigest()[:20])
        blocks.add(ex.num_blocks)
    return {"models": sorted(models), "block_counts": sorted(blocks)}


def coverage(examples: Iterable[_ExampleLike]) -> dict[str, Any]:
    """Summarise the examples of one scenario as JSON-able data.

    Keys: ``examples``; ``models``, ``layouts_seen`` and ``block_counts``
    (distinct values); ``families``, ``layouts``, ``block_buckets``,
    ``spec_kinds``, ``dtypes`` and ``workers`` (examples per value; a kind or
    dtype counts once per example that holds it); ``odd_block_counts``,
    ``over_4gib`` (examples whose placement backing, ``num_blocks`` times the
    sum of the device layers' block strides, passes 4 GiB) and
    ``layer_outer_multi_block`` (layer-outer layouts with two or more layers
    and blocks).
    """
    count = 0
    models: set[tuple[Any, ...]] = set()
    counters: dict[str, Counter[str]] = {
        k: Counter() for k in ("families", "layouts", "block_buckets", "spec_kinds", "dtypes")
    }
    counters["workers"] = Counter()
    block_counts: set[int] = set()
    odd = over = layer_outer = 0
    for ex in examples:
        count += 1
        merged = _merged(ex)
        models.add(_model_key(merged))
        counters["families"][family_of(ex.description)] += 1
        counters["layouts"][ex.config.kv_cache_layout.name] += 1
        counters["workers"][str(len(ex.workers))] += 1
        counters["block_buckets"][block_bucket(ex.num_blocks)] += 1
        block_counts.add(ex.num_blocks)
        odd += ex.num_blocks % 2 == 1 and ex.num_blocks > 1
        counters["spec_kinds"].update({type(s).kind for s in merged.values()})
        counters["dtypes"].update({d for s in merged.values() for d in _dtype_names(s)})
        host = ex.config.host_resident_layers
        stride_sum = sum(s.block_stride for n, s in merged.items() if n not in host)
        over += stride_sum * ex.num_blocks > _FOUR_GIB
        layer_outer += (
            ex.config.kv_cache_layout in _LAYER_OUTER and len(merged) >= 2 and ex.num_blocks >= 2
        )
    out: dict[str, Any] = {
        "examples": count,
        "models": len(models),
        "layouts_seen": len(counters["layouts"]),
        "block_counts": len(block_counts),
        "odd_block_counts": odd,
        "over_4gib": over,
        "layer_outer_multi_block": layer_outer,
    }
    for key, counter in counters.items():
        out[key] = dict(sorted(counter.items()))
    return out
