"""Run builders written against vLLM 0.33.0's own ``KVCacheConfigBuilder`` through the kit.

:func:`wrap_vllm_builder` turns a vLLM-native builder class (vLLM's
``DefaultKVCacheConfigBuilder`` or a vendor's subclass) into a kvref builder
class: every hook converts its kvref inputs to vLLM objects
(:mod:`kvref.interop.vllm`), calls the native hook and converts the result
back.  The class also brings vLLM's own Core flow as ``kvref_core``, which
the runner uses for the Core scenario instead of kvref's, so the kit judges
what vLLM itself would plan.

vLLM is imported only when a builder is wrapped: importing this module does not need it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.interop import vllm as iv
from kvref.planning import KVCachePlan
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["VLLMBuilderAdapter", "wrap_vllm_builder"]

#: The signature of :func:`kvref.planning.plan_kv_cache` that ``kvref_core`` has.
CoreFlow = Callable[
    [Any, PlanningConfig, Sequence[Mapping[str, KVCacheSpec]], "int | Sequence[int]"],
    KVCachePlan,
]


class VLLMBuilderAdapter(KVCacheConfigBuilder):
    """Base of the classes :func:`wrap_vllm_builder` makes; one native instance per instance.

    Attributes:
        native_cls: the wrapped vLLM builder class.
        kvref_core: vLLM's Core flow with ``native_cls`` installed (see
            :func:`wrap_vllm_builder`).
        kvref_unsupported: capabilities the kit must not check; vLLM keeps
            groups on the host only under HiSparse, which kvref does not model.
    """

    native_cls: ClassVar[type[Any]]
    kvref_core: ClassVar[CoreFlow]
    kvref_unsupported: ClassVar[tuple[str, ...]] = ("host_resident",)

    def __init__(self) -> None:
        # vLLM makes a fresh builder for every phase; so does the kit, one
        # adapter (and so one native instance) per phase.
        self.native = self.native_cls()

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Group through the native hook; a mutation of its input is written back.

        vLLM's contract lets the hook mutate the dict it gets (the default
        builder promotes specs in place with the hybrid manager disabled);
        writing the change back into ``kv_cache_spec`` keeps that visible to
        the kit instead of hiding it behind the conversion.

        Raises:
            VLLMOutputError: the hook returned something that is not a list of
                vLLM groups kvref can represent.
        """
        vcfg = iv.to_vllm_config(config)
        given = iv.specs_to_vllm(kv_cache_spec)
        before = dict(given)
        with iv._quiet_vllm():
            groups = self.native.get_kv_cache_groups(vcfg, given)
        result = iv.groups_from_vllm(groups)
        if given != before or list(given) != list(before):
            _write_back(kv_cache_spec, {n: iv.layer_spec_from_vllm(s) for n, s in given.items()})
        return result

    def get_kv_cache_config_from_groups(
        self,
        config: PlanningConfig,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
    ) -> KVCacheConfig:
        """Place through the native hook.

        Raises:
            VLLMOutputError: the hook returned something that is not a vLLM
                ``KVCacheConfig`` kvref can represent.
        """
        vcfg = iv.to_vllm_config(config)
        groups = iv.groups_to_vllm(kv_cache_groups)
        with iv._quiet_vllm():
            result = self.native.get_kv_cache_config_from_groups(vcfg, groups, num_blocks)
        return iv.config_from_vllm(result)


def _native_pool_bytes(
    self: VLLMBuilderAdapter,
    config: PlanningConfig,
    kv_cache_groups: Sequence[KVCacheGroupSpec],
) -> int | None:
    """The native ``_get_pool_bytes_per_block`` answer (installed where the native overrides it)."""
    vcfg = iv.to_vllm_config(config)
    value: Any = self.native._get_pool_bytes_per_block(vcfg, iv.groups_to_vllm(kv_cache_groups))
    return None if value is None else int(value)


def _write_back(target: Mapping[str, KVCacheSpec], changed: Mapping[str, KVCacheSpec]) -> None:
    if not isinstance(target, dict):  # a read-only mapping: nothing the builder could change
        return
    target.clear()
    target.update(changed)


def wrap_vllm_builder(native_cls: type[Any]) -> type[KVCacheConfigBuilder]:
    """A kvref builder class that runs the vLLM-native builder class ``native_cls``.

    Each instance owns a fresh ``native_cls()``; its hooks convert inputs to
    vLLM objects (a real ``VllmConfig`` matching the ``PlanningConfig``), call
    the native hooks and convert the results back.  A result that does not
    convert raises :class:`~kvref.interop.vllm.VLLMOutputError` from the
    hook, so the kit reports it.

    The class carries ``kvref_core``, with the signature of
    :func:`kvref.planning.plan_kv_cache`: it ignores the builder it is given
    and runs vLLM's own Core flow with ``native_cls`` installed as the
    platform's builder (:func:`kvref.interop.vllm.plan_with_vllm`).

    Raises:
        VLLMUnavailableError: vLLM cannot be imported (the message says how to
            install it).
        TypeError: ``native_cls`` is not a class.
    """
    if not isinstance(native_cls, type):
        raise TypeError(f"wrap_vllm_builder needs a builder class, got {native_cls!r}")
    # Import vLLM now, outside any per-call deadline: the first import takes seconds.
    iv.vllm_modules()

    def core(
        builder: Any,
        config: PlanningConfig,
        kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
        available_memory: int | Sequence[int],
    ) -> KVCachePlan:
        del builder  # vLLM's Core makes its own builders from native_cls
        return iv.plan_with_vllm(native_cls, config, kv_cache_specs, available_memory)

    name = f"VLLM{native_cls.__name__}"
    namespace: dict[str, Any] = {
        "__doc__": f"kvref adapter of vLLM's {native_cls.__module__}.{native_cls.__qualname__}.",
        "__module__": __name__,
        "native_cls": native_cls,
        "kvref_core": staticmethod(core),
    }
    # The kit checks _get_pool_bytes_per_block only on builders that override
    # it; forward it only where the native class does, or vLLM's default
    # "None: Core probes" would read as an override returning None.
    base = iv.vllm_modules().builder_module.KVCacheConfigBuilder
    native_pool = getattr(native_cls, "_get_pool_bytes_per_block", None)
    if native_pool is not None and native_pool is not base._get_pool_bytes_per_block:
        namespace["_get_pool_bytes_per_block"] = _native_pool_bytes
    adapter: type[KVCacheConfigBuilder] = type(name, (VLLMBuilderAdapter,), namespace)
    adapter.__qualname__ = name
    return adapter
