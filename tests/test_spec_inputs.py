"""The spec as an oracle: every public function refuses a malformed question in one line.

Table-driven, as tests/test_arguments.py is for the package: each public function of
`equarx_ref.spec` has a good call (checked to work), and each of its arguments a table of bad
values (empty where emptiness makes no sense, 0-d, wrongly shaped, wrongly typed, out of
range), each refused by a ValueError or TypeError of one line that names the argument, raised
by a plain `if` (no `assert` anywhere in the spec: `python -O` would remove it). Then what an
empty input gives (an empty answer, not a crash), that `spec.all_reduce` counts the device
rows against its schedule, and that it is what `eq.all_reduce` returns with `min_bytes=0`
(the default size gate may send a short message unquantized: the spec's `fmt=None` sum).
"""

from __future__ import annotations

import ast
import inspect
import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import spec
from equarx_ref.spec import data, elements, formats, quantize, scale, sums, wire

ROOT = Path(__file__).resolve().parent.parent
INT8 = eq.Format.int8()
INT4 = types.SimpleNamespace(name="int4", block_size=8, scale_dtype="bfloat16")  # any object
BLOCKS = np.linspace(-1, 1, 4 * 32, dtype=np.float32).reshape(4, 32)
Q = spec.quantize_blocks(BLOCKS, INT8)
G, _ = spec.grid("int8")
MESSAGE = spec.message(Q, eq.Format.int8())
RING4 = eq.make_schedule("ring", (4,))
ROWS = np.linspace(-1, 1, 4 * 100, dtype=np.float32).reshape(4, 100)


def _format(**fields):
    return types.SimpleNamespace(**{"name": "int8", "block_size": 32,
                                    "scale_dtype": "bfloat16", **fields})


def _schedule(**fields):
    step = types.SimpleNamespace(time=0, phase="reduce", kind="all_gather", transfers=())
    base = {"p": 4, "chunk_count": 1, "owners": ((0, 1, 2, 3),), "steps": (step,)}
    return types.SimpleNamespace(**{**base, **fields})


#: name -> (function, good keyword arguments)
CALLS = {
    "formats.grid": (formats.grid, {"name": "int8"}),
    "formats.tiny_exponent": (formats.tiny_exponent, {"name": "fp8_e4m3"}),
    "formats.is_int": (formats.is_int, {"name": "mxfp4"}),
    "formats.scale_rule": (formats.scale_rule, {"fmt": INT8}),
    "formats.check_format": (formats.check_format, {"fmt": INT4}),
    "scale.pow2": (scale.pow2, {"k": np.arange(-3, 3)}),
    "scale.e8m0_exponent": (scale.e8m0_exponent, {"amax": np.array([0.5, 3.0]), "emax": 6.0}),
    "scale.smallest_covering": (scale.smallest_covering,
                                {"amax": np.array([0.5, 3.0]), "emax": 127.0,
                                 "scale_type": "bfloat16"}),
    "scale.block_scale": (scale.block_scale, {"amax": np.array([0.5, 3.0]), "fmt": INT8,
                                              "emax": 127.0, "tiny": np.array([False, False])}),
    "elements.nearest": (elements.nearest, {"a": np.abs(BLOCKS), "s": np.full(4, 2.0**-6),
                                            "G": G}),
    "elements.stochastic": (elements.stochastic, {"a": np.abs(BLOCKS), "s": np.full(4, 2.0**-6),
                                                  "G": G, "u": np.full(BLOCKS.shape, 0.5)}),
    "elements.codes": (elements.codes, {"idx": np.arange(8).reshape(2, 4),
                                        "negative": np.zeros((2, 4), bool), "bits": 4,
                                        "is_int": True}),
    "elements.pack": (elements.pack, {"codes": Q.codes, "bits": 8}),
    "elements.unpack": (elements.unpack, {"payload": Q.payload, "bits": 8, "block_size": 32}),
    "quantize.quantize_blocks": (quantize.quantize_blocks, {"x": BLOCKS, "fmt": INT8}),
    "quantize.to_blocks": (quantize.to_blocks, {"x": ROWS, "block_size": 32}),
    "quantize.round_trip": (quantize.round_trip, {"x": BLOCKS.ravel(), "fmt": INT8}),
    "wire.scale_bytes": (wire.scale_bytes, {"stored": Q.scales}),
    "wire.canonical_bytes": (wire.canonical_bytes, {"q": Q}),
    "wire.blocks_per_row": (wire.blocks_per_row, {"block_size": 32}),
    "wire.row_values": (wire.row_values, {"fmt": INT8}),
    "wire.payload_bytes": (wire.payload_bytes, {"fmt": INT8}),
    "wire.scale_bits": (wire.scale_bits, {"stored": Q.scales, "fmt": INT8}),
    "wire.message": (wire.message, {"q": Q, "fmt": INT8}),
    "wire.from_message": (wire.from_message, {"payload": MESSAGE[0], "scales": MESSAGE[1],
                                              "fmt": INT8}),
    "wire.fixed_bytes": (wire.fixed_bytes, {"q": Q}),
    "sums.all_reduce": (sums.all_reduce, {"x": ROWS, "schedule": RING4, "fmt": INT8}),
    "sums.check_schedule": (sums.check_schedule, {"schedule": RING4}),
    "data.make": (data.make, {"name": "ties", "fmt": INT8}),
}

