"""Static int4 with BF16 outlier features: calibrated AllReduce (Dong et al., arXiv 2411.07942).

The dynamic formats of `quantize.py` compute a scale from every block of data as it is sent, and
pay for it on the wire (a bf16 scale per 32 values: int4 costs 4.5 bits). Tensor-parallel
partial sums are more regular than that: a given hidden feature at a given AllReduce site has
about the same range for every token, and a handful of features are far wider than the rest,
for every token. So measure the ranges once, offline, and send no scales at all:

1. Calibration. Run the model over calibration text and record, for every AllReduce site `s`,
   every device `d` and every hidden feature `j`, the minimum and maximum of `d`'s partial sum,
   smoothed over the calibration batches by an exponential moving average
   (`lo <- m lo + (1 - m) min_batch`, the first batch taken as is; likewise `hi`).
2. Outliers. At each site the `k = floor(E / 64)` features whose range `sum_d (hi - lo)` is
   largest travel as bfloat16 (10 of Gemma 3 270M's 640). The paper's observation, which the
   data file `equarx_ref/data/outliers.json` shows for Gemma: those features are the same for every
   token, so the choice can be static.
3. Every other feature travels as a 4-bit code of a static, asymmetric grid spanning its
   calibrated range on the sending device, widened to hold 0, with 0 on the grid (an integer
   zero point z, as integer quantizers do):

       step = (max(hi, 0) - min(lo, 0)) / 15       z = round(-min(lo, 0) / step)
       q = clip(round(x / step) + z, 0, 15)         x' = (q - z) step

   Values inside `[lo, hi]` are off by at most half a step; values outside clip to the ends
   (the price of a static range: the moving average makes the range a typical one, not the
   extreme one). Zero on the grid is not a detail: measured on Gemma 3 270M, the first token
   (BOS, the attention sink every later token reads) has an MLP partial sum near zero at most
   sites, and a grid without 0 gave it relative errors up to 48x its size (1080-token text);
   with 0 on the grid, at most 0.94. The grids are known to every device, so nothing but codes
   is sent:

       bits per value = (4 (E - k) + 16 k) / E          = 4.1875 for E = 640, k = 10

   (the paper reports 4.2 on average). Padding: an odd `E - k` adds a nibble per token.

The collective is the paper's one-shot: every device encodes its whole partial sum, one
all-gather brings every device every payload, and every device decodes them with the senders'
grids and adds them in f32 in rank order: one quantization per value, the same bytes and the
same additions everywhere, so the result is bitwise identical on every device. For comparison
the same payload also runs through the ring (`ring_schedule`): each hop decodes, adds its own
chunk and re-encodes the partial sum of one more device, on the grid calibrated for *that* set
of devices (calibration records the ranges of the partial sums of every run of consecutive
devices `start, start + 1, ..., start + length - 1 (mod p)`, which is what a ring hop carries);
the owners encode the full sums once more for the all-gather. Ring chunks are whole tokens.

Where the scales come from is the design question: they differ per site, and the model runs
its layers under `lax.scan`, so the collective is traced once for all 18 layers and cannot
count its calls. The model therefore tells it the site: `gemma.forward` calls a collective
whose `takes_site` is true as `ar(x, axis_name, site=2 * layer + kind)` with a traced int32,
and `StaticAllReduce` keeps every site's tables as constants and indexes them by it. It is a
frozen dataclass that hashes by a digest of its tables, so `forward(all_reduce=...)` compiles
once per calibration, like `eq.AllReduce`.

The calibration state is a plain dict of numpy arrays (a pytree), saved as `.npz`:

    lo, hi     float32 [sites, p, p, E]: [s, length - 1, start, j], the range of feature j of the
               partial sum of devices start .. start + length - 1 (mod p) at site s
               (length 1: device `start` alone, what the one-shot needs)
    batches    int64 []: calibration batches seen;  tokens: int64 []: tokens seen
    momentum   float32 []: the moving average's m

Non-finite values: a static grid has no scale to carry a NaN or an infinity (the dynamic
formats carry it through the block's scale). Here a token whose partial sum has a non-finite
value sends its outlier features as NaN, so that token's sum is non-finite (and after the
model's RMSNorm its whole row is); with `k = 0` there is no such channel, and infinities clip
to the range ends, NaN to `lo`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._checks import count
from .collectives import invariant
from .formats import Format
from .quantize import decode_elements, encode_elements
from .schedule import ring_schedule

__all__ = [
    "ALGORITHMS",
    "StaticAllReduce",
    "StaticFormat",
    "check_calibration",
    "default_outliers",
    "init_calibration",
    "load_calibration",
    "save_calibration",
    "select_outliers",
    "static_all_reduce",
    "static_wire_bytes",
    "update_calibration",
    "window_sums",
]

#: How a static payload can travel: the paper's one-shot, or the ring for comparison.
ALGORITHMS = ("one_shot", "ring")
_LEVELS = 15                      # 4 bits: codes 0..15, 15 steps between lo and hi
_INT4 = Format.int4()             # its element codec packs the codes (as code - 8)
_KEYS = ("lo", "hi", "batches", "tokens", "momentum")


def default_outliers(features: int) -> int:
    """The paper's k = floor(E / 64): features kept in bfloat16."""
    return count(features, "features") // 64


