"""Tests of conformance.check.memory: footprint checks P2, P3 and P4 (contract.md#memory-safety)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.check.geometry import OracleError, layout_strides, view_extents
from conformance.check.memory import (
    PERIODIC_FROM,
    OutOfBounds,
    Overlap,
    PageRef,
    check_memory,
    find_block_overlaps,
    find_host_block_overlaps,
    find_host_layer_overlaps,
    find_host_out_of_bounds,
    find_layer_overlaps,
    find_out_of_bounds,
    find_unusable_tensors,
    host_tensor_end,
    page_runs,
    tensor_footprints,
)
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

LAYOUTS = list(KVCacheLayout)


_Spec = TypeVar("_Spec", bound=KVCacheSpec)


def _int8(kind: type[_Spec], heads: int, content: int, block: int, **kw: Any) -> _Spec:
    """A ``kind`` spec of one-byte heads, ``content`` bytes of state a token."""
    return kind(
        block_size=block,
        num_kv_heads=heads,
        head_size=1,
        dtype="int8",
        state_content_bytes=content,
        **kw,
    )


def full(heads: int = 1, content: int = 16, block: int = 2, **kw: Any) -> FullAttentionSpec:
    return _int8(FullAttentionSpec, heads, content, block, **kw)


def sliding(heads: int = 1, content: int = 16, block: int = 2, **kw: Any) -> SlidingWindowSpec:
    return _int8(SlidingWindowSpec, heads, content, block, sliding_window=8, **kw)


def group(names: Sequence[str], spec: KVCacheSpec, **kw: bool) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(layer_names=list(names), kv_cache_spec=spec, **kw)


def tensor(
    size: int, layers: Sequence[str], ls: int, bs: int, offset: int = 0, host: bool = False
) -> KVCacheTensor:
    return KVCacheTensor(
        size=size,
        layers=list(layers),
        layer_stride=ls,
        block_stride=bs,
        offset=offset,
        host_resident=host,
    )


def spec_45_config(layout: str) -> KVCacheConfig:
    """contract.md#default-placement: L0 F, L1 S, ... in three groups, page 32, N = 4, size 256."""
    groups = [
        group(["L0", "L3"], full()),
        group(["L1", "L4"], sliding()),
        group(["L2", "L5"], sliding()),
    ]
    ls, bs = (128, 32) if layout == "LBNHC" else (32, 64)
    tensors = [tensor(256, g.layer_names, ls, bs) for g in groups]
    return KVCacheConfig(num_blocks=4, kv_cache_tensors=tensors, kv_cache_groups=groups)


def spec_6_config() -> KVCacheConfig:
    """The contract's real P3 example: LBNHC, N = 2, pages 96 B, alignments 24 and 64.

    See contract.md#memory-safety.
    """
    f = full(content=96, block=1, block_stride_alignment=24)
    s = sliding(content=96, block=1, block_stride_alignment=64)
    groups = [group(["L0", "L3"], f), group(["L1", "L2"], s)]
    tensors = [tensor(512, ["L0", "L3"], 192, 96), tensor(512, ["L1", "L2"], 256, 128)]
    return KVCacheConfig(num_blocks=2, kv_cache_tensors=tensors, kv_cache_groups=groups)


def interleaved_config(layout: str, n: int = 3) -> KVCacheConfig:
    """contract.md#layouts's 2-head page (H=2, S=2, C=16) over two layers, in LHBNC or BHLNC."""
    spec = full(heads=2, content=16, block=2)
    # LHBNC: block stride S*C, head stride S*C*N, layer stride H*S*C*N.
    # BHLNC: layer stride S*C, head stride S*C*layers, block stride = bpb.
    ls, bs = (64 * n, 32) if layout == "LHBNC" else (32, 128)
    groups = [group(["a", "b"], spec)]
    return KVCacheConfig(
        num_blocks=n, kv_cache_tensors=[tensor(128 * n, ["a", "b"], ls, bs)], kv_cache_groups=groups
    )


