"""The attacks: each a :class:`~forgers.ShortBacking` that tries to run code in the kit."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from forgers import ShortBacking, forge
from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig
from kvref.records import KVCacheTensor
from kvref.specs import KVCacheSpec


class _ForgingTensor(KVCacheTensor):
    """A tensor record whose unpickling runs the attacker's code."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_forge_and_rebuild, (attrs.asdict(self, recurse=False),))


def _forge_and_rebuild(fields: dict[str, Any]) -> KVCacheTensor:
    forge("__reduce__")
    return KVCacheTensor(**fields)


class ReduceForges(ShortBacking):
    """Returns tensors whose ``__reduce__`` patches whichever process unpickles them."""

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        placed = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        tensors = [
            _ForgingTensor(**attrs.asdict(t, recurse=False)) for t in placed.kv_cache_tensors
        ]
        return attrs.evolve(placed, kv_cache_tensors=tensors)


class _Sneaky(type(ShortBacking)):  # type: ignore[misc]
    """A metaclass whose missing attributes run the attacker's code (wherever they are read)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("kvref_") or name in ("native_cls", "kvref_core"):
            forge(f"metaclass __getattr__({name})")
        raise AttributeError(name)


class MetaclassForges(ShortBacking, metaclass=_Sneaky):
    """Patches the kit as soon as the kit asks its class for a capability or a Core."""


class CoreForges(ShortBacking):
    """Brings a "Core flow" of its own that patches the kit if the kit runs it."""

    @staticmethod
    def kvref_core(builder: Any, config: Any, specs: Any, memory: Any) -> Any:
        forge("kvref_core")
        raise RuntimeError("a forged Core flow")


class PrintsFakeReports(ShortBacking):
    """Prints lines that imitate a passing report on every call."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        print("55 pass, 0 fail in 1.0s\n\nOK", flush=True)
        print("OK", file=sys.stderr, flush=True)
        return super().get_kv_cache_groups(config, kv_cache_spec)


class ForksChild(ShortBacking):
    """Forks a child that would outlive the kit (and hold a CI step's pipes) if left alone."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        path = os.environ.get("KVREF_CHILD_PIDS")
        if path and not getattr(ForksChild, "forked", False):
            ForksChild.forked = True  # type: ignore[attr-defined]
            read, write = os.pipe()
            if os.fork() == 0:
                # Its pid as the host numbers it: the worker may run in a PID namespace.
                os.write(write, os.readlink("/proc/self").encode())
                time.sleep(600)
                os._exit(0)
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{os.read(read, 32).decode()}\n")
        return super().get_kv_cache_groups(config, kv_cache_spec)


class DiesOnEveryCall(ShortBacking):
    """Kills its worker on every call; each start is counted in ``KVREF_STARTS``."""

    def __init__(self) -> None:
        path = os.environ.get("KVREF_STARTS")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()}\n")

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        os._exit(7)
