"""The allocator settings of the kit's own processes (conformance.harness.allocator_settings)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from conformance.harness import allocator_settings

_GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None


@pytest.mark.skipif(not _GLIBC, reason="the settings are glibc's")
def test_glibc_takes_the_settings() -> None:
    assert allocator_settings.keep_freed_memory() is True


def test_elsewhere_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")  # the module reads sys.platform
    assert allocator_settings.keep_freed_memory() is False


def test_the_twin_environment_is_glibcs_spelling() -> None:
    assert set(allocator_settings.ENVIRONMENT) == {
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "MALLOC_TOP_PAD_",
    }
    assert all(v.isdigit() for v in allocator_settings.ENVIRONMENT.values())


@pytest.mark.skipif(not _GLIBC, reason="the settings are glibc's")
def test_an_interpreter_starts_with_the_environment() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "print('ok')"],
        env={**os.environ, **allocator_settings.ENVIRONMENT},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_a_run_leaves_the_callers_collector_as_it_was() -> None:
    """Objects made before the run are frozen during it and thawed after, even if it raises."""
    gc.unfreeze()
    with pytest.raises(RuntimeError), allocator_settings.older_objects_settled():
        assert gc.get_freeze_count() > 0
        raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0


def test_a_callers_own_freeze_is_kept() -> None:
    """A process that froze objects itself keeps them frozen after the run."""
    gc.unfreeze()
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        with allocator_settings.older_objects_settled():
            pass
        assert gc.get_freeze_count() >= mine > 0
    finally:
        gc.unfreeze()
