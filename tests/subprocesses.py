"""A command of the tests in a fresh process, its output kept for the test's messages."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

#: This folder: the test builders (``broken_builders``, ``forgers``...) import from it.
TESTS = Path(__file__).resolve().parent


def kit_env(**extra: str) -> dict[str, str]:
    """This environment with tests/ importable ahead of ``PYTHONPATH``, and ``extra`` set.

    What a kit process needs that names a test builder (``broken_builders:X``).
    """
    path = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path), **extra)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without Python's and Hypothesis's variables, and ``extra`` set.

    For a process that must start as a new user's would: no ``PYTHONPATH``
    that this session added, no Hypothesis profile.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HYPOTHESIS"))}
    return {**env, **extra}


def kit_command() -> list[str]:
    """The ``kvref-conformance`` command of this interpreter's environment."""
    script = Path(sys.executable).with_name("kvref-conformance")
    return [str(script)] if script.exists() else [sys.executable, "-m", "conformance.cli"]


def run_captured(
    command: Sequence[str],
    *,
    cwd: Path | str | None,
    env: Mapping[str, str] | None = None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``command`` run in ``cwd`` (``None``: this one) with ``env`` (``None``: this one's),
    killed at ``timeout``.

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
