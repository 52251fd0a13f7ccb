"""The map: bits on the wire against error, for every algorithm, format and remedy.

`sweep()` runs `all_reduce` for every device count p x algorithm x wire format x remedy on the
same inputs and records, per point:

- bits per element on the wire: the bytes one device sends (`predict.wire_bytes`, the count
  the tests hold equal to the compiled HLO) over those of the same algorithm unquantized in
  bf16, times 16 (8.5 for int8 with a bf16 scale per 32; a hop-aware plan's average);
- bytes per value: the bytes one device sends over the message's values, the real cost of an
  algorithm (one-shot sends p - 1 whole messages, the ring 2 (p - 1) / p of one);
- the relative error ||y - exact|| / ||exact|| against a float64 sum, on each data set;
- the modelled speedup on one TPU chip type against the unquantized bidirectional ring (XLA's
  own AllReduce), `cost.predicted_time` at a stated message size: modelled, not measured.

Data. "gaussian": i.i.d. N(0, 1), the case `predict.py` models. "outliers": Gaussian with a few
outlier features, the shape of real transformer activations: 1/64 of the features of a
640-wide hidden vector (Gemma 3 270M's), the same on every device, 20 times larger. Both are
synthetic; the Gemma activations themselves are measured by `equarx-ref gemma`.

Remedies (`collectives.py`): "sr" stochastic rounding, "rotate" a randomized Hadamard rotation,
"adaptive" a hop-aware bit plan, "rotate+adaptive" both; run on the ring, whose partial sums
are re-quantized, and on two-shot, the baseline it must beat (`_applies`). The Pareto front
of each (p, data) is the set of points no other point beats on both bytes per value and error.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..collectives import AllReduce
from ..formats import Format, format_label
from ..models.hops import MAX_DEVICES, hop_plan, plan_bits_per_element
from ..models.predict import predicted_relative_error, wire_bytes
from .progress import progress_bar

__all__ = ["DATA", "DEFAULT_ALGORITHMS", "DEFAULT_FORMATS", "DEFAULT_P", "REMEDIES", "Point",
           "configurations", "make_data", "pareto", "sweep"]

DEFAULT_P = (2, 4, 8, 16)
DEFAULT_ALGORITHMS = ("ring", "bidir_ring", "two_shot", "one_shot")
DEFAULT_FORMATS = ("int8", "int4", "fp8_e4m3", "mxfp8", "mxfp8/ceil", "mxfp6_e2m3", "mxfp4")
#: Remedies by name: the `AllReduce` fields they set.
REMEDIES = {"none": {}, "sr": {"stochastic_seed": 0}, "rotate": {"rotate": True},
            "adaptive": {"hop_bits": "adaptive"},
            "rotate+adaptive": {"rotate": True, "hop_bits": "adaptive"}}
DATA = ("gaussian", "outliers")
HIDDEN = 640  # the outlier features repeat with Gemma 3 270M's hidden size


@dataclasses.dataclass(frozen=True)
class Point:
    """One configuration measured on one data set."""

    p: int
    algorithm: str
    format: str
    remedy: str
    data: str
    bits_per_element: float
    bytes_per_value: float
    rel_error: float
    predicted_error: float | None  # the Gaussian model (None: no model for this remedy)
    modelled_speedup: float
    pareto: bool = False


def make_data(kind: str, p: int, n: int, seed: int = 0) -> np.ndarray:
    """Inputs [p, n] f32 of one kind (module essay), seeded."""
    rng = np.random.default_rng([seed, p, n])
    x = rng.standard_normal((p, n))
    if kind == "outliers":
        features = np.random.default_rng(seed).choice(HIDDEN, HIDDEN // 64, replace=False)
        x[:, np.isin(np.arange(n) % HIDDEN, features)] *= 20.0
    elif kind != "gaussian":
        raise ValueError(f"unknown data {kind!r}; choose one of {DATA}")
    return x.astype(np.float32)


def _applies(algorithm: str, fmt: Format, remedy: str) -> bool:
    """Which remedies the sweep runs (to stay within minutes): every remedy on the ring, whose
    partial sums are re-quantized, and on two-shot, the baseline it must beat, for int8 and
    int4; rotation also for mxfp4 on the ring. The bidirectional ring's error equals the
    ring's (the same partial sums), so it runs without remedies."""
    if remedy == "none":
        return True
    if algorithm not in ("ring", "two_shot"):
        return False
    if fmt.name in ("int8", "int4") and not fmt.is_mx:
        return True
    return remedy == "rotate" and algorithm == "ring" and fmt.name == "mxfp4"


def configurations(p_values, algorithms, formats, remedies) -> list[tuple]:
    """The (p, algorithm, Format, remedy) the sweep runs, in order (duplicates once); a mix
    that leaves nothing to run is refused in one line (ValueError), before any work."""
    fmts = list(dict.fromkeys(Format.parse(f) for f in formats))
    for r in remedies:
        if r not in REMEDIES:
            raise ValueError(f"unknown remedy {r!r}; choose from {list(REMEDIES)}")
    configs = [(p, a, f, r) for p in dict.fromkeys(p_values) for a in dict.fromkeys(algorithms)
               for f in fmts for r in dict.fromkeys(remedies) if _applies(a, f, r)]
    for _, a, f, r in configs:  # each configuration's own rules (e.g. rotate: 2^k blocks)
        AllReduce(f, a, min_bytes=0, **REMEDIES[r])
    big = sorted({p for p, _, _, r in configs if "adaptive" in r and p > MAX_DEVICES})
    if big:
        raise ValueError(f"hop-aware bits ('adaptive') plan at most {MAX_DEVICES} devices, "
                         f"got --p {' '.join(map(str, big))}")
    if not configs:
        raise ValueError(f"nothing to run: the remedies {' '.join(remedies)} do not apply to "
                         f"{' '.join(algorithms)} with {' '.join(map(str, fmts))} (remedies run "
                         "on ring and two_shot with int8 or int4, rotate also on the ring with "
                         "mxfp4); add 'none' to --remedies for the plain collectives")
    return configs


