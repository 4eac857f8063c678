"""Expectations manifests where docs/vendors.md imports them: :mod:`conformance.ci.expectations`."""

from conformance.ci.expectations import (
    FORMAT,
    Entry,
    ExpectationsError,
    Manifest,
    apply_expectations,
    load_manifest,
    resolve_manifest,
    shipped_manifests,
    update_manifest,
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
]
