"""vLLM's logger is quiet inside planning calls; only the kit's own processes keep it quiet."""

from __future__ import annotations

import logging
import subprocess
import sys

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
