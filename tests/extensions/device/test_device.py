"""The device checks: each device invariant passes sound configs and catches its own fault.

Real allocations run on ``KVREF_TEST_DEVICE`` (default cpu); shape-only checks
also run on meta.  The memory counter, which cpu lacks, is exercised with fake
counters so that both its pass and fail paths run everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from _devcases import (
    SHAPE_DEVICES,
    TEST_DEVICE,
    full,
    host_config,
    interleaved,
    mamba_config,
    misaligned_strides,
    worked_example,
)

from conformance.check.worker import allocate_backings, drop_scratch
from conformance.extensions.device.checks import (
    DEVICE_CHECKS,
    KV_DEV_ALLOC,
    KV_DEV_HOST,
    KV_DEV_TAGS,
    KV_DEV_VIEWS,
    DeviceCheckResult,
    check_device,
    check_device_alloc,
    check_device_host,
    check_device_tags,
    check_device_views,
    checkable_num_blocks,
    default_cap,
    device_memory_counter,
    verify_tags,
)
from conformance.extensions.device.memory import ordered_copy
from kvref.allocation import allocate_kv_cache
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

_MiB = 1 << 20
REAL_DEVICE = pytest.mark.skipif(TEST_DEVICE == "meta", reason="needs a device with data")

SOUND = {
    "worked-LBNHC": lambda: worked_example(KVCacheLayout.LBNHC),
    "worked-BLHNC": lambda: worked_example(KVCacheLayout.BLHNC),
    "mamba": mamba_config,
    "LHBNC": lambda: interleaved(KVCacheLayout.LHBNC),
    "BHLNC": lambda: interleaved(KVCacheLayout.BHLNC),
    "host": host_config,
}


def fake_counter(*readings: int) -> Callable[[], int]:
    """A memory counter that returns ``readings`` in order, one per call."""
    values = iter(readings)
    return lambda: next(values)


def overlapping_layers() -> KVCacheConfig:
    """One group, two tensors: [A] at 0 and [B] at offset 64 (should be 128); page 32, N = 4.

    B's block b is A's block b + 2, so B's block 1 overwrites A's block 3.
    """
    return KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[
            KVCacheTensor(size=256, layers=["A"], layer_stride=128, block_stride=32),
            KVCacheTensor(size=256, layers=["B"], layer_stride=128, block_stride=32, offset=64),
        ],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=["A", "B"], kv_cache_spec=full())],
        kv_cache_layout=KVCacheLayout.LBNHC,
    )


def zero_block_stride() -> KVCacheConfig:
    """A hostile tensor whose blocks all sit on the same 32 bytes (block_stride 0), N = 4."""
    return KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[KVCacheTensor(size=64, layers=["Z"], layer_stride=32, block_stride=0)],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=["Z"], kv_cache_spec=full())],
        kv_cache_layout=KVCacheLayout.LBNHC,
    )


def overlapping_host_pool() -> KVCacheConfig:
    """A sound device group plus a host pool whose two host layers share every page."""
    config = host_config()
    groups = [
        config.kv_cache_groups[0],
        KVCacheGroupSpec(layer_names=["h0", "h1"], kv_cache_spec=full(), host_resident=True),
    ]
    host = KVCacheTensor(
        size=160, layers=["h0", "h1"], layer_stride=0, block_stride=32, host_resident=True
    )
    return KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[host, config.kv_cache_tensors[1]],
        kv_cache_groups=groups,
        kv_cache_layout=KVCacheLayout.LBNHC,
        host_num_blocks=5,
    )


def failing(results: tuple[DeviceCheckResult, ...]) -> set[str]:
    """Ids of the results with violations."""
    return {r.invariant for r in results if r.violations}


class TestCheckableNumBlocks:
    def test_fits_all(self) -> None:
        """A config under the cap keeps its block count."""
        assert checkable_num_blocks(1024, 100, 1 << 30) == 100

    def test_shrinks_linearly(self) -> None:
        """Over the cap, the count is the most whole blocks the cap holds."""
        assert checkable_num_blocks(1000, 100, 25_500) == 25

    def test_not_even_one_block(self) -> None:
        """A block larger than the cap gives 0: check on meta only."""
        assert checkable_num_blocks(2**60, 10, 1 << 30) == 0

    def test_empty_blocks(self) -> None:
        """Zero bytes per block always fits."""
        assert checkable_num_blocks(0, 7, 0) == 7


class TestDeviceFacts:
    def test_cpu_cap_at_most_one_gib(self) -> None:
        """The default cpu cap is positive and never above 1 GiB."""
        assert 0 < default_cap("cpu") <= 1 << 30

    def test_meta_cap_unbounded(self) -> None:
        """meta allocates nothing, so its cap is no limit."""
        assert default_cap("meta") >= 2**62

    @pytest.mark.parametrize("device", ["cpu", "meta"])
    def test_no_counter_without_allocator(self, device: str) -> None:
        """cpu and meta have no device memory counter."""
        assert device_memory_counter(device) is None

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_counter_tracks_allocations(self) -> None:
        """The CUDA counter grows by at least the bytes of a new tensor."""
        counter = device_memory_counter("cuda")
        assert counter is not None
        before = counter()
        block = torch.empty(4 * _MiB, dtype=torch.uint8, device="cuda")
        assert counter() - before >= 4 * _MiB
        del block

    def test_catalog_lists_four_checks(self) -> None:
        """The device row of the catalog has the four stable ids."""
        assert list(DEVICE_CHECKS) == [KV_DEV_ALLOC, KV_DEV_VIEWS, KV_DEV_TAGS, KV_DEV_HOST]


class TestDevAlloc:
    def test_counter_grows_by_planned_bytes(self) -> None:
        """Growth of exactly the planned bytes passes and is measured."""
        result = check_device_alloc(
            worked_example(KVCacheLayout.LBNHC), TEST_DEVICE, counter=fake_counter(1000, 1256)
        )
        assert result.ok and result.measured

    def test_counter_within_rounding(self) -> None:
        """Growth rounded up by the allocator, within the tolerance, passes."""
        result = check_device_alloc(
            worked_example(KVCacheLayout.LBNHC), TEST_DEVICE, counter=fake_counter(0, 512)
        )
        assert result.ok

    def test_counter_does_not_grow(self) -> None:
        """A backing the counter never sees (a lazy or fake allocation) is a violation."""
        result = check_device_alloc(
            worked_example(KVCacheLayout.LBNHC), TEST_DEVICE, counter=fake_counter(0, 0)
        )
        (violation,) = result.violations
        assert violation.invariant == KV_DEV_ALLOC
        assert "grew by 0 B" in violation.message

    def test_counter_grows_too_much(self) -> None:
        """Growth far beyond the planned bytes is a violation."""
        result = check_device_alloc(
            worked_example(KVCacheLayout.LBNHC), TEST_DEVICE, counter=fake_counter(0, 8 * _MiB)
        )
        assert [v.invariant for v in result.violations] == [KV_DEV_ALLOC]

    def test_cpu_not_measured(self) -> None:
        """Without a counter the growth is reported as not measured, not as a pass."""
        result = check_device_alloc(worked_example(KVCacheLayout.LBNHC), "cpu")
        assert result.ok
        assert not result.measured
        assert "no memory counter" in result.notes[0]

    def test_over_cap_not_allocated(self) -> None:
        """A backing above the cap is not allocated; the note says how many blocks fit."""
        result = check_device_alloc(worked_example(KVCacheLayout.LBNHC), "cpu", cap=200)
        assert not result.measured
        assert "num_blocks=3" in result.notes[0]

    def test_hostile_size_not_allocated(self) -> None:
        """A 2**60-byte backing is never attempted under the default cap."""
        config = KVCacheConfig(
            num_blocks=2**55,
            kv_cache_tensors=[
                KVCacheTensor(size=2**60, layers=["x"], layer_stride=2**60, block_stride=32)
            ],
            kv_cache_groups=[KVCacheGroupSpec(layer_names=["x"], kv_cache_spec=full())],
        )
        result = check_device_alloc(config, "cpu")
        assert not result.measured
        assert "exceeds the cap" in result.notes[0]

    def test_mismatched_sizes(self) -> None:
        """Device tensors of two sizes cannot make one backing."""
        config = worked_example(KVCacheLayout.LBNHC)
        tensors = [
            *config.kv_cache_tensors[:2],
            KVCacheTensor(size=512, layers=["L2", "L5"], layer_stride=128, block_stride=32),
        ]
        broken = KVCacheConfig(
            num_blocks=4, kv_cache_tensors=tensors, kv_cache_groups=config.kv_cache_groups
        )
        result = check_device_alloc(broken, "meta")
        (violation,) = result.violations
        assert "[256, 512]" in violation.message

    @pytest.mark.skipif(device_memory_counter(TEST_DEVICE) is None, reason="no memory counter")
    def test_real_counter(self) -> None:
        """On a device with a counter, a sound 64 MiB backing is measured and passes."""
        config = KVCacheConfig(
            num_blocks=2048,
            kv_cache_tensors=[
                KVCacheTensor(
                    size=64 * _MiB, layers=["x"], layer_stride=64 * _MiB, block_stride=32 * 1024
                )
            ],
            kv_cache_groups=[
                KVCacheGroupSpec(layer_names=["x"], kv_cache_spec=full(heads=32, head_size=128))
            ],
        )
        result = check_device_alloc(config, TEST_DEVICE)
        assert result.measured, result.notes
        assert result.ok, result.violations


class TestDevViews:
    @pytest.mark.parametrize("device", SHAPE_DEVICES)
    @pytest.mark.parametrize("name", list(SOUND))
    def test_sound_configs_pass(self, name: str, device: str) -> None:
        """Every layer view of a sound config is built and fits its storage."""
        result = check_device_views(SOUND[name](), device)
        assert result.ok, result.violations
        assert result.measured

    def test_out_of_bounds_layer(self) -> None:
        """A backing too small for L3 is reported with L3's byte range."""
        result = check_device_views(worked_example(KVCacheLayout.LBNHC, size=240), TEST_DEVICE)
        first = result.violations[0]
        assert first.invariant == KV_DEV_VIEWS
        assert first.layer == "L3"
        assert first.byte_range == (128, 256)

    def test_misaligned_dtype_view(self) -> None:
        """A float16 layer at an odd offset cannot be viewed as float16."""
        tensor = KVCacheTensor(size=160, layers=["x"], layer_stride=128, block_stride=32, offset=1)
        config = KVCacheConfig(
            num_blocks=4,
            kv_cache_tensors=[tensor],
            kv_cache_groups=[KVCacheGroupSpec(layer_names=["x"], kv_cache_spec=full())],
        )
        (violation,) = check_device_views(config, TEST_DEVICE).violations
        assert violation.layer == "x"
        assert "offset=1" in violation.message

    def test_over_cap_checked_on_meta(self) -> None:
        """Above the cap the views are built on meta and the result says so."""
        result = check_device_views(worked_example(KVCacheLayout.LBNHC), "cpu", cap=100)
        assert result.ok
        assert not result.measured
        assert any("meta" in note for note in result.notes)


