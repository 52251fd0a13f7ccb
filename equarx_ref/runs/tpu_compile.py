"""Compiled for a TPU without one: libtpu's own compilers, run ahead of time from a CPU machine.

`pip install "jax[tpu]==<jax version>"` installs libtpu on any Linux machine. Its compilers need
no chip: `jax.experimental.topologies.get_topology_desc("v5e:2x4", platform="tpu")` describes a
slice with compile-only devices, a `Mesh` of them stands where real chips would, and

    jax.jit(f).trace(*shapes).lower().compile()

runs XLA:TPU (and, for a Pallas kernel, the Mosaic compiler) exactly as on the chip's host.
Nothing executes. What comes back is the TPU program: `as_text()` (its HLO, with the
asynchronous collective-permute-start / -done pairs and the fusions XLA scheduled between
them), `cost_analysis()` (XLA:TPU's own count of bytes accessed) and `memory_analysis()`.

So "compiles for TPU" is a fact checked here, not a hope: `compile_matrix(topology)` compiles
every algorithm x format of the XLA path, the 2D torus, the remedies, every Pallas kernel x
format and the tensor-parallel Gemma forward, and reports each as compiled or with the
compiler's first line of complaint; `equarx-ref kernels --compile v5e:2x4` prints it, and the
TPU compile tier of tests/run.sh fails on any error.

libtpu reads its settings from the environment when it loads, and only one process may hold it
at a time (a lock file): `prepare_environment()` sets the variables that keep it from asking a
metadata server (this is not a Cloud TPU VM) and keeps jax's default backend on the CPU.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import importlib.util
import os
import pathlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_ref as eq

from .._checks import count
from ..models.cost import as_chip, phases, predicted_time
from ..models.hlo import collective_overlap, hlo_wire_bytes
from ..models.hlo_memory import memory_traffic

__all__ = ["FAMILIES", "FORMATS", "READ_BACK", "TOPOLOGIES", "CompileResult", "LibtpuMissing",
           "compile_all_reduce", "compile_gemma", "compile_hop", "compile_matrix",
           "format_table", "libtpu_version", "model_hbm_bytes", "prepare_environment",
           "priced_time", "read_back", "run", "source_digest", "tpu_devices"]

#: The slices the compile tier targets (2D tori of 8 chips: what a v5e-8 / v6e-8 host has).
TOPOLOGIES = ("v5e:2x4", "v6e:2x4")

_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "localhost"}
_ACCELERATOR = {"v5e": "v5litepod-8", "v6e": "v6e-8", "v5p": "v5p-8", "v4": "v4-8"}


class LibtpuMissing(RuntimeError):
    """libtpu (the TPU compiler) is not installed in this environment."""


def source_digest() -> str:
    """sha256 (first 16 hex digits) of the package's Python sources: a stored compile record
    names the code it was made from, so a reader can tell whether it is current."""
    root = pathlib.Path(eq.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def libtpu_version() -> str | None:
    """The installed libtpu's version, or None when it is not installed."""
    if importlib.util.find_spec("libtpu") is None:
        return None
    from importlib import metadata

    try:
        return metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return "unknown"


def prepare_environment(topology: str = "v5e:2x4") -> None:
    """Set libtpu's environment for compiling without a chip (existing values win), and keep
    jax's default backend on the CPU when no backend has started yet. Raises `LibtpuMissing`."""
    if libtpu_version() is None:
        raise LibtpuMissing(f"libtpu is not installed: pip install \"jax[tpu]=={jax.__version__}\" "
                            "to compile for a TPU from this machine")
    chip = topology.split(":")[0]
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", _ACCELERATOR.get(chip, "v5litepod-8"))
    for name, value in _ENV.items():
        os.environ.setdefault(name, value)
    from jax._src import xla_bridge  # has a backend started already?

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")


@functools.cache
def tpu_devices(topology: str) -> tuple:
    """Compile-only devices of a TPU slice, e.g. "v5e:2x4" (8 chips)."""
    prepare_environment(topology)
    from jax.experimental import topologies

    return tuple(topologies.get_topology_desc(topology, platform="tpu").devices)


