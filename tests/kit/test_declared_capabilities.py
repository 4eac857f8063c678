"""A builder's own ``kvref_unsupported``: honoured as declared, and a misspelt one is refused.

The option (``--unsupported``) is checked in tests/kit/test_cli.py; this is the
class attribute, read as data from the builder's worker.  A misspelt name
was ignored, and the invariants it meant to opt out of were judged; a lone
name was read letter by letter.  The vLLM-native form:
tests/vllm/test_declared_capabilities_native.py.
"""

from __future__ import annotations

import pytest

from conformance import OptionError, check_builder
from kvref import ReferenceKVCacheConfigBuilder


class Misspelt(ReferenceKVCacheConfigBuilder):
    """Means to opt out of host residency; misspells it."""

    kvref_unsupported = ("host_residnet",)


class LoneName(ReferenceKVCacheConfigBuilder):
    """Declares one capability as a plain string."""

    kvref_unsupported = "host_resident"


def _run(builder: type, isolate: bool) -> dict[str, str]:
    report = check_builder(
        builder, select=["KV-HOST-TENSORS"], max_examples=3, seed=1, isolate=isolate, database=None
    )
    return {r.id: r.status for r in report.results}


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
def test_a_misspelt_capability_is_a_usage_error(isolate: bool) -> None:
    """Refused before any example, naming the value and the capabilities there are."""
    with pytest.raises(OptionError, match=r"'host_residnet'.*host_resident, host_outside_hisparse"):
        _run(Misspelt, isolate)


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
def test_a_lone_name_is_one_capability(isolate: bool) -> None:
    """``kvref_unsupported = "host_resident"`` skips the host invariants."""
    assert _run(LoneName, isolate) == {"KV-HOST-TENSORS": "skipped"}
