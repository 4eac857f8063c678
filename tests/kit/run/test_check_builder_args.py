"""What check_builder takes: its options by name, and a builder (never anything else)."""

from __future__ import annotations

import pytest


def test_check_builder_names_a_misspelt_option() -> None:
    """An unknown keyword is a usage error naming it and its value, before any example runs."""
    from conformance.run.options import OptionError
    from conformance.run.runner import check_builder
    from kvref import ReferenceKVCacheConfigBuilder

    with pytest.raises(OptionError, match=r"max_exmaples=3: check_builder has no such option"):
        check_builder(ReferenceKVCacheConfigBuilder, max_exmaples=3)


@pytest.mark.parametrize(
    "given",
    [print, 3, object, object()],
    ids=["a-function", "a-number", "a-plain-class", "an-object"],
)
def test_check_builder_refuses_what_is_no_builder(given: object) -> None:
    """'check_builder(print) runs and returns ok=True for KV-CALL-CONSTRUCT': a usage error now."""
    from conformance.run.options import OptionError
    from conformance.run.runner import check_builder

    with pytest.raises(OptionError, match="is not a KV cache config builder class or instance"):
        check_builder(given, max_examples=1, seed=1)  # type: ignore[arg-type]
