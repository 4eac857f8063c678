"""Broken builders of bugs seen in the field, and the regimes where they show."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from broken_builders._base import (
    Groups,
    Specs,
    _change_fields,
    _Grouping,
    _LayerOuter,
    _LayerSpecs,
    _Placement,
    _Regiven,
    _with_layer_specs,
    _with_tensors,
    member_of,
)
from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    PlanningConfig,
)
from kvref.specs import KVCacheSpec

# -- bugs seen in the field --------------------------------------------------------


@member_of("all", "field")
class ScatteredDrafts(_Grouping):
    """Moves the last of a group's equal-spec draft layers into a group of its own.

    Every layer keeps its spec and stays in one group, but vLLM's drafter
    asserts that its attention layers share one KV cache group.
    """

    CAUGHT_BY = "KV-GROUP-DRAFTS-TOGETHER"
    #: Its own second consequence: the moved draft layer's group next to a
    #: target group of another page, which a layer-outer layout cannot hold.
    ALSO = frozenset({"KV-CALL-RAISES"})
    #: Two equal draft layers outside a model-declared grouping are rare at seed 11.
    EXAMPLES = 60

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        from kvref import UniformTypeKVCacheSpecs

        if getattr(config, "hisparse", None) is not None:
            return groups  # HiSparse's groups carry roles: one bug, elsewhere
        for i, g in enumerate(groups):
            drafts = [n for n in g.layer_names if kv_cache_spec[n].is_draft]
            twins = [n for n in drafts if kv_cache_spec[n] == kv_cache_spec[drafts[-1]]]
            if len(twins) < 2:
                continue
            moved = twins[-1]
            kept = [n for n in g.layer_names if n != moved]
            spec = g.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = UniformTypeKVCacheSpecs(
                    kv_cache_specs={n: s for n, s in spec.kv_cache_specs.items() if n != moved}
                )
            groups[i] = attrs.evolve(g, layer_names=kept, kv_cache_spec=spec)
            groups.append(KVCacheGroupSpec(layer_names=[moved], kv_cache_spec=g.layer_spec(moved)))
            return groups
        return groups


@member_of("all", "field")
class HotIgnoresDecodeQuery(_Grouping):
    """Sizes HiSparse's hot groups for one top-k per request, whatever the settings say.

    A field bug: the hot buffer ignores speculative decoding's query length
    and an explicit ``device_buffer_size``, so the kernels write past a
    request's hot blocks.
    """

    CAUGHT_BY = "KV-GROUP-HISPARSE-HOT-BLOCKS"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        from kvref.extra_specs import HiSparseHotSpec
        from kvref.specs import MLAAttentionSpec

        settings = getattr(config, "hisparse", None)
        widths = [
            s.topk_buffer_width or (settings.index_topk if settings else None)
            for s in kv_cache_spec.values()
            if isinstance(s, MLAAttentionSpec) and s.cache_role == "SPARSE"
        ]
        if settings is None or not widths or None in widths:
            return groups
        top_k = max(w for w in widths if w is not None)
        for i, g in enumerate(groups):
            spec = g.kv_cache_spec
            if isinstance(spec, HiSparseHotSpec):
                blocks = -(-top_k // spec.block_size)
                groups[i] = attrs.evolve(
                    g, kv_cache_spec=attrs.evolve(spec, blocks_per_request=blocks)
                )
        return groups


@member_of("all", "field")
class RolelessSource(_Grouping):
    """Rebuilds HiSparse's source group without its role (vLLM then finds no host manager)."""

    CAUGHT_BY = "KV-GROUP-HISPARSE-ROLES"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        return [
            attrs.evolve(g, role="DEFAULT") if g.role == "HISPARSE_SOURCE" else g for g in groups
        ]


@member_of("all", "field")
class InterleavedHostPool(_Placement):
    """Lays HiSparse's host pool out block-interleaved: each host block holds every source page.

    Every host page stays in bounds and apart from the others, but vLLM's
    runtime reads each source layer's host pages as one run of
    ``host_num_blocks`` pages (contract.md#hisparse-host-runs).
    """

    CAUGHT_BY = "KV-HOST-HISPARSE-RUNS"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if config.hisparse is None:
            return result
        host = [t for t in result.kv_cache_tensors if t.host_resident]
        # One host block: the aligned page of every source layer, as LBNHC laid them out.
        block = sum(len(t.layers) * t.block_stride for t in host)
        tensors, offset = [], 0
        for t in result.kv_cache_tensors:
            if not t.host_resident:
                tensors.append(t)
                continue
            page = t.block_stride
            tensors.append(attrs.evolve(t, offset=offset, layer_stride=page, block_stride=block))
            offset += len(t.layers) * page
        return _with_tensors(result, tensors)


