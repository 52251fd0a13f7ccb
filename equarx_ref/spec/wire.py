"""What travels: a message's two lane-dense operands, and its canonical bytes.

A quantized block is its payload (elements.py's packing: PB bytes) and its scale (the bf16 /
f32 bit pattern, or the E8M0 byte). A collective sends a message of whole *rows* as two
arrays, the payload and the scales, each laid out so that one block sits in one lane:

    G         blocks per row: 128 / B when the block size B divides 128 (a row is then 128
              values, one lane row of a TPU vector register), else 1 (a row is one block)
    R         rows in the message: its blocks / G
    payload   uint8 [G PB, R]       payload[j PB + i, r] = byte i of block r G + j
    scales    [G, R], the scale's   scales[j, r]         = the scale of block r G + j
              bits as unsigned      (uint16 for bf16, uint32 for f32, uint8 for E8M0)
              integers

So block r G + j owns lane r of slot j: its PB payload bytes run down that lane, one per row
of the payload, and its scale sits in the same lane of the scales. Read as a grid, the message
is the values' rows transposed: row r of values becomes lane r of the operands. That is the
layout a TPU kernel reaches with one transpose of each 128 x 128 tile of values, after which
a block's 32 values lie along sublanes in one lane: its maximum is taken with elementwise
maxima and one sublane reduction, with no lane shuffling (kernels/codec.py).

The canonical bytes are the same blocks as one buffer, block after block: each block's
payload, then its scale's bytes, little-endian. They name the bits wherever one buffer is
needed (`to_bytes`, the golden digests); a message is a permutation of them, nothing more.
A non-finite block's scale bytes are some NaN or infinity (the bit pattern is not fixed);
everything else is fixed to the bit.
"""

from __future__ import annotations

import numpy as np

from . import _checks
from .formats import ELEMENTS, SCALE_TYPES, check_format
from .quantize import SpecQuantized

#: Values in a row of a message when the block size divides it: one 128-lane vector row.
ROW = 128
#: The unsigned integer type that carries each scale type's bits in a message.
SCALE_BITS = {"bfloat16": np.uint16, "float32": np.uint32, "e8m0": np.uint8}


def blocks_per_row(block_size: int) -> int:
    """G: blocks in a row of a message, 128 / B when B divides 128, else 1."""
    block_size = _checks.count(block_size, "block_size", maximum=_checks.MAX_BLOCK_SIZE)
    return ROW // block_size if ROW % block_size == 0 else 1


def row_values(fmt) -> int:
    """Values in one row of a message of `fmt` (128, or the block size)."""
    check_format(fmt)
    return blocks_per_row(fmt.block_size) * fmt.block_size


def payload_bytes(fmt) -> int:
    """PB: payload bytes of one block."""
    check_format(fmt)
    return fmt.block_size * ELEMENTS[fmt.name][1] // 8
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


def scale_bits(stored: np.ndarray, fmt) -> np.ndarray:
    """Stored scales (bf16 / f32 values, or E8M0 bytes) as the unsigned integers a message
    carries."""
    check_format(fmt)
    stored = np.asarray(stored)
    want = "uint8" if fmt.scale_dtype == "e8m0" else fmt.scale_dtype
    if stored.ndim != 1 or stored.dtype.name != want:
        raise TypeError(f"stored must be [blocks] of {want}, the scales of {fmt.name}/"
                        f"{fmt.scale_dtype}, got {stored.dtype} {stored.shape}")
    return np.ascontiguousarray(stored).view(SCALE_BITS[fmt.scale_dtype])


def message(q: SpecQuantized, fmt) -> tuple[np.ndarray, np.ndarray]:
    """The message of quantized blocks: (payload uint8 [G PB, R], scales [G, R])."""
    q = _quantized(q)
    check_format(fmt)
    blocks = len(q.payload)
    g, pb = blocks_per_row(fmt.block_size), payload_bytes(fmt)
    if q.payload.shape[1] != pb:
        raise ValueError(f"q must be blocks of {fmt.name}/b{fmt.block_size}, {pb} payload "
                         f"bytes each, got {q.payload.shape[1]}")
    if blocks % g:
        raise ValueError(f"q must be whole rows of {g} blocks to make a message, got {blocks}")
    rows = blocks // g
    payload = q.payload.reshape(rows, g, pb).transpose(1, 2, 0).reshape(g * pb, rows)
    scales = scale_bits(q.scales, fmt).reshape(rows, g).T
    return np.ascontiguousarray(payload), np.ascontiguousarray(scales)


def from_message(payload: np.ndarray, scales: np.ndarray, fmt) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `message`: (block payloads uint8 [blocks, PB], stored scales [blocks]: bf16 /
    f32 values or E8M0 bytes, as `quantize_blocks` stores them)."""
    g, pb = blocks_per_row(check_format(fmt).block_size), payload_bytes(fmt)
    payload, scales = np.asarray(payload), np.asarray(scales)
    if payload.ndim != 2 or payload.shape[0] != g * pb or payload.dtype != np.uint8:
        raise ValueError(f"a message payload of {fmt.name}/b{fmt.block_size} is uint8 "
                         f"[{g * pb}, rows], got {payload.dtype}{list(payload.shape)}")
    rows = payload.shape[1]
    want = (g, rows)
    if scales.shape != want or scales.dtype != SCALE_BITS[fmt.scale_dtype]:
        raise ValueError(f"its scales are {np.dtype(SCALE_BITS[fmt.scale_dtype]).name}"
                         f"{list(want)}, got {scales.dtype}{list(scales.shape)}")
    blocks = payload.reshape(g, pb, rows).transpose(2, 0, 1).reshape(rows * g, pb)
    bits = np.ascontiguousarray(scales.T).reshape(-1)
    stored = bits if fmt.scale_dtype == "e8m0" else bits.view(SCALE_TYPES[fmt.scale_dtype][0])
    return np.ascontiguousarray(blocks), stored


def canonical_bytes(q: SpecQuantized) -> np.ndarray:
    """The canonical bytes of quantized blocks, block after block (payload, then scale):
    uint8 [blocks * bytes_per_block]."""
    q = _quantized(q)
    return np.concatenate([q.payload, scale_bytes(q.scales)], axis=1).ravel()


def fixed_bytes(q: SpecQuantized) -> np.ndarray:
    """bool, like `canonical_bytes`: the bytes fixed to the bit (all but a non-finite
    scale's)."""
    q = _quantized(q)
    width = scale_bytes(q.scales).shape[1]
    return np.concatenate([np.ones(q.payload.shape, bool),
                           np.repeat(q.finite[:, None], width, axis=1)], axis=1).ravel()
