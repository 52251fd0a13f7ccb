"""Rounding onto the element grid, exactly: a block's values to element codes, given its plan.

Quantizing a block is two steps: from its largest magnitude, the scale and what rounding onto it
needs (a `BlockPlan`: the scale as stored, the scale lifted by `range_factor`, an estimate of its
reciprocal; quantize.py's `block_plan`), then every value of the block rounded onto that scale's
grid, here (`plan_codes`). The codes are int32, one per value; elements.py packs them.

The one division, 1/s, is only an estimate: XLA turns a division by a broadcast into a
multiplication by a rounded reciprocal, which can land on the wrong side of a rounding tie. So
`plan_codes` estimates with the reciprocal and then settles every close call with one exact
comparison (`_nearest_codes`): with a bf16 scale (8 significant bits) a midpoint times the
scale, (q +- 1/2) s, is exact in f32, so a plain comparison with x decides; an f32 scale is
split into two halves first (`scales.split`). Stochastic rounding is exact the same way
(`_stochastic_codes`: up from the grid value below, lo, when |x| - lo s >= (1 - u) step s; an
f32 scale's 47-bit products are compared in integer limbs, `_at_least`). An MX scale is a
power of two, so x / s is exact and rounding it is too (`_round_to_grid`). Every product that
feeds an addition or a comparison is exact in f32, so contracting it into an FMA changes no bit.

A subnormal input reads as a zero of its sign (`zero_subnormals`), decided on its exponent bits,
so that no backend's flushing can change a bit: quantize.py's essay says why the rule sits on
the element path and never on amax.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from .elements import float_codes
from .formats import Format
from .scales import pow2, range_factor, split, split_up

__all__ = ["BlockPlan", "plan_codes", "zero_subnormals"]


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



def zero_subnormals(x: jax.Array) -> jax.Array:
    """f32 `x` with every subnormal value replaced by a zero of its sign, decided on the
    exponent bits: what XLA:CPU and TPUs do to a subnormal operand, done explicitly so that a
    GPU, which keeps subnormals, computes the same bits."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    return jnp.where((bits & 0x7F800000) == 0,
                     lax.bitcast_convert_type(bits & ~0x7FFFFFFF, jnp.float32), x)




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
