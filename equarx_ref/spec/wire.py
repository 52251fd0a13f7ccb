"""The wire layout and its canonical bytes, as the package sends them.

One message is one uint8 buffer, block after block (block-major): each block's payload
(elements.py's packing) followed by that block's scale bytes: the bf16 / f32 bit pattern,
little-endian, or the one E8M0 byte. A non-finite block's scale bytes are some NaN or
infinity (its bit pattern is not fixed); everything else is fixed to the bit.
"""

from __future__ import annotations

import numpy as np

from .quantize import SpecQuantized

#: The scales a block can store, as `quantize_blocks` stores them: their dtype names.
SCALE_STORAGE = ("bfloat16", "float32", "uint8")


def scale_bytes(stored: np.ndarray) -> np.ndarray:
    """Stored scales as the bytes that travel: [blocks, scale_bytes] (little-endian)."""
    stored = np.asarray(stored)
    if stored.ndim != 1 or stored.dtype.name not in SCALE_STORAGE:
        raise TypeError(f"stored must be one scale per block, [blocks] of bfloat16, float32 "
                        f"or uint8 (E8M0 codes), got {stored.dtype} {stored.shape}")
    stored = stored.astype(stored.dtype.newbyteorder("<"))  # the wire is little-endian
    return np.ascontiguousarray(stored).view(np.uint8).reshape(len(stored),
                                                               stored.dtype.itemsize)


def _quantized(q) -> SpecQuantized:
    if not isinstance(q, SpecQuantized):
        raise TypeError(f"q must be the SpecQuantized that quantize_blocks returns, got "
                        f"{type(q).__name__}")
    if q.payload.ndim != 2 or len(q.payload) != len(q.scales) or len(q.finite) != len(q.scales):
        raise ValueError(f"q must hold one scale and one finite flag per payload row, got "
                         f"payload {q.payload.shape}, scales {np.shape(q.scales)}, finite "
                         f"{np.shape(q.finite)}")
    return q


def wire_bytes(q: SpecQuantized) -> np.ndarray:
    """The canonical bytes of quantized blocks: uint8 [blocks * bytes_per_block]."""
    q = _quantized(q)
    return np.concatenate([q.payload, scale_bytes(q.scales)], axis=1).ravel()


def fixed_bytes(q: SpecQuantized) -> np.ndarray:
    """bool, like `wire_bytes`: the bytes fixed to the bit (all but a non-finite scale's)."""
    q = _quantized(q)
    width = scale_bytes(q.scales).shape[1]
    return np.concatenate([np.ones(q.payload.shape, bool),
                           np.repeat(q.finite[:, None], width, axis=1)], axis=1).ravel()
