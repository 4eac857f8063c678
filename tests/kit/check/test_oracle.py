"""The kit's geometry is its own: it matches the contract and catches bugs planted in kvref's.

``conformance.check.geometry`` computes strides, pages, alignments and the
admission need from spec fields (contract.md#views-and-strides,
contract.md#memory-safety, contract.md#core-admission).  Here:

- it reproduces the contract's worked numbers;
- it agrees with kvref on generated specs (two independent implementations);
- a bug planted in a copy of kvref's stride math, page formula, alignment or
  admission formula, monkeypatched into kvref, makes the reference fail the
  kit's checks, while the unpatched reference passes them.  Each planted bug
  is self-consistent inside kvref, so a kit that borrowed kvref's formulas
  would have passed it (shown for the stride bug).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specs import compressed_mla

import kvref.allocation
import kvref.kernel_blocks
import kvref.layout
import kvref.placement
import kvref.planning
from conformance.check import geometry as geo
from conformance.check.catalog import Unjudged, by_id
from conformance.check.memory import check_memory
from conformance.extensions.device.checks import check_device_tags
from conformance.generate import strategies as gen
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.scenarios.core import observe_core
from conformance.scenarios.placement import observe_placement
from kvref import (
    FullAttentionSpec,
    KVCacheLayout,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    plan_kv_cache,
)
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import AttentionSpec, KVCacheSpec

# -- the contract's worked numbers --------------------------------------------------------


def _two_head_page() -> FullAttentionSpec:
    # H = 2, S = 2, C = 16 (head_size 4 + 4 values, fp16): a 64-byte page.
    return FullAttentionSpec(block_size=2, num_kv_heads=2, head_size=4, dtype=torch.float16)


#: contract.md#layouts: 2 layers, 3 blocks of the 2-head page, strides (L, B, H, S, C).
WORKED_STRIDES = {
    "LBHNC": (192, 64, 32, 16, 1),
    "LBNHC": (192, 64, 16, 32, 1),
    "LHBNC": (192, 32, 96, 16, 1),
    "BLHNC": (64, 128, 32, 16, 1),
    "BLNHC": (64, 128, 16, 32, 1),
    "BHLNC": (32, 128, 64, 16, 1),
}


class TestContractNumbers:
    """The geometry reproduces the contract's worked numbers."""

    @pytest.mark.parametrize("layout", sorted(WORKED_STRIDES))
    def test_layout_strides(self, layout: str) -> None:
        """Each layout's strides for 2 layers, 3 blocks of a 2-head page (B pinned if outermost)."""
        pinned_block = 128 if layout.startswith("B") else None
        strides = geo.layout_strides(
            _two_head_page(), 3, 2, layout, pinned=(None, pinned_block, None, None, None)
        )
        assert strides == WORKED_STRIDES[layout]

    def test_mla_pages(self) -> None:
        """DeepSeek-V3 MLA pages: 73,728 B in bf16 and 41,984 B with fp8_ds_mla."""
        dense = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype="bfloat16")
        fp8 = MLAAttentionSpec(
            block_size=64, num_kv_heads=1, head_size=576, dtype=torch.uint8, state_content_bytes=656
        )
        assert geo.page_bytes(dense) == 64 * 576 * 2 == 73_728
        assert geo.page_bytes(fp8) == 64 * 656 == 41_984

    def test_aligned_mla_page(self) -> None:
        """A compressed MLA page of 64 states of 584 B is padded to a multiple of 576: 37,440 B."""
        spec = compressed_mla()
        page = geo.page_geometry(spec)
        assert (page.states, page.content, page.page) == (64, 584, 37_440)
        assert page.footprint == 37_376

    def test_multiple_of_alignment(self) -> None:
        """MultipleOf(b) asks for the page at gcd(b, block) tokens; nothing at the whole block."""
        spec = FullAttentionSpec(
            block_size=64,
            num_kv_heads=2,
            head_size=64,
            dtype="bfloat16",
            block_stride_alignment=MultipleOf(16),
        )
        assert geo.block_stride_alignment(spec) == 2 * 16 * 256
        whole = FullAttentionSpec(
            block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16",
            block_stride_alignment=MultipleOf(64),
        )  # fmt: skip
        assert geo.block_stride_alignment(whole) == 1

    def test_fractional_tokens_per_state(self) -> None:
        """Half a token per state doubles the states of a block."""
        spec = FullAttentionSpec(
            block_size=8, num_kv_heads=1, head_size=8, dtype="bfloat16",
            tokens_per_state=Fraction(1, 2),
        )  # fmt: skip
        assert geo.page_geometry(spec).states == 16

    def test_mamba_page(self) -> None:
        """A Mamba page is the sum of its state tensors; align mode keeps 2 + spec + ckpt pages."""
        spec = MambaSpec(
            block_size=16, shapes=((4, 8), (16,)), dtypes=("float32", "bfloat16"),
            num_speculative_blocks=1,
        )  # fmt: skip
        assert geo.page_bytes(spec) == 4 * 8 * 4 + 16 * 2
        align = PlanningConfig(mamba_cache_mode="align")
        assert geo.max_memory_bytes(spec, align) == geo.page_bytes(spec) * 3
        assert geo.max_memory_bytes(spec, PlanningConfig()) == geo.page_bytes(spec) * 2

    def test_padded_page_needs_a_compact_layout(self) -> None:
        """A padded 2-head page cannot be expressed in LHBNC."""
        spec = FullAttentionSpec(
            block_size=2, num_kv_heads=2, head_size=4, dtype=torch.float16, page_size_padded=96
        )
        assert geo.layout_strides(spec, 3, 2, "LBNHC")[:2] == (288, 96)
        with pytest.raises(geo.OracleError, match="LHBNC"):
            geo.layout_strides(spec, 3, 2, "LHBNC")

    def test_sliding_window_need(self) -> None:
        """A window keeps min(window - 1 + in-flight, L) tokens, plus one block."""
        spec = SlidingWindowSpec(
            block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16", sliding_window=1024
        )
        config = PlanningConfig(max_model_len=32768, max_num_batched_tokens=2048)
        tokens = min(1024 - 1 + config.max_in_flight_tokens, 32768)
        assert geo.max_memory_bytes(spec, config) == (math.ceil(tokens / 16) + 1) * 16 * 256

    def test_unknown_kind_is_an_oracle_error(self) -> None:
        """A spec kind without a contract formula raises OracleError, naming the class."""

        class Strange(AttentionSpec):
            pass

        spec = Strange(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")
        with pytest.raises(geo.OracleError, match="Strange"):
            geo.max_memory_bytes(spec, PlanningConfig())


# -- two implementations agree ------------------------------------------------------------

_SPECS = st.one_of(
    gen.full_attention_specs(),
    gen.mla_specs(),
    gen.sliding_window_specs(),
    gen.sliding_window_mla_specs(),
    gen.chunked_local_specs(),
    gen.circular_buffer_specs(),
    gen.mamba_specs(),
    gen.cross_attention_specs(),
)


class TestAgreesWithReference:
    """On generated specs, the kit's geometry and kvref's give the same numbers."""

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_SPECS, st.sampled_from(list(KVCacheLayout)), st.integers(1, 6), st.integers(1, 4))
    def test_same_geometry(
        self, spec: KVCacheSpec, layout: KVCacheLayout, blocks: int, layers: int
    ) -> None:
        """Pages, alignments, view extents, strides and needs agree (or both refuse)."""
        assert geo.page_bytes(spec) == spec.page_size_bytes
        assert geo.block_stride_alignment(spec) == spec.get_block_stride_alignment()
        shape = kvref.layout.compute_layer_kv_cache_shape_bytes(spec, blocks)
        assert geo.view_extents(spec, blocks) == shape
        try:
            expected: Any = kvref.layout.compute_layout_strides(spec, blocks, layers, layout)
        except ValueError:
            expected = "refused"
        try:
            got: Any = geo.layout_strides(spec, blocks, layers, layout)
        except geo.OracleError:
            got = "refused"
        assert got == expected
        config = PlanningConfig(max_model_len=4096)
        assert geo.max_memory_bytes(spec, config) == spec.max_memory_usage_bytes(config)


