"""The GPU codec: encode, decode and one ring hop as Pallas kernels for GPUs (Triton backend).

A message is two arrays (spec/wire.py): the payload uint8 `[G PB, R]`, block r G + j's PB bytes
down lane r of slot j, and the scales `[G, R]`, its scale's bits in the same lane. The readable
codec (`wire.encode`: `quantize.quantize_blocks`, then transposes) leaves it to XLA:GPU how to
fuse a reduction for the block maxima, the elements and the transposes, and it may read the
values more than once, where the fewest bytes are one pass. These kernels make each program
one pass:

    encode  values [..., m]                     -> Message([..., G PB, R], [..., G, R])
    decode  Message, m                          -> values [..., m]
    hop     (Message, local values [..., m])    -> Message: encode(decode(message) + local)

for m = R rows of `fmt.row` values (128, or one block when the block does not divide 128).

The tiling. A grid step codes a tile of T rows of a message: it loads the values where they lie,
`[T, G, B]` (T rows of consecutive values: a coalesced load), quantizes them with the package's
own rule on blocks along the last axis (`quantize_blocks`, unchanged), which gives the payload
`[T, G, PB]` and the scales `[T, G]` in the values' order, transposes both in registers and
stores `[G, PB, T]` and `[G, T]`: every payload row of the tile is T consecutive bytes of the
message. The bytes are `wire.encode`'s by construction, and tests/test_gpu_codec.py holds every
kernel to the spec. Decode transposes the bytes back, then decodes in the values' order; a hop
does both, adding its local values in their own order, so nothing but bytes is ever transposed.
The transpose is of the codes, not of the values as on a TPU (kernels/tiles.py): there the
transposed values put a block down one lane's sublanes, where its maximum needs no cross-lane
shuffles; a GPU reduces along any axis of a Triton tensor (within a thread, then by warp
shuffles) and has nothing to gain from a transposed computation, and Triton moves a transpose
through shared memory, where the payload's bytes are a quarter (8-bit) or an eighth (4-bit) of
the f32 values'. T is `TILE_ROWS` = 32, on `NUM_WARPS` = 4 warps: a payload row of the tile is
then 32 bytes, one whole sector of a GPU's memory transactions (16 rows would write half
sectors), a scale row one, two or four sectors (E8M0, bf16, f32 scales), and a step's 4096
values (rows of 128) are 32 a thread, which a thread holds in registers with the rule's
temporaries. Where a message's rows are not a multiple of 32, T is the largest power of two that
divides them (Triton's shapes are powers of two, and a grid must cover the message exactly:
Pallas' Triton lowering masks no ragged edge), and where T is under 32 a step codes the tiles of
several messages side by side, as many as divide their count within 32 rows (`[L, T, G, B]`; one
grid axis over messages, one over tiles).

These tiles are reasoned, not measured: the kernels have not run on a GPU (none was lent when
they were written for this layout). `equarx-ref bench` times them on a GPU against a copy and a
bf16 `a + b` (`runs/bench.py`), `equarx-ref check` holds them to the spec there, and the
figures belong in the stored records, not here.

Shapes and formats. The formats are those of 8-bit and of 4-bit elements in power-of-two
blocks (`FORMATS`, `supports`), so G, PB and B are powers of two. An 8-bit code is a payload
byte; 4-bit codes pack in the package's own way (`elements.pack_codes`: byte i holds elements i
and i + B/2, the block's halves as `[..., 2, B/2]` and a reduction over the 2), and unpack
through the broadcast of `decode_elements(from_wire=False)`, the same values as the wire path's
concatenation, which has no Triton lowering. Widths whose groups span 3 bytes (6-bit) have no
power-of-two shape and are refused. Two of jax's lowering rules for Triton are missing for what
the rule uses, so `_lowering_rules` adds them, only where jax has none (`_jax_private.py` lists
the names): `round` (ties to even by one addition, ties away from zero from `floor`) and a
`stack` of one array (an added axis).

Triton's float semantics differ from XLA's in ways the rule meets (tests/test_gpu_codec.py
evaluates the kernels' bodies with Triton's semantics on the CPU, so CI holds them to it): jax
lowers `-x` to Triton as 0 - x, which turns -0 into +0 (`elements.float_values` multiplies by
-1 instead, and the round lowering puts the sign back by an OR), and `max` and `min` to
`maxnumf` and `minnumf`, which drop a NaN, so a clip would saturate a non-finite block's NaN to
3.4e38: the decode here saturates by comparisons, which a NaN fails (`_decode_values`), where
`scales.apply_scale` keeps its clip. Triton also contracts a product and an addition into one
FMA by default; the rule's products are exact where they feed an addition (quantize.py), and a
decoded value (code times scale, inexact for an f32 scale) reaches the hop's addition through
the saturation's selects, which no contraction crosses.
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
from ..wire import Message

__all__ = ["FORMATS", "NUM_WARPS", "TILE_ROWS", "decode", "encode", "hop", "supports"]

#: The formats these kernels code (`supports`): 8-bit and 4-bit elements, power-of-two blocks.
FORMATS = ("int8", "fp8_e4m3", "fp8_e5m2", "mxfp8", "int8/f32", "fp8_e4m3/f32",
           "int4", "fp4_e2m1", "mxfp4", "int4/f32", "int4/b16")
#: Rows of a message a grid step codes, at most (fewer where a message has fewer: a power of
#: two that divides them).
TILE_ROWS = 32
#: Warps (32 threads each) a grid step runs on.
NUM_WARPS = 4
_SCALE_BITS = {"bfloat16": jnp.uint16, "float32": jnp.uint32, "e8m0": jnp.uint8}


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


# ---- the tile code: what a grid step computes, on arrays --------------------------------------
#
# A tile is `[..., T, G, B]` values (T rows of G blocks) and its message `[..., G, PB, T]`,
# `[..., G, T]`; a leading axis holds the tiles of several messages coded in one step.


def _encode_tile(x: jax.Array, fmt: Format) -> tuple[jax.Array, jax.Array]:
    """Values `[..., T, G, B]` (f32) -> the tile's payload uint8 `[..., G, PB, T]` and scale
    bits `[..., G, T]`: the blocks quantized where they lie, then the bytes transposed."""
    payload, stored = quantize_blocks(x, fmt, None)  # [..., T, G, PB], [..., T, G]
    if fmt.scale_dtype != "e8m0":
        stored = lax.bitcast_convert_type(stored, _SCALE_BITS[fmt.scale_dtype])
    return jnp.moveaxis(payload, -3, -1), jnp.swapaxes(stored, -1, -2)  # block r G + j: lane r


def _decode_values(fmt: Format, payload: jax.Array, bits: jax.Array) -> jax.Array:
    """Payload `[..., PB]` and scale bits `[...]` (one block each) -> f32 values `[..., B]`,
    `wire.decode`'s numerics: the scale read as f32 straight from its bits, then
    `scales.apply_scale`'s saturation by two comparisons, which a NaN fails (its clip lowers
    to Triton's `minnumf` and `maxnumf`, which drop one). 4-bit codes unpack through a
    broadcast (`from_wire=False`: Triton has no concatenation)."""
    if fmt.scale_dtype == "bfloat16":
        scales = lax.bitcast_convert_type(bits.astype(jnp.uint32) << 16, jnp.float32)
    elif fmt.scale_dtype == "float32":
        scales = lax.bitcast_convert_type(bits, jnp.float32)
    else:  # the E8M0 byte, as stored
        scales = bits
    out = scaled(decode_elements(payload, fmt, from_wire=False), scales, fmt)
    big = np.finfo(np.float32).max
    return jnp.where(out > big, big, jnp.where(out < -big, -big, out))


def _decode_tile(payload: jax.Array, bits: jax.Array, fmt: Format) -> jax.Array:
    """A tile's message, payload `[..., G, PB, T]` and scale bits `[..., G, T]` -> f32 values
    `[..., T, G, B]`: the bytes transposed back, then decoded (`_decode_values`)."""
    return _decode_values(fmt, jnp.moveaxis(payload, -1, -3), jnp.swapaxes(bits, -1, -2))


def _hop_tile(payload: jax.Array, bits: jax.Array, local: jax.Array,
             fmt: Format) -> tuple[jax.Array, jax.Array]:
    """One hop on a tile: `_encode_tile(_decode_tile(message) + local)`, the sum in f32 with a
    subnormal local value read as a zero of its sign, as the collectives add it (execute.py;
    a decoded value is never subnormal)."""
    total = _decode_tile(payload, bits, fmt) + zero_subnormals(local.astype(jnp.float32))
    return _encode_tile(total, fmt)


def _encode_body(fmt, x_ref, p_ref, s_ref):
    p_ref[...], s_ref[...] = _encode_tile(x_ref[...].astype(jnp.float32), fmt)


def _decode_body(fmt, p_ref, s_ref, out_ref):
    out_ref[...] = _decode_tile(p_ref[...], s_ref[...], fmt).astype(out_ref.dtype)


def _hop_body(fmt, p_ref, s_ref, x_ref, po_ref, so_ref):
    po_ref[...], so_ref[...] = _hop_tile(p_ref[...], s_ref[...], x_ref[...], fmt)


# ---- the kernels -----------------------------------------------------------------------------


def _tile(messages: int, rows: int) -> tuple[int, int]:
    """(messages, rows) a grid step codes of `messages` messages of `rows` rows each: rows T,
    the largest power of two dividing `rows`, at most `TILE_ROWS`; then as many messages as
    divide `messages` and keep the step within `TILE_ROWS` rows (a power of two)."""
    t = math.gcd(rows, TILE_ROWS)
    return math.gcd(messages, TILE_ROWS // t), t


def _call(body, fmt: Format, messages: int, rows: int, operands, results, interpret):
    """`body` over the grid of tiles of `messages` messages of `rows` rows. `operands` and
    `results` are (kind, array or dtype) pairs, kind "values" (`[L, R, G, B]`), "payload"
    (`[L, G, PB, R]`) or "scales" (`[L, G, R]`); returns the results."""
    g, b, pb = fmt.blocks_per_row, fmt.block_size, fmt.payload_bytes_per_block
    shapes = {"values": (messages, rows, g, b), "payload": (messages, g, pb, rows),
              "scales": (messages, g, rows)}
    if messages * rows == 0:
        return [jnp.zeros(shapes[kind], dtype) for kind, dtype in results]
    lt, t = _tile(messages, rows)
    lb = lt if lt > 1 else None  # one message a step: its axis squeezed out of the tile
    specs = {"values": pl.BlockSpec((lb, t, g, b), lambda i, j: (i, j, 0, 0)),
             "payload": pl.BlockSpec((lb, g, pb, t), lambda i, j: (i, 0, 0, j)),
             "scales": pl.BlockSpec((lb, g, t), lambda i, j: (i, 0, j))}
    _lowering_rules()
    return pl.pallas_call(
        functools.partial(body, fmt), grid=(messages // lt, rows // t),
        in_specs=[specs[kind] for kind, _ in operands],
        out_specs=[specs[kind] for kind, _ in results],
        out_shape=[jax.ShapeDtypeStruct(shapes[kind], dtype) for kind, dtype in results],
        compiler_params=pltriton.CompilerParams(num_warps=NUM_WARPS),
        interpret=_interpret(interpret))(*(a.reshape(shapes[kind]) for kind, a in operands))


def _interpret(interpret) -> bool:
    """None: native on a GPU, interpreted elsewhere (no Triton to compile for)."""
    if interpret is None:
        return jax.default_backend() != "gpu"
    return bool(interpret)


def _values(x, name: str, fmt: Format) -> tuple[jax.Array, tuple[int, ...], int]:
    """Values `[..., m]`, checked: (x, its leading axes, its rows)."""
    x = array(x, name, floating=True)
    if x.ndim < 1 or x.shape[-1] % fmt.row:
        raise ValueError(f"{name} must be values [..., m] of whole rows of {fmt.row} ({fmt}), "
                         f"got shape {list(x.shape)}")
    return x, x.shape[:-1], x.shape[-1] // fmt.row


def _message(message, fmt: Format, rows: int, lead=None) -> tuple[Message, tuple[int, ...]]:
    """A message of `rows` rows of `fmt` (leading axes `lead`, or any), checked: (it, its
    leading axes)."""
    g, pb = fmt.blocks_per_row, fmt.payload_bytes_per_block
    uint = jnp.dtype(_SCALE_BITS[fmt.scale_dtype]).name
    axes = "..., " if lead is None else "".join(f"{a}, " for a in lead)
    want = f"uint8 [{axes}{g * pb}, {rows}] and {uint}[{axes}{g}, {rows}] ({fmt})"
    if not isinstance(message, Message) or message.scales is None:
        raise TypeError(f"message must be an equarx_ref.wire.Message, {want}, got "
                        f"{type(message).__name__}" + (" without scales" if isinstance(
                            message, Message) else ""))
    payload, scales = array(message.payload, "message.payload"), array(message.scales,
                                                                         "message.scales")
    here = payload.shape[:-2]
    if payload.dtype != jnp.uint8 or payload.ndim < 2 or \
            payload.shape[-2:] != (g * pb, rows) or scales.dtype != jnp.dtype(uint) or \
            scales.shape != (*here, g, rows) or (lead is not None and here != tuple(lead)):
        raise ValueError(f"message must be {want}, got {payload.dtype}{list(payload.shape)} "
                         f"and {scales.dtype}{list(scales.shape)}")
    return Message(payload, scales), here


def encode(x, fmt: Format, *, interpret=None) -> Message:
    """Values `[..., m]` (m whole rows of `fmt.row`) -> their message, payload uint8
    `[..., G PB, R]` and scale bits `[..., G, R]`: `wire.encode`'s (round to nearest).
    `interpret`: None runs natively on a GPU, interpreted elsewhere."""
    fmt = _format(fmt)
    x, lead, rows = _values(x, "x", fmt)
    g, pb = fmt.blocks_per_row, fmt.payload_bytes_per_block
    payload, scales = _call(_encode_body, fmt, math.prod(lead), rows, [("values", x)],
                            [("payload", jnp.uint8), ("scales", _SCALE_BITS[fmt.scale_dtype])],
                            interpret)
    return Message(payload.reshape(*lead, g * pb, rows), scales.reshape(*lead, g, rows))


def decode(message, fmt: Format, m: int, dtype="float32", *, interpret=None) -> jax.Array:
    """A message of `m` values (payload `[..., G PB, R]`, scales `[..., G, R]`) -> `dtype`
    `[..., m]`: `wire.decode`'s values."""
    fmt, dtype = _format(fmt), value_dtype(dtype)
    count(m, "m", minimum=0)
    if m % fmt.row:
        raise ValueError(f"a message of {fmt} is whole rows of {fmt.row} values: {m} values "
                         f"is not")
    message, lead = _message(message, fmt, m // fmt.row)
    [out] = _call(_decode_body, fmt, math.prod(lead), m // fmt.row,
                  [("payload", message.payload), ("scales", message.scales)],
                  [("values", dtype)], interpret)
    return out.reshape(*lead, m)


def hop(message, local, fmt: Format, *, interpret=None) -> Message:
    """One ring hop, `encode(decode(message) + local)` with the sum in f32 (a subnormal local
    value as a zero of its sign, as the collectives add it): a message of R rows and local
    values `[..., m]` (m = R rows of `fmt.row`, the same leading axes) -> the next message,
    bitwise the XLA codec's."""
    fmt = _format(fmt)
    local, lead, rows = _values(local, "local", fmt)
    message, _ = _message(message, fmt, rows, lead)
    g, pb = fmt.blocks_per_row, fmt.payload_bytes_per_block
    payload, scales = _call(_hop_body, fmt, math.prod(lead), rows,
                            [("payload", message.payload), ("scales", message.scales),
                             ("values", local)],
                            [("payload", jnp.uint8), ("scales", _SCALE_BITS[fmt.scale_dtype])],
                            interpret)
    return Message(payload.reshape(*lead, g * pb, rows), scales.reshape(*lead, g, rows))
