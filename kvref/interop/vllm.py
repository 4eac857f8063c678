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

from kvref.interop import vllm_convert
from kvref.interop.vllm_config import (
    hisparse_patches,
    is_pristine,
    pristine_pickle,
    to_vllm_config,
)

# Every name of vllm_convert.__all__, listed there only, and added to __all__ below.
from kvref.interop.vllm_convert import *  # noqa: F403
from kvref.interop.vllm_core import installed_builder, plan_with_vllm

__all__ = [
    "hisparse_patches",
    "installed_builder",
    "is_pristine",
    "plan_with_vllm",
    "pristine_pickle",
    "to_vllm_config",
]
__all__ += vllm_convert.__all__
