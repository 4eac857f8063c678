"""Where kvref differs from the installed vLLM on purpose, each difference pinned down.

See contract.md#deliberate-differences.  kvref plans as the installed release.

(a) placement returns the requested ``num_blocks``; vLLM's default returns
    ``num_gpu_blocks_override``;
(b) the PP projection of a uniform-type group with no layer on a worker is
    empty in kvref; vLLM 0.33.0 keeps the global spec and places foreign
    layers (vLLM 0.34.0 fixed it, issue 54711: there both agree);
(c) layer-outer placement with different aligned strides across groups:
    vLLM lets different block IDs alias, kvref uses one common stride;
(d) kvref's errors are typed; vLLM raises ``AssertionError`` and friends;
(e) with the hybrid manager disabled, vLLM 0.33.0 fails to promote SW-MLA
    (``TypeError``); kvref promotes it as vLLM 0.34.0 does.

Run: ``/work/vllm-venv/bin/python -m pytest -m vllm tests/vllm`` (or ``tox -e vllm``).
"""

from __future__ import annotations

import pytest
from _vllm_diff import INSTALLED, VLLMDefault, describe_tensors, group_names, run_kvref, run_vllm
from specs import projection_repro

from conformance.check.memory import check_memory
from kvref import (
    FullAttentionSpec,
    InsufficientMemoryError,
    KVCacheLayout,
    KVRefError,
    MLAAttentionSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    WorkerSpecMismatchError,
)
from kvref.errors import PartitionError

pytestmark = pytest.mark.vllm

GIB = 2**30


class TestOverride:
    """(a) ``num_gpu_blocks_override`` in placement."""

    def test_placement_returns_override_in_vllm_only(self) -> None:
        """Asked for 7 blocks with the override at 100: vLLM returns 100, kvref 7."""
        spec = FullAttentionSpec(num_kv_heads=2, head_size=16, dtype="float16", block_size=16)
        model = {"a": spec, "b": spec}
        config = PlanningConfig(
            vllm_version=INSTALLED, max_model_len=4096, num_gpu_blocks_override=100
        )
        ref, vl = ReferenceKVCacheConfigBuilder(), VLLMDefault()
        groups = ref.get_kv_cache_groups(config, model)
        assert vl.get_kv_cache_config_from_groups(config, groups, 7).num_blocks == 100
        assert ref.get_kv_cache_config_from_groups(config, groups, 7).num_blocks == 7

    def test_core_flow_still_agrees(self) -> None:
        """Core asks for exactly the override, so both flows end with it."""
        spec = FullAttentionSpec(num_kv_heads=2, head_size=16, dtype="float16", block_size=16)
        config = PlanningConfig(
            vllm_version=INSTALLED, max_model_len=1024, num_gpu_blocks_override=100
        )
        workers = [{"a": spec}, {"b": spec}]
        ref, vl = run_kvref(config, workers, [GIB, GIB]), run_vllm(config, workers, [GIB, GIB])
        assert ref.plan is not None and vl.plan is not None
        assert ref.plan.num_blocks == vl.plan.num_blocks == 100


