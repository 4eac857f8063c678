"""How a worker views a plan: every tensor's extents and byte strides, with exact integers.

The kit's one worker model (contract.md#views-and-strides): the device checks
allocate and view plans through it (:mod:`conformance.check.worker`, with
torch), and the memory checks compute every page's footprint on it
(:mod:`conformance.check.footprint`).  Strides come from
:mod:`conformance.check.geometry`, never from kvref.

Oracle and plumbing: everything here is oracle, what the kit expects a plan
to mean (each view's extents and strides, and the byte addresses of layers
and pages that follow from them).  kvref computes the same addresses in
``kvref.views`` and the two are written twice on purpose: were the kit to
use kvref's, a bug planted in kvref's addresses would move the kit's
expectations with it and go unseen.  The plumbing, torch buffers and
strided views over them, is :mod:`conformance.check.worker`; the tags the
device and serve extensions write and read through those views are
:mod:`conformance.extensions.tags`.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from conformance.check.geometry import (
    OracleError,
    PageGeometry,
    Strides,
    layout_strides,
    page_geometry,
    typed_view_misfits,
    view_extents,
)
from kvref.axes import HOST_LAYOUT
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import KVCacheSpec

__all__ = [
    "ViewProblem",
    "WorkerError",
    "WorkerTensor",
    "first_group_of",
    "planned_device_bytes",
    "planned_host_bytes",
    "resolve_layout",
    "view_problems",
    "worker_tensor",
    "worker_tensors",
]


class WorkerError(ValueError):
    """A worker could not allocate or view the plan; the message names the tensor and numbers."""


def resolve_layout(
    config: KVCacheConfig, layout: KVCacheLayout | str | None = None
) -> KVCacheLayout:
    """The layout of the device tensors: ``layout``, else the config's, else LBNHC."""
    if layout is not None:
        return KVCacheLayout.parse(layout)
    return config.kv_cache_layout or KVCacheLayout.LBNHC


def planned_device_bytes(config: KVCacheConfig) -> int:
    """Bytes of the device backing (the largest device size; 0 without device tensors)."""
    return max((t.size for t in config.kv_cache_tensors if not t.host_resident), default=0)


def planned_host_bytes(config: KVCacheConfig) -> int:
    """Bytes of all host backings: one per distinct host-resident tensor size."""
    return sum({t.size for t in config.kv_cache_tensors if t.host_resident})


@attrs.frozen(kw_only=True)
class WorkerTensor:
    """One tensor record as a worker views it (the kit's own; kvref's is ``kvref.views``).

    Attributes:
        index: position of the tensor in ``config.kv_cache_tensors``.
        tensor: the record.
        spec: the per-layer spec of ``tensor.layers[0]`` (``None`` without layers).
        page: that spec's page (``None`` without layers).
        layout: the layout the strides are in.
        shape: extents ``(L, N, H, S, C)``, ``C`` in bytes.
        strides: byte strides ``(L, B, H, S, C)``.

    """

    index: int
    tensor: KVCacheTensor
    spec: KVCacheSpec | None
    page: PageGeometry | None
    layout: KVCacheLayout
    shape: tuple[int, int, int, int, int]
    strides: Strides

    @property
    def offset(self) -> int:
        """Byte of layer 0, block 0 in the backing."""
        return self.tensor.offset

    @property
    def is_empty(self) -> bool:
        """Whether the tensor addresses no byte (no layers, no blocks, an empty page)."""
        return 0 in self.shape

    @property
    def page_bytes(self) -> int:
        """Bytes one (layer, block) view addresses: ``H * S * C``."""
        return self.shape[2] * self.shape[3] * self.shape[4]

    def layer_start(self, layer: int) -> int:
        """Byte where layer index ``layer`` starts."""
        return self.offset + layer * self.strides[0]

    def layer_end(self, layer: int) -> int:
        """One past the farthest byte of layer index ``layer`` (its start when empty)."""
        start = self.layer_start(layer)
        if self.is_empty:
            return start
        # Strides are non-negative: the last index of every axis is the farthest byte.
        reach = sum((e - 1) * s for e, s in zip(self.shape[1:], self.strides[1:], strict=True))
        return start + reach + 1

    @property
    def end(self) -> int:
        """One past the farthest byte of the tensor (0 when empty)."""
        return 0 if self.is_empty else self.layer_end(self.shape[0] - 1)

    def block_address(self, layer: int, block: int) -> int:
        """Byte where ``(layer, block)``'s view starts."""
        return self.layer_start(layer) + block * self.strides[1]


@attrs.frozen(kw_only=True)
class ViewProblem:
    """Why a layer's view cannot be built.

    Attributes:
        kind: ``"bounds"`` (outside the backing) or ``"dtype"`` (not reinterpretable).
        tensor_index: position of the tensor in the config.
        layer: the layer concerned.
        message: what is wrong, with the numbers.
        byte_range: the bytes the layer would address, end exclusive (``"bounds"`` only).

    """

    kind: str
    tensor_index: int
    layer: str
    message: str
    byte_range: tuple[int, int] | None = None


def first_group_of(groups: Sequence[KVCacheGroupSpec]) -> dict[str, int]:
    """Layer name -> the first of ``groups`` listing it (a broken plan may list a layer twice)."""
    owner: dict[str, int] = {}
    for index, group in enumerate(groups):
        for name in group.layer_names:
            owner.setdefault(name, index)
    return owner


