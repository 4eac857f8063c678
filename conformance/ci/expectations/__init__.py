"""Expectations manifests: which invariants a builder is known to fail, why, and when.

A manifest is TOML (format ``kvref-expectations/1``, docs/vendors.md
"Expectations manifest"); the kit ships ``vllm-0.33.0`` and ``vllm-0.34.0``,
each release's documented defects.  ``--expectations NAME|PATH`` applies one, and
``--update-expectations FILE`` writes or refreshes one from a run.  From
Python::

    from conformance.ci.expectations import apply_expectations, load_manifest, resolve_manifest

    manifest = load_manifest(resolve_manifest("vllm-0.34.0"))
    report = apply_expectations(check_builder(MyBuilder), [manifest])
"""

from conformance.ci.expectations.apply import apply_expectations, update_manifest
from conformance.ci.expectations.manifest import (
    FORMAT,
    Entry,
    ExpectationsError,
    Manifest,
    load_manifest,
    resolve_manifest,
    shipped_manifests,
    xfail_manifest,
)

__all__ = [
    "FORMAT",
    "Entry",
    "ExpectationsError",
    "Manifest",
    "apply_expectations",
    "load_manifest",
    "resolve_manifest",
    "shipped_manifests",
    "update_manifest",
    "xfail_manifest",
]
