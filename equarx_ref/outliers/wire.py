"""The wire format of static int4: codes on calibrated grids, a few features in bf16, no scales.

Every feature but the outliers travels as a 4-bit code of a static, asymmetric grid spanning its
calibrated range on the sending device (`calibration.py`), widened to hold 0, with 0 on the grid
(an integer zero point z, as integer quantizers do):

    step = (max(hi, 0) - min(lo, 0)) / 15       z = round(-min(lo, 0) / step)
    q = clip(round(x / step) + z, 0, 15)         x' = (q - z) step

Values inside `[lo, hi]` are off by at most half a step; values outside clip to the ends (the
price of a static range). Zero on the grid is not a detail: on Gemma 3 270M the first token
(BOS, the attention sink every later token reads) has an MLP partial sum near zero at most
sites, and a grid without 0 gives it relative errors many times its size; with 0 on the grid,
below one. The grids are known to every device, so nothing but codes is sent:

    bits per value = (4 (E - k) + 16 k) / E          = 4.1875 for E = 640, k = 10

(the paper reports 4.2 on average). Padding: an odd `E - k` adds a nibble per token. One token's
row on the wire is its int4 codes, then its k outliers as bf16 (`StaticFormat.row_bytes`).

Non-finite values: a static grid has no scale to carry a NaN or an infinity (the dynamic formats
carry it through the block's scale). Here a token whose partial sum has a non-finite value sends
its outlier features as NaN, so that token's sum is non-finite (and after the model's RMSNorm
its whole row is); with `k = 0` there is no such channel, and infinities clip to the range ends,
NaN to `lo`.

`Tables` holds a format's tables as constants of the traced program and encodes and decodes one
message for a (traced) site and group of devices; the executors are in `collective.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import jax.numpy as jnp
import numpy as np
from jax import lax

from .._checks import count
from ..elements import decode_elements, encode_elements
from ..formats import Format
from .calibration import check_calibration, default_outliers, select_outliers

__all__ = ["ALGORITHMS", "StaticFormat", "Tables", "check_algorithm", "static_wire_bytes"]

#: How a static payload can travel: the paper's one-shot, or the ring for comparison.
ALGORITHMS = ("one_shot", "ring")
_LEVELS = 15                      # 4 bits: codes 0..15, 15 steps between lo and hi
_INT4 = Format.int4()             # its element codec packs the codes (as code - 8)


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
    if not isinstance(fmt, StaticFormat):
        raise TypeError(f"fmt must be a StaticFormat, got {type(fmt).__name__}")
    check_algorithm(algorithm)
    if algorithm == "one_shot":
        return (p - 1) * tokens * fmt.row_bytes
    return 2 * (p - 1) * (-(-tokens // p)) * fmt.row_bytes


def check_algorithm(algorithm: str) -> None:
    """A ValueError unless `algorithm` is one a static payload can travel by (`ALGORITHMS`)."""
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r} for static int4; choose one of "
                         f"{list(ALGORITHMS)}")


class Tables:
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