@member_of("all", "field_regimes")
class Wraps32(_Placement):
    """Writes strides and offsets through 32-bit descriptors: ``x & 0xFFFFFFFF``.

    Right for every plan under 4 GiB; past it a layer-outer layer stride
    (``num_blocks x page``) wraps, and the layers of a tensor alias.
    """

    CAUGHT_BY = "KV-PLACE-NO-BLOCK-ALIAS"
    #: The wrapped stride also lands layers of one block on each other, and
    #: device pages beside host groups are judged by their own invariant.
    ALSO = frozenset({"KV-PLACE-NO-LAYER-OVERLAP", "KV-HOST-DEVICE-SAFE"})
    EXAMPLES = 50

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        wrap = 0xFFFFFFFF
        return _change_fields(result, lambda x: x & wrap)


@member_of("all", "field_regimes")
class SignedWraps32(_Placement):
    """A descriptor's 32-bit fast path is signed: values in ``[2**31, 2**32)`` lose their top bit.

    Values from 4 GiB take the 64-bit path and are right, so only plans
    whose strides or offsets lie between 2 GiB and 4 GiB break: a
    layer-outer layer stride there wraps and the layers of a tensor alias.
    """

    CAUGHT_BY = "KV-PLACE-NO-BLOCK-ALIAS"
    #: As for Wraps32: one block's layers land on each other too.
    ALSO = frozenset({"KV-PLACE-NO-LAYER-OVERLAP", "KV-HOST-DEVICE-SAFE"})
    EXAMPLES = 50

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        def field(x: int) -> int:
            return x & 0x7FFFFFFF if 1 << 31 <= x < 1 << 32 else x

        return _change_fields(result, field)


@member_of("all", "field_regimes")
class DensePadded(_LayerOuter):
    """Steps a padded page's blocks by its dense bytes, as if no backend padded pages.

    Layer-outer layouts only: there each layer's blocks step by its own
    page, and a page of ``page_size_padded`` bytes must step by that
    (contract.md#page-pitch); the dense step reads the padding as data.
    """

    CAUGHT_BY = "KV-PLACE-PAGE-PITCH"
    #: The short step also lands the group's blocks on the next block's bytes
    #: of the groups aliasing it, beside host groups too; and where the padding
    #: comes from a block stride alignment (a compressed latent's 576-byte
    #: multiple), the dense step is no multiple of it.
    ALSO = frozenset({"KV-PLACE-NO-BLOCK-ALIAS", "KV-HOST-DEVICE-SAFE", "KV-PLACE-ALIGNMENT"})
    EXAMPLES = 50

    def restep(
        self, result: KVCacheConfig, tensor: KVCacheTensor, spec: KVCacheSpec
    ) -> KVCacheTensor:
        import math

        from kvref.layout import compute_layer_kv_cache_shape_bytes

        if spec.padded_page_size is None:
            return tensor
        dense = math.prod(compute_layer_kv_cache_shape_bytes(spec, 1)[1:])
        blocks = result.num_blocks_of(tensor)
        return attrs.evolve(tensor, block_stride=dense, layer_stride=dense * blocks)


