"""Generate golden planning outputs with vLLM 0.33.0 for the newer interface parts.

Writes ``NAME.json`` (problems) and ``NAME.out.json`` (what vLLM's own
planning code returned) into ``tests/data/golden`` for:

- ``hidden_state``: ``HiddenStateCacheSpec`` layers set apart and aligned;
- ``hisparse``: HiSparse groups, host pool, placement and its errors;
- ``model_grouping``: a model-declared grouping (``SupportsKVCacheGrouping``);
- ``profiling``: the one-worker profiling path;
- ``layout_resolution``: problems that give no layout but describe the
  attention backends, the KV connector or ``VLLM_KV_CACHE_LAYOUT``; vLLM's
  ``resolve_kv_cache_layout`` picks the layout (recorded as
  ``layout_resolution`` and ``layout.resolved``) and the problem is then
  planned with it.

The outputs follow ``tests/data/golden/README.md`` (``resolved``, ``layout``,
``builder``, ``core``, ``from_groups``) plus ``profiling``: per worker, the
groups and the placement of ``min(max_num_reqs, max_cudagraph_capture_size) or 1``
blocks.  Problems are loaded by ``tests/golden.py`` on both sides, so kvref
tests read exactly what vLLM was given.  HiSparse problems marked
``resolve_hisparse`` get their derived resident and hot layers from vLLM's
``get_hisparse_kv_cache_groups`` before they are written.

Run with vLLM 0.33.0 installed (``tox -e vllm`` installs it):
``python scripts/make_golden.py [--check]`` (``--check``: compare, write nothing).
Other releases' outputs are ``scripts/golden_versions.py``'s, which reuses
this module's runner.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import enum
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import golden  # noqa: E402

from kvref.interop import vllm as iv  # noqa: E402
from kvref.interop.vllm_core import _worker_figures  # noqa: E402
from kvref.versions import installed_vllm_version  # noqa: E402

ORACLE_VERSION = "kvref-make_golden-1"
#: The release problems are planned as: the installed vLLM's.
VERSION = installed_vllm_version() or golden.BASE_VERSION
OUT_DIR = REPO / "tests" / "data" / "golden"

# -- problems -------------------------------------------------------------------

BF16 = {"dtype": "bfloat16", "head_size": 128}
FULL8 = {"kind": "full_attention", "num_kv_heads": 8, **BF16}
SWA8 = {"kind": "sliding_window", "num_kv_heads": 8, "sliding_window": 1024, **BF16}
SWA4 = {**SWA8, "num_kv_heads": 4}
HIDDEN = {"kind": "hidden_state", "num_kv_heads": 1, "head_size": 4096, "dtype": "bfloat16"}
SOURCE = {
    "kind": "mla",
    "block_size": 64,
    "num_kv_heads": 1,
    "head_size": 576,
    "dtype": "uint8",
    "state_content_bytes": 656,
    "cache_dtype_str": "fp8_ds_mla",
    "is_index_group_leader": True,
}
INDEXER = {
    "kind": "mla",
    "block_size": 64,
    "num_kv_heads": 1,
    "head_size": 128,
    "dtype": "uint8",
    "state_content_bytes": 132,
    "cache_role": "INDEXER",
}
GIB = 1 << 30


def _pattern(pattern: str, repeats: int, kinds: Mapping[str, Any]) -> dict[str, Any]:
    """``l<i>`` for the pattern repeated, one letter per layer."""
    letters = pattern * repeats
    return {f"l{i}": kinds[c] for i, c in enumerate(letters)}


def _problem(name: str, workers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    raw = {"name": name, "config": extra.pop("config", {}), "workers": workers}
    raw["available_memory"] = extra.pop("available_memory", GIB)
    raw.update(extra)
    return raw


def _hidden_problems() -> list[dict[str, Any]]:
    hybrid = _pattern("FSS", 2, {"F": FULL8, "S": SWA8}) | {"h0": HIDDEN}
    small_f = {"kind": "full_attention", "num_kv_heads": 1, "head_size": 64, "dtype": "float16"}
    small_s = {**small_f, "kind": "sliding_window", "sliding_window": 256}
    padded_s = {**SWA8, "num_kv_heads": 6, "page_size_padded": 65536}
    wide = {**HIDDEN, "num_kv_heads": 2, "head_size": 32768}
    mla = {"kind": "mla", "num_kv_heads": 1, "head_size": 576, "dtype": "bfloat16"}
    draft = {**SWA8, "block_size": 64}
    return [
        _problem("hidden_state_hybrid", [hybrid], config={"max_model_len": 4096}),
        _problem("hidden_state_scaled", [{"f": small_f, "s": small_s, "h": HIDDEN}]),
        _problem(
            "hidden_state_padded_groups",
            [{"f": {**FULL8, "num_kv_heads": 4}, "s": padded_s, "h": wide}],
            available_memory=8 * GIB,
        ),
        _problem("hidden_state_uniform_type", [{"f0": FULL8, "f1": FULL8, "h0": HIDDEN}]),
        _problem(
            "hidden_state_packed_BLHNC",
            [{"f0": FULL8, "s0": SWA4, "s1": SWA4, "h0": HIDDEN}],
            config={"kv_cache_layout": "BLHNC"},
        ),
        _problem(
            "hidden_state_blocks_fallback",
            [
                {f"m{i}": {**mla, "block_size": 64} for i in range(4)}
                | {"d": draft, "h": {**HIDDEN, "block_size": 32}}
            ],
        ),
        _problem(
            "hidden_state_pp2",
            [
                {k: v for k, v in hybrid.items() if k in ("l0", "l1", "l2")},
                {k: v for k, v in hybrid.items() if k not in ("l0", "l1", "l2")},
            ],
            available_memory=[GIB, GIB // 2],
        ),
    ]


def _mla_model(n: int, source: Mapping[str, Any] = SOURCE) -> dict[str, Any]:
    layers: dict[str, Any] = {}
    for i in range(n):
        layers[f"m{i}"] = dict(source)
        layers[f"i{i}"] = dict(INDEXER)
    return layers


def _hisparse_problems() -> list[dict[str, Any]]:
    hs = {"index_topk": 2048}
    base = {"max_model_len": 8192, "kv_cache_layout": "BLHNC", "hisparse": hs}
    pool = {"host_pool_bytes": 1 << 28}
    follower = {**SOURCE, "is_index_group_leader": False}
    wide_idx = {**INDEXER, "state_content_bytes": 1400}
    full = {"kind": "full_attention", "block_size": 64, "num_kv_heads": 1, "head_size": 64}
    full["dtype"] = "bfloat16"
    twelve = {f"m{i}": dict(SOURCE) for i in range(12)} | {"i0": wide_idx, "i1": wide_idx}

    def hp(name: str, workers: list[dict[str, Any]], **config: Any) -> dict[str, Any]:
        return _problem(name, workers, config={**base, **pool, **config}, resolve_hisparse=True)

    return [
        hp("hisparse_basic", [_mla_model(4)]),
        hp("hisparse_one_unit", [_mla_model(4, follower)]),
        hp("hisparse_packed_units", [twelve]),
        hp("hisparse_with_regular_layer", [_mla_model(4) | {"f0": full}]),
        hp("hisparse_shared_pool", [_mla_model(3)], hisparse={**hs, "shared_host_pool": True}),
        hp(
            "hisparse_two_decode_queries",
            [_mla_model(4)],
            hisparse={**hs, "max_decode_query_len": 2},
        ),
        hp("hisparse_buffer", [_mla_model(4)], hisparse={**hs, "device_buffer_size": 3000}),
        hp(
            "hisparse_auto_fit_host_pool",
            [_mla_model(4)],
            host_pool_bytes=1 << 24,
            max_model_len=-1,
            derived_max_model_len=65536,
        ),
        hp("hisparse_pool_too_small", [_mla_model(4)], host_pool_bytes=1 << 24),
        hp("hisparse_no_pool", [_mla_model(4)], host_pool_bytes=None),
        hp("hisparse_layer_outer_layout", [_mla_model(4)], kv_cache_layout="LBNHC"),
        hp(
            "hisparse_layer_outer_one_page",
            [{"m0": SOURCE, "i0": {**INDEXER, "state_content_bytes": 656}}],
            kv_cache_layout="LBNHC",
        ),
        hp(
            "hisparse_buffer_too_small",
            [_mla_model(4)],
            hisparse={**hs, "device_buffer_size": 1000},
        ),
        hp("hisparse_no_indexer", [{f"m{i}": dict(SOURCE) for i in range(2)}]),
        hp(
            "hisparse_deepseek_v4",
            [{k: {**v, "model_version": "deepseek_v4"} for k, v in _mla_model(2).items()}],
        ),
        hp("hisparse_no_mla", [{"f0": full}]),
    ]


def _grouping_problems() -> list[dict[str, Any]]:
    layers = _pattern("FSS", 10, {"F": FULL8, "S": SWA8})
    full_names = [f"l{i}" for i in range(0, 30, 3)]
    swa_names = [f"l{i}" for i in range(30) if i % 3]
    return [
        _problem(
            "model_grouping_two_groups",
            [layers],
            config={"max_model_len": 4096, "model_grouping": [full_names, swa_names]},
        ),
        _problem(
            "model_grouping_pp2",
            [
                {k: v for k, v in layers.items() if int(k[1:]) < 16},
                {k: v for k, v in layers.items() if int(k[1:]) >= 16},
            ],
            config={"max_model_len": 4096, "model_grouping": [full_names, swa_names]},
            available_memory=[GIB, GIB],
        ),
        _problem(
            "model_grouping_uniform_type_BLHNC",
            [_pattern("FS", 4, {"F": FULL8, "S": {**FULL8, "num_kv_heads": 4}})],
            config={"kv_cache_layout": "BLHNC", "model_grouping": [[f"l{i}" for i in range(8)]]},
        ),
        _problem(
            "model_grouping_overlap",
            [layers],
            config={"model_grouping": [full_names, swa_names, ["l1"]]},
        ),
        _problem(
            "model_grouping_missing_layer",
            [layers],
            config={"model_grouping": [full_names, swa_names[:-1]]},
        ),
        _problem(
            "model_grouping_with_hisparse",
            [_mla_model(2)],
            config={
                "kv_cache_layout": "BLHNC",
                "hisparse": {"index_topk": 2048},
                "host_pool_bytes": 1 << 28,
                "model_grouping": [["m0", "m1"], ["i0", "i1"]],
            },
        ),
    ]


def _profiling_problems() -> list[dict[str, Any]]:
    layers = _pattern("FSS", 10, {"F": FULL8, "S": SWA8})
    w0 = {k: v for k, v in layers.items() if int(k[1:]) < 16}
    w1 = {k: v for k, v in layers.items() if int(k[1:]) >= 16}
    prof = {"max_num_reqs": 128, "max_cudagraph_capture_size": 512}
    return [
        _problem(
            "profiling_pp2",
            [w0, w1],
            config={"max_model_len": 32768, "max_num_batched_tokens": 1024},
            available_memory=[2147483648, 1610612736],
            profiling=prof,
        ),
        _problem(
            "profiling_no_cudagraphs_lookahead",
            [_pattern("FS", 3, {"F": FULL8, "S": SWA8})],
            config={"num_prefill_lookahead_tokens": 3},
            profiling={"max_num_reqs": 64, "max_cudagraph_capture_size": 0},
        ),
        _problem(
            "profiling_hidden_state",
            [_pattern("FSS", 2, {"F": FULL8, "S": SWA8}) | {"h0": HIDDEN}],
            profiling={"max_num_reqs": 256, "max_cudagraph_capture_size": 64},
        ),
    ]


def _layout_problems() -> list[dict[str, Any]]:
    hs = {"index_topk": 2048}
    hisparse = {"max_model_len": 8192, "hisparse": hs, "host_pool_bytes": 1 << 28}
    sparse = {"name": "FLASHMLA_SPARSE", "supported_kernel_block_sizes": [{"multiple_of": 64}]}
    indexer = {"name": "DEEPSEEK_V32_INDEXER", "supported_kernel_block_sizes": [64]}
    mla = _mla_model(4)
    mla_backends = [
        {**sparse, "layers": [n for n in mla if n.startswith("m")]},
        {**indexer, "layers": [n for n in mla if n.startswith("i")]},
    ]
    hybrid = _pattern("FSS", 4, {"F": FULL8, "S": SWA8})
    prefers = {"name": "BLOCK_OUTER", "supported_kv_cache_layouts": ["BLNHC", "LBNHC"]}
    flash = {"name": "FLASH_ATTN", "supported_kv_cache_layouts": ["LBNHC", "LBHNC", "BLNHC"]}
    return [
        # The issue's case: HiSparse's connector needs a block-outermost layout.
        _problem(
            "hisparse_connector_layout",
            [mla],
            config={**hisparse, "kv_connector_layout": "BLHNC", "attention_backends": mla_backends},
            resolve_hisparse=True,
        ),
        _problem(
            "hisparse_connector_layout_no_backends",
            [_mla_model(2)],
            config={**hisparse, "kv_connector_layout": "BLHNC"},
            resolve_hisparse=True,
        ),
        _problem(
            "backends_prefer_block_outer",
            [hybrid],
            config={"max_model_len": 4096, "attention_backends": [prefers]},
        ),
        _problem(
            "backends_vote_for_first",
            [hybrid],
            config={
                "attention_backends": [
                    {**prefers, "layers": [f"l{i}" for i in range(0, 12, 3)]},
                    {**flash, "layers": [f"l{i}" for i in range(12) if i % 3]},
                ]
            },
        ),
        _problem(
            "env_override_LBHNC",
            [hybrid],
            config={"env_kv_cache_layout": "HND", "attention_backends": [flash]},
        ),
        _problem(
            "connector_layout_dropped",
            [hybrid],
            config={"kv_connector_layout": "BHLNC", "attention_backends": [flash]},
        ),
        _problem(
            "mixed_pages_block_compact",
            [{"f0": FULL8, "f1": {**FULL8, "num_kv_heads": 4}, "s0": SWA8}],
            config={
                "attention_backends": [
                    {"name": "HEADS_OUTER", "supported_kv_cache_layouts": ["LHBNC", "BLHNC"]}
                ]
            },
        ),
    ]


FILES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "hidden_state": _hidden_problems,
    "hisparse": _hisparse_problems,
    "model_grouping": _grouping_problems,
    "profiling": _profiling_problems,
    "layout_resolution": _layout_problems,
}

# -- vLLM records as JSON ----------------------------------------------------------


def _json(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, Fraction):
        return str(value) if value.denominator != 1 else int(value)
    if type(value).__name__ == "dtype":
        return str(value).removeprefix("torch.")
    if type(value).__name__ == "MultipleOf":
        return {"multiple_of": value.base}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def spec_record(spec: Any) -> dict[str, Any]:
    """A vLLM spec in the golden shape (``UniformTypeKVCacheSpecs`` deduplicated)."""
    record: dict[str, Any] = {
        "class": type(spec).__name__,
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
    }
    layers = getattr(spec, "kv_cache_specs", None)
    if isinstance(layers, dict):
        buckets: dict[Any, list[str]] = {}
        for name, layer_spec in layers.items():
            buckets.setdefault(layer_spec, []).append(name)
        record["layer_specs"] = [{"layers": n, "spec": spec_record(s)} for s, n in buckets.items()]
        return record
    record["fields"] = {f.name: _json(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
    return record


def group_record(group: Any) -> dict[str, Any]:
    """A vLLM group in the golden shape."""
    return {
        "layer_names": list(group.layer_names),
        "host_resident": bool(group.host_resident),
        "is_eagle_group": bool(group.is_eagle_group),
        "enable_kv_transfer": bool(group.enable_kv_transfer),
        "role": group.role.name,
        "spec": spec_record(group.kv_cache_spec),
    }


def config_record(config: Any, layout: str) -> dict[str, Any]:
    """A vLLM ``KVCacheConfig`` in the golden shape (layout set as the engine core does)."""
    return {
        "num_blocks": config.num_blocks,
        "kv_cache_tensors": [
            {
                "size": t.size,
                "layers": list(t.layers),
                "layer_stride": t.layer_stride,
                "block_stride": t.block_stride,
                "offset": t.offset,
                "host_resident": bool(t.host_resident),
            }
            for t in config.kv_cache_tensors
        ],
        "kv_cache_groups": [group_record(g) for g in config.kv_cache_groups],
        "kv_tp_replicas": config.kv_tp_replicas,
        "needs_kv_cache_zeroing": bool(config.needs_kv_cache_zeroing),
        "kv_cache_layout": layout,
        "prefix_cache_retention_interval": config.prefix_cache_retention_interval,
        "hisparse_host_num_blocks": config.hisparse_host_num_blocks,
        "hisparse_host_block_stride": config.hisparse_host_block_stride,
        "hisparse_shared_host_pool": bool(config.hisparse_shared_host_pool),
    }


def error_record(exc: BaseException) -> dict[str, Any]:
    """``{type, message, where}``: ``where`` is the innermost frame, relative to site-packages."""
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    path = frame.filename
    for marker in ("site-packages/", str(REPO) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "where": f"{path}:{frame.lineno} in {frame.name}",
    }


# -- running vLLM ------------------------------------------------------------------


def _vllm_backend(desc: Mapping[str, Any]) -> Any:
    """A vLLM ``AttentionBackend`` subclass answering as ``desc`` describes (never instantiated)."""
    base = __import__("vllm.v1.attention.backend", fromlist=["x"])
    vllm_layout = __import__("vllm.v1.kv_cache_layout", fromlist=["x"]).KVCacheLayout
    names = desc.get("supported_kv_cache_layouts")
    layouts = None if names is None else tuple(vllm_layout[n] for n in names)
    sizes = [
        base.MultipleOf(s["multiple_of"]) if isinstance(s, dict) else s
        for s in desc.get("supported_kernel_block_sizes", [{"multiple_of": 1}])
    ]
    namespace = {
        "supported_kv_cache_layouts": classmethod(lambda cls: layouts),
        "get_supported_kernel_block_sizes": staticmethod(lambda kv_cache_spec=None: list(sizes)),
        "get_name": staticmethod(lambda: desc["name"]),
    }
    return type(desc["name"], (base.AttentionBackend,), namespace)


def _worker_backends(descs: list[Mapping[str, Any]], layers: list[str]) -> list[Any]:
    """The backends a worker runs: those naming its layers, and the one naming none if needed."""
    named = {n for d in descs for n in d.get("layers", [])}
    return [
        _vllm_backend(d)
        for d in descs
        if set(d.get("layers", [])) & set(layers)
        or (not d.get("layers") and bool(set(layers) - named))
    ]


#: Config keys that describe what vLLM's layout resolution reads (kvref's field names).
_LAYOUT_INPUTS = {"attention_backends", "kv_connector_layout", "env_kv_cache_layout"}


@contextlib.contextmanager
def _layout_inputs(config: Mapping[str, Any]) -> Iterator[None]:
    """``VLLM_KV_CACHE_LAYOUT`` and (without HiSparse) the connector's layout, for vLLM."""
    utils = __import__("vllm.v1.attention.backends.utils", fromlist=["x"])
    saved_env = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    saved_connector = utils.get_kv_connector_cache_layout
    if config.get("env_kv_cache_layout") is not None:
        os.environ["VLLM_KV_CACHE_LAYOUT"] = config["env_kv_cache_layout"]
    connector = config.get("kv_connector_layout")
    if connector is not None and config.get("hisparse") is None:
        # HiSparse problems use vLLM's own HiSparseConnector; others name a layout only.
        utils.get_kv_connector_cache_layout = lambda vllm_config=None: connector
    try:
        yield
    finally:
        utils.get_kv_connector_cache_layout = saved_connector
        if saved_env is None:
            os.environ.pop("VLLM_KV_CACHE_LAYOUT", None)
        else:
            os.environ["VLLM_KV_CACHE_LAYOUT"] = saved_env