@REAL_DEVICE
class TestDevTags:
    @pytest.mark.parametrize("name", list(SOUND))
    def test_sound_configs_pass(self, name: str) -> None:
        """Every page of a sound config reads back its own tag."""
        result = check_device_tags(SOUND[name](), TEST_DEVICE)
        assert result.ok, result.violations
        assert result.measured

    def test_cross_group_overlap(self) -> None:
        """Misaligned strides: L1 block 2 overwrites L0 block 3, and the report says so.

        See contract.md#memory-safety.
        """
        result = check_device_tags(misaligned_strides(), TEST_DEVICE)
        (violation,) = result.violations
        assert violation.invariant == KV_DEV_TAGS
        assert (violation.layer, violation.block) == ("L0", 3)
        assert "the tag of layer 'L1' block 2" in violation.message
        assert violation.byte_range is not None
        assert 288 <= violation.byte_range[0] < 352

    def test_overlap_within_a_group(self) -> None:
        """B's block 1 sits on A's block 3: A block 3 is reported, written by B block 1."""
        (violation,) = check_device_tags(overlapping_layers(), TEST_DEVICE).violations
        assert (violation.layer, violation.block) == ("A", 3)
        assert "layer 'B' block 1" in violation.message

    def test_zero_block_stride(self) -> None:
        """All blocks on the same bytes: only the last block written keeps its tag."""
        violations = check_device_tags(zero_block_stride(), TEST_DEVICE).violations
        assert [(v.layer, v.block) for v in violations] == [("Z", 1), ("Z", 2)]
        assert all("layer 'Z' block 3" in v.message for v in violations)

    def test_host_pool_overlap(self) -> None:
        """Host layers sharing pages are caught in the host pool too."""
        violations = check_device_tags(overlapping_host_pool(), TEST_DEVICE).violations
        assert violations
        assert {v.layer for v in violations} == {"h0"}
        assert all("host pool" in v.message for v in violations)

    def test_report_is_bounded(self) -> None:
        """At most max_report pages are described, plus one line counting them all."""
        violations = check_device_tags(zero_block_stride(), TEST_DEVICE, max_report=1).violations
        assert len(violations) == 2
        assert "2 (layer, block) pages" in violations[1].message

    def test_null_block_untouched(self) -> None:
        """Block 0 is the null block: no tag is written to it."""
        config = worked_example(KVCacheLayout.BLHNC)
        with allocate_kv_cache(config, TEST_DEVICE) as allocation:
            readback = verify_tags(allocation, config)
            assert readback.pages == 2 * 3
            assert readback.bytes_written == readback.bytes_read == 6 * 32
            assert allocation.device_buffer is not None
            assert int(allocation.device_buffer[:64].count_nonzero()) == 0

    def test_each_page_gets_a_distinct_tag(self) -> None:
        """Two runs with different seeds write different bytes; each run's pages differ."""
        config = interleaved(KVCacheLayout.LHBNC)
        with allocate_kv_cache(config, TEST_DEVICE) as allocation:
            verify_tags(allocation, config, seed=1)
            a = allocation.views["a"].view(torch.int16)[1:].cpu().clone()
            b = allocation.views["b"].view(torch.int16)[1:].cpu().clone()
            verify_tags(allocation, config, seed=2)
            assert not torch.equal(a, allocation.views["a"].view(torch.int16)[1:].cpu())
        assert not torch.equal(a, b)
        assert not torch.equal(a[0], a[1])

    def test_reused_backing_changes_no_verdict(self) -> None:
        """On the CPU the tag check reuses one unzeroed backing: earlier tags never leak.

        Broken and sound configs alternate over the same buffer; each keeps its
        own verdict, with the same pages named every time.
        """
        if torch.device(TEST_DEVICE).type != "cpu":
            pytest.skip("the reused backing is the CPU's")
        try:
            first = check_device_tags(overlapping_layers(), TEST_DEVICE).violations
            for sound in SOUND.values():
                assert check_device_tags(sound(), TEST_DEVICE).ok
                again = check_device_tags(overlapping_layers(), TEST_DEVICE).violations
                assert [(v.layer, v.block) for v in again] == [(v.layer, v.block) for v in first]
            zero = check_device_tags(zero_block_stride(), TEST_DEVICE).violations
            assert [(v.layer, v.block) for v in zero] == [("Z", 1), ("Z", 2)]
        finally:
            drop_scratch()

    def test_scratch_backing_is_reused_and_dropped(self) -> None:
        """``scratch=True`` hands out one CPU buffer until it is dropped; never when zeroing."""
        config = worked_example(KVCacheLayout.LBNHC)
        try:
            a, _, _ = allocate_backings(config, "cpu", zeroed=False, scratch=True)
            b, _, _ = allocate_backings(config, "cpu", zeroed=False, scratch=True)
            assert a is not None and b is not None
            assert a.data_ptr() == b.data_ptr() and b.numel() == config.kv_cache_tensors[0].size
            zeroed, _, _ = allocate_backings(config, "cpu", scratch=True)
            assert zeroed is not None and zeroed.data_ptr() != a.data_ptr()
            assert int(zeroed.count_nonzero()) == 0
            drop_scratch()
            # ``a`` still holds the dropped buffer, so a new one cannot sit at its address.
            c, _, _ = allocate_backings(config, "cpu", zeroed=False, scratch=True)
            assert c is not None and c.data_ptr() != a.data_ptr()
        finally:
            drop_scratch()

    def test_self_overlapping_writes_leave_the_same_bytes(self) -> None:
        """Pages that share bytes keep what the later page wrote, whatever torch's threads.

        A split copy made "later" a race between threads: the value read
        back, and so the message of a violation, differed between a run and
        its shards.
        """
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            # 390 pages of 1000 elements, 900 apart: each overlaps the next by 100.
            buffer = torch.zeros(400_000, dtype=torch.int64)
            pages = buffer.as_strided((390, 1000), (900, 1))
            tags = torch.arange(390, dtype=torch.int64).view(390, 1).expand(390, 1000)
            expected = torch.zeros_like(buffer)
            for page in range(390):
                expected[page * 900 : page * 900 + 1000] = page
            for _ in range(20):
                buffer.zero_()
                ordered_copy(pages, tags)
                assert torch.equal(buffer, expected)
            assert torch.get_num_threads() == 2
        finally:
            torch.set_num_threads(threads)

    def test_meta_not_measured(self) -> None:
        """meta has no data to read back: not measured, no verdict."""
        result = check_device_tags(worked_example(KVCacheLayout.LBNHC), "meta")
        assert result.ok and not result.measured

    def test_over_cap_not_measured(self) -> None:
        """A config over the cap is not allocated."""
        result = check_device_tags(worked_example(KVCacheLayout.LBNHC), TEST_DEVICE, cap=100)
        assert not result.measured
        assert "re-plan at num_blocks=1" in result.notes[0]


