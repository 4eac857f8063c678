"""Differential tests of the reference against vLLM's recorded outputs (``golden/``).

Every problem of every golden file is planned by kvref as each supported vLLM
release (:data:`kvref.versions.SUPPORTED`) and compared, field by field, with
what that release's own planning code returned (0.33.0's outputs beside the
problems, another release's in ``golden/vllm-X.Y.Z/``): the builder's groups and
bytes per block, Core's global groups, per-worker figures and final configs,
the errors vLLM raised, and the ``from_groups`` placement probes.  No vLLM is
needed.  Where the reference deliberately differs (contract.md#deliberate-differences) from vLLM the
test asserts the difference itself, so that neither side can drift silently.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from golden import (
    BASE_VERSION,
    GoldenProblem,
    UnsupportedGoldenError,
    find_golden_dir,
    iter_problem_ids,
    load_expected,
    load_problem,
    problem_from_dict,
)

from kvref.backends import AttentionBackend, get_supported_kv_cache_layouts
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import (
    ConfigError,
    ConflictingWindowError,
    GroupingError,
    HiSparseError,
    InsufficientMemoryError,
    KVRefError,
    LayoutError,
    PageSizeUnificationError,
    PartitionError,
    PlanningError,
    SpecError,
    WorkerSpecMismatchError,
)
from kvref.extra_specs import HiddenStateCacheSpec, HiSparseHotSpec, HiSparseResidentSpec
from kvref.hisparse import resolve_hisparse_specs
from kvref.placement import pool_bytes_per_block
from kvref.planning import KVCachePlan, plan_kv_cache
from kvref.profiling import plan_profiling_kv_cache
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import (
    GroupKVCacheSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    UniformTypeKVCacheSpecs,
)
from kvref.versions import SUPPORTED, VllmVersion

GOLDEN_DIR = find_golden_dir()

#: vLLM's class name for each kvref class whose name differs (none today; kept
#: so that a rename on either side is one line here, not a silent mismatch).
VLLM_CLASS_NAMES: Mapping[str, str] = {}

#: Spec fields whose kvref default differs from vLLM's: ``(class, field) ->
#: (kvref value, vLLM value)``.  The field comparison treats the pair as
#: equal; ``TestSpecDefaults`` asserts the difference on its own.
KNOWN_DEFAULT_DIFFERENCES: Mapping[tuple[str, str], tuple[Any, Any]] = {}

_DESIGN_OVERRIDE = (
    "contract.md#deliberate-differences: placement always returns exactly the "
    "requested num_blocks (vLLM's default returns num_gpu_blocks_override)"
)


# -- golden discovery (collection time: only JSON is read) ---------------------


@attrs.frozen
class Source:
    """A golden problem file as planned by one vLLM release (whose outputs it is compared to)."""

    path: Path
    version: VllmVersion

    def tag(self, name: str) -> str:
        """The test id of problem ``name``: the name, with the release unless it is 0.33.0."""
        return name if self.version == BASE_VERSION else f"{name}-v{self.version.short}"


def _collect() -> list[tuple[Source, str, dict[str, Any]]]:
    if GOLDEN_DIR is None:
        return []
    out: list[tuple[Source, str, dict[str, Any]]] = []
    outputs: dict[Source, dict[str, dict[str, Any]]] = {}
    for version in SUPPORTED:
        for path, name in iter_problem_ids(GOLDEN_DIR, version):
            source = Source(path, version)
            if source not in outputs:
                outputs[source] = {o["name"]: o for o in load_expected(path, version)}
            out.append((source, name, outputs[source][name]))
    return out


_PROBLEMS = _collect()


def _stage_error(expected: Mapping[str, Any], stage: str) -> Mapping[str, Any] | None:
    value = expected.get(stage)
    if isinstance(value, Mapping):
        error = value.get("error")
        if isinstance(error, Mapping):
            return error
    return None


def _params(select: str) -> list[Any]:
    """``pytest.param`` per problem: ``all``, ``{core,builder}_ok`` or ``{core,builder}_error``."""
    params = []
    for path, name, expected in _PROBLEMS:
        if select != "all":
            stage, _, outcome = select.partition("_")
            failed = _stage_error(expected, stage) is not None
            if failed != (outcome == "error"):
                continue
        params.append(pytest.param(path, name, id=path.tag(name)))
    return params


def _declared_partition_error(expected: Mapping[str, Any]) -> bool:
    """vLLM's builder returned a model-declared grouping that Core's partition check refused.

    The reference builder runs that check itself, so it refuses at the
    builder stage already (docs/reference.md, deliberate differences).
    """
    error = _stage_error(expected, "core")
    declared = expected.get("resolved", {}).get("supports_kv_cache_grouping", False)
    return bool(declared) and error is not None and "_check_exact_partition" in error["where"]


def _problem_output(path: Source, name: str) -> Mapping[str, Any]:
    return next(e for p, n, e in _PROBLEMS if p == path and n == name)


def _builder_params(*, ok: bool) -> list[Any]:
    params = []
    for param in _params("builder_ok" if ok else "builder_error"):
        path, name = param.values
        if ok and _declared_partition_error(_problem_output(path, name)):
            continue
        params.append(param)
    return params


def _profiling_params() -> list[Any]:
    params = []
    for path, name, expected in _PROBLEMS:
        for worker in range(len(expected.get("profiling", []))):
            params.append(pytest.param(path, name, worker, id=f"{path.tag(name)}-w{worker}"))
    return params


def _probe_params(*, override: bool) -> list[Any]:
    params = []
    for path, name, expected in _PROBLEMS:
        has_override = expected.get("resolved", {}).get("num_gpu_blocks_override") is not None
        if has_override != override or _declared_partition_error(expected):
            continue
        for index, probe in enumerate(expected.get("from_groups", [])):
            n = probe["num_blocks_requested"]
            params.append(pytest.param(path, name, index, id=f"{path.tag(name)}-n{n}"))
    return params


pytestmark = pytest.mark.skipif(
    GOLDEN_DIR is None,
    reason="golden files not found: set KVREF_GOLDEN_DIR or restore tests/data/golden",
)


# -- running kvref (cached per problem) ----------------------------------------


@functools.cache
def _problem(path: Source, name: str) -> GoldenProblem:
    return load_problem(path.path, name, path.version)


def _load(path: Source, name: str) -> GoldenProblem:
    try:
        return _problem(path, name)
    except UnsupportedGoldenError as exc:
        pytest.skip(f"{name}: {exc}")


def _load_refused(path: Source, name: str, stage: str) -> tuple[GoldenProblem, Mapping[str, Any]]:
    """The problem and the error vLLM's ``stage`` raised on it (its params select such problems)."""
    problem = _load(path, name)
    error = _stage_error(problem.expected, stage)
    assert error is not None
    return problem, error


