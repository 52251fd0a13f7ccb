"""The spec: what every codec and collective of equarx-ref must return, bit for bit.

NumPy and ml_dtypes only, no jax, written from the rules and never from the package's code:
the oracle the package, its backend-tuned codecs and its kernels are proven bitwise against,
and the one users can run without jax. It reads a format from its public fields only (`name`,
`block_size`, `scale_dtype`, `scale_rule`: the package's `Format`, or any object with them)
and a schedule as plain data (sums.py).

The rules, for each block of B f32 values x (formats.py, scale.py, elements.py, quantize.py):

    amax    = max |x|
    scale   bf16/f32: the smallest scale-dtype value s with s * elem_max >= amax
            E8M0 (MX): 2^ceil(log2(amax / elem_max)), or OCP MX v1.0's floor rule
    element = round(|x| / s) onto the grid, nearest, ties to the even code, with x's sign;
            or stochastic, given uniforms u: up from the grid value below, lo, to the one
            above, hi, exactly when |x| - lo s >= (1 - u)(hi - lo) s
    x'      = element * s, saturated to f32's finite range
    message two operands, block r G + j in lane r of slot j: payload [G PB, R] and scales
            [G, R] (wire.py); its canonical bytes: per block its payload, then its scale

then the sum of every schedule (sums.py): messages decoded as dequantize(quantize(v)), added
in f32 in the schedule's order; the owner keeps exactly what the others receive; and the data
classes every codec is checked on (data.py, `equarx-ref check`). `all_reduce(x, schedule,
fmt)` is the package's `eq.all_reduce` with every message in `fmt`, i.e. `min_bytes=0`: by
default the package sends a message unquantized when quantizing it would send no fewer bytes
(a short message padded to whole blocks), and that result is the spec's `fmt=None` sum.

An oracle never answers a malformed question: every function checks its arguments before it
computes (_checks.py), as strictly as `eq.quantize` does: an unknown format name, a block of
the wrong width, integer, complex or object arrays, more device rows than the schedule has,
each is refused with one line naming the argument (a ValueError or TypeError, never an
`assert`, which `python -O` removes). Empty inputs give empty answers.

Exactness. Inputs are f32 (24 significant bits), bf16 scales carry 8, f32 scales 24, grid
values and their midpoints at most 13: every product of a grid value (or midpoint) and a
scale fits the 53 bits of a float64, so `midpoint * s` against `|x|` and `s * elem_max`
against `amax` are exact comparisons, and no division is ever rounded into a decision: a
quotient is at most a first guess, and exact comparisons settle the answer.

No rule depends on the float environment. Backends differ: XLA:CPU and TPUs flush subnormal
inputs and results to zero, GPUs keep them; XLA:CPU contracts a*b + c into one FMA rounding;
XLA:GPU's x/y and 1/y are not always correctly rounded. So:

- a subnormal input reads as a zero of its sign, and a block is tiny when amax's exponent
  field is below `tiny_exponent` (amax < 2^(emax_elem + 1 - g - 126), 2^g the grid's
  smallest step): it stores scale 0 (E8M0: 2^-127) and a zero payload. Both are integer
  tests of exponent bits; every other block's scale makes every value it dequantizes to a
  normal f32, so no result is ever subnormal either;
- every product that feeds an addition or a comparison is exact in f32 (the package's JAX
  code splits an f32 scale into 12-bit halves for that, and compares the 47-bit products of
  stochastic rounding with an f32 scale in integer limbs), so contracting it into an FMA
  changes nothing;
- a division or reciprocal is only ever an estimate; exact comparisons settle every case
  whatever its last few bits.

Edge cases: a NaN or infinity makes the block's scale non-finite (E8M0: the NaN byte 255),
its payload 0 and its values NaN; dequantized values saturate to f32's finite range.
"""

from . import data
from .elements import nearest, pack, stochastic, unpack
from .formats import E8M0_BIAS, ELEMENTS, F32_MAX, F32_TINY, grid, is_int, tiny_exponent
from .quantize import SpecQuantized, quantize_blocks, round_trip, to_blocks
from .scale import block_scale
from .sums import all_reduce
from .wire import (
    blocks_per_row,
    canonical_bytes,
    fixed_bytes,
    from_message,
    message,
    row_values,
    scale_bytes,
)

__all__ = ["E8M0_BIAS", "ELEMENTS", "F32_MAX", "F32_TINY", "SpecQuantized", "all_reduce",
           "block_scale", "blocks_per_row", "canonical_bytes", "data", "fixed_bytes",
           "from_message", "grid", "is_int", "message", "nearest", "pack", "quantize_blocks",
           "round_trip", "row_values", "scale_bytes", "stochastic", "tiny_exponent",
           "to_blocks", "unpack"]
