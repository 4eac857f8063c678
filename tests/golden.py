"""Load golden planning problems (``golden/*.json``) as kvref objects, per vLLM release.

A golden input file holds one planning problem or a list of them; the file
next to it, ``NAME.out.json``, holds what vLLM 0.33.0's own planning code
returned, and ``vllm-X.Y.Z/NAME.out.json`` what release X.Y.Z's returned
(see ``golden/README.md``).  Problems only a later release can express live
in its directory, ``vllm-X.Y.Z/NAME.json``, outputs beside them.  Every
problem is loaded for one release (``version``, default 0.33.0, whose
outputs the top-level files are): its config plans as that release and its
expected output is that release's.  The loader builds, per problem, the
:class:`~kvref.PlanningConfig` vLLM effectively planned with (read from the
output's ``resolved`` section, so that defaults vLLM derives, such as the
auto-fit upper bound or the batches in flight, are vLLM's and not guesses),
one ``layer -> spec`` mapping per worker, and the available memory.

The golden directory is found through ``KVREF_GOLDEN_DIR``, else the copy
of the project's shared golden files in ``tests/data/golden``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs

from kvref.config import PlanningConfig
from kvref.errors import KVRefError
from kvref.extra_specs import HiddenStateCacheSpec, HiSparseHotSpec, HiSparseResidentSpec
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheGroupSpec
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    GroupKVCacheSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvref.versions import V0_33, VllmVersion

__all__ = [
    "GoldenFormatError",
    "GoldenProblem",
    "ListedGrouping",
    "UnsupportedGoldenError",
    "BASE_VERSION",
    "expected_path",
    "find_golden_dir",
    "golden_input_files",
    "iter_problem_ids",
    "load_expected",
    "load_problem",
    "load_problems",
    "load_script",
    "problem_from_dict",
    "version_dir",
]

#: The release whose outputs the top-level ``NAME.out.json`` files are.
BASE_VERSION = V0_33

#: kvref's spec class for each golden ``kind``.
_KIND_CLASSES: Mapping[str, type[KVCacheSpec]] = {
    "full_attention": FullAttentionSpec,
    "sliding_window": SlidingWindowSpec,
    "chunked_local": ChunkedLocalAttentionSpec,
    "mla": MLAAttentionSpec,
    "sliding_window_mla": SlidingWindowMLASpec,
    "mamba": MambaSpec,
    "cross_attention": CrossAttentionSpec,
    "encoder_only": EncoderOnlyAttentionSpec,
    "circular_buffer": CircularBufferSpec,
    "sink_full_attention": SinkFullAttentionSpec,
    "rswa": RSWASpec,
    "hidden_state": HiddenStateCacheSpec,
    "hisparse_hot": HiSparseHotSpec,
    "hisparse_resident": HiSparseResidentSpec,
}

#: kvref's spec class for each golden ``kind`` and for each vLLM class name
#: (kvref's classes bear vLLM's names).
SPEC_KINDS: Mapping[str, type[KVCacheSpec]] = {
    **_KIND_CLASSES,
    **{cls.__name__: cls for cls in _KIND_CLASSES.values()},
}

#: Golden kinds kvref deliberately does not implement (none since hidden-state
#: and HiSparse specs were added).
UNSUPPORTED_KINDS: frozenset[str] = frozenset()

#: README "Input" defaults, used only when no ``.out.json`` is available.
_CONFIG_DEFAULTS: Mapping[str, Any] = {
    "block_size": 16,
    "max_model_len": 8192,
    "derived_max_model_len": 131072,
    "max_num_batched_tokens": 2048,
    "max_num_encoder_input_tokens": None,
    "num_gpu_blocks_override": None,
    "disable_hybrid_kv_cache_manager": False,
    "kv_cache_layout": None,
    "async_scheduling": None,
    "pipeline_parallel_size": 1,
    "tensor_parallel_size": 1,
    "decode_context_parallel_size": 1,
    "mamba_cache_mode": "none",
    "mamba_block_size": None,
    "prefix_cache_retention_interval": 0,
    "hisparse": None,
    "host_pool_bytes": None,
    "model_grouping": None,
}

#: The probes vLLM's oracle runs when a problem names none (its outputs list them).
DEFAULT_NUM_BLOCKS_PROBES: tuple[int, ...] = (1, 7)


class GoldenFormatError(ValueError):
    """A golden file does not follow ``golden/README.md``."""


class UnsupportedGoldenError(Exception):
    """The problem uses a spec kind or layout kvref deliberately does not implement."""


@attrs.frozen(kw_only=True)
class GoldenProblem:
    """One golden planning problem as kvref objects, with vLLM's output for it.

    Attributes:
        name: the problem's name.
        source: the input file it came from.
        config: the planning config vLLM effectively used.
        workers: one ``layer -> spec`` mapping per worker, in the file's layer order.
        available_memory: bytes, one int for every worker or one per worker.
        num_blocks_probes: the block counts of the ``from_groups`` probes.
        expected: vLLM's output for this problem (``{}`` when there is none).
        profiling: ``max_num_reqs`` and ``max_cudagraph_capture_size`` of the
            profiling path, when the problem exercises it.
    """

    name: str
    source: Path
    config: PlanningConfig
    workers: tuple[Mapping[str, KVCacheSpec], ...]
    available_memory: int | tuple[int, ...]
    num_blocks_probes: tuple[int, ...]
    expected: Mapping[str, Any] = attrs.field(factory=dict)
    profiling: Mapping[str, int] | None = None

    @property
    def merged_specs(self) -> dict[str, KVCacheSpec]:
        """All workers' specs merged by layer name, in first-seen order (Core's merge)."""
        merged: dict[str, KVCacheSpec] = {}
        for worker in self.workers:
            for name, spec in worker.items():
                merged.setdefault(name, spec)
        return merged

    def memory_of(self, worker: int) -> int:
        """Available bytes of ``worker``."""
        if isinstance(self.available_memory, int):
            return self.available_memory
        return self.available_memory[worker]


# -- locating files -----------------------------------------------------------


def find_golden_dir() -> Path | None:
    """The golden directory: ``$KVREF_GOLDEN_DIR``, else the copy in ``tests/data/golden``."""
    env = os.environ.get("KVREF_GOLDEN_DIR")
    if env:
        path = Path(env)
        return path if path.is_dir() else None
    copy = Path(__file__).resolve().parent / "data" / "golden"
    return copy if copy.is_dir() else None


def load_script(name: str) -> Any:
    """The golden files' generator ``scripts/NAME.py``, imported as the module ``NAME``.

    The module is registered in ``sys.modules`` before it runs, as an import would.
    """
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def version_dir(directory: Path, version: VllmVersion) -> Path:
    """Where ``version``'s outputs (and its own problems) live: ``directory/vllm-X.Y.Z``."""
    return directory / f"vllm-{version}"


