"""Misuse of the public API, table-driven (in the spirit of test_wrong.py's matrix).

Every argument of every public callable in `equarx_ref` belongs to a class of input (a count, a
format, an algorithm name, a chip, an axis name, ...); each class has its table of bad values;
every (argument, bad value) pair must be refused, where the argument enters, by a ValueError or
TypeError of one line that names the argument. Each callable is called with a good set of
arguments (checked to work), one replaced at a time.

`test_every_argument_has_a_class` reads the signatures: an argument added to a public function
without a class here fails it, so no argument skips its check.
"""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES

INT8 = eq.Format.int8()
X = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)


def _on_4_devices(body):
    """body() inside a jitted shard_map over 4 devices (axis "tp"); a bad argument is refused
    while tracing, where it enters."""
    mesh = eq.make_mesh(DEVICES[:4])
    return jax.jit(jax.shard_map(lambda _: body(), mesh=mesh, in_specs=P("tp"), out_specs=P(),
                                 check_vma=False))(jnp.zeros(4))


def _all_reduce(x, axis_name, **kw):
    return _on_4_devices(lambda: eq.all_reduce(x, axis_name, **kw))


def _all_reduce_object(x, axis_name, **kw):
    ar = eq.AllReduce(**kw)  # refused here, when built
    return _on_4_devices(lambda: ar(x, axis_name))


def _hlo() -> str:
    mesh = eq.make_mesh(DEVICES[:4])
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "tp"), mesh=mesh, in_specs=P("tp"),
                              out_specs=P()))
    return f.lower(jnp.zeros(8)).as_text()


# ---- each public callable, a good call, and the class of each argument -----------------------

ONE_SHOT = {"x": X, "axis_name": "tp", "algorithm": "one_shot"}  # the quickest to compile

#: name -> (what to call, signature to read, good keyword arguments)
CALLS = {
    "all_reduce": (_all_reduce, eq.all_reduce, ONE_SHOT),
    "AllReduce": (_all_reduce_object, eq.AllReduce, ONE_SHOT),
    "quantize": (eq.quantize, eq.quantize, {"x": X, "fmt": INT8}),
    "dequantize": (eq.dequantize, eq.dequantize, {"q": eq.quantize(X, INT8)}),
    "Format": (eq.Format, eq.Format, {"name": "int8"}),
    "Format.int8": (eq.Format.int8, eq.Format.int8, {}),
    "Format.int4": (eq.Format.int4, eq.Format.int4, {}),
    "Format.fp8_e4m3": (eq.Format.fp8_e4m3, eq.Format.fp8_e4m3, {}),
    "Format.fp8_e5m2": (eq.Format.fp8_e5m2, eq.Format.fp8_e5m2, {}),
    "Format.mxfp8": (eq.Format.mxfp8, eq.Format.mxfp8, {}),
    "Format.mxfp4": (eq.Format.mxfp4, eq.Format.mxfp4, {}),
    "Format.mxfp6": (eq.Format.mxfp6, eq.Format.mxfp6, {}),
    "Format.parse": (eq.Format.parse, eq.Format.parse, {"text": "int4/b16"}),
    "parse_format": (eq.parse_format, eq.parse_format, {"text": "int8"}),
    "format_label": (eq.format_label, eq.format_label, {"fmt": INT8}),
    "wire_bytes": (eq.wire_bytes, eq.wire_bytes,
                   {"n": 1000, "p": 4, "fmt": INT8, "algorithm": "ring"}),
    "predicted_relative_error": (eq.predicted_relative_error, eq.predicted_relative_error,
                                 {"p": 4, "fmt": INT8, "algorithm": "ring"}),
    "predicted_time": (eq.predicted_time, eq.predicted_time,
                       {"n": 1000, "p": 4, "fmt": INT8, "algorithm": "ring", "chip": "v5e"}),
    "best_num_chunks": (eq.best_num_chunks, eq.best_num_chunks,
                        {"n": 1000, "p": 4, "fmt": INT8, "algorithm": "ring", "chip": "v5e"}),
    "quantized_sizes": (eq.quantized_sizes, eq.quantized_sizes, {"p": 4, "algorithm": "ring"}),
    "gaussian_relative_error": (eq.gaussian_relative_error, eq.gaussian_relative_error,
                                {"fmt": INT8, "samples": 2048}),
    "hlo_wire_bytes": (eq.hlo_wire_bytes, eq.hlo_wire_bytes, {"hlo_text": _hlo(), "p": 4}),
    "make_schedule": (eq.make_schedule, eq.make_schedule, {"algorithm": "ring", "shape": (4,)}),
    "ring_schedule": (eq.ring_schedule, eq.ring_schedule, {"p": 4}),
    "bidir_ring_schedule": (eq.bidir_ring_schedule, eq.bidir_ring_schedule, {"p": 4}),
    "two_shot_schedule": (eq.two_shot_schedule, eq.two_shot_schedule, {"p": 4}),
    "one_shot_schedule": (eq.one_shot_schedule, eq.one_shot_schedule, {"p": 4}),
    "torus_schedule": (eq.torus_schedule, eq.torus_schedule, {"p1": 2, "p2": 2}),
    "simulate": (eq.simulate, eq.simulate, {"schedule": eq.ring_schedule(4)}),
    "layout": (eq.layout, eq.layout, {"n": 1000, "chunks": 4, "align": 32}),
    "setup_devices": (eq.setup_devices, eq.setup_devices, {}),
    "describe_devices": (eq.describe_devices, eq.describe_devices, {"devices": DEVICES}),
    "make_mesh": (eq.make_mesh, eq.make_mesh, {"devices": DEVICES[:4]}),
    "Chip": (eq.Chip, eq.Chip, {"name": "mine", "link_bandwidth": 1e11, "hop_latency": 1e-6,
                                    "hbm_bandwidth": 1e12, "peak_flops": 1e14}),
}