def _compile(fn: Callable, args, mesh: Mesh, lowered: bool = False):
    """Trace, lower and compile `fn` for the mesh's TPU devices (Pallas kernels see the
    mesh's platform, so they compile natively with Mosaic rather than interpret). With
    `lowered=True`, stop before compiling: the `Lowered`, whose `.compile()` may run on
    another thread (XLA:TPU compiles there with jax's tracing state left behind)."""
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        out = jax.jit(fn).trace(*args).lower()
    return out if lowered else out.compile()


def _mesh(topology: str, shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    devices = tpu_devices(topology)
    count = 1
    for s in shape:
        count *= s
    if count > len(devices):
        raise ValueError(f"{topology} has {len(devices)} chips, not {count}")
    import numpy as np

    return Mesh(np.array(devices[:count]).reshape(shape), names)


def compile_all_reduce(topology: str, *, n: int, p: int = 8, dtype="bfloat16",
                       torus: bool = False, lowered: bool = False, **options):
    """Compile `eq.all_reduce` over p chips of `topology` (a (2, p/2) torus with torus=True)
    for `n` values of `dtype` per chip; `options` are all_reduce's keywords. The compiled
    executable (`lowered=True`: the `Lowered`, not compiled yet); `min_bytes=0` unless given
    (the size gate would hide the quantized path)."""
    options.setdefault("min_bytes", 0)
    shape, names = ((2, p // 2), ("a", "b")) if torus else ((p,), ("x",))
    mesh = _mesh(topology, shape, names)
    axis = names if torus else names[0]
    key = options.pop("key", None)

    def body(v, *k):
        return eq.all_reduce(v, axis, key=k[0] if k else None, **options)

    # one flat array, n values per chip: a per-chip [1, n] would sit in tiles of 2 x 128 (bf16)
    # or 8 x 128 (f32) and double or octuple the bytes of every pass over it
    spec = P(names)
    arg = jax.ShapeDtypeStruct((p * n,), jnp.dtype(dtype), sharding=NamedSharding(mesh, spec))
    args = (arg,) if key is None else (arg, key)
    in_specs = (spec,) if key is None else (spec, P())
    fn = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=spec)
    return _compile(fn, args, mesh, lowered)


def compile_hop(topology: str, fmt: eq.Format, *, rows: int = 8, m: int = 1024,
                lowered: bool = False):
    """Compile the fused hop kernel (`kernels.fused_hop`) for one chip of `topology`."""
    from equarx_ref import kernels

    mesh = _mesh(topology, (1,), ("x",))
    on_chip = NamedSharding(mesh, P())
    wire = jax.ShapeDtypeStruct((rows, fmt.nbytes(m)), jnp.uint8, sharding=on_chip)
    local = jax.ShapeDtypeStruct((rows, m), jnp.bfloat16, sharding=on_chip)
    return _compile(lambda w, v: kernels.fused_hop(w, v, fmt, interpret=False), (wire, local),
                    mesh, lowered)


def compile_gemma(topology: str, all_reduce, *, p: int = 4, layers: int = 1, seq: int = 256,
                  lowered: bool = False):
    """Compile Gemma 3 270M's tensor-parallel forward (shapes only, `layers` layers, one
    sequence of `seq` tokens) with `all_reduce` at its reduction sites."""
    cfg = dataclasses.replace(eq.gemma.Gemma3Config.preset("270m"), num_layers=layers)
    mesh = _mesh(topology, (p,), ("tp",))
    shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), cfg.param_shapes(),
                          is_leaf=lambda s: isinstance(s, tuple))
    tokens = jax.ShapeDtypeStruct((1, seq), jnp.int32)
    return _compile(lambda w, t: eq.gemma.forward(w, t, cfg, mesh=mesh, all_reduce=all_reduce),
                    (shapes, tokens), mesh, lowered)


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """One configuration compiled for one topology.

    Attributes:
        topology: e.g. "v5e:2x4".
        family: "xla", "torus", "remedy", "pallas", "hop" or "gemma".
        case: what was compiled, e.g. "ring int8 bf16 p=8 n=4096 k=1".
        ok: the compiler produced an executable.
        seconds: compile wall time (this machine, CPU).
        error: the compiler's first line of complaint, "" when ok.
    """

    topology: str
    family: str
    case: str
    ok: bool
    seconds: float
    error: str = ""


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if "Mosaic failed to compile" in text and len(lines) > 1:  # the reason follows the prefix
        text = text.split("Mosaic failed to compile TPU kernel:")[-1].strip() or lines[1]
    return f"{type(e).__name__}: {text}"[:300]