_NAME = ["int13", "int1", "", "INT8", " int8", "bf16", 8, None, b"int8"]
_FORMAT = [None, "int8", 8, _format(name="int13"), _format(name=8), _format(block_size=0),
           _format(block_size=True), _format(block_size=2.5), _format(block_size=1 << 17),
           _format(name="int4", block_size=31), _format(scale_dtype="f16"),
           _format(name="mxfp8"), _format(scale_rule="floor"), _format(scale_rule="round"),
           types.SimpleNamespace(name="int8", block_size=32)]
_FLOATS = [None, "abc", np.arange(8), np.ones(8, bool), np.ones(8, complex),
           np.array([object()] * 8)]
_BLOCKS = [*_FLOATS, np.float32(1), np.ones(32, np.float32), np.ones((2, 31), np.float32),
           np.ones((1, 2, 32), np.float32)]

#: (function, argument) -> bad values
BAD = {
    **{(f"formats.{f}", "name"): _NAME for f in ("grid", "tiny_exponent", "is_int")},
    ("formats.scale_rule", "fmt"): _FORMAT, ("formats.check_format", "fmt"): _FORMAT,
    ("scale.pow2", "k"): [np.array([0.5]), np.array([True]), "3", None],
    ("scale.e8m0_exponent", "amax"): [*_FLOATS, np.array([-1.0]), np.array([np.nan])],
    ("scale.e8m0_exponent", "emax"): [0.0, -6.0, np.inf, "6", None, True],
    ("scale.smallest_covering", "amax"): [*_FLOATS, np.array([0.0]), np.array([np.inf])],
    ("scale.smallest_covering", "emax"): [0.0, np.nan, "127"],
    ("scale.smallest_covering", "scale_type"): ["e8m0", "bf16", None, 16],
    ("scale.block_scale", "amax"): [*_FLOATS, np.array([[0.5, 3.0]]), np.array([-1.0, 2.0])],
    ("scale.block_scale", "fmt"): _FORMAT,
    ("scale.block_scale", "emax"): [0.0, None, "127"],
    ("scale.block_scale", "tiny"): [None, np.array([0, 0]), np.array([False]), "no"],
    **{(f"elements.{f}", "a"): [*_BLOCKS[:6], np.ones(32), -np.ones((4, 32)),
                                np.full((4, 32), np.inf)] for f in ("nearest", "stochastic")},
    **{(f"elements.{f}", "s"): [*_FLOATS, np.ones(3), -np.ones(4), np.ones((4, 1))]
       for f in ("nearest", "stochastic")},
    **{(f"elements.{f}", "G"): [*_FLOATS, np.array([0.0]), np.array([1.0, 2.0]),
                                np.array([0.0, 2.0, 1.0]), np.ones((2, 2))]
       for f in ("nearest", "stochastic")},
    ("elements.stochastic", "u"): [*_FLOATS, np.full((4, 32), 1.0), np.full((4, 32), -0.1),
                                   np.full((4, 31), 0.5), np.full((4, 32), np.nan)],
    ("elements.codes", "idx"): [np.ones((2, 4)), np.ones((2, 4), bool), np.full((2, 4), 8),
                                np.full((2, 4), -1)],
    ("elements.codes", "negative"): [np.zeros((2, 4), int), np.zeros((2, 3), bool), None],
    **{(f"elements.{f}", "bits"): [0, 1, 17, 2.5, "8", True, None]
       for f in ("codes", "pack", "unpack")},
    ("elements.codes", "is_int"): [1, "yes", None],
    ("elements.pack", "codes"): [None, np.ones((4, 32)), np.ones(32, np.int64),
                                 np.ones((4, 32), bool), np.full((4, 32), 256)],
    ("elements.unpack", "payload"): [None, Q.payload.astype(np.int64), Q.payload[0],
                                     Q.payload[:, :31]],
    ("elements.unpack", "block_size"): [0, 33, 2.5, "32", True],
    ("quantize.quantize_blocks", "x"): _BLOCKS,
    ("quantize.quantize_blocks", "fmt"): _FORMAT,
    ("quantize.quantize_blocks", "uniforms"): [*_FLOATS[1:], np.full((4, 31), 0.5),
                                               np.full((4, 32), 1.0)],
    ("quantize.to_blocks", "x"): _FLOATS,
    ("quantize.to_blocks", "block_size"): [0, -32, 2.5, "32", True, None, 1 << 17],
    ("quantize.round_trip", "x"): [*_FLOATS, np.float32(1), BLOCKS, np.ones(33, np.float32)],
    ("quantize.round_trip", "fmt"): _FORMAT,
    ("wire.scale_bytes", "stored"): [None, "abc", Q.scales[None], Q.scales.astype(np.float64),
                                     np.float32(1)],
    **{(f"wire.{f}", "q"): [None, BLOCKS, "q", Q.payload]
       for f in ("canonical_bytes", "fixed_bytes", "message")},
    **{(f"wire.{f}", "fmt"): _FORMAT
       for f in ("row_values", "payload_bytes", "scale_bits", "message", "from_message")},
    ("wire.blocks_per_row", "block_size"): [0, -32, 2.5, "32", True, None, 1 << 17],
    ("wire.scale_bits", "stored"): [None, Q.scales[None], Q.scales.astype(np.float32),
                                    Q.scales.view(np.uint16)],
    ("wire.from_message", "payload"): [None, MESSAGE[0][:-1], MESSAGE[0].astype(np.int8),
                                       MESSAGE[0].ravel()],
    ("wire.from_message", "scales"): [None, MESSAGE[1][:, :0], MESSAGE[1].view(np.int16),
                                      MESSAGE[1].T],
    ("sums.all_reduce", "x"): [*_FLOATS, np.float32(1), np.ones((8, 100), np.float32),
                               np.ones((2, 100), np.float32)],
    ("sums.all_reduce", "fmt"): _FORMAT[1:],  # None is the unquantized sum
    **{(f"sums.{f}", "schedule"): [
        None, "ring", 5, types.SimpleNamespace(owners=(), steps=()),
        _schedule(chunk_count=0), _schedule(chunk_count=2), _schedule(owners=((),)),
        _schedule(owners=((0, 4),)), _schedule(p=2.5), _schedule(p=True),
        _schedule(owners=5), _schedule(steps=(5,)),
        types.SimpleNamespace(chunk_count=1, owners=(), steps=()),
        _schedule(steps=(types.SimpleNamespace(time=0, phase="scatter", kind="all_gather",
                                               transfers=()),)),
        _schedule(steps=(types.SimpleNamespace(time=0, phase="reduce", kind="permute",
                                               transfers=(types.SimpleNamespace(
                                                   src=0, dst=4, chunks=(0,)),)),)),
        _schedule(steps=(types.SimpleNamespace(time=0, phase="reduce", kind="permute",
                                               transfers=(types.SimpleNamespace(
                                                   src=0, dst=1, chunks=(1,)),)),)),
    ] for f in ("all_reduce", "check_schedule")},
    ("sums.all_reduce", "plan"): [5, ({}, None), ({99: INT8}, INT8), ({0: "int8"}, INT8),
                                  [{0: INT8}], ({0: INT8}, _format(name="int13"))],
    ("data.make", "name"): ["no such class", "", None, 5],
    ("data.make", "fmt"): _FORMAT,
}


