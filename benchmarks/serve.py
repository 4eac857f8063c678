"""Throughput of the serving simulation: tokens written and verified per second.

A gpt-oss-like hybrid (full attention every third layer, sliding windows of
128 between; 8 KV heads of 64, bf16, block 16) is placed by the reference
builder and served a reproducible random stream (prefix sharing, decode,
finish, preemption).  Each computed token is written through every layer's
view and every state a live request still needs is read back after every
step, so "verified" counts the readbacks of all steps.

    python benchmarks/serve.py                  # cpu
    python benchmarks/serve.py --device cuda
"""

from __future__ import annotations

import argparse
import time

import torch

from conformance.extensions.serve.checks import ServeBounds
from conformance.extensions.serve.machine import random_program
from conformance.extensions.serve.sim import Simulation
from kvref import (
    FullAttentionSpec,
    KVCacheLayout,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
)
from kvref.specs import KVCacheSpec


def model(layers: int) -> dict[str, KVCacheSpec]:
    """Full attention every third layer, sliding windows of 128 tokens between."""
    specs: dict[str, KVCacheSpec] = {}
    for i in range(layers):
        if i % 3 == 0:
            specs[f"l{i}"] = FullAttentionSpec(
                block_size=16, num_kv_heads=8, head_size=64, dtype=torch.bfloat16
            )
        else:
            specs[f"l{i}"] = SlidingWindowSpec(
                block_size=16,
                num_kv_heads=8,
                head_size=64,
                dtype=torch.bfloat16,
                sliding_window=128,
            )
    return specs


def run(layout: KVCacheLayout, device: str, layers: int, blocks: int, steps: int) -> None:
    """Serve one stream and print its throughput."""
    specs = model(layers)
    cfg = PlanningConfig(kv_cache_layout=layout)
    builder = ReferenceKVCacheConfigBuilder()
    config = builder.get_kv_cache_config_from_groups(
        cfg, builder.get_kv_cache_groups(cfg, specs), blocks
    )
    bounds = ServeBounds(max_tokens=768, max_prompt=384, max_encoder=0)
    program = random_program(steps, seed=1, max_prompt=bounds.max_prompt)
    sim = Simulation([config], layout, device, layer_specs=[specs], max_tokens=bounds.max_tokens)
    start = time.perf_counter()
    found = program.run(sim)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    stats = sim.stats
    token_bytes = sum(s.page_size_bytes // s.block_size for s in specs.values())
    print(
        f"{layout.name} {device}: {steps} steps, {config.device_size / 2**20:.0f} MiB, "
        f"{seconds:.2f} s; tokens {stats['tokens'] / seconds:,.0f}/s, "
        f"states written {stats['states_written'] / seconds:,.0f}/s, "
        f"verified {stats['states_verified'] / seconds:,.0f}/s "
        f"({stats['states_verified'] * token_bytes / layers / seconds / 2**20:,.0f} MiB/s); "
        f"prefix-hit tokens {stats['prefix_hit_tokens']}, preemptions {stats['preemptions']}"
        + (f"; VIOLATIONS {found[:1]}" if found else "")
    )
    for alloc in sim.allocations:
        alloc.close()


def main() -> None:
    """Parse the options and run every layout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--blocks", type=int, default=512)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layouts", default="LBNHC,BLHNC")
    args = parser.parse_args()
    for name in args.layouts.split(","):
        run(KVCacheLayout.parse(name), args.device, args.layers, args.blocks, args.steps)


if __name__ == "__main__":
    main()
