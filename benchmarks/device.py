"""Bandwidth of the KV-DEV-TAGS readback against a plain ``fill_`` of the same bytes.

The tag check writes every footprint byte once and reads it back once, so its
bandwidth is ``(bytes written + bytes read) / time``.  The baseline is
``torch.empty(n, dtype=torch.uint8, device=d).fill_(1)`` of the same ``n`` bytes
written, measured in the same run.  The goal is a ratio of at least 0.5.

    python benchmarks/device.py                 # cpu, 256 MiB
    python benchmarks/device.py --device cuda   # 1 GiB
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import torch

from conformance.extensions.device.checks import default_cap, verify_tags
from kvref.allocation import allocate_kv_cache
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

_MiB = 1 << 20


def config(total_bytes: int, layout: KVCacheLayout, layers_per_group: int = 16) -> KVCacheConfig:
    """Two groups (full, sliding) of 8-head, head-128, bf16, block-16 layers: 64 KiB pages."""
    specs: list[KVCacheSpec] = [
        FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16),
        SlidingWindowSpec(
            block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16, sliding_window=1024
        ),
    ]
    page = specs[0].page_size_bytes
    bytes_per_block = page * layers_per_group
    num_blocks = max(2, total_bytes // bytes_per_block)
    size = bytes_per_block * num_blocks
    names = [[f"{kind}{i}" for i in range(layers_per_group)] for kind in ("f", "s")]
    if layout.is_block_outermost:
        layer_stride, block_stride = page, bytes_per_block
    else:
        layer_stride, block_stride = page * num_blocks, page
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(size=size, layers=n, layer_stride=layer_stride, block_stride=block_stride)
            for n in names
        ],
        kv_cache_groups=[
            KVCacheGroupSpec(layer_names=n, kv_cache_spec=s)
            for n, s in zip(names, specs, strict=True)
        ],
        kv_cache_layout=layout,
    )


def best_of(repeats: int, device: torch.device, run: Callable[[], object]) -> float:
    """Fastest of ``repeats`` timed runs, after one warm-up run, in seconds."""
    run()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1...)")
    parser.add_argument(
        "--mib",
        type=int,
        default=None,
        help="backing size (default: 256 MiB "
        "on cpu, 1 GiB elsewhere, never above the device check cap)",
    )
    parser.add_argument("--layout", default="LBNHC", help="KV cache layout of the backing")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    device = torch.device(args.device)
    wanted = (args.mib * _MiB) if args.mib else (256 * _MiB if device.type == "cpu" else 1 << 30)
    # The readback's boolean temporaries add up to 1/8 of the backing: keep both under the cap.
    total = min(wanted, default_cap(device) * 7 // 8)
    plan = config(total, KVCacheLayout.parse(args.layout))
    allocation = allocate_kv_cache(plan, device)
    readback = verify_tags(allocation, plan)
    assert not readback.violations, readback.violations
    written = readback.bytes_written

    tags = best_of(args.repeats, device, functools.partial(verify_tags, allocation, plan))
    allocation.close()
    target = torch.empty(written, dtype=torch.uint8, device=device)
    fill = best_of(args.repeats, device, functools.partial(target.fill_, 1))

    tags_bw = (readback.bytes_written + readback.bytes_read) / tags
    fill_bw = written / fill
    print(
        f"device {device}, layout {args.layout}, backing {plan.device_size / _MiB:.0f} MiB, "
        f"{readback.pages} pages, {written / _MiB:.0f} MiB of footprint"
    )
    print(f"KV-DEV-TAGS: {tags * 1e3:8.2f} ms  {tags_bw / 1e9:7.2f} GB/s (written + read)")
    print(f"fill_:       {fill * 1e3:8.2f} ms  {fill_bw / 1e9:7.2f} GB/s (written)")
    print(f"ratio: {tags_bw / fill_bw:.2f} (goal >= 0.5)")


if __name__ == "__main__":
    main()