def _public_functions() -> set[str]:
    out = set()
    for module in (data, elements, formats, quantize, scale, sums, wire):
        for name, obj in vars(module).items():
            if inspect.isfunction(obj) and not name.startswith("_") \
                    and obj.__module__ == module.__name__:
                out.add(f"{module.__name__.rpartition('.')[2]}.{name}")
    return out


def test_every_public_function_and_argument_has_its_table():
    assert set(CALLS) == _public_functions(), (sorted(_public_functions() - set(CALLS)),
                                               sorted(set(CALLS) - _public_functions()))
    for fn, (call, _) in CALLS.items():
        params = [a for a in inspect.signature(call).parameters
                  if a != "what"]  # check_format's label for its message, not an input
        missing = [a for a in params if (fn, a) not in BAD]
        assert not missing, f"{fn}: arguments without bad values: {missing}"


@pytest.mark.parametrize("fn", list(CALLS))
def test_the_good_call_works(fn):
    call, good = CALLS[fn]
    call(**good)


def _cases():
    for (fn, arg), values in BAD.items():
        for i, bad in enumerate(values):
            yield pytest.param(fn, arg, bad, id=f"{fn}-{arg}-{i}")


@pytest.mark.parametrize(("fn", "arg", "bad"), list(_cases()))
def test_bad_argument_one_line_naming_it(fn, arg, bad):
    call, good = CALLS[fn]
    with pytest.raises((ValueError, TypeError)) as e:
        call(**{**good, arg: bad})
    message = str(e.value)
    assert "\n" not in message.strip(), f"{fn}({arg}=...): more than one line: {message}"
    assert re.search(rf"\b{re.escape(arg)}\b", message), \
        f"{fn}({arg}={bad!r}): the message does not name {arg!r}: {message}"


