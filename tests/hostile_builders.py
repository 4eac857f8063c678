"""Hostile builders: code that attacks the kit rather than getting the contract wrong.

Each one starts from the reference and does one hostile thing: ends the
process, crashes it, patches the kit's modules to forge a pass, never lets
itself be constructed, leaves threads behind, raises what a caller should
never swallow, or claims sizes no allocator can satisfy.  The containment
tests (tests/kit/harness/test_containment.py) check the kit reports each as a failure of
the builder, writes its report, and exits.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs

from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.specs import KVCacheSpec

Groups = list[KVCacheGroupSpec]


class _Grouping(ReferenceKVCacheConfigBuilder):
    """Does its hostile thing in ``get_kv_cache_groups``."""

    def attack(self) -> None:
        raise NotImplementedError

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        self.attack()
        return super().get_kv_cache_groups(config, kv_cache_spec)


class ExitsProcess(_Grouping):
    """Ends the whole process with ``os._exit(3)``, skipping every handler."""

    def attack(self) -> None:
        os._exit(3)


class Segfaults(_Grouping):
    """Reads address 0 through ctypes: the process dies of SIGSEGV."""

    def attack(self) -> None:
        ctypes.string_at(0)


class KilledByOOM(_Grouping):
    """Dies as the OOM killer ends a process: SIGKILL, no handler runs."""

    def attack(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class DiesOnLargeModels(ReferenceKVCacheConfigBuilder):
    """Ends its process on models of more than two layers; plans smaller ones correctly."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        if len(kv_cache_spec) > 2:
            os._exit(7)
        return super().get_kv_cache_groups(config, kv_cache_spec)


class RaisesSystemExit(_Grouping):
    """Calls ``sys.exit(4)`` from a hook."""

    def attack(self) -> None:
        raise SystemExit(4)


class RaisesKeyboardInterrupt(_Grouping):
    """Raises ``KeyboardInterrupt`` from a hook, as a stray Ctrl-C handler would."""

    def attack(self) -> None:
        raise KeyboardInterrupt


def _always_pass(obs: Any) -> list[Any]:
    return []


class PatchesCatalog(ReferenceKVCacheConfigBuilder):
    """Drops a layer, then patches every check of the kit's catalog to pass."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        from conformance.check import catalog

        for inv in catalog.catalog():
            object.__setattr__(inv, "check", _always_pass)
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return [attrs.evolve(g, layer_names=list(g.layer_names)[:-1]) for g in groups]


class PatchesCheck(ReferenceKVCacheConfigBuilder):
    """Breaks the partition, then patches the partition check's module to see nothing."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        from conformance.check import catalog

        inv = catalog.by_id()["KV-GROUP-PARTITION"]
        object.__setattr__(inv, "check", _always_pass)
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return [*groups, groups[0]] if groups else groups


# -- construction -----------------------------------------------------------------


class NeedsArguments(ReferenceKVCacheConfigBuilder):
    """A constructor vLLM cannot call: it needs an argument."""

    def __init__(self, device_name: str) -> None:
        self.device_name = device_name


class ConstructorRaises(ReferenceKVCacheConfigBuilder):
    """A constructor that always raises."""

    def __init__(self) -> None:
        raise RuntimeError("no licence server")


class ConstructorHangs(ReferenceKVCacheConfigBuilder):
    """A constructor that never returns."""

    def __init__(self) -> None:
        time.sleep(3600)


class LeavesThread(ReferenceKVCacheConfigBuilder):
    """Starts a non-daemon thread that never ends, in its constructor."""

    def __init__(self) -> None:
        threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()


# -- absurd sizes ------------------------------------------------------------------


def _sized(result: KVCacheConfig, size: Any) -> KVCacheConfig:
    tensors = []
    for tensor in result.kv_cache_tensors:
        if tensor.host_resident:
            tensors.append(tensor)
            continue
        changed = attrs.evolve(tensor)
        # Past the record's validators: a hostile builder is not bound by them.
        object.__setattr__(changed, "size", size)
        tensors.append(changed)
    return attrs.evolve(result, kv_cache_tensors=tensors)


class _Sized(ReferenceKVCacheConfigBuilder):
    SIZE: Any = 0

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        return _sized(result, self.SIZE) if result.kv_cache_tensors else result


class Size2Pow63(_Sized):
    """A backing of 2**63 bytes: past int64, what torch sizes are."""

    SIZE = 2**63


class Size2Pow70(_Sized):
    """A backing of 2**70 bytes."""

    SIZE = 2**70


class NegativeSize(_Sized):
    """A backing of -4096 bytes."""

    SIZE = -4096


class FloatSize(_Sized):
    """A backing size that is a float."""

    SIZE = 4096.5


class StringSize(_Sized):
    """A backing size that is a string."""

    SIZE = "4096"


SIZED: tuple[type[_Sized], ...] = (Size2Pow63, Size2Pow70, NegativeSize, FloatSize, StringSize)


class LeaksMemory(_Grouping):
    """Keeps 64 MiB more on every grouping call, and never lets it go."""

    kept: ClassVar[list[bytearray]] = []

    def attack(self) -> None:
        type(self).kept.append(bytearray(64 << 20))


class HoldsTheGIL(_Grouping):
    """Matches a regular expression that backtracks forever: C code that never releases the GIL.

    No Python thread runs meanwhile, the guard's deadline included; only a
    watchdog outside the interpreter (or outside the process) can end it.
    """

    def attack(self) -> None:
        re.match(r"(a+)+$", "a" * 64 + "b")
