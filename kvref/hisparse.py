"""HiSparse: sparse-MLA source KV kept on the host, device caches beside it (contract.md#hisparse).

With :attr:`PlanningConfig.hisparse <kvref.config.PlanningConfig.hisparse>`
set and MLA layers present, grouping takes HiSparse's own path (vLLM
``get_hisparse_kv_cache_groups``), in this order:

1. the **source** group: the sparse-MLA layers (``cache_role == "SPARSE"``),
   host-resident, role ``HISPARSE_SOURCE``;
2. the **indexer** group: the indexer MLA layers (``cache_role == "INDEXER"``),
   role ``HISPARSE_INDEXER``;
3. **resident** groups (:class:`~kvref.extra_specs.HiSparseResidentSpec`), then
   4. **hot** groups (:class:`~kvref.extra_specs.HiSparseHotSpec`): one pair per
   run of source layers whose pages fit the indexer page, over derived layer
   names ``<layer>.hisparse_resident`` and ``<layer>.hisparse_hot``;
5. the default grouping of every other layer.

A worker reports the derived resident and hot layers next to its MLA
layers (vLLM ``resolve_hisparse_specs``; here :func:`resolve_hisparse_specs`),
so that the groups partition its layers.  Placement keeps the source group
in a pinned host pool of ``host_pool_bytes // host_block_stride`` blocks
(:func:`host_pool_layout`) and needs a block-outermost device layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from kvref._math import cdiv, round_up
from kvref.config import HiSparseConfig, PlanningConfig
from kvref.errors import HiSparseError
from kvref.extra_specs import HiSparseHotSpec, HiSparseResidentSpec
from kvref.kernel_blocks import hisparse_kernel_block_size
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, MLAAttentionSpec, UniformTypeKVCacheSpecs, evolve_spec

__all__ = [
    "HOT_SUFFIX",
    "MAX_DEVICE_BUFFER_SIZE",
    "RESIDENT_SUFFIX",
    "HostPoolLayout",
    "device_buffer_size",
    "get_hisparse_kv_cache_groups",
    "host_pool_layout",
    "resolve_hisparse_specs",
]

HOT_SUFFIX = ".hisparse_hot"
RESIDENT_SUFFIX = ".hisparse_resident"
#: Hot-buffer rows are addressed by int16 slot indices.
MAX_DEVICE_BUFFER_SIZE = 2**15

#: The default grouping of the non-MLA layers (passed in to avoid an import circle).
RegularGrouping = Callable[[PlanningConfig, dict[str, KVCacheSpec]], list[KVCacheGroupSpec]]


def _settings(config: PlanningConfig) -> HiSparseConfig:
    if config.hisparse is None:  # pragma: no cover - callers check first
        raise HiSparseError("PlanningConfig.hisparse=None: HiSparse is off")
    return config.hisparse


def device_buffer_size(settings: HiSparseConfig, top_k: int) -> int:
    """Hot-buffer rows per request (vLLM ``ResolvedHiSparseConfig.device_buffer_size``).

    ``settings.device_buffer_size`` if set, else ``(max_decode_query_len + 1) * top_k``.

    Raises:
        HiSparseError: fewer rows than ``max_decode_query_len * top_k``, or more
            than the int16 slot limit of 32,768.
    """
    query = settings.max_decode_query_len
    minimum = query * top_k
    rows = settings.device_buffer_size
    if rows is None:
        rows = (query + 1) * top_k
    if rows < minimum:
        raise HiSparseError(
            f"HiSparseConfig.device_buffer_size={rows} must cover every decode query's "
            f"index_topk rows: max_decode_query_len={query} x index_topk={top_k} = {minimum}"
        )
    if rows > MAX_DEVICE_BUFFER_SIZE:
        raise HiSparseError(
            f"HiSparseConfig.device_buffer_size={rows} exceeds the int16 slot-index limit "
            f"of {MAX_DEVICE_BUFFER_SIZE}"
        )
    return rows


def _split_roles(
    mla: Mapping[str, MLAAttentionSpec],
) -> tuple[dict[str, MLAAttentionSpec], dict[str, MLAAttentionSpec]]:
    v4 = [n for n, s in mla.items() if s.model_version == "deepseek_v4"]
    if v4:
        raise HiSparseError(
            f"HiSparse does not support DeepSeek V4: layers {v4[:4]} have "
            "model_version='deepseek_v4'"
        )
    source = {n: s for n, s in mla.items() if s.cache_role == "SPARSE"}
    indexer = {n: s for n, s in mla.items() if s.cache_role == "INDEXER"}
    if not source or not indexer:
        missing = "sparse (cache_role='SPARSE')" if not source else "indexer (cache_role='INDEXER')"
        raise HiSparseError(
            f"HiSparse requires sparse-MLA and indexer cache specs, but no MLA layer is {missing}"
        )
    return source, indexer


def _top_k(settings: HiSparseConfig, source: Mapping[str, MLAAttentionSpec]) -> int:
    widths = []
    for name, spec in source.items():
        width = spec.topk_buffer_width
        if width is None:
            width = settings.index_topk
        if width is None:
            raise HiSparseError(
                f"HiSparseConfig.index_topk=None, and sparse-MLA layer {name!r} has no "
                "topk_buffer_width: the hot buffer cannot be sized"
            )
        widths.append(width)
    return max(widths)


def _hot_units(source: Mapping[str, MLAAttentionSpec]) -> list[list[tuple[str, MLAAttentionSpec]]]:
    # Layers sharing an index (a leader and its followers) stay in one hot group.
    units: list[list[tuple[str, MLAAttentionSpec]]] = []
    for name, spec in source.items():
        if spec.is_index_group_leader or not units:
            units.append([])
        units[-1].append((name, spec))
    return units


def _derived_pair(
    layers: Sequence[tuple[str, MLAAttentionSpec]], block_size: int, blocks_per_request: int
) -> tuple[KVCacheGroupSpec, KVCacheGroupSpec]:
    pages = sorted({spec.page_size_bytes for _, spec in layers})
    if len(pages) != 1:
        raise HiSparseError(
            f"HiSparse hot-cache groups require one page size, but sparse-MLA layers "
            f"{[n for n, _ in layers][:6]} have pages {pages}"
        )
    resident = KVCacheGroupSpec(
        layer_names=[name + RESIDENT_SUFFIX for name, _ in layers],
        kv_cache_spec=HiSparseResidentSpec(block_size=block_size, page_size=pages[0]),
        enable_kv_transfer=False,
    )
    hot = KVCacheGroupSpec(
        layer_names=[name + HOT_SUFFIX for name, _ in layers],
        kv_cache_spec=HiSparseHotSpec(
            block_size=block_size, page_size=pages[0], blocks_per_request=blocks_per_request
        ),
        enable_kv_transfer=False,
    )
    return resident, hot


def _lay_out(config: PlanningConfig, mla: Mapping[str, MLAAttentionSpec]) -> list[KVCacheGroupSpec]:
    """The source, indexer, resident and hot groups of the MLA layers (vLLM ``_lay_out_...``)."""
    wrapper = UniformTypeKVCacheSpecs.from_specs(dict(mla))
    if wrapper is None:
        sizes = sorted({(s.block_size, s.dcp_sharded) for s in mla.values()})
        raise HiSparseError(
            f"HiSparse requires one resolved GPU block size (and one dcp_sharded) for its MLA "
            f"layers, got (block_size, dcp_sharded) pairs {sizes}"
        )
    source, indexer = _split_roles(mla)
    block_size = wrapper.block_size
    settings = _settings(config)
    rows = device_buffer_size(settings, _top_k(settings, source))
    hot_blocks = cdiv(rows, block_size)

    indexer_page = sum(spec.page_size_bytes for spec in indexer.values())
    residents: list[KVCacheGroupSpec] = []
    hots: list[KVCacheGroupSpec] = []
    current: list[tuple[str, MLAAttentionSpec]] = []
    current_page = 0
    # Runs of index units are packed while they fit the indexer's page, so a
    # hot group never widens the device block beyond the indexer group.
    for unit in _hot_units(source):
        unit_page = sum(spec.page_size_bytes for _, spec in unit)
        if current and current_page + unit_page > indexer_page:
            resident, hot = _derived_pair(current, block_size, hot_blocks)
            residents.append(resident)
            hots.append(hot)
            current, current_page = [], 0
        current.extend(unit)
        current_page += unit_page
    if current:
        resident, hot = _derived_pair(current, block_size, hot_blocks)
        residents.append(resident)
        hots.append(hot)

    source_group = KVCacheGroupSpec(
        layer_names=list(source),
        kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs=dict(source)),
        host_resident=True,
        role="HISPARSE_SOURCE",
    )
    indexer_group = KVCacheGroupSpec(
        layer_names=list(indexer),
        kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs=dict(indexer)),
        role="HISPARSE_INDEXER",
    )
    return [source_group, indexer_group, *residents, *hots]


def _mla_specs(specs: Mapping[str, KVCacheSpec]) -> dict[str, MLAAttentionSpec]:
    return {n: s for n, s in specs.items() if isinstance(s, MLAAttentionSpec)}


def get_hisparse_kv_cache_groups(
    config: PlanningConfig, specs: Mapping[str, KVCacheSpec], regular: RegularGrouping
) -> list[KVCacheGroupSpec] | None:
    """HiSparse's groups, or ``None`` when HiSparse is off or there is no MLA layer.

    Resident and hot specs in ``specs`` are laid out again from the MLA
    layers they derive from; every other non-MLA layer is grouped by
    ``regular`` (the default grouping) and its groups come last.

    Raises:
        HiSparseError: see :class:`~kvref.errors.HiSparseError`.
    """
    if config.hisparse is None:
        return None
    mla = _mla_specs(specs)
    if not mla:
        return None
    others = {
        n: s
        for n, s in specs.items()
        if not isinstance(s, (MLAAttentionSpec, HiSparseHotSpec, HiSparseResidentSpec))
    }
    groups = _lay_out(config, mla)
    return groups + (regular(config, others) if others else [])


def resolve_hisparse_specs(
    config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
) -> dict[str, KVCacheSpec]:
    """A worker's specs with HiSparse's derived resident and hot layers added.

    vLLM's worker does this before reporting its specs.  The MLA layers first
    take the kernel block size every backend of theirs supports
    (:func:`kvref.kernel_blocks.hisparse_kernel_block_size`, from
    :attr:`PlanningConfig.attention_backends
    <kvref.config.PlanningConfig.attention_backends>`; without backends that
    is their own block size).  Without HiSparse or MLA layers the specs come
    back unchanged.

    Raises:
        HiSparseError: see :class:`~kvref.errors.HiSparseError`; also MLA layers
            of several block sizes, or backends that share no kernel block size.
    """
    out = dict(specs)
    if config.hisparse is None:
        return out
    mla = _mla_specs(specs)
    if not mla:
        return out
    size = hisparse_kernel_block_size(config, mla)
    if size is not None and any(spec.block_size != size for spec in mla.values()):
        mla = {name: evolve_spec(spec, block_size=size) for name, spec in mla.items()}
        out.update(mla)
    for group in _lay_out(config, mla):
        if isinstance(group.kv_cache_spec, (HiSparseHotSpec, HiSparseResidentSpec)):
            for name in group.layer_names:
                out[name] = group.kv_cache_spec
    return out


@attrs.frozen(kw_only=True)
class HostPoolLayout:
    """The pinned host pool of HiSparse's source group (vLLM ``HiSparseLayout``).

    Attributes:
        source_group: the host-resident group.
        host_num_blocks: host block IDs, ``host_pool_bytes // host_block_stride``.
        host_block_stride: host bytes per block: the source page, rounded up to
            the shared pool's alignment when local TP ranks share one pool.
        shared_host_pool: whether they do.
    """

    source_group: KVCacheGroupSpec
    host_num_blocks: int
    host_block_stride: int
    shared_host_pool: bool


def host_pool_layout(config: PlanningConfig, groups: Sequence[KVCacheGroupSpec]) -> HostPoolLayout:
    """Size HiSparse's host pool for ``groups`` (vLLM ``create_hisparse_layout``).

    Raises:
        HiSparseError: HiSparse is on but ``host_pool_bytes`` is ``None``; the
            groups do not hold exactly one host-resident group; the pool holds
            no block; or it holds fewer than ``cdiv(max_model_len, block_size) + 2``
            blocks (one request, the null block and a copy-on-write tail).
    """
    settings = _settings(config)
    if config.host_pool_bytes is None:
        raise HiSparseError(
            "PlanningConfig.host_pool_bytes=None: HiSparse requires a host pool "
            "(vLLM: a HiSparseConnector with host_pool_gib)"
        )
    host = [g for g in groups if g.host_resident]
    if len(host) != 1:
        raise HiSparseError(
            f"HiSparse needs exactly one host-resident (source) group, got {len(host)}: "
            "without sparse-MLA layers there is nothing to keep on the host"
        )
    (source,) = host
    stride = source.kv_cache_spec.page_size_bytes
    if settings.shared_host_pool:
        stride = round_up(stride, settings.host_block_alignment)
    blocks = config.host_pool_bytes // stride
    if blocks <= 0:
        raise HiSparseError(
            f"PlanningConfig.host_pool_bytes={config.host_pool_bytes} holds no HiSparse host "
            f"block of {stride} bytes"
        )
    needed = cdiv(config.max_model_len, source.kv_cache_spec.block_size) + 2
    if blocks < needed:
        raise HiSparseError(
            f"PlanningConfig.host_pool_bytes={config.host_pool_bytes} gives {blocks} HiSparse "
            f"host blocks of {stride} bytes, but max_model_len={config.max_model_len} needs "
            f"{needed}; increase the host pool"
        )
    return HostPoolLayout(
        source_group=source,
        host_num_blocks=blocks,
        host_block_stride=stride,
        shared_host_pool=settings.shared_host_pool,
    )
