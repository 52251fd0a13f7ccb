"""The demo: every AllReduce algorithm x wire format, side by side, on the same inputs.

`compare_collectives` runs every algorithm x wire format on the same inputs, in one process, and
reports for each: bits per element, the bytes one device sends (read from the compiled HLO and
checked against `wire_bytes`), the byte ratio and CPU time against the unquantized bf16 ring, and
the error against the exact (float64) sum next to the error the theory predicts. `demo` is what
`equarx-ref demo` prints: those rows and the devices they ran on.

The collectives run as a user calls them, with `all_reduce`'s default size gate: a message that
quantized would send no fewer bytes (a short one, padded to whole blocks) goes unquantized. Such
a row is `gated`: it asked for a format and sent bf16, so its bits per element, bytes, error and
prediction are bf16's, and it says so.

Times are CPU timings on simulated devices: XLA:CPU runs collectives in memory and does not
overlap them with compute, so what they show is the cost of quantizing and dequantizing, not of
sending. On real links the bytes column is what matters; the cost model turns bytes into time.
Each configuration runs `repeats` times, round-robin across configurations so that drifts in
machine load hit all of them alike, and the median is kept (`runs.timing`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..collectives import all_reduce
from ..devices import describe_devices, make_mesh, setup_devices
from ..formats import COMPARED_FORMATS, UNQUANTIZED, Format, format_label, parse_format
from ..models.hlo import hlo_wire_bytes
from ..models.predict import predicted_relative_error, quantizing_saves_bytes, wire_bytes
from ..schedule import ALGORITHMS
from .timing import medians, time_calls

__all__ = ["DEMO_FORMATS", "Row", "compare_collectives", "demo", "demo_configurations"]

DEMO_FORMATS: dict[str, Format | None] = {
    name: parse_format(name) for name in COMPARED_FORMATS}


@dataclasses.dataclass
class Row:
    """One algorithm x format, measured. Errors are relative to the exact float64 sum. A
    `gated` row asked for `format` and sent bf16 (the size gate, module essay): its bits per
    element and predicted error are bf16's."""

    algorithm: str
    format: str
    bits_per_element: float  # as sent
    bytes_sent: int  # per device, from the compiled HLO
    bytes_model: int  # per device, from wire_bytes
    byte_ratio: float  # bf16 ring bytes / these bytes, both as sent (HLO)
    rel_error: float  # ||y - exact|| / ||exact||
    max_error: float  # max |y - exact|
    predicted_error: float
    cpu_time_s: float  # median wall time of one call, CPU
    time_ratio: float  # this time / bf16 ring time
    note: str = ""
    gated: bool = False  # sent unquantized by all_reduce's default size gate


def _time(fns: dict, x, repeats: int) -> dict:
    """Median seconds of each `fns[k](x)`, round-robin (`runs.timing`)."""
    return medians(time_calls({k: functools.partial(f, x) for k, f in fns.items()}, repeats))


