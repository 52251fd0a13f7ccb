"""Predicted quantities: what a collective will send, and how wrong it will be, before it runs.

Both are read off the `Schedule` that `collectives.all_reduce` executes, so they hold for any
schedule, not a hand formula per algorithm.

Bytes. One device sends, for every transfer it makes, the chunks it names, each encoded as whole
blocks of payload plus scales (`Format.nbytes`), after the padding of `schedule.layout`:

    wire_bytes = chunks sent by device 0  x  encoded bytes of one chunk

For the ring that is 2 (p - 1) chunks of n / p values: 2 (p - 1) / p * n * bits / 8 bytes, so
int8 with a bf16 scale per 32 (8.5 bits) sends 16 / 8.5 = 1.88x fewer bytes than bf16.

The default size gate follows from the same count, and from nothing else: quantize a message
only when that sends fewer bytes than sending it as it is (`quantizing_saves_bytes`). A short
message padded to whole blocks of whole chunks can cost more quantized than raw; the rule reads
the message (length, dtype, devices, algorithm), never the chip, so it gates identically on
every backend. (`all_reduce(min_bytes="auto")` asks the chip's time model instead.)

Error: `error.py` (one format on every hop) and `hops.py` (a format per hop), read off the same
schedules; `predicted_relative_error` here picks between them.
"""

from __future__ import annotations

import math

from .._checks import count, value_dtype
from .._checks import min_bytes as check_min_bytes
from ..formats import Format
from ..schedule import (
    SCHEDULES,
    check_algorithm,
    chunk_count,
    chunks_sent,
    device_shape,
    layout,
    make_schedule,
)
from ..wire import encoded_bytes
from .error import uniform_relative_error
from .hops import HOP_BITS, hop_plan, plan_relative_error, step_weights

__all__ = ["predicted_relative_error", "quantizing_saves_bytes", "wire_bytes"]

# A schedule lists every transfer, p^2 of them for a ring, and a TPU v5p slice has thousands
# of chips: the chunks are counted in closed form where the schedule's row has one
# (`schedule.SCHEDULES`), held in the tests against `Schedule.chunks_sent` for every family and
# many p, so the executed schedule stays the one that is counted.


def _chunks_sent(algorithm: str, shape: tuple[int, ...]) -> int:
    """Chunk-sized messages one device sends (every device sends as many)."""
    return chunks_sent(algorithm, shape)


# ---- bytes ---------------------------------------------------------------------------------


def wire_bytes(n: int, p, *, fmt: Format | None, algorithm: str, dtype="bfloat16",
               num_chunks: int = 1, min_bytes: int | None = None,
               hop_bits: str = "uniform") -> int:
    """Bytes one device sends for an AllReduce of `n` values over `p` devices.

    Counted from the schedule `all_reduce` executes: every transfer of a device, encoded chunk
    sizes included (payload plus scales, after padding). `p` may be a pair (2D torus).
    "psum" is modelled as a ring, 2 (p - 1) / p * n values of `dtype` (XLA:CPU widens a bf16
    psum to f32 in practice; on TPU it sends bf16). An empty message sends nothing.
    `min_bytes` is `all_reduce`'s size gate: None (default, as `all_reduce`) counts the message
    quantized only if that sends fewer bytes (`quantizing_saves_bytes`); an int counts a
    message of fewer bytes (`n` values of `dtype`) unquantized, 0 never. ("auto", the chip's
    crossover, needs the chip: pass `cost.default_min_bytes(...)` as an int.) `hop_bits` as in
    `all_reduce`: "adaptive" counts each step in its own format (`hops.hop_plan`). Stochastic
    rounding and rotation do not change the bytes.
    """
    n = count(n, "n (values)", minimum=0)
    dtype = value_dtype(dtype)
    itemsize = dtype.itemsize
    if hop_bits not in HOP_BITS:
        raise ValueError(f"hop_bits must be one of {HOP_BITS}, got {hop_bits!r}")
    min_bytes = check_min_bytes(min_bytes, chipless="wire_bytes")
    shape = device_shape(p)
    check_algorithm(algorithm, fmt, shape, num_chunks)
    if fmt is not None and algorithm in SCHEDULES and (
            n * itemsize < min_bytes if min_bytes is not None else
            not _saves(n, shape, fmt, algorithm, dtype, num_chunks, hop_bits)):
        fmt = None
    return _sent(n, shape, fmt, algorithm, dtype, num_chunks, hop_bits)