# -- planted bugs ---------------------------------------------------------------------------

_REAL_STRIDES = kvref.layout.compute_layout_strides

#: The planted stride bug: the copy reads the interleaved layouts as their compact cousins.
_MISREAD = {KVCacheLayout.LHBNC: KVCacheLayout.LBHNC, KVCacheLayout.BHLNC: KVCacheLayout.BLHNC}


def _buggy_strides(
    spec: KVCacheSpec, num_blocks: int, num_layers: int, layout: KVCacheLayout, *args: Any,
    **kwargs: Any,
) -> tuple[int, int, int, int, int]:  # fmt: skip
    misread = _MISREAD.get(layout, layout)
    return _REAL_STRIDES(spec, num_blocks, num_layers, misread, *args, **kwargs)


def _plant_strides(monkeypatch: pytest.MonkeyPatch) -> None:
    # kvref's placement and kernel views (allocation's geometry) imported the function by
    # name: patch every copy.
    for module in (kvref.layout, kvref.placement, kvref.kernel_blocks):
        monkeypatch.setattr(module, "compute_layout_strides", _buggy_strides)


def _heads_ignored(self: AttentionSpec) -> int:
    # The planted page bug: a copy of the head count that forgets num_head_slots.
    return self.num_kv_heads


def _plant_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AttentionSpec, "num_page_heads", property(_heads_ignored))