@member_of("all", "field_regimes")
class LinearKernelPage(_Regiven):
    """Takes a kernel block's page as the cache block's page scaled down: ``page x k / block``.

    ``MultipleOf(b)`` asks the block stride to be a multiple of the layer's
    page at the kernel block ``k = gcd(b, block_size)``, with the MLA
    alignment padding recomputed at ``k`` (contract.md#views-and-strides).
    Scaling the padded page instead is right for dense pages and wrong for
    padded compressed ones (a DeepSeek-V4-style indexer read in 64-token
    kernel blocks): the stride honours an alignment no kernel asked for.
    Only a kernel block smaller than the cache block meets the bug.
    """

    CAUGHT_BY = "KV-PLACE-ALIGNMENT"
    #: The stride it picks is also not the aligned page the layout fixes, and
    #: device pages beside host groups are judged by their own invariant.
    ALSO = frozenset({"KV-PLACE-PAGE-PITCH", "KV-HOST-DEVICE-SAFE"})
    EXAMPLES = 50

    def regive(self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]) -> Groups:
        import math

        from kvref.specs import MultipleOf

        def scaled(spec: KVCacheSpec) -> KVCacheSpec:
            wanted = spec.block_stride_alignment
            if not isinstance(wanted, MultipleOf):
                return spec
            kernel = math.gcd(wanted.n, spec.block_size)
            if kernel == spec.block_size:
                return spec
            page = max(1, spec.page_size_bytes * kernel // spec.block_size)
            return attrs.evolve(spec, block_stride_alignment=page)

        return [_with_layer_specs(g, scaled) for g in kv_cache_groups]


@member_of("all", "field_regimes")
class InterleavedCompressed(_LayerOuter):
    """Lays compressed MLA caches out block-interleaved whatever the layout.

    A builder written for DeepSeek-V4's block-outer backends keeps a
    compressed tensor's layers side by side inside each block (layer stride
    one page, block stride the tensor's layers' pages) also in layer-outer
    layouts.
    The bytes stay in the tensor's region, but a layer-outer block must step
    the layer's aligned page (contract.md#page-pitch); groups aliasing the
    region then meet other block IDs.  Only compressed caches placed
    layer-outer meet the bug.
    """

    CAUGHT_BY = "KV-PLACE-PAGE-PITCH"
    #: Other groups aliasing the region see other blocks' bytes, beside host groups too.
    ALSO = frozenset({"KV-PLACE-NO-BLOCK-ALIAS", "KV-HOST-DEVICE-SAFE"})
    EXAMPLES = 50

    def restep(
        self, result: KVCacheConfig, tensor: KVCacheTensor, spec: KVCacheSpec
    ) -> KVCacheTensor:
        from kvref.specs import MLAAttentionSpec

        # One latent head: a block of every layer-outer layout is one run of the page.
        compressed = (
            isinstance(spec, MLAAttentionSpec)
            and spec.tokens_per_state_value > 1
            and spec.num_kv_heads == 1
        )
        if not compressed or len(tensor.layers) <= 1:
            return tensor
        page = tensor.block_stride
        return attrs.evolve(tensor, layer_stride=page, block_stride=len(tensor.layers) * page)


@member_of("all", "field_regimes")
class PlacesAbsentLayers(_Regiven):
    """Places the layers a projected uniform-type group names in its wrapper, on every worker.

    vLLM 0.33.0's own placement does this (contract.md#deliberate-differences,
    difference 2): a pipeline worker holding no layer of a uniform-type group
    gets the group with no layer names but the global wrapper, and placing
    the wrapper's layers gives the worker tensors of layers it does not have.
    Only a worker without any layer of such a group meets the bug.
    """

    CAUGHT_BY = "KV-PLACE-UNKNOWN-LAYER"
    #: The absent layers' bytes may pass the sane bound of the worker's own layers.
    ALSO = frozenset({"KV-PLACE-SIZE-BOUND"})
    EXAMPLES = 50

    def regive(self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]) -> Groups:
        from kvref import UniformTypeKVCacheSpecs

        return [
            attrs.evolve(g, layer_names=list(g.kv_cache_spec.kv_cache_specs))
            if not g.layer_names and isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs)
            else g
            for g in kv_cache_groups
        ]


@member_of("all", "field")
class ClaimsReplicatedKV(_LayerSpecs):
    """Records ``max_tp_shards=1`` in every attention group spec, as MLA's are.

    A vendor who copies MLA's spec fields onto every attention kind claims
    that each layer's KV is one shard, held whole by every TP rank.  Core
    derives ``kv_tp_replicas`` from the group specs, so with tensor
    parallelism a KV connector keeps one rank's copy for ranks that hold
    different heads.  The storage and every page are unchanged.
    """

    CAUGHT_BY = "KV-GROUP-TP-SHARDS"

    def respec(self, spec: KVCacheSpec) -> KVCacheSpec:
        from kvref.specs import AttentionSpec

        if not isinstance(spec, AttentionSpec) or spec.max_tp_shards == 1:
            return spec
        return attrs.evolve(spec, max_tp_shards=1)