@functools.cache
def _builder_groups(path: Source, name: str) -> list[KVCacheGroupSpec]:
    problem = _problem(path, name)
    return ReferenceKVCacheConfigBuilder().get_kv_cache_groups(problem.config, problem.merged_specs)


@functools.cache
def _plan(path: Source, name: str) -> KVCachePlan:
    problem = _problem(path, name)
    return plan_kv_cache(
        ReferenceKVCacheConfigBuilder,
        problem.config,
        list(problem.workers),
        problem.available_memory
        if isinstance(problem.available_memory, int)
        else list(problem.available_memory),
    )


# -- kvref objects seen the way the golden files show vLLM's --------------------


def vllm_class_name(spec: GroupKVCacheSpec) -> str:
    """The vLLM class name of a kvref spec."""
    name = type(spec).__name__
    return VLLM_CLASS_NAMES.get(name, name)


def _json_value(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, MultipleOf):
        return {"multiple_of": value.n}
    if isinstance(value, Fraction):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    return value


def spec_fields(spec: KVCacheSpec, golden_fields: Mapping[str, Any]) -> dict[str, Any]:
    """The golden-named fields of ``spec`` as JSON values; a field kvref lacks is ``<missing>``."""
    out: dict[str, Any] = {}
    cls = vllm_class_name(spec)
    for field in golden_fields:
        if field == "block_size":
            continue
        value = _json_value(getattr(spec, field, "<missing>"))
        known = KNOWN_DEFAULT_DIFFERENCES.get((cls, field))
        if known is not None and value == known[0] and golden_fields[field] == known[1]:
            value = known[1]
        out[field] = value
    return out


def _dedup_layer_specs(spec: UniformTypeKVCacheSpecs) -> list[tuple[list[str], KVCacheSpec]]:
    buckets: dict[KVCacheSpec, list[str]] = {}
    for name, layer_spec in spec.kv_cache_specs.items():
        buckets.setdefault(layer_spec, []).append(name)
    return [(names, s) for s, names in buckets.items()]


def spec_view(
    spec: GroupKVCacheSpec, golden: Mapping[str, Any], *, with_fields: bool
) -> dict[str, Any]:
    """``spec`` in the golden shape (class, block size, page, per-layer specs, fields)."""
    view: dict[str, Any] = {
        "class": vllm_class_name(spec),
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
    }
    if isinstance(spec, UniformTypeKVCacheSpecs):
        golden_layers = golden.get("layer_specs", [])
        view["layer_specs"] = [
            {
                "layers": names,
                "spec": spec_view(
                    s,
                    golden_layers[i]["spec"] if i < len(golden_layers) else {},
                    with_fields=with_fields,
                ),
            }
            for i, (names, s) in enumerate(_dedup_layer_specs(spec))
        ]
    elif with_fields:
        view["fields"] = spec_fields(spec, golden.get("fields", {}))
    return view


def golden_spec_view(golden: Mapping[str, Any], *, with_fields: bool) -> dict[str, Any]:
    """vLLM's spec record reduced to the keys of :func:`spec_view`."""
    view: dict[str, Any] = {
        "class": golden["class"],
        "block_size": golden["block_size"],
        "page_size_bytes": golden["page_size_bytes"],
    }
    if "layer_specs" in golden:
        view["layer_specs"] = [
            {
                "layers": entry["layers"],
                "spec": golden_spec_view(entry["spec"], with_fields=with_fields),
            }
            for entry in golden["layer_specs"]
        ]
    elif with_fields:
        view["fields"] = {k: v for k, v in golden.get("fields", {}).items() if k != "block_size"}
    return view


