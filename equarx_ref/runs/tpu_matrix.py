"""The compile matrix: every configuration of the package compiled for a TPU, and the command.

So "compiles for TPU" is a fact checked here, not a hope: `compile_matrix(topology)` compiles
every algorithm x format of the XLA path, the 2D torus, the remedies, every Pallas kernel x
format and the tensor-parallel Gemma forward with libtpu's compilers (`tpu_compile.py`: from a
CPU machine, nothing runs), and reports each as compiled or with the compiler's first line of
complaint. `run` is `equarx-ref kernels --compile v5e:2x4`: the table, with `--read-back`
the TPU programs read back against the models (`tpu_readback.py`), with `--bytes` XLA:TPU's
bytes accessed by the codec and the AllReduces over their floors (`tpu_bytes.py`), with
`--schedule` the chip's own schedule read back (`tpu_schedule.py`: the yardsticks, the codec's
kernels, and on v5e the AllReduces at 16 MiB per chip, priced with their cycles); the TPU
compile tier of tests/run.sh fails on any error.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from collections.abc import Callable

import jax

import equarx_ref as eq

from .._checks import count
from ..models.hlo import hlo_wire_bytes
from . import tpu_schedule
from .tpu_bytes import byte_ratios, format_byte_ratios
from .tpu_compile import (
    LibtpuMissing,
    compile_all_reduce,
    compile_codec,
    compile_gemma,
    libtpu_version,
    prepare_environment,
    source_digest,
    tpu_devices,
)
from .tpu_readback import AT_SCALE, AT_SCALE_N, format_read_back, read_back

__all__ = ["CODEC_FORMATS", "FAMILIES", "FORMATS", "SCALE_TOPOLOGY", "CompileResult",
           "compile_matrix", "format_table", "run"]


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """One configuration compiled for one topology.

    Attributes:
        topology: e.g. "v5e:2x4".
        family: one of `FAMILIES`.
        case: what was compiled, e.g. "ring int8 bf16 p=8 n=4096 k=1".
        ok: the compiler produced an executable.
        seconds: compile wall time (this machine, CPU).
        error: the compiler's first line of complaint, "" when ok.
        read: what was read off the compiled program, so that a test takes it from the stored
            report rather than compiling the program again: for an AllReduce,
            "all_reduce" (its arguments) and "wire_bytes_hlo" (the bytes one chip's
            collectives send, `hlo.hlo_wire_bytes` summed); empty otherwise.
    """

    topology: str
    family: str
    case: str
    ok: bool
    seconds: float
    error: str = ""
    read: dict = dataclasses.field(default_factory=dict)


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if "Mosaic failed to compile" in text and len(lines) > 1:  # the reason follows the prefix
        text = text.split("Mosaic failed to compile TPU kernel:")[-1].strip() or lines[1]
    return f"{type(e).__name__}: {text}"[:300]


FORMATS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp6_e2m3", "mxfp4")
XLA_ALGORITHMS = ("ring", "bidir_ring", "two_shot", "one_shot")
#: The families of `matrix_cases`, in its order ("none" in `families=` selects none of them).
FAMILIES = ("xla", "torus", "remedy", "mosaic", "pallas", "codec", "gemma")
#: The topology `--schedule` reads the AllReduces back on at scale (`tpu_readback.AT_SCALE`).
SCALE_TOPOLOGY = "v5e:2x4"
#: The Mosaic codec's formats: those its kernels code (`kernels.tiles.supports`: 8-bit and
#: 4-bit elements) among `FORMATS`, and an f32 scale.
CODEC_FORMATS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp4", "int8/f32")


def matrix_cases(topology: str) -> list[tuple[str, str, Callable[[], object]]]:
    """(family, case, thunk lowering it for `topology`) for every configuration the compile
    tier covers; `.compile()` on what a thunk returns runs libtpu's compilers. Each program is
    compiled once in the tier: the codec's kernels and the AllReduces at 16 MiB per chip are
    the schedule read-back's (`tpu_schedule.py`), not this matrix's."""
    fmts = {name: eq.Format.parse(name) for name in FORMATS}
    cases = []

    def add(family, case, thunk):
        cases.append((family, case, functools.partial(thunk, lowered=True)))

    n = 4096 + 96  # per chip: whole blocks, not a multiple of p x 128 (an odd layout)
    add("xla", "psum bf16", functools.partial(
        compile_all_reduce, topology, n=n, fmt=None, algorithm="psum"))
    for algorithm in XLA_ALGORITHMS:
        for name, fmt in (("bf16", None), *fmts.items()):
            add("xla", f"{algorithm} {name} bf16", functools.partial(
                compile_all_reduce, topology, n=n, fmt=fmt, algorithm=algorithm))
    add("xla", "ring int8 f32", functools.partial(
        compile_all_reduce, topology, n=n, dtype="float32", fmt=fmts["int8"]))
    int8 = fmts["int8"]
    for algorithm in ("ring", "bidir_ring"):
        add("torus", f"{algorithm} int8 2x4 torus", functools.partial(
            compile_all_reduce, topology, n=n, fmt=int8, algorithm=algorithm, torus=True))
    add("remedy", "ring int8 num_chunks=4", functools.partial(
        compile_all_reduce, topology, n=n, fmt=int8, num_chunks=4))
    add("remedy", "ring int8 key= (stochastic)", functools.partial(
        compile_all_reduce, topology, n=n, fmt=int8, key=jax.random.key(0)))
    add("remedy", "ring int8 rotate=True", functools.partial(
        compile_all_reduce, topology, n=n, fmt=int8, rotate=True))
    add("remedy", "ring int8 hop_bits=adaptive", functools.partial(
        compile_all_reduce, topology, n=n, fmt=int8, hop_bits="adaptive"))
    # The collectives on the Mosaic codec's kernels: every schedule and kernel format, chunks
    # of 16 rows of 128 (the kernels' smallest tile), pipelined and not
    small = 8 * 16 * 128
    for algorithm in ("ring", "bidir_ring", "two_shot"):
        for name in CODEC_FORMATS:
            add("mosaic", f"{algorithm} {name} p=8 n={small}", functools.partial(
                compile_all_reduce, topology, n=small, fmt=eq.Format.parse(name),
                algorithm=algorithm, impl="mosaic"))
    add("mosaic", f"bidir_ring int8 p=8 n={2 * small} k=2", functools.partial(
        compile_all_reduce, topology, n=2 * small, fmt=int8, algorithm="bidir_ring",
        num_chunks=2, impl="mosaic"))
    # The Pallas ring kernel: every format at p = 8 both lanes; p, lengths and pipelining on
    # int8 (pieces of one row of 128, shorter than a register's sublanes, among them)
    for algorithm in ("ring", "bidir_ring"):
        for name, fmt in (("bf16", None), *((k, v) for k, v in fmts.items()
                                            if k in CODEC_FORMATS)):
            add("pallas", f"{algorithm} {name} p=8 n={n} k=2", functools.partial(
                compile_all_reduce, topology, n=n, fmt=fmt, algorithm=algorithm,
                num_chunks=2, impl="pallas"))
    for p, size, k in ((2, 1000, 1), (4, 4100, 4), (8, 8000, 4), (4, 1000, 2), (4, 300, 2)):
        add("pallas", f"ring int8 p={p} n={size} k={k}", functools.partial(
            compile_all_reduce, topology, n=size, p=p, fmt=int8, num_chunks=k, impl="pallas"))
    add("pallas", "ring f32 p=4 n=1000 k=2 (f32 input)", functools.partial(
        compile_all_reduce, topology, n=1000, p=4, dtype="float32", fmt=None, num_chunks=2,
        impl="pallas"))
    for name in CODEC_FORMATS:  # encode, decode, hop and reduce on small messages
        add("codec", f"Mosaic codec {name}", functools.partial(
            compile_codec, topology, eq.Format.parse(name), rows=256))
    for label, ar in (("psum", None),
                      ("ring int8 xla", eq.AllReduce(fmt=int8, min_bytes=0)),
                      ("ring int8 pallas", eq.AllReduce(fmt=int8, min_bytes=0, impl="pallas")),
                      ("two_shot int8", eq.AllReduce(fmt=int8, algorithm="two_shot",
                                                     min_bytes=0))):
        # 64 tokens: every reduction site of a prefill, and the Pallas case compiles in a
        # fraction of its time at 256 tokens
        add("gemma", f"Gemma 3 270M TP=4 seq=64 {label}", functools.partial(
            compile_gemma, topology, ar, seq=64))
    return cases


def _check_families(families) -> None:
    """None (every family) or names of `FAMILIES` ("none": no compile), else one line saying
    which are unknown: before libtpu is looked for, so a typo is named as such."""
    if families is None:
        return
    if isinstance(families, str):
        raise TypeError(f"families must be a tuple of names from {FAMILIES}, got {families!r}")
    unknown = sorted(set(families) - {*FAMILIES, "none"})
    if unknown:
        raise ValueError(f"unknown compile families {unknown}: choose from {FAMILIES}")


def compile_matrix(topology: str | tuple[str, ...], *, families: tuple[str, ...] | None = None,
                   jobs: int = 1, progress: Callable[[str], None] | None = None
                   ) -> list[CompileResult]:
    """Compile every case of `matrix_cases` (or those of `families`) for each topology.

    One process compiles for several chips (libtpu allows one process at a time, not one chip).
    Tracing and lowering run here, one case at a time; XLA:TPU and Mosaic run on `jobs`
    threads (they release the GIL: 2 jobs on 2 cores nearly halve the wall time). `seconds`
    is each case's lowering plus compile time."""
    topologies = (topology,) if isinstance(topology, str) else tuple(topology)
    _check_families(families)
    for t in topologies:
        tpu_devices(t)

    def build(lowered, reader):
        start = time.perf_counter()
        try:
            compiled = lowered.compile()
            seconds = time.perf_counter() - start
            return True, "", seconds, reader(compiled) if reader else {}
        except Exception as e:  # the compiler's complaint is the result
            return False, _first_line(e), time.perf_counter() - start, {}

    out: list = []
    with concurrent.futures.ThreadPoolExecutor(max(1, count(jobs, "jobs", minimum=1))) as pool:
        for t in topologies:
            for family, case, thunk in matrix_cases(t):
                if families is not None and family not in families:
                    continue
                if progress:
                    progress(f"{t} {family}: {case}")
                start = time.perf_counter()
                try:
                    done = pool.submit(build, thunk(), _reader(thunk))
                except Exception as e:  # refused while lowering (jax's or Pallas's checks)
                    done = concurrent.futures.Future()
                    done.set_result((False, _first_line(e), 0.0, {}))
                out.append((t, family, case, time.perf_counter() - start, done))
    return [CompileResult(t, family, case, ok, lowering + seconds, error, read)
            for t, family, case, lowering, done in out
            for ok, error, seconds, read in (done.result(),)]


