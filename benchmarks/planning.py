"""Time kvref's Core flow on large models (issue: reference performance).

(a) 4,096 layers, 3:1 sliding-window(4096):full, 8 KV heads x 128, bf16,
    8 PP workers with 80 GiB each, max_model_len 32768;
(b) 16,384 layers on 16 workers (160 GiB each: at 80 GiB one 32k request
    does not fit, and the flow ends in an InsufficientMemoryError).

Run: python benchmarks/planning.py [--repeat 3]
Prints the best wall time of each case and the growth ratio (b)/(a), which
should stay near 16 (4x layers x 2x workers... layers x workers grows 8x;
see the note printed).  The side-by-side comparison with vLLM lives in
benchmarks/planning_vllm.py (needs the vllm environment).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kvref import (
    FullAttentionSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    plan_kv_cache,
)
from kvref.specs import KVCacheSpec

GIB = 2**30


def problem(
    layers: int, workers: int, gib: int = 80
) -> tuple[PlanningConfig, list[dict[str, KVCacheSpec]], list[int]]:
    """The benchmark's model split contiguously into ``workers`` PP stages.

    Every layer gets its own (equal) spec object, as a model's layers build them.
    """
    kw: dict[str, Any] = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bf16"}
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    specs: dict[str, KVCacheSpec] = {
        n: (FullAttentionSpec(**kw) if i % 4 == 3 else SlidingWindowSpec(**kw, sliding_window=4096))
        for i, n in enumerate(names)
    }
    per = layers // workers
    split = [dict(list(specs.items())[w * per : (w + 1) * per]) for w in range(workers)]
    config = PlanningConfig(max_model_len=32768, pipeline_parallel_size=workers)
    return config, split, [gib * GIB] * workers


def best(layers: int, workers: int, repeat: int, gib: int = 80) -> float:
    """Best wall time of ``repeat`` runs of the whole flow."""
    config, split, memory = problem(layers, workers, gib)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        plan_kv_cache(ReferenceKVCacheConfigBuilder, config, split, memory)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Print the timings."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    a = best(4096, 8, args.repeat)
    # 1,024 layers per worker need ~128 GiB for one 32k request: give them 160.
    b = best(16384, 16, args.repeat, gib=160)
    print(f"(a) 4,096 layers x 8 workers:   {a:.3f} s")
    print(f"(b) 16,384 layers x 16 workers: {b:.3f} s")
    print(f"(b)/(a) = {b / a:.1f} for 4x the layers on 2x the workers (linear in layers: 4)")


if __name__ == "__main__":
    main()
