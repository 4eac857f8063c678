"""A command of the tests in a fresh process, its output kept for the test's messages."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_captured(
    command: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str] | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``command`` run in ``cwd`` with ``env`` (``None``: this one's), killed at ``timeout``.

    Its stdout and stderr are kept as text, and its exit status is returned,
    never raised: the test asserts on it and prints the output when it fails.
    """
    return subprocess.run(
        list(command),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