FORMATS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp6_e2m3", "mxfp4")
XLA_ALGORITHMS = ("ring", "bidir_ring", "two_shot", "one_shot")
#: The families of `matrix_cases`, in its order ("none" in `families=` selects none of them).
FAMILIES = ("xla", "torus", "remedy", "pallas", "hop", "gemma")


def matrix_cases(topology: str) -> list[tuple[str, str, Callable[[], object]]]:
    """(family, case, thunk lowering it for `topology`) for every configuration the compile
    tier covers; `.compile()` on what a thunk returns runs libtpu's compilers."""
    fmts = {name: eq.Format.parse(name) for name in FORMATS}
    cases = []

    def add(family, case, thunk):
        cases.append((family, case, functools.partial(thunk, lowered=True)))

    n = 4096 + 96  # per chip: whole blocks, not a multiple of p x 128 (an odd layout)
    for dtype in ("bfloat16", "float32"):
        short = "bf16" if dtype == "bfloat16" else "f32"
        add("xla", f"psum {short}", functools.partial(
            compile_all_reduce, topology, n=n, dtype=dtype, fmt=None, algorithm="psum"))
        for algorithm in XLA_ALGORITHMS:
            for name, fmt in (("bf16" if dtype == "bfloat16" else "f32", None), *fmts.items()):
                add("xla", f"{algorithm} {name} {short}", functools.partial(
                    compile_all_reduce, topology, n=n, dtype=dtype, fmt=fmt,
                    algorithm=algorithm))
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
    # The Pallas kernels: every format at p = 8 both lanes; p, lengths and pipelining on int8.
    for algorithm in ("ring", "bidir_ring"):
        for name, fmt in (("bf16", None), *fmts.items()):
            add("pallas", f"{algorithm} {name} p=8 n={n} k=2", functools.partial(
                compile_all_reduce, topology, n=n, fmt=fmt, algorithm=algorithm,
                num_chunks=2, impl="pallas"))
    # p = 2, 4, 8; odd lengths; pieces of 32 and 64 values (shorter than a 128-lane tile row)
    for p, size, k in ((2, 1000, 1), (4, 4100, 4), (8, 8000, 4), (4, 1000, 2), (4, 300, 2)):
        add("pallas", f"ring int8 p={p} n={size} k={k}", functools.partial(
            compile_all_reduce, topology, n=size, p=p, fmt=int8, num_chunks=k, impl="pallas"))
    add("pallas", "ring f32 p=4 n=1000 k=2 (f32 input)", functools.partial(
        compile_all_reduce, topology, n=1000, p=4, dtype="float32", fmt=None, num_chunks=2,
        impl="pallas"))
    for name in ("bf16", "int4", "mxfp4"):  # short pieces in the narrowest formats too
        add("pallas", f"bidir_ring {name} p=4 n=300 k=2", functools.partial(
            compile_all_reduce, topology, n=300, p=4, fmt=fmts.get(name), num_chunks=2,
            algorithm="bidir_ring", impl="pallas"))
    for name, fmt in fmts.items():
        add("hop", f"fused hop {name}", functools.partial(compile_hop, topology, fmt))
    for label, ar in (("psum", None),
                      ("ring int8 xla", eq.AllReduce(fmt=int8, min_bytes=0)),
                      ("ring int8 pallas", eq.AllReduce(fmt=int8, min_bytes=0, impl="pallas")),
                      ("two_shot int8", eq.AllReduce(fmt=int8, algorithm="two_shot",
                                                     min_bytes=0))):
        # 64 tokens: every reduction site of a prefill (the Pallas case compiled in 14 s,
        # against 69 s at 256 tokens)
        add("gemma", f"Gemma 3 270M TP=4 seq=64 {label}", functools.partial(
            compile_gemma, topology, ar, seq=64))
    return cases


