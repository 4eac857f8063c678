"""Layout resolution (kvref.layout_resolution, kvref.backends) and its PlanningConfig fields.

Pure tests: the worked cases of vLLM 0.33.0's ``resolve_kv_cache_layout`` and
``get_supported_kv_cache_layouts``, the config's description fields and their
errors, and planning resolving the layout when none is given.  The same
functions are compared with vLLM's own in ``tests/vllm/test_layout_kernel_diff.py``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from specs import sparse_mla_indexer, sparse_mla_source

from kvref import KVCacheLayout, PlanningConfig, plan_kv_cache
from kvref.axes import DEFAULT_LAYOUT_PREFERENCE
from kvref.backends import AttentionBackend, get_supported_kv_cache_layouts
from kvref.config import HISPARSE_CONNECTOR_LAYOUT
from kvref.errors import ConfigError, LayoutResolutionError
from kvref.layout_resolution import resolve_kv_cache_layout
from kvref.specs import FullAttentionSpec, MultipleOf, SlidingWindowSpec

L = KVCacheLayout
BF16: dict[str, Any] = {"dtype": torch.bfloat16, "head_size": 64, "block_size": 16}
FULL8 = FullAttentionSpec(num_kv_heads=8, **BF16)
FULL4 = FullAttentionSpec(num_kv_heads=4, **BF16)
SWA8 = SlidingWindowSpec(num_kv_heads=8, sliding_window=128, **BF16)
REPLICATED4 = FullAttentionSpec(num_kv_heads=4, dcp_sharded=False, **BF16)


def _backend(name: str, *layouts: KVCacheLayout, **kw: Any) -> AttentionBackend:
    return AttentionBackend(name=name, supported_kv_cache_layouts=layouts or None, **kw)


class TestSupportedLayouts:
    """get_supported_kv_cache_layouts: one worker's report."""

    def test_no_declaration_is_the_default_preference(self) -> None:
        """Backends that declare nothing report vLLM's default order, LBNHC first."""
        assert get_supported_kv_cache_layouts([_backend("a")]) == list(DEFAULT_LAYOUT_PREFERENCE)
        assert get_supported_kv_cache_layouts([])[0] is L.LBNHC

    def test_identical_declarations_keep_their_order(self) -> None:
        """Two backends with the same list report it unchanged."""
        a, b = _backend("a", L.BLNHC, L.LBNHC), _backend("b", L.BLNHC, L.LBNHC)
        assert get_supported_kv_cache_layouts([a, b]) == [L.BLNHC, L.LBNHC]

    def test_the_most_voted_first_layout_wins(self) -> None:
        """Different lists: the common layouts, ordered by first-place votes."""
        a = _backend("a", L.BLNHC, L.LBNHC, L.LBHNC)
        b = _backend("b", L.BLNHC, L.LBHNC)
        c = _backend("c", L.LBHNC, L.BLNHC)
        assert get_supported_kv_cache_layouts([a, b, c]) == [L.BLNHC, L.LBHNC]

    def test_ties_keep_the_enum_order(self) -> None:
        """Equal votes fall back to KVCacheLayout's declaration order."""
        a, b = _backend("a", L.BLNHC, L.LBNHC), _backend("b", L.LBNHC, L.BLNHC)
        assert get_supported_kv_cache_layouts([a, b]) == [L.LBNHC, L.BLNHC]

    def test_disjoint_sets_name_each_backend(self) -> None:
        """No common layout is a LayoutResolutionError naming both backends' sets."""
        a, b = _backend("FLASH", L.LBNHC), _backend("KPOOL", L.BLHNC)
        with pytest.raises(LayoutResolutionError, match=r"FLASH: \['LBNHC'\]; KPOOL: \['BLHNC'\]"):
            get_supported_kv_cache_layouts([a, b])


