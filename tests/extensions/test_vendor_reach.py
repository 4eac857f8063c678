"""The reach proof: vendor-style builders are reached, their bugs caught, their legal plans passed.

The builders in :mod:`vendor_builders` specialise the way platform builders
do (``super()`` for ordinary models). Each is checked by the kit's default
run (profile ``ci``, 50 examples per scenario) and again with its own models
supplied as vendor models (``--models``, kvref-models/1 dumps in
``tests/data/models/``):

- the DeepSeek-V4 shared-tuple builder with a planted MTP slot overlap fails
  ``KV-PLACE-NO-LAYER-OVERLAP`` (and, where their own examples hold an MTP
  layer, ``KV-DEV-TAGS`` and ``KV-SERVE-ISOLATION``) and nothing else, with
  the MTP layer named, not inherited from the reference;
- the same builder without the bug and the GLM-5 builder that lays KDA
  states on another group's MLA slots pass every invariant;
- every one of them has at least 90% of its own lines reached;
- the Hydra builder, whose family no built-in generator produces, is
  reported as never entered by the default run and reached through
  ``--models``.

The default example stream does not depend on the builder, and every
scenario deals its examples over all the built-in families
(conformance/run/strata.py), so any seed meets the DeepSeek-V4 and GLM-5
families in every scenario; the default runs are checked at two seeds
(``KVREF_REACH_SEEDS`` picks others). Each test checks that its run drew the
family it needs, so a change of the generators shows up as that, not as a
missed bug.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from conformance import Report, check_builder
from conformance.cli import main

pytest.importorskip("coverage")

pytestmark = pytest.mark.slow

#: Seeds of the default runs (any seed should do: the strata deal every family).
SEEDS = tuple(int(x) for x in os.environ.get("KVREF_REACH_SEEDS", "1,2").split(","))
#: Mixed with the built-in families, the vendor models take half of every
#: scenario's examples. ``--models-only`` is no way round the mixing: with
#: only vendor models some invariants are never judged (inconclusive), e.g.
#: KV-PLACE-BLOCK-STRIDE for builders that answer ``_get_pool_bytes_per_block``.
VENDOR_SEED = 4
MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
DSV4_MODELS = str(MODELS / "acme_dsv4_mtp.json")
GLM5_MODELS = str(MODELS / "acme_glm5_mtp.json")
HYDRA_MODELS = str(MODELS / "acme_hydra.json")

BUG = "vendor_builders.deepseek_v4_mtp_bug:DeepSeekV4MTPSlotBugBuilder"
DSV4 = "vendor_builders.deepseek_v4:DeepSeekV4Builder"
GLM5 = "vendor_builders.glm5:GLM5Builder"
HYDRA = "vendor_builders.hydra:HydraBuilder"

#: Each builder's own modules (the vendor code it runs; slots.py is shared
#: arithmetic that only the DeepSeek builders use in full).
OWN: dict[str, tuple[str, ...]] = {
    BUG: ("deepseek_v4_mtp_bug.py", "deepseek_v4.py", "slots.py"),
    DSV4: ("deepseek_v4.py", "slots.py"),
    GLM5: ("glm5.py",),
    HYDRA: ("hydra.py",),
}
#: The planted bug's invariant.
CAUGHT_BY = "KV-PLACE-NO-LAYER-OVERLAP"
#: What else may report it, when its own examples hold an MTP layer: the
#: device check finds the overwritten tags, the serving simulation the
#: overwritten KV of live requests.
ALSO_BY = {"KV-DEV-TAGS", "KV-SERVE-ISOLATION"}


def _builder(qualname: str) -> Any:
    import importlib

    module, _, cls = qualname.partition(":")
    return getattr(importlib.import_module(module), cls)


def _run(qualname: str, seed: int, models: str | None = None) -> Report:
    return check_builder(_builder(qualname), seed=seed, reach=True, models=models)


def own_reach(report: Report, qualname: str) -> dict[str, float]:
    """Percent reached per own module of the builder, and ``"all"`` over them together."""
    assert report.reach is not None, "reach was not measured"
    modules = {Path(m["path"]).name: m for m in report.reach["modules"]}
    own = [modules[name] for name in OWN[qualname]]
    out = {Path(m["path"]).name: float(m["percent"]) for m in own}
    statements = sum(m["statements"] for m in own)
    out["all"] = 100.0 * sum(m["executed"] for m in own) / statements
    return out


def failed_ids(report: Report) -> set[str]:
    """Ids of every invariant that failed or could not be judged (both fail a run)."""
    return {r.id for r in report.results if r.status in ("fail", "inconclusive")}


def drew(report: Report, family: str, scenarios: Sequence[str] = ("placement", "core")) -> int:
    """How many examples of ``family`` the run drew in ``scenarios``."""
    return sum(report.coverage[s]["families"].get(family, 0) for s in scenarios)


def _assert_reached(report: Report, qualname: str) -> None:
    reach = own_reach(report, qualname)
    assert reach["all"] >= 90.0, (reach, report.reach and report.reach["lines"])
    assert all(p >= 90.0 for p in reach.values()), reach


def _assert_planted_bug_caught(report: Report) -> None:
    failed = failed_ids(report)
    assert CAUGHT_BY in failed and failed <= {CAUGHT_BY, *ALSO_BY}, failed
    overlap = next(r for r in report.results if r.id == CAUGHT_BY)
    # The MTP tuple overlaps the last decoder layer's: the finding names one of them.
    assert overlap.violations, overlap
    text = " ".join(str(v) for v in overlap.violations)
    assert "overlaps" in text and ".mtp_block." in text + (overlap.counterexample or "")
    # The reference never places an MTP tuple over another layer: the bug is the vendor's.
    assert not overlap.inherited


@pytest.fixture(scope="module", params=SEEDS, ids=lambda seed: f"seed{seed}")
def default_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Report]]:
    """The default run of each builder at one seed, once per module."""
    yield {q: _run(q, request.param) for q in (BUG, DSV4, GLM5, HYDRA)}


@pytest.fixture(scope="module")
def vendor_runs() -> Iterator[dict[str, Report]]:
    """Each builder's run with its own models mixed in (``--models``)."""
    yield {
        BUG: _run(BUG, VENDOR_SEED, DSV4_MODELS),
        DSV4: _run(DSV4, VENDOR_SEED, DSV4_MODELS),
        GLM5: _run(GLM5, VENDOR_SEED, GLM5_MODELS),
    }