def _inputs(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.json") if not p.name.endswith(".out.json"))


def golden_input_files(directory: Path, version: VllmVersion = BASE_VERSION) -> list[Path]:
    """The problem files planned as ``version``: the top-level ones, then the release's own."""
    own = version_dir(directory, version)
    return _inputs(directory) + (_inputs(own) if own.is_dir() else [])


def expected_path(path: Path, version: VllmVersion = BASE_VERSION) -> Path:
    """``version``'s output of the problem file ``path``.

    ``NAME.out.json`` beside ``NAME.json`` for :data:`BASE_VERSION` and for a
    release's own problems, else ``vllm-X.Y.Z/NAME.out.json``.
    """
    name = path.name.removesuffix(".json") + ".out.json"
    if version == BASE_VERSION or path.parent.name.startswith("vllm-"):
        return path.with_name(name)
    return version_dir(path.parent, version) / name


def _read_json_list(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    items = data if isinstance(data, list) else [data]
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise GoldenFormatError(f"{path}: every problem must be an object with a name")
    return items


def load_expected(path: str | Path, version: VllmVersion = BASE_VERSION) -> list[dict[str, Any]]:
    """vLLM's outputs from ``NAME.out.json`` (or ``version``'s output of ``NAME.json``).

    The file holds one output or a list of them; the result is always a list.
    """
    path = Path(path)
    if not path.name.endswith(".out.json"):
        path = expected_path(path, version)
    return _read_json_list(path)


def iter_problem_ids(
    directory: Path, version: VllmVersion = BASE_VERSION
) -> Iterator[tuple[Path, str]]:
    """``(input file, problem name)`` for every problem planned as ``version``."""
    for path in golden_input_files(directory, version):
        for raw in _read_json_list(path):
            yield path, raw["name"]


# -- conversion ---------------------------------------------------------------


def _convert_value(field: str, value: Any) -> Any:
    if field == "tokens_per_state" and isinstance(value, str):
        try:
            return Fraction(value)
        except ValueError as exc:
            raise GoldenFormatError(f"tokens_per_state={value!r} is not an int or 'p/q'") from exc
    if field == "block_stride_alignment" and isinstance(value, Mapping):
        if set(value) != {"multiple_of"}:
            raise GoldenFormatError(
                f"block_stride_alignment={value!r} must be an int or {{'multiple_of': n}}"
            )
        return MultipleOf(value["multiple_of"])
    return value


def _resolve_entry(
    entry: Any, templates: Mapping[str, Any], layer: str, depth: int = 0
) -> dict[str, Any]:
    """The full field dict of a worker entry: template name, template + overrides, or inline."""
    if depth > len(templates) + 1:
        raise GoldenFormatError(f"layer {layer!r}: templates refer to each other in a cycle")
    if isinstance(entry, str):
        if entry not in templates:
            raise GoldenFormatError(f"layer {layer!r}: unknown spec template {entry!r}")
        return _resolve_entry(templates[entry], templates, layer, depth + 1)
    if not isinstance(entry, Mapping):
        raise GoldenFormatError(f"layer {layer!r}: spec {entry!r} is not a name or an object")
    fields = dict(entry)
    base_name = fields.pop("template", None)
    if base_name is None:
        return fields
    base = _resolve_entry(base_name, templates, layer, depth + 1)
    base.update(fields)
    return base


def _build_spec(layer: str, fields: dict[str, Any], settings: Mapping[str, Any]) -> KVCacheSpec:
    """A kvref spec from a resolved field dict, applying README "Defaults"."""
    fields = dict(fields)
    kind = fields.pop("kind", None)
    if not isinstance(kind, str):
        raise GoldenFormatError(f"layer {layer!r}: spec has no kind: {fields!r}")
    if kind in UNSUPPORTED_KINDS:
        raise UnsupportedGoldenError(f"layer {layer!r} has kind {kind!r}, which kvref omits")
    cls = SPEC_KINDS.get(kind)
    if cls is None:
        raise GoldenFormatError(f"layer {layer!r}: unknown spec kind {kind!r}")
    if cls is MambaSpec:
        # README: mamba_block_size, else block_size in align mode, else max_model_len.
        mode = settings["mamba_cache_mode"]
        fields.setdefault("mamba_cache_mode", mode)
        if "block_size" not in fields:
            if settings["mamba_block_size"] is not None:
                fields["block_size"] = settings["mamba_block_size"]
            elif mode == "align":
                fields["block_size"] = settings["block_size"]
            else:
                fields["block_size"] = settings["max_model_len"]
    else:
        fields.setdefault("block_size", settings["block_size"])
    known = {a.name for a in attrs.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise GoldenFormatError(f"layer {layer!r}: {cls.__name__} has no field(s) {unknown}")
    kwargs = {name: _convert_value(name, value) for name, value in fields.items()}
    return cls(**kwargs)


def _layout(name: str | None) -> KVCacheLayout:
    if name is None:
        return KVCacheLayout.LBNHC
    try:
        return KVCacheLayout.parse(name)
    except KVRefError as exc:
        raise UnsupportedGoldenError(f"layout {name!r} is not a kvref layout") from exc


def _settings(raw_config: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, Any]:
    """Effective config values: vLLM's ``resolved`` section, else README defaults."""
    settings = {**_CONFIG_DEFAULTS, **raw_config}
    resolved = expected.get("resolved")
    if isinstance(resolved, Mapping):
        for key in (
            "block_size",
            "max_model_len",
            "original_max_model_len",
            "max_num_batched_tokens",
            "max_num_encoder_input_tokens",
            "async_scheduling",
            "max_concurrent_batches",
            "num_gpu_blocks_override",
            "disable_hybrid_kv_cache_manager",
            "mamba_cache_mode",
            "prefix_cache_retention_interval",
            "pipeline_parallel_size",
            "tensor_parallel_size",
            "decode_context_parallel_size",
            "num_prefill_lookahead_tokens",
        ):
            if key in resolved:
                settings[key] = resolved[key]
        layout = expected.get("layout", {}).get("resolved", resolved.get("kv_cache_layout"))
        settings["kv_cache_layout"] = layout
        query = resolved.get("max_decode_query_len")
        speculating = settings.get("speculative_method") is not None
        if query is not None and speculating and isinstance(settings["hisparse"], Mapping):
            # vLLM derived it from the speculative config: kvref's config refuses
            # a value it would not derive.  (Without one, the problem pins it.)
            settings["hisparse"] = {**settings["hisparse"], "max_decode_query_len": query}
    else:
        settings["original_max_model_len"] = settings["max_model_len"]
        if settings["max_model_len"] == -1:
            settings["max_model_len"] = settings["derived_max_model_len"]
        if settings["async_scheduling"] is None:
            settings["async_scheduling"] = True
    return settings


@attrs.frozen
class ListedGrouping:
    """A model-declared grouping given as layer-name lists (golden ``config.model_grouping``).

    Each list becomes one group whose spec is the layers' merged spec when
    they merge, else their uniform-type wrapper: the grouping a model that
    implements ``SupportsKVCacheGrouping`` might declare.  Hashable, so
    configs that carry it can be cached.
    """

    lists: tuple[tuple[str, ...], ...] = attrs.field(
        converter=lambda v: tuple(tuple(names) for names in v)
    )

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """One group per list, in order (unknown names fail Core's partition check later)."""
        groups = []
        for names in self.lists:
            specs = {n: kv_cache_spec[n] for n in names if n in kv_cache_spec}
            values = list(specs.values())
            group_spec: GroupKVCacheSpec | None
            try:
                group_spec = type(values[0]).merge(values)
            except KVRefError:
                group_spec = UniformTypeKVCacheSpecs.from_specs(specs)
            if group_spec is None:
                raise GoldenFormatError(f"model_grouping list {list(names)} is not of one type")
            groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=group_spec))
        return groups


def _hisparse_settings(settings: Mapping[str, Any], version: VllmVersion) -> Any:
    """``config.hisparse``; with a speculative method its decode query length defaults to kvref's.

    Only a problem with no output yet (one being generated) lacks vLLM's value.
    """
    hisparse = settings.get("hisparse")
    method = settings.get("speculative_method")
    if not isinstance(hisparse, Mapping) or method is None or "max_decode_query_len" in hisparse:
        return hisparse
    speculation = PlanningConfig(
        speculative_method=method,
        num_speculative_tokens=settings.get("num_speculative_tokens", 0),
        num_prefill_lookahead_tokens=settings.get("num_prefill_lookahead_tokens", 0),
        vllm_version=version,
    )
    return {**hisparse, "max_decode_query_len": speculation.derived_max_decode_query_len}


def _planning_config(settings: Mapping[str, Any], version: VllmVersion) -> PlanningConfig:
    grouping = settings.get("model_grouping")
    return PlanningConfig(
        max_model_len=settings["max_model_len"],
        auto_fit_max_model_len=settings["original_max_model_len"] == -1,
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        async_scheduling=bool(settings["async_scheduling"]),
        max_concurrent_batches=settings.get("max_concurrent_batches"),
        max_num_encoder_input_tokens=settings["max_num_encoder_input_tokens"],
        num_gpu_blocks_override=settings["num_gpu_blocks_override"],
        disable_hybrid_kv_cache_manager=settings["disable_hybrid_kv_cache_manager"],
        kv_cache_layout=_layout(settings["kv_cache_layout"]),
        mamba_cache_mode=settings["mamba_cache_mode"],
        decode_context_parallel_size=settings["decode_context_parallel_size"],
        pipeline_parallel_size=settings["pipeline_parallel_size"],
        tensor_parallel_size=settings["tensor_parallel_size"],
        prefix_cache_retention_interval=settings["prefix_cache_retention_interval"],
        num_prefill_lookahead_tokens=settings.get("num_prefill_lookahead_tokens", 0),
        hisparse=_hisparse_settings(settings, version),
        host_pool_bytes=settings.get("host_pool_bytes"),
        model_kv_cache_grouping=ListedGrouping(grouping) if grouping else None,
        speculative_method=settings.get("speculative_method"),
        num_speculative_tokens=settings.get("num_speculative_tokens", 0),
        num_draft_layers=settings.get("num_draft_layers", 0),
        vllm_version=version,
    )


def _available_memory(value: Any, num_workers: int) -> int | tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, Sequence) and len(value) == num_workers:
        return tuple(int(v) for v in value)
    raise GoldenFormatError(
        f"available_memory={value!r} must be an int or one int per worker ({num_workers})"
    )