class TestResolveLayout:
    """resolve_kv_cache_layout: the specs narrow, then override, connector, first."""

    def test_first_candidate_without_override_or_connector(self) -> None:
        """With nothing else said, the first reported layout is taken."""
        assert resolve_kv_cache_layout([[L.LBHNC, L.BLNHC]], [FULL8]) is L.LBHNC

    def test_mixed_shapes_keep_block_compact_layouts(self) -> None:
        """Specs of two head counts drop LHBNC and BHLNC."""
        assert resolve_kv_cache_layout([[L.LHBNC, L.BHLNC, L.BLHNC]], [FULL8, FULL4]) is L.BLHNC

    def test_mixed_shapes_without_a_block_compact_candidate(self) -> None:
        """Mixed shapes and only non-block-compact candidates name both sides."""
        with pytest.raises(LayoutResolutionError, match=r"block-compact.*\['LHBNC', 'BHLNC'\]"):
            resolve_kv_cache_layout([[L.LHBNC, L.BHLNC]], [FULL8, FULL4])

    def test_sharded_and_replicated_pages_need_block_outermost(self) -> None:
        """DCP-sharded target and replicated draft with two page sizes keep B-first layouts."""
        assert resolve_kv_cache_layout([list(DEFAULT_LAYOUT_PREFERENCE)], [FULL8, REPLICATED4]) is (
            L.BLNHC
        )
        with pytest.raises(LayoutResolutionError, match="block-outermost"):
            resolve_kv_cache_layout([[L.LBNHC]], [FULL8, REPLICATED4])

    def test_override_must_be_a_candidate(self) -> None:
        """VLLM_KV_CACHE_LAYOUT wins when allowed and is refused, naming the candidates, if not."""
        assert resolve_kv_cache_layout([[L.LBNHC, L.BLHNC]], env_layout=L.BLHNC) is L.BLHNC
        with pytest.raises(LayoutResolutionError, match=r"BHLNC.*\['LBNHC', 'BLHNC'\]"):
            resolve_kv_cache_layout([[L.LBNHC, L.BLHNC]], env_layout=L.BHLNC)

    def test_override_beats_the_connector(self) -> None:
        """With both set, the override decides and the connector is not consulted."""
        layouts = [[L.LBNHC, L.BLHNC, L.LBHNC]]
        assert resolve_kv_cache_layout(layouts, env_layout=L.LBHNC, connector_layout=L.BLHNC) is (
            L.LBHNC
        )

    def test_connector_taken_when_allowed_and_dropped_with_a_warning(self) -> None:
        """The connector's layout is used if a candidate, else the first with a warning."""
        assert resolve_kv_cache_layout([[L.LBNHC, L.BLHNC]], connector_layout=L.BLHNC) is L.BLHNC
        with pytest.warns(UserWarning, match="BHLNC.*using LBNHC"):
            assert resolve_kv_cache_layout([[L.LBNHC]], connector_layout=L.BHLNC) is L.LBNHC

    def test_workers_must_agree(self) -> None:
        """Two workers with different reports are refused, naming both."""
        with pytest.raises(LayoutResolutionError, match=r"worker 0 \['LBNHC'\] and worker 1"):
            resolve_kv_cache_layout([[L.LBNHC], [L.BLHNC]])
        with pytest.raises(LayoutResolutionError, match="at least one"):
            resolve_kv_cache_layout([])


class TestConfigFields:
    """PlanningConfig's attention_backends, kv_connector_layout and env_kv_cache_layout."""

    def test_defaults_describe_nothing_and_keep_lbnhc(self) -> None:
        """A config describing no backend, connector or override keeps LBNHC and never resolves."""
        config = PlanningConfig()
        assert config.kv_cache_layout is L.LBNHC
        assert not config.resolves_kv_cache_layout
        assert not config.describes_kv_cache_layout

    def test_given_layout_is_kept_as_is(self) -> None:
        """An explicit layout wins outright, even against a connector's (vLLM: set on the cache)."""
        config = PlanningConfig(kv_cache_layout="LBNHC", kv_connector_layout="BLHNC")
        assert config.kv_cache_layout is L.LBNHC
        assert not config.resolves_kv_cache_layout
        assert config.with_resolved_layout([{"a": FULL8}]) is config

    def test_no_layout_given_resolves_provisionally_then_in_planning(self) -> None:
        """Without a layout the config holds the spec-free resolution and planning finishes it."""
        config = PlanningConfig(attention_backends=[_backend("a")])
        assert config.resolves_kv_cache_layout and config.kv_cache_layout is L.LBNHC
        resolved = config.with_resolved_layout([{"t": FULL8, "d": REPLICATED4}])
        assert resolved.kv_cache_layout is L.BLNHC
        assert not resolved.resolves_kv_cache_layout

    def test_legacy_names_are_accepted(self) -> None:
        """NHD and HND name LBNHC and LBHNC, as in vLLM."""
        config = PlanningConfig(env_kv_cache_layout="HND", kv_connector_layout="nhd")
        assert (config.env_kv_cache_layout, config.kv_connector_layout) == (L.LBHNC, L.LBNHC)
        assert config.kv_cache_layout is L.LBHNC

    def test_evolve_keeps_a_given_layout(self) -> None:
        """attrs.evolve passes the layout, so the copy has it as given."""
        config = PlanningConfig(kv_connector_layout="BLHNC")
        assert not attrs.evolve(config, max_model_len=64).resolves_kv_cache_layout

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"kv_connector_layout": "XYZ"}, r"kv_connector_layout='XYZ' must be None or"),
            ({"env_kv_cache_layout": 3}, r"env_kv_cache_layout=3 must be None or"),
            ({"attention_backends": "FLASH"}, r"attention_backends='FLASH' must be a sequence"),
            ({"attention_backends": [1]}, r"attention_backends contains 1"),
            (
                {
                    "attention_backends": [
                        AttentionBackend(name="a", layers={"x"}),
                        AttentionBackend(name="b", layers={"x"}),
                    ]
                },
                r"layer 'x' runs both 'a' and 'b'",
            ),
            (
                {"attention_backends": [AttentionBackend(name="a"), AttentionBackend(name="b")]},
                r"\['a', 'b'\] all name no layers",
            ),
            (
                {
                    "attention_backends": [
                        _backend("a", L.LBNHC, layers={"x"}),
                        _backend("b", L.BLHNC, layers={"y"}),
                    ]
                },
                r"a: \['LBNHC'\]; b: \['BLHNC'\]",
            ),
            (
                {"attention_backends": [_backend("a", L.LBNHC)], "env_kv_cache_layout": "BLHNC"},
                r"VLLM_KV_CACHE_LAYOUT=BLHNC .*\['LBNHC'\]",
            ),
            (
                {"hisparse": {}, "kv_connector_layout": "LBNHC"},
                r"kv_connector_layout=LBNHC contradicts PlanningConfig.hisparse.*BLHNC",
            ),
        ],
    )
    def test_bad_values_are_config_errors(self, kwargs: dict[str, Any], match: str) -> None:
        """Each bad value or contradiction is a ConfigError naming the field(s) and value(s)."""
        with pytest.raises(ConfigError, match=match):
            PlanningConfig(**kwargs)

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"name": ""}, r"AttentionBackend.name='' must be"),
            ({"name": "a", "layers": "x"}, r"AttentionBackend.layers='x' must be"),
            ({"name": "a", "supported_kv_cache_layouts": []}, r"at least one layout"),
            ({"name": "a", "supported_kv_cache_layouts": ["QQ"]}, r"supported_kv_cache_layouts"),
            ({"name": "a", "supported_kernel_block_sizes": [0]}, r"contains 0"),
            ({"name": "a", "supported_kernel_block_sizes": 16}, r"=16 must be a sequence"),
        ],
    )
    def test_bad_backends_are_config_errors(self, kwargs: dict[str, Any], match: str) -> None:
        """AttentionBackend's fields are validated and the error names the field and value."""
        with pytest.raises(ConfigError, match=match):
            AttentionBackend(**kwargs)

    def test_backends_of_a_worker(self) -> None:
        """A worker runs the backends naming its layers, and the catch-all for the others."""
        a = AttentionBackend(name="a", layers={"x"})
        rest = AttentionBackend(name="rest")
        config = PlanningConfig(attention_backends=[a, rest])
        assert config.backends_of(["x"]) == [a]
        assert config.backends_of(["x", "y"]) == [a, rest]
        assert config.backends_of([]) == []


