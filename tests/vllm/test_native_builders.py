"""Meta-tests: the kit's verdicts on vLLM-native vendor builders (tests/vllm/native_builders).

Platform vendors write builders against vLLM, not kvref: subclasses of
vLLM's ``DefaultKVCacheConfigBuilder`` over vLLM's own spec classes and the
real ``VllmConfig``.  The kit loads them through its adapter and must:

- pass the legal ones, except for the invariants that vLLM 0.33.0's own
  code breaks (docs/vllm.md), which a vLLM-native builder inherits wherever
  it calls ``super()``: each such failure must be reported as inherited;
- fail each broken one with the invariant its docstring names, as the
  builder's own finding (not inherited), and otherwise only with what the
  builder declares sees the same bug from another side, or inherits.

Every verdict is checked twice: the fast tier (every submission; the legal
builders' under the newest release, the broken ones' under each) at one seed
with the paper invariants and half a default run's budget
(:data:`FAST_EXAMPLES` per scenario), the ``slow`` tier with the whole
catalog at the default 50 per scenario, two seeds and reach measured.  A
planted bug must be caught with the fewer draws, a stricter claim.  The
legal builders' proof of no false alarm at the default budget is the slow
tier and ``benchmarks/native_sweep.py`` (seeds 1-5 under each release); at
the default budget their fast runs were the suite's longest tests (60-180 s
each on a loaded 2-core machine), which is why the fast tier runs them at the
broken builders' budget (docs/performance.md, sixth session).
Each run must also have drawn the model family that opens the builder's
gate, and a cheap check proves the gates open on the kit's own examples of
that family, so that a pass is never a pass of ``super()`` alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from drawn import drawn_examples

# tests/ is on sys.path during a full run, and tests/vllm then looks like a
# namespace package called "vllm": ask for a real vLLM module.
pytest.importorskip("vllm.v1.core.kv_cache_planning")

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder

from conformance import Report, check_builder
from conformance.check.catalog import catalog
from conformance.harness.adapters import load_builder
from conformance.upstream import DEFECTS
from kvref.interop import vllm as iv
from kvref.versions import NEWEST, installed_vllm_version

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
PKG = "tests.vllm.native_builders"

#: What the installed release's own default builder breaks (docs/vllm.md,
#: conformance/upstream.py): under 0.33.0 the PP projection of an empty group
#: (vLLM issue 54711, seen by Core's check and where one pipeline stage is
#: placed), in both releases the block-ID alias of layer-outer groups whose
#: layers of one page ask for different ``block_stride_alignment`` (seen on
#: paper, on the device and as a pitch).
UPSTREAM = frozenset(
    inv
    for d in DEFECTS
    if (release := installed_vllm_version()) in d.versions
    for inv in d.invariants_in(release)
)

#: The fast tier's invariants: every paper check but the twin-process one
#: (device, serving, profiling and the twin run in the slow tier).
PAPER = tuple(
    inv.id
    for inv in catalog()
    if inv.id.startswith(("KV-CALL", "KV-GROUP", "KV-PLACE", "KV-CORE"))
    and inv.id != "KV-GROUP-HASH-STABLE"
)
FAST_SEED = 1
#: Examples per scenario of a fast-tier run, as the kvref-native meta-tests'
#: budget: half the draws of a default run; the slow tier and the seed sweep
#: prove every verdict at the default 50.
FAST_EXAMPLES = 25
SLOW_SEEDS = (1, 2)


@dataclass(frozen=True)
class Case:
    """One native builder and what the kit must say about it.

    Attributes:
        name: ``module:Class`` inside :data:`PKG`.
        family: the built-in family whose examples open the builder's gate
            (``None``: none does).
        meant: the invariant a broken builder's planted bug must fail
            (``None``: a legal builder).
        also: invariants that see the same bug from another side.
        fast: whether the fast tier checks it (a legal builder with every paper
            invariant, a broken one with its meant invariant alone).
        some_seeds: why a planted bug is caught at some seeds only (empty: at
            every seed); the seed sweeps then expect it without requiring it.
    """

    name: str
    family: str | None
    meant: str | None = None
    also: frozenset[str] = field(default_factory=frozenset)
    fast: bool = True
    some_seeds: str = ""

    @property
    def qualname(self) -> str:
        """The builder's ``module:Class`` as the kit loads it."""
        return f"{PKG}.{self.name}"

    @property
    def id(self) -> str:
        """The test id: the class name."""
        return self.name.partition(":")[2]


