"""Time kvref's Core flow next to vLLM 0.33.0's on the same large pipeline-parallel models.

Run: ``/work/vllm-venv/bin/python benchmarks/planning_vllm.py [--repeats 3] [--only a|b]``

Inputs (one per case): 3:1 sliding-window(4096):full layers, 8 KV heads x 128,
bf16, block 16, max_model_len 32,768, LBNHC, split contiguously over the workers:

- (a) 4,096 layers on 8 PP workers with 80 GiB each;
- (b) 16,384 layers on 16 PP workers with 160 GiB each (a stage of 1,024
  layers needs 128.05 GiB for one 32K request, so 80 GiB would only time
  both planners refusing).

Timed, best of ``--repeats``, in one process:

- vLLM: ``get_global_kv_cache_groups`` and ``get_kv_cache_configs`` (its
  default builder), on vLLM specs and a ``VllmConfig`` built beforehand;
- kvref: :func:`kvref.get_global_kv_cache_groups` and
  :func:`kvref.plan_kv_cache` given those groups, with the reference builder.

Building the ``VllmConfig`` and converting the specs are not timed (each
repeat gets a fresh deep copy of the config, made before its clock starts,
because vLLM's Core mutates it).  The two results are checked to agree.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from typing import Any

from kvref import (
    FullAttentionSpec,
    KVCacheSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    get_global_kv_cache_groups,
    plan_kv_cache,
)
from kvref.interop import vllm as iv

GIB = 2**30


def model(layers: int, shared: bool = False) -> dict[str, KVCacheSpec]:
    """``layers`` layers, pattern (S, S, S, F): 3:1 sliding window 4,096 to full attention.

    By default every layer gets its own (equal) spec object, as a model's
    layers build them and as vLLM's side gets them from the conversion, so
    kvref earns no identity shortcut and memoises once per layer.  ``shared``
    reuses one object per kind (the input of the first measurements).
    """
    kw: dict[str, Any] = {
        "num_kv_heads": 8,
        "head_size": 128,
        "dtype": "bfloat16",
        "block_size": 16,
    }
    one_full, one_swa = FullAttentionSpec(**kw), SlidingWindowSpec(**kw, sliding_window=4096)
    specs: dict[str, KVCacheSpec] = {}
    for i in range(layers):
        if shared:
            specs[f"model.layers.{i}.attn"] = one_full if i % 4 == 3 else one_swa
        elif i % 4 == 3:
            specs[f"model.layers.{i}.attn"] = FullAttentionSpec(**kw)
        else:
            specs[f"model.layers.{i}.attn"] = SlidingWindowSpec(**kw, sliding_window=4096)
    return specs


def split(specs: dict[str, KVCacheSpec], workers: int) -> list[dict[str, KVCacheSpec]]:
    """Contiguous, even PP split."""
    items = list(specs.items())
    cuts = [len(items) * k // workers for k in range(workers + 1)]
    return [dict(items[cuts[k] : cuts[k + 1]]) for k in range(workers)]


def best(fn: Callable[..., Any], repeats: int, setup: Callable[[], Any] | None = None) -> float:
    """Best wall time of ``fn(setup())`` (or ``fn()``) over ``repeats`` runs; setup untimed."""
    times = []
    for _ in range(repeats):
        arg = setup() if setup is not None else None
        start = time.perf_counter()
        fn(arg) if setup is not None else fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run_case(
    name: str, layers: int, workers: int, memory_gib: int, repeats: int, shared: bool = False
) -> float:
    """Time both flows on one case, print the times and ratios; return the total ratio."""
    config = PlanningConfig(
        max_model_len=32768,
        pipeline_parallel_size=workers,
        kv_cache_layout="LBNHC",
    )
    per_worker = split(model(layers, shared), workers)
    memory = [memory_gib * GIB] * workers

    # vLLM inputs, built outside the clock.
    kvp = iv.vllm_modules().kvp
    default_builder = kvp.DefaultKVCacheConfigBuilder
    vspecs = [iv.specs_to_vllm(w) for w in per_worker]
    template = iv.to_vllm_config(config)

    def vllm_groups(vcfg: Any) -> Any:
        return kvp.get_global_kv_cache_groups(vcfg, [dict(w) for w in vspecs])

    def vllm_configs(state: tuple[Any, Any]) -> Any:
        vcfg, groups = state
        return kvp.get_kv_cache_configs(vcfg, vspecs, memory, groups)

    with iv.installed_builder(default_builder), iv.quiet_vllm():
        t_vllm_groups = best(vllm_groups, repeats, lambda: copy.deepcopy(template))
        fixed_groups = vllm_groups(copy.deepcopy(template))
        t_vllm_configs = best(
            vllm_configs, repeats, lambda: (copy.deepcopy(template), fixed_groups)
        )
        vllm_result = vllm_configs((copy.deepcopy(template), fixed_groups))

    builder = ReferenceKVCacheConfigBuilder
    t_kvref_groups = best(lambda: get_global_kv_cache_groups(builder, config, per_worker), repeats)
    groups = get_global_kv_cache_groups(builder, config, per_worker)
    t_kvref_configs = best(
        lambda: plan_kv_cache(builder, config, per_worker, memory, global_groups=groups), repeats
    )
    plan = plan_kv_cache(builder, config, per_worker, memory, global_groups=groups)

    converted = [iv.config_from_vllm(c) for c in vllm_result]
    same = [c.kv_cache_tensors for c in converted] == [c.kv_cache_tensors for c in plan.configs]
    t_vllm = t_vllm_groups + t_vllm_configs
    t_kvref = t_kvref_groups + t_kvref_configs
    print(
        f"{name}: {layers} layers, {workers} workers x {memory_gib} GiB, {len(groups)} groups, "
        f"num_blocks {plan.num_blocks}, plans agree: {same}"
    )
    print(f"  {'':26} {'vLLM':>10} {'kvref':>10} {'kvref/vLLM':>11}")
    for label, v, k in (
        ("global groups", t_vllm_groups, t_kvref_groups),
        ("get_kv_cache_configs", t_vllm_configs, t_kvref_configs),
        ("total", t_vllm, t_kvref),
    ):
        print(f"  {label:26} {v * 1e3:8.1f}ms {k * 1e3:8.1f}ms {k / v:10.2f}x")
    return t_kvref / t_vllm


def main() -> None:
    """Parse the options and run the cases."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["a", "b"], default=None)
    parser.add_argument(
        "--shared-specs", action="store_true", help="one spec object per layer kind"
    )
    args = parser.parse_args()
    iv.vllm_modules()  # import vLLM (seconds) before any clock starts
    cases = {"a": ("(a)", 4096, 8, 80), "b": ("(b)", 16384, 16, 160)}
    for key, (name, layers, workers, memory_gib) in cases.items():
        if args.only in (None, key):
            run_case(name, layers, workers, memory_gib, args.repeats, args.shared_specs)


if __name__ == "__main__":
    main()