def _reader(thunk) -> Callable[[object], dict] | None:
    """What to read off a case's compiled program (`CompileResult.read`): for an AllReduce
    (`compile_all_reduce`), its arguments and the bytes its collectives send per chip."""
    if not (isinstance(thunk, functools.partial) and thunk.func is compile_all_reduce):
        return None
    kw = thunk.keywords
    fmt = kw.get("fmt")
    args = {"n": kw["n"], "p": kw.get("p", 8), "dtype": str(kw.get("dtype", "bfloat16")),
            "format": None if fmt is None else str(fmt),
            **{k: v for k, v in kw.items() if k in ("algorithm", "num_chunks", "impl", "torus",
                                                    "rotate", "hop_bits")},
            **({"key": True} if kw.get("key") is not None else {})}

    def read(compiled) -> dict:
        sent = hlo_wire_bytes(compiled.as_text(), args["p"])
        return {"all_reduce": args, "wire_bytes_hlo": sum(sent.values())}

    return read


def format_table(results: list[CompileResult]) -> str:
    """A plain-text table: one row per case, one column per topology."""
    topologies = list(dict.fromkeys(r.topology for r in results))
    rows: dict[tuple[str, str], dict[str, CompileResult]] = {}
    for r in results:
        rows.setdefault((r.family, r.case), {})[r.topology] = r
    width = max((len(c) for _, c in rows), default=10)
    head = f"{'family':7s} {'case':{width}s} " + " ".join(f"{t:>12s}" for t in topologies)
    lines = [head, "-" * len(head)]
    errors = []
    for (family, case), by_topo in rows.items():
        cells = []
        for t in topologies:
            r = by_topo.get(t)
            cells.append(f"{'-':>12s}" if r is None else
                         f"{f'ok {r.seconds:.1f}s':>12s}" if r.ok else f"{'FAILED':>12s}")
            if r is not None and not r.ok:
                errors.append(f"{t} {family} {case}: {r.error}")
        lines.append(f"{family:7s} {case:{width}s} " + " ".join(cells))
    total = len(results)
    good = sum(r.ok for r in results)
    lines.append(f"{good} of {total} compiled" + ("" if good == total else "; failures:"))
    return "\n".join(lines + errors)




