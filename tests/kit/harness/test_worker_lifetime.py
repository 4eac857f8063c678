"""A run closes the worker process it started: a suite or notebook of many runs keeps none."""

from __future__ import annotations

import os

import psutil
import pytest

from conformance.run.runner import check_builder
from kvref import ReferenceKVCacheConfigBuilder

SMALL = {"select": ["KV-GROUP-PARTITION"], "max_examples": 2, "seed": 1, "reach": False}


def children() -> set[int]:
    return {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}


@pytest.mark.parametrize(
    "builder",
    ["kvref:ReferenceKVCacheConfigBuilder", ReferenceKVCacheConfigBuilder],
    ids=["by-name", "by-class"],
)
def test_an_isolated_run_leaves_no_process(builder: object) -> None:
    before = children()
    report = check_builder(builder, **SMALL)  # type: ignore[arg-type]
    assert report.ok
    assert children() <= before


def test_a_proxy_the_caller_isolated_stays_the_callers() -> None:
    """The plugin keeps one worker for a session: a run must not close it under it."""
    from conformance.harness.isolate import isolated

    proxy = isolated("kvref:ReferenceKVCacheConfigBuilder", "kvref:ReferenceKVCacheConfigBuilder")
    try:
        first = check_builder(proxy, **SMALL)
        second = check_builder(proxy, **SMALL)
        assert first.ok and second.ok
    finally:
        proxy.close()
