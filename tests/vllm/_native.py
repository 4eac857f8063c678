"""A kit context over a vLLM-native builder named ``module:Class``, as the kit loads it."""

from __future__ import annotations

from conformance.harness.adapters import load_builder
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory

__all__ = ["native_context"]


def native_context(qualname: str) -> Context:
    """The builder through the vLLM adapter, with vLLM's own Core flow for the core scenario."""
    builder = load_builder(qualname)
    guard = Guard(120.0)
    return Context(
        factory=make_factory(builder, guard),
        guard=guard,
        core=getattr(builder, "kvref_core", None),
    )