@functools.cache
def _program(p: int, config: AllReduce, n: int):
    from ..devices import make_mesh, setup_devices

    mesh = make_mesh(setup_devices(p)[:p], ("tp",), (p,))
    body = lambda v: config(v[0], "tp")  # noqa: E731
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P()))


def _modelled_time(n, p, fmt, algorithm, chip):
    from ..models.cost import predicted_time

    return predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=chip)


def pareto(points: list[Point]) -> list[Point]:
    """`points` with `pareto` set on those no other point of the same (p, data) beats on both
    bytes per value and error."""
    out = []
    for pt in points:
        rivals = [q for q in points if (q.p, q.data) == (pt.p, pt.data)]
        beaten = any(q.bytes_per_value <= pt.bytes_per_value and q.rel_error <= pt.rel_error
                     and (q.bytes_per_value, q.rel_error) != (pt.bytes_per_value, pt.rel_error)
                     for q in rivals)
        out.append(dataclasses.replace(pt, pareto=not beaten))
    return out


def sweep(p_values=DEFAULT_P, algorithms=DEFAULT_ALGORITHMS, formats=DEFAULT_FORMATS,
          remedies=tuple(REMEDIES), data=DATA, *, size: int = 1 << 14, chip: str = "v5e",
          message_bytes: int = 16 << 20, progress: bool = True) -> dict:
    """Measure every configuration (module essay); returns a JSON-ready dict.

    Args:
        p_values: device counts (each needs that many devices: `setup_devices(max(p))`).
        algorithms, formats, remedies, data: what to cross (names; formats as `Format.parse`
            reads them, remedies keys of `REMEDIES`, data of `DATA`).
        size: values per device (a multiple of 640 is not needed).
        chip: the `cost.CHIPS` key of the modelled speedup; message_bytes: its bf16 message.
        progress: a progress bar on stderr (tqdm if installed, else a counter).
    """
    configs = configurations(p_values, algorithms, formats, remedies)
    data = list(dict.fromkeys(data))
    for kind in data:
        if kind not in DATA:
            raise ValueError(f"unknown data {kind!r}; choose one of {DATA}")
    bar = progress_bar(len(configs), progress)
    points, n_model = [], message_bytes // 2
    t0 = time.perf_counter()
    for p, algorithm, fmt, remedy in configs:
        config = AllReduce(fmt, algorithm, min_bytes=0, **REMEDIES[remedy])
        hop_bits = config.hop_bits
        sent = wire_bytes(size, p, fmt=fmt, algorithm=algorithm, dtype="float32",
                          hop_bits=hop_bits, min_bytes=0)
        plain = wire_bytes(size, p, fmt=None, algorithm=algorithm, dtype="bfloat16")
        bits = 16 * sent / plain
        if hop_bits == "adaptive":  # the plan's average, exact (padding aside)
            bits = plan_bits_per_element(hop_plan(p, fmt=fmt, algorithm=algorithm), p,
                                         algorithm=algorithm)
        base = _modelled_time(n_model, p, None, "bidir_ring", chip)
        speedup = base / _modelled_time(n_model, p, fmt, algorithm, chip)  # plan: <= fmt bytes
        model = None if remedy in ("sr",) else predicted_relative_error(
            p, fmt=fmt, algorithm=algorithm, hop_bits=hop_bits)
        run = _program(p, config, size)
        for kind in data:
            x = make_data(kind, p, size)
            y = np.asarray(run(jnp.asarray(x)), np.float64)
            exact = x.astype(np.float64).sum(0)
            err = float(np.linalg.norm(y - exact) / np.linalg.norm(exact))
            points.append(Point(p, algorithm, format_label(fmt), remedy, kind, round(bits, 4),
                                round(sent / size, 4), err,
                                None if kind != "gaussian" else model, speedup))
        bar(f"p={p} {config}")
    bar(None)
    return {"size": size, "chip": chip, "message_bytes": message_bytes, "modelled": True,
            "seconds": round(time.perf_counter() - t0, 1),
            "points": [dataclasses.asdict(q) for q in pareto(points)]}


def table(result: dict, data: str = "gaussian") -> list[list[str]]:
    """Rows for a printed table: one per configuration, on one data set."""
    rows = []
    for q in result["points"]:
        if q["data"] != data:
            continue
        pred = "-" if q["predicted_error"] is None else f"{q['predicted_error']:.2e}"
        rows.append([str(q["p"]), q["algorithm"], q["format"], q["remedy"],
                     f"{q['bits_per_element']:.3f}", f"{q['bytes_per_value']:.3f}",
                     f"{q['rel_error']:.2e}", pred, f"{q['modelled_speedup']:.2f}x",
                     "*" if q["pareto"] else ""])
    return rows