LEGAL = (
    # super() wherever the kit goes: the slow tier's full runs check it.
    Case("hydra:HydraPassThroughBuilder", None, fast=False),
    Case("deepseek_v32:DeepSeekV32TupleBuilder", "deepseek_v32"),
    Case("glm5:GLM5TopDownBuilder", "glm5"),
    Case("deepseek_v4:DeepSeekV4TupleBuilder", "deepseek_v4", fast=False),
    # Every target layer in a group of its own, drafters kept together (wasteful, legal).
    Case("drafts:ScattersTargetsBuilder", None),
    # vLLM's plan on a backing padded to 4 KiB per block (legal padding).
    Case("padded:Padded4KiBBuilder", None),
    # Group specs that ask block strides for more alignment than the layers (legal).
    Case("alignment:DmaAlignedGroupsBuilder", None),
    # Long full-attention tensors cut into descriptor-sized chunks, addresses kept.
    Case("descriptors:DescriptorChunksBuilder", None),
    # Group specs without a TP shard count: no replication claimed (legal).  The
    # fast tier's verdicts are tests/vllm/test_tp_shards_native.py's.
    Case("tp_shards:DropsTPShardsBuilder", None, fast=False),
)
BROKEN = (
    Case(
        "deepseek_v4_mtp_bug:DeepSeekV4MTPOverlapBuilder",
        "deepseek_v4",
        "KV-PLACE-NO-LAYER-OVERLAP",
        # The device tags and the serving simulation see the overwrite too.
        frozenset({"KV-DEV-TAGS", "KV-SERVE-ISOLATION", "KV-SERVE-POOL"}),
    ),
    Case(
        "glm5_bugs:GLM5ShortBackingBuilder",
        "glm5",
        "KV-PLACE-BACKING-SIZE",
        # The last block's pages lie past the short backing (on paper, as
        # views, as tags, for served requests); Core sees a block of slack;
        # vLLM 0.34.0's worker cannot cut it into whole segments.
        frozenset(
            {
                "KV-WORKER-BLOCK-SEGMENTS",
                "KV-PLACE-IN-BOUNDS",
                "KV-CORE-SLACK",
                "KV-DEV-VIEWS",
                "KV-DEV-TAGS",
                "KV-SERVE-ISOLATION",
                "KV-SERVE-POOL",
            }
        ),
    ),
    Case(
        "glm5_bugs:GLM5ReversingBuilder",
        "glm5",
        "KV-PLACE-INPUT-UNCHANGED",
        # The config echoes the reversed groups.
        frozenset({"KV-PLACE-GROUPS-ECHOED"}),
    ),
    Case(
        "glm5_bugs:GLM5DropsMTPBuilder",
        "glm5",
        "KV-GROUP-PARTITION",
        # vLLM's Core asserts the partition (an AssertionError, untyped),
        # and the dropped layer has no tensor.
        frozenset({"KV-CALL-RAISES", "KV-CORE-ERROR-TYPED", "KV-PLACE-LAYER-MISSING"}),
    ),
    Case(
        "deepseek_v32_bug:DeepSeekV32PoolBytesBugBuilder",
        "deepseek_v32",
        "KV-PLACE-POOL-BYTES",
        # Core sizes the pool with the short block and plans more blocks than fit;
        # vLLM 0.34.0's worker takes the placement's own bytes per block.
        frozenset({"KV-CORE-MEMORY", "KV-CORE-SLACK", "KV-CORE-ADMISSION", "KV-WORKER-POOL-BYTES"}),
    ),
    Case(
        "pool_bytes_mutates:CompactsGroupsBuilder",
        None,
        "KV-PLACE-INPUT-UNCHANGED",
        # Core then places a stage with fewer groups than the global grouping.
        frozenset({"KV-PLACE-GROUPS-ECHOED", "KV-CORE-WORKER-LAYERS", "KV-CALL-RAISES"}),
    ),
    Case(
        "alignment:DropsAlignmentBuilder",
        None,
        "KV-GROUP-SPEC-MEANING",
        # Placed from the weakened group specs, strides may leave the layers' pitch.
        frozenset({"KV-PLACE-PAGE-PITCH"}),
    ),
    Case(
        "descriptors:StaleChunkOffsetBuilder",
        None,
        "KV-PLACE-NO-LAYER-OVERLAP",
        # The device tags and the serving simulation see the overwrite too.
        frozenset({"KV-DEV-TAGS", "KV-SERVE-ISOLATION", "KV-SERVE-POOL"}),
    ),
    Case(
        "wide_fields:SignedFastPathBuilder",
        None,
        "KV-PLACE-NO-BLOCK-ALIAS",
        # The wrapped layer stride lands one block's layers on each other too;
        # beside host groups the same pages are judged by their own invariant;
        # vLLM 0.34.0's worker refuses the stride, or its committed blocks leave
        # their segments.
        frozenset(
            {
                "KV-PLACE-NO-LAYER-OVERLAP",
                "KV-HOST-DEVICE-SAFE",
                "KV-WORKER-LAYER-REGIONS",
                "KV-WORKER-COMMITTED",
            }
        ),
    ),
    Case("retention:RetentionDroppedBuilder", None, "KV-PLACE-RETENTION"),
    Case("tp_shards:ClaimsReplicatedKVBuilder", None, "KV-GROUP-TP-SHARDS", fast=False),
    Case(
        "drafts:ScattersDraftsBuilder",
        "drafts",
        "KV-GROUP-DRAFTS-TOGETHER",
        # A moved EAGLE-3 head whose page differs from its target's leaves
        # groups of two page sizes, which vLLM's layer-outer placement (its
        # super()) refuses with a ValueError.  The moved drafter's own group
        # holds no layer of the earlier pipeline stages, where vLLM's Core
        # projection defect then hands those stages foreign layers: caused
        # by this invalid grouping, so not vLLM's default's to inherit.
        frozenset({"KV-CALL-RAISES", "KV-CORE-WORKER-LAYERS"}),
    ),
)
ALL = LEGAL + BROKEN