class TestPageRuns:
    """page_runs folds dense axes analytically."""

    def test_dense_page_is_one_run(self) -> None:
        """An LBHNC page (Ss = C, Hs = S*C) is one run of H*S*C bytes."""
        assert page_runs(32, 2, 16, 2, 16).starts == (0,)
        assert page_runs(32, 2, 16, 2, 16).lengths == (64,)

    def test_split_heads_are_runs(self) -> None:
        """An LHBNC page with head stride 96 is two runs of S*C bytes."""
        runs = page_runs(96, 2, 16, 2, 16)
        assert (runs.starts, runs.lengths, runs.self_overlap) == ((0, 96), (32, 32), None)

    def test_self_overlap_is_reported(self) -> None:
        """Heads closer than their run length overlap each other."""
        runs = page_runs(8, 3, 16, 1, 16)
        assert runs.self_overlap == (8, 16)
        assert (runs.starts, runs.lengths) == ((0,), (32,))

    def test_empty_content_has_no_runs(self) -> None:
        """A page with no content bytes has no footprint."""
        assert page_runs(0, 1, 0, 1, 0).starts == ()


class TestWorkedExamples:
    """The contract's worked placements have no violation."""

    def test_spec_45_lbnhc(self) -> None:
        """contract.md#default-placement in LBNHC is clean although groups alias the same bytes."""
        report = check_memory(spec_45_config("LBNHC"), "LBNHC")
        assert report.ok and report.exhaustive and report.runs == 24

    def test_spec_45_blhnc(self) -> None:
        """contract.md#default-placement in BLHNC is clean."""
        report = check_memory(spec_45_config("BLHNC"), "BLHNC")
        assert report.ok and report.exhaustive

    def test_spec_45_large_path(self) -> None:
        """The closed-form large-config path also finds the contract clean, exhaustively.

        See contract.md#default-placement.
        """
        for layout in ("LBNHC", "BLHNC"):
            report = check_memory(spec_45_config(layout), layout, budget=20)
            assert report.ok and report.exhaustive

    def test_interleaved_layouts(self) -> None:
        """LHBNC (block stride < page) and BHLNC (layer stride < page) interleave legitimately."""
        for layout in ("LHBNC", "BHLNC"):
            config = interleaved_config(layout)
            assert check_memory(config, layout).ok
            assert check_memory(config, layout, budget=4).ok


