"""pytest plugin for a run of vLLM's own planning tests (tests/vllm/test_vllm_upstream.py).

Loaded with ``-p upstream_plugin`` into a pytest run of the files
``scripts/fetch-vllm-tests.sh`` extracted from vLLM's sdist, in place of
vLLM's root ``conftest.py`` (which imports vLLM's serving stack, PIL and
more, none of which planning needs).  It:

- provides the one fixture of vLLM's root conftest the planning tests use,
  ``caplog_vllm`` (vLLM's logger does not propagate to pytest's capture);
- wraps the current platform's ``get_kv_cache_config_builder_cls`` (the
  platform vLLM's builder resolution asks): with ``KVREF_UPSTREAM_BUILDER``
  set it returns that qualname, else the platform's own answer, and either
  way it records the id of each test that asked it (only those tests can
  plan differently with another builder; a test that patches vLLM's current
  platform itself is left to its own);
- lets vLLM 0.34.0's CPU platform configure an engine without triton-cpu
  (its ``check_and_update_config`` refuses x86 without Triton, which its
  kernels need and planning does not; the tests build ``VllmConfig`` objects);
- runs only the test ids listed in the file ``KVREF_UPSTREAM_ONLY`` names, if set;
- writes ``{"outcomes": {id: passed|failed|skipped}, "resolved": [ids]}``
  to the file ``KVREF_UPSTREAM_RECORD`` names.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BUILDER_ENV = "KVREF_UPSTREAM_BUILDER"
ONLY_ENV = "KVREF_UPSTREAM_ONLY"
RECORD_ENV = "KVREF_UPSTREAM_RECORD"

_STATE: dict[str, Any] = {"current": "", "resolved": set(), "outcomes": {}}


def _install_hook() -> None:
    import vllm.platforms

    platform_cls: Any = type(vllm.platforms.current_platform)
    own = platform_cls.get_kv_cache_config_builder_cls  # bound to the class
    qualname = os.environ.get(BUILDER_ENV)

    def hook(cls: Any, vllm_config: Any) -> str:
        _STATE["resolved"].add(_STATE["current"])
        return qualname or str(own(vllm_config))

    platform_cls.get_kv_cache_config_builder_cls = classmethod(hook)


def _planning_without_triton() -> None:
    import vllm.platforms

    platform_cls: Any = type(vllm.platforms.current_platform)
    check = platform_cls.check_and_update_config  # bound to the class

    def check_without_triton(cls: Any, vllm_config: Any) -> None:
        import vllm.triton_utils as triton_utils

        # The platform reads vllm.triton_utils.HAS_TRITON when it is called.
        saved = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            check(vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    platform_cls.check_and_update_config = classmethod(check_without_triton)


def pytest_configure(config: pytest.Config) -> None:
    """Install the platform hooks before any test module is imported."""
    _install_hook()
    _planning_without_triton()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the ids ``KVREF_UPSTREAM_ONLY`` lists, when it is set."""
    only = os.environ.get(ONLY_ENV)
    if not only:
        return
    wanted = set(json.loads(Path(only).read_text()))
    kept = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
    items[:] = kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Attribute the platform hook's calls to the running test."""
    _STATE["current"] = item.nodeid
    yield
    _STATE["current"] = ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One outcome per test: failed if any phase failed, else skipped or passed."""
    outcomes: dict[str, str] = _STATE["outcomes"]
    before = outcomes.get(report.nodeid)
    if report.failed:
        outcomes[report.nodeid] = "failed"
    elif report.skipped and before != "failed":
        outcomes[report.nodeid] = "skipped"
    elif report.when == "call" and before is None:
        outcomes[report.nodeid] = "passed"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the record."""
    path = os.environ.get(RECORD_ENV)
    if path:
        record = {"outcomes": _STATE["outcomes"], "resolved": sorted(_STATE["resolved"])}
        Path(path).write_text(json.dumps(record, indent=1, sort_keys=True))


@pytest.fixture
def caplog_vllm(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Iterator[pytest.LogCaptureFixture]:
    """vLLM's log records in pytest's capture, at INFO (vLLM's root conftest fixture)."""
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    monkeypatch.setitem(DEFAULT_LOGGING_CONFIG["loggers"]["vllm"], "propagate", True)
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)
    with caplog.at_level(logging.INFO):
        yield caplog
