"""The TPU program read back: what XLA:TPU really sends, overlaps and moves, against the models.

A compiled TPU program (`tpu_compile.compile_all_reduce`, from a CPU machine, nothing runs)
says what the chip would do. `read_back` compiles the AllReduce of each case and reads three
things off it: the bytes its collective-permutes carry, against `eq.wire_bytes` (they must be
equal); which fusions XLA:TPU scheduled inside each asynchronous transfer
(`hlo.collective_overlap`: the software pipeline of `num_chunks`, or none); and XLA:TPU's own
count of bytes accessed, taken apart op by op (`hlo_memory.memory_traffic`), against the HBM
passes the time model prices. The model's time re-priced with those bytes (`priced_time`) is a
modelled figure, never a measured one.

Both implementations are read back: `impl="xla"` (the readable codec's fusions) and
`impl="mosaic"` (the same collectives, every message coded by the Mosaic codec's kernels). A
kernel's own traffic is what it declares it moves (`hlo_memory.kernel_io`, its blocks through
HBM, once each), which XLA:TPU's count takes too; the tally adds it to the ops around it.

`READ_BACK` is read at 256 Ki values per chip, where compiles are quick. `AT_SCALE` is read at
16 MiB of bf16 per chip (`AT_SCALE_N`), the size issue 29 sets its time targets at (the
re-priced time within 25% of the model's; the bidirectional int8 ring at >= 1.4x psum's
speed): psum, every quantized AllReduce on the kernels, their rings pipelined as well, and the
XLA path's int8 ring beside them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

import equarx_ref as eq

from ..models.cost import as_chip, phases, predicted_time
from ..models.hlo import collective_overlap, hlo_wire_bytes
from ..models.hlo_memory import kernel_io, memory_traffic
from .tpu_compile import compile_all_reduce
from .tpu_schedule import compiled_schedule, dumping, price_ops

__all__ = ["AT_SCALE", "AT_SCALE_N", "READ_BACK", "format_read_back", "model_hbm_bytes",
           "priced_time", "read_back"]

#: (algorithm, format name or None, num_chunks[, impl]) that `read_back` compiles and reads;
#: impl "xla" unless named.
READ_BACK = (("psum", None, 1), ("ring", None, 1),
             *((a, f, 1) for a in ("ring", "bidir_ring", "two_shot", "one_shot")
               for f in ("int8", "int4", "fp8_e4m3", "mxfp8")),
             ("ring", "int8", 4),
             *((a, f, 1, "mosaic") for a in ("ring", "bidir_ring", "two_shot")
               for f in ("int8", "int4", "fp8_e4m3", "mxfp8")))
#: Values per chip of the read-back at scale: 16 MiB of bf16.
AT_SCALE_N = 8 << 20
#: The cases read back at `AT_SCALE_N`: psum; each algorithm on the kernels in int8; the
#: bidirectional ring pipelined (num_chunks=2: two messages in flight, the codec's kernels
#: inside the transfers) in every format the kernels run; the XLA path's int8 ring.
AT_SCALE = (("psum", None, 1),
            *((a, "int8", 1, "mosaic") for a in ("ring", "bidir_ring", "two_shot")),
            *(("bidir_ring", f, 2, "mosaic") for f in ("int8", "int4", "fp8_e4m3", "mxfp8")),
            ("ring", "int8", 1))


def model_hbm_bytes(n: int, p: int, *, fmt, algorithm: str, dtype="bfloat16",
                    num_chunks: int = 1) -> float:
    """Bytes of HBM traffic the time model prices for one AllReduce on one chip: its memory
    passes (`cost.phases`), each hop's pass counted once per hop."""
    return float(sum(ph.hbm_bytes * max(ph.hops, 1) for ph in phases(
        n, p, fmt=fmt, algorithm=algorithm, dtype=dtype, num_chunks=num_chunks)))


def priced_time(n: int, p: int, *, fmt, algorithm: str, chip: str, ratio: float,
                dtype="bfloat16", num_chunks: int = 1) -> float:
    """The time model's seconds with every memory pass `ratio` times the bytes it prices: the
    model re-priced with the traffic XLA:TPU's program really has (a modelled figure). Bytes
    only: the codec's stored cycles (`Chip.codec_price`) stay out of it, so that a read-back,
    which compiles the kernels afresh, never prices them with an older record's."""
    c = as_chip(chip)
    slow = dataclasses.replace(c, hbm_bandwidth=c.hbm_bandwidth / ratio, schedule="",
                               codec_bandwidth=c.codec_bandwidth and c.codec_bandwidth / ratio)
    return predicted_time(n, p, fmt=fmt, algorithm=algorithm, chip=slow, dtype=dtype,
                          num_chunks=num_chunks)