# ---- calibration: a plain dict of arrays -----------------------------------------------------


def init_calibration(sites: int, devices: int, features: int, *, momentum: float = 0.9) -> dict:
    """An empty calibration state (no batch seen) for `sites` x `devices` x `features`."""
    sites, p, e = count(sites, "sites"), count(devices, "devices"), count(features, "features")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    shape = (sites, p, p, e)
    return {"lo": np.zeros(shape, np.float32), "hi": np.zeros(shape, np.float32),
            "batches": np.asarray(0, np.int64), "tokens": np.asarray(0, np.int64),
            "momentum": np.asarray(momentum, np.float32)}


def window_sums(parts: np.ndarray) -> np.ndarray:
    """[p, ...] per-device partial sums -> [p, p, ...]: [length - 1, start] the sum of devices
    start, start + 1, ..., start + length - 1 (mod p), added in that order (as a ring does)."""
    p = parts.shape[0]
    out = np.empty((p, p, *parts.shape[1:]), np.float32)
    for start in range(p):
        acc = parts[start].astype(np.float32)
        out[0, start] = acc
        for length in range(2, p + 1):
            acc = acc + parts[(start + length - 1) % p]
            out[length - 1, start] = acc
    return out


def update_calibration(state: dict, parts) -> dict:
    """The state after one more batch: `parts` `[p, sites, tokens, E]`, each device's partial
    sum at each site (what `gemma.calibrate.capture` records). Returns a new dict."""
    check_calibration(state)
    parts = np.asarray(parts, np.float32)
    sites, p, _, e = state["lo"].shape
    if parts.ndim != 4 or parts.shape[0] != p or parts.shape[1] != sites or \
            parts.shape[3] != e or parts.shape[2] == 0:
        raise ValueError(f"parts must be [devices={p}, sites={sites}, tokens > 0, features={e}], "
                         f"got {list(parts.shape)}")
    if not np.isfinite(parts).all():
        raise ValueError("parts hold non-finite values: a calibration batch must be finite")
    w = window_sums(parts)                                       # [p, p, sites, T, E]
    lo = w.min(axis=3).transpose(2, 0, 1, 3)                     # [sites, p, p, E]
    hi = w.max(axis=3).transpose(2, 0, 1, 3)
    m = float(state["momentum"])
    if int(state["batches"]) > 0:
        lo = m * state["lo"] + (1 - m) * lo
        hi = m * state["hi"] + (1 - m) * hi
    return {"lo": lo.astype(np.float32), "hi": hi.astype(np.float32),
            "batches": np.asarray(int(state["batches"]) + 1, np.int64),
            "tokens": np.asarray(int(state["tokens"]) + parts.shape[2], np.int64),
            "momentum": np.asarray(m, np.float32)}