def _seeded(cases: Sequence[Case]) -> list[Any]:
    """``cases`` as parameters; one caught at some seeds only is an expected, unrequired catch."""
    return [
        pytest.param(c, marks=pytest.mark.xfail(strict=False, reason=c.some_seeds))
        if c.some_seeds
        else c
        for c in cases
    ]


#: Seeds beyond the fast and slow tiers' at which the planted bugs are caught
#: (seeds 1-5).  The two behind a family sub-structure (an MTP draft
#: layer, every DeepSeek-V3.2 layer indexed on a block-outer layout) were
#: caught at some seeds only before the focus (conformance/extensions/focus/).
MORE_SEEDS = (3, 4, 5)


def failed_ids(report: Report) -> set[str]:
    """Ids of every invariant that failed or could not be judged (both fail a run)."""
    return {r.id for r in report.results if r.status in ("fail", "inconclusive")}


def _describe(report: Report) -> list[tuple[str, str, str]]:
    return [
        (r.id, r.status, str((r.violations or (r.reason,))[0])[:300])
        for r in report.results
        if r.status in ("fail", "inconclusive")
    ]


def drew(report: Report, family: str) -> int:
    """How many examples of ``family`` the run's placement and Core scenarios drew."""
    return sum(
        report.coverage.get(s, {}).get("families", {}).get(family, 0) for s in ("placement", "core")
    )