def problem_from_dict(
    raw: Mapping[str, Any],
    expected: Mapping[str, Any] | None = None,
    source: Path = Path("<memory>"),
    version: VllmVersion = BASE_VERSION,
) -> GoldenProblem:
    """Convert one golden input problem (and vLLM's output for it, if any) to kvref objects.

    The config plans as ``version`` (the release ``expected`` is of).

    Raises:
        UnsupportedGoldenError: a spec kind or layout kvref does not implement.
        GoldenFormatError: the problem does not follow ``golden/README.md``.
    """
    expected = expected or {}
    settings = _settings(raw.get("config", {}), expected)
    config = _planning_config(settings, version)
    templates = raw.get("spec_templates", {})
    workers: list[dict[str, KVCacheSpec]] = []
    for worker in raw["workers"]:
        specs: dict[str, KVCacheSpec] = {}
        for layer, entry in worker.items():
            specs[layer] = _build_spec(layer, _resolve_entry(entry, templates, layer), settings)
        workers.append(specs)
    probes: tuple[int, ...]
    from_groups = expected.get("from_groups")
    if isinstance(from_groups, list) and from_groups:
        probes = tuple(int(p["num_blocks_requested"]) for p in from_groups)
    else:
        probes = tuple(raw.get("num_blocks_probes", DEFAULT_NUM_BLOCKS_PROBES))
    return GoldenProblem(
        name=raw["name"],
        source=source,
        config=config,
        workers=tuple(workers),
        available_memory=_available_memory(raw["available_memory"], len(workers)),
        num_blocks_probes=probes,
        expected=expected,
        profiling=raw.get("profiling"),
    )