#: Records the library builds and hands out (a user reads them, never needs to build one).
RECORDS = {"Quantized", "Schedule", "Step", "Transfer"}

#: (callable, argument) -> class of input. The argument names match the signatures.
ARGUMENTS = {
    **{("all_reduce", a): c for a, c in [
        ("x", "float array"), ("axis_name", "axis name"), ("fmt", "format or None"),
        ("algorithm", "algorithm"), ("num_chunks", "count"), ("min_bytes", "size or None"),
        ("key", "key or None"), ("rotate", "bool"), ("hop_bits", "hop bits"),
        ("impl", "impl"), ("backward", "backward"), ("bucket_bytes", "count or None"),
        ("dtype", "float dtype or None")]},
    **{("AllReduce", a): c for a, c in [
        ("fmt", "format or None"), ("algorithm", "algorithm"), ("num_chunks", "count"),
        ("min_bytes", "size or None"), ("stochastic_seed", "seed or None"), ("rotate", "bool"),
        ("hop_bits", "hop bits"), ("impl", "impl"), ("backward", "backward"),
        ("bucket_bytes", "count or None"), ("dtype", "float dtype or None")]},
    ("quantize", "x"): "float array", ("quantize", "fmt"): "format",
    ("quantize", "key"): "key or None",
    ("dequantize", "q"): "quantized",
    ("Format", "name"): "format name", ("Format", "block_size"): "block size",
    ("Format", "scale_dtype"): "scale dtype", ("Format", "scale_rule"): "scale rule",
    **{(f"Format.{n}", a): c for n in ["int8", "int4", "fp8_e4m3", "fp8_e5m2"]
       for a, c in [("block_size", "block size"), ("scale_dtype", "scale dtype")]},
    **{(f"Format.{n}", a): c for n in ["mxfp8", "mxfp4", "mxfp6"]
       for a, c in [("block_size", "block size"), ("scale_rule", "scale rule")]},
    ("Format.mxfp6", "element"): "mxfp6 element",
    ("Format.parse", "text"): "format text", ("parse_format", "text"): "format text",
    ("format_label", "fmt"): "format or None",
    **{(f, a): c for f in ["wire_bytes", "predicted_time", "best_num_chunks"]
       for a, c in [("n", "size"), ("p", "devices"), ("fmt", "format or None"),
                    ("algorithm", "algorithm"), ("dtype", "value dtype")]},
    ("wire_bytes", "num_chunks"): "count", ("wire_bytes", "min_bytes"): "size",
    ("wire_bytes", "hop_bits"): "hop bits",
    ("predicted_time", "num_chunks"): "count", ("predicted_time", "chip"): "chip",
    ("best_num_chunks", "chip"): "chip", ("best_num_chunks", "max_chunks"): "count",
    ("predicted_relative_error", "p"): "devices",
    ("predicted_relative_error", "fmt"): "format or None",
    ("predicted_relative_error", "algorithm"): "algorithm",
    ("predicted_relative_error", "hop_bits"): "hop bits",
    ("quantized_sizes", "p"): "devices", ("quantized_sizes", "algorithm"): "algorithm",
    ("gaussian_relative_error", "fmt"): "format", ("gaussian_relative_error", "samples"):
        "sample count", ("gaussian_relative_error", "seed"): "seed",
    ("hlo_wire_bytes", "hlo_text"): "text", ("hlo_wire_bytes", "p"): "count",
    ("make_schedule", "algorithm"): "algorithm", ("make_schedule", "shape"): "mesh shape",
    **{(f"{n}_schedule", "p"): "count" for n in ["ring", "bidir_ring", "two_shot", "one_shot"]},
    ("torus_schedule", "p1"): "count", ("torus_schedule", "p2"): "count",
    ("torus_schedule", "bidirectional"): "bool",
    ("simulate", "schedule"): "schedule",
    ("layout", "n"): "size", ("layout", "chunks"): "count", ("layout", "align"): "count",
    ("layout", "num_chunks"): "count",
    ("setup_devices", "n"): "count",
    ("describe_devices", "devices"): "device list",
    ("make_mesh", "devices"): "device list", ("make_mesh", "axis_names"): "axis names",
    ("make_mesh", "shape"): "mesh shape or None",
    ("Chip", "name"): "text",
    **{("Chip", a): "positive number" for a in ["link_bandwidth", "hbm_bandwidth",
                                                  "peak_flops"]},
    ("Chip", "hop_latency"): "non-negative number",
    ("Chip", "links"): "count", ("Chip", "torus"): "torus",
    ("Chip", "source"): "text", ("Chip", "quantize_overhead"): "non-negative number",
    ("Chip", "codec_bandwidth"): "positive number or None",
}

