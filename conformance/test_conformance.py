"""The kit as pytest items: one per invariant (collected by ``pytest --pyargs conformance``)."""

from __future__ import annotations

import pytest

from conformance.adapters import load_builder
from conformance.invariants import CATALOG
from conformance.plugin import xfail_ids
from conformance.runner import check_builder

_IDS = [inv.id for inv in CATALOG] + ["KV-DEV-ALLOC", "KV-DEV-VIEWS", "KV-DEV-TAGS", "KV-DEV-HOST"]


@pytest.mark.parametrize("invariant", _IDS)
def test_invariant(invariant: str, request: pytest.FixtureRequest) -> None:
    """The builder keeps ``invariant`` on every generated example."""
    config = request.config
    builder_name = config.getoption("--kv-builder")
    builder = load_builder(builder_name)
    xfail = xfail_ids(config)
    report = check_builder(
        builder,
        device=config.getoption("--kv-device"),
        max_examples=config.getoption("--kv-max-examples"),
        seed=config.getoption("--kv-seed"),
        select=[invariant],
        timeout=config.getoption("--kv-timeout"),
        unsupported=[c for c in config.getoption("--kv-unsupported").split(",") if c],
        profile=config.getoption("--kv-profile"),
        name=builder_name,
        database=config.getoption("--kv-database"),
    )
    (result,) = report.results
    if result.status == "skipped":
        pytest.skip(result.reason or "skipped")
    if result.status == "not-checked":
        pytest.skip(f"not checked: {result.reason}")
    if result.status == "fail" and invariant in xfail:
        pytest.xfail(f"{invariant} is in the xfail file")
    if result.status == "pass" and invariant in xfail:
        pytest.fail(f"XPASS: {invariant} holds but is in the xfail file", pytrace=False)
    if result.status == "fail":
        details = "\n".join(str(v) for v in result.violations)
        pytest.fail(
            f"{invariant}: {result.title}\n{details}\ncounterexample: {result.counterexample}\n"
            f"reproduce: {result.reproduce}",
            pytrace=False,
        )
