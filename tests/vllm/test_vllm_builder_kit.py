"""The kit's verdicts on kvref's vLLM-native builder and on vendor subclasses of it.

``kvref.interop.vllm_builder:KvrefKVCacheConfigBuilder`` is a vLLM-native
builder: the kit runs it behind its vLLM adapter, with vLLM's own Core flow,
and it must pass every invariant (kvref's reference keeps the contract
where vLLM's default does not: nothing is inherited).  A vendor subclass
that specialises MLA placements and calls ``super()`` for the rest
(tests/vllm/native_builders/kvref_mla.py) must pass too, and one with a
planted bug in its specialisation must fail as its own finding.

The fast tier is lean (one seed, few examples); the ``slow`` tier sweeps
seeds 1-5 with the whole catalog at the default budget.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from drawn import drawn_examples

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from test_native_builders import PAPER, Case, assert_verdict, drew, failed_ids

from conformance import Report, check_builder
from conformance.harness.adapters import load_builder
from kvref.interop import vllm as iv
from kvref.interop import vllm_builder as vb

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
#: The builder as the kit and its CLI name it.
NAME = "kvref.interop.vllm_builder:KvrefKVCacheConfigBuilder"

LEGAL = Case("kvref_mla:KvrefMLAGranuleBuilder", "mla")
BROKEN = Case(
    "kvref_mla:KvrefMLAShortBackingBuilder",
    "mla",
    "KV-PLACE-IN-BOUNDS",
    # The padded stride is not the backing over the block count, and the
    # worker's views of the last blocks reach past the storage.
    frozenset({"KV-PLACE-BLOCK-STRIDE", "KV-DEV-VIEWS"}),
)
#: Examples per scenario of the fast vendor runs (the native meta-tests' broken budget).
VENDOR_EXAMPLES = 25


def _run_cli(out: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-m", "conformance.cli", NAME, "--json", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    return done.returncode, json.loads(out.read_text()), done.stdout + done.stderr


class TestKit:
    """The kit passes kvref's vLLM-native builder with no failure."""

    def test_cli_passes_the_whole_catalog(self, tmp_path: Path) -> None:
        """``kvref-conformance NAME`` exits 0: every invariant passes or cannot apply here."""
        code, report, output = _run_cli(
            tmp_path / "report.json", "--seed", "1", "--max-examples", "5"
        )
        statuses = {r["id"]: r["status"] for r in report["results"]}
        assert code == 0, output[-3000:]
        assert report["ok"]
        assert not {i for i, s in statuses.items() if s in ("fail", "inconclusive")}
        # Most of the catalog judged, not waived: the N/A ones are the device
        # counters a CPU lacks and the rules of the other vLLM release.
        assert sum(s == "pass" for s in statuses.values()) >= 45, statuses

    def test_loaded_behind_the_vllm_adapter(self) -> None:
        """The kit sees a vLLM-native class and runs vLLM's own Core flow around it."""
        adapter: Any = load_builder(NAME)
        assert adapter.native_cls is vb.builder_class()
        assert callable(adapter.kvref_core)
        # vLLM's default pool-bytes hook: the adapter does not forward an override.
        assert "_get_pool_bytes_per_block" not in vars(adapter)


def _vendor_run(case: Case, seed: int, select: tuple[str, ...] | None, **kw: Any) -> Report:
    return check_builder(
        load_builder(case.qualname),
        seed=seed,
        select=select,
        shrink=False,
        reach=False,
        **kw,
    )


class TestVendorSubclass:
    """A subclass specialising MLA and calling ``super()`` passes; its planted bug is its own."""

    def test_gate_opens_on_the_kits_mla_examples(self) -> None:
        """Some MLA example of the kit is placed by the subclass's own code, not super()'s alone."""
        from tests.vllm.native_builders.kvref_mla import KvrefMLAGranuleBuilder

        opened = 0
        for example in drawn_examples(64, "mla"):
            vcfg = iv.to_vllm_config(example.config)
            builder = KvrefMLAGranuleBuilder()
            groups = builder.get_kv_cache_groups(vcfg, iv.specs_to_vllm(example.merged))
            ours = builder.get_kv_cache_config_from_groups(vcfg, groups, 3)
            plain = vb.builder_class()().get_kv_cache_config_from_groups(vcfg, groups, 3)
            opened += ours != plain
        assert opened >= 1

    def test_legal_subclass_passes(self) -> None:
        """The granule subclass passes the paper invariants; nothing is inherited or failed."""
        report = _vendor_run(LEGAL, 1, PAPER, max_examples=VENDOR_EXAMPLES)
        assert drew(report, "mla") >= 2
        assert not failed_ids(report), failed_ids(report)

    def test_planted_bug_is_its_own_finding(self) -> None:
        """The short backing fails KV-PLACE-IN-BOUNDS as the subclass's finding, nothing unmeant."""
        report = _vendor_run(BROKEN, 1, PAPER, max_examples=VENDOR_EXAMPLES)
        assert_verdict(BROKEN, report)
        assert not next(r for r in report.results if r.id == BROKEN.meant).inherited


@pytest.mark.slow
class TestSeedSweep:
    """Seeds 1-5, the whole catalog, the default budget (as benchmarks/vllm_builder_sweep.py)."""

    @pytest.mark.parametrize("seed", (1, 2, 3, 4, 5))
    def test_builder_passes(self, seed: int) -> None:
        """kvref's builder fails nothing at any seed."""
        report = check_builder(load_builder(NAME), seed=seed, shrink=False, reach=False)
        assert report.ok and not failed_ids(report), failed_ids(report)

    @pytest.mark.parametrize("seed", (1, 2, 3, 4, 5))
    @pytest.mark.parametrize("case", (LEGAL, BROKEN), ids=lambda c: c.id)
    def test_vendor_verdicts(self, case: Case, seed: int) -> None:
        """The subclasses' verdicts hold at every seed and with the whole catalog."""
        assert_verdict(case, _vendor_run(case, seed, None))