def test_no_assert_in_the_spec():
    """`python -O` removes asserts: a check that must hold is an `if` that raises."""
    found = [f"{p.name}:{node.lineno}" for p in sorted((ROOT / "equarx_ref" / "spec")
                                                      .glob("*.py"))
             for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(node, ast.Assert)]
    assert not found, f"asserts in the spec: {found}"


def test_unknown_names_list_the_known_ones_in_counting_order():
    with pytest.raises(ValueError) as e:
        spec.grid("int13")
    known = str(e.value).split("known: ")[1].split(", ")
    assert set(known) == set(spec.ELEMENTS)
    ints = [k for k in known if re.fullmatch(r"int\d+", k)]
    assert ints == [f"int{b}" for b in range(2, 13)], ints


@pytest.mark.parametrize("name", ["int8", "int4", "int7", "fp8_e4m3", "mxfp8", "mxfp4"])
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5)])
def test_empty_inputs_give_empty_answers(name, shape):
    """No values: no blocks, no bytes, an empty sum of the input's shape and dtype."""
    fmt = eq.Format.parse(name) if name != "int7" else eq.Format("int7", 8)
    x = np.zeros(shape, np.float32)
    blocks = spec.to_blocks(x, fmt.block_size)
    assert blocks.shape == (0, fmt.block_size)
    q = spec.quantize_blocks(blocks, fmt)
    assert q.payload.shape == (0, fmt.block_size * fmt.elem_bits // 8)
    assert spec.canonical_bytes(q).size == 0 and spec.fixed_bytes(q).size == 0
    assert spec.round_trip(np.zeros(0, np.float32), fmt).size == 0
    for algorithm in ("ring", "one_shot"):
        y = spec.all_reduce(np.zeros((4, *shape), np.float32),
                            eq.make_schedule(algorithm, (4,)), fmt)
        assert y.shape == shape and y.dtype == np.float32


def test_a_0d_value_is_one_block():
    fmt = eq.Format.int8()
    q = spec.quantize_blocks(spec.to_blocks(np.float32(3.0), 32), fmt)
    assert q.values.shape == (1, 32) and not q.values[0, 1:].any()
    assert abs(q.values[0, 0] - 3.0) <= float(q.scales[0]) / 2


def test_all_reduce_counts_the_rows_against_the_schedule():
    """8 rows against a 4-device schedule were summed as the first 4; now refused."""
    with pytest.raises(ValueError, match="one row per device of the schedule, 4, got 8"):
        spec.all_reduce(np.ones((8, 64), np.float32), RING4, INT8)
    with pytest.raises(ValueError, match="one row per device of the schedule, 8, got 4"):
        spec.all_reduce(np.ones((4, 64), np.float32), eq.make_schedule("ring", (2, 4)), INT8)


@pytest.mark.parametrize("dtype", [np.int32, np.complex64, object, bool])
def test_non_float_inputs_are_refused_as_eq_quantize_refuses_them(dtype):
    x = np.ones((1, 32), dtype)
    with pytest.raises(TypeError):
        eq.quantize(x if dtype is not object else x.astype(np.float32).astype(object), INT8)
    for call in (lambda: spec.quantize_blocks(x, INT8), lambda: spec.to_blocks(x, 32),
                 lambda: spec.all_reduce(np.ones((4, 32), dtype), RING4, INT8)):
        with pytest.raises(TypeError, match="floating-point"):
            call()


def test_float_inputs_of_every_width_are_taken():
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64):
        assert spec.to_blocks(np.ones(40, dtype), 32).dtype == np.float32
        assert spec.all_reduce(np.ones((4, 40), dtype), RING4, INT8).dtype == dtype


