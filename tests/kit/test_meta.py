"""Meta-tests: the kit catches each deliberately broken builder with the invariant meant for it."""

from __future__ import annotations

from pathlib import Path

import broken_builders
import pytest
import reproduce_lines

from conformance.check.catalog import catalog
from conformance.report.model import Report
from conformance.run.runner import check_builder
from kvref import ReferenceKVCacheConfigBuilder
from kvref.versions import rules

# Device checks are exercised on their own in tests/extensions/device/test_device.py.
_PAPER = ["KV-CALL", "KV-GROUP", "KV-PLACE", "KV-HOST", "KV-CORE"]


class TestReferenceIsClean:
    """The reference builder passes the whole catalog."""

    def test_every_invariant_passes(self) -> None:
        """Every invariant passes on the reference, and none goes unchecked."""
        report = check_builder(ReferenceKVCacheConfigBuilder, max_examples=40, seed=7)
        assert report.ok, [(r.id, r.violations, r.counterexample) for r in report.failures]
        statuses = {r.id: r.status for r in report.results}
        assert set(statuses) >= {inv.id for inv in catalog()}
        # cpu has no device memory counter: those two cannot apply there.
        unmeasurable = {"KV-DEV-ALLOC", "KV-DEV-HOST"}
        # The run judges the installed vLLM's contract: a release without the
        # extensible KV cache has none of its worker rules.
        if not rules(report.contract.removeprefix("vLLM ")).extensible_kv_cache:
            unmeasurable |= {i for i in statuses if i.startswith("KV-WORKER-")} - {
                "KV-WORKER-ONE-BACKING"
            }
        assert all(s == "pass" for i, s in statuses.items() if i not in unmeasurable), statuses
        assert all(statuses[i] == "not-applicable" for i in unmeasurable)
        assert statuses["KV-DEV-TAGS"] == statuses["KV-DEV-VIEWS"] == "pass"


#: Builders whose meta-test also shrinks (shrinking costs seconds per failure;
#: these cover grouping, placement and call failures; tests/kit/run/test_reproduce.py
#: shrinks every builder under `-m slow`).
SHRUNK = frozenset(
    {
        broken_builders.DroppedLayer,
        broken_builders.OverlappingBlocks,
        broken_builders.RaisesOnValidInput,
    }
)


def meta_selection(builder: type, *, wide: bool = False) -> list[str]:
    """The paper invariants judged in the scenarios where the builder's bug shows.

    Those scenarios are the ones that judge the meant invariant and the
    invariants the builder declares see the same bug (``ALSO``): a grouping
    bug is judged by grouping, Core and the profiling path, and the
    placement, host, device, serving and twin scenarios are not run for it.
    "Nothing unmeant fails" is then claimed inside those scenarios; ``wide``
    (the ``slow`` tier) runs every paper invariant in every scenario they
    read.  KV-GROUP-HASH-STABLE starts a second process per run; only the
    builder meant for it needs that.
    """
    invariants = catalog()
    chosen = [inv for inv in invariants if inv.id.startswith(tuple(_PAPER))]
    if not wide:
        by_id = {inv.id: inv for inv in invariants}
        seen = {s for i in (builder.CAUGHT_BY, *builder.ALSO) for s in by_id[i].scenarios}
        chosen = [inv for inv in chosen if set(inv.scenarios) <= seen]
    return [
        inv.id for inv in chosen if inv.id != "KV-GROUP-HASH-STABLE" or inv.id == builder.CAUGHT_BY
    ]


#: Broken builders the default generation no longer reaches (known gaps, named).
_GAPS: dict[str, str] = {}


#: Broken builders whose catch tests/kit/check/test_power.py and
#: tests/kit/generate/test_field_generation.py already prove in the default
#: suite, at the default count and with the same
#: assertions (meant invariant, nothing unmeant, a counterexample and a
#: reproduce line); their run here repeats that proof and is ``slow``.
_PROVEN_AT_DEFAULT_COUNT = frozenset(
    b.__name__ for b in (*broken_builders.POWER, *broken_builders.FIELD_REGIMES)
)


