"""`equarx-ref check`: the package on the chip in front of you, bitwise against the spec.

Every check format (the public `FORMAT_NAMES`, a six-bit MX float, a bit-packed odd width and
an f32 scale) quantizes every data class of the spec (`spec.data`) on the default device under
`jit`, by both of the package's paths to the wire, `to_bytes(quantize(x))` and `wire.encode`
(the collectives'), and with stochastic rounding (`quantize(x, key=...)`, the spec given the
same uniforms: jax's PRNG draws the same bits on every backend); the bytes, and the
dequantized values, must be the spec's to the bit (a non-finite block's scale bytes excepted:
any NaN or infinity). The Mosaic codec's kernels (`kernels.codec`: natively on a TPU, in TPU
interpret mode elsewhere) encode and decode the same classes, a row each, for every check
format they compile for, and so do the GPU codec's (`kernels.gpu`: natively on a GPU,
interpreted elsewhere) for the 8-bit and 4-bit formats they code. Then a small `all_reduce` on
the devices `setup_devices` gives, against the spec's sum of its schedule. A difference names
the first differing block: its values, the expected and the received bytes. A `progress`
callback hears of each part as it starts (`equarx-ref check` prints them, as `demo` does):
the whole check compiles a few dozen programs, which takes a minute on a laptop CPU.
`equarx-ref check --formats NAME ...` checks only those formats (any `Format.parse` reads),
and runs only the all_reduce cases in them (`reduce_cases`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from .. import spec
from ..collectives import all_reduce
from ..devices import make_mesh
from ..formats import FORMAT_NAMES, Format
from ..quantize import dequantize, quantize
from ..schedule import make_schedule
from ..spec import data
from ..wire import encode, to_bytes

#: The formats checked: the public names, and one each of six-bit MX, odd width, f32 scale.
CHECK_FORMATS = (*FORMAT_NAMES, "mxfp6_e2m3", "int7/b8", "int8/f32")
#: The all_reduce cases: (algorithm, format, values per device, impl); "mosaic" codes its
#: messages with the Mosaic codec's kernels (natively on a TPU), whole rows of blocks on 8
#: devices.
REDUCE_CASES = (("ring", "int8", 1000, "xla"), ("one_shot", "int4/b16", 999, "xla"),
                ("two_shot", "mxfp8", 999, "xla"), ("ring", "int8", 8192, "mosaic"),
                ("two_shot", "mxfp4", 8192, "mosaic"))


def reduce_cases(formats) -> tuple:
    """The cases of `REDUCE_CASES` whose format is one of `formats` (names as
    `Format.parse` reads them): what `equarx-ref check --formats` runs."""
    chosen = {Format.parse(name) for name in formats}
    return tuple(c for c in REDUCE_CASES if Format.parse(c[1]) in chosen)


#: The key of the stochastic-rounding check.
KEY = 0


@functools.cache
def _codec(fmt: Format):
    """jit of both paths to the wire and back, and of stochastic rounding: (to_bytes(quantize),
    encode's message (of whole rows: the padded values), dequantize, to_bytes(quantize(key)),
    the uniforms it drew)."""
    def run(x, padded):
        q, key = quantize(x, fmt), jax.random.key(KEY)
        uniforms = jax.random.uniform(key, padded.reshape(-1, fmt.block_size).shape)
        rows = jnp.pad(padded, (0, -padded.size % fmt.row))
        return (to_bytes(q), tuple(encode(rows, fmt)), dequantize(q),
                to_bytes(quantize(x, fmt, key=key)), uniforms)
    return jax.jit(run)


def _plain(values) -> list:
    """Floats for JSON, non-finite ones as text ("nan", "inf", "-inf")."""
    return [float(v) if np.isfinite(v) else str(v) for v in np.asarray(values, np.float64)]


def _first_block(fmt, x, want, got, fixed) -> dict:
    """The first block whose fixed bytes differ: its values, expected and received bytes."""
    per = fmt.bytes_per_block
    bad = np.flatnonzero((want != got) & fixed)[0] // per
    values = spec.to_blocks(x, fmt.block_size)[bad]
    return {"block": int(bad), "values": _plain(values),
            "expected": want[bad * per:(bad + 1) * per].tolist(),
            "got": got[bad * per:(bad + 1) * per].tolist()}


def _values_differ(fmt, x, expect, got, finite, path: str) -> dict | None:
    """The first value of `got` that is not the spec's `expect` (to the bit in a finite block,
    any non-finite value in a non-finite one), or None when there is none."""
    same = (got.view(np.uint32) == expect.view(np.uint32)) | ~finite & ~np.isfinite(got)
    if same.all():
        return None
    i = int(np.flatnonzero(~same)[0])
    return {"path": path, "block": i // fmt.block_size, "values": _plain(x[i:i + 1]),
            "expected": _plain(expect[i:i + 1]), "got": _plain(got[i:i + 1])}


def check_format(name: str) -> dict:
    """Every data class through the package and the spec for format `name`: {class: None
    when bitwise equal, else what differs first}."""
    fmt = Format.parse(name)
    out = {}
    for cls in data.CLASSES:
        x = data.make(cls, fmt)
        want = spec.quantize_blocks(spec.to_blocks(x, fmt.block_size), fmt)
        wire, fixed = spec.canonical_bytes(want), spec.fixed_bytes(want)
        padded = jnp.asarray(spec.to_blocks(x, fmt.block_size).ravel())
        got, message, values, rounded, u = _codec(fmt)(jnp.asarray(x), padded)
        got, values, rounded, u = (np.asarray(a) for a in (got, values, rounded, u))
        encoded = _canonical(*message, fmt)[:wire.size]  # the blocks of x, not the row's pad
        stochastic = spec.canonical_bytes(spec.quantize_blocks(
            spec.to_blocks(x, fmt.block_size), fmt, uniforms=u))
        expect = want.values.ravel()[: x.size]
        finite = np.repeat(want.finite, fmt.block_size)[: x.size]
        if not np.array_equal(got[fixed], wire[fixed]):
            out[cls] = {"path": "to_bytes(quantize(x))", **_first_block(fmt, x, wire, got, fixed)}
        elif not np.array_equal(encoded[fixed], wire[fixed]):
            out[cls] = {"path": "wire.encode", **_first_block(fmt, x, wire, encoded, fixed)}
        elif not np.array_equal(rounded[fixed], stochastic[fixed]):
            out[cls] = {"path": f"to_bytes(quantize(x, key=jax.random.key({KEY})))",
                        **_first_block(fmt, x, stochastic, rounded, fixed)}
        else:
            out[cls] = _values_differ(fmt, x, expect, values, finite, "dequantize")
    return out


def check_kernels(name: str, family: str = "mosaic") -> dict:
    """The encode and decode kernels of the Mosaic codec (`family="mosaic"`, natively on a
    TPU, else in interpret mode) or the GPU codec ("gpu", `_check_gpu_kernels`) on a message
    per data class: {class: None when bitwise the spec, else what differs first}."""
    if family == "gpu":
        return _check_gpu_kernels(name)
    if family != "mosaic":
        raise ValueError(f"family must be 'mosaic' or 'gpu', got {family!r}")
    from ..kernels import codec
    from ..wire import Message

    fmt = Format.parse(name)
    rows = 16  # rows of 128 values a class: the kernels' smallest tile
    xs = [spec.to_blocks(data.make(cls, fmt), fmt.block_size).ravel() for cls in data.CLASSES]
    values_in = np.zeros((len(xs), rows * 128), np.float32)
    for i, x in enumerate(xs):
        values_in[i, :x.size] = x
    qs = [spec.quantize_blocks(spec.to_blocks(r, fmt.block_size), fmt) for r in values_in]
    messages = [spec.message(q, fmt) for q in qs]
    stacked = Message(jnp.asarray(np.stack([p for p, _ in messages])),
                      jnp.asarray(np.stack([s for _, s in messages])))
    encoded = jax.jit(lambda v: codec.encode(v, fmt, count=len(xs), stacked=True))(
        jnp.asarray(values_in.reshape(-1, 128)))
    values = np.asarray(jax.jit(lambda w: codec.decode(w, fmt))(stacked)).reshape(len(xs), -1)
    return _compare_kernels(fmt, values_in, qs, encoded, values, "kernels.codec")


def _case_name(algorithm: str, name: str, p: int, impl: str) -> str:
    return f"{algorithm} {name} p={p}" + (f" ({impl})" if impl != "xla" else "")


def _canonical(payload, scales, fmt) -> np.ndarray:
    """A message's canonical bytes (spec/wire.py): block after block, payload then scale."""
    blocks, stored = spec.from_message(np.asarray(payload), np.asarray(scales), fmt)
    return np.concatenate([blocks, spec.scale_bytes(stored)], axis=1).ravel()


