"""Element rounding and packing: a value in element units to its code, and codes to bytes.

    element = round(|x| / s) onto the grid, nearest, ties to the even code; or stochastic:
              up from the grid value below, lo, to the one above, hi, exactly when
              |x| - lo s >= (1 - u)(hi - lo) s for a uniform u in [0, 1)
    code    integers: two's complement of the signed element, N bits
            floats: sign bit | magnitude code (a negative value rounding to 0 keeps its sign)
    payload 8 bits: a byte each
            4 bits: two a byte, element i in the low nibble of byte i and element i + B/2 in
            its high nibble (B the block size)
            other widths: one little-endian bit stream per block, bit k of element i being
            bit i N + k of the stream, the stream's bit j bit j % 8 of byte j // 8

The rounding never divides: |x| is compared with each midpoint times s, exact in float64
(a midpoint has at most 13 significant bits, s at most 24, x 24).
"""

from __future__ import annotations

import numpy as np

from . import _checks, _masks


def _rounding_args(a, s, G) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Magnitudes a [blocks, B] and scales s [blocks], finite and >= 0, and a grid G: 0, then
    increasing values (formats.grid), all as float64."""
    G = _checks.array(G, "G", ndim=1).astype(np.float64)
    if len(G) < 2 or G[0] != 0 or not np.all(np.isfinite(G)) or not np.all(np.diff(G) > 0):
        raise ValueError(f"G must be a grid: 0, then increasing finite values (formats.grid), "
                         f"got {G[:4]}{'...' if len(G) > 4 else ''}")
    a = _checks.array(a, "a", ndim=2).astype(np.float64)
    s = _checks.array(s, "s", ndim=1).astype(np.float64)
    if len(s) != len(a):
        raise ValueError(f"s must hold one scale per block of a: {len(a)}, got {len(s)}")
    for what, v in (("a", a), ("s", s)):
        if not np.all(np.isfinite(v) & (v >= 0)):
            raise ValueError(f"{what} must be finite and >= 0 (magnitudes, scales), got "
                             f"{v[~(np.isfinite(v) & (v >= 0))][0]!r}")
    return a, s, G


def _bits(bits) -> int:
    return _checks.count(bits, "bits", minimum=2, maximum=16)


def nearest(a: np.ndarray, s: np.ndarray, G: np.ndarray) -> np.ndarray:
    """Indices into grid `G` of round(a / s), ties to the even index, for magnitudes
    a [blocks, B] and scales s [blocks] (float64; s = 0: index 0)."""
    a, s, G = _rounding_args(a, s, G)
    products = G[None, :] * s[:, None]  # [blocks, grid], exact
    lo = (products[:, None, :] <= a[:, :, None]).sum(-1) - 1  # largest grid value <= a / s
    hi = np.minimum(lo + 1, len(G) - 1)
    mid = (G[lo] + G[hi]) / 2 * s[:, None]  # exact
    idx = np.where(a > mid, hi, np.where(a < mid, lo, np.where(lo % 2 == 0, lo, hi)))
    return np.where(s[:, None] > 0, idx, 0)  # a zero scale carries a zero payload


def stochastic(a: np.ndarray, s: np.ndarray, G: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Stochastic rounding: indices into `G` of the grid value below a / s, lo, or the one
    above, hi, up exactly when a - G[lo] s >= (1 - u)(G[hi] - G[lo]) s, for uniforms u in
    [0, 1) (so with probability (a / s - G[lo]) / (G[hi] - G[lo]): unbiased). Exact in
    float64: a step of a grid is a power of two, 1 - u has 23 bits, s at most 24."""
    a, s, G = _rounding_args(a, s, G)
    u = _checks.uniforms(u, a.shape, "u").astype(np.float64)
    lo = nearest(a, s, G)
    lo = np.where(G[lo] * s[:, None] > a, lo - 1, lo)  # the grid value at or below
    hi = np.minimum(lo + 1, len(G) - 1)
    up = a - G[lo] * s[:, None] >= (1.0 - u) * (G[hi] - G[lo]) * s[:, None]
    return np.where(up & (hi > lo) & (s[:, None] > 0), hi, lo)