def compare_collectives(devices, n: int = 1 << 18, *, repeats: int = 5, seed: int = 0,
                        formats: dict[str, Format | None] | None = None,
                        algorithms=ALGORITHMS, pairs=None, progress=None) -> list[Row]:
    """Run every algorithm x `formats` (default DEMO_FORMATS) on the same N(0, 1) bf16 inputs.

    Args:
        devices: the devices of a 1-D mesh (e.g. `setup_devices(8)`).
        n: values each device contributes.
        repeats: timed calls per configuration (median kept).
        formats: name -> Format (None = unquantized bf16); default `DEMO_FORMATS`.
        algorithms: which algorithms; "psum" runs unquantized only.
        pairs: only these (algorithm, format name) pairs, in this order (None: every
            algorithm x format).
        progress: optional callable(str) told about each configuration as it compiles.

    Returns:
        One `Row` per configuration, the unquantized bf16 ring first among equals.
    """
    formats = DEMO_FORMATS if formats is None else formats
    p = len(devices)
    mesh = make_mesh(devices, ("tp",))
    x = jax.random.normal(jax.random.key(seed), (p, n), jnp.float32).astype(jnp.bfloat16)
    x = jax.device_put(x, NamedSharding(mesh, P("tp")))
    exact = np.asarray(x, np.float64).sum(0)

    configs = [(a, name) for a in algorithms for name in formats
               if a != "psum" or formats[name] is None] if pairs is None else list(pairs)
    compiled = {}
    for algorithm, name in configs:
        if progress:
            progress(f"compiling {algorithm} {name}")
        fmt = formats[name]
        fn = jax.shard_map(
            lambda v, fmt=fmt, algorithm=algorithm: all_reduce(v[0], "tp", fmt=fmt,
                                                              algorithm=algorithm),
            mesh=mesh, in_specs=P("tp"), out_specs=P(), check_vma=True)
        compiled[algorithm, name] = jax.jit(fn).lower(x).compile()
    if progress:
        progress(f"timing {len(configs)} configurations x {repeats}")
    times = _time(compiled, x, repeats)

    unquantized = next((k for k, f in formats.items() if f is None), None)
    base_key = ("ring", unquantized) if ("ring", unquantized) in times else None
    base_bytes = wire_bytes(n, p, fmt=None, algorithm="ring", dtype="bfloat16")  # = its HLO
    rows = []
    for key in configs:
        algorithm, name = key
        fmt = formats[name]
        y = np.asarray(compiled[key](x), np.float64)
        sent = round(sum(hlo_wire_bytes(compiled[key].as_text(), p).values()))
        model = wire_bytes(n, p, fmt=fmt, algorithm=algorithm, dtype="bfloat16")
        gated = fmt is not None and not quantizing_saves_bytes(  # all_reduce's own rule
            n, p, fmt=fmt, algorithm=algorithm, dtype=x.dtype)
        sent_fmt = None if gated else fmt
        note = "" if sent == model else "CPU: f32" if algorithm == "psum" else "HLO != model"
        if gated:
            note = "; ".join(filter(None, [f"sent {UNQUANTIZED}: size gate", note]))
        rows.append(Row(
            algorithm=algorithm, format=name,
            bits_per_element=16.0 if sent_fmt is None else sent_fmt.bits_per_element,
            bytes_sent=sent, bytes_model=model, byte_ratio=base_bytes / sent,
            rel_error=float(np.linalg.norm(y - exact) / np.linalg.norm(exact)),
            max_error=float(np.abs(y - exact).max()),
            predicted_error=predicted_relative_error(p, fmt=sent_fmt, algorithm=algorithm),
            cpu_time_s=times[key],
            time_ratio=times[key] / times[base_key] if base_key else float("nan"),
            note=note, gated=gated))
    return rows


def demo_configurations(formats=None, algorithms=None) -> tuple[dict[str, Format | None], list]:
    """What `demo` runs for the given format names and algorithms (None: `COMPARED_FORMATS`,
    every algorithm): (formats by label, [(algorithm, format label), ...]), each algorithm x
    format but "psum" with a format (it sends bf16 only), and the unquantized bf16 ring,
    every ratio's baseline, first where it was not asked for. A request that leaves nothing
    to run, or an unknown name, is refused in one line before any work."""
    names = list(COMPARED_FORMATS) if formats is None else list(formats)
    fmts = {format_label(f): f for f in map(parse_format, names)}
    algs = list(dict.fromkeys(ALGORITHMS if algorithms is None else algorithms))
    unknown = [a for a in algs if a not in ALGORITHMS]
    if unknown:
        raise ValueError(f"unknown algorithm {unknown[0]!r}; choose from {', '.join(ALGORITHMS)}")
    pairs = [(a, name) for a in algs for name, f in fmts.items() if a != "psum" or f is None]
    if not pairs:
        raise ValueError(f"nothing to run: psum sends {UNQUANTIZED} only; add {UNQUANTIZED} to "
                         f"the formats or another algorithm")
    base = ("ring", UNQUANTIZED)
    return {UNQUANTIZED: None, **fmts}, pairs if base in pairs else [base, *pairs]


def demo(devices: int = 8, size: int = 1 << 18, *, repeats: int = 5, formats=None,
         algorithms=None, progress=None) -> dict:
    """`equarx-ref demo`: `compare_collectives` on `devices` devices (`setup_devices`), for
    the format names and algorithms given (`demo_configurations`; None: all of them).

    Returns:
        {"devices": describe_devices(...), "size": size, "rows": [Row, ...]}.
    """
    fmts, pairs = demo_configurations(formats, algorithms)  # refused before devices start
    devs = setup_devices(devices)
    rows = compare_collectives(devs, size, repeats=repeats, formats=fmts, pairs=pairs,
                               progress=progress)
    return {"devices": describe_devices(devs), "size": size, "rows": rows}