def group_view(
    group: KVCacheGroupSpec, golden: Mapping[str, Any], *, with_fields: bool = False
) -> dict[str, Any]:
    """A kvref group in the golden shape."""
    return {
        "layer_names": list(group.layer_names),
        "host_resident": group.host_resident,
        "is_eagle_group": group.is_eagle_group,
        "enable_kv_transfer": group.enable_kv_transfer,
        "role": group.role,
        "spec": spec_view(group.kv_cache_spec, golden.get("spec", {}), with_fields=with_fields),
    }


def golden_group_view(golden: Mapping[str, Any], *, with_fields: bool = False) -> dict[str, Any]:
    """vLLM's group record reduced to the keys of :func:`group_view`."""
    return {
        "layer_names": golden["layer_names"],
        "host_resident": golden["host_resident"],
        "is_eagle_group": golden["is_eagle_group"],
        "enable_kv_transfer": golden["enable_kv_transfer"],
        "role": golden["role"],
        "spec": golden_spec_view(golden["spec"], with_fields=with_fields),
    }


def groups_views(
    groups: Sequence[KVCacheGroupSpec], golden: Sequence[Mapping[str, Any]], *, with_fields: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(kvref, vLLM)`` views of two group lists, position by position."""
    ours = [
        group_view(g, golden[i] if i < len(golden) else {"spec": {}}, with_fields=with_fields)
        for i, g in enumerate(groups)
    ]
    theirs = [golden_group_view(g, with_fields=with_fields) for g in golden]
    return ours, theirs


def tensor_view(tensor: KVCacheTensor) -> dict[str, Any]:
    """A kvref tensor in the golden shape."""
    return {
        "size": tensor.size,
        "layers": list(tensor.layers),
        "layer_stride": tensor.layer_stride,
        "block_stride": tensor.block_stride,
        "offset": tensor.offset,
        "host_resident": tensor.host_resident,
    }


def config_view(config: KVCacheConfig) -> dict[str, Any]:
    """A kvref config's block count, tensors and group layer names, in the golden shape."""
    return {
        "num_blocks": config.num_blocks,
        "kv_cache_tensors": [tensor_view(t) for t in config.kv_cache_tensors],
        "kv_cache_groups": [list(g.layer_names) for g in config.kv_cache_groups],
    }


def golden_config_view(golden: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's config record reduced to the keys of :func:`config_view`."""
    return {
        "num_blocks": golden["num_blocks"],
        "kv_cache_tensors": [
            {
                k: t[k]
                for k in (
                    "size",
                    "layers",
                    "layer_stride",
                    "block_stride",
                    "offset",
                    "host_resident",
                )
            }
            for t in golden["kv_cache_tensors"]
        ],
        "kv_cache_groups": [g["layer_names"] for g in golden["kv_cache_groups"]],
    }


# -- vLLM errors -> kvref errors ---------------------------------------------------

#: The kvref error type expected for an error vLLM raised in function ``where``.
_ERRORS_BY_WHERE: Mapping[str, tuple[type[KVRefError], ...]] = {
    "_check_enough_kv_cache_memory": (InsufficientMemoryError,),
    "_auto_fit_max_model_len": (InsufficientMemoryError,),
    "check_kv_cache_spec_registry": (SpecError, PlanningError),
    "get_global_kv_cache_groups": (WorkerSpecMismatchError,),
    "_check_exact_partition": (PartitionError,),
    "validate_kv_cache_layout": (LayoutError,),
    "unify_kv_cache_spec_page_size": (PageSizeUnificationError,),
    "_promote_local_kv_cache_specs": (GroupingError,),
    "merge_window_sizes": (ConflictingWindowError,),
    # HiSparse (v1/hisparse): every refusal is a HiSparseError.
    "get_hisparse_host_pool_bytes": (HiSparseError,),
    "create_hisparse_layout": (HiSparseError,),
    "_partition_hisparse_specs": (HiSparseError,),
    "_lay_out_hisparse_groups": (HiSparseError,),
    "append_hot_group": (HiSparseError,),
    "from_vllm_config": (HiSparseError,),
    "_build_hisparse_kv_cache_tensors": (HiSparseError,),
    # DefaultKVCacheConfigBuilder: a model-declared grouping with HiSparse.
    "get_kv_cache_groups": (ConfigError,),
}

_NEEDED = re.compile(
    r"max seq len \((?P<len>\d+)\), \((?P<needed>[\d.]+) GiB KV cache is needed.*?"
    r"available KV cache memory \((?P<available>[\d.]+) GiB\)",
    re.DOTALL,
)
_ESTIMATED = re.compile(r"estimated maximum model length is (?P<est>\d+)")
_LAYER = re.compile(r"for layer (?P<layer>\S+):")


def expected_error_types(error: Mapping[str, Any]) -> tuple[type[KVRefError], ...]:
    """The kvref error types matching vLLM's error record (``KVRefError`` if unmapped)."""
    where = str(error.get("where", ""))
    for function, types in _ERRORS_BY_WHERE.items():
        if where.endswith(f" in {function}"):
            return types
    return (KVRefError,)


# -- tests --------------------------------------------------------------------------


class TestLoader:
    """``golden.load_problem`` and ``golden.problem_from_dict``."""

    @pytest.mark.parametrize(("path", "name"), _params("all"))
    def test_every_problem_loads_with_its_layers_in_order(self, path: Source, name: str) -> None:
        """Every golden problem converts to kvref specs, keeping each worker's layer order."""
        problem = _load(path, name)
        raw = next(r for r in _read_raw(path) if r["name"] == name)
        assert [list(w) for w in problem.workers] == [list(w) for w in raw["workers"]]
        assert problem.expected["name"] == name

    @pytest.mark.parametrize(
        ("path", "name"),
        [
            p
            for p in _params("all")
            if "max_decode_query_len" in _problem_output(*p.values)["resolved"]
        ],
    )
    def test_decode_query_length_is_vllms(self, path: Source, name: str) -> None:
        """The decode query length kvref derives is the one vLLM derived (a draft model's slot)."""
        problem = _load(path, name)
        expected = problem.expected["resolved"]["max_decode_query_len"]
        assert problem.config.derived_max_decode_query_len == expected

    @pytest.mark.parametrize(("path", "name"), _params("all"))
    def test_config_is_what_vllm_resolved(self, path: Source, name: str) -> None:
        """The planning config carries vLLM's resolved lengths, batches, layout and sizes."""
        problem = _load(path, name)
        resolved = problem.expected["resolved"]
        config = problem.config
        assert config.max_model_len == resolved["max_model_len"]
        assert config.auto_fit_max_model_len == (resolved["original_max_model_len"] == -1)
        assert config.max_in_flight_tokens == resolved["max_in_flight_tokens"]
        assert config.encoder_input_tokens == resolved["max_num_encoder_input_tokens"]
        assert config.num_gpu_blocks_override == resolved["num_gpu_blocks_override"]
        assert config.kv_cache_layout.name == problem.expected["layout"]["resolved"]
        assert config.pipeline_parallel_size == resolved["pipeline_parallel_size"]
        assert config.tensor_parallel_size == resolved["tensor_parallel_size"]

    def test_template_overrides_and_conversions(self) -> None:
        """Template overrides, ``"1/4"``, ``multiple_of`` and dtype aliases become kvref values."""
        raw = {
            "name": "t",
            "config": {"block_size": 32},
            "spec_templates": {
                "m": {"kind": "mla", "num_kv_heads": 1, "head_size": 576, "dtype": "bf16"}
            },
            "workers": [
                {
                    "a": "m",
                    "b": {"template": "m", "tokens_per_state": "1/4"},
                    "c": {"template": "m", "block_stride_alignment": {"multiple_of": 16}},
                }
            ],
            "available_memory": [1 << 30],
        }
        problem = problem_from_dict(raw)
        a, b, c = (problem.workers[0][n] for n in "abc")
        assert isinstance(a, MLAAttentionSpec)
        assert a.dtype == torch.bfloat16
        assert a.block_size == 32
        assert isinstance(b, MLAAttentionSpec)
        assert b.tokens_per_state == Fraction(1, 4)
        assert c.block_stride_alignment == MultipleOf(16)
        assert problem.available_memory == (1 << 30,)

    @pytest.mark.parametrize(
        ("config", "block_size"),
        [
            ({"block_size": 16, "max_model_len": 4096}, 4096),
            ({"block_size": 16, "max_model_len": 4096, "mamba_cache_mode": "align"}, 16),
            ({"block_size": 16, "max_model_len": 4096, "mamba_block_size": 64}, 64),
        ],
    )
    def test_mamba_block_size_defaults(self, config: dict[str, Any], block_size: int) -> None:
        """Mamba blocks: ``mamba_block_size``, else ``block_size`` (align mode), else the length."""
        raw = {
            "name": "m",
            "config": config,
            "workers": [{"m0": {"kind": "mamba", "shapes": [[4, 8]], "dtypes": ["float32"]}}],
            "available_memory": 1 << 30,
        }
        spec = problem_from_dict(raw).workers[0]["m0"]
        assert isinstance(spec, MambaSpec)
        assert spec.block_size == block_size
        assert spec.mamba_cache_mode == config.get("mamba_cache_mode", "none")

    def test_auto_fit_without_output_uses_derived_length(self) -> None:
        """``max_model_len: -1`` means auto-fit up to ``derived_max_model_len``."""
        raw = {
            "name": "a",
            "config": {"max_model_len": -1, "derived_max_model_len": 65536},
            "workers": [
                {
                    "f": {
                        "kind": "full_attention",
                        "num_kv_heads": 1,
                        "head_size": 8,
                        "dtype": "fp16",
                    }
                }
            ],
            "available_memory": 1 << 30,
        }
        config = problem_from_dict(raw).config
        assert config.auto_fit_max_model_len
        assert config.max_model_len == 65536

    @pytest.mark.parametrize("kind", ["hidden_state", "HiddenStateCacheSpec"])
    def test_hidden_state_kind_loads(self, kind: str) -> None:
        """``hidden_state`` (formerly unsupported) loads as a ``HiddenStateCacheSpec``."""
        raw = {
            "name": "u",
            "workers": [{"x": {"kind": kind, "num_kv_heads": 1, "head_size": 8, "dtype": "fp16"}}],
            "available_memory": 1 << 30,
        }
        spec = problem_from_dict(raw).workers[0]["x"]
        assert type(spec) is HiddenStateCacheSpec
        assert spec.page_size_bytes == 16 * 8 * 2

    def test_unknown_field_is_an_error(self) -> None:
        """A field the spec class does not have is a format error, as in vLLM's loader."""
        raw = {
            "name": "u",
            "workers": [
                {
                    "x": {
                        "kind": "full_attention",
                        "num_kv_heads": 1,
                        "head_size": 8,
                        "dtype": "fp16",
                        "bogus": 1,
                    }
                }
            ],
            "available_memory": 1 << 30,
        }
        with pytest.raises(ValueError, match="bogus"):
            problem_from_dict(raw)


@functools.cache
def _read_raw(path: Source) -> list[dict[str, Any]]:
    with path.path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, list) else [data]


class TestSpecDefaults:
    """kvref spec defaults against vLLM's, where the golden files show vLLM's."""

    def test_mla_cache_role_default_is_vllms(self) -> None:
        """An MLA spec built without ``cache_role`` has vLLM's default, SPARSE."""
        spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")
        assert spec.cache_role == "SPARSE"


class TestBuilderGroups:
    """``ReferenceKVCacheConfigBuilder.get_kv_cache_groups`` on all workers' specs."""

    @pytest.mark.parametrize(
        "with_fields", [pytest.param(False, id="groups"), pytest.param(True, id="spec-fields")]
    )
    @pytest.mark.parametrize(("path", "name"), _builder_params(ok=True))
    def test_groups_match_vllm(self, path: Source, name: str, with_fields: bool) -> None:
        """Layer names (in order), flags, spec class, block size, page and per-layer specs match.

        With ``with_fields``, also every dataclass field vLLM reports for a
        group's (per-layer) spec has kvref's value.
        """
        problem = _load(path, name)
        golden = problem.expected["builder"]["groups"]
        ours, theirs = groups_views(_builder_groups(path, name), golden, with_fields=with_fields)
        assert ours == theirs

    @pytest.mark.parametrize(("path", "name"), _builder_params(ok=True))
    def test_pool_bytes_per_block_matches_vllm(self, path: Source, name: str) -> None:
        """``pool_bytes_per_block`` of the builder's groups is vLLM's ``_pool_bytes_per_block``."""
        problem = _load(path, name)
        core_error = _stage_error(problem.expected, "core")
        if core_error is not None and LayoutError in expected_error_types(core_error):
            # Layer-outer pages the layout cannot express: the reference's common
            # stride (deliberate difference 3) makes its figure differ, unused.
            pytest.skip(f"{name}: the layout cannot express these groups")
        groups = _builder_groups(path, name)
        expected = problem.expected["builder"]["pool_bytes_per_block"]
        assert pool_bytes_per_block(problem.config, groups) == expected


class TestCorePlan:
    """``plan_kv_cache``: Core's cross-worker flow, for problems vLLM planned."""

    @pytest.mark.parametrize(("path", "name"), _params("core_ok"))
    def test_global_groups_match_vllm(self, path: Source, name: str) -> None:
        """The global groups (layers, flags, specs and fields) are vLLM's."""
        problem = _load(path, name)
        golden = problem.expected["core"]["global_groups"]
        ours, theirs = groups_views(_plan(path, name).global_groups, golden, with_fields=True)
        assert ours == theirs

    @pytest.mark.parametrize(("path", "name"), _params("core_ok"))
    def test_projected_groups_match_vllm(self, path: Source, name: str) -> None:
        """Each worker's projection of the global groups names vLLM's layers."""
        problem = _load(path, name)
        plan = _plan(path, name)
        ours = [[list(g.layer_names) for g in c.kv_cache_groups] for c in plan.configs]
        theirs = [w["projected_group_layer_names"] for w in problem.expected["core"]["workers"]]
        assert ours == theirs

    @pytest.mark.parametrize(("path", "name"), _params("core_ok"))
    def test_worker_figures_match_vllm(self, path: Source, name: str) -> None:
        """Per worker: bytes per block, effective and check memory, need, and own block count."""
        problem = _load(path, name)
        keys = (
            "available_memory",
            "effective_available_memory",
            "pool_bytes_per_block",
            "check_memory",
            "needed_memory",
            "num_blocks_before_min",
        )
        ours = [{k: getattr(w, k) for k in keys} for w in _plan(path, name).workers]
        theirs = [{k: w[k] for k in keys} for w in problem.expected["core"]["workers"]]
        assert ours == theirs

    @pytest.mark.parametrize(("path", "name"), _params("core_ok"))
    def test_worker_pool_bytes_per_block_from_projected_groups(
        self, path: Source, name: str
    ) -> None:
        """``pool_bytes_per_block`` of each worker's projected groups is vLLM's probe."""
        problem = _load(path, name)
        ours = [
            pool_bytes_per_block(problem.config, c.kv_cache_groups)
            for c in _plan(path, name).configs
        ]
        theirs = [w["pool_bytes_per_block"] for w in problem.expected["core"]["workers"]]
        assert ours == theirs

    @pytest.mark.parametrize(("path", "name"), _params("core_ok"))
    def test_final_configs_match_vllm(self, path: Source, name: str) -> None:
        """Each worker's block count, tensors (size, layers, strides, offset) and groups match."""
        problem = _load(path, name)
        ours = [config_view(c) for c in _plan(path, name).configs]
        theirs = [golden_config_view(w["config"]) for w in problem.expected["core"]["workers"]]
        assert ours == theirs

    @pytest.mark.parametrize(("path", "name"), _params("core_ok"))
    def test_config_metadata_matches_vllm(self, path: Source, name: str) -> None:
        """Each config's layout name, TP replicas, retention interval and zeroing are vLLM's.

        ``needs_kv_cache_zeroing`` where the output records it (those made by
        this repository's scripts).
        """
        problem = _load(path, name)
        keys = ["kv_cache_layout", "kv_tp_replicas", "prefix_cache_retention_interval"]
        if all(
            "needs_kv_cache_zeroing" in w["config"] for w in problem.expected["core"]["workers"]
        ):
            keys.append("needs_kv_cache_zeroing")
        ours = [
            {
                "kv_cache_layout": c.kv_cache_layout.name if c.kv_cache_layout else None,
                "kv_tp_replicas": c.kv_tp_replicas,
                "prefix_cache_retention_interval": c.prefix_cache_retention_interval,
                "needs_kv_cache_zeroing": c.needs_kv_cache_zeroing,
            }
            for c in _plan(path, name).configs
        ]
        ours = [{k: v for k, v in config.items() if k in keys} for config in ours]
        theirs = [{k: w["config"][k] for k in keys} for w in problem.expected["core"]["workers"]]
        assert ours == theirs

    @pytest.mark.parametrize(("path", "name"), _params("core_ok"))
    def test_num_blocks_and_max_model_len_match_vllm(self, path: Source, name: str) -> None:
        """The agreed block count and the (auto-fitted) ``max_model_len`` are vLLM's."""
        problem = _load(path, name)
        plan = _plan(path, name)
        core = problem.expected["core"]
        assert (plan.num_blocks, plan.max_model_len) == (
            core["num_blocks"],
            core["max_model_len_after"],
        )


class TestCoreErrors:
    """``plan_kv_cache`` on problems where vLLM's Core raised."""

    @pytest.mark.parametrize(("path", "name"), _params("core_error"))
    def test_raises_the_matching_kvref_error(self, path: Source, name: str) -> None:
        """kvref raises the kvref error type that corresponds to vLLM's error."""
        _, error = _load_refused(path, name, "core")
        with pytest.raises(expected_error_types(error)) as info:
            _plan(path, name)
        layer = _LAYER.search(error["message"])
        if layer is not None:
            assert layer["layer"] in str(info.value)

    @pytest.mark.parametrize(("path", "name"), _params("core_error"))
    def test_insufficient_memory_numbers_match_vllm(self, path: Source, name: str) -> None:
        """Needed and available GiB and the estimated length are vLLM's numbers."""
        _, error = _load_refused(path, name, "core")
        match = _NEEDED.search(error["message"])
        if match is None:
            pytest.skip(f"{name}: vLLM's error is not an insufficient-memory error")
        estimated = _ESTIMATED.search(error["message"])
        with pytest.raises(InsufficientMemoryError) as info:
            _plan(path, name)
        ours = {
            "max_model_len": info.value.max_model_len,
            "needed_gib": info.value.needed_gib,
            "available_gib": info.value.available_gib,
            "estimated_max_model_len": info.value.estimated_max_model_len,
        }
        theirs = {
            "max_model_len": int(match["len"]),
            "needed_gib": float(match["needed"]),
            "available_gib": float(match["available"]),
            "estimated_max_model_len": int(estimated["est"]) if estimated else 0,
        }
        assert ours == theirs

    @pytest.mark.parametrize(("path", "name"), _params("core_error"))
    def test_vllm_figures_before_the_error_match(self, path: Source, name: str) -> None:
        """The figures vLLM computed before raising agree with kvref's for a fitting budget."""
        problem = _load(path, name)
        workers = problem.expected["core"].get("workers")
        if not workers:
            pytest.skip(f"{name}: vLLM raised before computing per-worker figures")
        error = _stage_error(problem.expected, "core")
        if error is not None and InsufficientMemoryError not in expected_error_types(error):
            pytest.skip(f"{name}: vLLM's error does not depend on the memory budget")
        if problem.config.auto_fit_max_model_len:
            pytest.skip(f"{name}: with auto-fit the need depends on the budget")
        # kvref raises where vLLM did, so recompute its figures with the need met.
        budget = [
            max(w["needed_memory"] + w["pool_bytes_per_block"], w["available_memory"])
            for w in workers
        ]
        plan = plan_kv_cache(
            ReferenceKVCacheConfigBuilder, problem.config, list(problem.workers), budget
        )
        ours = [(w.pool_bytes_per_block, w.needed_memory) for w in plan.workers]
        theirs = [(w["pool_bytes_per_block"], w["needed_memory"]) for w in workers]
        assert ours == theirs


class TestFromGroups:
    """``get_kv_cache_config_from_groups`` on the builder's groups for vLLM's probe counts."""

    @pytest.mark.parametrize(("path", "name", "index"), _probe_params(override=False))
    def test_probe_matches_vllm(self, path: Source, name: str, index: int) -> None:
        """Without an override the placement for ``n`` blocks is vLLM's, tensor by tensor."""
        problem = _load(path, name)
        probe = problem.expected["from_groups"][index]
        n = probe["num_blocks_requested"]
        place = functools.partial(
            ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups,
            problem.config,
            _builder_groups(path, name),
            n,
        )
        if "error" in probe:  # a HiSparse host pool or layout refusal
            with pytest.raises(expected_error_types(probe["error"])):
                place()
            return
        assert config_view(place()) == golden_config_view(probe["config"])

    @pytest.mark.parametrize(("path", "name", "index"), _probe_params(override=True))
    def test_override_probe_returns_requested_blocks(
        self, path: Source, name: str, index: int
    ) -> None:
        """With an override kvref places exactly ``n`` blocks where vLLM places the override."""
        problem = _load(path, name)
        probe = problem.expected["from_groups"][index]
        n = probe["num_blocks_requested"]
        override = problem.config.num_gpu_blocks_override
        assert override is not None
        groups = _builder_groups(path, name)
        bpb = problem.expected["builder"]["pool_bytes_per_block"]
        config = ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(
            problem.config, groups, n
        )
        golden = probe["config"]
        # vLLM's side of the deliberate difference (contract.md#deliberate-differences): it returns
        # the override.
        assert golden["num_blocks"] == override, _DESIGN_OVERRIDE
        assert config.num_blocks == n, _DESIGN_OVERRIDE
        assert {t.size for t in config.kv_cache_tensors} == {n * bpb}
        if n == override:
            assert config_view(config) == golden_config_view(golden)
            return
        assert config.num_blocks != golden["num_blocks"], _DESIGN_OVERRIDE
        # Everything but the block-count-dependent figures is vLLM's; layer-outer
        # layer strides scale linearly with the block count (contract.md#placement-backing).
        scale = Fraction(n, override)
        expected = golden_config_view(golden)
        for tensor in expected["kv_cache_tensors"]:
            tensor["size"] = n * bpb
            if not problem.config.kv_cache_layout.is_block_outermost:
                tensor["layer_stride"] = int(tensor["layer_stride"] * scale)
        expected["num_blocks"] = n
        assert config_view(config) == expected


class TestBuilderErrors:
    """``ReferenceKVCacheConfigBuilder.get_kv_cache_groups`` where vLLM's builder raised."""

    @pytest.mark.parametrize(("path", "name"), _params("builder_error"))
    def test_raises_the_matching_kvref_error(self, path: Source, name: str) -> None:
        """kvref's builder raises the kvref error type matching vLLM's."""
        problem, error = _load_refused(path, name, "builder")
        with pytest.raises(expected_error_types(error)):
            ReferenceKVCacheConfigBuilder().get_kv_cache_groups(
                problem.config, problem.merged_specs
            )

    @pytest.mark.parametrize(
        ("path", "name"),
        [p for p in _params("all") if _declared_partition_error(_problem_output(*p.values))],
    )
    def test_declared_partition_checked_by_the_builder(self, path: Source, name: str) -> None:
        """Deliberate difference: a bad declared grouping fails in the builder, not in Core."""
        problem = _load(path, name)
        assert "groups" in problem.expected["builder"]  # vLLM's builder returned it
        with pytest.raises(PartitionError):
            ReferenceKVCacheConfigBuilder().get_kv_cache_groups(
                problem.config, problem.merged_specs
            )


class TestHostPool:
    """HiSparse host-pool figures of every planned config."""

    @pytest.mark.parametrize(("path", "name"), _params("core_ok"))
    def test_host_figures_match_vllm(self, path: Source, name: str) -> None:
        """Host blocks, host block stride and pool sharing are vLLM's."""
        problem = _load(path, name)
        ours = [
            (c.host_num_blocks, c.host_block_stride, c.shared_host_pool)
            for c in _plan(path, name).configs
        ]
        theirs = [
            (
                w["config"].get("hisparse_host_num_blocks"),
                w["config"].get("hisparse_host_block_stride"),
                bool(w["config"].get("hisparse_shared_host_pool")),
            )
            for w in problem.expected["core"]["workers"]
        ]
        assert ours == theirs


class TestHiSparseSpecs:
    """kvref's ``resolve_hisparse_specs`` derives the resident and hot layers vLLM derived."""

    @pytest.mark.parametrize(("path", "name"), _builder_params(ok=True))
    def test_derived_layers_match_vllm(self, path: Source, name: str) -> None:
        """Dropping the derived layers and resolving them again gives the golden workers."""
        problem = _load(path, name)
        if problem.config.hisparse is None:
            pytest.skip(f"{name}: HiSparse is off")
        for worker in problem.workers:
            base = {
                n: s
                for n, s in worker.items()
                if not isinstance(s, (HiSparseHotSpec, HiSparseResidentSpec))
            }
            assert resolve_hisparse_specs(problem.config, base) == dict(worker)


class TestProfiling:
    """``plan_profiling_kv_cache`` on one worker's specs, against vLLM's profiling path."""

    @pytest.mark.parametrize(("path", "name", "worker"), _profiling_params())
    def test_profiling_matches_vllm(self, path: Source, name: str, worker: int) -> None:
        """Groups (with fields), the block count asked for and the placement are vLLM's."""
        problem = _load(path, name)
        golden = problem.expected["profiling"][worker]
        assert problem.profiling is not None
        run = functools.partial(
            plan_profiling_kv_cache,
            ReferenceKVCacheConfigBuilder,
            problem.config,
            problem.workers[worker],
            max_num_reqs=problem.profiling["max_num_reqs"],
            max_cudagraph_capture_size=problem.profiling["max_cudagraph_capture_size"],
        )
        if "error" in golden:
            with pytest.raises(expected_error_types(golden["error"])):
                run()
            return
        plan = run()
        ours, theirs = groups_views(plan.groups, golden["groups"], with_fields=True)
        assert ours == theirs
        assert plan.num_blocks_requested == golden["num_blocks_requested"]
        assert config_view(plan.config) == golden_config_view(golden["config"])


# -- layout resolution (golden problems that give no layout) -----------------------


def _layout_params() -> list[Any]:
    return [
        pytest.param(path, name, id=path.tag(name))
        for path, name, expected in _PROBLEMS
        if "layout_resolution" in expected
    ]


def _golden_backend(desc: Mapping[str, Any]) -> AttentionBackend:
    sizes = [
        MultipleOf(s["multiple_of"]) if isinstance(s, Mapping) else s
        for s in desc.get("supported_kernel_block_sizes", [{"multiple_of": 1}])
    ]
    return AttentionBackend(
        name=desc["name"],
        layers=desc.get("layers", ()),
        supported_kv_cache_layouts=desc.get("supported_kv_cache_layouts"),
        supported_kernel_block_sizes=sizes,
    )


@functools.cache
def _unresolved_config(path: Source, name: str) -> PlanningConfig:
    """The problem's config as its JSON gives it: no layout, and what resolution reads."""
    raw = next(r for r in _read_raw(path) if r["name"] == name)["config"]
    given = _problem(path, name).config
    fields = {
        a.name: getattr(given, a.name)
        for a in attrs.fields(PlanningConfig)
        if a.init and a.name != "kv_cache_layout"
    }
    fields["attention_backends"] = tuple(
        _golden_backend(d) for d in raw.get("attention_backends", [])
    )
    fields["kv_connector_layout"] = raw.get("kv_connector_layout")
    fields["env_kv_cache_layout"] = raw.get("env_kv_cache_layout")
    return PlanningConfig(**fields)


class TestLayoutResolution:
    """kvref resolves the layout itself, from the same description vLLM resolved from."""

    @pytest.mark.parametrize(("path", "name"), _layout_params())
    def test_config_leaves_the_layout_to_planning(self, path: Source, name: str) -> None:
        """A config that gives no layout but describes resolution's inputs resolves in planning."""
        assert _unresolved_config(path, name).resolves_kv_cache_layout

    @pytest.mark.parametrize(("path", "name"), _layout_params())
    def test_worker_reports_match_vllm(self, path: Source, name: str) -> None:
        """Each worker's supported layouts, most preferred first, are what vLLM's worker reports."""
        problem, config = _load(path, name), _unresolved_config(path, name)
        ours = [
            [m.name for m in get_supported_kv_cache_layouts(config.backends_of(w))]
            for w in problem.workers
        ]
        assert ours == problem.expected["layout_resolution"]["supported_layouts"]

    @pytest.mark.parametrize(("path", "name"), _layout_params())
    def test_resolved_layout_matches_vllm(self, path: Source, name: str) -> None:
        """The layout resolved from the specs is vLLM's; it warns if vLLM drops the connector's."""
        problem, config = _load(path, name), _unresolved_config(path, name)
        expected = problem.expected["layout_resolution"]["layout"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resolved = config.with_resolved_layout(problem.workers)
        assert resolved.kv_cache_layout.name == expected
        assert not resolved.resolves_kv_cache_layout
        connector = config.kv_connector_layout
        dropped = connector is not None and config.env_kv_cache_layout is None
        dropped = dropped and connector.name != expected
        assert bool(caught) == dropped

    @pytest.mark.parametrize(("path", "name"), _layout_params())
    def test_plan_matches_vllm(self, path: Source, name: str) -> None:
        """Planning the unresolved config gives vLLM's configs: layout, blocks, tensors, groups."""
        problem, config = _load(path, name), _unresolved_config(path, name)
        memory = problem.available_memory
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the dropped connector layout, asserted above
            plan = plan_kv_cache(
                None,
                config,
                list(problem.workers),
                memory if isinstance(memory, int) else list(memory),
            )
        core = problem.expected["core"]
        assert [config_view(c) for c in plan.configs] == [
            golden_config_view(w["config"]) for w in core["workers"]
        ]
        assert [c.kv_cache_layout.name if c.kv_cache_layout else None for c in plan.configs] == [
            w["config"]["kv_cache_layout"] for w in core["workers"]
        ]
        assert plan.num_blocks == core["num_blocks"]

    def test_the_hisparse_connector_case_is_golden(self) -> None:
        """The issue's case is among the problems: HiSparse, no layout, the connector's BLHNC."""
        names = {param.values[1] for param in _layout_params()}
        if GOLDEN_DIR is None:
            pytest.skip("no golden directory")
        assert "hisparse_connector_layout" in names
