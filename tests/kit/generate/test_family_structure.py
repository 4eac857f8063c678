"""Structure varies inside the families: optional parts are drawn, and shrink to absent.

A vendor builder enters its code only for the exact structure it was
written for; a family that draws one rigid structure tests only that one.
"""

from __future__ import annotations

from hypothesis import Phase, find, given, settings

from conformance.generate.families import family_strategy
from conformance.generate.records import Model
from kvref.specs import MLAAttentionSpec

OCCURS = settings(database=None, deadline=None, max_examples=500, phases=[Phase.generate])
MINIMAL = settings(database=None, deadline=None, derandomize=True)
FAST = settings(database=None, deadline=None, max_examples=60)

V32 = family_strategy("deepseek_v32")


def _stems(model: Model) -> dict[str, set[str]]:
    """Decoder-layer stem to the caches it carries (``attn``, ``indexer.k_cache``)."""
    out: dict[str, set[str]] = {}
    for name in model.specs:
        stem, _, role = name.partition(".self_attn.")
        out.setdefault(stem, set()).add(role)
    return out


def _unindexed(model: Model) -> int:
    return sum(1 for roles in _stems(model).values() if "indexer.k_cache" not in roles)


@FAST
@given(V32)
def test_v32_leader_iff_indexed(model: Model) -> None:
    """A latent leads an index group exactly when its layer has an indexer; MTP layers have one."""
    for stem, roles in _stems(model).items():
        latent = model.specs[f"{stem}.self_attn.attn"]
        assert isinstance(latent, MLAAttentionSpec)
        assert latent.is_index_group_leader == ("indexer.k_cache" in roles)
        if latent.is_draft:
            assert "indexer.k_cache" in roles


def test_v32_indexer_absence_occurs() -> None:
    """IndexCache-style layers without their indexer are drawn (and layers with it beside them)."""
    model = find(V32, lambda m: 0 < _unindexed(m) < len(_stems(m)), settings=OCCURS)
    assert _unindexed(model) > 0


def test_v32_shrinks_to_every_layer_indexed() -> None:
    """The simplest V3.2 model has every layer indexed: absent parts are not the minimum."""
    model = find(V32, lambda m: True, settings=MINIMAL)
    assert _unindexed(model) == 0
