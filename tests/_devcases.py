"""Hand-built configs shared by tests/reference/test_allocation.py and
tests/extensions/device/test_device.py.

Every config here is written out tensor by tensor (no planner involved), so the
allocation and device checks are tested on exactly the bytes the contract lists.
"""

from __future__ import annotations

import os

import torch

from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import FullAttentionSpec, MambaSpec, SlidingWindowSpec

#: The device the device-dependent tests run on: ``KVREF_TEST_DEVICE`` (default cpu).
TEST_DEVICE = os.environ.get("KVREF_TEST_DEVICE", "cpu")
#: The test device, plus meta where a test only needs shapes.
SHAPE_DEVICES = [TEST_DEVICE, "meta"] if TEST_DEVICE != "meta" else ["meta"]


def full(
    heads: int = 1, head_size: int = 4, dtype: torch.dtype = torch.float16
) -> FullAttentionSpec:
    """Full attention with block 2.

    See contract.md#default-placement (1 head, head 4, fp16 gives a 32-byte page).
    """
    return FullAttentionSpec(block_size=2, num_kv_heads=heads, head_size=head_size, dtype=dtype)


def sliding(heads: int = 1, head_size: int = 4) -> SlidingWindowSpec:
    """Sliding-window attention shaped like :func:`full`."""
    return SlidingWindowSpec(
        block_size=2, num_kv_heads=heads, head_size=head_size, dtype=torch.float16, sliding_window=4
    )


def worked_example(layout: KVCacheLayout, *, size: int = 256) -> KVCacheConfig:
    """L0 F, L1 S, L2 S, L3 F, L4 S, L5 S; three groups; N = 4; page 32.

    See contract.md#default-placement.
    """
    groups = [
        KVCacheGroupSpec(layer_names=["L0", "L3"], kv_cache_spec=full()),
        KVCacheGroupSpec(layer_names=["L1", "L4"], kv_cache_spec=sliding()),
        KVCacheGroupSpec(layer_names=["L2", "L5"], kv_cache_spec=sliding()),
    ]
    layer_stride, block_stride = (128, 32) if layout is KVCacheLayout.LBNHC else (32, 64)
    tensors = [
        KVCacheTensor(size=size, layers=names, layer_stride=layer_stride, block_stride=block_stride)
        for names in (["L0", "L3"], ["L1", "L4"], ["L2", "L5"])
    ]
    return KVCacheConfig(
        num_blocks=4, kv_cache_tensors=tensors, kv_cache_groups=groups, kv_cache_layout=layout
    )


def mamba_config() -> KVCacheConfig:
    """One Mamba layer (conv (3, 4) fp16 + ssm (5,) fp32: 44-byte page), N = 3, LBNHC."""
    spec = MambaSpec(block_size=16, shapes=((3, 4), (5,)), dtypes=(torch.float16, torch.float32))
    return KVCacheConfig(
        num_blocks=3,
        kv_cache_tensors=[
            KVCacheTensor(size=132, layers=["m0"], layer_stride=132, block_stride=44)
        ],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=["m0"], kv_cache_spec=spec)],
        kv_cache_layout=KVCacheLayout.LBNHC,
    )


def interleaved(layout: KVCacheLayout) -> KVCacheConfig:
    """contract.md#layouts's 2-head page (H=2, S=2, C=16: 64 B), L = 2, N = 3, in LHBNC or BHLNC."""
    layer_stride, block_stride = (192, 32) if layout is KVCacheLayout.LHBNC else (32, 128)
    return KVCacheConfig(
        num_blocks=3,
        kv_cache_tensors=[
            KVCacheTensor(
                size=384, layers=["a", "b"], layer_stride=layer_stride, block_stride=block_stride
            )
        ],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=["a", "b"], kv_cache_spec=full(heads=2))],
        kv_cache_layout=layout,
    )


def host_config(*, host_on_device: bool = False, host_blocks: int = 5) -> KVCacheConfig:
    """A device group [a0, a1] (LBNHC, N = 4) and a host-resident group [h0] with its own pool.

    With ``host_on_device`` the host group's layer is wrongly put in a device tensor.
    """
    groups = [
        KVCacheGroupSpec(layer_names=["a0", "a1"], kv_cache_spec=full()),
        KVCacheGroupSpec(layer_names=["h0"], kv_cache_spec=full(), host_resident=True),
    ]
    device = KVCacheTensor(size=256, layers=["a0", "a1"], layer_stride=128, block_stride=32)
    if host_on_device:
        host = KVCacheTensor(size=256, layers=["h0"], layer_stride=128, block_stride=32)
    else:
        host = KVCacheTensor(
            size=32 * host_blocks,
            layers=["h0"],
            layer_stride=32 * host_blocks,
            block_stride=32,
            host_resident=True,
        )
    return KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[host, device],
        kv_cache_groups=groups,
        kv_cache_layout=KVCacheLayout.LBNHC,
        host_num_blocks=host_blocks,
    )


def misaligned_strides() -> KVCacheConfig:
    """The contract's real P3 violation: two groups of 96-byte pages with block strides 96 and 128.

    See contract.md#memory-safety.

    LBNHC, N = 4: G0 = [L0, L3] (Bs 96, Ls 384), G1 = [L1, L2] (Bs 128, Ls 512).
    Block 2 of L1, ``[256, 352)``, overlaps block 3 of L0, ``[288, 384)``.
    """
    spec = full(head_size=12)
    return KVCacheConfig(
        num_blocks=4,
        kv_cache_tensors=[
            KVCacheTensor(size=1024, layers=["L0", "L3"], layer_stride=384, block_stride=96),
            KVCacheTensor(size=1024, layers=["L1", "L2"], layer_stride=512, block_stride=128),
        ],
        kv_cache_groups=[
            KVCacheGroupSpec(layer_names=["L0", "L3"], kv_cache_spec=spec),
            KVCacheGroupSpec(layer_names=["L1", "L2"], kv_cache_spec=sliding(head_size=12)),
        ],
        kv_cache_layout=KVCacheLayout.LBNHC,
    )
