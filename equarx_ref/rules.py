"""The argument rules of `all_reduce` and `AllReduce`: one rule set, refused where it enters.

`all_reduce` checks its arguments while it is traced, `AllReduce` the same ones when it is
built, before it knows the mesh (one axis then stands in for it, and the rules that need the
mesh's shape wait for the call), both through `check_config`. Each bad argument is refused by
name in one line (ValueError or TypeError), whatever the others are: `min_bytes` is checked
even where fmt=None or "psum" ignores it, so a typo never waits for the configuration that
would read it.

In the order they are checked: the algorithm with its format and pipeline depth
(`schedule.check_algorithm`); the size gate `min_bytes` (None, "auto" or a count >= 0:
`_checks.min_bytes`, which `wire_bytes` shares, so both word a refusal alike); the remedies
(`key`, `rotate`, `hop_bits`), which act on quantization, so they need a quantized fmt, and a
rotation a power-of-two block; the implementation (`IMPLS`: "pallas" runs the ring family
over one mesh axis, round to nearest, no remedies; "mosaic" any schedule, round to nearest,
uniform hops, the formats its kernels code: the codec's `supports`, looked up as an
extension point, `extensions.py`); the pytree arguments (`autodiff.check_tree_args`). The
axis name must name one axis of the enclosing `shard_map` (or `vmap`, `pmap`), or a pair of
distinct ones; a key must be one typed key or one raw uint32 key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._checks import flag
from ._checks import min_bytes as check_min_bytes
from .autodiff import check_tree_args
from .extensions import provided
from .formats import Format
from .schedule import RING_FAMILY, SCHEDULES, check_algorithm, in_ring_family

__all__ = ["HOP_BITS", "IMPLS", "check_axes", "check_config", "check_hop_bits", "check_key"]

#: How `all_reduce` executes a schedule: shard_map collectives with the XLA codec ("xla") or
#: with the Mosaic codec's kernels ("mosaic"), or one Pallas TPU kernel ("pallas").
IMPLS = ("xla", "mosaic", "pallas")
#: Values of `all_reduce(..., hop_bits=)`: one format everywhere, or a hop-aware plan
#: (`models/hops.py`).
HOP_BITS = ("uniform", "adaptive")


def check_axes(axis_name) -> tuple[str, ...]:
    """The axis, or the pair of axes in mesh order (ppermute numbers devices in mesh order)."""
    axes = (axis_name,) if isinstance(axis_name, str) else \
        tuple(axis_name) if isinstance(axis_name, (tuple, list)) else ()
    if not axes or len(axes) > 2 or not all(isinstance(a, str) and a for a in axes) or \
            len(set(axes)) != len(axes):
        raise ValueError(f"axis_name must be a mesh axis name or a pair of distinct ones, "
                         f"got {axis_name!r}")
    names = tuple(jax.sharding.get_abstract_mesh().axis_names)
    for a in axes:
        try:
            lax.axis_size(a)
        except (NameError, KeyError, ValueError):
            raise ValueError(f"unknown mesh axis {a!r} (axis_name); all_reduce runs inside "
                             f"jax.shard_map over one of the mesh axes {names}") from None
    return tuple(sorted(axes, key=names.index)) if set(axes) <= set(names) else axes


def check_key(key) -> None:
    """A PRNG key: a typed key (`jax.random.key`) or a raw uint32[2] (`jax.random.PRNGKey`)."""
    dtype = getattr(key, "dtype", None)
    typed = dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)
    raw = dtype == jnp.uint32 and getattr(key, "shape", None) in ((2,), (4,))  # threefry, rbg
    if not (typed and key.shape == ()) and not raw:
        raise TypeError(f"key must be one jax.random.key (or PRNGKey) for stochastic rounding, "
                        f"or None, got {key!r}")


def check_config(fmt, algorithm: str, num_chunks: int, min_bytes, stochastic: bool,
                 rotate: bool, hop_bits: str, impl: str, backward: str, bucket_bytes, dtype,
                 shape=(1,), axes=("",)):
    """The one rule set of `all_reduce` and `AllReduce` (which checks when built, before it
    knows the mesh: `shape` and `axes` then stand for one axis). Each bad argument is refused
    by name, whatever the others are (`min_bytes` even when fmt=None or "psum" ignores it).
    Returns the buffer dtype (None: the leaves')."""
    check_algorithm(algorithm, fmt, shape, num_chunks)
    check_min_bytes(min_bytes)
    _check_remedies(fmt, stochastic, rotate, hop_bits)
    _check_impl(impl, algorithm, axes, fmt, stochastic=stochastic, hop_bits=hop_bits,
                remedies=stochastic or rotate or hop_bits != "uniform")
    return check_tree_args(backward, bucket_bytes, dtype)


def check_hop_bits(hop_bits: str, fmt: Format | None) -> None:
    """Refuse an unknown `hop_bits`, or "adaptive" with a format it cannot plan for."""
    if hop_bits not in HOP_BITS:
        raise ValueError(f"hop_bits must be one of {HOP_BITS}, got {hop_bits!r}")
    if hop_bits == "adaptive" and (fmt is None or not fmt.is_int or fmt.is_mx):
        raise ValueError(f"hop_bits='adaptive' plans integer widths with a bf16 or f32 block "
                         f"scale: fmt must be such an integer format (int8, int4, ...), got "
                         f"{fmt if fmt is None else str(fmt)!r}")


def _check_remedies(fmt: Format | None, stochastic: bool, rotate, hop_bits) -> None:
    """Refuse a remedy that has nothing to act on, or a bad value, naming the argument."""
    flag(rotate, "rotate")
    if hop_bits not in HOP_BITS:
        raise ValueError(f"hop_bits must be one of {HOP_BITS}, got {hop_bits!r}")
    if fmt is None and (stochastic or rotate or hop_bits != "uniform"):
        what = "key (stochastic rounding)" if stochastic else \
            "rotate=True" if rotate else f"hop_bits={hop_bits!r}"
        raise ValueError(f"{what} acts on quantization: it needs a quantized fmt, got fmt=None")
    check_hop_bits(hop_bits, fmt)
    if rotate and fmt.block_size & (fmt.block_size - 1):
        raise ValueError(f"rotate=True rotates each block with a Hadamard transform: the block "
                         f"size must be a power of two, got {fmt.block_size}")


def _check_impl(impl, algorithm: str, axes, fmt=None, *, stochastic: bool = False,
                hop_bits: str = "uniform", remedies: bool = False) -> None:
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {IMPLS}")
    if impl == "mosaic":
        _check_mosaic(fmt, algorithm, stochastic, hop_bits)
    if impl == "pallas" and (not in_ring_family(algorithm) or len(axes) > 1):
        what = "a 2D torus" if len(axes) > 1 else f"algorithm {algorithm!r}"
        runs = " and ".join(map(repr, RING_FAMILY))
        raise ValueError(f"impl='pallas' runs {runs} over one mesh axis, not {what}; "
                         "use impl='xla'")
    if impl == "pallas" and remedies:
        raise ValueError("impl='pallas' runs round-to-nearest on one format per hop: key=, "
                         "rotate=True and hop_bits='adaptive' need impl='xla'")


def _check_mosaic(fmt, algorithm: str, stochastic: bool, hop_bits: str) -> None:
    """impl='mosaic': the XLA path's schedule, each message coded by the Mosaic codec's kernels
    (the extension point "mosaic_codec"): round to nearest, one format, one the kernels code."""
    if stochastic or hop_bits != "uniform":
        what = "stochastic rounding (key=)" if stochastic else f"hop_bits={hop_bits!r}"
        raise ValueError(f"impl='mosaic' rounds to nearest in one format: {what} needs "
                         "impl='xla'")
    if fmt is not None and algorithm in SCHEDULES and \
            not provided("mosaic_codec").supports(fmt):  # Pallas loads only when asked for
        raise ValueError(f"impl='mosaic' codes 8-bit and 4-bit elements in blocks that divide "
                         f"128, not {fmt}; use impl='xla'")
