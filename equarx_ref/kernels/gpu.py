"""The GPU codec: encode, decode and one ring hop as Pallas kernels for GPUs (Triton backend).

XLA:GPU compiles the readable codec (`wire.encode`) into a reduce fusion for the block maxima,
small per-block fusions for the scales, and one concatenate fusion that reads the input again
and writes the `[blocks, bytes_per_block]` rows: at least two passes over the input, where the
fewest bytes are one. Measured on an NVIDIA H100 (jax 0.11.2, 2^28 bf16 values, `equarx-ref
bench`): int8 encode at 36% of a copy's bandwidth, and a ring hop at 2.2x a bf16 `a + b`.

These kernels make each program one pass. A grid step loads a tile of `TILE_BLOCKS` blocks,
`[TILE_BLOCKS, block_size]`, quantizes it where it lies with the package's own rule
(`quantize.quantize_blocks`, unchanged), and stores the payload bytes and the scale bytes
straight into the wire rows, block after block: the bytes `wire.encode` writes, bit for bit
(tests/test_gpu_codec.py holds every kernel to the spec in interpret mode on the CPU, and
`equarx-ref check` does on a GPU). Decode reads the rows back the same way, and the hop
decodes, adds its local tile in f32 and encodes again without leaving the core.

    encode  values [..., n]                     -> wire bytes [..., fmt.nbytes(n)]
    decode  wire bytes [..., fmt.nbytes(n)]     -> values [..., n]
    hop     (wire bytes, local values [..., n]) -> wire bytes: encode(decode(wire) + local)

Triton's shapes are powers of two, so a tile is a power-of-two number of blocks of a
power-of-two block size, and a row of 34 bytes is written as its payload `[tile, 32]` and one
column per scale byte. The formats are those of 8-bit and of 4-bit elements (`FORMATS`). An
8-bit code is a payload byte; 4-bit codes pack in the package's own way (`elements.pack_codes`:
byte i holds elements i and i + B/2, the block's two halves as `[tile, 2, B/2]` and a
reduction over the 2), and unpack through the broadcast of `decode_elements(from_wire=False)`,
the same values as the wire path's concatenation, which has no Triton lowering. Widths whose
groups span 3 bytes (6-bit) have no power-of-two shape and are refused. Two of jax's lowering
rules for Triton are missing for what the rule uses, so `_lowering_rules` adds them, only where
jax has none (`_jax_private.py` lists the names): `round` (ties to even by one addition, ties
away from zero from `floor`) and a `stack` of one array (an added axis).

Triton's float semantics differ from XLA's in two ways the rule met, both found on an H100
(tests/test_gpu_codec.py evaluates the kernels' bodies with Triton's semantics on the CPU, so
CI holds them to it): jax lowers `-x` to Triton as 0 - x, so a decoded -0 came back +0
(`elements._float_values` now multiplies by -1 instead), and `max` and `min` to `maxnumf`
and `minnumf`, which drop a NaN, so a non-finite block decoded to 3.4e38: the decode here
saturates by comparisons (`_decode_values`), where `scales.apply_scale` keeps its clip (XLA:TPU
counted 1.8x the bytes for a 4-bit decode with the comparisons).

Measured on an NVIDIA H100 80GB HBM3 (jax 0.11.2, 2^28 bf16 values, medians of round-robin calls
in one run, against `x + 1` and a bf16 `a + b` in the same run; runs on four machines, each
against its own baselines): a tile of 64 blocks on 2 warps was the fastest of 16 (16-128 blocks
x 1-8 warps; 1024 blocks ran 10x slower; a later sweep with the one-addition round had 32x1,
64x4 and 128x4 within 4% of it, inside the runs' spread). int8 encode 0.78 / 0.98 ms, 56% / 50%
of the copy's bandwidth (the XLA codec: 1.27 ms, 38-39%); decode 94% (XLA: 68%); a hop 0.96 /
1.11 ms, 1.65x / 1.83x `a + b` (XLA: 2.8-3.2x); mxfp8 encode 61% / 54%. A naive quantizer in the
same kernel shape (absmax / 127, round, no exactness rule) took 0.56-0.60 ms, 73-78%: the exact
rule costs about 1.5x here, in arithmetic (the scale bytes' stores cost nothing measurable), so
operations per element are what to save: `round` as one addition (`_round_half_even`) instead of
two floors took, side by side on the third machine, int8 encode 0.99 -> 0.94 ms and its hop 1.15
-> 1.08 ms (1.46x -> 1.37x `a + b`), fp8_e4m3 1.11 -> 1.01 and 1.41 -> 1.29 ms, mxfp8 0.93 ->
0.85 and 1.21 -> 1.10 ms (one PTX `cvt.rni` instead of the floors had gained nothing, in an
earlier run). So a hop meets 1.5x `a + b` for int8 and mxfp8, not for fp8_e4m3 (1.64x), and
encode stays short of 60% of a copy (int8 47%, mxfp8 51-53% on that machine, whose copy ran at
1.9 TB/s). The 4-bit formats, on a fourth machine (`equarx-ref bench --mib 512`, copy 1.9 TB/s):
int4 encode 39% of a copy, decode 71%, a hop 1.44x `a + b` (the XLA codec's: 2.62x); mxfp4 41%,
76%, 1.46x (XLA: 2.94x); int8 in the same run 46%, 75%, 1.47x.

What this does not claim: no other GPU has run these kernels; the figures are the closing
notes' and this essay's, not a stored result.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .._checks import array, count, value_dtype
from .._jax_private import private
from ..elements import decode_elements
from ..formats import Format
from ..quantize import quantize_blocks, zero_subnormals
from ..scales import scaled

__all__ = ["FORMATS", "NUM_WARPS", "TILE_BLOCKS", "decode", "encode", "hop", "supports"]

#: The formats these kernels code (`supports`): 8-bit and 4-bit elements, power-of-two blocks.
FORMATS = ("int8", "fp8_e4m3", "fp8_e5m2", "mxfp8", "int8/f32", "fp8_e4m3/f32",
           "int4", "fp4_e2m1", "mxfp4", "int4/f32", "int4/b16")
#: Blocks a grid step codes, at most (fewer where a message has fewer, a power of two).
TILE_BLOCKS = 64
#: Warps (32 threads each) a grid step runs on.
NUM_WARPS = 2


def supports(fmt: Format) -> str | None:
    """None if these kernels code `fmt`, else why not (one line)."""
    if not isinstance(fmt, Format):
        return f"fmt must be an equarx_ref.Format, got {type(fmt).__name__}"
    if fmt.elem_bits not in (4, 8):
        return f"the GPU codec codes 8-bit and 4-bit elements, not {fmt.elem_bits}-bit {fmt}"
    if fmt.block_size & (fmt.block_size - 1):
        return f"the GPU codec's tiles are powers of two, not block_size {fmt.block_size}"
    return None


def _format(fmt) -> Format:
    why = supports(fmt)
    if why is not None:
        raise (TypeError if not isinstance(fmt, Format) else ValueError)(why)
    return fmt


# ---- two lowering rules jax's Triton backend lacks -------------------------------------------


def _round_half_even(x: jax.Array, *, ties_to_even: bool = True) -> jax.Array:
    """round(x), ties to even (or away from zero), exactly. For |x| < 2^23, ties to even is
    one addition: t = |x| + 2^23 lies in [2^23, 2^24], where f32's spacing is 1 (2 at 2^24
    itself), so the addition rounds |x| to an integer, ties to even (no FMA can contract an
    addition, and a flushed subnormal rounds to 0 either way), and t - 2^23 is exact. The 2^23
    is read off t's bits (its exponent field with the lowest bit cleared: 2^23 for t = 2^24
    too), so that no compiler folds (|x| + c) - c into |x|, as XLA does. Ties away from zero
    decide on the exact fraction |x| - floor(|x|). x's sign bit goes back on by an OR (-0.4
    rounds to -0; Triton's negation, 0 - x, would give +0); larger |x| (and inf, NaN) are
    integers already."""
    a = jnp.abs(x)
    if ties_to_even:
        t = a + 2.0**23  # the rounding
        r = t - lax.bitcast_convert_type(lax.bitcast_convert_type(t, jnp.int32) & 0x7F000000,
                                         jnp.float32)  # t - 2^23, exact
    else:
        n = jnp.floor(a)
        r = jnp.where(a - n >= 0.5, n + 1, n)  # the fraction is exact
    sign = lax.bitcast_convert_type(x, jnp.int32) & jnp.int32(-2**31)
    r = lax.bitcast_convert_type(lax.bitcast_convert_type(r, jnp.int32) | sign, jnp.float32)
    return jnp.where(a < 2.0**23, r, x)


@functools.cache
def _lowering_rules() -> None:
    """Add Triton lowering rules for `round` and a one-array `stack`, where jax has none."""
    rules = private("jax._src.pallas.triton.lowering:triton_lowering_rules", None)
    lower_fun = private("jax._src.pallas.triton.lowering:lower_fun", None)
    if rules is None or lower_fun is None:
        return
    if lax.round_p not in rules:
        rules[lax.round_p] = lower_fun(lambda x, rounding_method: _round_half_even(
            x, ties_to_even=rounding_method == lax.RoundingMethod.TO_NEAREST_EVEN),
            multiple_results=False)
    stack_p = jax.make_jaxpr(lambda x: jnp.stack([x]))(1.0).eqns[0].primitive  # jnp.stack's
    stack = rules.get(stack_p) if stack_p.name == "stack" else None
    if stack is not None and not getattr(stack, "_one_array", False):
        one = lower_fun(lambda x, axis: lax.expand_dims(x, (axis,)), multiple_results=False)

        def stack_rule(ctx, *args, axis):
            return one(ctx, *args, axis=axis) if len(args) == 1 else stack(ctx, *args, axis=axis)

        stack_rule._one_array = True
        rules[stack_p] = stack_rule


# ---- the tile bodies -------------------------------------------------------------------------


def _store_wire(fmt: Format, out_ref, payload: jax.Array, stored: jax.Array) -> None:
    """Write a tile's rows: payload bytes, then the scale's bytes, little-endian, one column
    each (a bf16 or f32 scale through its same-width integer bits)."""
    pb = fmt.payload_bytes_per_block
    out_ref[:, :pb] = payload
    if fmt.scale_dtype == "e8m0":
        out_ref[:, pb] = stored
        return
    uint = jnp.uint16 if fmt.scale_dtype == "bfloat16" else jnp.uint32
    bits = lax.bitcast_convert_type(stored, uint).astype(jnp.uint32)
    for i in range(fmt.scale_bytes):
        out_ref[:, pb + i] = ((bits >> (8 * i)) & 0xFF).astype(jnp.uint8)


def _decode_values(fmt: Format, payload: jax.Array, scale_bytes) -> jax.Array:
    """A tile's payload `[tile, PB]` and its scale bytes (one `[tile]` column each) -> f32
    values `[tile, block_size]`, `wire.decode`'s numerics: the scale read as f32 straight from
    its bytes, then `scales.apply_scale`'s saturation by two comparisons, which a NaN fails
    (its clip lowers to Triton's `minnumf` and `maxnumf`, which drop one). 4-bit codes unpack
    through a broadcast (`from_wire=False`: Triton has no concatenation)."""
    if fmt.scale_dtype == "e8m0":
        scales = scale_bytes[0]
    else:
        bits = scale_bytes[0].astype(jnp.uint32)
        for i, b in enumerate(scale_bytes[1:], 1):
            bits = bits | b.astype(jnp.uint32) << (8 * i)
        if fmt.scale_dtype == "bfloat16":
            bits = bits << 16
        scales = lax.bitcast_convert_type(bits, jnp.float32)
    out = scaled(decode_elements(payload, fmt, from_wire=False), scales, fmt)
    big = np.finfo(np.float32).max
    return jnp.where(out > big, big, jnp.where(out < -big, -big, out))


def _load_wire(fmt: Format, wire_ref) -> jax.Array:
    """A tile's rows -> f32 values `[tile, block_size]` (`_decode_values`)."""
    pb = fmt.payload_bytes_per_block
    return _decode_values(fmt, wire_ref[:, :pb],
                          [wire_ref[:, pb + i] for i in range(fmt.scale_bytes)])


def _encode_body(fmt, x_ref, out_ref):
    _store_wire(fmt, out_ref, *quantize_blocks(x_ref[...].astype(jnp.float32), fmt, None))


def _decode_body(fmt, wire_ref, out_ref):
    out_ref[...] = _load_wire(fmt, wire_ref).astype(out_ref.dtype)


def _hop_body(fmt, wire_ref, local_ref, out_ref):
    # a subnormal local value reads as a zero of its sign, as the collectives add it
    # (execute.py); a decoded value is never subnormal
    total = _load_wire(fmt, wire_ref) + zero_subnormals(local_ref[...].astype(jnp.float32))
    _store_wire(fmt, out_ref, *quantize_blocks(total, fmt, None))


# ---- the kernels -----------------------------------------------------------------------------


def _tile(blocks: int) -> int:
    """Blocks a grid step codes: the largest power of two dividing `blocks`, at most
    TILE_BLOCKS (the grid then covers the message exactly)."""
    return math.gcd(blocks, TILE_BLOCKS)


def _call(body, fmt: Format, blocks: int, operands, out_cols: int, out_dtype, interpret):
    tile = _tile(blocks)
    _lowering_rules()
    spec = lambda cols: pl.BlockSpec((tile, cols), lambda i: (i, 0))  # noqa: E731
    return pl.pallas_call(
        functools.partial(body, fmt), grid=(blocks // tile,),
        in_specs=[spec(op.shape[1]) for op in operands], out_specs=spec(out_cols),
        out_shape=jax.ShapeDtypeStruct((blocks, out_cols), out_dtype),
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS),
        interpret=_interpret(interpret))(*operands)


def _interpret(interpret) -> bool:
    """None: native on a GPU, interpreted elsewhere (no Triton to compile for)."""
    if interpret is None:
        return jax.default_backend() != "gpu"
    return bool(interpret)


def _values(x, name: str, fmt: Format) -> tuple[jax.Array, int]:
    x = array(x, name, floating=True)
    if x.ndim < 1 or x.shape[-1] % fmt.block_size:
        raise ValueError(f"{name} must be rows [..., n] of whole blocks of {fmt.block_size}, got "
                         f"shape {list(x.shape)}")
    return x, x.shape[-1]


def _wire(wire, fmt: Format, n: int, lead: tuple[int, ...] | None = None) -> jax.Array:
    w = array(wire, "wire")
    want = fmt.nbytes(n)
    if w.dtype != jnp.uint8 or w.ndim < 1 or w.shape[-1] != want or (
            lead is not None and w.shape[:-1] != lead):
        shape = "[..., " if lead is None else f"[{', '.join(map(str, lead))}{', ' if lead else ''}"
        raise ValueError(f"wire must be uint8 {shape}{want}] ({n} values of {fmt} a row), got "
                         f"{w.dtype}{list(w.shape)}")
    return w


def encode(x, fmt: Format, *, interpret=None) -> jax.Array:
    """Values `[..., n]` (n whole blocks) -> uint8 `[..., fmt.nbytes(n)]`: `wire.encode`'s
    bytes (round to nearest). `interpret`: None runs natively on a GPU, interpreted elsewhere."""
    fmt = _format(fmt)
    x, n = _values(x, "x", fmt)
    blocks = x.size // fmt.block_size
    out = _call(_encode_body, fmt, blocks, [x.reshape(blocks, fmt.block_size)],
                fmt.bytes_per_block, jnp.uint8, interpret)
    return out.reshape(*x.shape[:-1], fmt.nbytes(n))


def decode(wire, fmt: Format, n: int, dtype="float32", *, interpret=None) -> jax.Array:
    """uint8 `[..., fmt.nbytes(n)]` -> `dtype` `[..., n]`: `wire.decode` of each row."""
    fmt, dtype = _format(fmt), value_dtype(dtype)
    count(n, "n")
    if n % fmt.block_size:
        raise ValueError(f"decode takes rows of whole blocks: {n} values is not a multiple of "
                         f"block_size {fmt.block_size}")
    w = _wire(wire, fmt, n)
    blocks = w.size // fmt.bytes_per_block
    out = _call(_decode_body, fmt, blocks, [w.reshape(blocks, fmt.bytes_per_block)],
                fmt.block_size, dtype, interpret)
    return out.reshape(*w.shape[:-1], n)


def hop(wire, local, fmt: Format, *, interpret=None) -> jax.Array:
    """One ring hop, `encode(decode(wire) + local)` with the sum in f32 (a subnormal local
    value as a zero of its sign, as the collectives add it): wire uint8 `[..., fmt.nbytes(n)]`
    and local `[..., n]` -> the next message, bitwise the XLA codec's."""
    fmt = _format(fmt)
    local, n = _values(local, "local", fmt)
    w = _wire(wire, fmt, n, local.shape[:-1])
    blocks = local.size // fmt.block_size
    out = _call(_hop_body, fmt, blocks, [w.reshape(blocks, fmt.bytes_per_block),
                                         local.reshape(blocks, fmt.block_size)],
                fmt.bytes_per_block, jnp.uint8, interpret)
    return out.reshape(w.shape)