def quantizing_saves_bytes(n: int, p, *, fmt: Format, algorithm: str, dtype="bfloat16",
                           num_chunks: int = 1, hop_bits: str = "uniform") -> bool:
    """The default size gate of `all_reduce` (`min_bytes=None`): True when `n` values of
    `dtype` sent quantized in `fmt` cost fewer bytes on the wire than sent as they are.

    It depends on the message only (length, dtype, devices, algorithm, pipeline, hop_bits),
    never on the chip, so the same call quantizes the same messages on every backend. An empty
    message or one device sends nothing either way: False. A format that sends no fewer bytes
    at any size (8.5 bits a value for 8-bit inputs) is not gated: asked for explicitly, it
    still buys f32 partial sums where the raw message would round every hop to its dtype.
    """
    n = count(n, "n (values)", minimum=0)
    value_dtype(dtype)
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be a Format, got {fmt!r}")
    if hop_bits not in HOP_BITS:
        raise ValueError(f"hop_bits must be one of {HOP_BITS}, got {hop_bits!r}")
    shape = device_shape(p)
    check_algorithm(algorithm, fmt, shape, num_chunks)
    return _saves(n, shape, fmt, algorithm, dtype, num_chunks, hop_bits)


def _saves(n, shape, fmt, algorithm, dtype, num_chunks, hop_bits) -> bool:
    quantized = _sent(n, shape, fmt, algorithm, dtype, num_chunks, hop_bits)
    plain = _sent(n, shape, None, algorithm, dtype, num_chunks, "uniform")
    if quantized == plain == 0:
        return False
    if fmt.bits_per_element >= 8 * value_dtype(dtype).itemsize:
        return True  # never fewer bytes at any size: asked for anyway, for its sums' sake
    return quantized < plain


def _sent(n, shape, fmt, algorithm, dtype, num_chunks, hop_bits) -> int:
    """`wire_bytes` of checked arguments, no gate."""
    itemsize = value_dtype(dtype).itemsize
    total = math.prod(shape)
    if algorithm not in SCHEDULES:  # psum: modelled as a ring of the unquantized values
        return 2 * (total - 1) * n * itemsize // total
    if total == 1:
        return 0
    chunks = chunk_count(algorithm, shape)
    if fmt is not None and hop_bits != "uniform":
        plan = hop_plan(shape if len(shape) > 1 else shape[0], fmt=fmt, algorithm=algorithm,
                        hop_bits=hop_bits)
        _, pieces = layout(n, chunks, plan.align, num_chunks)
        steps, (_, gathered) = step_weights(make_schedule(algorithm, shape))
        sends = [(steps[t][1], f) for t, f in plan.reduce] + [(gathered, plan.gather)]
        return sum(k * sum(f.nbytes(m) for _, m in pieces) for k, f in sends if k)
    _, pieces = layout(n, chunks, fmt.row if fmt else 1, num_chunks)
    return _chunks_sent(algorithm, shape) * sum(encoded_bytes(m, fmt, dtype) for _, m in pieces)


def predicted_relative_error(p, *, fmt: Format | None, algorithm: str,
                             hop_bits: str = "uniform") -> float:
    """Expected ||all_reduce - exact|| / ||exact|| for i.i.d. Gaussian inputs (module essay).

    0.0 for `fmt=None`, "psum" and a single device (exact up to the rounding of the
    accumulation dtype, and nothing quantized). `p` may be a pair (2D torus). `hop_bits`:
    "adaptive" weighs each step's format by the partial sums it quantizes (`hops.py`).
    Rounding to nearest; a rotation leaves Gaussian data's error unchanged.
    """
    shape = device_shape(p)
    check_algorithm(algorithm, fmt, shape)
    total = math.prod(shape)
    if fmt is None or algorithm not in SCHEDULES or total == 1:
        return 0.0
    if hop_bits != "uniform":
        plan = hop_plan(p, fmt=fmt, algorithm=algorithm, hop_bits=hop_bits)
        return plan_relative_error(plan, p, algorithm=algorithm)
    return uniform_relative_error(shape, fmt, algorithm)
