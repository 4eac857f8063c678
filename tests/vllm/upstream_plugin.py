"""pytest plugin for a run of vLLM's own planning tests (tests/vllm/test_vllm_upstream.py).

Loaded with ``-p upstream_plugin`` into one pytest run of the files
``scripts/fetch-vllm-tests.sh`` extracted from vLLM's sdist, in place of
vLLM's root ``conftest.py`` (which imports vLLM's serving stack, PIL and
more, none of which planning needs).  Each test runs first as vLLM ships
it (``default``); while it runs the plugin records whether it reached a
builder:

- ``hook``: it asked the current platform for its builder
  (``get_kv_cache_config_builder_cls``, which vLLM's ``get_kv_cache_configs``
  and ``get_global_kv_cache_groups`` resolve);
- ``module``: it called vLLM's module-level planning functions
  (``kv_cache_planning.get_kv_cache_groups``, ``get_kv_cache_config_from_groups``)
  other than through the default builder's own hooks.

It then runs the same test again in each mode it reached, in the same
process (the vLLM import, most of a run's cost, is paid once):

- ``hook``: the platform returns kvref's qualname (``KVREF_UPSTREAM_BUILDER``);
- ``module``: as ``hook``, and the two module-level functions answer with
  kvref's builder too: grouping is its ``get_kv_cache_groups`` hook, and
  placement for ``available_memory`` bytes is its
  ``get_kv_cache_config_from_groups`` hook for the block count vLLM's Core
  derives from that memory (the bytes of one block as Core measures them
  from the builder, ``num_gpu_blocks_override`` applied as the function does).

A test that patches vLLM's current platform or those functions itself is
left to its own patches.  The plugin also provides the one fixture of vLLM's
root conftest the planning tests use, ``caplog_vllm``, and lets vLLM 0.34.0's
CPU platform configure an engine without triton-cpu (its
``check_and_update_config`` refuses x86 without Triton, which its kernels
need and planning does not; the tests build ``VllmConfig`` objects).

It writes ``{"outcomes": {mode: {id: passed|failed|skipped}}, "failures":
{mode: {id: text}}, "kvref_ran": {mode: [id]}}`` (the runs in which kvref's
builder read a config) to the file ``KVREF_UPSTREAM_RECORD`` names; the
pytest report itself shows the ``default`` runs only.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest.runner import runtestprotocol

BUILDER_ENV = "KVREF_UPSTREAM_BUILDER"
RECORD_ENV = "KVREF_UPSTREAM_RECORD"

#: The modes a test runs in, in order; ``default`` always, the others where reached.
MODES = ("default", "hook", "module")

_STATE: dict[str, Any] = {
    "mode": "default",
    "reached": set(),
    "outcomes": {mode: {} for mode in MODES},
    "failures": {mode: {} for mode in MODES},
    "kvref_ran": {mode: [] for mode in MODES},
}


def _kvref_builder() -> Any:
    qualname = os.environ[BUILDER_ENV]
    module, _, name = qualname.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)()


def _install_hook() -> None:
    import vllm.platforms

    platform_cls: Any = type(vllm.platforms.current_platform)
    own = platform_cls.get_kv_cache_config_builder_cls  # bound to the class
    qualname = os.environ[BUILDER_ENV]

    def hook(cls: Any, vllm_config: Any) -> str:
        _STATE["reached"].add("hook")
        if _STATE["mode"] == "default":
            return str(own(vllm_config))
        return qualname

    platform_cls.get_kv_cache_config_builder_cls = classmethod(hook)


def _from_default_hooks(kvp: Any) -> bool:
    """Whether the caller of a module-level function is one of the default builder's hooks."""
    caller = sys._getframe(2)
    hooks = vars(kvp.DefaultKVCacheConfigBuilder).values()
    return any(getattr(hook, "__code__", None) is caller.f_code for hook in hooks)