def codes(idx: np.ndarray, negative: np.ndarray, bits: int, is_int: bool) -> np.ndarray:
    """Element codes from grid indices and signs: uint8 (uint16 past 8 bits)."""
    bits = _bits(bits)
    if not isinstance(is_int, (bool, np.bool_)):
        raise TypeError(f"is_int must be True or False, got {is_int!r}")
    idx = np.asarray(idx)
    if idx.dtype == bool or not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"idx must hold integer grid indices, got dtype {idx.dtype}")
    top = 1 << (bits - 1)  # indices of the non-negative half: 0 .. 2^(bits-1) - 1
    if idx.size and (idx.min() < 0 or idx.max() >= top):
        raise ValueError(f"idx must lie in [0, {top}) for {bits}-bit elements, got "
                         f"{idx.min()} .. {idx.max()}")
    negative = _masks.mask(negative, idx.shape, "negative", "idx")
    if is_int:  # two's complement of the signed integer
        c = np.where(negative, -idx, idx) & ((1 << bits) - 1)
    else:  # sign bit | magnitude code
        c = np.where(negative, idx | (1 << (bits - 1)), idx)
    return c.astype(np.uint8) if bits <= 8 else c.astype(np.uint16)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes [blocks, B] -> payload uint8 [blocks, B bits / 8], as the module essay lays out."""
    bits = _bits(bits)
    codes = np.asarray(codes)
    if codes.dtype == bool or not np.issubdtype(codes.dtype, np.integer) or codes.ndim != 2:
        raise TypeError(f"codes must be integer codes [blocks, B], got {codes.dtype} "
                        f"{codes.shape}")
    if codes.shape[1] * bits % 8:
        raise ValueError(f"codes' blocks must fill whole bytes: B x bits a multiple of 8, got "
                         f"B = {codes.shape[1]} with {bits} bits")
    if codes.size and (codes.min() < 0 or codes.max() >= 1 << bits):
        raise ValueError(f"codes must lie in [0, 2^{bits}), got {codes.min()} .. {codes.max()}")
    if bits == 8:
        return codes.astype(np.uint8)
    if bits == 4:
        half = codes.shape[1] // 2
        return (codes[:, :half] | (codes[:, half:] << 4)).astype(np.uint8)
    stream = (codes[:, :, None].astype(np.int64) >> np.arange(bits)) & 1  # [blocks, B, bits]
    return np.packbits(stream.reshape(len(codes), codes.shape[1] * bits).astype(np.uint8),
                       axis=1, bitorder="little")


def unpack(payload: np.ndarray, bits: int, block_size: int) -> np.ndarray:
    """Inverse of `pack`: payload uint8 [blocks, PB] -> codes int64 [blocks, B]."""
    bits = _bits(bits)
    block_size = _checks.count(block_size, "block_size")
    payload = np.asarray(payload)
    if payload.dtype != np.uint8 or payload.ndim != 2:
        raise TypeError(f"payload must be uint8 [blocks, bytes per block], got {payload.dtype} "
                        f"{payload.shape}")
    if block_size * bits % 8 or payload.shape[1] != block_size * bits // 8:
        raise ValueError(f"payload must hold block_size x bits / 8 = {block_size * bits / 8:g} "
                         f"bytes per block, got {payload.shape[1]}")
    payload = payload.astype(np.int64)
    if bits == 8:
        return payload
    if bits == 4:
        return np.concatenate([payload & 0xF, payload >> 4], axis=1)
    stream = np.unpackbits(payload.astype(np.uint8), axis=1, bitorder="little")
    stream = stream.reshape(len(payload), block_size, bits).astype(np.int64)
    return (stream << np.arange(bits)).sum(-1)
