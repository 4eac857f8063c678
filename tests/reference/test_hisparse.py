"""HiSparse (contract.md#hisparse): specs, grouping, host pool, placement, Core and errors.

The model is DeepSeek-V3.2-like: per layer a sparse-MLA source layer
(``fp8_ds_mla``: 64 tokens x 656 B = 41,984 B pages) and an indexer MLA layer
(64 x 132 B = 8,448 B pages), block 64.  Every number below was also
checked against vLLM 0.33.0 (``tests/vllm/test_new_interfaces.py``,
golden file ``hisparse.json``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest
import torch
from specs import sparse_mla_indexer, sparse_mla_source

from kvref import (
    FullAttentionSpec,
    MLAAttentionSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    allocate_kv_cache,
    plan_kv_cache,
)
from kvref.config import HiSparseConfig
from kvref.errors import ConfigError, HiSparseError, InsufficientMemoryError, LayoutError
from kvref.extra_specs import HiSparseHotSpec, HiSparseResidentSpec
from kvref.grouping import get_kv_cache_groups
from kvref.hisparse import device_buffer_size, host_pool_layout, resolve_hisparse_specs
from kvref.placement import pool_bytes_per_block
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

SOURCE = sparse_mla_source()
INDEXER = sparse_mla_indexer()
SETTINGS = HiSparseConfig(index_topk=2048)
CONFIG = PlanningConfig(
    max_model_len=8192, kv_cache_layout="BLHNC", hisparse=SETTINGS, host_pool_bytes=1 << 28
)


def model(n: int = 4, source: MLAAttentionSpec = SOURCE) -> dict[str, KVCacheSpec]:
    """``n`` transformer layers: ``m<i>`` (sparse MLA) and ``i<i>`` (indexer)."""
    specs: dict[str, KVCacheSpec] = {}
    for i in range(n):
        specs[f"m{i}"] = source
        specs[f"i{i}"] = INDEXER
    return specs


def names(groups: Sequence[KVCacheGroupSpec]) -> list[list[str]]:
    return [list(g.layer_names) for g in groups]


class TestSpecs:
    """Hot and resident specs: raw pages without layer views."""

    def test_hot(self) -> None:
        """Hot: ``blocks_per_request * page`` whatever the length."""
        hot = HiSparseHotSpec(block_size=64, page_size=41_984, blocks_per_request=64)
        assert hot.page_size_bytes == hot.real_page_size_bytes == 41_984
        assert hot.max_memory_usage_bytes(CONFIG) == 64 * 41_984
        assert not hot.has_layer_views
        assert hot.view_dtype is None

    def test_resident(self) -> None:
        """Resident: ``cdiv(min(I, L), 64) * page``; I = 2 x 2,048 = 4,096 < L = 8,192."""
        resident = HiSparseResidentSpec(block_size=64, page_size=41_984)
        assert CONFIG.max_in_flight_tokens == 4096
        assert resident.max_memory_usage_bytes(CONFIG) == 64 * 41_984
        short = attrs.evolve(CONFIG, max_model_len=1000)
        assert resident.max_memory_usage_bytes(short) == 16 * 41_984

    def test_bad_fields(self) -> None:
        """Non-positive page or block counts are ``SpecError`` s naming the field."""
        with pytest.raises(ValueError, match=r"HiSparseHotSpec\.blocks_per_request=0"):
            HiSparseHotSpec(block_size=64, page_size=8, blocks_per_request=0)
        with pytest.raises(ValueError, match=r"HiSparseResidentSpec\.page_size=-1"):
            HiSparseResidentSpec(block_size=64, page_size=-1)


class TestDeviceBuffer:
    """Hot-buffer rows: ``(q + 1) * top_k`` by default, within ``[q * top_k, 32768]``."""

    @pytest.mark.parametrize(
        ("settings", "rows"),
        [
            (HiSparseConfig(), 4096),
            (HiSparseConfig(max_decode_query_len=2), 6144),
            (HiSparseConfig(device_buffer_size=3000), 3000),
        ],
    )
    def test_rows(self, settings: HiSparseConfig, rows: int) -> None:
        """top_k 2,048: 2 x 2,048, 3 x 2,048, or the configured 3,000."""
        assert device_buffer_size(settings, 2048) == rows

    @pytest.mark.parametrize(("rows", "message"), [(1000, "must cover"), (40_000, "int16")])
    def test_out_of_range(self, rows: int, message: str) -> None:
        """Below one top-k per query, or above 32,768 rows: ``HiSparseError``."""
        with pytest.raises(HiSparseError, match=message):
            device_buffer_size(HiSparseConfig(device_buffer_size=rows), 2048)


class TestGrouping:
    """Source (host), indexer, resident and hot groups, then the rest."""

    def test_groups(self) -> None:
        """Each source unit (a leader) is 41,984 B > the 4 x 8,448 = 33,792 B indexer page.

        So every source layer gets its own resident and hot group; the hot
        buffer is cdiv(4,096, 64) = 64 blocks per request.
        """
        groups = get_kv_cache_groups(CONFIG, resolve_hisparse_specs(CONFIG, model()))
        assert names(groups) == [
            ["m0", "m1", "m2", "m3"],
            ["i0", "i1", "i2", "i3"],
            *[[f"m{i}.hisparse_resident"] for i in range(4)],
            *[[f"m{i}.hisparse_hot"] for i in range(4)],
        ]
        source, indexer = groups[0], groups[1]
        assert (source.host_resident, source.role, source.enable_kv_transfer) == (
            True,
            "HISPARSE_SOURCE",
            True,
        )
        assert (indexer.host_resident, indexer.role) == (False, "HISPARSE_INDEXER")
        assert groups[2].kv_cache_spec == HiSparseResidentSpec(block_size=64, page_size=41_984)
        assert groups[6].kv_cache_spec == HiSparseHotSpec(
            block_size=64, page_size=41_984, blocks_per_request=64
        )
        assert not any(g.enable_kv_transfer for g in groups[2:])

    def test_without_leaders_one_unit(self) -> None:
        """No index-group leader: all source layers form one unit, one resident + one hot."""
        follower = attrs.evolve(SOURCE, is_index_group_leader=False)
        groups = get_kv_cache_groups(CONFIG, model(source=follower))
        assert names(groups)[2:] == [
            [f"m{i}.hisparse_resident" for i in range(4)],
            [f"m{i}.hisparse_hot" for i in range(4)],
        ]

    def test_units_packed_to_the_indexer_page(self) -> None:
        """12 source layers, 2 wide indexers (64 x 1,400 = 89,600 B each, 179,200 in all).

        4 units are 167,936 B <= 179,200, a fifth would not fit: hot groups of 4, 4, 4.
        """
        wide = attrs.evolve(INDEXER, state_content_bytes=1400)
        specs: dict[str, KVCacheSpec] = {f"m{i}": SOURCE for i in range(12)}
        specs |= {"i0": wide, "i1": wide}
        groups = get_kv_cache_groups(CONFIG, specs)
        hot = [g for g in groups if isinstance(g.kv_cache_spec, HiSparseHotSpec)]
        assert [len(g.layer_names) for g in hot] == [4, 4, 4]

    def test_other_layers_grouped_by_default_after(self) -> None:
        """A non-MLA layer is grouped by the default rules, after HiSparse's groups."""
        full = FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16")
        groups = get_kv_cache_groups(CONFIG, model() | {"f0": full})
        assert names(groups)[-1] == ["f0"]
        assert groups[-1].kv_cache_spec == full

    def test_no_mla_takes_the_default_path(self) -> None:
        """Without MLA layers HiSparse does not group."""
        full = FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16")
        assert names(get_kv_cache_groups(CONFIG, {"f0": full})) == [["f0"]]

    def test_resolve_specs(self) -> None:
        """The worker adds 8 derived layers; resolving twice changes nothing; off: unchanged."""
        resolved = resolve_hisparse_specs(CONFIG, model())
        assert len(resolved) == 16
        assert resolve_hisparse_specs(CONFIG, resolved) == resolved
        assert resolve_hisparse_specs(PlanningConfig(), model()) == model()


