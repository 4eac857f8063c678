"""The allocator settings of the processes the kit owns (its CLI, the worker, the twin).

A run allocates and frees the same large buffers thousands of times (tag
backings, footprint runs, pickled plans).  glibc returns each freed block of
128 KiB or more to the kernel at once, so the next allocation of that size
faults every page in again, zero-filled: measured on the default run, a
fifth of its CPU time was the kernel's (a million page faults).  Keeping
freed memory for reuse removes most of them (docs/performance.md).  Only processes the kit owns
are tuned; a caller's process (the pytest plugin, ``check_builder`` in a
notebook) keeps its allocator as it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import sys
from collections.abc import Iterator

__all__ = ["ENVIRONMENT", "keep_freed_memory", "older_objects_settled", "settle_startup_objects"]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: Blocks below this size come from the heap, so their pages are reused.
MMAP_THRESHOLD = 1 << 30
#: What older glibc releases accept at most (HEAP_MAX_SIZE / 2 on 64 bits).
_OLD_GLIBC_MAX = 32 << 20
#: Free memory at the top of the heap kept, not returned to the kernel.
TRIM_THRESHOLD = 1 << 30
#: Extra memory asked of the kernel when the heap grows.
TOP_PAD = 256 << 20

#: The same settings for a child interpreter, in glibc's environment form.
ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
    "MALLOC_TOP_PAD_": str(TOP_PAD),
}


def keep_freed_memory() -> bool:
    """Tune this process's allocator as above; ``False`` where it is not glibc's.

    Never raises: the settings only save time.
    """
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        done = [
            mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            or mallopt(_M_MMAP_THRESHOLD, _OLD_GLIBC_MAX),
            mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            mallopt(_M_TOP_PAD, TOP_PAD),
        ]
        return all(done)
    return False


def settle_startup_objects() -> None:
    """Leave the objects made so far (imported modules: torch, Hypothesis, the kit) out of GC.

    A full collection walks every tracked object; with torch loaded that is
    hundreds of thousands, none of them ever garbage, and a run makes many
    full collections (Hypothesis forces one per drawing thread when it
    registers its PRNG).  Call it once, after the imports, in a process the
    kit owns.
    """
    gc.freeze()


@contextlib.contextmanager
def older_objects_settled() -> Iterator[None]:
    """During a run: the objects made before it (the caller's, torch, vLLM) left out of GC.

    A vLLM-native run in a fresh process with vLLM loaded spent about 2 s
    of its kit process's CPU in the two full collections of the run, walking
    those objects; frozen, its eight cost about 0.4 s together
    (docs/performance.md).  The caller's process gets its collector back as
    it was when the run ends, unless it had frozen objects itself: then what
    this run froze stays frozen too, as after a second ``gc.freeze()`` of
    its own (``gc.unfreeze`` cannot tell the two apart).
    """
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    try:
        yield
    finally:
        if frozen_before == 0:
            gc.unfreeze()
