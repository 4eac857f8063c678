"""KV-GROUP-INPUT-UNCHANGED says what changed, and which rule it breaks."""

from __future__ import annotations

from types import SimpleNamespace

from conformance.check.catalog import catalog
from conformance.check.violations import Violation


def _judge(*mutations: str) -> list[Violation]:
    inv = next(i for i in catalog() if i.id == "KV-GROUP-INPUT-UNCHANGED")
    obs = SimpleNamespace(mutated=bool(mutations), mutations=mutations)
    found = inv.check(obs)
    assert isinstance(found, list)
    return found


def test_a_changed_spec_object_is_named_with_its_field() -> None:
    """A spec object padded in place: the message names the layer, the field, old and new."""
    found = _judge("spec of 'model.layers.0.attn'.block_size: 16 -> 32")
    assert len(found) == 1
    message = found[0].message
    assert "'model.layers.0.attn'.block_size: 16 -> 32" in message
    assert "nor change a spec object it was given" in message
    # The old message told the vendor in-place rewriting was allowed: it is not, for objects.
    assert "rewriting specs in place is allowed" not in message


def test_dropped_layers_are_named() -> None:
    """Layers removed from the dict: said as such."""
    (found,) = _judge("the dict's layers were added, removed or reordered")
    assert "added, removed or reordered" in found.message


def test_many_changes_are_counted() -> None:
    """More than four changes: four shown, the rest counted."""
    (found,) = _judge(*(f"spec of 'l{i}'.head_size: 64 -> 128" for i in range(6)))
    assert "'l3'" in found.message and "'l4'" not in found.message
    assert "(and 2 more)" in found.message


def test_an_unchanged_input_passes() -> None:
    """No mutation: nothing found."""
    assert _judge() == []