def _with_gaps(builders: list[type]) -> list[object]:
    params: list[object] = []
    for b in builders:
        marks: list[pytest.MarkDecorator] = []
        if b.__name__ in _GAPS:
            # A known gap is tracked under `-m slow` (strict: it fails there once closed).
            marks += [pytest.mark.xfail(strict=True, reason=_GAPS[b.__name__]), pytest.mark.slow]
        if b.__name__ in _PROVEN_AT_DEFAULT_COUNT:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(b, marks=marks) if marks else b)
    return params


@pytest.mark.parametrize(
    "builder", _with_gaps(list(broken_builders.ALL)), ids=lambda b: getattr(b, "__name__", str(b))
)
class TestBrokenBuildersAreCaught:
    """Each broken builder fails exactly the invariant meant to catch its bug."""

    @pytest.mark.parametrize("wide", [False, pytest.param(True, marks=pytest.mark.slow)])
    def test_caught_by_the_right_invariant(self, builder: type, tmp_path: Path, wide: bool) -> None:
        """The meant invariant fails, with a shrunk counterexample and a reproduce line.

        No other invariant of the scenarios that see the bug fails (of any
        scenario, ``wide``).  For ``broken_builders.REPRODUCED`` the printed
        line is rerun in a fresh process and fails the same invariant alone.
        """
        report = check_builder(
            builder,
            select=meta_selection(builder, wide=wide),
            max_examples=builder.EXAMPLES,
            seed=11,
            timeout=broken_builders.meta_timeout(builder),
            shrink=builder in SHRUNK,
            # Reach is not what a meta-test proves (tests/extensions/test_reach.py does).
            reach=False,
        )
        # Only the meant invariant, and those the builder declares see the same
        # bug from another side (each with its reason in tests/broken_builders/).
        broken_builders.assert_caught(report, builder.CAUGHT_BY, builder.ALSO)
        if builder in broken_builders.REPRODUCED and not wide:
            _assert_reproduces(report, builder, tmp_path)


def _assert_reproduces(report: Report, builder: type, cwd: Path) -> None:
    meant = builder.CAUGHT_BY
    line = report.result(meant).reproduce
    assert line is not None
    assert f"--select {meant}" in line and "--seed 11" in line
    assert f"--timeout {broken_builders.meta_timeout(builder):g}" in line
    assert line.split()[1] == f"{builder.__module__}:{builder.__name__}"
    done = reproduce_lines.run_line(line, cwd)
    rows = dict(reproduce_lines.ROW.findall(done.stdout))
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert rows == {meant: "FAIL"}, (rows, done.stdout[-2000:], done.stderr[-2000:])
    assert f"[{meant}]" in done.stdout


class TestEveryInvariantHasABrokenBuilder:
    """The meta-tests cover the catalog."""

    def test_catalog_covered(self) -> None:
        """Every paper invariant has a broken builder or a dedicated test that makes it fail."""
        covered = {b.CAUGHT_BY for b in broken_builders.ALL}
        # Core-flow invariants hold by construction under kvref's Core for any
        # honest builder; tests/kit/check/test_core_invariants.py breaks the flow itself.
        # The device checks have their fault tests in tests/extensions/device/test_device.py.
        # The serving invariants have theirs in tests/extensions/serve/test_serve.py.
        # vLLM's worker rules are release-bound: tests/kit/check/test_worker_accept.py
        # breaks each under every release that has it (tests/worker_builders.py).
        dedicated = {
            inv.id
            for inv in catalog()
            if inv.id.startswith(("KV-CORE", "KV-DEV", "KV-SERVE", "KV-WORKER"))
        }
        missing = {inv.id for inv in catalog()} - covered - dedicated
        assert not missing, missing