def worker_refused(case: Case, report: Report) -> frozenset[str]:
    """What the run's release of vLLM's worker refuses of a legal builder (its ``WORKER_REFUSED``).

    Legal by the interface's text, yet not accepted by that release's GPU
    worker (tests/vllm/test_worker_accept_native.py proves each).
    """
    native: Any = load_builder(case.qualname)
    refused = getattr(native.native_cls, "WORKER_REFUSED", {})
    return frozenset(refused.get(report.contract.removeprefix("vLLM "), frozenset()))


def assert_verdict(case: Case, report: Report) -> None:
    """The legal pass, the broken fail as meant; anything else only as an inherited defect."""
    failed = failed_ids(report)
    by_id = {r.id: r for r in report.results}
    if case.family is not None:
        assert drew(report, case.family) >= 2, report.coverage.get("placement")
    if case.meant is None:
        assert failed <= UPSTREAM | worker_refused(case, report), _describe(report)
    else:
        assert case.meant in failed, _describe(report)
        assert not by_id[case.meant].inherited, by_id[case.meant]
        assert by_id[case.meant].violations, by_id[case.meant]
        assert failed <= {case.meant} | case.also | UPSTREAM, _describe(report)
    # What vLLM's own default breaks is reported as inherited, never as the vendor's.
    for inv in failed & UPSTREAM - case.also - {case.meant}:
        assert by_id[inv].inherited, (inv, by_id[inv].violations)


def run_kit(case: Case, seed: int, select: tuple[str, ...] | None, **kw: Any) -> Report:
    """The kit's default run (profile ci, 50 examples per scenario) of ``case``'s builder."""
    # Reach is measured only where a test asks for it (TestReach).
    kw.setdefault("reach", False)
    return check_builder(load_builder(case.qualname), seed=seed, select=select, shrink=False, **kw)


class _FastRuns(dict[str, Report]):
    """Each builder's fast-tier run, made on first use."""

    def __missing__(self, qualname: str) -> Report:
        case = next(c for c in ALL if c.qualname == qualname)
        # The paper invariants for legal and broken builders alike: a selection
        # of one invariant runs fewer scenarios, whose first deals teach the
        # focus less (conformance/extensions/focus/) than the default run's.
        report = self[qualname] = run_kit(case, FAST_SEED, PAPER, max_examples=FAST_EXAMPLES)
        return report


@pytest.fixture(scope="module")
def fast_runs() -> Iterator[dict[str, Report]]:
    """The fast-tier runs, shared by the module's tests."""
    yield _FastRuns()


class TestLoading:
    """The kit loads every native builder through its vLLM adapter."""

    @pytest.mark.parametrize("case", ALL, ids=lambda c: c.id)
    def test_wrapped_as_vllm_native(self, case: Case) -> None:
        """``module:Class`` gives an adapter over the native class, which subclasses vLLM's."""
        adapter: Any = load_builder(case.qualname)
        assert issubclass(adapter.native_cls, DefaultKVCacheConfigBuilder)
        assert adapter.native_cls.__module__ == case.qualname.partition(":")[0]
        assert callable(adapter.kvref_core)
        # The adapter forwards the pool-bytes hook only where the native class overrides it.
        overrides = "_get_pool_bytes_per_block" in vars(adapter)
        native = adapter.native_cls._get_pool_bytes_per_block
        assert overrides == (native is not DefaultKVCacheConfigBuilder._get_pool_bytes_per_block)


