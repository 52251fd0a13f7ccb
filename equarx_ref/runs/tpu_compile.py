"""Compiled for a TPU without one: libtpu's own compilers, run ahead of time from a CPU machine.

`pip install "jax[tpu]==<jax version>"` installs libtpu on any Linux machine. Its compilers need
no chip: `jax.experimental.topologies.get_topology_desc("v5e:2x4", platform="tpu")` describes a
slice with compile-only devices, a `Mesh` of them stands where real chips would, and

    jax.jit(f).trace(*shapes).lower().compile()

runs XLA:TPU (and, for a Pallas kernel, the Mosaic compiler) exactly as on the chip's host.
Nothing executes. What comes back is the TPU program: `as_text()` (its HLO, with the
asynchronous collective-permute-start / -done pairs and the fusions XLA scheduled between
them), `cost_analysis()` (XLA:TPU's own count of bytes accessed) and `memory_analysis()`.

This module compiles one program: an AllReduce (`compile_all_reduce`), the Mosaic codec's
kernels (`compile_codec`), any function on one chip (`compile_on_chip`) or the tensor-parallel
Gemma forward (`compile_gemma`). Every configuration of
the package compiled and tabled is `tpu_matrix.py`; the TPU program read back against the models
(wire bytes, overlap, memory traffic) is `tpu_readback.py`.

libtpu reads its settings from the environment when it loads, and only one process may hold it
at a time (a lock file): `prepare_environment()` sets the variables that keep it from asking a
metadata server (this is not a Cloud TPU VM) and keeps jax's default backend on the CPU.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.util
import os
import pathlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from equarx_ref._jax_private import private

__all__ = ["TOPOLOGIES", "LibtpuMissing", "compile_all_reduce", "compile_codec", "compile_gemma",
           "compile_on_chip", "libtpu_version", "prepare_environment", "source_digest",
           "tpu_devices"]

#: The slices the compile tier targets (2D tori of 8 chips: what a v5e-8 / v6e-8 host has).
TOPOLOGIES = ("v5e:2x4", "v6e:2x4")

_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "localhost"}
_ACCELERATOR = {"v5e": "v5litepod-8", "v6e": "v6e-8", "v5p": "v5p-8", "v4": "v4-8"}


class LibtpuMissing(RuntimeError):
    """libtpu (the TPU compiler) is not installed in this environment."""


def source_digest() -> str:
    """sha256 (first 16 hex digits) of the package's Python code: a stored compile record names
    the code it was made from, so a reader can tell whether it is current. Each module is
    hashed as its syntax tree without docstrings (comments never reach it), as the stored
    results' provenance hashes code: an edited essay leaves the digest as it was."""
    root = pathlib.Path(eq.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)) and body \
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" +
                      ast.dump(tree).encode())
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
    started = private("jax._src.xla_bridge:backends_are_initialized", None)  # no public name
    if started is not None and not started():  # unknown: leave the platforms alone
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


def compile_codec(topology: str, fmt: eq.Format, *, rows: int = 2048, lowered: bool = False):
    """Compile the Mosaic codec's four kernels (`kernels.codec`) as one program for one chip of
    `topology`: encode, decode (to bf16), a hop, on a message of `rows` rows of 128 values
    (the kernels' tiles, read as the collectives hand them), and two-shot's reduce of 8 such
    messages."""
    from equarx_ref.kernels import codec

    mesh = _mesh(topology, (1,), ("x",))
    on_chip = NamedSharding(mesh, P())
    n = rows * 128
    (pb, _), (g, _) = eq.wire.message_shapes(n, fmt)
    bits = {"bfloat16": jnp.uint16, "float32": jnp.uint32, "e8m0": jnp.uint8}[fmt.scale_dtype]
    shapes = [jax.ShapeDtypeStruct((pb, rows), jnp.uint8, sharding=on_chip),
              jax.ShapeDtypeStruct((g, rows), bits, sharding=on_chip),
              jax.ShapeDtypeStruct((rows, 128), jnp.bfloat16, sharding=on_chip)]

    def every_kernel(payload, scales, x):
        message = eq.wire.Message(payload, scales)
        stack = jax.tree.map(lambda a: jnp.stack([a] * 8), message)
        return (codec.encode(x, fmt, interpret=False),
                codec.decode(message, fmt, jnp.bfloat16, interpret=False),
                codec.hop(message, x, fmt, interpret=False),
                codec.reduce(stack, fmt, interpret=False))

    return _compile(every_kernel, shapes, mesh, lowered)


def compile_on_chip(topology: str, fn: Callable, args, *, lowered: bool = False):
    """Compile `fn` for one chip of `topology`; `args` are (dtype, shape) pairs, each array
    placed whole on that chip."""
    mesh = _mesh(topology, (1,), ("x",))
    on_chip = NamedSharding(mesh, P())
    shapes = tuple(jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=on_chip)
                   for dtype, shape in args)
    return _compile(fn, shapes, mesh, lowered)


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
