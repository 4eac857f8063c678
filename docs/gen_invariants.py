"""Generate docs/invariants.md from the catalog (one source of truth).

Run: python docs/gen_invariants.py.
"""

from __future__ import annotations

from pathlib import Path

from conformance.device_invariants import invariants as device_invariants
from conformance.invariants import CATALOG


def render() -> str:
    """The catalog as a Markdown table."""
    lines = [
        "# Invariant catalog",
        "",
        "Generated from `conformance/invariants.py` and `conformance/device.py` by",
        "`python docs/gen_invariants.py`; do not edit by hand. Ids are stable: use them",
        "in `--select` and xfail files.",
        "",
        "| id | scenario | SPEC | requires | title |",
        "|---|---|---|---|---|",
    ]
    for inv in [*CATALOG, *device_invariants("cpu", None)]:
        requires = ", ".join(sorted(inv.requires)) or "-"
        lines.append(f"| `{inv.id}` | {inv.scenario} | {inv.spec} | {requires} | {inv.title} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    Path(__file__).with_name("invariants.md").write_text(render())
