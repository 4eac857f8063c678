"""How both DeepSeek-V4 builders read a cache's name: its decoder layer, role and table.

The name grammar and the slot order are the platform's, whatever form the
builder takes: the kvref-native builder (:mod:`vendor_builders.deepseek_v4`)
and its vLLM-native twin (tests/vllm/native_builders/deepseek_v4.py) both
parse names here and differ only in which spec classes each role accepts.
Plain Python only, so that either form imports it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["TABLES", "CacheLayer", "parse_cache"]

_LAYER = re.compile(
    r"^(?P<stem>.+?\.(?P<index>\d+)\.(?:mtp_block\.)?attn)"
    r"(?:\.(?P<role>indexer\.k_cache|swa_cache|compressor\.state_cache"
    r"|indexer\.compressor\.state_cache))?$"
)
#: Each role's table and its rank inside the decoder layer's tuple.
_ROLES: dict[str, tuple[str, int]] = {
    "latent": ("compressed", 0),
    "indexer.k_cache": ("compressed", 1),
    "swa_cache": ("window", 0),
    "compressor.state_cache": ("state", 0),
    "indexer.compressor.state_cache": ("state", 1),
}
#: The tables, in group order.
TABLES = ("compressed", "window", "state")


@dataclass(frozen=True)
class CacheLayer:
    """One cache of a DeepSeek-V4 decoder layer, as a builder reads its name and spec."""

    name: str
    stem: str
    index: int
    draft: bool
    role: str
    spec: Any

    @property
    def table(self) -> str:
        """The block table (group kind) the cache belongs to."""
        return _ROLES[self.role][0]

    @property
    def order(self) -> tuple[bool, int, int]:
        """Target layers by index first, then drafts; the tuple rank last."""
        return self.draft, self.index, _ROLES[self.role][1]

    @property
    def key(self) -> tuple[str, int, bool, int]:
        """``(stem, index, draft, rank)`` for :func:`~vendor_builders.slots.tuples_by_stem`."""
        return self.stem, self.index, self.draft, _ROLES[self.role][1]


def parse_cache(name: str, spec: Any, fits: Callable[[str, Any], bool]) -> CacheLayer | None:
    """The DeepSeek-V4 cache ``name`` holds, or ``None`` when it is not one.

    ``fits(table, spec)`` says whether the form's spec is one the table's kernels read.
    """
    match = _LAYER.match(name)
    role = (match["role"] or "latent") if match is not None else ""
    if match is None or not fits(_ROLES[role][0], spec):
        return None
    return CacheLayer(
        name=name,
        stem=match["stem"],
        index=int(match["index"]),
        draft=spec.is_draft,
        role=role,
        spec=spec,
    )