class TestGroupingErrors:
    """HiSparse's refusals, each a ``HiSparseError`` naming the cause."""

    @pytest.mark.parametrize(
        ("specs", "settings", "message"),
        [
            (
                {k: attrs.evolve(v, model_version="deepseek_v4") for k, v in model().items()},
                SETTINGS,
                "DeepSeek V4",
            ),
            ({"m0": SOURCE}, SETTINGS, "indexer"),
            ({"i0": INDEXER}, SETTINGS, "sparse"),
            (model() | {"i9": attrs.evolve(INDEXER, block_size=32)}, SETTINGS, "one resolved"),
            (model(), HiSparseConfig(), "index_topk=None"),
            (model(), HiSparseConfig(index_topk=2048, device_buffer_size=1000), "must cover"),
            (
                {
                    "m0": attrs.evolve(SOURCE, is_index_group_leader=False),
                    "m1": attrs.evolve(
                        SOURCE, is_index_group_leader=False, state_content_bytes=600
                    ),
                    "i0": INDEXER,
                },
                SETTINGS,
                "one page size",
            ),
        ],
    )
    def test_errors(
        self, specs: dict[str, KVCacheSpec], settings: HiSparseConfig, message: str
    ) -> None:
        """DeepSeek-V4, a missing role, two block sizes, no top-k, a bad buffer, mixed pages."""
        config = attrs.evolve(CONFIG, hisparse=settings)
        with pytest.raises(HiSparseError, match=message):
            get_kv_cache_groups(config, specs)

    def test_host_resident_layers_conflict(self) -> None:
        """``host_resident_layers`` and HiSparse cannot both choose host layers."""
        with pytest.raises(ConfigError, match="host_resident_layers"):
            PlanningConfig(hisparse=SETTINGS, host_resident_layers={"m0"})


