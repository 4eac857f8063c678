"""kvref's reference as a builder vLLM runs (``kvref.interop.vllm_builder``).

A platform names ``kvref.interop.vllm_builder.KvrefKVCacheConfigBuilder``
from ``get_kv_cache_config_builder_cls``; vLLM resolves it and calls its
hooks with the real ``VllmConfig`` and vLLM's records.  These tests put a
platform that does so in place of vLLM's current platform and check that
vLLM's own Core flow then plans every golden problem as it does with its
default builder, that vLLM's callers get the exception types and log lines
they expect, that partial configs (vLLM's tests hand them) fail where
vLLM's default fails and nowhere else, and that HiSparse's engine-derived
settings are read through vLLM's own functions.  The kit's verdicts on the
builder and on vendor subclasses are in ``test_vllm_builder_kit.py``.
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

import golden
from _kvref_platform import DEFAULT, installed_config, platform_builder, run_core
from specs import mla, mla_beside_chunked
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.core.kv_cache_config_builder import KVCacheConfigBuilder as VllmBuilder
from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder

from kvref import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    PlanningConfig,
    SlidingWindowSpec,
)
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.errors import KVRefError, PageSizeUnificationError, PartitionError, UnsupportedError
from kvref.interop import vllm as iv
from kvref.interop import vllm_builder as vb
from kvref.interop.vllm_reading import (
    VllmModelGrouping,
    hisparse_from_vllm,
    planning_config_from_vllm,
    read_vllm_config,
)
from kvref.layout import KVCacheLayout
from kvref.versions import installed_vllm_version

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]


def _sw(block_size: int = 16, **kw: Any) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=8,
        head_size=128,
        dtype="bfloat16",
        sliding_window=1024,
        **kw,
    )


def _full(heads: int = 8) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=128, dtype="bfloat16")


def _builder() -> Any:
    return vb.builder_class()()


class TestImport:
    """The module is importable without vLLM; the class resolves through vLLM's own resolution."""

    def test_importing_kvref_does_not_import_vllm(self) -> None:
        """``kvref``, ``kvref.interop`` and both new modules import no vLLM module."""
        code = (
            "import sys, kvref, kvref.interop, kvref.interop.vllm_builder, "
            "kvref.interop.vllm_reading\n"
            "from kvref.interop import planning_config_from_vllm\n"
            "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')]\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)

    def test_qualname_resolves_through_vllm(self) -> None:
        """vLLM's ``resolve_obj_by_qualname`` gives the class, a concrete vLLM builder."""
        cls = resolve_obj_by_qualname(vb.QUALNAME)
        assert cls is vb.builder_class() is vb.KvrefKVCacheConfigBuilder
        assert issubclass(cls, VllmBuilder)
        assert not getattr(cls, "__abstractmethods__", None)
        assert f"{cls.__module__}.{cls.__qualname__}" == vb.QUALNAME

    def test_platform_hook_resolves_fresh_instances(self) -> None:
        """A platform naming the qualname makes vLLM build a fresh instance per call."""
        vcfg = iv.to_vllm_config(PlanningConfig())
        with platform_builder(vb.QUALNAME):
            first = get_kv_cache_config_builder(vcfg)
            second = get_kv_cache_config_builder(vcfg)
        assert type(first) is vb.builder_class()
        assert first is not second

    def test_class_and_instance_pickle(self) -> None:
        """Pickle finds the class by its qualname (vLLM ships builders to workers)."""
        cls = vb.builder_class()
        assert pickle.loads(pickle.dumps(cls)) is cls
        assert type(pickle.loads(pickle.dumps(cls()))) is cls

    def test_also_exported_from_kvref_interop(self) -> None:
        """``kvref.interop`` names the public API lazily."""
        import kvref.interop as ki

        assert ki.KvrefKVCacheConfigBuilder is vb.builder_class()
        assert ki.planning_config_from_vllm is planning_config_from_vllm


# -- the golden problems through vLLM's Core flow ------------------------------

#: Golden problems where kvref's builder refuses as vLLM's default does, with
#: an error of vLLM's type (so vLLM's callers catch it alike) but kvref's own
#: typed error and message (docs/contract.md#deliberate-differences).
TYPED_REFUSALS = {
    # 4: kvref's PageSizeUnificationError, also vLLM's NotImplementedError.
    "hidden_state_blocks_fallback": 4,
    # 4: LayoutError (a ValueError) for vLLM's ValueError.
    "hisparse_layer_outer_layout": 4,
    # 4: ConfigError (a ValueError) for vLLM's ValueError, naming both settings.
    "model_grouping_with_hisparse": 4,
    # 9: the builder checks a model's declared grouping itself (PartitionError,
    # also an AssertionError like Core's check, which then never runs).
    "model_grouping_overlap": 9,
    "model_grouping_missing_layer": 9,
    # 12: typed HiSparse errors (HiSparseError, a ValueError).
    "hisparse_pool_too_small": 12,
    "hisparse_layer_outer_one_page": 12,
    "hisparse_buffer_too_small": 12,
    "hisparse_no_indexer": 12,
    "hisparse_deepseek_v4": 12,
    "hisparse_no_mla": 12,
}
if not installed_config(PlanningConfig()).rules.fallback_covers_sliding_window_mla:
    # 4, as above; from vLLM 0.34.0 the fallback plans it.
    TYPED_REFUSALS["swmla_fallback"] = 4


def _golden_problems() -> list[Any]:
    directory = golden.find_golden_dir()
    if directory is None:
        return []
    return [
        pytest.param(path, name, id=f"{path.stem}-{name}")
        for path, name in golden.iter_problem_ids(directory)
    ]


def _installed_problem(path: Path, name: str) -> Any:
    """The golden problem planned as the installed vLLM release (skipped where it is not one)."""
    try:
        problem = golden.load_problem(path, name)
    except golden.UnsupportedGoldenError as exc:
        pytest.skip(f"kvref does not implement it: {exc}")
    try:
        return attrs.evolve(problem, config=installed_config(problem.config))
    except KVRefError as exc:
        pytest.skip(f"not a config of vLLM {installed_vllm_version()}: {exc}")


@pytest.mark.parametrize(("path", "name"), _golden_problems())
def test_golden_problem_core_flow(path: Path, name: str) -> None:
    """vLLM's Core flow plans alike with kvref's builder and vLLM's default, or both refuse.

    Plans are compared as vLLM's own objects: global groups, every worker's
    config (tensors, groups, block count, replicas) and the final
    ``max_model_len``.  A refusal must be of vLLM's exception type; where it
    is kvref's own typed error it must be listed in :data:`TYPED_REFUSALS`.
    """
    problem = _installed_problem(path, name)
    args = (problem.config, problem.workers, problem.available_memory)
    ours = run_core(vb.QUALNAME, *args)
    vllms = run_core(DEFAULT, *args)
    if vllms.error is not None:
        assert ours.error is not None, f"vLLM refuses ({vllms.error!r}), kvref plans"
        assert isinstance(ours.error, type(vllms.error)), (ours.error, vllms.error)
        typed = isinstance(ours.error, KVRefError) and str(ours.error) != str(vllms.error)
        assert typed == (name in TYPED_REFUSALS), (ours.error, vllms.error)
        return
    assert ours.error is None, f"kvref refuses: {ours.error!r}"
    assert name not in TYPED_REFUSALS
    assert ours.global_groups == vllms.global_groups
    assert ours.configs == vllms.configs
    assert ours.max_model_len == vllms.max_model_len


@pytest.mark.parametrize(("path", "name"), _golden_problems())
def test_golden_placement_probes(path: Path, name: str) -> None:
    """The placement hook equals vLLM's default at every probed block count.

    Except under ``num_gpu_blocks_override`` (deliberate difference 1): kvref
    places exactly the blocks asked for, vLLM's default the override.
    """
    problem = _installed_problem(path, name)
    config = problem.config
    if config.hisparse is not None or config.model_kv_cache_grouping is not None:
        pytest.skip("the Core flow test covers HiSparse and declared groupings")
    vcfg = iv.to_vllm_config(config)
    specs = iv.specs_to_vllm(problem.merged_specs)
    try:
        groups = DefaultKVCacheConfigBuilder().get_kv_cache_groups(vcfg, dict(specs))
    except Exception:
        pytest.skip("vLLM refuses the grouping (the Core flow test compares refusals)")
    assert _builder().get_kv_cache_groups(vcfg, dict(specs)) == groups
    override = config.num_gpu_blocks_override
    with iv.quiet_vllm():
        for n in problem.num_blocks_probes:
            ours = _builder().get_kv_cache_config_from_groups(vcfg, groups, n)
            vllms = DefaultKVCacheConfigBuilder().get_kv_cache_config_from_groups(vcfg, groups, n)
            if override is not None and override != n:
                assert (ours.num_blocks, vllms.num_blocks) == (n, override)
                continue
            assert ours == vllms
            assert ours.kv_cache_groups is groups  # the caller's own list, as vLLM's default


# -- a model's declared grouping ------------------------------------------------


class _GroupedModel:
    """A vLLM model class owning its grouping (``SupportsKVCacheGrouping``): a group a layer."""

    @classmethod
    def get_kv_cache_groups(cls, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        kvi = iv.vllm_modules().kvi
        return [kvi.KVCacheGroupSpec([name], spec) for name, spec in kv_cache_spec.items()]


class _DropsLastModel(_GroupedModel):
    @classmethod
    def get_kv_cache_groups(cls, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        return super().get_kv_cache_groups(vllm_config, kv_cache_spec)[:-1]


def _declaring(model: type[Any]) -> Any:
    """A real ``VllmConfig`` whose model class declares its grouping."""
    vcfg = iv.to_vllm_config(PlanningConfig())
    registry = SimpleNamespace(resolve_model_cls=lambda arch, config: (model, "arch"))
    model_config = SimpleNamespace(
        **{n: getattr(vcfg.model_config, n) for n in ("max_model_len", "architectures")},
        supports_kv_cache_grouping=True,
        registry=registry,
        original_max_model_len=vcfg.model_config.max_model_len,
        hf_config=vcfg.model_config.hf_config,
        get_total_num_hidden_layers=vcfg.model_config.get_total_num_hidden_layers,
    )
    return SimpleNamespace(**{**vars(vcfg), "model_config": model_config})


class TestDeclaredGrouping:
    """A model that owns its grouping gets it under kvref's builder, checked."""

    def test_model_grouping_owns_grouping(self) -> None:
        """The model's groups come back, as vLLM's default returns them."""
        vcfg = _declaring(_GroupedModel)
        specs = iv.specs_to_vllm({"a": _full(), "b": _full(4)})
        ours = _builder().get_kv_cache_groups(vcfg, dict(specs))
        assert ours == DefaultKVCacheConfigBuilder().get_kv_cache_groups(vcfg, dict(specs))
        assert [g.layer_names for g in ours] == [["a"], ["b"]]

    def test_reading_gives_a_model_grouping_hook(self) -> None:
        """The planning config's hook asks the model class through vLLM's registry."""
        vcfg = _declaring(_GroupedModel)
        hook = planning_config_from_vllm(vcfg).model_kv_cache_grouping
        assert isinstance(hook, VllmModelGrouping)
        assert hook.model_class() is _GroupedModel
        assert hook == VllmModelGrouping(vcfg)

    def test_bad_declaration_is_vllms_assertion_too(self) -> None:
        """A grouping that drops a layer is kvref's PartitionError and vLLM's AssertionError."""
        vcfg = _declaring(_DropsLastModel)
        specs = iv.specs_to_vllm({"a": _full(), "b": _full(4)})
        with pytest.raises(AssertionError, match="miss layers") as caught:
            _builder().get_kv_cache_groups(vcfg, dict(specs))
        assert isinstance(caught.value, PartitionError)


# -- errors and log lines as vLLM's callers expect them --------------------------


class TestErrors:
    """Refusals are kvref's typed errors, of vLLM's own type where vLLM's differs."""

    def test_unpaddable_pages_are_not_implemented(self) -> None:
        """MLA beside a chunked-local layer: vLLM's NotImplementedError, kvref's typed error."""
        vcfg = iv.to_vllm_config(PlanningConfig())
        vspecs = iv.specs_to_vllm(mla_beside_chunked())
        with pytest.raises(NotImplementedError):
            DefaultKVCacheConfigBuilder().get_kv_cache_groups(vcfg, dict(vspecs))
        with pytest.raises(NotImplementedError) as caught:
            _builder().get_kv_cache_groups(vcfg, dict(vspecs))
        assert isinstance(caught.value, PageSizeUnificationError)

    @pytest.mark.parametrize("error_type", sorted(vb.VLLM_ERROR_TYPES.values(), key=str))
    def test_both_types_pickle(self, error_type: type[Exception]) -> None:
        """The errors of both types cross process boundaries (vLLM's workers, the kit's)."""
        error = error_type("message")
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is error_type and back.args == ("message",)

    def test_unknown_vllm_spec_class_is_unsupported(self) -> None:
        """A vLLM spec class kvref does not model is an UnsupportedError naming it."""
        kvi = iv.vllm_modules().kvi

        @attrs.define
        class Alien:
            page_size_bytes: int = 4096

        vcfg = iv.to_vllm_config(PlanningConfig())
        good = iv.specs_to_vllm({"a": _full()})["a"]
        with pytest.raises(UnsupportedError, match="Alien"):
            _builder().get_kv_cache_groups(vcfg, {"a": good, "x": Alien()})
        assert kvi.KVCacheGroupSpec  # vLLM's records were importable for the comparison

    def test_no_memory_is_vllms_value_error(self) -> None:
        """Core's admission refusal is vLLM's own ValueError with its message."""
        specs = [{f"l{i}": _full() for i in range(4)}]
        config = installed_config(PlanningConfig(max_model_len=1 << 20))
        ours = run_core(vb.QUALNAME, config, specs, 1 << 20)
        vllms = run_core(DEFAULT, config, specs, 1 << 20)
        assert type(ours.error) is type(vllms.error) is ValueError
        assert str(ours.error) == str(vllms.error)


@pytest.fixture
def vllm_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """vLLM's log records, propagated to pytest's capture (vLLM's logger does not propagate)."""
    logger = logging.getLogger("vllm")
    saved = logger.propagate, logger.level
    logger.propagate = True
    logger.setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate, _ = saved
        logger.setLevel(saved[1])


class TestWarnings:
    """Grouping logs vLLM's warnings, in vLLM's words, through vLLM's planning logger."""

    def _specs(self) -> dict[str, Any]:
        specs: dict[str, Any] = {f"m{i}": mla() for i in range(4)}
        specs["draft"] = _sw(block_size=64, is_draft=True)
        return iv.specs_to_vllm(specs)

    def test_full_allocation_fallback(self, vllm_log: pytest.LogCaptureFixture) -> None:
        """MLA beside an unpaddable sliding-window draft: the fallback's warning, as vLLM's."""
        vcfg = iv.to_vllm_config(PlanningConfig(kv_cache_layout="LBNHC"))
        _builder().get_kv_cache_groups(vcfg, self._specs())
        ours = [r for r in vllm_log.records if r.getMessage() == vb.FALLBACK_WARNING]
        vllm_log.clear()
        DefaultKVCacheConfigBuilder().get_kv_cache_groups(vcfg, self._specs())
        theirs = [r for r in vllm_log.records if r.getMessage() == vb.FALLBACK_WARNING]
        assert len(ours) == len(theirs) == 1
        assert "attention compute is unchanged" in ours[0].getMessage()
        assert (ours[0].name, ours[0].levelno) == (theirs[0].name, theirs[0].levelno)

    def test_hybrid_manager_disabled(self, vllm_log: pytest.LogCaptureFixture) -> None:
        """Local layers promoted with the hybrid manager off: vLLM's warning."""
        vcfg = iv.to_vllm_config(PlanningConfig(disable_hybrid_kv_cache_manager=True))
        specs = iv.specs_to_vllm({"f": _full(), "s": _sw()})
        _builder().get_kv_cache_groups(vcfg, dict(specs))
        messages = [r.getMessage() for r in vllm_log.records]
        assert vb.HYBRID_DISABLED_WARNING in messages

    def test_no_warning_without_promotion(self, vllm_log: pytest.LogCaptureFixture) -> None:
        """A hybrid model grouped by kind logs neither warning."""
        vcfg = iv.to_vllm_config(PlanningConfig())
        _builder().get_kv_cache_groups(vcfg, iv.specs_to_vllm({"f": _full(), "s": _sw()}))
        messages = {r.getMessage() for r in vllm_log.records}
        assert not messages & {vb.FALLBACK_WARNING, vb.HYBRID_DISABLED_WARNING}


# -- partial configs, as vLLM's tests hand them ---------------------------------


def _partial(layout: KVCacheLayout | None) -> Any:
    """A config with only what grouping and placement read (as in vLLM's planning tests)."""

    def resolved() -> Any:
        if layout is None:
            raise ValueError("KV cache layout has not been resolved yet")
        return iv.vllm_modules().config_module.cache.KVCacheLayout[layout.name]

    return SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        speculative_config=None,
        attention_config=SimpleNamespace(hisparse_config=None),
        model_config=SimpleNamespace(supports_kv_cache_grouping=False),
        cache_config=SimpleNamespace(
            get_resolved_kv_cache_layout=resolved,
            prefix_cache_retention_interval=None,
            num_gpu_blocks_override=None,
        ),
    )


class TestPartialConfigs:
    """A partial config fails where vLLM's default fails on it, with vLLM's error, only there."""

    def _both(self, call: Any) -> tuple[Any, Any]:
        outcomes = []
        for builder in (_builder(), DefaultKVCacheConfigBuilder()):
            try:
                outcomes.append(call(builder))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes[0], outcomes[1]

    def test_uniform_grouping_needs_no_layout(self) -> None:
        """One page size: both group without reading the layout."""
        specs = iv.specs_to_vllm({"a": _full(), "b": _full()})
        ours, theirs = self._both(lambda b: b.get_kv_cache_groups(_partial(None), dict(specs)))
        assert ours == theirs and not isinstance(ours, Exception)

    def test_mixed_pages_need_the_layout(self) -> None:
        """Mixed pages: both read the layout, and both fail without one (vLLM's ValueError)."""
        small = SlidingWindowSpec(
            block_size=16, num_kv_heads=4, head_size=128, dtype="bfloat16", sliding_window=1024
        )
        specs = iv.specs_to_vllm({"a": _full(), "s": small})
        ours, theirs = self._both(lambda b: b.get_kv_cache_groups(_partial(None), dict(specs)))
        assert type(ours) is type(theirs) is ValueError
        assert str(ours) == str(theirs)

    def test_placement_needs_the_layout(self) -> None:
        """Placement reads the layout: vLLM's own error without one, equal plans with one."""
        specs = iv.specs_to_vllm({"a": _full(), "b": _full()})
        groups = DefaultKVCacheConfigBuilder().get_kv_cache_groups(_partial(None), dict(specs))
        ours, theirs = self._both(
            lambda b: b.get_kv_cache_config_from_groups(_partial(None), groups, 4)
        )
        assert type(ours) is type(theirs) is ValueError and str(ours) == str(theirs)
        ours, theirs = self._both(
            lambda b: b.get_kv_cache_config_from_groups(_partial(KVCacheLayout.BLHNC), groups, 4)
        )
        assert ours == theirs

    def test_unread_fields_are_recorded(self) -> None:
        """What a partial config lacks keeps kvref's default and is named with its error."""
        reading = read_vllm_config(_partial(None))
        assert reading.config.max_model_len == PlanningConfig().max_model_len
        assert isinstance(reading.unread["max_model_len"], AttributeError)
        assert isinstance(reading.unread["kv_cache_layout"], ValueError)
        with pytest.raises(ValueError, match="not been resolved"):
            reading.require("max_num_batched_tokens" and "kv_cache_layout")


# -- reading a VllmConfig -------------------------------------------------------

#: Configs whose planning-relevant fields must survive to_vllm_config and back.
ROUND_TRIPS = (
    PlanningConfig(),
    PlanningConfig(max_model_len=1 << 16, async_scheduling=False, pipeline_parallel_size=2),
    PlanningConfig(kv_cache_layout="BLHNC", num_gpu_blocks_override=77, mamba_cache_mode="align"),
    PlanningConfig(disable_hybrid_kv_cache_manager=True, prefix_cache_retention_interval=None),
    PlanningConfig(
        auto_fit_max_model_len=True, tensor_parallel_size=4, decode_context_parallel_size=2
    ),
    PlanningConfig(max_concurrent_batches=5, max_num_encoder_input_tokens=4096),
    PlanningConfig(cache_dtype="fp8", num_hidden_layers=61, hf_config={"model_type": "llama"}),
    PlanningConfig(
        kv_cache_layout="BLHNC",
        hisparse={"device_buffer_size": 4096, "index_topk": 2048},
        host_pool_bytes=3 << 30,
    ),
    PlanningConfig(
        kv_cache_layout="BLHNC",
        hisparse={"max_decode_query_len": 3, "shared_host_pool": True},
        host_pool_bytes=1 << 30,
        hf_config={"index_topk": 512},
    ),
)

_COMPARED = (
    "max_model_len",
    "auto_fit_max_model_len",
    "max_num_batched_tokens",
    "async_scheduling",
    "concurrent_batches",
    "encoder_input_tokens",
    "num_gpu_blocks_override",
    "disable_hybrid_kv_cache_manager",
    "kv_cache_layout",
    "mamba_cache_mode",
    "decode_context_parallel_size",
    "pipeline_parallel_size",
    "tensor_parallel_size",
    "prefix_cache_retention_interval",
    "num_prefill_lookahead_tokens",
    "host_pool_bytes",
    "cache_dtype",
    "vllm_version",
)


@pytest.mark.parametrize("config", ROUND_TRIPS, ids=range(len(ROUND_TRIPS)))
def test_reading_round_trips(config: PlanningConfig) -> None:
    """``planning_config_from_vllm(to_vllm_config(c))`` plans as ``c``, field by field."""
    config = installed_config(config)
    vcfg = iv.to_vllm_config(config)
    with iv.hisparse_patches(config):
        read = read_vllm_config(vcfg)
    assert not read.unread, read.unread
    for name in _COMPARED:
        assert getattr(read.config, name) == getattr(config, name), name
    if config.hisparse is None:
        assert read.config.hisparse is None
    else:
        got = attrs.evolve(read.config.hisparse, index_topk=None)
        assert got == attrs.evolve(config.hisparse, index_topk=None)
        assert read.config.hisparse.index_topk == (
            config.hisparse.index_topk or config.hf("index_topk")
        )
    for name, value in config.hf_config:
        assert read.config.hf(name) == value
    if config.num_hidden_layers is not None:
        assert read.config.num_hidden_layers == config.num_hidden_layers


class TestHiSparseReading:
    """HiSparse's engine-derived settings come through the vLLM functions placement calls."""

    def _vcfg(self) -> Any:
        config = PlanningConfig(kv_cache_layout="BLHNC", hisparse={}, host_pool_bytes=1 << 30)
        return iv.to_vllm_config(config)

    def test_patched_functions_are_seen(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Patching vLLM's functions (as vLLM's tests do) changes what is read."""
        import vllm.v1.hisparse.layout as layout
        import vllm.v1.hisparse.runtime as runtime

        kvp = iv.vllm_modules().kvp
        monkeypatch.setattr(runtime, "max_decode_query_len", lambda c: 5)
        monkeypatch.setattr(layout, "use_shared_hisparse_host_pool", lambda c: True)
        monkeypatch.setattr(kvp, "get_hisparse_host_pool_bytes", lambda c: 12345 << 12)
        settings, pool = hisparse_from_vllm(self._vcfg())
        assert settings is not None
        assert (settings.max_decode_query_len, settings.shared_host_pool) == (5, True)
        assert pool == 12345 << 12

    def test_unpatched_values_are_vllms(self) -> None:
        """Without patches: vLLM's own answers for this engine, or vLLM's own error.

        vLLM 0.34.0 asks the platform for its HiSparse backend to decide the
        shared pool, which a CPU platform refuses with a ``RuntimeError``:
        vLLM's placement fails there, and so does this reading.
        """
        import vllm.v1.hisparse.layout as layout
        import vllm.v1.hisparse.runtime as runtime

        vcfg = self._vcfg()
        try:
            shared = layout.use_shared_hisparse_host_pool(vcfg)
        except Exception as exc:
            with pytest.raises(type(exc), match=str(exc)):
                hisparse_from_vllm(vcfg)
            return
        settings, pool = hisparse_from_vllm(vcfg)
        assert settings is not None
        assert settings.max_decode_query_len == runtime.max_decode_query_len(vcfg)
        assert settings.shared_host_pool == shared
        assert pool == iv.vllm_modules().kvp.get_hisparse_host_pool_bytes(vcfg) == 1 << 30

    def test_missing_connector_is_vllms_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """HiSparse without its connector: vLLM's own ValueError, raised strictly here."""
        import vllm.v1.hisparse.layout as layout

        monkeypatch.setattr(layout, "use_shared_hisparse_host_pool", lambda c: False)
        vcfg = self._vcfg()
        vcfg.kv_transfer_config = None
        with pytest.raises(ValueError, match="HiSparseConnector"):
            hisparse_from_vllm(vcfg)
        reading = read_vllm_config(vcfg)
        assert reading.config.host_pool_bytes is None and "host_pool_bytes" in reading.unread

    def test_off_is_none(self) -> None:
        """HiSparse off: no settings and no pool."""
        assert hisparse_from_vllm(iv.to_vllm_config(PlanningConfig())) == (None, None)


# -- the pool-bytes hook ----------------------------------------------------------


class _DeclaresPoolBytes(ReferenceKVCacheConfigBuilder):
    def _get_pool_bytes_per_block(self, config: PlanningConfig, kv_cache_groups: Any) -> int | None:
        return 1 << 20


class TestPoolBytes:
    """``_get_pool_bytes_per_block`` is vLLM's default unless the kvref builder declares it."""

    def test_default_lets_core_probe(self) -> None:
        """The class inherits vLLM's hook (``None``: Core probes one block), as vLLM's default."""
        cls = vb.builder_class()
        assert cls._get_pool_bytes_per_block is VllmBuilder._get_pool_bytes_per_block
        vcfg = iv.to_vllm_config(PlanningConfig())
        groups = iv.groups_to_vllm([KVCacheGroupSpec(layer_names=["a"], kv_cache_spec=_full())])
        assert cls()._get_pool_bytes_per_block(vcfg, groups) is None

    def test_declaring_kvref_builder_is_asked(self) -> None:
        """A subclass naming a kvref builder that declares its pool bytes forwards them."""

        class Declaring(vb.builder_class()):  # type: ignore[misc]
            kvref_builder = _DeclaresPoolBytes

        class BackToReference(Declaring):
            kvref_builder = ReferenceKVCacheConfigBuilder

        vcfg = iv.to_vllm_config(PlanningConfig())
        groups = iv.groups_to_vllm([KVCacheGroupSpec(layer_names=["a"], kv_cache_spec=_full())])
        assert Declaring()._get_pool_bytes_per_block(vcfg, groups) == 1 << 20
        base = VllmBuilder._get_pool_bytes_per_block
        assert BackToReference._get_pool_bytes_per_block is base

    def test_vendor_override_wins(self) -> None:
        """A vLLM-side override is never replaced by the forwarder."""

        class Own(vb.builder_class()):  # type: ignore[misc]
            kvref_builder = _DeclaresPoolBytes

            def _get_pool_bytes_per_block(self, vllm_config: Any, groups: Any) -> int:
                return 7

        vcfg = iv.to_vllm_config(PlanningConfig())
        assert Own()._get_pool_bytes_per_block(vcfg, []) == 7


class TestVersion:
    """The hooks plan as the installed vLLM release, else as the newest, saying so once."""

    def test_installed_release(self) -> None:
        """A supported vLLM installed: its rules."""
        config = _builder().planning_config(iv.to_vllm_config(PlanningConfig()))
        assert config.vllm_version == installed_vllm_version()

    def test_other_release_plans_as_newest(
        self, monkeypatch: pytest.MonkeyPatch, vllm_log: pytest.LogCaptureFixture
    ) -> None:
        """Another release installed: the newest kvref follows, with one warning."""
        from kvref.interop import vllm_reading
        from kvref.versions import NEWEST

        monkeypatch.setattr(vllm_reading, "_installed_version", lambda: None)
        monkeypatch.setattr(vb, "installed_vllm_version", lambda: None)
        vb._version_note.cache_clear()
        try:
            vcfg = iv.to_vllm_config(PlanningConfig())
            assert _builder().planning_config(vcfg).vllm_version == NEWEST
            _builder().planning_config(vcfg)
        finally:
            vb._version_note.cache_clear()
        warned = [r for r in vllm_log.records if "follows vLLM" in r.getMessage()]
        assert len(warned) == 1
