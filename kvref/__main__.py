"""``python -m kvref``: plan a Llama-like and a Gemma-3-like model and print the configs."""

from __future__ import annotations

from kvref import (
    FullAttentionSpec,
    KVCachePlan,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    plan_kv_cache,
)
from kvref.specs import KVCacheSpec

_GIB = 2**30


def _show(title: str, plan: KVCachePlan) -> None:
    print(f"== {title}: {plan.num_blocks} blocks, max_model_len {plan.max_model_len}")
    for w, (config, figures) in enumerate(zip(plan.configs, plan.workers, strict=True)):
        print(
            f"  worker {w}: {figures.pool_bytes_per_block} bytes per block, "
            f"backing {config.device_size / _GIB:.2f} GiB, layout "
            f"{config.kv_cache_layout.name if config.kv_cache_layout else None}"
        )
        for i, group in enumerate(config.kv_cache_groups):
            spec = group.kv_cache_spec
            names = group.layer_names
            print(
                f"    group {i}: {type(spec).__name__}(block_size={spec.block_size}, "
                f"page={spec.page_size_bytes}) x {len(names)} layers [{names[0]} .. {names[-1]}]"
            )
        for t in config.kv_cache_tensors[:4]:
            print(
                f"    tensor {list(t.layers)[:2]}{'...' if len(t.layers) > 2 else ''}: "
                f"layer_stride={t.layer_stride} block_stride={t.block_stride} offset={t.offset}"
            )
        if len(config.kv_cache_tensors) > 4:
            print(f"    ... {len(config.kv_cache_tensors) - 4} more tensors")


def main() -> None:
    """Print two example plans."""
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    llama: dict[str, KVCacheSpec] = {f"model.layers.{i}.self_attn.attn": full for i in range(32)}
    plan = plan_kv_cache(
        ReferenceKVCacheConfigBuilder, PlanningConfig(max_model_len=8192), [llama], 16 * _GIB
    )
    _show("Llama-3-8B-like, 32 layers, 16 GiB", plan)

    g_full = FullAttentionSpec(block_size=16, num_kv_heads=16, head_size=128, dtype="bfloat16")
    g_swa = SlidingWindowSpec(
        block_size=16, num_kv_heads=16, head_size=128, dtype="bfloat16", sliding_window=1024
    )
    gemma: dict[str, KVCacheSpec] = {
        f"model.layers.{i}.self_attn.attn": (g_full if i % 6 == 5 else g_swa) for i in range(62)
    }
    plan = plan_kv_cache(
        ReferenceKVCacheConfigBuilder,
        PlanningConfig(max_model_len=32768, max_num_batched_tokens=8192),
        [gemma],
        20 * _GIB,
    )
    _show("Gemma-3-27B-like, 5:1 sliding window, 20 GiB", plan)


if __name__ == "__main__":
    main()