def worker_tensor(
    config: KVCacheConfig, index: int, tensor: KVCacheTensor, layout: KVCacheLayout, group: int
) -> WorkerTensor:
    """How a worker views ``config.kv_cache_tensors[index]``, in ``layout``.

    Every layer is viewed with the spec of the tensor's first layer in group ``group``.

    Raises:
        WorkerError: the spec has no geometry in the layout (a padded page it cannot hold).
    """
    first = tensor.layers[0]
    # A worker views every layer of a tensor with its first layer's spec.
    spec = config.kv_cache_groups[group].layer_spec(first)
    num_blocks = config.num_blocks_of(tensor)
    try:
        page = page_geometry(spec)
        blocks, heads, states, content = view_extents(spec, num_blocks)
        strides = layout_strides(
            spec,
            num_blocks,
            len(tensor.layers),
            layout,
            pinned=(tensor.layer_stride, tensor.block_stride, None, None, None),
        )
    except OracleError as error:
        raise WorkerError(f"kv_cache_tensors[{index}] layer {first!r}: {error}") from error
    return WorkerTensor(
        index=index,
        tensor=tensor,
        spec=spec,
        page=page,
        layout=layout,
        shape=(len(tensor.layers), blocks, heads, states, content),
        strides=strides,
    )


def worker_tensors(
    config: KVCacheConfig, layout: KVCacheLayout | str | None = None
) -> tuple[WorkerTensor, ...]:
    """The geometry of every tensor, in config order.

    Device tensors use ``layout`` (see :func:`resolve_layout`) and ``num_blocks``;
    host-resident ones use LBNHC and the host pool's block count.

    Raises:
        WorkerError: a tensor's first layer is in no group, or its spec has no
            geometry in the layout (a padded page the layout cannot hold).
    """
    device_layout = resolve_layout(config, layout)
    owner = first_group_of(config.kv_cache_groups)
    out: list[WorkerTensor] = []
    for index, tensor in enumerate(config.kv_cache_tensors):
        this_layout = HOST_LAYOUT if tensor.host_resident else device_layout
        if not tensor.layers:
            empty = (tensor.layer_stride, tensor.block_stride, 0, 0, 1)
            out.append(
                WorkerTensor(
                    index=index,
                    tensor=tensor,
                    spec=None,
                    page=None,
                    layout=this_layout,
                    shape=(0, 0, 0, 0, 0),
                    strides=empty,
                )
            )
            continue
        group = owner.get(tensor.layers[0])
        if group is None:
            raise WorkerError(
                f"kv_cache_tensors[{index}]: layer {tensor.layers[0]!r} belongs to no KV cache "
                "group, so its page shape is unknown"
            )
        out.append(worker_tensor(config, index, tensor, this_layout, group))
    return tuple(out)


def _bounds_problem(geometry: WorkerTensor, backing_bytes: int) -> ViewProblem:
    tensor = geometry.tensor
    num_layers, num_blocks, heads, states, content = geometry.shape
    # layer_end grows with the layer index: find the first layer that leaves the backing.
    stride = geometry.strides[0]
    reach = geometry.layer_end(0) - geometry.offset
    first = 0 if stride == 0 else (backing_bytes - geometry.offset - reach) // stride + 1
    first = min(max(first, 0), num_layers - 1)
    start, end = geometry.layer_start(first), geometry.layer_end(first)
    return ViewProblem(
        kind="bounds",
        tensor_index=geometry.index,
        layer=tensor.layers[first],
        message=(
            f"kv_cache_tensors[{geometry.index}] layer {tensor.layers[first]!r} (index {first}) "
            f"spans bytes [{start}, {end}) but its backing holds {backing_bytes} bytes "
            f"(offset={tensor.offset}, layer_stride={tensor.layer_stride}, "
            f"block_stride={tensor.block_stride}, num_blocks={num_blocks}, "
            f"(H, S, C)=({heads}, {states}, {content}))"
        ),
        byte_range=(start, end),
    )


def view_problems(geometry: WorkerTensor, backing_bytes: int) -> list[ViewProblem]:
    """Why the views of ``geometry`` cannot be built in ``backing_bytes`` bytes.

    The farthest byte must lie inside the backing (contract.md#memory-safety),
    and typed views need their offsets and strides in whole elements
    (contract.md#views-and-strides).  Empty: :func:`torch.as_strided` and
    ``Tensor.view(dtype)`` both succeed.
    """
    page = geometry.page
    if page is None:
        return []
    problems: list[ViewProblem] = []
    if not geometry.is_empty and geometry.end > backing_bytes:
        problems.append(_bounds_problem(geometry, backing_bytes))
    misfits = typed_view_misfits(geometry.offset, geometry.shape[0], geometry.strides, page)
    if misfits and page.dtype is not None:
        name, value = next(iter(misfits.items()))
        layer = geometry.tensor.layers[0]
        problems.append(
            ViewProblem(
                kind="dtype",
                tensor_index=geometry.index,
                layer=layer,
                message=(
                    f"kv_cache_tensors[{geometry.index}] layer {layer!r}: {name}={value} is not "
                    f"a multiple of sizeof({page.dtype})={page.dtype.itemsize}, so the layer's "
                    f"bytes cannot be viewed as {page.dtype}"
                ),
            )
        )
    return problems
