"""torch's intra-op threads during a run: one, unless the user chose.

The device checks copy and compare tensors of at most ``--max-alloc-bytes``
(a few MiB by default), one after another.  Those copies are bound by memory,
not arithmetic: a second intra-op thread on a 2-core machine cut no wall time
and added about 2 s of CPU to the default run (benchmarks/default_run.py,
``OMP_NUM_THREADS=1`` against unset, side by side).  A vendor pays that CPU
on every commit, on CI machines shared with other jobs.

torch's thread count is global to the process, and ``check_builder`` may run
inside the caller's own process (the pytest plugin, a notebook), so the count
is restored when the run ends.  A user who set ``OMP_NUM_THREADS`` has chosen
and is left alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

__all__ = ["one_torch_thread"]


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the block with one torch intra-op thread; restore the count after it."""
    if os.environ.get("OMP_NUM_THREADS"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