class TestBlockOverlaps:
    """find_block_overlaps reports P3 violations with exact bytes."""

    def test_spec_6_example(self) -> None:
        """Block 0 of L3 [192,288) overlaps block 1 of L1 [128,224) in bytes [192,224)."""
        found = find_block_overlaps(spec_6_config(), "LBNHC")
        assert found[0] == Overlap(PageRef(0, "L3", 0), PageRef(1, "L1", 1), (192, 224))
        assert found[1] == Overlap(PageRef(1, "L2", 0), PageRef(0, "L3", 1), (288, 352))
        assert len(found) == 2

    def test_spec_6_example_large_path(self) -> None:
        """The large-config path finds the same first violation."""
        found = find_block_overlaps(spec_6_config(), "LBNHC", budget=3)
        assert Overlap(PageRef(0, "L3", 0), PageRef(1, "L1", 1), (192, 224)) in found

    def test_block_stride_below_page(self) -> None:
        """LBNHC with block stride 24 < page 32 overlaps consecutive blocks."""
        groups = [group(["a"], full())]
        config = KVCacheConfig(
            num_blocks=3, kv_cache_tensors=[tensor(96, ["a"], 96, 24)], kv_cache_groups=groups
        )
        found = find_block_overlaps(config, "LBNHC")
        assert found[0] == Overlap(PageRef(0, "a", 0), PageRef(0, "a", 1), (24, 32))
        assert find_layer_overlaps(config, "LBNHC") == []

    def test_limit(self) -> None:
        """At most ``limit`` violations are listed."""
        groups = [group(["a"], full())]
        config = KVCacheConfig(
            num_blocks=50, kv_cache_tensors=[tensor(4096, ["a"], 0, 8)], kv_cache_groups=groups
        )
        assert len(find_block_overlaps(config, "LBNHC", limit=3)) == 3

    def test_huge_block_count_is_not_enumerated(self) -> None:
        """A billion blocks take the closed-form path and still find a mid-range overlap."""
        n = 10**9
        groups = [group(["a", "b"], full())]
        # Layer b starts half-way through layer a's blocks: block n/2 of a is block 0 of b.
        config = KVCacheConfig(
            num_blocks=n,
            kv_cache_tensors=[tensor(32 * n * 2, ["a", "b"], 32 * (n // 2), 32)],
            kv_cache_groups=groups,
        )
        report = check_memory(config, "LBNHC")
        assert report.exhaustive
        assert Overlap(PageRef(0, "b", 0), PageRef(0, "a", n // 2), (16 * n, 16 * n + 32)) in (
            report.block_overlaps
        )

    def test_huge_values_are_exact(self) -> None:
        """Offsets beyond int64 are handled exactly with Python ints."""
        groups = [group(["a"], full())]
        base = 2**70
        config = KVCacheConfig(
            num_blocks=3,
            kv_cache_tensors=[tensor(2**71, ["a"], 0, 24, base)],
            kv_cache_groups=groups,
        )
        found = find_block_overlaps(config, "LBNHC")
        assert found[0].byte_range == (base + 24, base + 32)


class TestLayerOverlaps:
    """find_layer_overlaps reports P4 violations."""

    def test_layer_stride_too_small(self) -> None:
        """Two layers 16 bytes apart with 32-byte pages share 16 bytes in every block."""
        groups = [group(["a", "b"], full())]
        config = KVCacheConfig(
            num_blocks=4,
            kv_cache_tensors=[tensor(1024, ["a", "b"], 16, 64)],
            kv_cache_groups=groups,
        )
        found = find_layer_overlaps(config, "BLHNC")
        assert found[0] == Overlap(PageRef(0, "a", 0), PageRef(0, "b", 0), (16, 32))
        assert len(found) == 4
        assert find_block_overlaps(config, "BLHNC") == []

    def test_cross_group_aliasing_is_allowed(self) -> None:
        """Different groups sharing one block's bytes is P5, not P4."""
        config = spec_45_config("LBNHC")
        assert find_layer_overlaps(config, "LBNHC") == []

    def test_self_overlapping_page(self) -> None:
        """An LHBNC page whose heads are closer than S*C bytes overlaps itself."""
        groups = [group(["a"], full(heads=2, content=16, block=2))]
        # N = 1: head stride = Bs * N = 8 < C = 16: head 1 state 0 overlaps head 0 state 0.
        config = KVCacheConfig(
            num_blocks=1, kv_cache_tensors=[tensor(1024, ["a"], 512, 8)], kv_cache_groups=groups
        )
        found = find_layer_overlaps(config, "LHBNC")
        assert found == [Overlap(PageRef(0, "a", 0), PageRef(0, "a", 0), (8, 16))]


class TestOutOfBounds:
    """find_out_of_bounds reports P2 violations."""

    def test_offset_past_end(self) -> None:
        """A tensor whose last page ends past the backing is reported with that page."""
        groups = [group(["a", "b"], full())]
        config = KVCacheConfig(
            num_blocks=2,
            kv_cache_tensors=[tensor(128, ["a", "b"], 64, 32, offset=8)],
            kv_cache_groups=groups,
        )
        assert find_out_of_bounds(config, "LBNHC") == [
            OutOfBounds(PageRef(0, "b", 1), (104, 136), 128)
        ]

    def test_exact_fit(self) -> None:
        """A footprint ending exactly at ``size`` is in bounds."""
        assert find_out_of_bounds(spec_45_config("LBNHC"), "LBNHC") == []


class TestHostTensors:
    """Host tensors form their own address space."""

    def config(self) -> KVCacheConfig:
        groups = [group(["d"], full()), group(["h"], full(), host_resident=True)]
        tensors = [tensor(64, ["d"], 64, 32), tensor(48, ["h"], 96, 16, host=True)]
        return KVCacheConfig(
            num_blocks=2, kv_cache_tensors=tensors, kv_cache_groups=groups, host_num_blocks=3
        )

    def test_device_checks_ignore_host(self) -> None:
        """The device checks do not see the broken host tensor, nor compare it with device bytes."""
        config = self.config()
        assert check_memory(config, "LBNHC").ok

    def test_host_checks(self) -> None:
        """Host checks use host_num_blocks and find the host tensor's overlaps and overflow."""
        config = self.config()
        assert find_host_block_overlaps(config)[0] == Overlap(
            PageRef(1, "h", 0), PageRef(1, "h", 1), (16, 32)
        )
        assert find_host_out_of_bounds(config) == [OutOfBounds(PageRef(1, "h", 2), (32, 64), 48)]
        assert find_host_layer_overlaps(config) == []

    def test_host_tensor_end(self) -> None:
        """host_tensor_end is the closed-form end of the farthest host page, None if undefined."""
        config = self.config()
        assert host_tensor_end(config, config.kv_cache_tensors[1]) == 64
        assert host_tensor_end(config, tensor(8, ["ghost"], 0, 0, host=True)) is None


class TestUnusableTensors:
    """Tensors whose footprint is undefined are skipped and reported, never crash."""

    def test_unknown_layer(self) -> None:
        """A tensor whose first layer is in no group is a Problem, not a KeyError."""
        groups = [group(["a"], full())]
        tensors = [tensor(64, ["ghost"], 0, 0), tensor(64, ["a"], 64, 32)]
        config = KVCacheConfig(num_blocks=2, kv_cache_tensors=tensors, kv_cache_groups=groups)
        problems = find_unusable_tensors(config, "LBNHC")
        assert [p.tensor_index for p in problems] == [0]
        report = check_memory(config, "LBNHC")
        assert report.ok and len(report.problems) == 1

    def test_layout_cannot_pad(self) -> None:
        """A padded page in LHBNC (H > 1) is a Problem from the LayoutError."""
        groups = [group(["a"], full(heads=2, page_size_padded=128))]
        config = KVCacheConfig(
            num_blocks=2, kv_cache_tensors=[tensor(512, ["a"], 256, 32)], kv_cache_groups=groups
        )
        problems = find_unusable_tensors(config, "LHBNC")
        assert len(problems) == 1 and "undefined" in problems[0].reason
        assert find_block_overlaps(config, "LHBNC") == []


# -- property test against a brute-force byte-set oracle ------------------------------


Pair = tuple[PageRef, PageRef]


def oracle(
    config: KVCacheConfig, layout: KVCacheLayout, host: bool
) -> tuple[set[int], set[Pair], set[Pair], dict[PageRef, set[int]]]:
    """Enumerate every byte of every page: P2 tensors, P3 pairs, P4 pairs (incl. self)."""
    group_of: dict[str, int] = {}
    for gi, g in enumerate(config.kv_cache_groups):
        for name in g.layer_names:
            group_of.setdefault(name, gi)
    pages: dict[PageRef, set[int]] = {}
    owner: dict[PageRef, tuple[int, int]] = {}
    oob: set[int] = set()
    p4: set[Pair] = set()
    for ti, t in enumerate(config.kv_cache_tensors):
        if t.host_resident != host or not t.layers or t.layers[0] not in group_of:
            continue
        gi = group_of[t.layers[0]]
        spec = config.kv_cache_groups[gi].layer_spec(t.layers[0])
        n = config.num_blocks_of(t)
        try:
            # The kit's geometry (tests/kit/check/test_oracle.py checks it against the contract's
            # numbers); this oracle checks the sweeps, not the strides.
            ls, bs, hs, ss, _ = layout_strides(
                spec,
                n,
                len(t.layers),
                layout,
                pinned=(t.layer_stride, t.block_stride, None, None, None),
            )
        except OracleError:
            continue
        _, heads, states, content = view_extents(spec, 1)
        for li, name in enumerate(t.layers):
            for b in range(n):
                base = t.offset + li * ls + b * bs
                cells = [base + h * hs + s * ss for h in range(heads) for s in range(states)]
                ref = PageRef(ti, name, b)
                footprint: set[int] = set()
                for c in cells:
                    cell = set(range(c, c + content))
                    if footprint & cell:
                        p4.add((ref, ref))
                    footprint |= cell
                if footprint and max(footprint) >= t.size:
                    oob.add(ti)
                pages[ref] = footprint
                owner[ref] = (gi, li)
    p3: set[Pair] = set()
    refs = list(pages)
    for i, a in enumerate(refs):
        for b in refs[i + 1 :]:
            if not (pages[a] & pages[b]):
                continue
            if a.block != b.block:
                p3.add((a, b))
            elif owner[a][0] == owner[b][0] and (a.tensor_index, owner[a][1]) != (
                b.tensor_index,
                owner[b][1],
            ):
                p4.add((a, b))
    return oob, p3, p4, pages


@st.composite
def configs(draw: st.DrawFn) -> KVCacheConfig:
    """Small random configs: random specs, groups, strides, offsets and sizes."""
    names = [f"l{i}" for i in range(draw(st.integers(1, 5)))]
    ngroups = draw(st.integers(1, min(3, len(names))))
    groups = []
    for gi in range(ngroups):
        members = names[gi::ngroups]
        specs = {
            m: full(
                heads=draw(st.integers(1, 3)),
                content=draw(st.integers(1, 6)),
                block=draw(st.integers(1, 3)),
                page_size_padded=draw(st.sampled_from([None, 64])),
            )
            for m in members
        }
        if draw(st.booleans()):
            spec = next(iter(specs.values()))
            specs = dict.fromkeys(members, spec)
            groups.append(group(members, spec, host_resident=draw(st.booleans())))
        else:
            blocks = {s.block_size for s in specs.values()}
            if len(blocks) > 1:
                specs = {
                    m: full(heads=s.num_kv_heads, content=s.state_content_size_bytes)
                    for m, s in specs.items()
                }
            groups.append(
                group(
                    members,
                    UniformTypeKVCacheSpecs(kv_cache_specs=specs),
                    host_resident=draw(st.booleans()),
                )
            )
    shift = draw(st.sampled_from([0, 0, 2**63 - 10**4]))
    tensors = []
    for _ in range(draw(st.integers(1, 4))):
        layers = draw(
            st.lists(st.sampled_from([*names, "ghost"]), min_size=1, max_size=3, unique=True)
        )
        tensors.append(
            tensor(
                draw(st.integers(0, 600)) + shift,
                layers,
                draw(st.integers(0, 80)),
                draw(st.integers(0, 80)),
                draw(st.integers(0, 40)) + shift,
                host=draw(st.booleans()),
            )
        )
    return KVCacheConfig(
        num_blocks=draw(st.integers(0, 5)),
        kv_cache_tensors=tensors,
        kv_cache_groups=groups,
        host_num_blocks=draw(st.integers(0, 4)),
    )


class TestAgainstOracle:
    """The vectorised checks agree with a brute-force byte-set oracle."""

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        configs(),
        st.sampled_from(LAYOUTS),
        st.booleans(),
        st.sampled_from([10**6, 4, 1]),
        st.sampled_from([0, PERIODIC_FROM]),
    )
    def test_matches_oracle(
        self,
        config: KVCacheConfig,
        layout: KVCacheLayout,
        host: bool,
        budget: int,
        periodic_from: int,
    ) -> None:
        """Exact path: same verdicts; any path: every reported overlap is real, with real bytes.

        ``periodic_from=0`` sends every config through the closed-form proof of
        absence first, so a clean answer there must be the oracle's too.
        """
        oob, p3, p4, pages = oracle(config, layout, host)
        report = check_memory(
            config, layout, host=host, limit=10**6, budget=budget, periodic_from=periodic_from
        )
        assert {o.page.tensor_index for o in report.out_of_bounds} == oob
        for o in report.block_overlaps:
            assert o.a.block != o.b.block
            assert (o.a, o.b) in p3 or (o.b, o.a) in p3
            lo, hi = o.byte_range
            assert lo < hi and set(range(lo, hi)) <= pages[o.a] & pages[o.b]
        for o in report.layer_overlaps:
            assert o.a.block == o.b.block
            assert (o.a, o.b) in p4 or (o.b, o.a) in p4
            lo, hi = o.byte_range
            assert lo < hi and set(range(lo, hi)) <= pages[o.a] & pages[o.b]
        if report.exhaustive:
            assert bool(report.block_overlaps) == bool(p3)
            assert bool(report.layer_overlaps) == bool(p4)
        if budget == 10**6:
            assert report.exhaustive
            geoms, _ = tensor_footprints(config, layout, host=host)
            assert report.runs == sum(g.num_pages * len(g.runs.starts) for g in geoms)