#: An argument a message may name by what it holds: a format's text is "format ..." there.
NAMED_AS = {"text": "format"}

_COUNT = [0, -1, 2.5, "4", True, None]
_SIZE = [-1, 2.5, "4", True, None]
_FORMAT = ["int8", 8, eq.Format]
_POSITIVE = [0.0, -1.0, "1e9", None, float("nan"), float("inf")]

#: class of input -> bad values, each refused by every argument of the class
CLASSES = {
    "count": _COUNT,
    "count or None": _COUNT[:-1],
    "size": _SIZE,
    "size or None": _SIZE[:-1],
    "sample count": [1023, *_COUNT],
    "seed": [-1, 2.5, "0", True, None],
    "seed or None": [-1, 2.5, "0", True],
    "devices": [*_COUNT, (), (2, 2, 2), (0, 2), (2, "2"), [4.0]],
    "float array": ["abc", None, np.arange(8), np.ones((4, 8), bool)],
    "format": [*_FORMAT, None],
    "format or None": _FORMAT,
    "format name": ["int13", "int1", "", 8, None, "bf16", " int8"],
    "format text": ["int13", "", "  ", 8, None, b"int8", "int8/b0", "int8/q7", "int4/b7",
                    "mxfp8/f32", "int8/floor", "bf16/b32"],
    "block size": [0, -32, 2.5, "32", True, None, 1 << 17],
    "scale dtype": ["f16", "e4m3", 16, True],
    "scale rule": ["round", "", 5, None],
    "mxfp6 element": ["e4m3", 6, None],
    "algorithm": ["tree", "", None, 5, ["ring"]],
    "hop bits": ["wide", "", None, 5, True],
    "impl": ["tpu", "", None, 5],
    "backward": ["quantised", "", None, 5, True],
    "bool": [1, 0, "yes", None],
    "key or None": [5, "key", np.zeros(3, np.uint32), np.zeros(2, np.float32)],
    "axis name": [None, 5, "", ("tp", "tp"), ("tp", 5), ("a", "b", "c"), "nosuch", [], b"tp"],
    "chip": ["v9", "", ["v5e"], 5, None],
    "value dtype": ["int8", "floats", 5, None, "bool"],
    "float dtype or None": ["int8", "floats", 5, "bool", np.uint32],
    "quantized": [X, None, "q", (X, X)],
    "text": [5, None, b"text", ["a"]],
    "schedule": [None, "ring", 5, eq.ring_schedule],
    "mesh shape": [(0,), (2, 2, 2), (), "4", None, (2.5,), (-4,)],
    "mesh shape or None": [(0,), (3,), (2, 3), "4", (4.0,), (-4,), 4.0],
    "device list": [None, [], 5, ["cpu"], "cpu"],
    "axis names": [(), (5,), ("tp", "tp"), None, 5, ("tp", "")],
    "positive number": _POSITIVE,
    "positive number or None": _POSITIVE[:3] + _POSITIVE[4:],
    "non-negative number": [-1.0, "0", None, float("nan"), float("inf")],
    "torus": [(0,), (2.5,), "2x4", 4, (-2, 2), None],
}