class TestGatesOpen:
    """The kit's own examples of each family open the builder's gate (its code is reached)."""

    @pytest.mark.parametrize("case", [c for c in LEGAL if c.family is not None], ids=lambda c: c.id)
    def test_family_examples_are_placed_by_the_platform(self, case: Case) -> None:
        """Some drawn example of the family is placed by the builder's own slot plan."""
        assert case.family is not None
        native = load_builder(case.qualname).native_cls  # type: ignore[union-attr]
        builder = native()
        opened = 0
        for example in drawn_examples(32, case.family):
            vcfg = iv.to_vllm_config(example.config)
            specs = iv.specs_to_vllm(example.merged)
            groups = builder.get_kv_cache_groups(vcfg, dict(specs))
            opened += builder._slot_plan(vcfg, groups) is not None
        assert opened >= 1

    def test_unknown_family_never_opens_hydra(self) -> None:
        """No built-in family makes Hydra names: the pass-through's grouping is vLLM's."""
        native = load_builder(LEGAL[0].qualname).native_cls  # type: ignore[union-attr]
        for family in ("glm5", "deepseek_v4", "hybrid"):
            for example in drawn_examples(3, family):
                vcfg = iv.to_vllm_config(example.config)
                specs = iv.specs_to_vllm(example.merged)
                ours = native().get_kv_cache_groups(vcfg, dict(specs))
                theirs = DefaultKVCacheConfigBuilder().get_kv_cache_groups(vcfg, dict(specs))
                assert ours == theirs


def _legal_fast() -> list[Any]:
    """The fast tier's legal builders: every submission under the newest release.

    Under an older release they run in the slow tier (``-m slow``), with the
    slow tier's own runs: a legal vLLM-native builder's no-false-alarm under
    that release is proven on every submission by the field-bug pairs'
    legal builders, the vendor subclass, kvref's own vLLM builder and vLLM's
    default (tests/vllm/test_field_bugs_native.py, test_vllm_builder_kit.py,
    test_vllm_path.py), and for this whole corpus by ``-m slow`` and
    ``benchmarks/native_sweep.py``.  The broken builders' catches, which
    depend on what each release inherits, stay in every release's run.
    """
    cases = [c for c in LEGAL if c.fast]
    if installed_vllm_version() == NEWEST:
        return list(cases)
    return [pytest.param(c, marks=pytest.mark.slow, id=c.id) for c in cases]


class TestFastVerdicts:
    """One seed: legal builders pass the paper invariants, broken ones fail the one meant."""

    @pytest.mark.parametrize("case", _legal_fast(), ids=lambda c: getattr(c, "id", c))
    def test_legal_builder_passes(self, fast_runs: dict[str, Report], case: Case) -> None:
        """Only vLLM's own upstream defects fail, each reported as inherited."""
        assert_verdict(case, fast_runs[case.qualname])

    @pytest.mark.parametrize("case", [c for c in BROKEN if c.fast], ids=lambda c: c.id)
    def test_planted_bug_is_caught(self, fast_runs: dict[str, Report], case: Case) -> None:
        """The meant invariant fails, as the builder's own finding; nothing unmeant fails."""
        assert_verdict(case, fast_runs[case.qualname])


@pytest.mark.slow
class TestFullCatalog:
    """The whole catalog at two seeds (device, serving, profiling and the twin included)."""

    @pytest.mark.parametrize("seed", SLOW_SEEDS)
    @pytest.mark.parametrize("case", _seeded(ALL), ids=lambda c: c.id)
    def test_verdict(self, case: Case, seed: int) -> None:
        """The same verdicts with every invariant of the catalog."""
        assert_verdict(case, run_kit(case, seed, None))


def _failed(data: dict[str, Any]) -> set[str]:
    """Ids of a JSON report's results that failed or could not be judged."""
    return {r["id"] for r in data["results"] if r["status"] in ("fail", "inconclusive")}


def assert_caught_in_json(case: Case, data: dict[str, Any]) -> None:
    """A JSON report of a broken builder: not OK, its bug its own finding, nothing unmeant."""
    failed = _failed(data)
    assert not data["ok"]
    assert case.meant in failed, failed
    assert failed <= {case.meant} | case.also | UPSTREAM, failed
    assert not next(r for r in data["results"] if r["id"] == case.meant)["inherited"]