class TestPlanningResolves:
    """plan_kv_cache resolves the layout before grouping when the config leaves it open."""

    def test_backends_preferring_block_outer_pack(self) -> None:
        """A backend preferring BLNHC makes the plan's layout block-outermost."""
        config = PlanningConfig(
            attention_backends=[_backend("outer", L.BLNHC, L.LBNHC)], max_model_len=256
        )
        plan = plan_kv_cache(None, config, [{"f": FULL8, "s": SWA8}], 1 << 26)
        (kv_cache_config,) = plan.configs
        assert kv_cache_config.kv_cache_layout is L.BLNHC

    def test_contradiction_found_only_with_specs_is_raised_by_planning(self) -> None:
        """Mixed shapes with only LHBNC allowed are refused when planning sees the specs."""
        config = PlanningConfig(attention_backends=[_backend("heads", L.LHBNC)])
        assert config.kv_cache_layout is L.LHBNC
        with pytest.raises(LayoutResolutionError, match="block-compact"):
            plan_kv_cache(None, config, [{"a": FULL8, "b": FULL4}], 1 << 26)

    def test_hisparse_with_its_connector_plans_block_outermost(self) -> None:
        """HiSparse with no layout given plans in its connector's BLHNC, said or not.

        vLLM's HiSparse runs through its ``HiSparseConnector``, whose required
        layout is BLHNC: a config with ``hisparse`` requires it by itself (it
        planned LBNHC and was refused as not block-outermost before).
        """
        from kvref.hisparse import resolve_hisparse_specs

        source = sparse_mla_source()
        indexer = sparse_mla_indexer()
        hisparse: dict[str, Any] = {"hisparse": {"index_topk": 2048}, "host_pool_bytes": 1 << 28}
        plain = PlanningConfig(**hisparse)
        connected = PlanningConfig(kv_connector_layout=HISPARSE_CONNECTOR_LAYOUT, **hisparse)
        specs = resolve_hisparse_specs(connected, {"m0": source, "i0": indexer})
        assert plain.resolves_kv_cache_layout and plain.required_connector_layout is L.BLHNC
        plan = plan_kv_cache(None, connected, [specs], 1 << 30)
        assert {c.kv_cache_layout for c in plan.configs} == {L.BLHNC}
        assert plan_kv_cache(None, plain, [specs], 1 << 30).configs == plan.configs

    def test_kernel_sizes_do_not_change_the_layout(self) -> None:
        """Kernel block sizes alone describe backends but leave the default preference."""
        config = PlanningConfig(
            attention_backends=[
                AttentionBackend(name="k", supported_kernel_block_sizes=[MultipleOf(16)])
            ]
        )
        plan = plan_kv_cache(None, config, [{"a": FULL8}], 1 << 26)
        assert plan.configs[0].kv_cache_layout is L.LBNHC
