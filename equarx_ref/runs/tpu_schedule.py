"""The TPU's own schedule, read back: what libtpu says each kernel and fusion costs in cycles.

XLA:TPU's `cost_analysis()` counts bytes, and for a Pallas kernel it reports the bytes the
kernel declares (`pl.CostEstimate`): a figure a program states about itself, blind to its work.
The chip's compiler says more. A TensorCore is an in-order VLIW machine and libtpu schedules
its bundles statically; with

    LIBTPU_INIT_ARGS="--xla_jf_dump_to=DIR --xla_jf_dump_llo_text=true
                      --xla_jf_dump_llo_pass_label_regex=final_bundles"

set before libtpu loads (`enable_dump`), every compile leaves a listing per kernel and fusion
(`models/bundles.py` reads them: bundles times loop trips, plus the matrix units' stalls).
Nothing runs; this is the schedule the chip would execute. Each piece of a program is priced

    compute  static cycles / clock          (Chip.clock_hz, from public figures)
    memory   its bytes / HBM bandwidth      a kernel's fewest bytes; a fusion's operands and
                                            results in their tiled layouts (hlo_memory)
    price    max(compute, memory)           the roofline of one kernel

and a program's price is the sum along its schedule (nothing overlaps in it: an upper bound
where DMAs overlap compute, a fair one for kernels that stream). A kernel's declared bytes are
used only where the program text gives nothing better (inside a collective, a kernel reads part
of a larger array), and are marked declared wherever they appear.

Trust comes from yardsticks (`yardsticks`), compiled the same way: XLA's bf16 matmul must come
out near the chip's peak FLOP/s (the MXU stall accounting: a bundle issues a multiply, the unit
takes a cycle per row), a Pallas `x + 1` and XLA's own `x + 1` fusion at or under their HBM
time. Two more yardsticks measure the layout itself: one naive int8 encoder (absmax / 127,
a division, no exactness rule) written as a Pallas kernel twice, once writing the old wire's
interleaved rows `u8[blocks, 34]` (`naive_rows34`: a block's 32 values in 32 lanes, reduced
across lanes, its 34 bytes shifted against them) and once the wire's two lane-dense operands
(`naive_two_operands`: a tile transposed once, a block down the sublanes of one lane), on the
same grid over the same bytes; each is stored with its bundles a grid step and the operations
of a step (`bundles.body_ops`), so what the layout costs is read off the schedule, not
asserted. Then the codec's kernels (`codec_rows`: encode, decode, hop and two-shot's reduce of
each format, 16 MiB of bf16 on one chip) are priced against the HBM time of their fewest bytes,
and the AllReduces (16 MiB per chip over 8 chips, `tpu_readback.AT_SCALE`) are read back
whole (`tpu_readback.read_back`, which reads the cycles with these functions wherever the
listings are dumped; `equarx-ref kernels --schedule` adds them to the record):
their static compute beside the time model's, and the model re-priced with every kernel's and
fusion's roofline (`tpu_readback.priced_time`). The figures are stored in
equarx_ref/data/tpu-schedule.json (`equarx-ref kernels --schedule`); the TPU tier of the tests
holds the targets to them.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

import equarx_ref as eq

from ..models.bundles import ProgramSchedule, body_ops, read_dump
from ..models.cost import as_chip
from ..models.hlo_memory import op_bytes
from .tpu_compile import (
    compile_on_chip,
    prepare_environment,
    tpu_devices,
)

__all__ = ["CODEC_FORMATS", "CODEC_KERNELS", "LAYOUT_STEP", "N", "codec_rows", "compiled_schedule",
           "dumping", "enable_dump", "format_schedule", "naive_rows34", "naive_two_operands",
           "price_ops", "schedule_record", "yardsticks"]

#: Values per chip the schedule is read at: 16 MiB of bf16.
N = 8 << 20
#: The formats whose kernels are priced (issue 50's list).
CODEC_FORMATS = ("int8", "fp8_e4m3", "int4", "mxfp8", "mxfp4")
#: The codec's kernels, each a program of its own.
CODEC_KERNELS = ("encode", "decode", "hop", "reduce")
_FLAGS = ("--xla_jf_dump_to={} --xla_jf_dump_llo_text=true "
          "--xla_jf_dump_llo_pass_label_regex=final_bundles")
_folder: pathlib.Path | None = None


def enable_dump() -> pathlib.Path:
    """Make libtpu write its final bundle listings into a folder of this process's, and return
    it. Must run before libtpu loads (its flags are read once): it refuses afterwards."""
    global _folder
    if _folder is not None:
        return _folder
    flags = os.environ.get("LIBTPU_INIT_ARGS", "")
    if tpu_devices.cache_info().currsize and "--xla_jf_dump_to" not in flags:
        raise RuntimeError("libtpu has loaded already (a TPU topology was made): "
                           "enable_dump() must run first")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="equarx-bundles-"))
    os.environ["LIBTPU_INIT_ARGS"] = f"{flags} {_FLAGS.format(folder)}".strip()
    _folder = folder
    return folder


def dumping() -> bool:
    """Whether libtpu writes its bundle listings in this process (`enable_dump` ran)."""
    return _folder is not None


def compiled_schedule(compile_thunk: Callable):
    """(compiled, its `ProgramSchedule`): runs `compile_thunk` with an empty dump folder and
    reads what libtpu wrote for it."""
    folder = enable_dump()
    for path in folder.iterdir():
        path.unlink()
    compiled = compile_thunk()
    return compiled, read_dump(folder)


def price_ops(schedule: ProgramSchedule, hlo_text: str, chip) -> list[dict]:
    """Each kernel and fusion the program calls, priced: {"op", "cycles", "compute_s",
    "bytes", "declared" (the bytes are a kernel's own declaration), "memory_s", "price_s"}."""
    chip = as_chip(chip)
    moved = op_bytes(hlo_text)
    rows = []
    for op, cycles in schedule.called().items():
        if op.startswith("<"):  # the runtime's own prologue and epilogue
            continue
        nbytes, declared = moved.get(op, (0.0, False))
        compute, memory = cycles / chip.clock_hz, nbytes / chip.hbm_bandwidth
        rows.append({"op": op, "cycles": cycles, "compute_s": compute, "bytes": nbytes,
                     "declared": declared, "memory_s": memory, "price_s": max(compute, memory)})
    return rows


def _program(topology: str, fn, args):
    compiled, schedule = compiled_schedule(lambda: compile_on_chip(topology, fn, args))
    return compiled, schedule


#: Values a grid step of the layout yardsticks codes: 32 rows of 4096 (rows of 34) or 1024
#: rows of 128 (two operands), so both walk the same grid over the same bytes.
LAYOUT_STEP = 32 * 4096


def _bf16_scale(amax):
    """(scale, its bf16 bits as int32): absmax / 127 rounded to the nearest bf16 by its bits,
    so that the scale divided by is the one written (XLA may drop an f32 -> bf16 -> f32
    round trip of converts as excess precision)."""
    from jax.experimental.pallas import tpu as pltpu

    bits = pltpu.bitcast(amax / 127, jnp.int32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000  # round to nearest even
    return pltpu.bitcast(bits, jnp.float32), bits >> 16


def naive_rows34(x, *, interpret=False):
    """A naive int8 encoder in the old wire's layout, a Pallas kernel (a yardstick, not the
    spec's bits): values bf16 `[rows, 4096]` (128 blocks of 32 a row) -> uint8
    `[rows, 128 x 34]`, each block's 32 codes followed by its bf16 scale's two bytes,
    little-endian, block after block: the canonical bytes, as a message used to travel
    (`u8[blocks, 34]` rows). Naive rounding: scale absmax / 127 rounded to bf16, codes
    round(x / scale) clipped to +-127 (`_bf16_scale`). Tiles of 32 rows (an 8-bit array's
    tile)."""
    from jax.experimental import pallas as pl

    rows, tile = x.shape[0], 32

    def body(x_ref, o_ref):
        blocks = x_ref[...].astype(jnp.float32).reshape(tile, 128, 32)  # 32 lanes a block
        scale, bits = _bf16_scale(jnp.max(jnp.abs(blocks), axis=-1, keepdims=True))
        codes = jnp.round(blocks / jnp.where(scale == 0, 1, scale))
        codes = jnp.clip(codes, -127, 127).astype(jnp.int32) & 0xFF
        row = jnp.concatenate([codes, bits & 0xFF, (bits >> 8) & 0xFF], axis=-1)  # [., 128, 34]
        o_ref[...] = row.reshape(tile, 128 * 34).astype(jnp.uint8)

    return pl.pallas_call(body, grid=(rows // tile,),
                          in_specs=[pl.BlockSpec((tile, 4096), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec((tile, 128 * 34), lambda i: (i, 0)),
                          out_shape=jax.ShapeDtypeStruct((rows, 128 * 34), jnp.uint8),
                          interpret=interpret)(x)


def naive_two_operands(x, *, interpret=False):
    """The same naive int8 encoder in the wire's layout (spec/wire.py), a Pallas kernel: values
    bf16 `[rows, 128]` -> (payload uint8 `[128, rows]`, scales uint16 `[4, rows]`). Each
    128 x 128 tile is transposed once, so block j of row r lies down sublanes 32 j .. 32 j + 31
    of lane r: its maximum is elementwise, and the codes are written as they lie. Same rounding
    as `naive_rows34`, same bytes; only the layout differs. Tiles of 1024 rows."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    rows, tile = x.shape[0], 1024

    def body(x_ref, p_ref, s_ref):
        blocks = x_ref[...].astype(jnp.float32).T.reshape(4, 32, tile)  # a block down a lane
        scale, bits = _bf16_scale(jnp.max(jnp.abs(blocks), axis=1, keepdims=True))
        codes = jnp.round(blocks / jnp.where(scale == 0, 1, scale))
        codes = jnp.clip(codes, -127, 127).astype(jnp.int32).reshape(128, tile)
        p_ref[...] = pltpu.bitcast(codes.astype(jnp.int8), jnp.uint8)
        s_ref[...] = bits.reshape(4, tile).astype(jnp.uint16)

    return pl.pallas_call(body, grid=(rows // tile,),
                          in_specs=[pl.BlockSpec((tile, 128), lambda i: (i, 0))],
                          out_specs=[pl.BlockSpec((128, tile), lambda i: (0, i)),
                                     pl.BlockSpec((4, tile), lambda i: (0, i))],
                          out_shape=[jax.ShapeDtypeStruct((128, rows), jnp.uint8),
                                     jax.ShapeDtypeStruct((4, rows), jnp.uint16)],
                          interpret=interpret)(x)


def _kernel_body(schedule: ProgramSchedule) -> dict:
    """The largest kernel a program calls, from the listing libtpu just wrote: its bundles a
    grid step ("body"), its loop's turns ("steps") and one step's ops (`bundles.body_ops`)."""
    name = max((k for k in schedule.called() if not k.startswith("<")),
               key=lambda k: schedule.called()[k])
    listing = schedule.listings[name]
    paths = sorted(enable_dump().glob(f"*-{name}-01-final_bundles.txt"))
    outer = max(listing.loops, key=lambda loop: loop[1] - loop[0])
    return {"body": listing.body(), "steps": outer[2],
            "ops": body_ops(paths[-1].read_text(encoding="utf-8")) if paths else {}}


def yardsticks(topology: str, *, n: int = N) -> list[dict]:
    """The checks the counting must pass before it is trusted: XLA's bf16 matmul (4096^3) in
    time against the chip's peak FLOP/s ("ratio": cycles' time over peak time, near 1), and a
    Pallas `x + 1` and XLA's `x + 1` fusion on n bf16 values against their HBM time (at most
    1: memory bound). Then the layout's yardsticks, one naive int8 encoder as a Pallas kernel
    in each layout (`naive_rows34`, `naive_two_operands`), against the HBM time of their
    fewest bytes (2n in, `nbytes(n)` out): the same arithmetic, so the difference is the
    layout's. One row each: {"topology", "program", "cycles", "compute_s", "reference_s",
    "ratio"}; a Pallas kernel's also "body" (bundles a grid step), "steps" (its loop's
    turns: the grid's steps and the software pipeline's two) and "ops" (a step's operations
    by mnemonic, `bundles.body_ops`)."""
    from jax.experimental import pallas as pl

    chip = as_chip(topology.split(":")[0])

    def pallas_x1(x):
        rows = x.reshape(-1, 128)

        def body(x_ref, o_ref):
            o_ref[...] = x_ref[...] + 1

        return pl.pallas_call(body, grid=(rows.shape[0] // 512,),
                              in_specs=[pl.BlockSpec((512, 128), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((512, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct(rows.shape, rows.dtype))(rows)

    m, step = 4096, LAYOUT_STEP
    n = n // step * step
    encoded = (2 * n + eq.Format("int8").nbytes(n)) / chip.hbm_bandwidth
    cases = [("matmul bf16 4096^3", lambda a, b: a @ b, (("bfloat16", (m, m)),) * 2,
              2 * m ** 3 / chip.peak_flops, False),
             ("pallas x + 1", pallas_x1, (("bfloat16", (n,)),), 4 * n / chip.hbm_bandwidth,
              True),
             ("xla x + 1", lambda x: x + 1, (("bfloat16", (n,)),), 4 * n / chip.hbm_bandwidth,
              False),
             ("pallas int8 rows of 34 (naive)", naive_rows34, (("bfloat16", (n // m, m)),),
              encoded, True),
             ("pallas int8 two operands (naive)", naive_two_operands,
              (("bfloat16", (n // 128, 128)),), encoded, True)]
    rows = []
    for name, fn, args, reference, kernel in cases:
        _, schedule = _program(topology, fn, args)
        cycles = schedule.cycles()
        compute = cycles / chip.clock_hz
        rows.append({"topology": topology, "program": name, "cycles": cycles,
                     "compute_s": compute, "reference_s": reference,
                     "ratio": compute / reference, **(_kernel_body(schedule) if kernel else {})})
    return rows


def codec_program(kernel: str, fmt, n: int, p: int = 8):
    """(function, argument shapes, fewest bytes) of one of the codec's kernels at n values."""
    from equarx_ref.kernels import codec

    (pb, rows), (g, _) = eq.wire.message_shapes(n, fmt)
    bits = {"bfloat16": "uint16", "float32": "uint32", "e8m0": "uint8"}[fmt.scale_dtype]
    message = (("uint8", (pb, rows)), (bits, (g, rows)))
    nbytes = fmt.nbytes(n)
    if kernel == "encode":
        return (lambda x: codec.encode(x.reshape(-1, 128), fmt, interpret=False),
                (("bfloat16", (n,)),), 2 * n + nbytes)
    if kernel == "decode":
        return (lambda a, s: codec.decode(eq.wire.Message(a, s), fmt, "bfloat16",
                                          interpret=False), message, nbytes + 2 * n)
    if kernel == "hop":
        return (lambda a, s, x: codec.hop(eq.wire.Message(a, s), x.reshape(-1, 128), fmt,
                                          interpret=False),
                (*message, ("bfloat16", (n,))), 2 * nbytes + 2 * n)
    stack = (("uint8", (p, pb, rows)), (bits, (p, g, rows)))
    return (lambda a, s: codec.reduce(eq.wire.Message(a, s), fmt, interpret=False), stack,
            (p + 1) * nbytes)


def codec_rows(topology: str, *, formats=CODEC_FORMATS, kernels=CODEC_KERNELS, n: int = N,
               progress: Callable[[str], None] | None = None) -> list[dict]:
    """Each codec kernel of each format as a program on one chip, n values (two-shot's reduce:
    of 8 messages of n / 8): {"topology", "format", "kernel", "n", "cycles", "compute_s",
    "fewest_bytes", "hbm_s", "ratio" (compute over HBM time: the kernel's price is the HBM
    time when it is at most 1)}."""
    chip = as_chip(topology.split(":")[0])
    rows = []
    for name in formats:
        fmt = eq.Format.parse(name)
        for kernel in kernels:
            if progress:
                progress(f"{topology} schedule: {kernel} {name}")
            values = n // 8 if kernel == "reduce" else n
            fn, args, fewest = codec_program(kernel, fmt, values)
            _, schedule = _program(topology, fn, args)
            cycles = schedule.cycles()
            compute, hbm = cycles / chip.clock_hz, fewest / chip.hbm_bandwidth
            rows.append({"topology": topology, "format": name, "kernel": kernel, "n": values,
                         "cycles": cycles, "compute_s": compute, "fewest_bytes": fewest,
                         "hbm_s": hbm, "ratio": compute / hbm})
    return rows


def schedule_record(topologies=("v5e:2x4", "v6e:2x4"), *, n: int = N,
                    formats=CODEC_FORMATS,
                    progress: Callable[[str], None] | None = None) -> dict:
    """The yardsticks and the codec's kernels on each topology, each chip's clock and HBM
    bandwidth and the libtpu that made them: the JSON record equarx_ref/data/tpu-schedule.json
    holds (`equarx-ref kernels --schedule` adds the AllReduces read back at scale under
    "all_reduce", tpu_matrix.py)."""
    from .tpu_compile import libtpu_version

    prepare_environment(topologies[0])
    start = time.perf_counter()
    chips = {t.split(":")[0]: as_chip(t.split(":")[0]) for t in topologies}
    record = {
        "libtpu": libtpu_version(), "jax": jax.__version__, "n": n,
        "chips": {k: {"clock_hz": c.clock_hz, "hbm_bandwidth": c.hbm_bandwidth,
                      "peak_flops": c.peak_flops} for k, c in chips.items()},
        "yardsticks": [r for t in topologies for r in yardsticks(t, n=n)],
        "codec": [r for t in topologies for r in codec_rows(t, formats=formats, n=n,
                                                            progress=progress)],
    }
    record["seconds"] = time.perf_counter() - start
    return record


def format_schedule(record: dict) -> str:
    """The record as plain-text tables."""
    lines = [f"Static schedule (libtpu {record.get('libtpu')}, jax {record.get('jax')}): "
             "cycles priced at each chip's clock, against HBM time", "",
             "yardsticks (ratio: the schedule's time over the reference: peak FLOP/s for the "
             "matmul, the HBM time of its fewest bytes for the others)"]
    for r in record["yardsticks"]:
        lines.append(f"  {r['topology']:9s} {r['program']:32s} {r['cycles']:>10,d} cycles "
                     f"{r['compute_s'] * 1e6:>8.1f} us  ref {r['reference_s'] * 1e6:>8.1f} us"
                     f"  {r['ratio']:>5.2f}x")
    lines += ["", f"codec kernels, {record['n'] * 2 / 2**20:g} MiB of bf16 (two-shot's reduce: "
              "8 messages of 1/8): static compute over the HBM time of the fewest bytes"]
    head = f"  {'topology':9s} {'format':9s} " + " ".join(f"{k:>8s}" for k in CODEC_KERNELS)
    lines.append(head)
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for r in record["codec"]:
        cells.setdefault((r["topology"], r["format"]), {})[r["kernel"]] = r["ratio"]
    for (topology, fmt), by in cells.items():
        lines.append(f"  {topology:9s} {fmt:9s} " + " ".join(
            f"{by[k]:>7.2f}x" if k in by else f"{'-':>8s}" for k in CODEC_KERNELS))
    lines += ["", "AllReduces, 8 chips, whole programs: static compute, the sum of the ops' "
              "rooflines, the time model's time and the model re-priced with them "
              "(modelled, not measured)"]
    for r in record["all_reduce"]:
        speed = (r.get("speedup_over_psum") or {}).get("cycles")
        lines.append(
            f"  {r['topology']:9s} {r['algorithm']:10s} {r['format']:9s} k={r['num_chunks']} "
            f"{r['impl']:6s} compute {r['compute_s'] * 1e6:>7.0f} us  priced "
            f"{r['priced_s'] * 1e6:>7.0f} us  model {r['seconds']['model'] * 1e6:>6.0f} us  "
            f"re-priced {r['seconds']['cycles'] * 1e6:>6.0f} us" +
            (f"  {speed:.2f}x psum" if speed else ""))
    return "\n".join(lines)
