"""Run the installed vLLM's own Core planning flow and return kvref records.

:func:`plan_with_vllm` runs ``get_global_kv_cache_groups`` then
``get_kv_cache_configs`` with a given vLLM builder class installed as the
platform's builder, and returns a :class:`~kvref.planning.KVCachePlan`.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from kvref.config import PlanningConfig
from kvref.errors import ConfigError, InsufficientMemoryError, PlanningError
from kvref.interop.vllm_config import hisparse_patches, to_vllm_config
from kvref.interop.vllm_convert import (
    config_from_vllm,
    groups_from_vllm,
    specs_to_vllm,
    vllm_modules,
)
from kvref.interop.vllm_convert import quiet_vllm as _quiet_vllm
from kvref.planning import KVCachePlan, WorkerPlan
from kvref.specs import KVCacheSpec
from kvref.versions import installed_vllm_version

__all__ = ["installed_builder", "plan_with_vllm"]


_CORE_LOCK = threading.RLock()


@contextlib.contextmanager
def installed_builder(native_cls: type[Any]) -> Iterator[None]:
    """Make vLLM's ``get_kv_cache_config_builder`` return fresh ``native_cls`` instances.

    Both Core functions look the builder up at call time in
    ``vllm.v1.core.kv_cache_config_builder``; the original is restored on exit.
    Calls are serialised: the patch is process-wide.
    """
    module = vllm_modules().builder_module
    with _CORE_LOCK:
        original = module.get_kv_cache_config_builder
        module.get_kv_cache_config_builder = lambda vllm_config: native_cls()
        try:
            yield
        finally:
            module.get_kv_cache_config_builder = original


_NEEDED = re.compile(
    r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, .*? memory \(([\d.]+) GiB\)"
)
_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")
_GIB = 2**30


@attrs.frozen
class _Figures:
    available: int
    effective: int
    bpb: int
    check: int
    needed: int
    before_min: int | None


def _worker_figures(
    native_cls: type[Any],
    vcfg: Any,
    global_groups: list[Any],
    worker_specs: list[dict[str, Any]],
    memory: Sequence[int],
) -> list[_Figures]:
    """Core's per-worker numbers, recomputed with vLLM's own helpers (0 where they fail).

    vLLM keeps them in locals; recomputing them after the flow (with the
    final ``max_model_len``) gives the kit and the differential tests the
    same figures kvref's :class:`~kvref.planning.WorkerPlan` carries.
    """
    kvp = vllm_modules().kvp
    override = vcfg.cache_config.num_gpu_blocks_override
    out: list[_Figures] = []
    for specs, available in zip(worker_specs, memory, strict=True):
        try:
            groups = kvp._project_kv_cache_groups_to_worker(global_groups, specs)
            builder = native_cls()
            bpb = kvp._pool_bytes_per_block_from_builder(builder, vcfg, groups) if groups else 0
            effective = override * bpb if override is not None and groups else available
            check = effective - bpb if groups else effective
            needed = kvp._max_memory_usage_bytes_from_groups(builder, vcfg, groups) if groups else 0
            before = (effective // bpb if bpb else None) if groups else 1
        except Exception:  # figures are informative; the flow's result stands
            out.append(_Figures(available, available, 0, available, 0, None))
            continue
        out.append(_Figures(available, effective, bpb, check, needed, before))
    return out


def _insufficient(
    message: str, vcfg: Any, figures: list[_Figures] | None
) -> InsufficientMemoryError:
    """The kvref typed error for one of vLLM's insufficient-memory ``ValueError`` s."""
    max_model_len = int(vcfg.model_config.max_model_len)
    needed = available = estimated = 0
    match = _NEEDED.search(message)
    if match:
        max_model_len = int(match.group(1))
        needed = round(float(match.group(2)) * _GIB)
        available = round(float(match.group(3)) * _GIB)
    estimate = _ESTIMATE.search(message)
    if estimate:
        estimated = int(estimate.group(1))
    if message.startswith("Cannot auto-fit"):
        max_model_len = 1
    # vLLM prints GiB to two decimals; take the exact bytes of the first
    # worker that does not fit when the figures are known.
    for fig in figures or ():
        if fig.bpb and (fig.check <= 0 or fig.needed > fig.check):
            available = max(fig.check, 0)
            needed = fig.needed
            break
    return InsufficientMemoryError(
        f"vLLM: {message}",
        max_model_len=max_model_len,
        needed_bytes=needed,
        available_bytes=available,
        estimated_max_model_len=estimated,
    )


