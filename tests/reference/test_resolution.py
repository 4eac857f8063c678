"""Builder resolution (platform > model > default, a fresh instance per call) and
model-declared grouping (vLLM's ``SupportsKVCacheGrouping``) in the reference builder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import pytest
from _hooked import hooked
from specs import MODEL_A as LAYERS
from specs import MODEL_A_FULL as FULL
from specs import MODEL_A_SWA as SWA

from kvref import (
    FullAttentionSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    plan_kv_cache,
)
from kvref.config import GroupingHook, HiSparseConfig
from kvref.errors import ConfigError, GroupingError, PartitionError
from kvref.grouping import create_kv_cache_group_specs
from kvref.records import KVCacheGroupSpec
from kvref.resolution import (
    DEFAULT_BUILDER_QUALNAME,
    BuilderResolutionError,
    get_kv_cache_config_builder,
    get_kv_cache_config_builder_cls,
    resolve_builder_class,
)
from kvref.specs import KVCacheSpec


class PlatformBuilder(ReferenceKVCacheConfigBuilder):
    """A platform's builder: the reference, counted."""

    made: ClassVar[int] = 0

    def __init__(self) -> None:
        type(self).made += 1


class ModelBuilder(ReferenceKVCacheConfigBuilder):
    """A builder a model declares."""


class NeedsArgument(ReferenceKVCacheConfigBuilder):
    """A builder that cannot be built without arguments."""

    def __init__(self, scale: int) -> None:
        self.scale = scale


NOT_A_BUILDER = 42
HERE = __name__


class TestResolution:
    """``get_kv_cache_config_builder``: platform, then model, then the reference."""

    def test_default_is_the_reference(self) -> None:
        """No qualname: the reference builder's qualname and a reference instance."""
        config = PlanningConfig()
        assert get_kv_cache_config_builder_cls(config) == DEFAULT_BUILDER_QUALNAME
        assert type(get_kv_cache_config_builder(config)) is ReferenceKVCacheConfigBuilder

    def test_platform_wins_over_model(self) -> None:
        """Both set: the platform's class."""
        config = PlanningConfig(
            platform_builder_cls=f"{HERE}.PlatformBuilder", model_builder_cls=f"{HERE}:ModelBuilder"
        )
        assert type(get_kv_cache_config_builder(config)) is PlatformBuilder

    def test_model_when_no_platform(self) -> None:
        """Only the model names one (``module:Class`` form): the model's class."""
        config = PlanningConfig(model_builder_cls=f"{HERE}:ModelBuilder")
        assert get_kv_cache_config_builder_cls(config) == f"{HERE}:ModelBuilder"
        assert type(get_kv_cache_config_builder(config)) is ModelBuilder

    def test_fresh_instance_per_call(self) -> None:
        """Two calls give two distinct instances, each built without arguments."""
        config = PlanningConfig(platform_builder_cls=f"{HERE}.PlatformBuilder")
        before = PlatformBuilder.made
        first = get_kv_cache_config_builder(config)
        second = get_kv_cache_config_builder(config)
        assert first is not second
        assert PlatformBuilder.made == before + 2

    def test_core_resolves_once_per_phase(self) -> None:
        """``plan_kv_cache(None, ...)``: grouping and placement get distinct fresh builders."""
        config = PlanningConfig(platform_builder_cls=f"{HERE}.PlatformBuilder", max_model_len=4096)
        before = PlatformBuilder.made
        plan = plan_kv_cache(None, config, [LAYERS], 1 << 30)
        reference = plan_kv_cache(ReferenceKVCacheConfigBuilder, config, [LAYERS], 1 << 30)
        # get_global_kv_cache_groups and get_kv_cache_configs: two phases.
        assert PlatformBuilder.made == before + 2
        assert plan.configs == reference.configs

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("model_builder_cls", "Builder", "must be a qualname"),
            ("platform_builder_cls", ":Builder", "must be a qualname"),
            ("platform_builder_cls", 42, "must be a qualname str"),
        ],
    )
    def test_malformed_qualname_is_refused_at_construction(
        self, field: str, value: object, message: str
    ) -> None:
        """The config checks the name's form, naming the field and the value."""
        with pytest.raises(BuilderResolutionError, match=message) as info:
            PlanningConfig(**{field: value})  # type: ignore[arg-type]
        assert f"PlanningConfig.{field}={value!r}" in str(info.value)
        assert isinstance(info.value, ConfigError)

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("platform_builder_cls", "no_such_module_xyz.Builder", "cannot import module"),
            ("model_builder_cls", f"{HERE}.NoSuchBuilder", "has no attribute 'NoSuchBuilder'"),
            ("platform_builder_cls", f"{HERE}.NOT_A_BUILDER", "not a subclass"),
            ("model_builder_cls", "kvref.config.PlanningConfig", "not a subclass"),
            ("platform_builder_cls", "kvref.KVCacheConfigBuilder", "abstract class"),
        ],
    )
    def test_unresolvable_qualname_is_a_typed_error_on_use(
        self, field: str, value: object, message: str
    ) -> None:
        """As in vLLM, the name is resolved when a builder is asked for, not before.

        A config naming a module that does not import is built (importing
        nothing); asking it for its builder names the field and the value.
        """
        config = PlanningConfig(**{field: value})  # type: ignore[arg-type]
        with pytest.raises(BuilderResolutionError, match=message) as info:
            get_kv_cache_config_builder(config)
        assert f"PlanningConfig.{field}={value!r}" in str(info.value)
        assert isinstance(info.value, ConfigError)

    def test_class_needing_arguments_is_refused_on_use(self) -> None:
        """A concrete builder whose constructor needs arguments fails when resolved."""
        config = PlanningConfig(model_builder_cls=f"{HERE}.NeedsArgument")
        with pytest.raises(BuilderResolutionError, match="without arguments"):
            get_kv_cache_config_builder(config)

    def test_resolve_builder_class(self) -> None:
        """The resolver returns the class itself, for both spellings."""
        assert resolve_builder_class(f"{HERE}.ModelBuilder") is ModelBuilder
        assert resolve_builder_class("kvref:ReferenceKVCacheConfigBuilder") is (
            ReferenceKVCacheConfigBuilder
        )