def _resolve_layout(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run vLLM's ``resolve_kv_cache_layout`` on a problem that gives no layout.

    Returns the problem to plan (the layout set to vLLM's) and the record of
    the resolution: what each worker reported, and the layout or the error.
    """
    utils = __import__("vllm.v1.attention.backends.utils", fromlist=["x"])
    problem = golden.problem_from_dict(raw, version=VERSION)
    descs = raw["config"].get("attention_backends", [])
    supported = [
        [m.name for m in utils.get_supported_kv_cache_layouts(_worker_backends(descs, list(w)))]
        for w in problem.workers
    ]
    vcfg = iv.to_vllm_config(problem.config)
    vcfg.cache_config.kv_cache_layout = None
    specs = [s for w in problem.workers for s in iv.specs_to_vllm(w).values()]
    record: dict[str, Any] = {"supported_layouts": supported}
    with _layout_inputs(raw["config"]), iv.quiet_vllm():
        try:
            record["layout"] = utils.resolve_kv_cache_layout(vcfg, supported, specs).name
        except Exception as exc:  # vLLM's refusals are the data here
            record["error"] = error_record(exc)
    planned = copy.deepcopy(raw)
    planned["config"]["kv_cache_layout"] = record.get("layout", "LBNHC")
    return planned, record


def _resolve_hisparse(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with vLLM's derived resident and hot layers added to every worker."""
    problem = golden.problem_from_dict(raw, version=VERSION)
    hisparse_layout = __import__("vllm.v1.hisparse.layout", fromlist=["x"])
    kvi = iv.vllm_modules().kvi
    raw = copy.deepcopy(raw)
    for index, worker in enumerate(problem.workers):
        vcfg = iv.to_vllm_config(problem.config)
        with iv.hisparse_patches(problem.config), iv.quiet_vllm():
            try:
                groups = hisparse_layout.get_hisparse_kv_cache_groups(
                    vcfg, iv.specs_to_vllm(worker)
                )
            except ValueError:
                continue  # the problem is about this error: keep the specs as they are
        for group in groups or []:
            spec = group.kv_cache_spec
            if isinstance(spec, (kvi.HiSparseHotSpec, kvi.HiSparseResidentSpec)):
                fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
                entry = {"kind": type(spec).__name__}
                entry |= {k: _json(v) for k, v in fields.items() if k != "is_draft"}
                for name in group.layer_names:
                    raw["workers"][index][name] = entry
    raw.pop("resolve_hisparse", None)
    return raw


def _resolved(config: Any, vcfg: Any, builder_cls: Any) -> dict[str, Any]:
    sched, par = vcfg.scheduler_config, vcfg.parallel_config
    backend = __import__("vllm.v1.attention.backend", fromlist=["x"])
    return {
        "max_decode_query_len": backend.max_decode_query_len(vcfg),
        "builder_cls": f"{builder_cls.__module__}.{builder_cls.__qualname__}",
        "kv_cache_layout": config.kv_cache_layout.name,
        "max_model_len": vcfg.model_config.max_model_len,
        "original_max_model_len": vcfg.model_config.original_max_model_len,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "max_num_encoder_input_tokens": sched.max_num_encoder_input_tokens,
        "async_scheduling": config.async_scheduling,
        "max_concurrent_batches": vcfg.max_concurrent_batches,
        "max_in_flight_tokens": vcfg.max_in_flight_tokens,
        "disable_hybrid_kv_cache_manager": sched.disable_hybrid_kv_cache_manager,
        "num_gpu_blocks_override": vcfg.cache_config.num_gpu_blocks_override,
        "mamba_cache_mode": vcfg.cache_config.mamba_cache_mode,
        "prefix_cache_retention_interval": vcfg.cache_config.prefix_cache_retention_interval,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "tensor_parallel_size": par.tensor_parallel_size,
        "decode_context_parallel_size": par.decode_context_parallel_size,
        "num_prefill_lookahead_tokens": vcfg.num_prefill_lookahead_tokens,
        "supports_kv_cache_grouping": bool(vcfg.model_config.supports_kv_cache_grouping),
        "hisparse": vcfg.attention_config.hisparse_config is not None,
    }


def _stage(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as exc:  # vLLM's refusals are the data here
        return {"error": error_record(exc)}


def run_problem(raw: dict[str, Any], problem: golden.GoldenProblem | None = None) -> dict[str, Any]:
    """Run vLLM on one problem (already resolved) and record its output.

    ``problem``: the problem as kvref objects, when not the one ``raw`` gives
    by itself (another release's run of a problem loaded with its outputs).
    """
    modules = iv.vllm_modules()
    kvp, builder_cls = modules.kvp, modules.kvp.DefaultKVCacheConfigBuilder
    problem = problem or golden.problem_from_dict(raw, version=VERSION)
    config = problem.config
    layout = config.kv_cache_layout.name
    workers = [iv.specs_to_vllm(w) for w in problem.workers]
    merged = {k: v for w in workers for k, v in w.items()}
    memory = [problem.memory_of(i) for i in range(len(workers))]
    out: dict[str, Any] = {"name": raw["name"], "oracle_version": ORACLE_VERSION}
    out["vllm_version"] = modules.version
    out["layout"] = {"resolved": layout}
    out["resolved"] = _resolved(config, iv.to_vllm_config(config), builder_cls)
    builder_groups: list[Any] = []

    def builder_stage() -> dict[str, Any]:
        vcfg = iv.to_vllm_config(config)
        groups = builder_cls().get_kv_cache_groups(vcfg, dict(merged))
        builder_groups.extend(groups)
        return {
            "builder_class": builder_cls.__name__,
            "groups": [group_record(g) for g in groups],
            "pool_bytes_per_block": kvp._pool_bytes_per_block(vcfg, groups),
        }

    core_state: dict[str, Any] = {}

    def core_stage() -> dict[str, Any]:
        vcfg = iv.to_vllm_config(config)
        core_state["vcfg"] = vcfg
        global_groups = kvp.get_global_kv_cache_groups(vcfg, copy.copy(workers))
        core_state["global"] = global_groups
        configs = kvp.get_kv_cache_configs(vcfg, workers, memory, global_groups)
        return {
            "global_groups": [group_record(g) for g in global_groups],
            "workers": _workers(vcfg, global_groups, workers, memory, configs, layout),
            "num_blocks": min(c.num_blocks for c in configs),
            "max_model_len_after": vcfg.model_config.max_model_len,
        }

    with iv.installed_builder(builder_cls), iv.hisparse_patches(config), iv.quiet_vllm():
        out["builder"] = _stage(builder_stage)
        core = _stage(core_stage)
        if "error" in core and "global" in core_state:
            vcfg, global_groups = core_state["vcfg"], core_state["global"]
            core["global_groups"] = [group_record(g) for g in global_groups]
            core["workers"] = _workers(vcfg, global_groups, workers, memory, None, layout)
            core["max_model_len_after"] = vcfg.model_config.max_model_len
        out["core"] = core
        probes = list(raw.get("num_blocks_probes", golden.DEFAULT_NUM_BLOCKS_PROBES))
        if "num_blocks" in core:
            probes.append(core["num_blocks"])
        out["from_groups"] = (
            []
            if not builder_groups
            else [
                {"num_blocks_requested": n, **_stage(lambda n=n: _probe(builder_groups, config, n))}
                for n in probes
            ]
        )
        if problem.profiling is not None:
            out["profiling"] = [_stage(lambda w=w: _profile(w, problem)) for w in workers]
    out["ok"] = not any(
        isinstance(out.get(k), dict) and "error" in out[k] for k in ("builder", "core")
    )
    return out


def _probe(groups: list[Any], config: Any, n: int) -> dict[str, Any]:
    builder = iv.vllm_modules().kvp.DefaultKVCacheConfigBuilder()
    placed = builder.get_kv_cache_config_from_groups(iv.to_vllm_config(config), groups, n)
    return {"config": config_record(placed, config.kv_cache_layout.name)}


def _workers(
    vcfg: Any,
    global_groups: list[Any],
    workers: list[dict[str, Any]],
    memory: list[int],
    configs: list[Any] | None,
    layout: str,
) -> list[dict[str, Any]]:
    kvp = iv.vllm_modules().kvp
    figures = _worker_figures(kvp.DefaultKVCacheConfigBuilder, vcfg, global_groups, workers, memory)
    out = []
    for index, (specs, fig) in enumerate(zip(workers, figures, strict=True)):
        projected = kvp._project_kv_cache_groups_to_worker(global_groups, specs)
        record = {
            "available_memory": fig.available,
            "effective_available_memory": fig.effective,
            "pool_bytes_per_block": fig.bpb,
            "check_memory": fig.check,
            "needed_memory": fig.needed,
            "num_blocks_before_min": fig.before_min,
            "projected_group_layer_names": [list(g.layer_names) for g in projected],
        }
        if configs is not None:
            record["config"] = config_record(configs[index], layout)
        out.append(record)
    return out


def _profile(worker: dict[str, Any], problem: golden.GoldenProblem) -> dict[str, Any]:
    """Run ``_init_minimal_kv_cache_for_profiling`` (V1 runner) without the allocation."""
    modules = iv.vllm_modules()
    registry = __import__("vllm.v1.kv_cache_spec_registry", fromlist=["x"])
    assert problem.profiling is not None
    vcfg = iv.to_vllm_config(problem.config)
    registry.KVCacheSpecRegistry.check_kv_cache_spec_registry(worker)
    builder = modules.kvp.DefaultKVCacheConfigBuilder()
    groups = modules.kvp.get_kv_cache_groups_from_builder(builder, vcfg, dict(worker))
    reqs = problem.profiling["max_num_reqs"]
    capture = problem.profiling["max_cudagraph_capture_size"]
    blocks = min(reqs, capture) or 1
    placed = builder.get_kv_cache_config_from_groups(vcfg, groups, num_blocks=blocks)
    return {
        "num_blocks_requested": blocks,
        "groups": [group_record(g) for g in groups],
        "config": config_record(placed, problem.config.kv_cache_layout.name),
    }


def _dump(data: Any) -> str:
    return json.dumps(data, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) every golden file this script owns."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--only", choices=sorted(FILES), help="one golden file")
    args = parser.parse_args(argv)
    if VERSION != golden.BASE_VERSION:
        print(
            f"vLLM {VERSION} is installed: this script writes vLLM {golden.BASE_VERSION}'s "
            "files; run scripts/golden_versions.py for other releases"
        )
        return 2
    stale = []
    for name, make in FILES.items():
        if args.only is not None and name != args.only:
            continue
        raws = [_resolve_hisparse(r) if r.get("resolve_hisparse") else r for r in make()]
        outs = []
        for raw in raws:
            if not _LAYOUT_INPUTS & set(raw["config"]):
                outs.append(run_problem(raw))
                continue
            planned, record = _resolve_layout(raw)
            outs.append(run_problem(planned) | {"layout_resolution": record})
        for suffix, data in ((".json", raws), (".out.json", outs)):
            path = args.out / f"{name}{suffix}"
            text = _dump(data)
            if args.check:
                if not path.exists() or path.read_text(encoding="utf-8") != text:
                    stale.append(path.name)
            else:
                path.write_text(text, encoding="utf-8")
        print(f"{name}: {len(raws)} problems, {sum(o['ok'] for o in outs)} ok")
    if stale:
        print(f"stale golden files: {stale}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
