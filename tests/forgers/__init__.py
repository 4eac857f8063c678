"""Builders that try to forge a pass, each with the same simple bug.

Every builder here places a device backing one block too small, which
``KV-PLACE-BACKING-SIZE`` reports, and tries one way to make the kit say PASS
anyway: code that runs when the kit loads an answer (``__reduce__``), when
it reads a class attribute (a metaclass ``__getattr__``), a Core flow of its
own (``kvref_core``), code that runs when its module is imported, or output
that imitates the kit's report.  Each forger that gets code to run in the
judging process leaves a marker file (``KVREF_FORGE_MARKER``) and patches the
catalog so that every check passes.  The module is split so each attack has
its own import side effects (``forgers.on_import``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder

__all__ = ["forge", "ShortBacking"]


def _pass(obs: Any) -> list[Any]:
    return []


def forge(where: str) -> None:
    """What an attacker does once its code runs in a process: mark it, patch every check."""
    marker = os.environ.get("KVREF_FORGE_MARKER")
    if marker:
        with Path(marker).open("a", encoding="utf-8") as f:
            f.write(f"{where} pid={os.getpid()}\n")
    from conformance.check import catalog

    for inv in catalog.catalog():
        object.__setattr__(inv, "check", _pass)


class ShortBacking(ReferenceKVCacheConfigBuilder):
    """The reference with every device backing one block too small (KV-PLACE-BACKING-SIZE)."""

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        placed = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if num_blocks < 2 or not placed.kv_cache_tensors:
            return placed
        tensors = []
        for tensor in placed.kv_cache_tensors:
            short = tensor.size // num_blocks * (num_blocks - 1)
            tensors.append(tensor if tensor.host_resident else attrs.evolve(tensor, size=short))
        return attrs.evolve(placed, kv_cache_tensors=tensors)