def _check_gpu_kernels(name: str) -> dict:
    """`check_kernels` for the GPU codec (`kernels.gpu`): a message of whole rows per data
    class, encoded and decoded as one batch; a difference named in canonical bytes."""
    from ..kernels import gpu
    from ..wire import Message

    fmt = Format.parse(name)
    xs = [spec.to_blocks(data.make(cls, fmt), fmt.block_size).ravel() for cls in data.CLASSES]
    m = -(-max(x.size for x in xs) // fmt.row) * fmt.row
    rows = np.zeros((len(xs), m), np.float32)
    for i, x in enumerate(xs):
        rows[i, :x.size] = x
    qs = [spec.quantize_blocks(spec.to_blocks(r, fmt.block_size), fmt) for r in rows]
    messages = [spec.message(q, fmt) for q in qs]
    message = Message(jnp.asarray(np.stack([p for p, _ in messages])),
                      jnp.asarray(np.stack([s for _, s in messages])))
    encoded = jax.jit(functools.partial(gpu.encode, fmt=fmt))(jnp.asarray(rows))
    values = np.asarray(jax.jit(lambda w: gpu.decode(w, fmt, m))(message))
    return _compare_kernels(fmt, rows, qs, encoded, values, "kernels.gpu")


def _compare_kernels(fmt, rows, qs, encoded, values, kernels: str) -> dict:
    """A codec's kernels against the spec, a data class a row: `rows` the values encoded,
    `qs` the spec's quantized rows, `encoded` the kernels' stacked message, `values` what they
    decoded of the spec's messages. {class: None when bitwise the spec, else what differs
    first, by "<kernels>.encode" (in canonical bytes) or "<kernels>.decode"}."""
    out = {}
    for i, cls in enumerate(data.CLASSES):
        fixed, expect = spec.fixed_bytes(qs[i]), qs[i].values.ravel()
        want = spec.canonical_bytes(qs[i])
        got = _canonical(encoded.payload[i], encoded.scales[i], fmt)
        finite = np.repeat(qs[i].finite, fmt.block_size)
        if not np.array_equal(got[fixed], want[fixed]):
            out[cls] = {"path": f"{kernels}.encode",
                        **_first_block(fmt, rows[i], want, got, fixed)}
        else:
            out[cls] = _values_differ(fmt, rows[i], expect, values[i], finite,
                                      f"{kernels}.decode")
    return out


def check_all_reduce(devices, progress=None, cases=None) -> dict:
    """A small all_reduce per case of `cases` (default `REDUCE_CASES`) on `devices` against
    the spec's sum: {case: None or what differs first}. `progress(message)`, if given, hears
    of each case as it starts."""
    p = len(devices)
    mesh = make_mesh(devices, ("tp",))
    out = {}
    for algorithm, name, n, impl in REDUCE_CASES if cases is None else cases:
        if progress:
            progress(f"all_reduce {_case_name(algorithm, name, p, impl)}")
        fmt = Format.parse(name)
        x = np.random.default_rng(n).standard_normal((p, n)).astype(np.float32)
        want = spec.all_reduce(x, make_schedule(algorithm, (p,)), fmt)
        fn = jax.jit(jax.shard_map(lambda v, fmt=fmt, a=algorithm, i=impl: all_reduce(
            v[0], "tp", fmt=fmt, algorithm=a, impl=i)[None], mesh=mesh, in_specs=P("tp"),
            out_specs=P("tp"), check_vma=True))
        rows = np.asarray(fn(jnp.asarray(x)))
        bad = [(d, int(np.flatnonzero(r.view(np.uint32) != want.view(np.uint32))[0]))
               for d, r in enumerate(rows) if not np.array_equal(r.view(np.uint32),
                                                                 want.view(np.uint32))]
        key = _case_name(algorithm, name, p, impl)
        out[key] = None if not bad else {"device": bad[0][0], "index": bad[0][1],
                                         "expected": _plain(want[bad[0][1]:][:1]),
                                         "got": _plain(rows[bad[0][0], bad[0][1]:][:1])}
    return out


def check(devices, formats=CHECK_FORMATS, progress=None, cases=None) -> dict:
    """The whole check: {"device", "platform", "formats": {name: {class: None | diff}},
    "kernels": the same for the Mosaic codec, "gpu_kernels" for the GPU codec, "all_reduce":
    {case: None | diff} of `cases` (default `REDUCE_CASES`; `reduce_cases(formats)` picks
    those of some formats), "equal"}. `progress(message)`, if given, hears of each part (a
    format's data classes, a codec's kernels for one format, an all_reduce case) as it
    starts."""
    from ..kernels.gpu import FORMATS as GPU_FORMATS
    from ..kernels.tiles import supports

    def told(message: str, run):
        if progress:
            progress(message)
        return run()

    n = len(data.CLASSES)
    dev = jax.devices()[0]
    result = {"device": dev.device_kind, "platform": dev.platform,
              "formats": {name: told(f"{name}: {n} data classes, 3 paths to the wire",
                                     lambda name=name: check_format(name))
                          for name in formats},
              "kernels": {name: told(f"{name}: the Mosaic codec's kernels",
                                     lambda name=name: check_kernels(name))
                          for name in formats if supports(Format.parse(name))},
              "gpu_kernels": {name: told(f"{name}: the GPU codec's kernels",
                                         lambda name=name: check_kernels(name, "gpu"))
                              for name in formats if name in GPU_FORMATS},
              "all_reduce": check_all_reduce(devices, progress, cases),
              "reduce_devices": f"{len(devices)} {devices[0].platform} devices"}
    result["equal"] = all(v is None for part in ("formats", "kernels", "gpu_kernels")
                          for f in result[part].values() for v in f.values()) \
        and all(v is None for v in result["all_reduce"].values())
    return result