class TestPPProjection:
    """(b) Repro: w0 = {f0..f3 (8 heads), s0a..s3a (6 heads)}, w1 = {s0b..s3b}, BLHNC.

    See contract.md#deliberate-differences.
    """

    def _problem(self) -> tuple[PlanningConfig, list[dict[str, object]]]:
        config = PlanningConfig(
            vllm_version=INSTALLED,
            max_model_len=8192,
            kv_cache_layout=KVCacheLayout.BLHNC,
            pipeline_parallel_size=2,
        )
        return config, projection_repro()

    def test_same_global_groups(self) -> None:
        """Both group f0..f3 into one uniform-type group that has no layer on w1."""
        config, workers = self._problem()
        ref = run_kvref(config, workers, [GIB, GIB])  # type: ignore[arg-type]
        vl = run_vllm(config, workers, [GIB, GIB])  # type: ignore[arg-type]
        assert ref.plan is not None and vl.plan is not None
        assert vl.plan.global_groups == ref.plan.global_groups
        assert group_names(ref.plan.global_groups)[0] == ("f0", "f1", "f2", "f3")

    def test_vllm_places_foreign_layers(self) -> None:
        """VLLM 0.33.0 gives w1 a tensor of f0..f3 (4 x 65,536 B at block stride 98,304), out
        of bounds; vLLM 0.34.0 places only w1's layers, as kvref does."""
        config, workers = self._problem()
        vl = run_vllm(config, workers, [GIB, GIB])  # type: ignore[arg-type]
        assert vl.plan is not None
        w1 = vl.plan.configs[1]
        foreign = [t for t in w1.kv_cache_tensors if set(t.layers) - set(workers[1])]
        if config.rules.placement_walks_layer_specs:
            ref = run_kvref(config, workers, [GIB, GIB])  # type: ignore[arg-type]
            assert ref.plan is not None
            assert foreign == []
            assert describe_tensors(vl.plan) == describe_tensors(ref.plan)
            return
        assert [(t.layers, t.layer_stride, t.block_stride) for t in foreign] == [
            (("f0", "f1", "f2", "f3"), 65_536, 98_304)
        ]
        # 4 x 65,536 bytes do not fit in a 98,304-byte block: the last block's
        # last layer ends past the backing (the kit's memory check skips the
        # tensor outright: its layers are in no group of this worker).
        t = foreign[0]
        end = t.offset + 3 * t.layer_stride + (w1.num_blocks - 1) * t.block_stride + 65_536
        assert end > t.size
        assert check_memory(w1, config.kv_cache_layout).problems

    def test_kvref_projects_to_empty(self) -> None:
        """kvref keeps the group (block IDs are global) but places nothing for it on w1."""
        config, workers = self._problem()
        ref = run_kvref(config, workers, [GIB, GIB])  # type: ignore[arg-type]
        assert ref.plan is not None
        w1 = ref.plan.configs[1]
        assert w1.kv_cache_groups[0].layer_names == ()
        assert {n for t in w1.kv_cache_tensors for n in t.layers} == set(workers[1])
        report = check_memory(w1, config.kv_cache_layout)
        assert not (report.out_of_bounds or report.block_overlaps or report.layer_overlaps)


class TestLayerOuterAlias:
    """(c) the contract example: LBNHC, N=2, pages of 96 B, alignments 24 (F) vs 64 (S).

    See contract.md#memory-safety.
    """

    def _groups_and_config(self) -> tuple[list[object], PlanningConfig]:
        kw = {"num_kv_heads": 1, "head_size": 24, "dtype": "float16", "block_size": 1}
        full = FullAttentionSpec(block_stride_alignment=24, **kw)  # type: ignore[arg-type]
        swa = SlidingWindowSpec(
            block_stride_alignment=64,
            sliding_window=1024,
            **kw,  # type: ignore[arg-type]
        )
        assert full.page_size_bytes == swa.page_size_bytes == 96
        model = {"L0": full, "L1": swa, "L2": swa, "L3": full}
        config = PlanningConfig(
            vllm_version=INSTALLED, max_model_len=2048, kv_cache_layout=KVCacheLayout.LBNHC
        )
        groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, model)
        assert [g.layer_names for g in groups] == [("L0", "L3"), ("L1", "L2")]
        assert VLLMDefault().get_kv_cache_groups(config, model) == groups
        return list(groups), config

    def test_vllm_aliases_block_ids(self) -> None:
        """vLLM: G0 at Bs 96 / Ls 192, G1 at Bs 128 / Ls 256; block 0 of L3 meets block 1 of L1."""
        groups, config = self._groups_and_config()
        placed = VLLMDefault().get_kv_cache_config_from_groups(config, groups, 2)  # type: ignore[arg-type]
        strides = [(t.layers, t.layer_stride, t.block_stride) for t in placed.kv_cache_tensors]
        assert strides == [(("L0", "L3"), 192, 96), (("L1", "L2"), 256, 128)]
        assert check_memory(placed, config.kv_cache_layout).block_overlaps

    def test_kvref_uses_common_stride(self) -> None:
        """kvref: one block stride for every group (round_up(96, lcm(24, 64)) = 192), no alias."""
        groups, config = self._groups_and_config()
        placed = ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(
            config,
            groups,  # type: ignore[arg-type]
            2,
        )
        assert {t.block_stride for t in placed.kv_cache_tensors} == {192}
        report = check_memory(placed, config.kv_cache_layout)
        assert not (report.out_of_bounds or report.block_overlaps or report.layer_overlaps)


