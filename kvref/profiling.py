"""The profiling path: one worker's minimal KV cache for CUDA-graph capture.

See contract.md#profiling-path.

Before Core plans the real cache, a worker that captures CUDA graphs
allocates the smallest cache that still lets every graph be captured
(vLLM ``_init_minimal_kv_cache_for_profiling``, in the V1 runner and in
``gpu/cudagraph_utils.py``).  It differs from planning in what the builder
sees: **one worker's** specs (its own pipeline-parallel slice), with no
cross-worker merge, no ``extra_retained_tokens`` tagging of sliding windows
and no EAGLE annotation; and in the block count it asks for, one block per
sequence: ``min(max_num_reqs, max_cudagraph_capture_size) or 1``.

vLLM 0.33.0 has no public function for this; :func:`plan_profiling_kv_cache`
is kvref's.  Deliberate difference (as everywhere in kvref): the reference
builder returns exactly the blocks asked for, where vLLM's default builder
returns ``num_gpu_blocks_override`` when it is set.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kvref.config import PlanningConfig
from kvref.errors import ConfigError, PlanningError, SpecError
from kvref.partition import (
    check_exact_partition,
    check_spec_fields,
    check_spec_registry,
    check_wrapped_layers,
)
from kvref.planning import BuilderLike, fresh_builder
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["ProfilingPlan", "plan_profiling_kv_cache", "profiling_num_blocks"]


def _count(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{field}={value!r} must be an int >= 0")
    return value


def profiling_num_blocks(max_num_reqs: int, max_cudagraph_capture_size: int) -> int:
    """Blocks of the profiling cache: one per sequence, ``min(reqs, capture size) or 1``.

    Raises:
        ConfigError: an argument is not an int >= 0.
    """
    reqs = _count(max_num_reqs, "max_num_reqs")
    capture = _count(max_cudagraph_capture_size, "max_cudagraph_capture_size")
    return min(reqs, capture) or 1


@attrs.frozen(kw_only=True)
class ProfilingPlan:
    """What the profiling path produced for one worker.

    Attributes:
        groups: the builder's groups over the worker's own specs.
        num_blocks_requested: the block count asked of the builder.
        config: the builder's placement for that count.
    """

    groups: tuple[KVCacheGroupSpec, ...]
    num_blocks_requested: int
    config: KVCacheConfig


def plan_profiling_kv_cache(
    builder: BuilderLike,
    config: PlanningConfig,
    worker_specs: Mapping[str, KVCacheSpec],
    *,
    max_num_reqs: int,
    max_cudagraph_capture_size: int,
    check_registry: bool = True,
) -> ProfilingPlan:
    """Group one worker's layers and place the minimal profiling cache (contract.md#profiling-path).

    Steps, as vLLM's runners take them: the registry check (the V1 runner;
    pass ``check_registry=False`` for the V2 runner, which skips it), a
    fresh builder, ``get_kv_cache_groups`` on a copy of ``worker_specs``
    followed by Core's exact-partition check, then
    ``get_kv_cache_config_from_groups`` for :func:`profiling_num_blocks` blocks
    with the same builder.

    Args:
        builder: a builder instance, a class, or ``None`` for the config's builder.
        config: the planning config (read as is: no auto-fit, no override handling;
            a layout left to planning is resolved from ``worker_specs``; resolve it
            from every worker's with :meth:`PlanningConfig.with_resolved_layout` first
            to match a multi-worker Core).
        worker_specs: this worker's ``{layer name: spec}`` (not mutated).
        max_num_reqs: the scheduler's ``max_num_seqs``.
        max_cudagraph_capture_size: the largest CUDA-graph batch (0: no graphs).
        check_registry: run Core's registry check first.

    Raises:
        SpecError: a key is not a str, a value is not a per-layer spec, or (with
            ``check_registry``) a spec class is not registered for planning.
        PartitionError: the groups do not partition the worker's layers.
        PlanningError: the builder's placement is not a ``KVCacheConfig``.
        ConfigError: a block-count argument is invalid.
        LayoutResolutionError: the config leaves the layout to planning and no
            layout meets its requirements.
        KVRefError: whatever the builder raises for its input.
    """
    num_blocks = profiling_num_blocks(max_num_reqs, max_cudagraph_capture_size)
    if not isinstance(worker_specs, Mapping):
        raise SpecError(f"worker_specs={worker_specs!r} must map layer names to specs")
    specs: dict[str, KVCacheSpec] = {}
    for name, spec in worker_specs.items():
        if not isinstance(name, str) or not isinstance(spec, KVCacheSpec):
            raise SpecError(
                f"worker_specs[{name!r}]={spec!r} must map a str layer name to a per-layer "
                "KVCacheSpec"
            )
        specs[name] = spec
    # vLLM resolves the layout from every worker's specs before profiling; a
    # config still to be resolved is resolved from this worker's alone.
    config = config.with_resolved_layout([specs])
    if check_registry:
        check_spec_registry(specs)
    check_spec_fields(specs, config.rules)
    chosen = fresh_builder(builder, config)
    groups = list(chosen.get_kv_cache_groups(config, dict(specs)))
    check_exact_partition(groups, list(specs))
    check_wrapped_layers(groups)
    placed = chosen.get_kv_cache_config_from_groups(config, groups, num_blocks)
    if not isinstance(placed, KVCacheConfig):
        raise PlanningError(
            f"{type(chosen).__qualname__}.get_kv_cache_config_from_groups returned "
            f"{placed!r:.200}, not a KVCacheConfig"
        )
    return ProfilingPlan(groups=tuple(groups), num_blocks_requested=num_blocks, config=placed)