def _cli(case: Case, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    argv = [sys.executable, "-m", "conformance.cli", case.qualname, "--seed", str(FAST_SEED)]
    argv += ["--json", str(out), "--no-database", *extra]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.exists(), done.stdout[-2000:] + done.stderr[-2000:]
    return done.returncode, json.loads(out.read_text())


_CLI_SELECT = ("--select", "KV-PLACE-BACKING-SIZE,KV-PLACE-IN-BOUNDS", "--no-reach")


class TestCLI:
    """``python -m conformance.cli tests.vllm.native_builders.<mod>:<Class>`` gives the verdicts."""

    # The same proof on the same builder, named on the command line, is the
    # whole run of tests/vllm/test_shard_native.py (default suite).
    @pytest.mark.slow
    def test_broken_is_caught(self, tmp_path: Path) -> None:
        """The GLM-5 short backing, named on the command line, is caught as the builder's own."""
        broken = next(c for c in BROKEN if c.meant == "KV-PLACE-BACKING-SIZE")
        rc, data = _cli(broken, tmp_path / "broken.json", *_CLI_SELECT)
        assert rc == 1
        assert_caught_in_json(broken, data)

    # The legal builders' verdicts are TestFastVerdicts'; a builder named on the
    # command line is tests/vllm/test_vllm_path.py's (vLLM's default, by name).
    @pytest.mark.slow
    def test_legal_passes(self, tmp_path: Path) -> None:
        """The legal GLM-5 builder, named on the command line, fails nothing of its own."""
        legal = next(c for c in LEGAL if c.family == "glm5")
        rc, data = _cli(legal, tmp_path / "legal.json", *_CLI_SELECT)
        failed = _failed(data)
        assert failed <= UPSTREAM, failed
        assert rc == (0 if data["ok"] else 1)
        assert data["builder"] == legal.qualname

    @pytest.mark.slow
    def test_default_run(self, tmp_path: Path) -> None:
        """The CLI's default run (whole catalog, reach measured) on the same two builders."""
        legal = next(c for c in LEGAL if c.family == "glm5")
        broken = next(c for c in BROKEN if c.meant == "KV-PLACE-BACKING-SIZE")
        _, data = _cli(legal, tmp_path / "legal.json")
        failed = _failed(data)
        assert failed <= UPSTREAM, failed
        _, data = _cli(broken, tmp_path / "broken.json")
        failed = _failed(data)
        assert broken.meant in failed and failed <= {broken.meant} | broken.also | UPSTREAM


#: The least share of its own module's lines a family builder's default run
#: must execute (the gates, the grouping and the placement it owns).
MIN_REACH = 85.0


@pytest.mark.slow
class TestReach:
    """The default run (seed 1, reach measured) executes the gated code of each builder."""

    @pytest.mark.parametrize("case", [c for c in ALL if c.family], ids=lambda c: c.id)
    def test_family_code_is_reached(self, case: Case) -> None:
        """The builder's own module is reached, and its verdict is the one meant."""
        report = run_kit(case, FAST_SEED, None, reach=True)
        assert report.reach is not None
        module = case.qualname.partition(":")[0].rpartition(".")[2] + ".py"
        (own,) = [m for m in report.reach["modules"] if Path(m["path"]).name == module]
        assert own["percent"] >= MIN_REACH, own
        assert_verdict(case, report)

    def test_pass_through_gates_shut(self) -> None:
        """The Hydra gate is evaluated on every model, its specialisation never entered."""
        case = LEGAL[0]
        report = run_kit(case, FAST_SEED, None, reach=True)
        assert report.reach is not None
        (own,) = [m for m in report.reach["modules"] if m["path"].endswith("hydra.py")]
        assert {"_one_table", "_promoted"} <= set(own["unreached_functions"]), own
        assert "hydra_key" not in own["unreached_functions"], own
        assert_verdict(case, report)


@pytest.mark.slow
@pytest.mark.parametrize("seed", MORE_SEEDS)
@pytest.mark.parametrize("case", _seeded(BROKEN), ids=lambda c: c.id)
def test_caught_at_more_seeds(case: Case, seed: int) -> None:
    """The default run (the whole catalog) catches each planted bug at seeds 3-5 too, as meant."""
    assert_verdict(case, run_kit(case, seed, None))
