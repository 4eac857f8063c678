"""What reach counts of a vendor package: the code the builder's own code names.

Fast, static: no kit run (tests/extensions/test_reach.py runs the kit, in the slow tier).
"""

from __future__ import annotations

from pathlib import Path

from reach_pkg.gated import GatedBuilder

from conformance.extensions.reach.figures import summary
from conformance.harness.call_graph import callee_closure
from conformance.harness.reach import ReachMeter, _source_of, reach_scope


def test_shared_helper_counts_where_named() -> None:
    """A shared module's functions count where the builder's code names them, transitively.

    Named through a module alias, through a registry ``dict`` and through a
    method's own call; a class counts whole; a type named only in an
    annotation and a helper no code names do not count.
    """
    found = callee_closure([("callee_pkg.builder", "Builder")], "callee_pkg", _source_of)
    assert set(found.files) == {"callee_pkg.builder", "callee_pkg.shared"}
    assert found.names["callee_pkg.shared"] == {"Plan", "REGISTRY", "_inner", "registered"}
    assert found.names["callee_pkg.builder"] == {"Builder"}


def test_star_import_resolves_names_in_its_module(tmp_path: Path) -> None:
    """A name taken by ``from m import *`` is followed into ``m``; the rest of ``m`` is not."""
    pkg = tmp_path / "starpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lib.py").write_text("def a():\n    return 1\n\n\ndef b():\n    return 2\n")
    (pkg / "kv.py").write_text(
        "from starpkg.lib import *\n\n\nclass B:\n    def f(self):\n        return a()\n"
    )
    files = {"starpkg": pkg / "__init__.py", "starpkg.lib": pkg / "lib.py"}
    files["starpkg.kv"] = pkg / "kv.py"
    found = callee_closure([("starpkg.kv", "B")], "starpkg", files.get)
    assert found.names == {"starpkg.kv": {"B"}, "starpkg.lib": {"a"}}


def test_shared_slot_helpers_count_for_the_builder_that_names_them() -> None:
    """GLM-5's builder is not measured over DeepSeek-V4's helpers in their shared module."""
    from vendor_builders.deepseek_v4 import DeepSeekV4Builder
    from vendor_builders.glm5 import GLM5Builder

    dsv4_only = {"CacheTuple", "lay_out", "tuples_by_stem"}

    def slots(builder: type) -> frozenset[str]:
        counted = reach_scope(builder).counted or {}
        return next(names for path, names in counted.items() if path.endswith("slots.py"))

    assert not slots(GLM5Builder) & dsv4_only
    assert {"SlotPlanBuilder", "pack"} <= slots(GLM5Builder)
    assert dsv4_only <= slots(DeepSeekV4Builder)


def test_another_builders_helper_is_not_counted() -> None:
    """``other_page`` shares a module with the gated helper; no code of the builder names it."""
    meter = ReachMeter.for_builder(GatedBuilder)
    meter.start(trace_here=False)
    helper = next(m for m in summary(meter)["modules"] if m["path"].endswith("helper.py"))
    assert helper["unreached_functions"] == ["acme_page"]
