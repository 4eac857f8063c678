"""vLLM's logger is quiet inside planning calls; only the kit's own processes keep it quiet."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from kvref.interop.vllm_convert import quiet_vllm


def test_a_callers_level_is_restored() -> None:
    """In a caller's process the block sets ERROR and gives the caller's level back."""
    logger = logging.getLogger("vllm")
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        with quiet_vllm():
            assert logger.level == logging.ERROR
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(before)


def test_the_kits_own_process_stays_quiet() -> None:
    """After keep_vllm_quiet (the CLI, worker and twin processes) ERROR stays, and is re-set."""
    code = (
        "import logging\n"
        "from kvref.interop.vllm_convert import keep_vllm_quiet, quiet_vllm\n"
        "log = logging.getLogger('vllm')\n"
        "log.setLevel(logging.INFO)\n"
        "keep_vllm_quiet()\n"
        "with quiet_vllm():\n"
        "    pass\n"
        "first = log.level\n"
        # vLLM's import configures its logger afresh: the next block sets ERROR again.
        "log.setLevel(logging.DEBUG)\n"
        "with quiet_vllm():\n"
        "    inside = log.level\n"
        "print(first, inside, log.level)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    error = str(logging.ERROR)
    assert done.stdout.split() == [error, error, error], done.stdout + done.stderr


def test_vllms_import_warns_nothing_through_the_kit() -> None:
    """Torch's deprecations raised by vLLM's import stay out of the caller's output.

    Under pytest (the plugin) deprecation warnings are shown, and vLLM's
    import printed about a dozen before the session began, once per process.
    """
    pytest.importorskip("vllm.v1.core.kv_cache_planning")
    code = "from kvref.interop.vllm_convert import vllm_modules\nvllm_modules()\n"
    done = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "DeprecationWarning" not in done.stderr, done.stderr[-2000:]