def _public_callables() -> dict[str, object]:
    """Every callable `equarx_ref` exports (lazy subpackages aside), Format's constructors."""
    out = {}
    for name in eq.__all__:
        obj = getattr(eq, name) if name not in ("gemma", "kernels", "outliers", "viz") else None
        if callable(obj) and name not in RECORDS:
            out[name] = obj
    for name, obj in vars(eq.Format).items():
        if isinstance(obj, classmethod):
            out[f"Format.{name}"] = getattr(eq.Format, name)
    return out


def _parameters(sig_of) -> list[str]:
    return [n for n, p in inspect.signature(sig_of).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _cases():
    for (fn, arg), cls in ARGUMENTS.items():
        for i, bad in enumerate(CLASSES[cls]):
            yield pytest.param(fn, arg, bad, id=f"{fn}-{arg}-{cls}-{i}")


def test_every_argument_has_a_class():
    """A public callable missing from CALLS, or an argument without a class, fails here."""
    public = _public_callables()
    assert set(public) == set(CALLS), f"CALLS differs from the public callables: " \
        f"missing {sorted(set(public) - set(CALLS))}, extra {sorted(set(CALLS) - set(public))}"
    missing = [(fn, a) for fn, (_, sig_of, _) in CALLS.items() for a in _parameters(sig_of)
               if (fn, a) not in ARGUMENTS]
    extra = [k for k in ARGUMENTS if k[1] not in _parameters(CALLS[k[0]][1])]
    assert not missing and not extra, f"arguments without a class: {missing}; " \
        f"classed but not in the signature: {extra}"
    assert set(CLASSES) == set(ARGUMENTS.values()), "a class of input nobody uses, or unknown"


@pytest.mark.parametrize("fn", list(CALLS))
def test_the_good_call_works(fn):
    """The baseline each bad value is swapped into is itself accepted."""
    call, _, good = CALLS[fn]
    call(**good)


@pytest.mark.parametrize(("fn", "arg", "bad"), list(_cases()))
def test_bad_argument_one_line_naming_it(fn, arg, bad):
    call, _, good = CALLS[fn]
    with pytest.raises((ValueError, TypeError)) as e:
        call(**{**good, arg: bad})
    message = str(e.value)
    assert "\n" not in message.strip(), f"{fn}({arg}={bad!r}): more than one line: {message}"
    named = NAMED_AS.get(arg, arg)
    assert re.search(rf"\b{re.escape(named)}\b", message), \
        f"{fn}({arg}={bad!r}): the message does not name {named!r}: {message}"


#: Values each argument must still take (the checks are not stricter than the API).
GOOD = [
    ("parse_format", "text", " INT8 "), ("parse_format", "text", " BF16 "),
    ("Format.parse", "text", "Int4/B16/F32"), ("Format", "scale_dtype", "float32"),
    ("Format.int8", "scale_dtype", jnp.float32), ("Format.int8", "block_size", np.int64(16)),
    ("all_reduce", "key", jax.random.key(0)), ("all_reduce", "key", jax.random.PRNGKey(0)),
    ("all_reduce", "axis_name", ["tp"]), ("all_reduce", "min_bytes", 1 << 30),
    ("all_reduce", "x", X.astype(jnp.bfloat16)),
    ("wire_bytes", "dtype", jnp.float32), ("wire_bytes", "p", (2, 2)),
    ("predicted_time", "chip", eq.CHIPS["v6e"]), ("predicted_time", "dtype", np.float16),
    ("make_mesh", "shape", [2, 2]), ("make_schedule", "shape", [2, 2]),
    ("Chip", "torus", (2, 4)), ("Chip", "hop_latency", 0), ("Chip", "codec_bandwidth", 1e12),
]


@pytest.mark.parametrize(("fn", "arg", "value"), GOOD, ids=[f"{f}-{a}-{i}" for i, (f, a, _)
                                                           in enumerate(GOOD)])
def test_good_values_still_accepted(fn, arg, value):
    call, _, good = CALLS[fn]
    kw = {**good, arg: value}
    if fn == "make_mesh":
        kw["axis_names"] = ("a", "b")
    if fn == "make_schedule":
        kw["algorithm"] = "bidir_ring"
    call(**kw)


#: Configurations wrong only together: `all_reduce` and `AllReduce` refuse each with the same
#: message (one rule set), and accept the same ones.
CONFIGS = [
    ({"fmt": None, "min_bytes": -1}, "min_bytes"),
    ({"algorithm": "psum", "fmt": None, "min_bytes": -1}, "min_bytes"),
    ({"algorithm": "psum", "fmt": None, "min_bytes": 2.0}, "min_bytes"),
    ({"algorithm": "psum"}, "psum"),
    ({"algorithm": "psum", "fmt": None, "num_chunks": 2}, "num_chunks"),
    ({"algorithm": "two_shot", "num_chunks": 2}, "num_chunks"),
    ({"fmt": None, "rotate": True}, "rotate"),
    ({"fmt": None, "hop_bits": "adaptive"}, "hop_bits"),
    ({"fmt": eq.Format.mxfp8(), "hop_bits": "adaptive"}, "fmt"),
    ({"fmt": eq.Format("int8", 24), "rotate": True}, "block size"),
    ({"impl": "pallas", "algorithm": "two_shot"}, "impl"),
    ({"impl": "pallas", "rotate": True}, "impl"),
    ({"fmt": None, "min_bytes": 0}, None),
    ({"algorithm": "psum", "fmt": None, "min_bytes": 10}, None),
    ({"fmt": None, "algorithm": "one_shot", "num_chunks": 1}, None),
]


@pytest.mark.parametrize(("config", "word"), CONFIGS,
                         ids=[" ".join(f"{k}={v}" for k, v in c.items()) for c, _ in CONFIGS])
def test_all_reduce_and_AllReduce_share_one_rule_set(config, word):
    outcomes = []
    for call in (_all_reduce, _all_reduce_object):
        try:
            call(X, "tp", **config)
            outcomes.append(None)
        except (ValueError, TypeError) as e:
            outcomes.append((type(e), str(e)))
    assert outcomes[0] == outcomes[1], f"all_reduce and AllReduce differ: {outcomes}"
    if word is None:
        assert outcomes[0] is None
    else:
        assert outcomes[0] is not None and word in outcomes[0][1], outcomes[0]