def _is_insufficient(message: str) -> bool:
    return (
        message.startswith("No available memory for the cache blocks")
        or message.startswith("To serve at least one request")
        or message.startswith("Cannot auto-fit max_model_len")
    )


def plan_with_vllm(
    native_cls: type[Any],
    config: PlanningConfig,
    kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: int | Sequence[int],
) -> KVCachePlan:
    """Run vLLM's own Core flow with ``native_cls`` as the platform's builder.

    The counterpart of :func:`kvref.planning.plan_kv_cache`:
    ``get_global_kv_cache_groups`` then ``get_kv_cache_configs``, on a
    :func:`to_vllm_config` copy, with the results converted to kvref records.
    Each config records ``config.kv_cache_layout`` (vLLM's engine core does
    that after planning); ``max_model_len`` is the auto-fitted length; the
    per-worker figures are recomputed with vLLM's helpers (0 where unknown).

    Raises:
        ConfigError: ``config.vllm_version`` is not the installed vLLM's release
            (vLLM plans only as itself).
        InsufficientMemoryError: vLLM's "no available memory", "to serve at
            least one request..." and "cannot auto-fit" ``ValueError`` s, with
            the numbers parsed from the message (exact bytes where recomputable).
        PlanningError: any other ``ValueError`` from vLLM.
        VLLMOutputError: vLLM's result does not convert to kvref records.
        AssertionError, NotImplementedError, ...: vLLM's own untyped failures,
            unchanged.
    """
    installed = installed_vllm_version()
    if config.vllm_version != installed:
        raise ConfigError(
            f"PlanningConfig.vllm_version={config.vllm_version} but the installed vLLM is "
            f"{installed or vllm_modules().version}: vLLM can only plan as itself; plan as "
            f"vLLM {installed} (attrs.evolve(config, vllm_version=...)) or install that release"
        )
    workers = [specs_to_vllm(w) for w in kv_cache_specs]
    if isinstance(available_memory, int):
        memory = [available_memory] * len(workers)
    else:
        memory = list(available_memory)
    vcfg = to_vllm_config(config)
    kvp = vllm_modules().kvp
    global_groups: list[Any] = []
    with installed_builder(native_cls), hisparse_patches(config), _quiet_vllm():
        try:
            global_groups = kvp.get_global_kv_cache_groups(vcfg, workers)
            configs = kvp.get_kv_cache_configs(vcfg, workers, memory, global_groups)
        except ValueError as exc:
            message = str(exc)
            if _is_insufficient(message):
                figures = None
                if global_groups:
                    figures = _worker_figures(native_cls, vcfg, global_groups, workers, memory)
                raise _insufficient(message, vcfg, figures) from exc
            raise PlanningError(f"vLLM: {message}") from exc
        figures = _worker_figures(native_cls, vcfg, global_groups, workers, memory)
    layout = config.kv_cache_layout
    # Core resolved the zeroing for every worker where vLLM has it as a field (0.34.0).
    resolved = config.rules.zeroing_across_workers
    converted = [
        attrs.evolve(
            config_from_vllm(c),
            kv_cache_layout=layout,
            resolved_kv_cache_zeroing=bool(c.needs_kv_cache_zeroing) if resolved else None,
        )
        for c in configs
    ]
    return KVCachePlan(
        global_groups=tuple(groups_from_vllm(global_groups)),
        configs=tuple(converted),
        workers=tuple(
            WorkerPlan(
                available_memory=f.available,
                effective_available_memory=f.effective,
                pool_bytes_per_block=f.bpb,
                check_memory=f.check,
                needed_memory=f.needed,
                num_blocks_before_min=f.before_min,
            )
            for f in figures
        ),
        max_model_len=int(vcfg.model_config.max_model_len),
        num_blocks=min((c.num_blocks for c in converted), default=1),
    )
