"""Block-wise quantization: float values to packed elements and one scale per block, and back.

For each block of `B` consecutive values (a `Format` fixes B, the element grid and the scale type):

    amax  = max |x|                                   over the block, in f32
    scale = the smallest scale-dtype value s with s * elem_max >= amax   (so nothing clips)
    q     = round(x / s)  onto the element grid       (nearest, ties to even; or stochastic)
    x'    = q * s                                     (dequantize, in f32)

Both rules hold exactly, under `jit` and eagerly alike, on every backend: no decision depends on
the float environment. The one division, 1/s (`scales.reciprocal`), is only an estimate, and
every product that feeds an addition or a comparison is exact in f32 (a midpoint has at most 13
bits, a bf16 scale 8, an f32 scale is split in 12-bit halves), so fusing it into an FMA (XLA:CPU
contracts a*b + c) removes a rounding that never happened. The scale is scales.py's: the exact
smallest cover of amax, or an MX power of two. The rounding takes the same care: XLA turns a
division by a broadcast into a multiplication by a rounded reciprocal, which can land on the
wrong side of a rounding tie, so the quantizer estimates with the reciprocal and then settles
every close call with one exact comparison: with a bf16 scale (8 significant bits) a midpoint
times the scale, (q +- 1/2) s, is exact in f32, so a plain comparison with x decides; an f32
scale is split into two halves first (`scales.split`). Stochastic rounding is exact the same way
(`_stochastic_codes`: up from the grid value below, lo, when |x| - lo s >= (1 - u) step s; an
f32 scale's 47-bit products are compared in integer limbs, `_at_least`). The grid values then
travel as packed codes (elements.py), and a block's payload and scale as one uint8 buffer
(wire.py).

Error. For integer grids the step is `s`, so round-to-nearest is off by at most s/2 and
stochastic rounding by less than one step, with zero mean. For float grids (fp8, fp4) the step
depends on the element's binade: the error is at most half an ULP of the element format. The
error model built on these bounds is in models/error.py.

Edge cases, all deliberate:
- An all-zero block has scale 0 (E8M0: the smallest exponent, 2^-127) and a zero payload, and
  dequantizes to exact zeros.
- A subnormal input reads as a zero of its sign, and a block whose amax lies below the format's
  tiny threshold, 2^(emax_elem + 1 - g - 126) with 2^g its grid's smallest step (int8: 2^-119,
  1.5e-36; fp8_e4m3: 2^-108, 3e-33), stores scale 0 (E8M0: 2^-127) and a zero payload: it
  dequantizes to zeros. Both are decided on exponent bits, so that no backend's flushing of
  subnormals (XLA:CPU and TPUs flush, GPUs do not) can change a bit, and every other block
  dequantizes to normal f32 values only. The subnormal rule is applied on the element path
  only, never to amax: a subnormal is a block's amax only when every value of the block is
  subnormal or zero, and such a block is tiny (its exponent field, 0, lies below every
  threshold) whether or not the subnormal is flushed; any normal value is larger. It matters
  in the other blocks: there a subnormal can reach half a grid step (int8 at amax = 2^-119:
  s = 1.016 2^-126, so the subnormal 0.75 2^-126 rounds to 1 where the rule gives 0).
- A finite block near f32's maximum stays finite and within the format's bound. Where the
  covering scale s would put the grid's top value past f32's maximum (s * elem_max > 3.4e38),
  the scale is the step below it instead, the largest whose top value is finite, and elements
  past s * elem_max saturate to elem_max: they lose under one scale step times elem_max, which
  for amax = 3.4028e38 is 0.19% (bf16 scales: int4, fp8) or 0.006% (int8), far inside half a
  grid step. Dequantizing also saturates to the largest f32, so nothing finite becomes inf.
- A NaN or infinity in a block makes its amax, hence its scale, non-finite (amax is the
  largest magnitude's bit pattern, and a NaN's lies above every other: XLA:CPU's vectorised
  float max could drop it); the payload of such a block is forced to 0 (casting NaN to an
  integer is undefined, and e4m3 would turn overflow into NaN), so the block dequantizes to
  0 * inf = NaN: non-finite, whatever the payload. Other blocks are untouched.

Speed. Quantizing is compute bound on a CPU: its cost is the operations per element, and
XLA:CPU's fusion decides how many there are. Four choices keep them few (the codec's timings
are stored by `equarx-ref bench`, data/bench.json, and drawn on the Results page):
(1) `dequantize` unpacks 4-bit elements through a broadcast, not as a concatenation of the two
nibble halves: XLA fuses the whole quantizer and its nibble-packing reduction into such a
concatenation, one loop that XLA:CPU runs many times slower per element. `decode` (wire.py:
bytes off the wire, no quantizer to fuse) keeps the concatenation. (2) XLA fuses cheap
per-block operations into the per-element loop that reads them through a broadcast, so the
scale search (estimate, exact steps, `range_factor`, 1/s) would run again for every element of
its block: an exact integer division by a per-block 1 that XLA cannot fold (`_once`) makes it
compute the scale once. (3) The rounding compares x with one midpoint only, a plain product for
bf16 scales, and reads the codes off the rounded units directly (`_nearest_codes`). (4) The
subnormal rule sits on the element path, beside the select that zeroes a non-finite block,
where it fuses into the loop; as a select on the input ahead of the amax reduction it would
make XLA:CPU write the selected f32 input out in a pass of its own and read it back twice.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .elements import decode_elements, float_codes, pack_codes
from .formats import Format
from .scales import apply_scale, block_scales, pow2, range_factor, reciprocal, split, split_up

__all__ = ["BlockPlan", "Quantized", "block_codes", "block_plan", "dequantize", "plan_codes",
           "quantize", "rank_order_sum", "zero_subnormals"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Quantized:
    """A quantized array: packed payload, one scale per block, and what it came from.

    Attributes:
        payload: uint8 `[..., blocks, payload_bytes_per_block]`.
        scales: one per block `[..., blocks]`: bf16 or f32 values, or uint8 E8M0 codes (MX).
        shape: the original shape (static).
        dtype: the original dtype name (static).
        fmt: the `Format` (static).
    """

    payload: jax.Array
    scales: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    dtype: str = dataclasses.field(metadata={"static": True})
    fmt: Format = dataclasses.field(metadata={"static": True})

    @property
    def nbytes(self) -> int:
        """Bytes of payload and scales, as `to_bytes` lays them out."""
        return int(self.payload.size + self.scales.size * self.fmt.scale_bytes)


def _check_float(x: Any, what: str) -> jax.Array:
    try:
        x = jnp.asarray(x)
    except (TypeError, ValueError):
        raise TypeError(f"{what} takes an array x (jax, numpy or a float), got "
                        f"{type(x).__name__}") from None
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{what} needs a floating-point array x, got dtype {x.dtype}; "
                        "cast it to a float dtype first")
    return x


# ---- rounding onto the element grid ----------------------------------------------------------


def _ulp_exponent(q: jax.Array, fmt: Format) -> jax.Array:
    """k with 2^k the spacing of a float grid at |q| (the subnormal range shares the lowest)."""
    e = (lax.bitcast_convert_type(q, jnp.int32) >> 23 & 0xFF) - 127  # |q| in [2^e, 2^(e+1))
    return jnp.maximum(e, fmt.min_exponent) - fmt.mant_bits


def _midpoint_bits(fmt: Format) -> int:
    """Significant bits of a midpoint n +- 1/2 in units of the grid's spacing: |n| < 2^(bits-1)
    for integers; n <= 2^(m+1) for a float grid with m mantissa bits (its binade's top)."""
    return fmt.elem_bits if fmt.is_int else fmt.mant_bits + 3


def _nearest_codes(x: jax.Array, v: jax.Array, s: jax.Array, fmt: Format) -> jax.Array:
    """round(x / s) to the nearest grid value, ties to even, exactly; its int32 code.

    `v = x * fl(1/s)` is the quantizer's fast estimate, within a few f32 ulps of x / s. In
    units u of the grid's spacing at v (1 for integers, 2^k in v's binade for floats) it
    rounds to n = round(v / u); that can sit on the wrong side of a midpoint by a rounding,
    never further, and only of the midpoint nearest to v / u: m = n + h, h = +1/2 if v / u
    >= n, else -1/2. So one exact comparison of x with m u s decides whether n moves by one
    (towards m; on m itself only from an odd n, ties to even). Signed values throughout:

    - bf16 scale (8 significant bits): m has at most `_midpoint_bits` bits, so m u s is exact
      in f32 and a plain comparison with x settles it;
    - f32 scale (24 bits): s is split into head + tail (`split`); r = x - n u head is exact
      (Sterbenz), and so is the sign of (r - h u head) - m u tail.

    A float grid's spacing halves below a power of two, but the midpoint there is a quarter
    step away from v's estimate, which an estimate this close never crosses: only the
    midpoints of v's own binade can be in doubt. x and s come scaled by `range_factor`, so that no
    product or difference below is subnormal.

    The code is read off n and k directly: an integer's is n; a float's magnitude is
    (k - k_min) 2^mant_bits + n (n counts the hidden bit, and n = 2^(mant_bits+1) carries
    into the next binade, as the code does), its sign bit x's, also at zero (-0).
    """
    v = jnp.clip(v, -fmt.elem_max, fmt.elem_max)
    if fmt.is_int:
        w, unit = v, None
    else:  # unit = 2^k = max(2^e, 2^emin) 2^-m for |v| in [2^e, 2^(e+1)); 1/unit from its bits
        top = lax.bitcast_convert_type(lax.bitcast_convert_type(v, jnp.int32) & 0x7F800000,
                                       jnp.float32)  # 2^e (0 for v = 0)
        unit = jnp.maximum(top, 2.0**fmt.min_exponent) * 2.0**-fmt.mant_bits
        ubits = lax.bitcast_convert_type(unit, jnp.int32)
        w = v * lax.bitcast_convert_type(0x7F000000 - ubits, jnp.float32)  # exact
    n = jnp.round(w)
    h = jnp.where(w >= n, 0.5, -0.5)  # towards the midpoint nearest to the estimate
    # a zero scale (all-zero or flushed block) or a non-finite one keeps n: no comparison with
    # an infinite scale holds (it gives +-inf, or NaN where n = 0)
    S = jnp.where(s > 0, s, jnp.inf)
    if fmt.scale_dtype == "bfloat16" and _midpoint_bits(fmt) + 8 <= 24:
        mid = (n + h) * (S if unit is None else S * unit)  # exact (or +-inf beyond f32)
        beyond = ((h > 0) & (x > mid)) | ((h < 0) & (x < mid))  # no select of masks: Mosaic
        tie = x == mid
    else:
        head, tail = split(S)
        if unit is not None:
            head, tail = head * unit, tail * unit  # exact
        d = ((x - n * head) - h * head) - (n + h) * tail  # the sign of x - m u s, exact
        beyond = ((h > 0) & (d > 0)) | ((h < 0) & (d < 0))
        tie = d == 0
    c = n.astype(jnp.int32)
    c = c + jnp.where(beyond | (tie & ((c & 1) == 1)), jnp.where(h > 0, 1, -1), 0)
    if unit is None:  # a block near f32's maximum, its scale stepped down (`block_scales`), may
        # put x past (elem_max + 1/2) s: it saturates to +-elem_max. (A float grid's top
        # midpoint is at least 1/32 beyond elem_max, past one bf16 scale step: never crossed.)
        return jnp.clip(c, -int(fmt.elem_max), int(fmt.elem_max))
    kmin_bits = (127 + fmt.min_exponent - fmt.mant_bits) << 23  # unit's bits at k_min
    mag = ((ubits - kmin_bits) >> (23 - fmt.mant_bits)) + jnp.abs(c)
    return jnp.where(jnp.signbit(x), mag | 1 << (fmt.elem_bits - 1), mag)


def _minus(a: jax.Array, n: jax.Array, S: jax.Array) -> jax.Array:
    """a - n S for an f32 scale S (24 bits), n of at most 12 bits: its sign always exact, its
    value exact when n = floor(a / S). S = head + tail (`split_up`, tail <= 0), so n head and
    n tail are exact; a - n head is exact within a factor 2 of each other (Sterbenz) and for
    n = floor(a / S), and otherwise dwarfs n tail, so the last subtraction keeps the sign."""
    head, tail = split_up(S)
    return (a - n * head) - n * tail


def _at_least(r: jax.Array, m: jax.Array, S: jax.Array) -> jax.Array:
    """r >= m 2^-23 S, exactly, for f32 0 <= r < S (normal or zero) and int32 1 <= m <= 2^23.

    f32 cannot hold m S (47 bits), so both sides are compared as integers in units of
    2^-23 ulp(S), each in two 24-bit limbs of int32: r 2^23 / ulp(S) = R 2^sh with R r's
    significand and sh = 23 - (S's exponent - r's), and m S / ulp(S) = m Si from 12-bit
    halves of m and of S's significand Si. Integer operations only: no float environment.
    """
    rb, sb = lax.bitcast_convert_type(r, jnp.int32), lax.bitcast_convert_type(S, jnp.int32)
    R = jnp.where(rb >> 23 > 0, rb & 0x7FFFFF | 0x800000, 0)
    Si = sb & 0x7FFFFF | 0x800000
    sh = (rb >> 23) - (sb >> 23) + 23  # <= 23 (r < S); below 0, R 2^sh < 2^23 <= m Si
    shc = jnp.clip(sh, 0, 23)
    lhs_hi, lhs_lo = R >> (24 - shc), (R << shc) & 0xFFFFFF  # R << shc wraps: low bits kept
    m1, m0, s1, s0 = m >> 12, m & 0xFFF, Si >> 12, Si & 0xFFF
    mid = m1 * s0 + m0 * s1  # < 2^25
    low = m0 * s0 + ((mid & 0xFFF) << 12)  # < 2^25
    rhs_hi, rhs_lo = m1 * s1 + (mid >> 12) + (low >> 24), low & 0xFFFFFF
    return (sh >= 0) & ((lhs_hi > rhs_hi) | ((lhs_hi == rhs_hi) & (lhs_lo >= rhs_lo)))


def _stochastic_codes(x: jax.Array, v: jax.Array, s: jax.Array, fmt: Format,
                      u: jax.Array) -> jax.Array:
    """Stochastic rounding, exactly: |x| / s goes to the grid value below it, lo, or the one
    above, hi, and up exactly when |x| - lo s >= (1 - u)(hi - lo) s, u uniform in [0, 1) (so
    with probability (|x| / s - lo) / (hi - lo): unbiased); the sign is x's; int32 codes.

    `v = x * fl(1/s)` only guesses: the binade (float grids) and lo are settled by exact
    comparisons, and r = |x| - lo s is exact. With a bf16 or power-of-two scale (8
    significant bits against at most 12 of lo, hi or a binade's top) every product is exact
    in f32, and 1 - u (23 bits) is split in two 12-bit halves, so the decision is the sign of
    (r - w_head S) - w_tail S. An f32 scale (24 bits) takes `_minus` for lo and r and
    `_at_least`, integer limbs, for the decision. No rounding of 1/s or contraction moves
    either. x and s come scaled by `range_factor`: nothing here is subnormal.
    """
    S0 = jnp.where((s > 0) & (s < jnp.inf), s, 0.0)  # a zero or non-finite scale: a zero payload
    wide = fmt.scale_dtype == "float32"  # 24-bit scale: its products are not exact in f32
    if wide:  # past the top only for a scale stepped down near f32's maximum: saturates
        over = _minus(jnp.abs(x), fmt.elem_max, S0) > 0
        a = jnp.where(over, 0.0, jnp.abs(x))
    else:
        over = False
        a = jnp.minimum(jnp.abs(x), fmt.elem_max * S0)  # saturate (floor rule, stepped scales)

    def below(n, S):  # a < n S, exactly
        return _minus(a, n, S) < 0 if wide else a < n * S  # exact products: <= 12 + 8 bits

    t = jnp.minimum(jnp.abs(v), fmt.elem_max)
    if fmt.is_int:
        S, base = S0, None
    else:  # the binade 2^e of |x| / s: from t's bits, then settled exactly (a guess's ulps)
        top = lax.bitcast_convert_type(lax.bitcast_convert_type(t, jnp.int32) & 0x7F800000,
                                       jnp.float32)
        top = jnp.where((top > 0) & (a < top * S0), top * 0.5, top)
        top = jnp.where(a >= 2 * top * S0, top * 2, top)
        unit = jnp.maximum(top, 2.0**fmt.min_exponent) * 2.0**-fmt.mant_bits
        base = lax.bitcast_convert_type(unit, jnp.int32)
        S = S0 * unit  # exact: a power of two
        t = t * lax.bitcast_convert_type(0x7F000000 - base, jnp.float32)  # t / unit, exact
    n = jnp.floor(t)
    n = jnp.where(below(n, S), n - 1, n)
    n = jnp.where(below(n + 1, S), n, n + 1)
    w = 1.0 - u  # exact: u is a multiple of 2^-23
    if wide:
        up = _at_least(_minus(a, n, S), (w * 2.0**23).astype(jnp.int32), S)
    else:
        r = a - n * S  # exact
        w_head = lax.bitcast_convert_type(lax.bitcast_convert_type(w, jnp.int32) & -4096,
                                          jnp.float32)
        up = (r - w_head * S) - (w - w_head) * S >= 0
    c = (n + up).astype(jnp.int32)
    if fmt.is_int:
        c = jnp.where(over, int(fmt.elem_max), c)
        c = jnp.where(S0 > 0, jnp.minimum(c, int(fmt.elem_max)), 0)
        return jnp.where(jnp.signbit(x), -c, c)
    kmin_bits = (127 + fmt.min_exponent - fmt.mant_bits) << 23
    mag = ((base - kmin_bits) >> (23 - fmt.mant_bits)) + c
    mag = jnp.where(over, len(fmt.grid) - 1, mag)
    mag = jnp.where(S0 > 0, jnp.minimum(mag, len(fmt.grid) - 1), 0)
    return jnp.where(jnp.signbit(x), mag | 1 << (fmt.elem_bits - 1), mag)


def _round_to_grid(v: jax.Array, fmt: Format) -> jax.Array:
    """Round element-unit values |v| <= elem_max onto the format's grid, nearest, ties to even
    (f32 result). For MX scales, where v = x 2^-k is exact, so rounding it is exact too."""
    v = jnp.clip(v, -fmt.elem_max, fmt.elem_max)
    k = None if fmt.is_int else _ulp_exponent(v, fmt)
    r = v if k is None else v * pow2(-k)  # exact: a power of two
    r = jnp.round(r)  # round half to even
    r = r if k is None else r * pow2(k)
    return jnp.clip(r, -fmt.elem_max, fmt.elem_max)


# ---- public API ----------------------------------------------------------------------------


def _blocks(x: jax.Array, fmt: Format) -> jax.Array:
    """Flatten, zero-pad to whole blocks: [blocks, B] in f32."""
    flat = x.reshape(-1).astype(jnp.float32)
    pad = -flat.size % fmt.block_size
    return jnp.pad(flat, (0, pad)).reshape(-1, fmt.block_size)


def _once(a: jax.Array, amax: jax.Array) -> jax.Array:
    """The per-block f32 array `a`, unchanged, but computed once per block.

    XLA:CPU fuses cheap per-block operations into the per-element loop that reads them through
    a broadcast, so, unless a block's scale is also an output of its own, the whole scale
    search runs again for every element of the block ("Speed" in the module essay). XLA
    never duplicates a division into a loop that reuses its elements: an exact integer
    division of a's bits by a per-block 1 (amax is never negative, NaN < 0 is false) that XLA
    cannot fold away makes the per-element loop read a stored array.
    """
    one = 1 + (amax < 0).astype(jnp.int32)
    return lax.bitcast_convert_type(lax.div(lax.bitcast_convert_type(a, jnp.int32), one),
                                    jnp.float32)


def zero_subnormals(x: jax.Array) -> jax.Array:
    """f32 `x` with every subnormal value replaced by a zero of its sign, decided on the
    exponent bits: what XLA:CPU and TPUs do to a subnormal operand, done explicitly so that a
    GPU, which keeps subnormals, computes the same bits."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where((bits & 0x7F800000) == 0,
                     lax.bitcast_convert_type(bits & ~0x7FFFFFFF, jnp.float32), x)


def rank_order_sum(parts, settle=lambda v: v) -> jax.Array:
    """parts[0] + parts[1] + ... in rank order, each partial sum passed through `settle`
    (`zero_subnormals` where the collectives add f32): the same additions on every device and
    backend, whether `parts` is an array `[p, ...]` or a list (a kernel's decoded tiles)."""
    total = parts[0]
    for r in range(1, len(parts)):
        total = settle(total + parts[r])
    return total


def quantize_blocks(xb: jax.Array, fmt: Format, key) -> tuple[jax.Array, jax.Array]:
    """[..., blocks, B] f32 -> (payload uint8 [..., blocks, PB], stored scales [..., blocks])."""
    # max |x| as the largest of the magnitudes' bit patterns (sign bit cleared), an int32 max:
    # for non-negative floats the order of the bits is the order of the values, and every NaN
    # lies above +inf, so a NaN decides its block. (A float max would not do: XLA:CPU's
    # vectorised max can drop a NaN, and a second reduction to find it is another pass.)
    bits = lax.bitcast_convert_type(xb, jnp.int32) & 0x7FFFFFFF
    amax = lax.bitcast_convert_type(jnp.max(bits, axis=-1), jnp.float32)
    u = None if key is None else jax.random.uniform(key, xb.shape, jnp.float32)
    codes, stored = block_codes(xb, amax, fmt, u, lambda a: a[..., None],
                                lambda a: _once(a, amax))
    return pack_codes(codes, fmt), stored


def block_codes(xb: jax.Array, amax: jax.Array, fmt: Format, u=None, expand=lambda a: a,
                once=lambda a: a) -> tuple[jax.Array, jax.Array]:
    """The element codes (int32, one per value of `xb`) and the stored scales of blocks whose
    largest magnitudes are `amax`: `quantize_blocks` without the reduction or the packing, for
    any arrangement of the blocks. `expand` broadcasts a per-block array against `xb` (a
    block along the last axis: `a[..., None]`; along the first, as the TPU kernels hold them,
    `amax` already is a row and `expand` the identity); `once` is `_once` on XLA:CPU; `u`
    are stochastic rounding's uniforms (None: round to nearest)."""
    plan = block_plan(amax, fmt, once)
    return plan_codes(xb, plan, fmt, u, expand), plan.stored


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """What quantizing a block needs besides its values, one entry per block (`block_plan`).

    Attributes:
        stored: the scale as stored (bf16 / f32 value, or the E8M0 byte).
        s: the scale's value times `factor` (None for E8M0, whose `inv` is exact).
        inv: 1 / s, an estimate (E8M0: the exact power of two taking x to element units).
        factor: the power of two `range_factor` lifts x and s by (1 for E8M0).
        finite: the block holds no NaN or infinity.
    """

    stored: jax.Array
    s: jax.Array | None
    inv: jax.Array
    factor: jax.Array | None
    finite: jax.Array


def block_plan(amax: jax.Array, fmt: Format, once=lambda a: a) -> BlockPlan:
    """Per block, from its largest magnitude: the scale and what rounding onto it needs."""
    stored, s, inv = block_scales(amax, fmt)
    finite = jnp.isfinite(amax)
    if s is None:
        return BlockPlan(stored, None, once(inv), None, finite)
    s = once(s)
    stored = s.astype(stored.dtype)  # exact: s is the stored scale's value
    factor = range_factor(s, fmt)  # x and s scaled alike by a power of two: same ratios
    s = s * factor
    inv = jnp.where(s > 0, reciprocal(s), 0.0)  # an estimate (`reciprocal`)
    return BlockPlan(stored, s, inv, factor, finite)


def plan_codes(xb: jax.Array, plan: BlockPlan, fmt: Format, u=None,
               expand=lambda a: a) -> jax.Array:
    """The element codes (int32) of values `xb` on their blocks' `plan` (`expand` broadcasts a
    per-block array against `xb`)."""
    finite = expand(plan.finite)
    # A subnormal input reads as a zero of its sign (XLA:CPU and TPUs flush it; GPUs would
    # not), decided on its exponent bits, on the element path only: it cannot move amax (a
    # block whose largest magnitude is subnormal is tiny, scale 0 and a zero payload, either
    # way), and a select kept out of the reduction costs XLA:CPU no pass of its own (module
    # essay, "Speed" (4)), fused with the select that zeroes a non-finite block (its scale
    # alone carries it).
    xb = jnp.where(finite, zero_subnormals(xb), 0.0)
    if plan.s is None:
        v = jnp.where(finite, xb * expand(plan.inv), 0.0)  # exact: a power of two
        if u is None:
            q = _round_to_grid(v, fmt)
            return q.astype(jnp.int32) if fmt.is_int else float_codes(q, fmt)
        stored = plan.stored
        ok = (stored > 0) & (stored < 255)  # not tiny, finite: s = 2^k, k >= -125
        s = jnp.where(ok, pow2(jnp.clip(stored.astype(jnp.int32) - 127, -126, 127)), 0.0)
        factor = range_factor(s, fmt)
        return _stochastic_codes(xb * expand(factor), v, expand(s * factor), fmt, u)
    xb, s = xb * expand(plan.factor), expand(plan.s)
    v = jnp.where(finite, xb * expand(plan.inv), 0.0)
    if u is not None:
        return _stochastic_codes(xb, v, s, fmt, u)
    return _nearest_codes(xb, v, s, fmt)  # exact round(x / s)


def quantize(x: jax.Array, fmt: Format, *, key: jax.Array | None = None) -> Quantized:
    """Quantize `x` block-wise (any shape; flattened, zero-padded to whole blocks).

    Args:
        x: a floating-point array.
        fmt: the wire format, e.g. `Format.int8()`.
        key: a PRNG key for stochastic rounding (unbiased, error below one step); None rounds
            to nearest, ties to even.

    Returns:
        A `Quantized` pytree; `dequantize` restores an f32 array of `x`'s shape.

    Edge cases (module essay): an empty `x` (shape (0,), (3, 0), ...) gives no blocks and
    dequantizes to an empty array of its shape; an all-zero block comes back exact zeros; a
    block with a NaN or Inf comes back all NaN, other blocks untouched; a tiny block (largest
    magnitude below the
    format's threshold, decided on its exponent bits: int8 2^-119, about 1.5e-36) comes back
    as zeros, and a subnormal input as a zero of its sign; a finite block stays finite, even
    next to f32's maximum.
    """
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format, got {type(fmt).__name__}")
    x = _check_float(x, "quantize")
    if x.size == 0:  # no values, no blocks: empty payload and scales of the format's kinds
        kinds = jax.eval_shape(lambda b: quantize_blocks(b, fmt, None),
                               jax.ShapeDtypeStruct((1, fmt.block_size), jnp.float32))
        payload, stored = (jnp.zeros((0, *k.shape[1:]), k.dtype) for k in kinds)
    else:
        payload, stored = quantize_blocks(_blocks(x, fmt), fmt, key)
    return Quantized(payload, stored, tuple(x.shape), jnp.dtype(x.dtype).name, fmt)


def dequantize(q: Quantized) -> jax.Array:
    """The f32 values a `Quantized` stands for: `[*lead, *shape]`, lead the batch axes of a
    stacked `Quantized` (as `from_bytes` of a `[*lead, nbytes]` buffer gives)."""
    if not isinstance(q, Quantized):
        raise TypeError(f"dequantize takes q, the Quantized that quantize returns, got "
                        f"{type(q).__name__}")
    lead, n = q.payload.shape[:-2], math.prod(q.shape)
    if q.payload.size == 0:  # no blocks (an empty array): no values
        return jnp.zeros((*lead, *q.shape), jnp.float32)
    values = apply_scale(decode_elements(q.payload, q.fmt, from_wire=False), q.scales, q.fmt)
    return values.reshape(*lead, -1)[..., :n].reshape(*lead, *q.shape)