def listed_grouping(lists: Sequence[Sequence[str]]) -> GroupingHook:
    """A model-declared grouping that returns ``lists`` with merged specs."""

    def group(config: PlanningConfig, specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
        return create_kv_cache_group_specs(specs, lists)

    return group


class DeclaringModel:
    """A ``SupportsKVCacheGrouping`` object: one group per layer kind, contiguous."""

    calls: ClassVar[list[int]] = []

    @classmethod
    def get_kv_cache_groups(
        cls, config: PlanningConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Full layers in one group, sliding-window layers in one group."""
        cls.calls.append(len(kv_cache_spec))
        full = [n for n, s in kv_cache_spec.items() if type(s) is FullAttentionSpec]
        local = [n for n in kv_cache_spec if n not in full]
        kv_cache_spec.clear()  # the model may consume its argument; the caller's stays
        return create_kv_cache_group_specs(
            {**dict.fromkeys(full, FULL), **dict.fromkeys(local, SWA)}, [full, local]
        )


class TestModelDeclaredGrouping:
    """The reference builder honours ``model_kv_cache_grouping`` before its own grouping."""

    def test_declared_groups_are_used(self) -> None:
        """Model (a) of contract.md#grouping-examples declared as 2 groups (10 F, 20 S)."""
        config = PlanningConfig(model_kv_cache_grouping=DeclaringModel)
        specs = dict(LAYERS)
        groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, specs)
        assert [len(g.layer_names) for g in groups] == [10, 20]
        assert specs == LAYERS
        default = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(PlanningConfig(), LAYERS)
        assert [len(g.layer_names) for g in default] == [10, 10, 10]

    def test_declared_groups_drive_core(self) -> None:
        """Core plans the declared groups: bpb = 20 * 65,536 = 1,310,720 (the widest group)."""
        config = PlanningConfig(model_kv_cache_grouping=DeclaringModel, max_model_len=4096)
        plan = plan_kv_cache(ReferenceKVCacheConfigBuilder, config, [LAYERS], 1 << 30)
        assert plan.workers[0].pool_bytes_per_block == 20 * 65_536
        # 1 GiB // 1,310,720 B per block = 819 blocks.
        assert plan.num_blocks == (1 << 30) // 1_310_720 == 819

    def test_callable_hook(self) -> None:
        """A plain callable works as the declaration too."""
        lists = [[f"l{i}" for i in range(0, 30, 3)], [f"l{i}" for i in range(30) if i % 3]]
        config = PlanningConfig(model_kv_cache_grouping=listed_grouping(lists))
        groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, LAYERS)
        assert [list(g.layer_names) for g in groups] == lists

    @pytest.mark.parametrize(
        ("lists", "message"),
        [
            ([["l0", "l1"], ["l1", "l2"]], "in group 0 and group 1"),
            ([["l0", "l1"]], "groups miss layers"),
            ([["l0", "l1", "l2", "ghost"]], "ghost"),
        ],
    )
    def test_core_partition_check_runs_on_the_declaration(
        self, lists: list[list[str]], message: str
    ) -> None:
        """Overlap, a missing layer or an unknown name: ``PartitionError``."""
        specs = {n: FULL for n in ("l0", "l1", "l2")}

        def group(config: PlanningConfig, given: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
            return [KVCacheGroupSpec(layer_names=names, kv_cache_spec=FULL) for names in lists]

        config = PlanningConfig(model_kv_cache_grouping=group)
        with pytest.raises(PartitionError, match=message):
            ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, specs)

    def test_non_list_result_is_a_grouping_error(self) -> None:
        """A declaration returning something other than a list is refused."""
        config = PlanningConfig(model_kv_cache_grouping=lambda c, s: None)  # type: ignore[arg-type]
        with pytest.raises(GroupingError, match="not a list of KVCacheGroupSpec"):
            ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, {"l0": FULL})

    def test_combined_with_hisparse_is_a_config_error(self) -> None:
        """vLLM raises ``ValueError``; kvref a ``ConfigError`` naming both settings."""
        config = PlanningConfig(
            model_kv_cache_grouping=DeclaringModel, hisparse=HiSparseConfig(index_topk=2048)
        )
        with pytest.raises(ConfigError, match=r"model_kv_cache_grouping=.*HiSparse"):
            ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, {"l0": FULL})

    def test_bad_hook_value(self) -> None:
        """A value that is neither callable nor a grouping object is refused at construction."""
        with pytest.raises(ConfigError, match="model_kv_cache_grouping=3"):
            PlanningConfig(model_kv_cache_grouping=3)  # type: ignore[arg-type]

    def test_subclass_that_overrides_grouping_bypasses_the_declaration(self) -> None:
        """As in vLLM, a builder overriding ``get_kv_cache_groups`` owns grouping.

        Even a subclass of the reference, whose own grouping honours the declaration.
        """
        one_group = hooked(
            groups=lambda _, config, specs: [
                KVCacheGroupSpec(layer_names=tuple(specs), kv_cache_spec=FULL)
            ]
        )
        config = PlanningConfig(model_kv_cache_grouping=DeclaringModel)
        specs = {n: FULL for n in ("a", "b")}
        assert len(one_group().get_kv_cache_groups(config, specs)) == 1
