"""The wire layout and its canonical bytes, as the package sends them.

One message is one uint8 buffer, block after block (block-major): each block's payload
(elements.py's packing) followed by that block's scale bytes: the bf16 / f32 bit pattern,
little-endian, or the one E8M0 byte. A non-finite block's scale bytes are some NaN or
infinity (its bit pattern is not fixed); everything else is fixed to the bit.
"""

from __future__ import annotations

import numpy as np

from .quantize import SpecQuantized


def scale_bytes(stored: np.ndarray) -> np.ndarray:
    """Stored scales as the bytes that travel: [blocks, scale_bytes] (little-endian)."""
    assert np.little_endian or stored.dtype.itemsize == 1, "the wire is little-endian"
    return np.ascontiguousarray(stored).view(np.uint8).reshape(len(stored), -1)


def wire_bytes(q: SpecQuantized) -> np.ndarray:
    """The canonical bytes of quantized blocks: uint8 [blocks * bytes_per_block]."""
    return np.concatenate([q.payload, scale_bytes(q.scales)], axis=1).ravel()


def fixed_bytes(q: SpecQuantized) -> np.ndarray:
    """bool, like `wire_bytes`: the bytes fixed to the bit (all but a non-finite scale's)."""
    width = scale_bytes(q.scales).shape[1]
    return np.concatenate([np.ones(q.payload.shape, bool),
                           np.repeat(q.finite[:, None], width, axis=1)], axis=1).ravel()