def _place(spec: KVCacheSpec, layout: KVCacheLayout, layers: int, blocks: int) -> KVCacheConfig:
    names = [f"l{i}" for i in range(layers)]
    groups = [KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec)]
    config = PlanningConfig(kv_cache_layout=layout)
    return ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(config, groups, blocks)


def _context(core: Callable[..., Any] | None = None) -> Context:
    guard = Guard(10)
    factory = make_factory(ReferenceKVCacheConfigBuilder, guard)
    return Context(factory=factory, guard=guard, core=core or plan_kv_cache)


def _failed(scenario: str, obs: Any) -> set[str]:
    return {
        i
        for i, inv in by_id().items()
        if scenario in inv.scenarios
        and (found := inv.check(obs))
        and not isinstance(found, Unjudged)
    }


def _placement_failures(specs: Mapping[str, KVCacheSpec], layout: KVCacheLayout) -> set[str]:
    config = PlanningConfig(kv_cache_layout=layout)
    return _failed("placement", observe_placement(_context(), config, specs, 4))


_INTERLEAVED = sorted(_MISREAD, key=lambda x: x.name)
_MEMORY_SAFETY = {"KV-PLACE-IN-BOUNDS", "KV-PLACE-NO-LAYER-OVERLAP", "KV-PLACE-NO-BLOCK-ALIAS"}