def load_problems(path: str | Path, version: VllmVersion = BASE_VERSION) -> list[GoldenProblem]:
    """Every problem of the golden input file ``path``, with ``version``'s outputs when present.

    Raises:
        UnsupportedGoldenError: a problem uses what kvref does not implement.
        GoldenFormatError: the file does not follow ``golden/README.md``.
    """
    return [load_problem(path, raw["name"], version) for raw in _read_json_list(Path(path))]


def load_problem(
    path: str | Path, name: str | None = None, version: VllmVersion = BASE_VERSION
) -> GoldenProblem:
    """The problem ``name`` of the golden input file ``path`` (the only one if ``name`` is None).

    Planned as ``version``, with that release's output when the file exists.

    Raises:
        UnsupportedGoldenError: the problem uses what kvref does not implement.
        GoldenFormatError: no such problem, or it does not follow ``golden/README.md``.
    """
    path = Path(path)
    raws = _read_json_list(path)
    if name is None:
        if len(raws) != 1:
            raise GoldenFormatError(f"{path} holds {len(raws)} problems; name one")
        name = raws[0]["name"]
    matches = [r for r in raws if r["name"] == name]
    if len(matches) != 1:
        raise GoldenFormatError(f"{path} holds {len(matches)} problems named {name!r}")
    out_path = expected_path(path, version)
    expected: Mapping[str, Any] = {}
    if out_path.exists():
        outputs = [o for o in load_expected(out_path) if o["name"] == name]
        if len(outputs) != 1:
            raise GoldenFormatError(f"{out_path} holds {len(outputs)} outputs named {name!r}")
        expected = outputs[0]
    return problem_from_dict(matches[0], expected, path, version)
