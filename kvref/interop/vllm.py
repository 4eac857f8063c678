"""Convert kvref objects to and from the installed vLLM's, and run vLLM's own planning flow.

A thin re-export, kept so that ``kvref.interop.vllm`` stays importable:

- :mod:`kvref.interop.vllm_convert`: the lazy vLLM import and the spec and
  record conversions, both ways;
- :mod:`kvref.interop.vllm_config`: :func:`to_vllm_config`, a real
  ``VllmConfig`` that plans as a :class:`~kvref.config.PlanningConfig`;
- :mod:`kvref.interop.vllm_core`: :func:`plan_with_vllm`, vLLM's Core flow
  with a given builder class installed as the platform's builder.
"""

from __future__ import annotations

from kvref.interop.vllm_config import (
    hisparse_patches,
    is_pristine,
    pristine_pickle,
    to_vllm_config,
)
from kvref.interop.vllm_convert import (
    INSTALL_HINT,
    VLLM_VERSION,
    VLLMOutputError,
    VLLMUnavailableError,
    config_from_vllm,
    config_to_vllm,
    group_from_vllm,
    group_to_vllm,
    groups_from_vllm,
    groups_to_vllm,
    is_vllm_available,
    layer_spec_from_vllm,
    quiet_vllm,
    spec_from_vllm,
    spec_to_vllm,
    specs_to_vllm,
    vllm_modules,
)
from kvref.interop.vllm_core import installed_builder, plan_with_vllm

__all__ = [
    "INSTALL_HINT",
    "VLLM_VERSION",
    "VLLMOutputError",
    "VLLMUnavailableError",
    "config_from_vllm",
    "config_to_vllm",
    "group_from_vllm",
    "group_to_vllm",
    "groups_from_vllm",
    "groups_to_vllm",
    "hisparse_patches",
    "installed_builder",
    "is_pristine",
    "is_vllm_available",
    "layer_spec_from_vllm",
    "plan_with_vllm",
    "pristine_pickle",
    "quiet_vllm",
    "spec_from_vllm",
    "spec_to_vllm",
    "specs_to_vllm",
    "to_vllm_config",
    "vllm_modules",
]