class TestDevHost:
    def test_host_config_passes(self) -> None:
        """A host pool on the CPU with a device group on the device holds the invariant."""
        result = check_device_host(host_config(), TEST_DEVICE)
        assert result.ok, result.violations

    def test_host_layer_in_device_tensor(self) -> None:
        """A host-resident group's layer placed in a device tensor is named."""
        (violation,) = check_device_host(host_config(host_on_device=True), TEST_DEVICE).violations
        assert violation.invariant == KV_DEV_HOST
        assert violation.layer == "h0"
        assert "counted on the device" in violation.message

    def test_device_layer_in_host_tensor(self) -> None:
        """A device group's layer placed in a host tensor is named."""
        config = host_config()
        moved = KVCacheTensor(
            size=160, layers=["a1"], layer_stride=160, block_stride=32, host_resident=True
        )
        tensors = [*config.kv_cache_tensors, moved]
        broken = KVCacheConfig(
            num_blocks=4,
            kv_cache_tensors=tensors,
            kv_cache_groups=config.kv_cache_groups,
            host_num_blocks=5,
        )
        (violation,) = check_device_host(broken, TEST_DEVICE).violations
        assert violation.layer == "a1"

    def test_counter_excludes_host_pool(self) -> None:
        """Growth of only the device backing passes and is measured."""
        result = check_device_host(host_config(), "cpu", counter=fake_counter(0, 256), tolerance=0)
        assert result.ok and result.measured

    def test_counter_includes_host_pool(self) -> None:
        """Growth by the device backing plus the host pool is caught."""
        result = check_device_host(
            host_config(), "cpu", counter=fake_counter(0, 256 + 160), tolerance=0
        )
        (violation,) = result.violations
        assert "host pool (160 B) is counted on the device" in violation.message

    def test_cpu_counter_not_measured(self) -> None:
        """On cpu the counter part is not measured."""
        result = check_device_host(host_config(), "cpu")
        assert not result.measured

    @pytest.mark.skipif(TEST_DEVICE.split(":")[0] != "cuda", reason="needs CUDA")
    def test_pinned_next_to_cuda(self) -> None:
        """Next to a CUDA device the host pool is pinned."""
        with allocate_kv_cache(host_config(), TEST_DEVICE) as allocation:
            assert allocation.host_pinned
            assert allocation.host_buffers[0].is_pinned()