def compile_matrix(topology: str | tuple[str, ...], *, families: tuple[str, ...] | None = None,
                   jobs: int = 1, progress: Callable[[str], None] | None = None
                   ) -> list[CompileResult]:
    """Compile every case of `matrix_cases` (or those of `families`) for each topology.

    One process compiles for several chips (libtpu allows one process at a time, not one chip).
    Tracing and lowering run here, one case at a time; XLA:TPU and Mosaic run on `jobs`
    threads (they release the GIL: 2 jobs on 2 cores nearly halve the wall time). `seconds`
    is each case's lowering plus compile time."""
    topologies = (topology,) if isinstance(topology, str) else tuple(topology)
    unknown = sorted(set(families or ()) - {*FAMILIES, "none"})
    if unknown:
        raise ValueError(f"unknown compile families {unknown}: choose from {FAMILIES}")
    for t in topologies:
        tpu_devices(t)

    def build(lowered):
        start = time.perf_counter()
        try:
            lowered.compile()
            return True, "", time.perf_counter() - start
        except Exception as e:  # the compiler's complaint is the result
            return False, _first_line(e), time.perf_counter() - start

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
                    done = pool.submit(build, thunk())
                except Exception as e:  # refused while lowering (jax's or Pallas's checks)
                    done = concurrent.futures.Future()
                    done.set_result((False, _first_line(e), 0.0))
                out.append((t, family, case, time.perf_counter() - start, done))
    return [CompileResult(t, family, case, ok, lowering + seconds, error)
            for t, family, case, lowering, done in out
            for ok, error, seconds in (done.result(),)]


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


# ---- the TPU program read back ----------------------------------------------------------------

#: (algorithm, format name or None, num_chunks) that `read_back` compiles and reads.
READ_BACK = (("psum", None, 1), ("ring", None, 1),
             *((a, f, 1) for a in ("ring", "bidir_ring", "two_shot", "one_shot")
               for f in ("int8", "int4", "fp8_e4m3", "mxfp8")),
             ("ring", "int8", 4))


def model_hbm_bytes(n: int, p: int, *, fmt, algorithm: str, dtype="bfloat16",
                    num_chunks: int = 1) -> float:
    """Bytes of HBM traffic the time model prices for one AllReduce on one chip: its memory
    passes (`cost.phases`), each hop's pass counted once per hop."""
    return float(sum(ph.hbm_bytes * max(ph.hops, 1) for ph in phases(
        n, p, fmt=fmt, algorithm=algorithm, dtype=dtype, num_chunks=num_chunks)))