class TestPlacement:
    """Host pool of the source group, block-outermost device pool of the rest."""

    def place(
        self, config: PlanningConfig = CONFIG, num_blocks: int = 7, n: int = 4
    ) -> KVCacheConfig:
        specs = resolve_hisparse_specs(config, model(n))
        groups = get_kv_cache_groups(config, specs)
        return ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(
            config, groups, num_blocks
        )

    def test_host_and_device_tensors(self) -> None:
        """Host: 2**28 // (4 x 41,984) = 1,598 blocks of 167,936 B, LBNHC, placed first.

        Device: bpb = max(33,792, 41,984) rounded to the hot page = 41,984 (BLHNC).
        """
        config = self.place()
        assert config.host_num_blocks == 1598
        assert config.host_block_stride == 167_936
        assert not config.shared_host_pool
        host, *device = config.kv_cache_tensors
        assert (host.host_resident, host.layers) == (True, ("m0", "m1", "m2", "m3"))
        assert (host.size, host.layer_stride, host.block_stride, host.offset) == (
            167_936 * 1598,
            41_984 * 1598,
            41_984,
            0,
        )
        assert {t.size for t in device} == {7 * 41_984}
        assert {t.block_stride for t in device} == {41_984}
        hot = [t for t in device if t.layers[0].endswith(".hisparse_hot")]
        assert [(t.layer_stride, t.offset) for t in hot] == [(41_984, 0)] * 4

    def test_shared_pool_rounds_the_host_block(self) -> None:
        """3 source layers: a shared pool rounds 125,952 up to 126,976 (4,096 x 31).

        2**28 // 126,976 = 2,114 host blocks (2,131 without sharing).
        """
        shared = attrs.evolve(
            CONFIG, hisparse=HiSparseConfig(index_topk=2048, shared_host_pool=True)
        )
        config = self.place(shared, n=3)
        assert (config.host_block_stride, config.host_num_blocks) == (126_976, 2114)
        assert config.shared_host_pool
        private = self.place(CONFIG, n=3)
        assert (private.host_block_stride, private.host_num_blocks) == (125_952, 2131)
        # The host tensor is sized by its own LBNHC block bytes, not the stride.
        (host,) = private.host_tensors
        assert host.size == 125_952 * 2131

    def test_hot_page_rounds_the_block(self) -> None:
        """BLHNC bpb is a multiple of every hot page: raw 50,000 (a wide indexer) -> 83,968."""
        wide = attrs.evolve(INDEXER, state_content_bytes=1_250 // 2)
        specs = resolve_hisparse_specs(CONFIG, {"m0": SOURCE, "i0": wide, "i1": wide})
        groups = get_kv_cache_groups(CONFIG, specs)
        # Indexer group: 2 x 64 x 625 = 80,000 B; hot page 41,984 -> 2 x 41,984.
        assert pool_bytes_per_block(CONFIG, groups) == 83_968

    @pytest.mark.parametrize(
        ("changes", "error", "message"),
        [
            ({"host_pool_bytes": None}, HiSparseError, "host_pool_bytes=None"),
            ({"host_pool_bytes": 100_000}, HiSparseError, "holds no HiSparse host block"),
            ({"host_pool_bytes": 1 << 24}, HiSparseError, "needs 130"),
            ({"kv_cache_layout": "LBNHC"}, LayoutError, "mixed page sizes"),
        ],
    )
    def test_errors(self, changes: dict[str, object], error: type[Exception], message: str) -> None:
        """No pool, an empty pool, fewer than 8,192 / 64 + 2 = 130 blocks, a layer-outer layout."""
        with pytest.raises(error, match=message):
            self.place(attrs.evolve(CONFIG, **changes))

    def test_layer_outer_with_one_page_size(self) -> None:
        """Equal pages pass the layout check; the hot layers still need block-outermost."""
        same = attrs.evolve(INDEXER, state_content_bytes=656)
        config = attrs.evolve(CONFIG, kv_cache_layout="LBNHC")
        groups = get_kv_cache_groups(
            config, resolve_hisparse_specs(config, {"m0": SOURCE, "i0": same})
        )
        with pytest.raises(HiSparseError, match="block-outermost"):
            ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(config, groups, 3)

    def test_group_order_is_kept(self) -> None:
        """Deliberate difference: groups come back in the order given (vLLM puts host first)."""
        specs = resolve_hisparse_specs(CONFIG, model())
        groups = get_kv_cache_groups(CONFIG, specs)
        moved = [*groups[1:], groups[0]]
        config = ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(CONFIG, moved, 3)
        assert list(config.kv_cache_groups) == moved
        assert config.kv_cache_tensors[0].host_resident

    def test_no_source_group(self) -> None:
        """HiSparse on and no MLA layer: nothing for the host pool (vLLM fails to unpack)."""
        full = FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16")
        group = KVCacheGroupSpec(layer_names=["f"], kv_cache_spec=full)
        with pytest.raises(HiSparseError, match="exactly one host-resident"):
            host_pool_layout(CONFIG, [group])

    def test_hot_layers_view_the_whole_backing(self) -> None:
        """On a worker, resident and hot layers get the raw device backing."""
        small = attrs.evolve(CONFIG, max_model_len=1024, host_pool_bytes=1 << 24)
        config = self.place(small, 3)
        allocation = allocate_kv_cache(config, torch.device("cpu"))
        assert allocation.views["m0.hisparse_hot"] is allocation.device_buffer
        assert tuple(allocation.views["m0"].shape) == (99, 1, 64, 656)


class TestCore:
    """Core under HiSparse: pure bytes per block, host-pool-aware auto-fit."""

    def test_plan(self) -> None:
        """1 GiB // 41,984 = 25,575 blocks; one request needs 4 x (64 + 64) + 128 = 640 blocks."""
        specs = resolve_hisparse_specs(CONFIG, model())
        plan = plan_kv_cache(ReferenceKVCacheConfigBuilder, CONFIG, [specs], 1 << 30)
        worker = plan.workers[0]
        assert (worker.pool_bytes_per_block, plan.num_blocks) == (41_984, 25_575)
        # indexer cdiv(8192, 64) = 128; resident 4 x cdiv(4096, 64); hot 4 x 64.
        assert worker.needed_memory == (128 + 4 * 64 + 4 * 64) * 41_984

    def test_pure_bytes_per_block_ignores_the_builder(self) -> None:
        """A builder's declared pool bytes are not asked under HiSparse."""

        class Declares(ReferenceKVCacheConfigBuilder):
            def _get_pool_bytes_per_block(
                self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
            ) -> int | None:
                return 1

        specs = resolve_hisparse_specs(CONFIG, model())
        plan = plan_kv_cache(Declares, CONFIG, [specs], 1 << 30)
        assert plan.workers[0].pool_bytes_per_block == 41_984

    def test_auto_fit_respects_the_host_pool(self) -> None:
        """2**24 // 167,936 = 99 host blocks hold (99 - 2) x 64 = 6,208 tokens."""
        config = attrs.evolve(
            CONFIG, host_pool_bytes=1 << 24, auto_fit_max_model_len=True, max_model_len=65_536
        )
        specs = resolve_hisparse_specs(config, model())
        plan = plan_kv_cache(ReferenceKVCacheConfigBuilder, config, [specs], 1 << 30)
        assert plan.max_model_len == 6208

    def test_host_pool_too_small_without_auto_fit(self) -> None:
        """Without auto-fit the final placement refuses the pool."""
        config = attrs.evolve(CONFIG, host_pool_bytes=1 << 24)
        specs = resolve_hisparse_specs(config, model())
        with pytest.raises(HiSparseError, match="needs 130"):
            plan_kv_cache(ReferenceKVCacheConfigBuilder, config, [specs], 1 << 30)

    def test_device_memory_still_checked(self) -> None:
        """Host bytes are not device bytes: 640 blocks of 41,984 B need more than 16 MiB."""
        specs = resolve_hisparse_specs(CONFIG, model())
        with pytest.raises(InsufficientMemoryError):
            plan_kv_cache(ReferenceKVCacheConfigBuilder, CONFIG, [specs], 1 << 24)