def check_calibration(state, *, sites: int | None = None, features: int | None = None,
                      devices: int | None = None) -> dict:
    """`state` if it is a well-formed calibration (matching the model when sizes are given),
    else a ValueError saying what differs."""
    if not isinstance(state, dict) or set(state) != set(_KEYS):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"a calibration state is a dict with keys {list(_KEYS)}, got {got}")
    lo, hi = np.asarray(state["lo"]), np.asarray(state["hi"])
    if lo.ndim != 4 or lo.shape != hi.shape or lo.shape[1] != lo.shape[2]:
        raise ValueError(f"calibration lo/hi must both be [sites, p, p, features], got "
                         f"{list(lo.shape)} and {list(hi.shape)}")
    have = dict(zip(("sites", "devices", "features"), (lo.shape[0], lo.shape[1], lo.shape[3]),
                    strict=True))
    want = {"sites": sites, "devices": devices, "features": features}
    wrong = [f"{have[k]} {k} (the model has {v})" for k, v in want.items()
             if v is not None and v != have[k]]
    if wrong:
        raise ValueError(f"the calibration does not match the model: it was made for "
                         f"{', '.join(wrong)}; calibrate on this model and device count")
    if int(state["batches"]) > 0 and not (np.isfinite(lo).all() and np.isfinite(hi).all()
                                          and (lo <= hi).all()):
        raise ValueError("calibration ranges must be finite with lo <= hi")
    return state


def save_calibration(path, state: dict) -> None:
    """Write `state` to `path` as an uncompressed `.npz` (numpy appends the suffix if missing)."""
    check_calibration(state)
    if int(state["batches"]) == 0:
        raise ValueError("this calibration has seen no batch: nothing to save")
    np.savez(path, **{k: np.asarray(v) for k, v in state.items()})


def load_calibration(path, *, sites: int | None = None, features: int | None = None,
                     devices: int | None = None) -> dict:
    """Read a state `save_calibration` wrote, checked against the sizes given (ValueError)."""
    try:
        with np.load(Path(path), allow_pickle=False) as f:
            state = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read a calibration from {str(path)!r}: {e}") from None
    return check_calibration(state, sites=sites, features=features, devices=devices)


def select_outliers(state: dict, k: int) -> np.ndarray:
    """`[sites, k]` int32, ascending: per site, the k features with the largest calibrated range
    summed over the devices, `sum_d (hi - lo)` (ties: the lower feature index)."""
    check_calibration(state)
    spread = (state["hi"][:, 0] - state["lo"][:, 0]).astype(np.float64).sum(axis=1)  # [S, E]
    k = count(k, "outliers", minimum=0, maximum=spread.shape[1])
    top = np.argsort(-spread, axis=1, kind="stable")[:, :k]
    return np.sort(top, axis=1).astype(np.int32)


