"""The extensions' contributions: scenarios and invariants that join the core in their places."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conformance
from conformance.check.catalog import catalog, modules
from conformance.extensions.contributions import CONTRIBUTIONS, woven
from conformance.scenarios import registry

KIT = Path(conformance.__file__).parent


def test_woven_places_each_run_before_its_anchor_in_table_order() -> None:
    placed = [(("x",), "c"), (("z",), None), (("y1", "y2"), "c")]
    assert woven(("a", "b", "c"), str, placed) == ("a", "b", "x", "y1", "y2", "c", "z")
    assert woven(("a",), str, []) == ("a",)
    with pytest.raises(ValueError, match="'nowhere' is not among"):
        woven(("a",), str, [(("x",), "nowhere")])


def test_the_extensions_keep_their_places_in_the_run_and_the_catalog() -> None:
    assert registry.names() == (
        "grouping",
        "placement",
        "host",
        "core",
        "profiling",
        "device",
        "serve",
        "processes",
    )
    ordered = modules()
    device = ordered.index("conformance.extensions.device.rows")
    assert ordered[device - 1 : device + 3] == (
        "conformance.check.processes",
        "conformance.extensions.device.rows",
        "conformance.extensions.device.kernel",
        "conformance.check.profiling",
    )
    assert ordered[-5:] == (
        "conformance.check.profiling",
        "conformance.extensions.hisparse.pool",
        "conformance.extensions.hisparse.groups",
        "conformance.extensions.hisparse.runs",
        "conformance.extensions.serve.invariants",
    )
    ids = [inv.id for inv in catalog()]
    assert ids[-6:] == [
        "KV-HOST-HISPARSE-POOL",
        "KV-GROUP-HISPARSE-HOT-BLOCKS",
        "KV-GROUP-HISPARSE-ROLES",
        "KV-HOST-HISPARSE-RUNS",
        "KV-SERVE-ISOLATION",
        "KV-SERVE-POOL",
    ]
    assert {inv.id for inv in catalog() if inv.scenario == "device"} >= {"KV-DEV-TAGS"}


def test_each_contribution_names_modules_of_its_own_folder() -> None:
    for contribution in CONTRIBUTIONS:
        folder = KIT / "extensions" / contribution.extension
        assert folder.is_dir(), folder
        named = [
            *contribution.check_modules,
            *(r.partition(":")[0] for r in contribution.scenarios),
        ]
        assert named
        for module in named:
            assert module.startswith(f"conformance.extensions.{contribution.extension}."), module
            assert (KIT.parent / (module.replace(".", "/") + ".py")).is_file(), module


_WITHOUT = """
import conformance, sys
from pathlib import Path
assert Path(conformance.__file__).parent == Path(sys.argv[1]), conformance.__file__
from conformance.check.catalog import catalog
from conformance.run.runner import check_builder
from conformance.scenarios.registry import names
from kvref import ReferenceKVCacheConfigBuilder

print(" ".join(names()))
print(" ".join(inv.id for inv in catalog()))
report = check_builder(
    ReferenceKVCacheConfigBuilder, select=["KV-GROUP-NONEMPTY"], max_examples=2, seed=1,
    isolate=False, reach=False, database=None, focus="off",
)
print([(r.id, r.status) for r in report.results])
"""


@pytest.mark.parametrize(
    ("extension", "scenario", "prefixes"),
    [
        ("device", "device", ("KV-DEV-",)),
        ("serve", "serve", ("KV-SERVE-",)),
        # No scenario of its own: its invariants are judged on the core's.
        ("hisparse", None, ("KV-HOST-HISPARSE-", "KV-GROUP-HISPARSE-")),
    ],
)
def test_a_kit_without_an_extension_folder_runs_without_its_invariants(
    tmp_path: Path, extension: str, scenario: str | None, prefixes: tuple[str, ...]
) -> None:
    # A copy of the kit with the extension's folder and its entry deleted, as a maintainer would.
    kit = tmp_path / "conformance"
    shutil.copytree(KIT, kit, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(kit / "extensions" / extension)
    table = kit / "extensions" / "contributions.py"
    table.write_text(
        table.read_text()
        + textwrap.dedent(f"""
            CONTRIBUTIONS = tuple(c for c in CONTRIBUTIONS if c.extension != {extension!r})
            """)
    )
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT, str(kit)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    scenarios, ids, results = done.stdout.splitlines()[-3:]
    # Exactly the extension's scenario and invariants are gone; the rest keep their order.
    assert scenarios.split() == [name for name in registry.names() if name != scenario]
    assert ids.split() == [inv.id for inv in catalog() if not inv.id.startswith(prefixes)]
    assert len(ids.split()) < len(catalog())
    assert results == "[('KV-GROUP-NONEMPTY', 'pass')]"
