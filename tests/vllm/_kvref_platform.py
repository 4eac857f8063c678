"""vLLM's Core flow with a platform that names a builder by qualname, as a platform does.

:class:`KvrefPlatform` is a platform whose ``get_kv_cache_config_builder_cls``
returns a qualname; :func:`platform_builder` makes it vLLM's current platform
for the duration of a block (``vllm.platforms.current_platform``, which
vLLM's builder resolution imports at call time).  :func:`run_core` runs
vLLM's ``get_global_kv_cache_groups`` and ``get_kv_cache_configs`` on a
:func:`~kvref.interop.vllm_config.to_vllm_config` copy, so that the same
problem can be planned with vLLM's default and with kvref's builder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from unittest import mock

import attrs

from kvref.config import PlanningConfig
from kvref.interop import vllm as iv
from kvref.specs import KVCacheSpec
from kvref.versions import NEWEST, installed_vllm_version

__all__ = ["DEFAULT", "CoreOutcome", "platform_builder", "run_core"]

#: vLLM's default builder, as its platform base class names it.
DEFAULT = "vllm.v1.core.kv_cache_planning.DefaultKVCacheConfigBuilder"


@contextlib.contextmanager
def platform_builder(qualname: str) -> Iterator[Any]:
    """Make vLLM's current platform one whose builder hook returns ``qualname``; yield it."""
    import vllm.platforms

    base: Any = type(vllm.platforms.current_platform)

    class KvrefPlatform(base):  # type: ignore[misc, valid-type]
        """The machine's platform, naming its KV cache config builder by qualname."""

        @classmethod
        def get_kv_cache_config_builder_cls(cls, vllm_config: Any) -> str:
            return qualname

    platform = KvrefPlatform()
    with mock.patch("vllm.platforms.current_platform", platform):
        yield platform


@attrs.frozen
class CoreOutcome:
    """vLLM's Core result (vLLM objects), or the exception that replaced it."""

    global_groups: Any = None
    configs: Any = None
    max_model_len: int | None = None
    error: BaseException | None = None


def installed_config(config: PlanningConfig) -> PlanningConfig:
    """``config`` planned as the installed vLLM release."""
    return attrs.evolve(config, vllm_version=installed_vllm_version() or NEWEST)


def run_core(
    qualname: str,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
    memory: int | Sequence[int],
) -> CoreOutcome:
    """vLLM's Core flow on ``config`` with the platform naming ``qualname``."""
    vcfg = iv.to_vllm_config(config)
    specs = [iv.specs_to_vllm(w) for w in workers]
    available = [memory] * len(specs) if isinstance(memory, int) else list(memory)
    kvp = iv.vllm_modules().kvp
    with platform_builder(qualname), iv.hisparse_patches(config), iv.quiet_vllm():
        try:
            groups = kvp.get_global_kv_cache_groups(vcfg, specs)
            configs = kvp.get_kv_cache_configs(vcfg, specs, available, groups)
        except Exception as exc:
            return CoreOutcome(error=exc)
    return CoreOutcome(groups, configs, int(vcfg.model_config.max_model_len))
