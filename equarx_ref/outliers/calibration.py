"""Calibration: the ranges of the AllReduce partial sums, measured once, offline.

Static int4 (Dong et al., arXiv 2411.07942) sends no scales: every device knows every grid in
advance, because the ranges were measured before. Run the model over calibration text and
record, for every AllReduce site `s`, every device `d` and every hidden feature `j`, the minimum
and maximum of `d`'s partial sum, smoothed over the calibration batches by an exponential moving
average (`lo <- m lo + (1 - m) min_batch`, the first batch taken as is; likewise `hi`).

The ring needs more than each device's own range: a ring hop carries the partial sum of a run of
consecutive devices `start, start + 1, ..., start + length - 1 (mod p)`, so calibration records
the range of every such run (`window_sums`); length 1 is the device alone, what the one-shot
needs.

Outliers. At each site the `k = floor(E / 64)` features whose range `sum_d (hi - lo)` is largest
travel as bfloat16 (`select_outliers`; 10 of Gemma 3 270M's 640). The paper's observation, which
`equarx_ref/data/outliers.json` shows for Gemma: those features are the same for every token, so the
choice can be static. The trade-off: a static range is a typical one (the moving average), not
the extreme one, so what falls outside it clips (`wire.py`).

The state is a plain dict of numpy arrays (a pytree), saved as `.npz`:

    lo, hi     float32 [sites, p, p, E]: [s, length - 1, start, j], the range of feature j of the
               partial sum of devices start .. start + length - 1 (mod p) at site s
    batches    int64 []: calibration batches seen;  tokens: int64 []: tokens seen
    momentum   float32 []: the moving average's m
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import numpy as np

from .._checks import count, number

__all__ = [
    "check_calibration",
    "default_outliers",
    "init_calibration",
    "load_calibration",
    "save_calibration",
    "select_outliers",
    "update_calibration",
    "window_sums",
]

_KEYS = ("lo", "hi", "batches", "tokens", "momentum")


def default_outliers(features: int) -> int:
    """The paper's k = floor(E / 64): features kept in bfloat16."""
    return count(features, "features") // 64


def init_calibration(sites: int, devices: int, features: int, *, momentum: float = 0.9) -> dict:
    """An empty calibration state (no batch seen) for `sites` x `devices` x `features`."""
    sites, p, e = count(sites, "sites"), count(devices, "devices"), count(features, "features")
    momentum = number(momentum, "momentum", positive=False)
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    shape = (sites, p, p, e)
    return {"lo": np.zeros(shape, np.float32), "hi": np.zeros(shape, np.float32),
            "batches": np.asarray(0, np.int64), "tokens": np.asarray(0, np.int64),
            "momentum": np.asarray(momentum, np.float32)}


def window_sums(parts: np.ndarray) -> np.ndarray:
    """[p, ...] per-device partial sums -> [p, p, ...]: [length - 1, start] the sum of devices
    start, start + 1, ..., start + length - 1 (mod p), added in that order (as a ring does)."""
    parts = _parts(parts)
    if parts.ndim == 0:
        raise ValueError(f"parts must be [devices, ...] partial sums, got a scalar {parts!r}")
    p = parts.shape[0]
    out = np.empty((p, p, *parts.shape[1:]), np.float32)
    for start in range(p):
        acc = parts[start].astype(np.float32)
        out[0, start] = acc
        for length in range(2, p + 1):
            acc = acc + parts[(start + length - 1) % p]
            out[length - 1, start] = acc
    return out


def _parts(parts) -> np.ndarray:
    """`parts` as a real (int or float, not bool) NumPy array, else a TypeError naming it."""
    try:
        out = np.asarray(parts)
    except (TypeError, ValueError):
        out = None
    if out is None or out.dtype == bool or not np.issubdtype(out.dtype, np.number) or \
            np.issubdtype(out.dtype, np.complexfloating):
        raise TypeError(f"parts must be an array of real numbers, got {type(parts).__name__}"
                        + (f" of dtype {out.dtype}" if out is not None else ""))
    return out


def update_calibration(state: dict, parts) -> dict:
    """The state after one more batch: `parts` `[p, sites, tokens, E]`, each device's partial
    sum at each site (what `gemma.calibrate.capture` records). Returns a new dict."""
    check_calibration(state)
    parts = _parts(parts).astype(np.float32)
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
        raise ValueError(f"state must be a calibration state, a dict with keys {list(_KEYS)}, "
                         f"got {got}")
    sites, features, devices = (None if v is None else count(v, what) for v, what in
                                [(sites, "sites"), (features, "features"), (devices, "devices")])
    lo, hi = np.asarray(state["lo"]), np.asarray(state["hi"])
    if lo.ndim != 4 or lo.shape != hi.shape or lo.shape[1] != lo.shape[2]:
        raise ValueError(f"state's lo/hi must both be [sites, p, p, features], got "
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
        raise ValueError("state's calibration ranges must be finite with lo <= hi")
    return state


def save_calibration(path, state: dict) -> None:
    """Write `state` to `path` as an uncompressed `.npz` (numpy appends the suffix if missing)."""
    check_calibration(state)
    path = _path(path)
    if int(state["batches"]) == 0:
        raise ValueError("this calibration has seen no batch: nothing to save")
    try:
        np.savez(path, **{k: np.asarray(v) for k, v in state.items()})
    except OSError as e:
        raise ValueError(f"cannot write a calibration to path {str(path)!r}: "
                         f"{e.strerror or e}") from None


def _path(path) -> Path:
    if not isinstance(path, (str, PathLike)) or not str(path):
        raise TypeError(f"path must be a file name (str or os.PathLike), got {path!r}")
    return Path(path)


def load_calibration(path, *, sites: int | None = None, features: int | None = None,
                     devices: int | None = None) -> dict:
    """Read a state `save_calibration` wrote, checked against the sizes given (ValueError)."""
    path = _path(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            state = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        message = " ".join(str(getattr(e, "strerror", None) or e).split())
        raise ValueError(f"cannot read a calibration from path {str(path)!r}: {message}") \
            from None
    return check_calibration(state, sites=sites, features=features, devices=devices)


def select_outliers(state: dict, k: int) -> np.ndarray:
    """`[sites, k]` int32, ascending: per site, the k features with the largest calibrated range
    summed over the devices, `sum_d (hi - lo)` (ties: the lower feature index)."""
    check_calibration(state)
    spread = (state["hi"][:, 0] - state["lo"][:, 0]).astype(np.float64).sum(axis=1)  # [S, E]
    k = count(k, "k (outliers)", minimum=0, maximum=spread.shape[1])
    top = np.argsort(-spread, axis=1, kind="stable")[:, :k]
    return np.sort(top, axis=1).astype(np.int32)