# ---- the wire format ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class StaticFormat:
    """Everything static about the payload of every site: which features are outliers and the
    int4 grids of every device (and run of devices). Hashes and compares by a digest of its
    tables. Build it with `StaticFormat.from_calibration(state, outliers=k)`.

    Attributes:
        outliers: `[sites, k]` int32, the bf16 features of each site.
        inliers: `[sites, E - k]` int32, the int4 features.
        lo, step: `[sites, p, p, E]` float32 grids `lo + q step`, q = 0..15, indexed like the
            calibration's lo/hi; `lo = -z step`, so q = z is exactly 0.
    """

    outliers: np.ndarray
    inliers: np.ndarray
    lo: np.ndarray
    step: np.ndarray
    digest: str

    @classmethod
    def from_calibration(cls, state: dict, *, outliers: int | None = None) -> StaticFormat:
        """The format of a calibration, with `outliers` bf16 features per site (default
        `floor(E / 64)`; 0: all features int4)."""
        check_calibration(state)
        if int(state["batches"]) == 0:
            raise ValueError("this calibration has seen no batch: calibrate first")
        e = state["lo"].shape[3]
        k = default_outliers(e) if outliers is None else outliers
        out = select_outliers(state, k)
        inl = np.stack([np.setdiff1d(np.arange(e), o) for o in out]).astype(np.int32)
        lo = np.minimum(np.asarray(state["lo"], np.float64), 0.0)     # 0 inside the range
        hi = np.maximum(np.asarray(state["hi"], np.float64), 0.0)
        step = ((hi - lo) / _LEVELS).astype(np.float32)
        # Round step up to 20 significant bits, so that q * step (q < 16) is exact in f32: the
        # decoder's lo + q * step then gives exactly 0 at q = z, fused multiply-add or not.
        step = ((step.view(np.uint32) + 0xF) & np.uint32(0xFFFFFFF0)).view(np.float32)
        zero = np.round(-lo / np.where(step > 0, step, 1.0))           # the zero point z
        lo = (-zero * step).astype(np.float32)     # grid lo + q step: q = z gives exactly 0
        h = hashlib.sha256()
        for a in (out, inl, lo, step):
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a).tobytes())
        return cls(out, inl.reshape(out.shape[0], e - out.shape[1]), lo, step, h.hexdigest())

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other) -> bool:
        return isinstance(other, StaticFormat) and other.digest == self.digest

    @property
    def sites(self) -> int:
        return self.lo.shape[0]

    @property
    def devices(self) -> int:
        return self.lo.shape[1]

    @property
    def features(self) -> int:
        return self.lo.shape[3]

    @property
    def k(self) -> int:
        """Outlier features per site."""
        return self.outliers.shape[1]

    @property
    def row_bytes(self) -> int:
        """Bytes one token's partial sum takes on the wire: int4 codes, then bf16 outliers."""
        return -(-(self.features - self.k) // 2) + 2 * self.k

    @property
    def bits_per_value(self) -> float:
        """Wire bits per value, everything included: `8 * row_bytes / E` (no scales travel)."""
        return 8 * self.row_bytes / self.features

    def __str__(self) -> str:
        return f"int4 static + {self.k} bf16" if self.k else "int4 static"

    def __repr__(self) -> str:
        return (f"StaticFormat({self.sites} sites, {self.devices} devices, {self.features} "
                f"features, {self.k} outliers, {self.bits_per_value:g} bits/value)")


def static_wire_bytes(tokens: int, p: int, fmt: StaticFormat, algorithm: str = "one_shot") -> int:
    """Bytes one device sends to reduce `tokens` rows of E features over `p` devices.

    one_shot: one all-gather, `(p - 1) * tokens * row_bytes`. ring: `p - 1` hops of a chunk of
    `ceil(tokens / p)` rows, then an all-gather of the owners' chunks: `2 (p - 1) ceil(T / p)
    row_bytes`."""
    tokens, p = count(tokens, "tokens", minimum=0), count(p, "p")
    _check_algorithm(algorithm)
    if algorithm == "one_shot":
        return (p - 1) * tokens * fmt.row_bytes
    return 2 * (p - 1) * (-(-tokens // p)) * fmt.row_bytes


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r} for static int4; choose one of "
                         f"{list(ALGORITHMS)}")


# ---- encode / decode one message ------------------------------------------------------------


class _Tables:
    """The format's tables as constants of the traced program, for one (traced) site."""

    def __init__(self, fmt: StaticFormat, site):
        pick = functools.partial(lax.dynamic_index_in_dim, index=site, axis=0, keepdims=False)
        self.fmt = fmt
        self.out = pick(jnp.asarray(fmt.outliers))                     # [k]
        self.inl = pick(jnp.asarray(fmt.inliers))                      # [E - k]
        order = np.argsort(np.concatenate([fmt.inliers, fmt.outliers], axis=1), axis=1)
        self.order = pick(jnp.asarray(order.astype(np.int32)))         # [E]: back to features
        self.lo = pick(jnp.asarray(fmt.lo))                            # [p, p, E]
        self.step = pick(jnp.asarray(fmt.step))

    def grid(self, group):
        """(lo, step) of the int4 features for group `(length - 1, start)`: [..., E - k]."""
        i, s = group
        lo, step = self.lo[i, s], self.step[i, s]                      # [..., E]
        return jnp.take(lo, self.inl, axis=-1), jnp.take(step, self.inl, axis=-1)

    def encode(self, x, group):
        """rows `[T, E]` -> wire bytes uint8 `[T, row_bytes]` on `group`'s grid."""
        lo, step = self.grid(group)
        inl = jnp.take(x, self.inl, axis=-1)                           # [T, E - k]
        inv = jnp.where(step > 0, 1.0 / jnp.where(step > 0, step, 1.0), 0.0)
        v = (inl - lo) * inv
        q = jnp.clip(jnp.round(jnp.where(jnp.isnan(v), 0.0, v)), 0, _LEVELS)
        codes = q - 8                                                  # int4 two's complement
        if codes.shape[-1] % 2:                                        # whole bytes
            codes = jnp.pad(codes, ((0, 0), (0, 1)))
        parts = [encode_elements(codes, _INT4)]
        if self.fmt.k:
            bad = ~jnp.isfinite(x).all(axis=-1, keepdims=True)         # carry NaN/Inf (essay)
            out = jnp.where(bad, jnp.nan, jnp.take(x, self.out, axis=-1)).astype(jnp.bfloat16)
            parts.append(lax.bitcast_convert_type(out, jnp.uint8).reshape(x.shape[0], -1))
        return jnp.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]

    def decode(self, buf, group):
        """wire bytes `[..., T, row_bytes]` -> f32 `[..., T, E]` (group's grids broadcast over
        the leading axes: `[..., 1, E]`)."""
        e, k = self.fmt.features, self.fmt.k
        nib = -(-(e - k) // 2)
        codes = decode_elements(buf[..., :nib], _INT4)[..., :e - k] + 8
        lo, step = self.grid(group)
        vals = [lo + codes * step]
        if k:
            raw = buf[..., nib:].reshape(*buf.shape[:-1], k, 2)
            vals.append(lax.bitcast_convert_type(raw, jnp.bfloat16).astype(jnp.float32))
        return jnp.take(jnp.concatenate(vals, axis=-1), self.order, axis=-1)


# ---- the collective -------------------------------------------------------------------------


def _one_shot(rows, tab: _Tables, axis, me, p):
    """Every device's payload to everyone; decode with the senders' grids; sum in rank order."""
    wire = lax.all_gather(tab.encode(rows, (0, me)), axis, axis=0, to="invarying")  # [p, T, R]
    parts = tab.decode(wire, (0, jnp.arange(p)[:, None]))                          # [p, T, E]
    total = parts[0]
    for r in range(1, p):
        total = total + parts[r]
    return total


def _ring(rows, tab: _Tables, axis, me, p):
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
    tab = _Tables(fmt, site)
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
    _check_algorithm(algorithm)
    if not isinstance(axis_name, str):
        raise ValueError(f"static int4 runs over one mesh axis, got {axis_name!r}")
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"static_all_reduce needs a floating-point array, got {x.dtype}")
    p = lax.axis_size(axis_name)
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
    if isinstance(site, (int, np.integer)) and not 0 <= site < fmt.sites:
        raise ValueError(f"site must lie in [0, {fmt.sites}), got {site}")
    if x.size == 0 or p == 1:        # nothing to send, so nothing to quantize
        return invariant(x, (axis_name,))
    return _run(x, jnp.asarray(site, jnp.int32), axis_name, fmt, algorithm)


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
        _check_algorithm(self.algorithm)

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

