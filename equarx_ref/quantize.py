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
smallest cover of amax, or an MX power of two. The rounding takes the same care (rounding.py):
the quantizer estimates with the reciprocal, then settles every close call, to nearest or
stochastic, with one exact comparison; it computes each block's scale here (`block_plan`) and
rounds its values onto that scale's grid there (`plan_codes`). The grid values then travel as
packed codes (elements.py), and a block's payload and scale as one uint8 buffer (wire.py).

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
XLA:CPU's fusion decides how many there are. Four choices keep them few (the codec's timings are
stored by `equarx-ref bench`, data/bench.json, and drawn on the Results page): (1) `dequantize`
unpacks 4-bit elements through a broadcast, not as a concatenation of the two nibble halves: XLA
fuses the whole quantizer and its nibble-packing reduction into such a concatenation, one loop
that XLA:CPU runs many times slower per element. `decode` (wire.py: bytes off the wire, no
quantizer to fuse) keeps the concatenation. (2) XLA fuses cheap per-block operations into the
per-element loop that reads them through a broadcast, so the scale search (estimate, exact
steps, `range_factor`, 1/s) would run again for every element of its block: an exact integer
division by a per-block 1 that XLA cannot fold (`_once`) makes it compute the scale once. (3)
The rounding compares x with one midpoint only, a plain product for bf16 scales, and reads the
codes off the rounded units directly (rounding.py's `_nearest_codes`). (4) The subnormal rule
sits on the element path, beside the select that zeroes a non-finite block, where it fuses into
the loop; as a select on the input ahead of the amax reduction it would make XLA:CPU write the
selected f32 input out in a pass of its own and read it back twice.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .elements import decode_elements, pack_codes
from .formats import Format
from .rounding import BlockPlan, plan_codes, zero_subnormals
from .scales import apply_scale, block_scales, range_factor, reciprocal

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
