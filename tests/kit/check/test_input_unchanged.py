"""KV-GROUP-INPUT-UNCHANGED says what changed, and which rule it breaks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace

import pytest

from conformance import check_builder
from conformance.check.catalog import catalog
from conformance.check.violations import Violation
from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow


def _judge(*mutations: str) -> list[Violation]:
    inv = next(i for i in catalog() if i.id == "KV-GROUP-INPUT-UNCHANGED")
    obs = SimpleNamespace(mutated=bool(mutations), mutations=mutations)
    found = inv.check(obs)
    assert isinstance(found, list)
    return found


def test_a_changed_spec_object_is_named_with_its_field() -> None:
    """A spec object padded in place: the message names the layer, the field, old and new."""
    found = _judge("spec of 'model.layers.0.attn'.block_size: 16 -> 32")
    assert len(found) == 1
    message = found[0].message
    assert "'model.layers.0.attn'.block_size: 16 -> 32" in message
    assert "nor change a spec object or the config it was given" in message
    # The old message told the vendor in-place rewriting was allowed: it is not, for objects.
    assert "rewriting specs in place is allowed" not in message


def test_dropped_layers_are_named() -> None:
    """Layers removed from the dict: said as such."""
    (found,) = _judge("the dict's layers were added, removed or reordered")
    assert "added, removed or reordered" in found.message


def test_many_changes_are_counted() -> None:
    """More than four changes: four shown, the rest counted."""
    (found,) = _judge(*(f"spec of 'l{i}'.head_size: 64 -> 128" for i in range(6)))
    assert "'l3'" in found.message and "'l4'" not in found.message
    assert "(and 2 more)" in found.message


def test_an_unchanged_input_passes() -> None:
    """No mutation: nothing found."""
    assert _judge() == []


class WritesConfigInGrouping(ReferenceKVCacheConfigBuilder):
    """Halves ``max_model_len`` on the config it is handed (frozen, but not to ``object``)."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        object.__setattr__(config, "max_model_len", max(1, config.max_model_len // 2))
        return super().get_kv_cache_groups(config, kv_cache_spec)


class WritesConfigInPlacement(ReferenceKVCacheConfigBuilder):
    """Records the block count it was asked for as the config's block override."""

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        object.__setattr__(config, "num_gpu_blocks_override", num_blocks)
        return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)


_HOOK_PURITY = ["KV-GROUP-INPUT-UNCHANGED", "KV-PLACE-INPUT-UNCHANGED"]


class TestConfigWrites:
    """A hook that writes the config it is handed is named, field and values, on both paths."""

    @pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
    @pytest.mark.parametrize(
        ("builder", "meant", "field"),
        [
            (WritesConfigInGrouping, "KV-GROUP-INPUT-UNCHANGED", "config.max_model_len: "),
            (WritesConfigInPlacement, "KV-PLACE-INPUT-UNCHANGED", "config.num_gpu_blocks_override"),
        ],
        ids=["grouping", "placement"],
    )
    def test_a_written_config_fails_the_hooks_purity(
        self, builder: type, meant: str, field: str, isolate: bool
    ) -> None:
        """The meant invariant fails, its message names the config's field; nothing else fails."""
        report = check_builder(
            builder, select=_HOOK_PURITY, max_examples=5, seed=1, isolate=isolate, shrink=False
        )
        assert {r.id for r in report.failures} == {meant}
        (failure,) = report.failures
        assert any(field in v.message for v in failure.violations), failure.violations

    def test_the_reference_writes_no_config(self) -> None:
        """The reference passes both purity invariants: the comparison has no false alarm."""
        report = check_builder(
            ReferenceKVCacheConfigBuilder, select=_HOOK_PURITY, max_examples=10, seed=2
        )
        assert report.ok
        assert all(r.examples > 0 for r in report.results)
