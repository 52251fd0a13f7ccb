"""The package's array arguments at their edges: empty, 0-d, wrongly typed.

`eq.quantize` of an empty array returns an empty `Quantized` (no blocks, no bytes) that
dequantizes to an empty array of its shape, eagerly and under jit, rounding to nearest or
stochastically; it raised a raw ZeroDivisionError from a reshape. A 0-d value is one block.
Arrays that hold no real floating-point values (integers, booleans, complex numbers, Python
objects) are refused in one line naming `x`, by `quantize` and by `all_reduce` alike; an
empty or 0-d input to `all_reduce` comes back with its own shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import wire

FORMATS = ["int8", "int4", "fp8_e4m3", "mxfp8", "mxfp4", "int8/f32", "int7/b8"]
EMPTY = [(0,), (3, 0), (0, 5)]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("shape", EMPTY, ids=str)
@pytest.mark.slow
def test_quantize_of_an_empty_array_is_empty_and_round_trips(name, shape):
    fmt = eq.Format.parse(name)
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jnp.zeros(shape, dtype)
        for key in (None, jax.random.key(0)):
            q = eq.quantize(x, fmt, key=key)
            assert q.shape == shape and q.nbytes == 0 and q.payload.size == q.scales.size == 0
            full = eq.quantize(jnp.ones(fmt.block_size, dtype), fmt)  # the same kinds of array
            assert q.payload.dtype == full.payload.dtype and q.scales.dtype == full.scales.dtype
            assert q.payload.shape[1:] == full.payload.shape[1:]
            y = eq.dequantize(q)
            assert y.shape == shape and y.dtype == jnp.float32
        assert wire.to_bytes(q).shape == (0,)
    jitted = jax.jit(lambda v: eq.dequantize(eq.quantize(v, fmt)))(jnp.zeros(shape))
    assert jitted.shape == shape


def test_a_0d_value_is_one_block():
    y = eq.dequantize(eq.quantize(jnp.float32(3.0), eq.Format.int8()))
    assert y.shape == () and abs(float(y) - 3.0) < 3.0 / 127


BAD_VALUES = {"int32": np.ones(8, np.int32), "bool": np.ones(8, bool),
              "complex64": np.ones(8, np.complex64), "object": np.array([object()] * 8),
              "str": "abc", "None": None}


@pytest.mark.parametrize("what", list(BAD_VALUES))
def test_non_float_values_are_refused_in_one_line_naming_x(what):
    with pytest.raises(TypeError) as e:
        eq.quantize(BAD_VALUES[what], eq.Format.int8())
    assert "\n" not in str(e.value) and " x" in str(e.value), e.value
    mesh = eq.make_mesh(DEVICES[:4])
    fn = jax.jit(jax.shard_map(lambda _: eq.all_reduce(BAD_VALUES[what], "tp"), mesh=mesh,
                               in_specs=P("tp"), out_specs=P(), check_vma=False))
    with pytest.raises(TypeError) as e:
        fn(jnp.zeros(4))
    assert "\n" not in str(e.value) and "x" in str(e.value), e.value


@pytest.mark.parametrize("shape", [(0,), (3, 0), ()], ids=str)
@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "psum"])
def test_all_reduce_of_empty_and_0d_inputs(shape, algorithm):
    mesh = eq.make_mesh(DEVICES[:4])
    fmt = None if algorithm == "psum" else eq.Format.int8()
    fn = jax.jit(jax.shard_map(
        lambda v: eq.all_reduce(v[0], "tp", fmt=fmt, algorithm=algorithm, min_bytes=0),
        mesh=mesh, in_specs=P("tp"), out_specs=P()))
    y = fn(jnp.ones((4, *shape)))
    assert y.shape == shape and y.dtype == jnp.float32
    if shape == ():  # four ones, each hop within half an int8 step
        assert abs(float(y) - 4.0) <= 4.0 / 127
