"""pytest plugin: ``pytest --pyargs conformance --kv-builder X --kv-device D``.

One pytest item per invariant (the items share no state, so ``pytest -n auto``
spreads them over cores); JUnit output through pytest's own ``--junitxml``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.adapters import DEFAULT_BUILDER

__all__ = ["pytest_addoption", "pytest_report_header"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the kit's options in one group."""
    group = parser.getgroup("kvref-conformance", "kvref KV cache builder conformance")
    group.addoption("--kv-builder", default=DEFAULT_BUILDER, help="module:Class of the builder")
    group.addoption("--kv-device", default="cpu", help="torch device for the device checks")
    group.addoption("--kv-max-examples", type=int, default=None, help="examples per scenario")
    group.addoption("--kv-seed", type=int, default=None, help="seed (default: random)")
    group.addoption("--kv-profile", default="ci", help="ci or thorough")
    group.addoption("--kv-xfail-file", default=None, help="file of invariant ids expected to fail")
    group.addoption("--kv-unsupported", default="", help="capabilities the builder lacks")
    group.addoption("--kv-timeout", type=float, default=10.0, help="per-call deadline, seconds")
    group.addoption(
        "--kv-database",
        default=None,
        help="Hypothesis example database directory: replay and save counterexamples",
    )


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Name exactly what is being tested, so a typo shows at once."""
    builder = config.getoption("--kv-builder", default=None)
    if builder is None:
        return None
    xfail = config.getoption("--kv-xfail-file")
    return [
        f"kvref-conformance: builder={builder} device={config.getoption('--kv-device')} "
        f"profile={config.getoption('--kv-profile')} "
        f"max_examples={config.getoption('--kv-max-examples')} "
        f"seed={config.getoption('--kv-seed')} "
        f"xfail_file={xfail} unsupported={config.getoption('--kv-unsupported') or '-'}"
    ]


def xfail_ids(config: pytest.Config) -> list[str]:
    """Ids of the ``--kv-xfail-file``, warning about ids that match no invariant."""
    from conformance.invariants import CATALOG
    from conformance.reports import read_xfail_file

    path = config.getoption("--kv-xfail-file")
    if not path:
        return []
    ids = read_xfail_file(Path(path))
    known = {inv.id for inv in CATALOG}
    for entry in ids:
        if entry not in known and not entry.startswith("KV-DEV"):
            config.issue_config_time_warning(
                pytest.PytestWarning(f"--kv-xfail-file names {entry!r}, which is no invariant id"),
                stacklevel=2,
            )
    return ids
