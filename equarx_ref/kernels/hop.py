"""The fused hop: decode the bytes that arrived, add the local chunk in f32, encode onwards.

Every reduce step of a quantized ring does, per received message,

    out = encode(decode(wire) + local)          (wire, out: uint8 bytes; sums in f32)

XLA runs this as a few fusions with intermediates in HBM; a kernel can do it in one pass: read
the received bytes and the local values once, keep the f32 sum in vector registers/VMEM, write
the next message once. Per value that is (bits_per_element / 8) bytes in, the local value's
bytes in, and (bits_per_element / 8) bytes out: for int8 and bf16 inputs 1.06 + 2 + 1.06 =
4.1 bytes, so at HBM bandwidth B the hop can run at most at B / 4.1 values per second. That
bound is what `kernels.measure` compares the kernel's GB/s against on a TPU.

The kernel body calls the package's own codec (`wire_codec`: `wire.encode` and `wire.decode` in
their Mosaic form) on the values it loaded, so it is bitwise the XLA path for every format by
construction (tested for int8, int4, fp8 and MX formats in interpret mode). That code is written for
Mosaic, the TPU kernel compiler, which refuses bitcasts between types of different widths, compares
and shifts on narrow integers and `isfinite` on bf16: the scale bytes are packed with 32-bit integer
shifts, bf16 scales are read back as f32, bit streams go word by word through int32. Compiled with
libtpu for v5e and v6e from a CPU machine (`runs/tpu_compile.py`'s `compile_hop`, the compile tier
of tests/run.sh, record in equarx_ref/data/tpu.json), the hop builds for int8, int4, fp8_e4m3,
fp8_e5m2, mxfp8, mxfp6_e2m3 and mxfp4 (for v5p too; not for v4, whose Mosaic refuses to reshape
bytes into the codec's rows: `kernels/ring.py`).
Compiled is not run: no TPU timing of this kernel is claimed here; on a TPU `equarx-ref
kernels` measures it.

`wire_codec(fmt, dtype)` is the message codec the ring kernel uses: a Format's bytes, or with
`fmt=None` the raw bits of the input dtype (a bf16 partial sum rounded to bf16 at each hop),
exactly as the XLA path sends them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._checks import array, count, value_dtype
from ..formats import Format
from ..wire import Codec, decode, encode
from . import backend

__all__ = ["fused_hop", "hop_reference", "wire_codec"]


def wire_codec(fmt: Format | None, dtype) -> Codec:
    """The codec of one message: `.encode(values)`, `.decode(bytes, m)`, `.nbytes(m)`, `.acc`:
    the XLA path's own, so both paths put the same bytes on the wire."""
    if fmt is not None and not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format or None, got {type(fmt).__name__}")
    return Codec(fmt, value_dtype(dtype), mosaic=True)


def hop_reference(wire: jax.Array, local: jax.Array, fmt: Format) -> jax.Array:
    """The XLA hop the kernel must match bitwise: `encode(decode(wire) + local)`."""
    wire, local, _, _ = _check_hop(wire, local, fmt)
    return encode(decode(wire, fmt, local.shape[-1]) + local.astype(jnp.float32), fmt)


def _hop_kernel(codec: Codec, m: int, wire_ref, local_ref, out_ref):
    # one pass: bytes and local values in, the f32 sum stays on chip, the next message out
    out_ref[...] = codec.encode(codec.decode(wire_ref[...], m) + local_ref[...].astype(codec.acc))


def _check_hop(wire, local, fmt) -> tuple[jax.Array, jax.Array, int, int]:
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format, got {type(fmt).__name__}")
    wire, local = array(wire, "wire"), array(local, "local", floating=True)
    if local.ndim != 2 or wire.ndim != 2 or wire.shape[0] != local.shape[0]:
        raise ValueError(f"fused_hop takes wire [rows, bytes] and local [rows, m], got "
                         f"{list(wire.shape)} and {list(local.shape)}")
    rows, m = local.shape
    if m % fmt.block_size:
        raise ValueError(f"local rows hold {m} values, not a multiple of block_size "
                         f"{fmt.block_size}")
    if wire.dtype != jnp.uint8 or wire.shape[1] != fmt.nbytes(m):
        raise ValueError(f"wire must be uint8 [rows, {fmt.nbytes(m)}] ({m} values of {fmt}), "
                         f"got {wire.dtype}{list(wire.shape)}")
    return wire, local, rows, m


def fused_hop(wire: jax.Array, local: jax.Array, fmt: Format, *, block_rows: int | None = None,
              interpret=None) -> jax.Array:
    """One ring hop as a Pallas kernel: `encode(decode(wire) + local)` in one pass over memory.

    Args:
        wire: uint8 `[rows, fmt.nbytes(m)]`, one received message per row.
        local: float `[rows, m]`, this device's values of the same chunks (m whole blocks).
        fmt: the wire format.
        block_rows: rows per grid step (a VMEM tile); None: 8 if it divides rows, else all.
        interpret: as `ring_all_reduce`: None is native on a TPU, interpret mode elsewhere.

    Returns:
        uint8 `[rows, fmt.nbytes(m)]`: the next messages, bitwise `hop_reference`'s.
    """
    wire, local, rows, m = _check_hop(wire, local, fmt)
    if block_rows is None:
        block_rows = 8 if rows % 8 == 0 else rows
    count(block_rows, "block_rows")
    if rows % block_rows:
        raise ValueError(f"block_rows={block_rows} does not divide rows={rows}")
    interpret = backend.interpret_params(interpret)
    nbytes = wire.shape[1]
    return pl.pallas_call(
        functools.partial(_hop_kernel, wire_codec(fmt, local.dtype), m),
        out_shape=jax.ShapeDtypeStruct(wire.shape, jnp.uint8),
        grid=(rows // block_rows,),
        in_specs=[pl.BlockSpec((block_rows, nbytes), lambda i: (i, 0)),
                  pl.BlockSpec((block_rows, m), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((block_rows, nbytes), lambda i: (i, 0)),
        interpret=interpret,
    )(wire, local)
