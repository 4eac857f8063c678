"""The scenario registry: every scenario is a record the run asks, and a new one is one module.

The last test adds a small scenario the way a contributor would (a record
and an invariant that reads it) and shows that the runner draws, deals and
judges it with no other change.
"""

from __future__ import annotations

from typing import Any

import pytest
from kit_runs import quick_check

from conformance.check import catalog as catalog_module
from conformance.check.catalog import Invariant, Unjudged, catalog
from conformance.check.violations import Violation
from conformance.harness.hooks import Context, call_grouping
from conformance.scenarios import registry
from conformance.scenarios.base import Scenario
from conformance.scenarios.examples import PLAIN
from kvref.builder import ReferenceKVCacheConfigBuilder


def test_every_invariant_reads_registered_scenarios() -> None:
    names = set(registry.names())
    for inv in catalog():
        assert set(inv.scenarios) <= names, inv.id


def test_every_scenario_is_read_by_some_invariant() -> None:
    for scenario in registry.names():
        assert any(inv.scenario == scenario for inv in catalog()), scenario


def test_names_are_unique_and_in_run_order() -> None:
    names = registry.names()
    assert len(set(names)) == len(names)
    assert names[:2] == ("grouping", "placement")


def test_an_unknown_name_is_an_error_that_lists_the_scenarios() -> None:
    with pytest.raises(KeyError, match="no scenario 'nope'; the scenarios are grouping, "):
        registry.get("nope")


def test_the_host_scenario_admits_no_attention_free_model() -> None:
    from conformance.generate.limits import NO_LIMITS

    host = registry.get("host")
    assert not host.admits("attention_free", NO_LIMITS)
    assert host.admits("uniform", NO_LIMITS)


def _observe_toy(ctx: Context, ex: Any) -> Any:
    result, _ = call_grouping(ctx.guard, ctx.factory(), ex.config, ex.merged)
    return result


def _check_toy(result: Any) -> list[Violation] | Unjudged:
    if not result.ok:
        return Unjudged("the grouping call failed")
    empty = [g for g in result.value if not g.layer_names]
    return [Violation(invariant="KV-TOY-NONEMPTY", message=f"{g}") for g in empty]


TOY = Scenario(
    name="toy",
    examples=lambda d: PLAIN.examples(d.models, d.limits, d.paths),
    observe=_observe_toy,
    # Only one family: the deal must follow the record.
    admits=lambda family, _limits: family == "uniform",
)


@pytest.fixture
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy scenario and its invariant registered for one test, as a new module would."""
    catalog()  # fill the real catalog before the copy, so that nothing registers into the copy
    monkeypatch.setattr(catalog_module, "_REGISTRY", dict(catalog_module._REGISTRY))
    catalog_module.register(
        Invariant(
            id="KV-TOY-NONEMPTY",
            title="toy: no group without layers",
            anchor="grouping-nonempty",
            scenarios=("toy",),
            check=_check_toy,
        )
    )
    monkeypatch.setattr(registry, "SCENARIOS", (*registry.SCENARIOS, TOY))


@pytest.mark.usefixtures("toy_registered")
def test_a_new_scenario_is_drawn_dealt_and_judged() -> None:
    report = quick_check(
        ReferenceKVCacheConfigBuilder, "KV-TOY-NONEMPTY", examples=6, seed=3, focus="off"
    )
    (result,) = report.results
    assert result.status == "pass"
    assert result.examples == 6
    assert set(report.coverage["toy"]["families"]) == {"uniform"}


def test_a_declared_check_states_its_id_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``flag`` violations come back stamped with the declaration's id; others keep theirs."""
    from conformance.check.catalog import by_id, flag, invariant, violation

    catalog()
    monkeypatch.setattr(catalog_module, "_REGISTRY", dict(catalog_module._REGISTRY))

    @invariant("KV-TOY-STAMP", "toy", anchor="grouping-nonempty", scenario="grouping")
    def _toy(obs: Any) -> list[Violation]:
        return [flag("mine", layer="a"), violation("KV-OTHER", "a helper's")]

    found = by_id()["KV-TOY-STAMP"].check(None)
    assert [(v.invariant, v.message, v.layer) for v in found] == [
        ("KV-TOY-STAMP", "mine", "a"),
        ("KV-OTHER", "a helper's", None),
    ]
    # The module's name is the stamped check too: a direct call never sees an empty id.
    assert [v.invariant for v in _toy(None)] == ["KV-TOY-STAMP", "KV-OTHER"]
