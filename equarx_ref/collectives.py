"""Quantized AllReduce: the schedules of schedule.py, executed with shard_map collectives.

`all_reduce(x, axis_name, ...)` goes inside `jax.shard_map` exactly where `lax.psum(x, axis_name)`
would, and returns a result that is identical on every device and typed as such (usable with
`out_specs=P()` under `check_vma=True`). It runs a `Schedule` (schedule.py: who sends which
chunk to whom, step by step) with `lax.ppermute`, `lax.all_to_all` and `lax.all_gather`
(execute.py), each message one uint8 buffer of payload and scales (`wire.Codec`), each hop's
partial sum re-quantized; with `num_chunks=k` in k independent pieces that a compiler may
overlap (a software pipeline), bitwise the same result and the same bytes. `fmt=None` runs the
same schedule unquantized, in x's own dtype.

The ring it runs, written by hand (chapter 03's exercise; `x` a vector of p chunks of m values,
m a multiple of the block, `wire.encode` / `wire.decode` the codec):

    p, me = lax.axis_size(axis), lax.axis_index(axis)
    chunks = x.reshape(p, -1)                                 # [p, m] in f32
    m = chunks.shape[1]
    right = [(d, (d + 1) % p) for d in range(p)]
    for s in range(p - 1):                                    # reduce-scatter: p - 1 hops
        buf = wire.encode(chunks[(me - s - 1) % p], fmt)      # my partial sum, as bytes
        buf = lax.ppermute(buf, axis, right)                  # my left neighbour's arrive
        chunks = chunks.at[(me - s - 2) % p].add(wire.decode(buf, fmt, m))  # add in f32
    every = lax.all_gather(wire.encode(chunks[me], fmt), axis, to="invarying")  # [p, bytes]
    return wire.decode(every, fmt, m).reshape(-1)             # the same bytes on every device

is bitwise `all_reduce(x, axis, fmt=fmt, algorithm="ring")` (chapter 03 checks it). The rest is
what a library adds to it: any length (padding to whole chunks of whole blocks), every algorithm
as data (`schedule.py`), pipelining, the remedies, derivatives, pytrees and checked arguments.

Over one device nothing is sent, so nothing is quantized: `all_reduce` returns `x` unchanged;
an empty `x` comes back empty. What each configuration sends and how much error it makes are
predicted, from the same schedules, in `predict.py`.

`impl="mosaic"` runs the same schedule and collectives with the Mosaic codec's Pallas kernels
coding every message (`kernels/codec.py`): a hop's decode, add and encode are one pass over
HBM, its f32 sum never written out (execute.py keeps it pending). `impl="pallas"` runs "ring"
and "bidir_ring" as one Pallas TPU kernel instead (remote DMAs, semaphores, an in-kernel
pipeline: `kernels/ring.py`), natively on a TPU and in TPU interpret mode elsewhere. Both give
bitwise `impl="xla"`'s result, and send the same bytes.

Remedies for the error of re-quantized partial sums (compared in `equarx-ref sweep`):

- `key=`: stochastic rounding on every quantization. Each hop's key is `fold_in` of the hop
  (the schedule's step time), the pipeline piece and the device (`axis_index`), so every
  rounding is independent and unbiased: the expected result is the exact sum. The error is
  within one step per quantization (round-to-nearest: half a step), about sqrt(2) times the
  RMS error of rounding to nearest; what it buys is the absence of bias. The gather phase still
  decodes the same bytes everywhere, so the result stays bitwise identical on every device.
  One thing is not pinned down, stated here rather than hidden: the rounding decision
  floor(x / s + u) is taken on x times the multiplier fl(1 / s) as the device computes it.
  Round-to-nearest settles every close call exactly, so its bytes are the same on any backend;
  with `key=` an element whose x / s + u lands within a rounding of an integer (a chance of
  about 2^-22 per element) may round the other way on a backend whose division is not
  correctly rounded (XLA:CPU's is). Still unbiased, still within one step; bitwise agreement
  across backends is promised for round-to-nearest only.
- `rotate=True`: a randomized Hadamard rotation of every block before the first hop and its
  inverse after the last (`rotation.py`): the same bytes, outliers spread over their block.
- `hop_bits="adaptive"`: a different integer width (and block) per hop, more bits where the
  partial sums are larger, no more bits per element than `fmt` (`hops.py`).

Derivative, pytrees, vmap (`autodiff.py`). Rounding has a zero derivative almost everywhere, so
`all_reduce` defines its own: psum's (straight-through), the cotangent optionally sent through
the same quantized collective (`backward="quantized"`). `x` may be a pytree (gradients): its
leaves are flattened into one buffer of `dtype` (or buckets of `bucket_bytes`), one collective
each. A leaf already invariant over the axis (gradients `jax.grad` already summed) warns. Under
`vmap(axis_name=...)` and `pmap` the same code runs (gathers typed invariant only over mesh axes).

`AllReduce(fmt=..., algorithm=..., num_chunks=...)` packages one configuration as a frozen,
hashable callable `(x, axis_name) -> sum`: pass it where a function expects a collective (the
Gemma model's `all_reduce=`), and equal configurations share one compiled program. A jax key is
not hashable, so the object holds an integer `stochastic_seed` and makes the key from it at
each call (the same rounding every call, hence the same result: a deterministic collective);
`AllReduce(...)(x, axis, key=k)` takes a fresh key per call instead, e.g.
`jax.random.fold_in(k, layer)`.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

from ._checks import count
from .autodiff import reduce_tree
from .devices import mesh_device_kind
from .execute import run_schedule, typed_all_gather
from .extensions import provided
from .formats import Format
from .rules import HOP_BITS, IMPLS, check_axes, check_config, check_key
from .schedule import ALGORITHMS, SCHEDULES
from .wire import Codec

__all__ = ["ALGORITHMS", "HOP_BITS", "IMPLS", "AllReduce", "all_reduce", "invariant"]

def _mesh_axes(axes) -> tuple[str, ...]:
    """Those of `axes` that are mesh axes (shard_map's), not `vmap`'s or `pmap`'s."""
    names = set(jax.sharding.get_abstract_mesh().axis_names)
    return tuple(a for a in axes if a in names)


def invariant(x: jax.Array, axes) -> jax.Array:
    """x itself, typed as identical on every device (a gather over one device is free)."""
    if x.size == 0:
        return jnp.zeros(x.shape, x.dtype)  # a constant: the same everywhere
    flat, mesh_axes = x.reshape(-1), _mesh_axes(axes)
    for a in axes:
        flat = typed_all_gather(flat, a, mesh_axes, axis=0, tiled=True)
    return flat.reshape(x.shape)


def all_reduce(x, axis_name, *, fmt: Format | None = Format.int8(),  # noqa: B008
               algorithm: str = "ring", num_chunks: int = 1, min_bytes: int | str | None = None,
               key: jax.Array | None = None, rotate: bool = False,
               hop_bits: str = "uniform", impl: str = "xla", backward: str = "psum",
               bucket_bytes: int | None = None, dtype=None):
    """Sum `x` over the devices of `axis_name`, sending quantized data. Use inside `shard_map`
    (or `vmap(axis_name=...)` / `pmap`), exactly where `lax.psum(x, axis_name)` would go.

    Args:
        x: this device's float array (any shape), a Python float, or a pytree of them (e.g.
            gradients: the leaves go as one buffer, or buckets, see `bucket_bytes`); every
            device passes the same shapes.
        axis_name: a mesh axis, or a pair of axes (2D torus; "ring" and "bidir_ring" only).
        fmt: the wire format (default int8, block 32, bf16 scale); None sends the buffer's
            dtype as is.
        algorithm: "ring", "bidir_ring", "two_shot", "one_shot", or "psum" (lax.psum, fmt=None).
        num_chunks: pipeline depth for the ring family; the result does not depend on it.
        min_bytes: the size gate, which sends some messages unquantized, as XLA's quantized
            AllReduce and vLLM's QuickReduce do below their thresholds. None (default): quantize
            only when that sends fewer bytes than the unquantized message would (short
            messages padded to whole blocks can cost more; `predict.quantizing_saves_bytes`):
            a rule of the message alone, so the same call gives the same bits on every backend.
            A format that never sends fewer bytes (8-bit inputs) is not gated.
            An int: a message of fewer bytes (the buffer's nbytes) goes unquantized; 0: never
            gate. "auto": the chip's time-model crossover (`cost.default_min_bytes`) for the
            devices of the mesh (those the collective runs on, not the default backend's), 0
            on CPU devices; it reads the chip, so its bits depend on where it runs.
        key: a PRNG key: stochastic rounding on every quantization, independent per hop,
            pipeline piece and device (`fold_in`), and per bucket; unbiased. None: round to
            nearest, even.
        rotate: rotate every block by a shared randomized Hadamard transform before the first
            hop and back after the last (`rotation.py`); needs a power-of-two block size.
        hop_bits: "uniform" (fmt on every hop) or "adaptive": per-hop integer widths and
            blocks, more bits on the larger partial sums, no more bits per element than fmt
            (`hops.py`; fmt an integer format, at most `hops.MAX_DEVICES` devices).
        impl: "xla" (shard_map collectives), "mosaic" (the same collectives, every message
            coded by the Mosaic codec's kernels and each hop one fused kernel pass,
            `kernels/codec.py`; round to nearest, uniform hops, `codec.FORMATS`; off a TPU the
            kernels' body runs as XLA ops) or "pallas" (one Pallas TPU kernel with remote
            DMAs; "ring" and "bidir_ring" over one axis; interpret mode off a TPU). All give
            bitwise the same result, and send the same bytes.
        backward: the derivative is psum's (straight-through: the tangent is `lax.psum` of
            the tangent, exact). "psum" (default): the cotangent is psum's transpose, exact;
            "quantized": the cotangent goes through this same collective (reverse mode only;
            it changes something only where psum's transpose communicates, i.e. under
            `check_vma=False`). Derivatives of every order are psum's (`jax.hessian`,
            jvp of grad); `jax.linear_transpose` transposes fmt=None as psum and refuses a
            quantized fmt, or leaves cast to another `dtype` to be sent (not linear). See
            `autodiff.py`.
        bucket_bytes: a pytree's leaves are cut into buckets of at most this many bytes (of
            `dtype`) at leaf boundaries, one collective each, like PyTorch DDP's
            `bucket_cap_mb`; a larger leaf goes alone. None (default): one buffer.
        dtype: the dtype of the buffer sent and summed (default: the leaves' common dtype);
            with fmt=None it is what travels, e.g. dtype="bfloat16" (or "bf16") for a bf16
            ring of f32 gradients. Each leaf comes back in its own dtype. Accumulation is in f32.

    Returns:
        The sum, with the structure, shapes and dtypes of `x`: bitwise identical on every
            device and typed invariant over `axis_name`, so `out_specs=P()` works under
            `check_vma=True`.

    Raises:
        TypeError: a leaf that is not floating point, leaves without a common dtype and no
            `dtype=`, `fmt` not a Format, `key` not a PRNG key, `rotate` not a bool, a count
            not an integer; `jax.linear_transpose` of a quantized fmt or of leaves cast to
            another `dtype`; forward mode (jvp, jacfwd, linearize) of
            backward="quantized" where it communicates (a custom_vjp has no jvp).
        ValueError: unknown algorithm, axis, impl or backward, `fmt` given with "psum", bad
            `num_chunks`, `min_bytes` or `bucket_bytes` (checked even where unused), a remedy
            (`key`, `rotate`, `hop_bits`) without a quantized fmt, impl="pallas" with an
            algorithm, torus or remedy it does not run, impl="mosaic" with a key, adaptive
            hops or a format its kernels do not code. `AllReduce` applies the same rules
            (`rules.py`) when built.

    Warns:
        InvariantInputWarning: under `check_vma=True`, a leaf typed invariant over the axis
            (already the same on every device, e.g. gradients `jax.grad` already summed):
            summing it multiplies it by p. The message names the fix.
    """
    if key is not None:
        check_key(key)
    axes = check_axes(axis_name)
    shape = tuple(lax.axis_size(a) for a in axes)
    dtype = check_config(fmt, algorithm, num_chunks, min_bytes, key is not None, rotate,
                          hop_bits, impl, backward, bucket_bytes, dtype, shape, axes)

    def reduce(flat: jax.Array, bucket: int | None, key) -> jax.Array:
        k = key if key is None or bucket is None else jax.random.fold_in(key, bucket)
        return _reduce(flat, axes, shape, fmt, algorithm, num_chunks, min_bytes, k, rotate,
                       hop_bits, impl)

    return reduce_tree(x, axes, reduce, backward=backward, bucket_bytes=bucket_bytes,
                       dtype=dtype, key=key, linear=fmt is None or algorithm not in SCHEDULES)


def _reduce(x, axes, shape, fmt, algorithm, num_chunks, min_bytes, key, rotate, hop_bits, impl):
    """The forward of one buffer: the quantized AllReduce itself (not differentiable)."""
    if algorithm not in SCHEDULES:  # "psum": lax.psum itself
        return lax.psum(x, axes if len(axes) > 1 else axes[0])
    if x.size == 0 or math.prod(shape) == 1:  # nothing to send, so nothing to quantize
        return invariant(x, axes)
    if fmt is not None and not _quantize(x, shape, fmt, algorithm, num_chunks, min_bytes,
                                         hop_bits):
        fmt = None
    if fmt is None:  # unquantized (fmt=None or under the gate): nothing to remedy
        key, rotate, hop_bits = None, False, "uniform"
    # what the arguments ask of the layers above the core: extension points (extensions.py),
    # each loaded only when asked for (Pallas only for a kernel impl)
    plan = None if hop_bits == "uniform" else provided("hop_plan")(
        shape if len(shape) > 1 else shape[0], fmt=fmt, algorithm=algorithm, hop_bits=hop_bits)
    if impl == "pallas":
        return provided("pallas_ring")(x, axes[0], fmt=fmt, algorithm=algorithm,
                                       num_chunks=num_chunks)
    rotation = (provided("rotate"), provided("unrotate")) if rotate else None
    codec = provided("mosaic_codec") if impl == "mosaic" else Codec
    return run_schedule(x, key, axes, shape, fmt, algorithm, num_chunks, rotation, plan,
                        _mesh_axes(axes), codec)


def _quantize(x, shape, fmt, algorithm, num_chunks, min_bytes, hop_bits) -> bool:
    """The size gate (`all_reduce`'s `min_bytes`): does this message go quantized?"""
    if min_bytes is None:  # the default: the message alone decides, never the chip
        return provided("size_gate")(x.size, shape if len(shape) > 1 else shape[0], fmt=fmt,
                                     algorithm=algorithm, dtype=x.dtype, num_chunks=num_chunks,
                                     hop_bits=hop_bits)
    if min_bytes == "auto":  # opt-in: the time model of the chip the mesh runs on
        min_bytes = provided("chip_gate")(shape, fmt=fmt, algorithm=algorithm,
                                          device_kind=mesh_device_kind())
    return x.nbytes >= min_bytes


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class AllReduce:
    """One `all_reduce` configuration as a value: `AllReduce(fmt=..., algorithm=...)(x, axis)`.

    Frozen and hashable, and a pytree with no leaves (`jax.tree_util.register_static`): passed
    to `jax.jit` as a static argument or as an ordinary one (the Gemma model's `all_reduce=`),
    it is a compile-time constant, never a traced array (its field `dtype` would otherwise
    make jax take it for one), and equal configurations compile once. Checked when built, like
    `all_reduce`.

    The remedies: `stochastic_seed` (an int: stochastic rounding with
    `jax.random.key(stochastic_seed)`, the same key every call; or pass `key=` when calling,
    which takes precedence), `rotate` and `hop_bits`; the derivative (`backward`) and the
    pytree keywords (`bucket_bytes`, `dtype`, stored as the dtype's name): as in `all_reduce`.
    """

    fmt: Format | None = Format.int8()  # noqa: RUF009 (a frozen, hashable default)
    algorithm: str = "ring"
    num_chunks: int = 1
    min_bytes: int | str | None = None
    stochastic_seed: int | None = None
    rotate: bool = False
    hop_bits: str = "uniform"
    impl: str = "xla"
    backward: str = "psum"
    bucket_bytes: int | None = None
    dtype: str | None = None

    def __post_init__(self):
        if self.stochastic_seed is not None:
            count(self.stochastic_seed, "stochastic_seed", minimum=0, maximum=2**63 - 1)
        dtype = check_config(self.fmt, self.algorithm, self.num_chunks, self.min_bytes,
                              self.stochastic_seed is not None, self.rotate, self.hop_bits,
                              self.impl, self.backward, self.bucket_bytes, self.dtype)
        object.__setattr__(self, "dtype", None if dtype is None else dtype.name)  # hashable

    def __call__(self, x, axis_name, *, key: jax.Array | None = None):
        if key is None and self.stochastic_seed is not None:
            key = jax.random.key(self.stochastic_seed)
        return all_reduce(x, axis_name, fmt=self.fmt, algorithm=self.algorithm,
                          num_chunks=self.num_chunks, min_bytes=self.min_bytes, key=key,
                          rotate=self.rotate, hop_bits=self.hop_bits, impl=self.impl,
                          backward=self.backward, bucket_bytes=self.bucket_bytes,
                          dtype=self.dtype)

    @property
    def remedies(self) -> str:
        """The remedies on, as `str` lists them ("" for none): "sr", "rotate", "adaptive"."""
        return " ".join(name for name, on in (("sr", self.stochastic_seed is not None),
                                              ("rotate", self.rotate),
                                              ("adaptive", self.hop_bits == "adaptive")) if on)

    def __str__(self) -> str:
        from .formats import format_label

        pipe = f" x{self.num_chunks}" if self.num_chunks > 1 else ""
        extra = f" +{self.remedies.replace(' ', ' +')}" if self.remedies else ""
        kernel = f" ({self.impl})" if self.impl != "xla" else ""
        tree = "".join(part for part, on in (
            (f" as {self.dtype}", self.dtype is not None),
            (f" buckets of {self.bucket_bytes} B", self.bucket_bytes is not None),
            (" +quantized backward", self.backward == "quantized")) if on)
        return f"{self.algorithm} {format_label(self.fmt)}{pipe}{extra}{kernel}{tree}"