def run(topologies: tuple[str, ...], *, families: tuple[str, ...] | None = None,
        read_back_too: bool = False, bytes_mib: float | None = None, schedule: bool = False,
        jobs: int = 1, out=None,
        progress: Callable[[str], None] | None = None) -> tuple[int, dict]:
    """What `equarx-ref kernels --compile T1,T2` does: compile the matrix for every topology
    in one process, print the table (and the read-back, the byte ratios, the schedule read
    back: `tpu_schedule.py`), return (exit status, JSON report). Status 0 when everything
    compiled, 1 on any compile error, 2 when libtpu is missing or a topology is unknown (one
    line on stderr saying which)."""
    import sys

    out = out or sys.stdout
    _check_families(families)
    if schedule or read_back_too or bytes_mib is not None:  # bundle listings: before it loads
        tpu_schedule.enable_dump()
    try:
        prepare_environment(topologies[0])
        for t in topologies:
            tpu_devices(t)
    except LibtpuMissing as e:
        print(f"equarx-ref kernels: {e}", file=sys.stderr)
        return 2, {}
    except Exception as e:  # an unknown topology, or libtpu refusing to start
        first = (str(e).splitlines() or [""])[0]
        print(f"equarx-ref kernels: cannot describe TPU topology {t!r}: {first}",
              file=sys.stderr)
        return 2, {}
    results = compile_matrix(topologies, families=families, jobs=jobs, progress=progress)
    print(f"compiled with libtpu {libtpu_version()} (jax {jax.__version__}) for "
          f"{', '.join(topologies)}; nothing ran on a TPU", file=out)
    print(format_table(results), file=out)
    report = {"source_digest": source_digest(), "topologies": list(topologies),
              "jax": jax.__version__, "libtpu": libtpu_version(),
              "results": [dataclasses.asdict(r) for r in results]}
    if read_back_too:
        rows = [row for t in topologies for row in read_back(t, progress=progress)]
        report["read_back"] = rows
        print(f"the TPU programs read back ({rows[0]['n']} bf16 values per chip, "
              f"p = {rows[0]['p']}; ratio: XLA:TPU's bytes accessed / the model's HBM passes; "
              f"speedup over the bf16 psum: modelled / re-priced with XLA:TPU's bytes, "
              f"HBM part only - all):", file=out)
        print(format_read_back(rows), file=out)
    if bytes_mib is not None:
        report["bytes"] = byte_ratios(topologies, mib=bytes_mib, progress=progress)
        print(format_byte_ratios(report["bytes"]), file=out)
    if schedule:
        start = time.perf_counter()
        record = tpu_schedule.schedule_record(topologies, progress=progress)
        record["all_reduce"] = [row for t in topologies if t == SCALE_TOPOLOGY
                                for row in read_back(t, n=AT_SCALE_N, cases=AT_SCALE,
                                                     progress=progress)]
        record["seconds"] = time.perf_counter() - start
        report["schedule"] = record
        print(tpu_schedule.format_schedule(record), file=out)
    return (0 if all(r.ok for r in results) else 1), report
