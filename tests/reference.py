"""An independent reference for the quantizer and the collectives: NumPy and ml_dtypes only.

Written from the documented rules (the essays of equarx_ref/quantize.py and wire.py, the
collectives'), never from the package's code. It reads only the public fields of a `Format`
(name, block size, scale type); element grids come from ml_dtypes, and every decision is exact:

    scale  bf16/f32: the smallest scale-dtype value s with s * elem_max >= amax; if that
           s * elem_max exceeds f32's maximum, the scale-dtype value just below it
           (elements saturating at +-elem_max)
           E8M0 (MX): 2^k, k = ceil(log2(amax / elem_max)), stored as the byte k + 127;
           or, with the OCP MX v1.0 floor rule, k = floor(log2(amax)) - emax_elem (emax_elem
           the exponent of the grid's largest value), elements saturating at +-elem_max
    element = round(x / s) onto the grid, nearest, ties to the even code
    packing: 8 bits a byte; 4 bits two a byte (element i low nibble of byte i, element i + B/2
           its high nibble); any other width a little-endian bit stream per block

Exactness. Inputs are f32 (24 significant bits), bf16 scales carry 8, f32 scales 24, grid values
and their midpoints at most 9: every product of a grid value (or midpoint) and a scale fits the
53 bits of a float64, so `midpoint * s` against `|x|` and `s * elem_max` against `amax` are exact
comparisons, and no division is ever rounded into a decision.

Edge cases, as quantize.py documents them: an all-zero block has scale 0 (E8M0: 2^-127) and a
zero payload; a block whose amax / elem_max is below f32's smallest normal gets scale 0; a NaN
or infinity makes the block's scale non-finite (E8M0: the NaN byte 255), its payload 0 and its
values non-finite; dequantized values saturate to f32's finite range.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

F32_TINY = float(np.finfo(np.float32).tiny)
F32_MAX = float(np.finfo(np.float32).max)
E8M0_BIAS = 127

# Element type of each format name: ml_dtypes float type (None: symmetric integer) and bits.
_ELEMENTS = {
    "int8": (None, 8), "int4": (None, 4), "mxint8": (None, 8),
    **{f"int{b}": (None, b) for b in range(2, 13)},
    "fp8_e4m3": (ml_dtypes.float8_e4m3fn, 8), "mxfp8": (ml_dtypes.float8_e4m3fn, 8),
    "fp8_e5m2": (ml_dtypes.float8_e5m2, 8),
    "fp6_e2m3": (ml_dtypes.float6_e2m3fn, 6), "mxfp6_e2m3": (ml_dtypes.float6_e2m3fn, 6),
    "fp6_e3m2": (ml_dtypes.float6_e3m2fn, 6), "mxfp6_e3m2": (ml_dtypes.float6_e3m2fn, 6),
    "fp4_e2m1": (ml_dtypes.float4_e2m1fn, 4), "mxfp4": (ml_dtypes.float4_e2m1fn, 4),
}
_SCALE_TYPES = {"bfloat16": (ml_dtypes.bfloat16, np.uint16), "float32": (np.float32, np.uint32)}


def grid(name: str) -> tuple[np.ndarray, int]:
    """(non-negative element values in code order, element bits): code i has value grid[i]."""
    dtype, bits = _ELEMENTS[name]
    if dtype is None:  # symmetric integers 0..2^(bits-1)-1, two's complement codes
        return np.arange(2 ** (bits - 1), dtype=np.float64), bits
    # ml_dtypes' sub-byte floats occupy the low bits of one byte each
    values = np.arange(2 ** (bits - 1), dtype=np.uint8).view(dtype).astype(np.float64)
    values = values[np.isfinite(values)]  # e4m3fn ends in NaN, e5m2 in inf and NaNs
    assert np.all(np.diff(values) > 0)
    return values, bits


@dataclasses.dataclass
class RefQuantized:
    """What the reference computes for blocks `[blocks, B]`."""

    scales: np.ndarray  # stored: bf16 / f32 values, or uint8 E8M0 codes
    codes: np.ndarray  # uint8 [blocks, B]: one element code per value (unpacked)
    payload: np.ndarray  # uint8 [blocks, B * bits / 8]: packed as on the wire
    values: np.ndarray  # f32 [blocks, B]: dequantized
    finite: np.ndarray  # bool [blocks]: the block was finite


def _pow2(k: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, k.astype(np.int64))


def _e8m0_exponent(amax: np.ndarray, emax: float) -> np.ndarray:
    """k = ceil(log2(amax / emax)) for amax > 0, exactly: 2^(k-1) emax < amax <= 2^k emax."""
    _, e = np.frexp(np.where(amax > 0, amax / emax, 1.0))  # a guess within one of k
    k = e.astype(np.int64)
    for _ in range(3):
        k = np.where(_pow2(k) * emax < amax, k + 1, k)
        k = np.where(_pow2(k - 1) * emax >= amax, k - 1, k)
    assert np.all((_pow2(k) * emax >= amax) & ((_pow2(k - 1) * emax < amax) | (amax == 0)))
    return k


def _smallest_covering(amax: np.ndarray, emax: float, scale_type) -> np.ndarray:
    """The smallest scale_type value s >= f32's smallest normal with s * emax >= amax (amax > 0,
    finite). Below that normal the scale is 0 anyway (the caller's rule), so the search stops."""
    dtype, bits = _SCALE_TYPES[scale_type]
    floor = int(np.asarray(F32_TINY, dtype).view(bits))
    guess = np.maximum(amax / emax, F32_TINY).astype(dtype).view(bits).astype(np.int64)

    def value(b):
        return np.maximum(b, floor).astype(bits).view(dtype).astype(np.float64)

    def covers(b):
        return value(b) * emax >= amax  # exact: <= 24 + 16 significant bits

    b = guess
    for _ in range(4):  # positive floats order like their bit patterns: step by one pattern
        b = np.where(~covers(b), b + 1, b)
        b = np.where(covers(b - 1) & (b > floor), b - 1, b)
    assert np.all(covers(b) & (~covers(b - 1) | (b == floor))), "scale search did not settle"
    return value(b)


def quantize_blocks(x: np.ndarray, fmt) -> RefQuantized:
    """The reference quantizer for f32 blocks `x` of shape `[blocks, fmt.block_size]`."""
    x = np.asarray(x, np.float32)
    assert x.ndim == 2 and x.shape[1] == fmt.block_size
    G, bits = grid(fmt.name)
    emax = float(G[-1])
    a = np.abs(x.astype(np.float64))
    amax = a.max(axis=1)
    finite = np.isfinite(amax)
    amax_f = np.where(finite, amax, 0.0)

    if fmt.scale_dtype == "e8m0" and getattr(fmt, "scale_rule", "ceil") == "floor":
        _, e = np.frexp(np.where(amax_f > 0, amax_f, 1.0))  # amax in [2^(e-1), 2^e)
        _, f = np.frexp(emax)  # emax in [2^(f-1), 2^f): emax_elem = f - 1
        k = np.clip(e.astype(np.int64) - 1 - (f - 1), -E8M0_BIAS, 127)
        k = np.where(amax_f > 0, k, -E8M0_BIAS)
        s = _pow2(k)
        stored = np.where(finite, k + E8M0_BIAS, 255).astype(np.uint8)
    elif fmt.scale_dtype == "e8m0":
        k = np.clip(_e8m0_exponent(amax_f, emax), -E8M0_BIAS, 127)
        k = np.where(amax_f > 0, k, -E8M0_BIAS)  # all-zero block: the smallest exponent
        s = _pow2(k)
        stored = np.where(finite, k + E8M0_BIAS, 255).astype(np.uint8)
    else:
        dtype, _ = _SCALE_TYPES[fmt.scale_dtype]
        positive = np.where(amax_f > 0, amax_f, 1.0)
        s = np.where(amax_f > 0, _smallest_covering(positive, emax, fmt.scale_dtype), 0.0)
        s = np.where(amax_f < F32_TINY * emax, 0.0, s)  # amax / emax below f32's normals
        # the top grid value past f32's maximum: the scale one step below (elements saturate)
        below = np.maximum(s, F32_TINY).astype(dtype).view(_SCALE_TYPES[fmt.scale_dtype][1])
        below = (below - 1).view(dtype).astype(np.float64)
        s = np.where(s * emax > F32_MAX, below, s)
        stored = np.where(finite, s, np.where(np.isnan(amax), np.nan, np.inf)).astype(dtype)

    # round(|x| / s) to nearest, ties to the even code: compare |x| with midpoint * s, exactly.
    a = np.where(finite[:, None], a, 0.0)
    products = G[None, :] * s[:, None]  # [blocks, grid], exact
    a = np.minimum(a, emax * s[:, None])  # the floor rule saturates (and E8M0's 2^-127 floor)
    lo = (products[:, None, :] <= a[:, :, None]).sum(-1) - 1  # largest grid value <= |x| / s
    hi = np.minimum(lo + 1, len(G) - 1)
    mid = (G[lo] + G[hi]) / 2 * s[:, None]
    idx = np.where(a > mid, hi, np.where(a < mid, lo, np.where(lo % 2 == 0, lo, hi)))
    idx = np.where(s[:, None] > 0, idx, 0)  # a zero scale carries a zero payload

    sign = np.signbit(x) & finite[:, None]
    if _ELEMENTS[fmt.name][0] is None:  # two's complement of the signed integer
        codes = np.where(sign, -idx, idx) & ((1 << bits) - 1)
    else:  # sign bit | magnitude code (a negative value rounding to 0 keeps its sign: -0)
        codes = np.where(sign, idx | (1 << (bits - 1)), idx)
    codes = codes.astype(np.uint8) if bits <= 8 else codes.astype(np.uint16)
    if bits == 8:
        payload = codes
    elif bits == 4:
        payload = codes[:, : fmt.block_size // 2] | (codes[:, fmt.block_size // 2:] << 4)
    else:  # bit i of element j is bit (j * bits + i) of the block's stream, little-endian
        stream = (codes[:, :, None].astype(np.int64) >> np.arange(bits)) & 1
        payload = np.packbits(stream.reshape(len(codes), -1).astype(np.uint8), axis=1,
                              bitorder="little")

    # dequantize: the code's value (integer code 0 is +0; a float code keeps its sign) times s
    negative = sign & ((idx > 0) | (_ELEMENTS[fmt.name][0] is not None))
    product = np.where(negative, -G[idx], G[idx]) * s[:, None]  # exact in float64
    values = np.clip(product, -F32_MAX, F32_MAX).astype(np.float32)
    values = np.where(finite[:, None], values, np.float32(np.nan))
    return RefQuantized(stored, codes, payload, values, finite)


def scale_bytes(stored: np.ndarray) -> np.ndarray:
    """Stored scales as the bytes that travel: [blocks, scale_bytes] (little-endian)."""
    return np.ascontiguousarray(stored).view(np.uint8).reshape(len(stored), -1)


def to_blocks(x: np.ndarray, block_size: int) -> np.ndarray:
    """Flatten to f32 and zero-pad to whole blocks: [blocks, B]."""
    flat = np.asarray(x, np.float32).reshape(-1)
    return np.pad(flat, (0, -flat.size % block_size)).reshape(-1, block_size)


def round_trip(x: np.ndarray, fmt) -> np.ndarray:
    """dequantize(quantize(x)) of a 1-D f32 array whose length is a multiple of the block."""
    return quantize_blocks(to_blocks(x, fmt.block_size), fmt).values.reshape(-1)


# ---- collectives --------------------------------------------------------------------------


def all_reduce(x: np.ndarray, schedule, fmt, plan=None) -> np.ndarray:
    """What `all_reduce` must return for inputs `x` [p, ...], by the collectives' documented
    semantics, following `schedule` (plain data) step by step in NumPy.

    `plan` (hop-aware bits): ({step time: format}, gather format); chunks are then padded to
    the largest block of the plan, and each step's messages use its own format.

    Each message is what a receiver decodes: dequantize(quantize(v)) (or, with fmt None, v
    rounded to x's dtype). A reduce hop adds it to the receiver's f32 copy; an all-to-all or a
    reduce-phase all-gather sums every device's message, the receiver's own included, in rank
    order; the gather phase hands everyone the owner's chunk, encoded once.
    """
    x = np.asarray(x)
    p, n = x.shape[0], x[0].size
    dtype = x.dtype
    steps_fmt, gather_fmt = plan if plan is not None else ({}, fmt)
    align = max([f.block_size for f in (fmt, gather_fmt, *steps_fmt.values())]) \
        if fmt is not None else 1
    C = schedule.chunk_count
    L = -(-n // (C * align)) * align
    acc = np.zeros((p, C * L), np.float32)
    acc[:, :n] = x.reshape(p, -1).astype(np.float32)
    acc = acc.reshape(p, C, L)

    def message(v, f=fmt):  # v [..., L] f32 -> what the receiver decodes, f32
        if f is None:
            return v.astype(dtype).astype(np.float32)
        return round_trip(v.reshape(-1), f).reshape(v.shape)

    def rank_order_sum(parts):
        total = parts[0]
        for part in parts[1:]:
            total = total + part  # f32 additions, one at a time, rank 0 first
        return total

    for step in (s for s in schedule.steps if s.phase == "reduce"):
        new = acc.copy()  # a step reads everyone's copies from before it
        f = steps_fmt.get(step.time, fmt)
        if step.kind == "permute":
            for t in step.transfers:
                for c in t.chunks:
                    new[t.dst, c] = message(acc[t.src, c], f) + acc[t.dst, c]
        elif step.kind == "all_to_all":
            senders = {}
            for t in step.transfers:
                for c in t.chunks:
                    senders.setdefault((t.dst, c), {t.dst}).add(t.src)
            for (d, c), srcs in senders.items():
                new[d, c] = rank_order_sum([message(acc[r, c], f) for r in sorted(srcs)])
        elif step.kind == "all_gather":
            total = rank_order_sum([message(acc[r], f) for r in range(p)])
            new[:] = total
        else:
            raise AssertionError(step.kind)
        acc = new
    if any(s.phase == "gather" for s in schedule.steps):
        out = np.stack([message(acc[schedule.owners[c][0], c], gather_fmt) for c in range(C)])
    else:
        out = acc[0]
    return out.reshape(-1)[:n].reshape(x.shape[1:]).astype(dtype)