class TestCheckDevice:
    @pytest.mark.parametrize("name", list(SOUND))
    def test_sound_configs_pass_everything(self, name: str) -> None:
        """A sound config breaks no device invariant."""
        results = check_device(SOUND[name](), TEST_DEVICE)
        assert [r.invariant for r in results] == list(DEVICE_CHECKS)
        assert failing(results) == set()

    @pytest.mark.parametrize(
        ("make", "invariant"),
        [
            (misaligned_strides, KV_DEV_TAGS),
            (overlapping_layers, KV_DEV_TAGS),
            (lambda: worked_example(KVCacheLayout.LBNHC, size=240), KV_DEV_VIEWS),
            (lambda: host_config(host_on_device=True), KV_DEV_HOST),
        ],
        ids=["cross-group-overlap", "layer-overlap", "out-of-bounds", "host-on-device"],
    )
    @REAL_DEVICE
    def test_each_fault_caught_by_its_invariant_alone(
        self, make: Callable[[], KVCacheConfig], invariant: str
    ) -> None:
        """Each broken config fails exactly the invariant meant to catch it."""
        assert failing(check_device(make(), TEST_DEVICE)) == {invariant}

    def test_alloc_fault_caught_alone(self) -> None:
        """A lazy allocator (counter never grows) fails KV-DEV-ALLOC alone."""
        config = worked_example(KVCacheLayout.LBNHC)
        results = check_device(config, "cpu", counter=fake_counter(0, 0, 0, 0))
        assert failing(results) == {KV_DEV_ALLOC}

    def test_select(self) -> None:
        """select runs only the named checks."""
        results = check_device(mamba_config(), "meta", select=(KV_DEV_VIEWS,))
        assert [r.invariant for r in results] == [KV_DEV_VIEWS]

    def test_worker_is_recorded(self) -> None:
        """Violations carry the worker index they were checked for."""
        results = check_device(host_config(host_on_device=True), "meta", worker=3)
        assert [v.worker for r in results for v in r.violations] == [3]