def read_back(topology: str, *, n: int = 1 << 18, p: int = 8, dtype="bfloat16",
              cases=READ_BACK, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Compile each case for `topology` and read the TPU program back (one JSON-ready dict per
    case): wire bytes from its HLO against `eq.wire_bytes`; the permutes' overlap
    (`hlo.collective_overlap`); XLA:TPU's bytes accessed against the model's HBM traffic,
    taken apart by `hlo_memory.memory_traffic` (by kind of op; the part that stays in VMEM);
    and the model's time re-priced with those bytes (`priced_time`): with all of them at HBM
    bandwidth (an upper bound) and with the HBM part only (VMEM work free: a lower bound),
    beside the model's own, each as a speedup over the bf16 psum priced the same way."""
    chip = topology.split(":")[0]
    out = []
    for case in cases:
        algorithm, name, k, impl = (*case, "xla")[:4]
        fmt = None if name is None else eq.Format.parse(name)
        if progress:
            progress(f"{topology} read back: {algorithm} {name or dtype} k={k} {impl}")
        def build(fmt=fmt, algorithm=algorithm, k=k, impl=impl):
            return compile_all_reduce(topology, n=n, p=p, dtype=dtype, fmt=fmt,
                                      algorithm=algorithm, num_chunks=k, impl=impl)

        schedule = None
        if dumping():  # libtpu writes its bundle listings: read the cycles too
            compiled, schedule = compiled_schedule(build)
        else:
            compiled = build()
        text = compiled.as_text()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        accessed = float(cost.get("bytes accessed", float("nan")))
        traffic = memory_traffic(text)
        kernels = kernel_io(text)  # what the kernels move through HBM (0: none)
        model = model_hbm_bytes(n, p, fmt=fmt, algorithm=algorithm, dtype=dtype, num_chunks=k)
        pairs = collective_overlap(text)
        hbm = traffic.hbm + kernels
        ratio, hbm_ratio = accessed / model, max(hbm / model, 1.0)
        ratios = {"model": 1.0, "hbm_only": hbm_ratio, "all": ratio}
        cycles = {}
        if schedule is not None:  # every kernel and fusion at its roofline (tpu_schedule.py)
            c = as_chip(chip)
            ops = price_ops(schedule, text, c)
            priced = sum(o["price_s"] for o in ops)
            ratios["cycles"] = max(priced / (model / c.hbm_bandwidth), 1.0)
            cycles = {"cycles": schedule.cycles(), "compute_s": schedule.cycles() / c.clock_hz,
                      "priced_s": priced, "model_bf16_bidir_s": predicted_time(
                          n, p, fmt=None, algorithm="bidir_ring", chip=chip, dtype=dtype),
                      "declared_bytes": sum(o["bytes"] for o in ops if o["declared"]),
                      "ops": sorted(ops, key=lambda o: -o["price_s"])[:5]}
        times = {label: priced_time(n, p, fmt=fmt, algorithm=algorithm, chip=chip, ratio=r,
                                    dtype=dtype, num_chunks=k)
                 for label, r in ratios.items()}
        out.append({
            "topology": topology, "algorithm": algorithm, "format": name or dtype,
            "num_chunks": k, "impl": impl, "n": n, "p": p, "dtype": jnp.dtype(dtype).name,
            "wire_bytes_hlo": sum(hlo_wire_bytes(text, p).values()),
            "wire_bytes": eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm, dtype=dtype,
                                        num_chunks=k, min_bytes=0),
            "bytes_accessed": accessed, "model_hbm_bytes": model,
            "plain_pass_bytes": 2 * n * jnp.dtype(dtype).itemsize,
            "ratio_to_model": ratio,
            "traffic": {"tally": traffic.total + kernels, "by_kind": traffic.by_kind,
                        "kernels": kernels, "vmem": traffic.vmem, "hbm": hbm,
                        "padding": traffic.padding},
            "hbm_ratio_to_model": hbm / model,
            "seconds": times,
            "permutes": len(pairs), "max_in_flight": max((q.in_flight for q in pairs), default=0),
            "fusions_between": [len(q.between) for q in pairs],
            "feeding_other_sends": [len(q.feeding) for q in pairs],
            **cycles,
        })
    base = next((r["seconds"] for r in out if r["algorithm"] == "psum"), None)
    for r in out:  # speedup over the bf16 psum, each time priced the same way
        r["speedup_over_psum"] = None if base is None else {
            label: base[label] / t for label, t in r["seconds"].items()}
    return out


def format_read_back(rows: list[dict]) -> str:
    """The read-back as a plain-text table: per topology x algorithm x format."""
    head = (f"{'topology':9s} {'algorithm':10s} {'impl':6s} {'format':9s} k {'wire=HLO':>8s} "
            f"{'accessed':>10s} {'model':>9s} {'ratio':>6s} {'HBM part':>8s} {'VMEM':>5s} "
            f"{'permutes':>8s} {'in flight':>9s} {'speedup model/priced':>21s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r["traffic"]
        speed = r.get("speedup_over_psum") or {}
        lines.append(
            f"{r['topology']:9s} {r['algorithm']:10s} {r['impl']:6s} {r['format']:9s} "
            f"{r['num_chunks']} "
            f"{'yes' if r['wire_bytes_hlo'] == r['wire_bytes'] else 'NO':>8s} "
            f"{r['bytes_accessed'] / 1e6:>7.0f} MB {r['model_hbm_bytes'] / 1e6:>6.0f} MB "
            f"{r['ratio_to_model']:>5.1f}x {r['hbm_ratio_to_model']:>7.1f}x "
            f"{t['vmem'] / t['tally']:>5.0%} {r['permutes']:>8d} {r['max_in_flight']:>9d} "
            f"{speed.get('model', 0):>9.2f} / {speed.get('hbm_only', 0):.2f}"
            f"-{speed.get('all', 0):.2f}")
    return "\n".join(lines)