def _package_all_reduce(x, fmt, algorithm, **kw):
    """eq.all_reduce on len(x) devices; every device's row of the result."""
    p = len(x)
    mesh = eq.make_mesh(DEVICES[:p])
    fn = jax.jit(jax.shard_map(lambda v: eq.all_reduce(v[0], "tp", fmt=fmt,
                                                        algorithm=algorithm, **kw)[None],
                               mesh=mesh, in_specs=P("tp"), out_specs=P("tp"),
                               check_vma=True))
    return np.asarray(fn(jnp.asarray(x)))


def test_the_spec_is_all_reduce_with_min_bytes_0_and_the_gate_is_the_unquantized_sum():
    """p = 8, 64 values, int8 (docs/api/spec.md, spec/sums.py): the spec's sum is the package's
    with `min_bytes=0`, to the bit; the default gate sends these 128 bytes unquantized (as
    int8 they would be 8 x 34 padded blocks), and gives the spec's `fmt=None` sum."""
    x = np.random.default_rng(8).standard_normal((8, 64)).astype(np.float32)
    want = spec.all_reduce(x, eq.make_schedule("ring", (8,)), INT8)
    unquantized = spec.all_reduce(x, eq.make_schedule("ring", (8,)), None)
    assert not np.array_equal(want, unquantized)  # a case where the two differ
    for got in _package_all_reduce(x, INT8, "ring", min_bytes=0):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not eq.models.predict.quantizing_saves_bytes(64, 8, fmt=INT8, algorithm="ring",
                                                        dtype="float32")
    for got in _package_all_reduce(x, INT8, "ring"):
        assert np.array_equal(got.view(np.uint32), unquantized.view(np.uint32))
