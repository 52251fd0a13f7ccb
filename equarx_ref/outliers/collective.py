"""The static int4 collective: the paper's one-shot, and the ring for comparison.

One-shot (Dong et al.'s): every device encodes its whole partial sum on its own grid
(`wire.py`), one all-gather brings every device every payload, and every device decodes them
with the senders' grids and adds them in f32 in rank order: one quantization per value, the
same bytes and the same additions everywhere, so the result is bitwise identical on every
device. Bytes per device: `(p - 1) T row_bytes`.

Ring: the same payload through `ring_schedule(p)`. Each hop decodes, adds its own chunk and
re-encodes the partial sum of one more device, on the grid calibrated for *that* run of devices
(the calibration's `[length - 1, start]` ranges); the owners encode the full sums once more for
the all-gather. Ring chunks are whole tokens. Bytes: `2 (p - 1) ceil(T / p) row_bytes`, at the
price of p - 1 re-quantizations where the one-shot has one.

Where the scales come from is the design question: they differ per site, and the model runs its
layers under `lax.scan`, so the collective is traced once for all 18 layers and cannot count its
calls. The model therefore tells it the site: `gemma.forward` calls a collective whose
`takes_site` is true as `ar(x, axis_name, site=2 * layer + kind)` with a traced int32, and
`StaticAllReduce` keeps every site's tables as constants and indexes them by it. It is a frozen
dataclass that hashes by a digest of its tables, so `forward(all_reduce=...)` compiles once per
calibration, like `eq.AllReduce` (and, like it, a pytree with no leaves: a static value to jit).

Its derivative is psum's (straight-through, `autodiff.straight_through`), as `all_reduce`'s:
differentiating through the static grids' rounding would give a silent zero gradient.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._checks import array, count
from ..autodiff import straight_through
from ..collectives import invariant
from ..schedule import ring_schedule
from .wire import StaticFormat, Tables, check_algorithm

__all__ = ["StaticAllReduce", "static_all_reduce"]


def _one_shot(rows, tab: Tables, axis, me, p):
    """Every device's payload to everyone; decode with the senders' grids; sum in rank order."""
    wire = lax.all_gather(tab.encode(rows, (0, me)), axis, axis=0, to="invarying")  # [p, T, R]
    parts = tab.decode(wire, (0, jnp.arange(p)[:, None]))                          # [p, T, E]
    total = parts[0]
    for r in range(1, p):
        total = total + parts[r]
    return total


def _ring(rows, tab: Tables, axis, me, p):
    """The ring's reduce-scatter, each hop on the grid of the devices its partial sum holds,
    then an all-gather of the owners' chunks. Walks `ring_schedule(p)`."""
    sched = ring_schedule(p)
    t = rows.shape[0]
    tc = -(-t // p)
    chunks = jnp.pad(rows, ((0, p * tc - t), (0, 0))).reshape(p, tc, -1)   # [p, Tc, E]
    held = [[frozenset({d}) for _ in range(p)] for d in range(p)]          # inputs in each chunk
    cur, cur_chunk = None, None

    def group_of(devs):            # a run of consecutive devices -> (length - 1, start)
        start = next(d for d in devs if (d - 1) % p not in devs) if len(devs) < p else 0
        return len(devs) - 1, start

    table = lambda vals: jnp.asarray(vals, jnp.int32)[me]  # noqa: E731  (this device's entry)
    for step in (s for s in sched.steps if s.phase == "reduce"):
        by_src = {tr.src: tr.chunks[0] for tr in step.transfers}
        by_dst = {tr.dst: (tr.src, tr.chunks[0]) for tr in step.transfers}
        if cur_chunk is not None and any(by_src[d] != cur_chunk[d] for d in range(p)):
            raise ValueError("ring_schedule changed: a device no longer forwards what it got")
        send = [group_of(held[d][by_src[d]]) for d in range(p)]
        recv = [send[by_dst[d][0]] for d in range(p)]
        own = chunks[table([by_src[d] for d in range(p)])] if cur is None else cur
        wire = tab.encode(own, (table([g[0] for g in send]), table([g[1] for g in send])))
        wire = lax.ppermute(wire, axis, [(tr.src, tr.dst) for tr in step.transfers])
        got = tab.decode(wire, (table([g[0] for g in recv]), table([g[1] for g in recv])))
        cur_chunk = [by_dst[d][1] for d in range(p)]
        cur = got + chunks[table(cur_chunk)]
        for d in range(p):
            src, c = by_dst[d]
            held[d][c] = held[d][c] | held[src][c]
    if any(held[d][cur_chunk[d]] != frozenset(range(p)) for d in range(p)):
        raise ValueError("ring_schedule changed: the reduce phase does not end in full sums")
    full = (p - 1, 0)
    wire = lax.all_gather(tab.encode(cur, full), axis, axis=0, to="invarying")    # [p, Tc, R]
    sums = tab.decode(wire, full)                                                  # [p, Tc, E]
    order = np.argsort(np.asarray(cur_chunk))     # row d of the gather is device d's chunk
    return sums[order].reshape(p * tc, -1)[:t]


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _run(x, site, axis, fmt, algorithm):
    """Jitted on its own (like `collectives._run`): eager shard_map runs compile once."""
    p = lax.axis_size(axis)
    tab = Tables(fmt, site)
    rows = x.reshape(-1, fmt.features).astype(jnp.float32)               # [T, E]
    me = lax.axis_index(axis)
    out = (_one_shot if algorithm == "one_shot" else _ring)(rows, tab, axis, me, p)
    return out.reshape(x.shape).astype(x.dtype)


def static_all_reduce(x: jax.Array, axis_name: str, fmt: StaticFormat, *, site=None,
                      algorithm: str = "one_shot") -> jax.Array:
    """Sum `x` over `axis_name` sending static int4 codes and bf16 outliers. Use in shard_map.

    Args:
        x: this device's partial sum, float, `[..., E]` (E the format's features).
        axis_name: the mesh axis, of the calibrated size.
        fmt: a `StaticFormat`.
        site: which AllReduce site's tables to use: an int, or a traced int32 scalar (as
            `gemma.forward` passes it; out-of-range traced values are clamped). None: only
            for a format of one site.
        algorithm: "one_shot" (the paper's) or "ring".

    Returns:
        The sum, shape and dtype of `x`, bitwise identical on every device (typed invariant).
    """
    if not isinstance(fmt, StaticFormat):
        raise TypeError(f"fmt must be a StaticFormat, got {type(fmt).__name__}")
    check_algorithm(algorithm)
    if not isinstance(axis_name, str) or not axis_name:
        raise ValueError(f"axis_name must name one mesh axis (static int4 runs over one), got "
                         f"{axis_name!r}")
    x = array(x, "x", floating=True)
    try:
        p = lax.axis_size(axis_name)
    except NameError:
        raise ValueError(f"axis_name {axis_name!r} is not a mesh axis here (call "
                         "static_all_reduce inside shard_map over it)") from None
    if p != fmt.devices:
        raise ValueError(f"this static format was calibrated on {fmt.devices} devices; axis "
                         f"{axis_name!r} has {p}")
    if x.ndim == 0 or x.shape[-1] != fmt.features:
        raise ValueError(f"static int4 reduces [..., {fmt.features}] features, got shape "
                         f"{tuple(x.shape)}")
    if site is None:
        if fmt.sites != 1:
            raise ValueError(f"this format holds {fmt.sites} AllReduce sites: say which (site=)")
        site = 0
    if isinstance(site, (int, np.integer)) and not isinstance(site, bool):
        count(site, "site", minimum=0, maximum=fmt.sites - 1)
    elif not (isinstance(site, jax.Array) and site.shape == ()
              and jnp.issubdtype(site.dtype, jnp.integer)):
        raise TypeError(f"site must be an int or an integer scalar array, got {site!r}")
    if x.size == 0 or p == 1:        # nothing to send, so nothing to quantize
        return invariant(x, (axis_name,))
    run = straight_through(lambda v, s: _run(v, s, axis_name, fmt, algorithm), axis_name,
                           "static int4 (static_all_reduce)")
    return run(x, jnp.asarray(site, jnp.int32))  # its derivative is psum's, as all_reduce's


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class StaticAllReduce:
    """`static_all_reduce` as a frozen, hashable collective `(x, axis_name, site=...)`.

    `takes_site` tells `gemma.forward` to pass the site index; `sites` lets it check the
    calibration was made for its number of sites. Equal formats hash equal, so a forward
    compiles once per (calibration, outliers, algorithm).
    """

    fmt: StaticFormat
    algorithm: str = "one_shot"
    takes_site: ClassVar[bool] = True

    def __post_init__(self):
        if not isinstance(self.fmt, StaticFormat):
            raise TypeError(f"fmt must be a StaticFormat, got {type(self.fmt).__name__}")
        check_algorithm(self.algorithm)

    @classmethod
    def from_calibration(cls, state: dict, *, outliers: int | None = None,
                         algorithm: str = "one_shot") -> StaticAllReduce:
        """The collective of a calibration state (`outliers` as in `StaticFormat`)."""
        return cls(StaticFormat.from_calibration(state, outliers=outliers), algorithm)

    @property
    def sites(self) -> int:
        return self.fmt.sites

    def __call__(self, x: jax.Array, axis_name: str, *, site=None) -> jax.Array:
        return static_all_reduce(x, axis_name, self.fmt, site=site, algorithm=self.algorithm)

    def __str__(self) -> str:
        return f"{self.algorithm} {self.fmt}"