class TestTypedErrors:
    """(d) vLLM's untyped failures are typed kvref errors."""

    def test_worker_spec_mismatch(self) -> None:
        """A layer with two specs on two workers: vLLM asserts, kvref raises a typed error."""
        a = FullAttentionSpec(num_kv_heads=2, head_size=16, dtype="float16", block_size=16)
        b = FullAttentionSpec(num_kv_heads=4, head_size=16, dtype="float16", block_size=16)
        workers = [{"x": a}, {"x": b}]
        config = PlanningConfig(vllm_version=INSTALLED, pipeline_parallel_size=2)
        vl, ref = run_vllm(config, workers, [GIB, GIB]), run_kvref(config, workers, [GIB, GIB])
        assert isinstance(vl.error, AssertionError)
        assert isinstance(ref.error, WorkerSpecMismatchError)

    def test_zero_layer_worker(self) -> None:
        """A worker without KV layers: vLLM fails untyped; kvref gives it the others' blocks."""
        spec = FullAttentionSpec(num_kv_heads=2, head_size=16, dtype="float16", block_size=16)
        workers: list[dict[str, FullAttentionSpec]] = [{"a": spec, "b": spec}, {}]
        config = PlanningConfig(
            vllm_version=INSTALLED, max_model_len=1024, pipeline_parallel_size=2
        )
        memory = [GIB, GIB]
        vl, ref = run_vllm(config, workers, memory), run_kvref(config, workers, memory)
        assert vl.error is not None and not isinstance(vl.error, KVRefError)
        assert ref.plan is not None
        assert ref.plan.configs[1].kv_cache_tensors == ()

    def test_memory_errors_carry_numbers(self) -> None:
        """Both refuse too little memory; kvref's error has exact bytes, vLLM's are parsed GiB."""
        spec = FullAttentionSpec(num_kv_heads=8, head_size=128, dtype="bfloat16", block_size=16)
        model = {f"l{i}": spec for i in range(8)}
        config = PlanningConfig(vllm_version=INSTALLED, max_model_len=32768)
        vl, ref = run_vllm(config, [model], [GIB]), run_kvref(config, [model], [GIB])
        assert isinstance(ref.error, InsufficientMemoryError)
        assert isinstance(vl.error, InsufficientMemoryError)
        assert vl.error.max_model_len == ref.error.max_model_len == 32768
        assert vl.error.needed_bytes == ref.error.needed_bytes
        assert vl.error.estimated_max_model_len == ref.error.estimated_max_model_len

    def test_partition_error_typed(self) -> None:
        """A builder that drops a layer: vLLM's Core asserts, kvref's raises PartitionError."""
        assert issubclass(PartitionError, KVRefError)


class TestSlidingWindowMLAPromotion:
    """(e) The hybrid manager disabled, SW-MLA beside MLA: vLLM 0.33.0 cannot promote it.

    Its promotion carries every field over and MLA has no ``bounded_replay``:
    a ``TypeError``.  kvref promotes as vLLM 0.34.0 does (dropping the field).
    """

    def test_promotion(self) -> None:
        """VLLM 0.33.0 raises TypeError; vLLM 0.34.0 and kvref give one MLA group."""
        kw = {"block_size": 64, "num_kv_heads": 1, "head_size": 576, "dtype": "bfloat16"}
        model = {
            "m": MLAAttentionSpec(**kw),  # type: ignore[arg-type]
            "w": SlidingWindowMLASpec(sliding_window=128, **kw),  # type: ignore[arg-type]
        }
        config = PlanningConfig(vllm_version=INSTALLED, disable_hybrid_kv_cache_manager=True)
        ours = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, model)
        assert group_names(ours) == [("m", "w")]
        assert type(ours[0].kv_cache_spec) is MLAAttentionSpec
        if config.rules.fallback_covers_sliding_window_mla:
            assert VLLMDefault().get_kv_cache_groups(config, model) == ours
            return
        with pytest.raises(TypeError, match="bounded_replay"):
            VLLMDefault().get_kv_cache_groups(config, model)
