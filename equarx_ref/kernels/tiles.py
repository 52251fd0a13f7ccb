"""The codec's arithmetic on tiles of rows, as a TPU core does it: one transpose, then lanes.

A TPU vector register is 8 sublanes x 128 lanes. A block of 32 consecutive values is a quarter
of one lane row, and finding its maximum where it lies takes lane rotations through the
cross-lane unit, a few cycles each, at every level of a reduction tree and again to broadcast
the scale back. The message layout (wire.py, spec/wire.py) is chosen so that none of that is
needed: a message is the values' rows transposed, block r G + j in lane r of slot j. So a
kernel holding R rows of 128 values

    x [R, 128]  --transpose-->  x^T [128, R]:  slot j = sublanes j B .. (j + 1) B - 1

has each block in one lane, its B values down B sublanes (B = 32: four registers). Then

    amax      the elementwise maximum of the slot's registers, then one sublane reduction
    scale     `block_plan` on the slots' amax rows, G rows together: once per block
    codes     `plan_codes` elementwise, the scale row broadcast down the sublanes
    payload   codes packed down the sublanes: 8-bit codes four to a 32-bit lane by the
              chip's packs (an int8 register is 32 sublane rows), 4-bit codes i and i + B/2
              of a block into one byte, exactly the canonical per-block payload bytes

and a slot's payload rows are its blocks' bytes, one block per lane: the message, with no lane
ever moved but by the one transpose. Decoding runs the same way backwards. The numerics are the
package's own (`block_plan`, `plan_codes`, `float_values`, `apply_scale`), applied to rows of
blocks instead of blocks of values, so the results are the spec's by construction; the
conformance suite holds them to it (tests/test_conformance.py).

These functions take and return arrays, so the same code runs inside a Pallas kernel
(`codec.py`, `ring.py`) and, off a TPU, as XLA operations on whole messages (`MosaicCodec`).
Inside a kernel (`flushes=True`) the rule that a subnormal sum reads as a zero of its sign
is the TPU core's own flushing, and the interpreter's (XLA:CPU flushes too); as XLA ops on
another backend the rule is applied explicitly. The encode needs neither: it only compares
values with normal midpoints, where a subnormal and its zero fall on the same side.
They take tiles of R rows, R a multiple of 8 (the f32 register's sublanes), for the formats
`supports` names: 8-bit and 4-bit elements, blocks that divide 128, any scale type; round to
nearest.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from ..formats import Format
from ..quantize import BlockPlan, block_plan, plan_codes, rank_order_sum, zero_subnormals
from ..wire import Message

__all__ = ["decode", "encode", "hop", "reduce", "supports"]

_SCALE_BITS = {"bfloat16": jnp.uint16, "float32": jnp.uint32, "e8m0": jnp.uint8}


def supports(fmt) -> bool:
    """Whether the tile code takes `fmt`: 8-bit or 4-bit elements, a block that divides 128
    into whole registers of sublanes (8-bit: a multiple of 8; 4-bit: of 16, so that codes i
    and i + B/2 pair whole registers)."""
    return isinstance(fmt, Format) and fmt.elem_bits in (8, 4) and 128 % fmt.block_size == 0 \
        and fmt.block_size % (8 if fmt.elem_bits == 8 else 16) == 0


def _slots(xt: jax.Array, fmt: Format) -> list[jax.Array]:
    """The G slots of a transposed tile `[128, R]`: slot j is sublanes j B .. (j + 1) B - 1."""
    b = fmt.block_size
    return [xt[j * b:(j + 1) * b] for j in range(fmt.blocks_per_row)]


def _pack(codes: jax.Array, fmt: Format) -> jax.Array:
    """int32 codes `[B, R]` (a slot) -> its payload rows uint8 `[PB, R]`: 8-bit codes a byte
    each; 4-bit codes i (low nibble) and i + B/2 (high) of each block in byte i."""
    if fmt.elem_bits == 8:  # the chip's pack keeps the low byte
        return lax.bitcast_convert_type(codes.astype(jnp.int8), jnp.uint8)
    half = fmt.block_size // 2
    pairs = (codes[:half] & 0xF) | (codes[half:] << 4)  # bits past the byte: dropped
    return lax.bitcast_convert_type(pairs.astype(jnp.int8), jnp.uint8)


def _unpack(rows: jax.Array, fmt: Format) -> jax.Array:
    """A slot's payload rows uint8 `[PB, R]` -> its codes int32 `[B, R]` (widened first:
    Mosaic shifts only 32-bit vectors)."""
    wide = rows.astype(jnp.int32)
    if fmt.elem_bits == 8:
        return wide
    return jnp.concatenate([wide & 0xF, wide >> 4], axis=0)


def _elements(codes: jax.Array, fmt: Format) -> jax.Array:
    """int32 codes -> the grid values they stand for, f32. A float code's magnitude bits,
    moved into f32's exponent and mantissa fields and rebiased, are a normal value; a
    subnormal code's mantissa counts steps of 2^(emin - m); the sign bit goes to f32's (a
    zero keeps its sign)."""
    bits = fmt.elem_bits
    if fmt.is_int:  # two's complement of elem_bits bits
        sign = 1 << (bits - 1)
        return ((codes ^ sign) - sign).astype(jnp.float32)
    m, emin = fmt.mant_bits, fmt.min_exponent
    mag = codes & ((1 << (bits - 1)) - 1)
    normal = (mag << (23 - m)) + ((126 + emin) << 23)
    sub = lax.bitcast_convert_type(mag.astype(jnp.float32) * 2.0 ** (emin - m), jnp.int32)
    value = jnp.where(mag >= 1 << m, normal, sub) | ((codes >> (bits - 1)) << 31)
    return lax.bitcast_convert_type(value, jnp.float32)


def _scale_bits(stored: jax.Array, fmt: Format) -> jax.Array:
    if fmt.scale_dtype == "e8m0":
        return stored
    return lax.bitcast_convert_type(stored, _SCALE_BITS[fmt.scale_dtype])


def _stored(bits: jax.Array, fmt: Format) -> jax.Array:
    if fmt.scale_dtype == "e8m0":
        return bits
    return lax.bitcast_convert_type(bits, jnp.dtype(fmt.scale_dtype))


def _rows(plan: BlockPlan, fmt: Format) -> dict[str, jax.Array]:
    """What rounding a slot needs, per block, as f32 rows `[G, R]` (computed once for all
    slots, on registers of blocks; numbers, not masks: a mask row broadcast down sublanes is
    what Mosaic lays out worst).

        keep    -1 (every bit) where the block is finite, else 0: its payload, which the
                codes of an infinity or a NaN would fill with anything, is and-ed with it
        inv     1 / scale (E8M0: the exact power of two; bf16: a correctly rounded
                quotient, an estimate exact comparisons settle); 0 for a tiny block
        S       the scale (bf16 only); inf for a tiny block, so that its values round to
                zero codes (float codes keep their sign)

    No lift is needed (`range_factor`): a bf16 scale is at most f32's maximum over elem_max,
    so its reciprocal is a normal number, and it is at least 2^-125, so is every midpoint."""
    keep = jnp.where(plan.finite, -1, 0)
    if plan.s is None:  # E8M0: v = x 2^-k is exact; a tiny block's inv is 0
        return {"keep": keep, "inv": jnp.where(plan.finite, plan.inv, 0.0)}
    s = plan.s / plan.factor  # the scale's value (factor: `range_factor`'s lift)
    ok = plan.finite & (s > 0)
    S = jnp.where(ok, s, jnp.inf)
    return {"keep": keep, "S": S, "inv": jnp.where(ok, 1.0 / S, 0.0)}


def _int_codes(x: jax.Array, r: dict, fmt: Format) -> jax.Array:
    """round(x / S) onto a symmetric integer grid, nearest, ties to even, exactly.

    v = x inv is within a few f32 ulps of x / S, so n0 = floor(v) is the answer or one below
    it, and one exact comparison of x with the midpoint (n0 + 1/2) S (exact in f32: a bf16
    scale has 8 significant bits, a midpoint at most 13) decides: above it n0 + 1, below it
    n0, on it the even one, which rounding n0 + 3/4, n0 + 1/4 or n0 + 1/2 to nearest even
    gives. v is clamped to elem_max - 1/4, so a scale stepped down near f32's maximum
    saturates. Comparisons only: no float environment moves the answer (a flushed
    subnormal x lies below every midpoint, as the zero it reads as does).

    An E8M0 scale (mxint8; no S) makes v exact (x times a power of two that is a normal
    number, the tiny rule's k >= -126; a product below f32's normals rounds to 0 either way):
    v clamped to +-elem_max (the spec's saturation) and rounded to nearest even is the
    answer."""
    if "S" not in r:
        return jnp.round(jnp.clip(x * r["inv"], -fmt.elem_max, fmt.elem_max)).astype(jnp.int32)
    top = fmt.elem_max - 0.25
    n0 = jnp.floor(jnp.clip(x * r["inv"], -top, top))
    mid = (n0 + 0.5) * r["S"]
    w = n0 + jnp.where(x > mid, 0.75, jnp.where(x < mid, 0.25, 0.5))
    return jnp.round(w).astype(jnp.int32)


def _float_codes(x: jax.Array, r: dict, fmt: Format) -> jax.Array:
    """x / S onto a float grid (fp8, fp4), nearest, ties to even, exactly; sign | magnitude
    code. The unit of the grid at |v| (v = x inv, its binade from v's exponent bits) turns the
    grid into integers, and the integer rule of `_int_codes` runs in those units: only a
    midpoint of v's own binade can be in doubt (rounding.py `_nearest_codes`). E8M0 scales
    (no S) make v exact: rounding it to nearest even is the answer. No code passes the top
    of the grid: |v| is clamped to elem_max, and with a bf16 scale the grid's top midpoint
    lies past one scale step (quantize.py)."""
    m, bits = fmt.mant_bits, fmt.elem_bits
    a = r["abs"] if "abs" in r else jnp.abs(x)
    t = jnp.minimum(a * r["inv"], fmt.elem_max)
    top = lax.bitcast_convert_type(lax.bitcast_convert_type(t, jnp.int32) & 0x7F800000,
                                   jnp.float32)  # 2^e
    unit = lax.bitcast_convert_type(jnp.maximum(top, 2.0 ** fmt.min_exponent), jnp.int32)
    ubits = unit - (m << 23)  # the grid's unit, as bits
    w = t * lax.bitcast_convert_type(0x7F000000 - ubits, jnp.float32)  # t / unit, exact
    if "S" not in r:
        n = jnp.round(w).astype(jnp.int32)
    else:
        n0 = jnp.floor(w)
        mid = (n0 + 0.5) * (r["S"] * lax.bitcast_convert_type(ubits, jnp.float32))
        n = jnp.round(n0 + jnp.where(a > mid, 0.75, jnp.where(a < mid, 0.25, 0.5))
                      ).astype(jnp.int32)
    kmin = (127 + fmt.min_exponent - m) << 23  # the unit's bits at the lowest binade
    mag = ((ubits - kmin) >> (23 - m)) + n
    sign = (lax.bitcast_convert_type(x, jnp.int32) >> (32 - bits)) & (1 << (bits - 1))
    return mag | sign


def _fast(fmt: Format) -> bool:
    """Whether the tile code's own rounding takes `fmt`: bf16 and E8M0 scales (an f32 scale's
    products are not exact in f32: `plan_codes` carries it)."""
    return fmt.scale_dtype in ("bfloat16", "e8m0")


def _plans(amax, fmt: Format) -> list[tuple[jax.Array, object, int]]:
    """Each tile's block plan, from its blocks' amax bits (`[G, r]` a tile): the scale bits,
    what rounding needs (`_rows`, or the plan with its finite mask as a number), and where the
    tile's rows start in them. Tiles of one width are planned together, their rows stacked
    so that they fill registers (`block_plan` runs once per block, on whole registers); a
    short last tile, of another width, on its own."""
    widths = {}
    for t, a in enumerate(amax):
        widths.setdefault(a.shape[1], []).append(t)
    plans = [None] * len(amax)
    for ts in widths.values():
        stacked = jnp.concatenate([amax[t] for t in ts])  # [tiles * G, r]
        plan = block_plan(lax.bitcast_convert_type(stacked, jnp.float32), fmt)
        if _fast(fmt):
            rows = _rows(plan, fmt)
        else:  # the package's rounding; the finite mask goes down the sublanes as a number
            rows = dataclasses.replace(plan, finite=jnp.where(plan.finite, 1.0, 0.0))
        bits = _scale_bits(plan.stored, fmt)
        for k, t in enumerate(ts):
            plans[t] = (bits, rows, k * fmt.blocks_per_row)
    return plans


def _encode_t(tiles, fmt: Format) -> Message:
    """Transposed tiles of values (each `[128, r]` f32, slot j: sublanes j B ..) -> the
    message of all of them, laid side by side. Their blocks' scales are worked out together,
    tiles of one width at once (`_plans`)."""
    slots = [_slots(xt, fmt) for xt in tiles]
    mags = [[lax.bitcast_convert_type(s, jnp.int32) & 0x7FFFFFFF for s in ss] for ss in slots]
    # max |x| as the largest magnitude's bits, an integer max: a NaN's lie above +inf's
    amax = [jnp.concatenate([jnp.max(a, axis=0, keepdims=True) for a in aa])  # [G, r] bits
            for aa in mags]
    plans = _plans(amax, fmt)
    codes = _int_codes if fmt.is_int else _float_codes
    payload, scales = [], []
    for t, ss in enumerate(slots):
        bits, rows, at = plans[t]
        out = []
        for j, s in enumerate(ss):  # a slot's registers, 8 sublanes each, share one row
            row = jax.tree.map(lambda a, i=at + j, s=s: jnp.broadcast_to(
                a[i:i + 1], (8, s.shape[1])), rows)
            if _fast(fmt):
                a = lax.bitcast_convert_type(mags[t][j], jnp.float32)
                c = [codes(s[i:i + 8], {**row, "abs": a[i:i + 8]}, fmt)
                     for i in range(0, len(s), 8)]
                keep = jnp.broadcast_to(rows["keep"][at + j:at + j + 1],
                                        (fmt.payload_bytes_per_block, s.shape[1]))
                out.append(_pack(jnp.concatenate(c), fmt) &
                           lax.bitcast_convert_type(keep.astype(jnp.int8), jnp.uint8))
            else:
                row = dataclasses.replace(row, finite=row.finite > 0)
                c = [plan_codes(s[i:i + 8], row, fmt) for i in range(0, len(s), 8)]
                out.append(_pack(jnp.concatenate(c), fmt))
        payload.append(jnp.concatenate(out))
        scales.append(bits[at:at + fmt.blocks_per_row])
    return Message(jnp.concatenate(payload, axis=1), jnp.concatenate(scales, axis=1))


def _factors(bits: jax.Array, fmt: Format) -> jax.Array:
    """Per block, from its scale bits `[G, r]`: the one f32 a decoded element is multiplied
    by. bf16 / f32: the scale's value. E8M0: 2^k, a normal f32 for every block that codes
    anything (k >= -126: the tiny rule, scale.py), 0 for a tiny block (its payload is zero;
    2^-127 would be subnormal), NaN for the NaN code 255."""
    if fmt.scale_dtype != "e8m0":
        return _stored(bits, fmt).astype(jnp.float32)
    k = bits.astype(jnp.int32)
    two_k = lax.bitcast_convert_type(jnp.maximum(k, 1) << 23, jnp.float32)  # 2^(k - 127)
    return jnp.where(k == 255, jnp.nan, jnp.where(k == 0, 0.0, two_k))


def _decode_t(message: Message, fmt: Format) -> jax.Array:
    """A message of one tile -> its values transposed, `[128, r]` f32: each element's grid
    value times its block's factor, saturated to f32's finite range (quantize.py: a scale
    stepped down near f32's maximum, or an E8M0 scale past it)."""
    payload, bits = message
    pb, big = fmt.payload_bytes_per_block, float(jnp.finfo(jnp.float32).max)
    factors = _factors(bits, fmt)
    # only an E8M0 ceil scale can put a code past f32's maximum (a bf16 / f32 scale is
    # stepped down so that elem_max s is finite; the floor rule stays under amax)
    saturate = fmt.scale_dtype == "e8m0" and fmt.scale_rule == "ceil"
    out = []
    for j in range(fmt.blocks_per_row):
        codes = _unpack(payload[j * pb:(j + 1) * pb], fmt)  # [B, r]
        f = jnp.broadcast_to(factors[j:j + 1], (8, codes.shape[1]))  # one row, 8 sublanes
        for i in range(0, fmt.block_size, 8):
            v = _elements(codes[i:i + 8], fmt) * f
            out.append(jnp.clip(v, -big, big) if saturate else v)
    return jnp.concatenate(out)


def _settled_t(local: jax.Array, flushes: bool) -> jax.Array:
    """Local values `[R, 128]` transposed, in f32, subnormals read as zeros of their sign:
    explicitly, unless the core `flushes` them itself (a TPU core flushes subnormal operands
    and results, so there the rule costs nothing)."""
    local = local.astype(jnp.float32).T
    return local if flushes else zero_subnormals(local)


def _tiles(rows: int) -> list[slice]:
    """A message's rows in tiles of 128 (a whole one where it is shorter)."""
    return [slice(i, min(i + 128, rows)) for i in range(0, rows, 128)]


def _message_tile(message: Message, t: slice) -> Message:
    return Message(message.payload[:, t], message.scales[:, t])


def encode(x: jax.Array, fmt: Format) -> Message:
    """Values `[R, 128]` (any float dtype) -> their message: payload uint8 `[G PB, R]`, scale
    bits `[G, R]`. A subnormal value reads as a zero of its sign, as everywhere."""
    # the one transpose a tile: blocks down sublanes
    return _encode_t([x[t].astype(jnp.float32).T for t in _tiles(x.shape[0])], fmt)


def decode(message: Message, fmt: Format, dtype=jnp.float32) -> jax.Array:
    """A message (payload `[G PB, R]`, scales `[G, R]`) -> values `[R, 128]` in `dtype`."""
    return jnp.concatenate([_decode_t(_message_tile(message, t), fmt).T.astype(dtype)
                            for t in _tiles(message.payload.shape[1])])  # rows of values


def hop(message: Message, local: jax.Array, fmt: Format, *, flushes: bool = False) -> Message:
    """One ring hop: the next message, `encode(decode(message) + local)`, the sum in f32 with a
    subnormal local value read as a zero of its sign (as the collectives add it, execute.py
    `settle`; a decoded value is never subnormal): explicitly, unless the core `flushes`
    subnormals itself (a TPU core: the kernels say so). Added transposed: the local values
    take the one transpose, the message none."""
    return _encode_t([_decode_t(_message_tile(message, t), fmt) + _settled_t(local[t], flushes)
                      for t in _tiles(local.shape[0])], fmt)


def reduce(messages, fmt: Format, *, flushes: bool = False) -> Message:
    """Two-shot's reduce step: p messages -> the message of their sum, decoded and added in
    rank order in f32, each partial sum's subnormals read as zeros of their sign (explicitly,
    unless the core `flushes` them). No transpose at all: the sum stays in the messages'
    layout."""
    settle = (lambda v: v) if flushes else zero_subnormals
    return _encode_t([rank_order_sum([_decode_t(_message_tile(m, t), fmt) for m in messages],
                                     settle)
                      for t in _tiles(messages[0].payload.shape[1])], fmt)