class _WithoutModelGrouping:
    """``vllm_config`` as vLLM's module-level grouping reads it: no model declares its grouping.

    Every other attribute reads through (a partial config's missing parts stay missing).
    """

    def __init__(self, target: Any, field: str = "model_config") -> None:
        self._target = target
        self._field = field

    def __getattr__(self, name: str) -> Any:
        target = self.__dict__["_target"]
        field = self.__dict__["_field"]
        if name == field == "model_config":
            return _WithoutModelGrouping(target.model_config, "supports_kv_cache_grouping")
        if name == field == "supports_kv_cache_grouping":
            return False
        return getattr(target, name)


def _route_module_functions() -> None:
    """Put the dispatchers in front of vLLM's module-level grouping and placement.

    Installed before the test modules import them by name.
    """
    import vllm.v1.core.kv_cache_planning as kvp

    def dispatch(own: Callable[..., Any], through_kvref: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(own)
        def function(*args: Any, **kwargs: Any) -> Any:
            if not _from_default_hooks(kvp):
                _STATE["reached"].add("module")
            if _STATE["mode"] == "module":
                return through_kvref(*args, **kwargs)
            return own(*args, **kwargs)

        return function

    def groups_through_kvref(vllm_config: Any, kv_cache_spec: Any) -> Any:
        # The module-level function is vLLM's own grouping, which a model's
        # declared grouping replaces only in the builder's hook.
        config = _WithoutModelGrouping(vllm_config)
        return _kvref_builder().get_kv_cache_groups(config, kv_cache_spec)

    def placement_through_kvref(
        vllm_config: Any, kv_cache_groups: Any, available_memory: int
    ) -> Any:
        builder = _kvref_builder()
        if not kv_cache_groups:
            return builder.get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, 1)
        per_block = kvp._pool_bytes_per_block_from_builder(builder, vllm_config, kv_cache_groups)
        num_blocks = kvp.may_override_num_blocks(vllm_config, available_memory // per_block)
        return builder.get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)

    kvp.get_kv_cache_groups = dispatch(kvp.get_kv_cache_groups, groups_through_kvref)
    kvp.get_kv_cache_config_from_groups = dispatch(
        kvp.get_kv_cache_config_from_groups, placement_through_kvref
    )


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


def _note_kvref_calls() -> None:
    """Record each run in which kvref's builder read a config (both its hooks do, first)."""
    from kvref.interop.vllm_builder import KvrefHooks

    own = KvrefHooks.read_config

    def read_config(self: Any, vllm_config: Any) -> Any:
        _STATE["reached"].add("kvref")
        return own(self, vllm_config)

    KvrefHooks.read_config = read_config  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    """Install the platform hooks and the dispatchers before any test module is imported."""
    _install_hook()
    _route_module_functions()
    _planning_without_triton()
    _note_kvref_calls()


def _run(item: pytest.Item, nextitem: pytest.Item | None, mode: str) -> list[pytest.TestReport]:
    """Run ``item`` once in ``mode``; record its outcome (and failure text) under the mode."""
    _STATE["mode"] = mode
    _STATE["reached"] = set()
    try:
        # Each run sets up and tears down the test's fixtures as a run of its
        # own (nextitem decides which wider-scoped ones are torn down).
        reports = runtestprotocol(item, log=False, nextitem=nextitem)
    finally:
        _STATE["mode"] = "default"
    failed = [report for report in reports if report.failed]
    if failed:
        outcome = "failed"
        _STATE["failures"][mode][item.nodeid] = failed[0].longreprtext[-4000:]
    elif any(report.skipped for report in reports):
        outcome = "skipped"
    else:
        outcome = "passed"
    _STATE["outcomes"][mode][item.nodeid] = outcome
    if "kvref" in _STATE["reached"]:
        _STATE["kvref_ran"][mode].append(item.nodeid)
    return reports


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """Run the test as shipped, then again in each mode it reached (see the module docstring)."""
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _run(item, nextitem, "default"):
        item.ihook.pytest_runtest_logreport(report=report)
    reached = set(_STATE["reached"])
    for mode in MODES[1:]:
        if mode in reached:
            _run(item, nextitem, mode)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the record."""
    path = os.environ.get(RECORD_ENV)
    if path:
        record = {name: _STATE[name] for name in ("outcomes", "failures", "kvref_ran")}
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
