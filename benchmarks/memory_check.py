"""Time the P2+P3+P4 footprint checks of conformance.check.memory on ~1M-page configs.

Run: ``.venv/bin/python benchmarks/memory_check.py [--layers 100] [--blocks 10000]``

Configs are built by hand with kvref records (two groups aliasing from offset
0, like the default placement), so this does not depend on kvref.placement.
"""

from __future__ import annotations

import argparse
import time

from conformance.check.memory import DEFAULT_BUDGET, check_memory
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import FullAttentionSpec, SlidingWindowSpec


def build(layout: KVCacheLayout, layers: int, blocks: int) -> KVCacheConfig:
    """Two groups of ``layers / 2`` layers each, 8 heads x 16 tokens x 256 B (bf16, head 64)."""
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=64, dtype="bfloat16")
    swa = SlidingWindowSpec(
        block_size=16, num_kv_heads=8, head_size=64, dtype="bfloat16", sliding_window=128
    )
    half = layers // 2
    names = [[f"f{i}" for i in range(half)], [f"s{i}" for i in range(half)]]
    groups = [
        KVCacheGroupSpec(layer_names=names[0], kv_cache_spec=full),
        KVCacheGroupSpec(layer_names=names[1], kv_cache_spec=swa),
    ]
    page = full.page_size_bytes
    bpb = half * page
    size = bpb * blocks
    if layout is KVCacheLayout.LBNHC:
        ls, bs = page * blocks, page
    elif layout is KVCacheLayout.BLHNC:
        ls, bs = page, bpb
    else:  # LHBNC: block stride S*C, head stride S*C*N, layer stride a whole layer
        ls, bs = page * blocks, page // full.num_kv_heads
    tensors = [KVCacheTensor(size=size, layers=n, layer_stride=ls, block_stride=bs) for n in names]
    return KVCacheConfig(num_blocks=blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pages = args.layers * args.blocks
    print(f"{args.layers} layers x {args.blocks} blocks = {pages:,} pages")
    # LHBNC pages are 8 runs (one per head): 8M runs, enumerated only with a larger budget.
    cases = [
        (KVCacheLayout.LBNHC, args.blocks, DEFAULT_BUDGET, "enumerated"),
        (KVCacheLayout.BLHNC, args.blocks, DEFAULT_BUDGET, "enumerated"),
        (KVCacheLayout.LHBNC, args.blocks, 10**7, "enumerated"),
        (KVCacheLayout.LHBNC, args.blocks, DEFAULT_BUDGET, "closed form"),
        (KVCacheLayout.LBNHC, 10_000_000, DEFAULT_BUDGET, "closed form"),
        (KVCacheLayout.BLHNC, 10_000_000, DEFAULT_BUDGET, "closed form"),
    ]
    for layout, blocks, budget, how in cases:
        config = build(layout, args.layers, blocks)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            report = check_memory(config, layout, budget=budget)
            best = min(best, time.perf_counter() - t0)
        print(
            f"{layout.name} {args.layers} x {blocks:,} blocks ({how}): {best:.3f} s "
            f"(best of {args.repeat}), runs {report.runs:,}, ok={report.ok}, "
            f"exhaustive={report.exhaustive}"
        )


if __name__ == "__main__":
    main()