class TestDefaultRun:
    """The default run reaches the specialisations the built-in families produce."""

    def test_stream_draws_the_families(self, default_runs: dict[str, Report]) -> None:
        """Every placement and Core scenario meets DeepSeek-V4 and GLM-5 models, at any seed."""
        report = default_runs[DSV4]
        for scenario in ("placement", "core"):
            families = report.coverage[scenario]["families"]
            assert families.get("deepseek_v4", 0) >= 2, families
            assert families.get("glm5", 0) >= 2, families

    def test_planted_mtp_bug_is_caught(self, default_runs: dict[str, Report]) -> None:
        """The MTP slot overlap is KV-PLACE-NO-LAYER-OVERLAP's finding (KV-DEV-TAGS on device)."""
        report = default_runs[BUG]
        _assert_planted_bug_caught(report)
        _assert_reached(report, BUG)

    @pytest.mark.parametrize("qualname", [DSV4, GLM5])
    def test_legal_builders_pass(self, default_runs: dict[str, Report], qualname: str) -> None:
        """Shared tuples and states on another group's slots raise no alarm, and are reached."""
        report = default_runs[qualname]
        assert report.ok, [(r.id, r.status, r.reason) for r in report.failures]
        assert failed_ids(report) == set()
        _assert_reached(report, qualname)

    def test_unknown_family_is_never_entered(self, default_runs: dict[str, Report]) -> None:
        """No built-in family makes Hydra models: the report names what was never entered."""
        report = default_runs[HYDRA]
        assert report.ok
        assert own_reach(report, HYDRA)["all"] < 90.0
        assert report.reach is not None
        (hydra,) = [m for m in report.reach["modules"] if m["path"].endswith("hydra.py")]
        assert "_promoted" in hydra["unreached_functions"]
        warning = next(line for line in report.reach["lines"] if "never entered" in line)
        assert "--models" in warning


class TestVendorModels:
    """The same proof with the builders' own models supplied as vendor models."""

    def test_planted_mtp_bug_is_caught(self, vendor_runs: dict[str, Report]) -> None:
        """Every vendor model has an MTP layer: the overlap is found from them too."""
        report = vendor_runs[BUG]
        assert drew(report, "vendor") >= 40, report.coverage["placement"]["families"]
        _assert_planted_bug_caught(report)
        _assert_reached(report, BUG)
        overlap = next(r for r in report.results if r.id == CAUGHT_BY)
        assert "--models" in (overlap.reproduce or "")

    @pytest.mark.parametrize("qualname", [DSV4, GLM5])
    def test_legal_builders_pass(self, vendor_runs: dict[str, Report], qualname: str) -> None:
        """Pipeline splits, growths and shrinks of the vendor models raise no alarm."""
        report = vendor_runs[qualname]
        assert drew(report, "vendor") >= 40, report.coverage["placement"]["families"]
        assert report.ok, [(r.id, r.status, r.reason) for r in report.failures]
        _assert_reached(report, qualname)

    def test_unknown_family_through_the_cli(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--models`` with a JSON dump reaches the Hydra specialisation; the reports say so."""
        out = tmp_path / "hydra.json"
        argv = [HYDRA, "--models", HYDRA_MODELS, "--seed", str(VENDOR_SEED)]
        reach = ["--reach", "vendor_builders.hydra", "--min-reach", "90"]
        assert main([*argv, *reach, "--no-database", "--json", str(out)]) == 0
        text = capsys.readouterr().out
        assert "reached" in text and "hydra.py" in text
        data = json.loads(out.read_text())
        (hydra,) = [m for m in data["reach"]["modules"] if m["path"].endswith("hydra.py")]
        assert hydra["percent"] >= 90.0, hydra
        assert data["options"]["models"] == HYDRA_MODELS