def priced_time(n: int, p: int, *, fmt, algorithm: str, chip: str, ratio: float,
                dtype="bfloat16", num_chunks: int = 1) -> float:
    """The time model's seconds with every memory pass `ratio` times the bytes it prices: the
    model re-priced with the traffic XLA:TPU's program really has (a modelled figure)."""
    c = as_chip(chip)
    slow = dataclasses.replace(c, hbm_bandwidth=c.hbm_bandwidth / ratio,
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
    for algorithm, name, k in cases:
        fmt = None if name is None else eq.Format.parse(name)
        if progress:
            progress(f"{topology} read back: {algorithm} {name or dtype} k={k}")
        compiled = compile_all_reduce(topology, n=n, p=p, dtype=dtype, fmt=fmt,
                                      algorithm=algorithm, num_chunks=k)
        text = compiled.as_text()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        accessed = float(cost.get("bytes accessed", float("nan")))
        traffic = memory_traffic(text)
        model = model_hbm_bytes(n, p, fmt=fmt, algorithm=algorithm, dtype=dtype, num_chunks=k)
        pairs = collective_overlap(text)
        ratio, hbm_ratio = accessed / model, max(traffic.hbm / model, 1.0)
        times = {label: priced_time(n, p, fmt=fmt, algorithm=algorithm, chip=chip, ratio=r,
                                    dtype=dtype, num_chunks=k)
                 for label, r in (("model", 1.0), ("hbm_only", hbm_ratio), ("all", ratio))}
        out.append({
            "topology": topology, "algorithm": algorithm, "format": name or dtype,
            "num_chunks": k, "n": n, "p": p, "dtype": jnp.dtype(dtype).name,
            "wire_bytes_hlo": sum(hlo_wire_bytes(text, p).values()),
            "wire_bytes": eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm, dtype=dtype,
                                        num_chunks=k),
            "bytes_accessed": accessed, "model_hbm_bytes": model,
            "plain_pass_bytes": 2 * n * jnp.dtype(dtype).itemsize,
            "ratio_to_model": ratio,
            "traffic": {"tally": traffic.total, "by_kind": traffic.by_kind,
                        "vmem": traffic.vmem, "hbm": traffic.hbm, "padding": traffic.padding},
            "hbm_ratio_to_model": traffic.hbm / model,
            "seconds": times,
            "permutes": len(pairs), "max_in_flight": max((q.in_flight for q in pairs), default=0),
            "fusions_between": [len(q.between) for q in pairs],
            "feeding_other_sends": [len(q.feeding) for q in pairs],
        })
    base = next((r["seconds"] for r in out if r["algorithm"] == "psum"), None)
    for r in out:  # speedup over the bf16 psum, each time priced the same way
        r["speedup_over_psum"] = None if base is None else {
            label: base[label] / t for label, t in r["seconds"].items()}
    return out


def format_read_back(rows: list[dict]) -> str:
    """The read-back as a plain-text table: per topology x algorithm x format."""
    head = (f"{'topology':9s} {'algorithm':10s} {'format':9s} k {'wire=HLO':>8s} "
            f"{'accessed':>10s} {'model':>9s} {'ratio':>6s} {'HBM part':>8s} {'VMEM':>5s} "
            f"{'permutes':>8s} {'in flight':>9s} {'speedup model/priced':>21s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r["traffic"]
        speed = r.get("speedup_over_psum") or {}
        lines.append(
            f"{r['topology']:9s} {r['algorithm']:10s} {r['format']:9s} {r['num_chunks']} "
            f"{'yes' if r['wire_bytes_hlo'] == r['wire_bytes'] else 'NO':>8s} "
            f"{r['bytes_accessed'] / 1e6:>7.0f} MB {r['model_hbm_bytes'] / 1e6:>6.0f} MB "
            f"{r['ratio_to_model']:>5.1f}x {r['hbm_ratio_to_model']:>7.1f}x "
            f"{t['vmem'] / t['tally']:>5.0%} {r['permutes']:>8d} {r['max_in_flight']:>9d} "
            f"{speed.get('model', 0):>9.2f} / {speed.get('hbm_only', 0):.2f}"
            f"-{speed.get('all', 0):.2f}")
    return "\n".join(lines)


def run(topologies: tuple[str, ...], *, families: tuple[str, ...] | None = None,
        read_back_too: bool = False, jobs: int = 1, out=None,
        progress: Callable[[str], None] | None = None) -> tuple[int, dict]:
    """What `equarx-ref kernels --compile T1,T2` does: compile the matrix for every topology
    in one process, print the table (and the read-back), return (exit status, JSON report).
    Status 0 when everything compiled, 1 on any compile error, 2 when libtpu is missing or a
    topology is unknown (one line on stderr saying which)."""
    import sys

    out = out or sys.stdout
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
    return (0 if all(r.ok for r in results) else 1), report