class TestPlantedStrideBug:
    """A copy of kvref's stride math that misreads LHBNC/BHLNC is caught by the kit."""

    @pytest.mark.parametrize("layout", _INTERLEAVED, ids=lambda x: x.name)
    def test_memory_checks_catch_it(
        self, layout: KVCacheLayout, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The reference's plan overlaps itself by the contract's strides, not by its own."""
        assert check_memory(_place(_two_head_page(), layout, 3, 4), layout).ok
        _plant_strides(monkeypatch)
        config = _place(_two_head_page(), layout, 3, 4)
        report = check_memory(config, layout)
        assert report.layer_overlaps or report.block_overlaps or report.out_of_bounds
        # The bug is self-consistent: judged by kvref's own (patched) strides, nothing overlaps.
        tensor = config.kv_cache_tensors[0]
        own = kvref.layout.compute_layout_strides(
            _two_head_page(), 4, 3, layout,
            fixed=(tensor.layer_stride, tensor.block_stride, None, None, None),
        )  # fmt: skip
        assert own[2] * 2 == own[1] or own[2] * 2 == own[0]  # heads stay inside one dense page

    @pytest.mark.parametrize("layout", _INTERLEAVED, ids=lambda x: x.name)
    def test_placement_invariants_catch_it(
        self, layout: KVCacheLayout, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The reference passes every placement invariant, then fails memory safety."""
        specs = {f"l{i}": _two_head_page() for i in range(3)}
        assert _placement_failures(specs, layout) == set()
        _plant_strides(monkeypatch)
        failed = _placement_failures(specs, layout)
        assert failed & _MEMORY_SAFETY

    def test_device_tags_catch_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """KV-DEV-TAGS writes through the contract's views, so the pages collide on the device."""
        layout = KVCacheLayout.LHBNC
        assert check_device_tags(_place(_two_head_page(), layout, 3, 4), "cpu", layout=layout).ok
        _plant_strides(monkeypatch)
        result = check_device_tags(_place(_two_head_page(), layout, 3, 4), "cpu", layout=layout)
        assert result.violations or not result.measured


def _slotted(block: int = 2) -> FullAttentionSpec:
    # Twice as many head slots as KV heads (as NVFP4 backends declare).
    return FullAttentionSpec(
        block_size=block, num_kv_heads=2, head_size=4, dtype=torch.float16, num_head_slots=4
    )


class TestPlantedPageBug:
    """A copy of the page formula that forgets num_head_slots is caught by the kit."""

    @pytest.mark.parametrize("layout", [KVCacheLayout.LBNHC, KVCacheLayout.BLHNC], ids=str)
    def test_memory_checks_catch_it(
        self, layout: KVCacheLayout, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Pages placed at half their size overlap their neighbours by the contract's page."""
        assert check_memory(_place(_slotted(), layout, 2, 4), layout).ok
        _plant_page(monkeypatch)
        spec = _slotted()
        assert spec.page_size_bytes == geo.page_bytes(spec) // 2  # the planted bug
        report = check_memory(_place(spec, layout, 2, 4), layout)
        assert not report.ok

    def test_placement_invariants_catch_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The unpatched reference passes every placement invariant; the patched one does not."""
        layout = KVCacheLayout.LBNHC
        assert _placement_failures({"a": _slotted(), "b": _slotted()}, layout) == set()
        _plant_page(monkeypatch)
        failed = _placement_failures({"a": _slotted(), "b": _slotted()}, layout)
        assert failed & _MEMORY_SAFETY


def _aligned() -> MLAAttentionSpec:
    # A compressed MLA page padded to 576-byte multiples: 37,440 B per 256-token block.  At
    # kernel blocks of gcd(128, 256) = 128 tokens the page is 19,008 B, which 37,440 is not
    # a multiple of, so the block stride must grow to 38,016.
    return compressed_mla(block_stride_alignment=MultipleOf(128))


class TestPlantedAlignmentBug:
    """A copy of the block-stride alignment that ignores MultipleOf is caught by the kit."""

    def test_alignment_invariant_catches_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Unaligned block strides fail KV-PLACE-ALIGNMENT once kvref forgets MultipleOf."""
        # MLA beside plain attention: one uniform-type group that keeps the MLA layer's own
        # spec (a merged MLA spec would drop its alignment).
        plain = FullAttentionSpec(block_size=256, num_kv_heads=1, head_size=64, dtype="bfloat16")
        specs = {"a": _aligned(), "b": plain}
        layout = KVCacheLayout.LBNHC
        assert geo.block_stride_alignment(_aligned()) == 19_008
        assert geo.aligned_page(_aligned()) == 38_016
        assert _placement_failures(specs, layout) == set()

        def no_multiple_of(self: KVCacheSpec) -> int:
            value = self.block_stride_alignment
            return value if isinstance(value, int) else 1

        monkeypatch.setattr(KVCacheSpec, "get_block_stride_alignment", no_multiple_of)
        monkeypatch.setattr(KVCacheSpec, "block_stride_alignment_bytes", property(no_multiple_of))
        assert "KV-PLACE-ALIGNMENT" in _placement_failures(specs, layout)


# -- admission -------------------------------------------------------------------------------

_FULL = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
_SWA = SlidingWindowSpec(
    block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=1024
)
_LAYERS = {f"l{i}": (_FULL if i % 3 == 0 else _SWA) for i in range(30)}
_CONFIG = PlanningConfig(max_model_len=32768)


def _own_page_need(
    config: PlanningConfig, groups: Sequence[KVCacheGroupSpec], pool_bytes_per_block: int
) -> int:
    """The planted admission bug: each group's blocks charged at its own page, not at bpb."""
    return sum(
        math.ceil(g.kv_cache_spec.max_memory_usage_bytes(config) / g.kv_cache_spec.page_size_bytes)
        * g.kv_cache_spec.page_size_bytes
        for g in groups
        if not g.host_resident
    )


class TestPlantedAdmissionBug:
    """A copy of kvref's need formula that undercharges blocks is caught by KV-CORE-ADMISSION."""

    def _memory(self) -> int:
        # Between what the buggy formula asks (plus the null block) and what a request needs.
        plan = plan_kv_cache(ReferenceKVCacheConfigBuilder, _CONFIG, [_LAYERS], [2**34])
        bpb = plan.configs[0].kv_cache_tensors[0].size // plan.num_blocks
        need = geo.request_need_bytes(_CONFIG, plan.global_groups, bpb)
        buggy = _own_page_need(_CONFIG, plan.global_groups, bpb)
        assert buggy + bpb < need
        return (buggy + need) // 2 + bpb

    def test_admission_catches_it(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The honest reference refuses the memory (typed error); the patched one plans anyway."""
        memory = self._memory()
        honest = observe_core(_context(), _CONFIG, [_LAYERS], [memory])
        assert honest.plan is None and _failed("core", honest) == set()
        monkeypatch.setattr(kvref.planning, "max_memory_usage_bytes_from_groups", _own_page_need)
        patched = observe_core(_context(), _CONFIG, [_LAYERS], [memory])
        assert patched.plan is not None
        assert _failed("core", patched) == {"KV-CORE-ADMISSION"}
