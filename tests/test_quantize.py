"""The quantizer: formats, error bounds (property tests), edge cases, wire layout."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import equarx_ref as eq
from equarx_ref.quantize import (
    _apply_scale,
    from_bytes,
    to_bytes,
)

FORMATS = {
    "int8": eq.Format.int8(),
    "int4": eq.Format.int4(),
    "fp8_e4m3": eq.Format.fp8_e4m3(),
    "fp8_e5m2": eq.Format.fp8_e5m2(),
    "mxfp8": eq.Format.mxfp8(),
    "mxfp4": eq.Format.mxfp4(),
    "int8_f32_b16": eq.Format.int8(block_size=16, scale_dtype=jnp.float32),
    "int4_b8": eq.Format.int4(block_size=8),
}


@functools.cache
def _roundtrip(fmt):
    return jax.jit(lambda x: eq.dequantize(eq.quantize(x, fmt)))


@functools.cache
def _scales_fn(fmt):
    def scales(x):
        q = eq.quantize(x, fmt)
        return _apply_scale(jnp.ones((*q.payload.shape[:-1], 1)), q.scales, fmt)[:, 0]
    return jax.jit(scales)


def _block_scales(x, fmt):
    return np.repeat(np.asarray(_scales_fn(fmt)(x)), fmt.block_size)[: x.size]


def _error_bound(x, fmt):
    """Half a step (integers) or half an ULP of the element grid (floats), per element."""
    s = _block_scales(x, fmt)
    if fmt.is_int:
        return s / 2
    with np.errstate(invalid="ignore"):  # non-finite blocks have no bound
        v = np.abs(np.asarray(x, np.float64)) / np.where(s > 0, s, 1)
    e = np.maximum(np.floor(np.log2(np.maximum(v, 1e-300))), fmt.min_exponent)
    return 0.5 * 2.0 ** (e - fmt.mant_bits) * s


def test_bits_per_element():
    assert eq.Format.int8().bits_per_element == 8.5
    assert eq.Format.int4().bits_per_element == 4.5
    assert eq.Format.int8(scale_dtype="float32").bits_per_element == 9.0
    assert eq.Format.mxfp8().bits_per_element == 8.25
    assert eq.Format.mxfp4().bits_per_element == 4.25
    assert eq.Format.fp8_e4m3().bits_per_element == 8.5


def test_format_validation():
    with pytest.raises(ValueError, match="block_size must be even"):
        eq.Format.int4(block_size=7)
    with pytest.raises(ValueError, match="scale_dtype"):
        eq.Format.int8(scale_dtype=jnp.int32)
    with pytest.raises(ValueError, match="block_size"):
        eq.Format.int8(block_size=0)


def test_format_refuses_impossible_combinations():
    with pytest.raises(ValueError, match="unknown format name 'e3m4'"):
        eq.Format("e3m4")
    with pytest.raises(ValueError, match="fields are name, block_size, scale_dtype"):
        eq.Format(8)
    with pytest.raises(ValueError, match="MX format"):
        eq.Format("mxfp8", 32, "float32")
    with pytest.raises(TypeError, match="block_size"):
        eq.Format.int8(block_size=True)
    with pytest.raises(ValueError, match="block_size"):
        eq.Format.int8(block_size=1 << 40)
    mxint8 = eq.Format("int8", 32, "e8m0")  # OCP MXINT8: int8, E8M0 scale
    assert mxint8.is_mx and mxint8.bits_per_element == 8.25
    assert eq.Format("mxint8") == eq.Format("mxint8", 32, "e8m0")


@pytest.mark.parametrize("text", ["int8", "int4/b16", "fp8_e4m3/f32", "fp8_e5m2/b64/f32",
                                  "mxfp8", "mxfp4/b64", "int8/e8m0", "fp4_e2m1"])
def test_format_names_round_trip(text):
    fmt = eq.Format.parse(text)
    assert str(fmt) == text and eq.Format.parse(str(fmt)) == fmt
    assert eq.Format(fmt.name, fmt.block_size, fmt.scale_dtype) == fmt  # positional use


def test_format_names_refused_clearly():
    from equarx_ref.formats import format_label, parse_format

    assert parse_format("bf16") is None and format_label(None) == "bf16"
    assert parse_format("int8") == eq.Format.int8()
    with pytest.raises(ValueError, match="cannot read 'q'"):
        eq.Format.parse("int8/q")
    with pytest.raises(ValueError, match="parse_format"):
        eq.Format.parse("bf16")


@pytest.mark.parametrize("name", ["int8", "int4", "fp8_e4m3", "mxfp8", "mxfp4", "int8_f32_b16"])
def test_scales_against_an_independent_numpy_rule(name):
    """amax / elem_max rounded up to the scale dtype (MX: 2^ceil(log2(amax / elem_max)))."""
    import ml_dtypes

    fmt = FORMATS[name]
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((256, fmt.block_size)) * 10.0 ** rng.uniform(-20, 20, (256, 1)))
    x = x.astype(np.float32)
    amax = np.abs(x).max(1).astype(np.float64)
    if fmt.is_mx:
        want = 2.0 ** np.ceil(np.log2(amax / fmt.elem_max))
    else:
        dtype = ml_dtypes.bfloat16 if fmt.scale_dtype == "bfloat16" else np.float32
        ratio = amax.astype(np.float32) / np.float32(fmt.elem_max)  # in f32, as documented
        want = ratio.astype(dtype).astype(np.float64)
        up = np.nextafter(ratio.astype(dtype), np.array(np.inf, dtype)).astype(np.float64)
        want = np.where(want < ratio, up, want)
    got = np.asarray(_scales_fn(fmt)(jnp.asarray(x.reshape(-1))), np.float64)
    if fmt.scale_dtype == "float32":  # XLA divides by the constant elem_max via its reciprocal
        np.testing.assert_allclose(got, want, rtol=2**-23, atol=0)
    else:
        np.testing.assert_array_equal(got, want)


def test_grids():
    assert list(eq.Format.mxfp4().grid) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert eq.Format.fp8_e4m3().grid.max() == 448 and len(eq.Format.fp8_e4m3().grid) == 127
    assert eq.Format.int4().grid.max() == 7


@settings(deadline=None, max_examples=60)
@given(
    name=st.sampled_from(sorted(FORMATS)),
    n=st.sampled_from([1, 45, 256]),
    log_scale=st.floats(-30, 30),
    seed=st.integers(0, 2**31 - 1),
)
def test_roundtrip_error_bound(name, n, log_scale, seed):
    fmt = FORMATS[name]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.exponential(1.0, n) * 10.0**log_scale).astype(np.float32)
    y = np.asarray(_roundtrip(fmt)(jnp.asarray(x)))
    err = np.abs(y.astype(np.float64) - x)
    bound = _error_bound(jnp.asarray(x), fmt) * (1 + 1e-6)
    worst = int(np.argmax(err - bound))
    assert np.all(err <= bound), (f"{fmt}: |err| {err[worst]:.3e} > bound {bound[worst]:.3e} "
                                  f"at x={x[worst]:.6e}; max err {err.max():.3e}")
    assert y.shape == x.shape and y.dtype == np.float32


@pytest.mark.parametrize("name", ["int8", "int4", "fp8_e4m3", "mxfp4"])
def test_grid_values_roundtrip_exactly(name):
    fmt = FORMATS[name]
    grid = np.concatenate([fmt.grid, -fmt.grid])
    x = np.resize(grid, fmt.block_size * (len(grid) // fmt.block_size + 1)).astype(np.float32)
    x[:: fmt.block_size] = fmt.elem_max  # every block's amax is elem_max: scale exactly 1
    y = np.asarray(_roundtrip(fmt)(jnp.asarray(x)))
    np.testing.assert_array_equal(y, x)


def test_round_half_to_even():
    fmt = eq.Format.int8()
    x = np.zeros(32, np.float32)
    x[:5] = np.array([127, 0.5, 1.5, 2.5, -2.5]) / 8  # scale is exactly 1/8
    y = np.asarray(_roundtrip(fmt)(jnp.asarray(x))) * 8
    np.testing.assert_array_equal(y[:5], [127, 0, 2, 2, -2])


def test_stochastic_rounding_unbiased_and_within_a_step():
    fmt = eq.Format.int8()
    x = jnp.asarray(np.random.default_rng(0).standard_normal(256), jnp.float32)
    keys = jax.random.split(jax.random.key(0), 2000)
    ys = jax.jit(jax.vmap(lambda k: eq.dequantize(eq.quantize(x, fmt, key=k))))(keys)
    step = _block_scales(x, fmt)
    ys = np.asarray(ys, np.float64)
    assert np.all(np.abs(ys - np.asarray(x)) < step * (1 + 1e-6))
    bias = (ys.mean(0) - np.asarray(x)) / step  # ~ N(0, 0.29 / sqrt(2000)) per element
    assert np.abs(bias).max() < 0.05, f"max |bias| {np.abs(bias).max():.3f} steps"
    nearest = np.asarray(_roundtrip(fmt)(x))
    assert not np.array_equal(ys[0], nearest)  # it really is random


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "mxfp8", "mxfp4"])
def test_zero_nan_inf_blocks(name):
    fmt = FORMATS[name]
    x = np.random.default_rng(1).standard_normal(4 * 32).astype(np.float32)
    x[0:32] = 0.0
    x[40] = np.nan
    x[70] = np.inf
    y = np.asarray(_roundtrip(fmt)(jnp.asarray(x)))
    np.testing.assert_array_equal(y[0:32], 0.0)  # all-zero block: exact zeros
    assert not np.isfinite(y[32:64]).any() and not np.isfinite(y[64:96]).any()
    assert np.all(np.abs(y[96:] - x[96:]) <= _error_bound(jnp.asarray(x), fmt)[96:] * 1.000001)


def test_tiny_blocks_flush_to_zero_documented():
    """amax / 127 below f32's smallest normal: XLA:CPU flushes the scale, the block reads 0."""
    x = jnp.full((32,), 1e-37, jnp.float32)
    y = np.asarray(_roundtrip(eq.Format.int8())(x))
    np.testing.assert_array_equal(y, 0.0)
    assert np.abs(y - 1e-37).max() < 1.5e-36
    # MX scales are powers of two down to 2^-127: the same block survives in mxfp8.
    y = np.asarray(_roundtrip(eq.Format.mxfp8())(x))
    assert np.allclose(y, 1e-37, rtol=0.07)


def test_large_values_do_not_overflow():
    x = jnp.asarray(np.linspace(-3e38, 3e38, 64), jnp.float32)
    for name in ["int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8"]:
        y = np.asarray(_roundtrip(FORMATS[name])(x))
        assert np.isfinite(y).all(), name


def test_integer_input_refused():
    with pytest.raises(TypeError, match="floating-point"):
        eq.quantize(jnp.arange(32), eq.Format.int8())


def test_wire_layout_and_packing():
    for fmt in FORMATS.values():
        x = jax.random.normal(jax.random.key(2), (3, 50))
        q = eq.quantize(x, fmt)
        blocks = -(-150 // fmt.block_size)
        assert q.payload.dtype == jnp.uint8
        assert q.payload.shape == (blocks, fmt.block_size * fmt.elem_bits // 8)  # 4-bit: packed
        buf = to_bytes(q)
        assert buf.shape == (blocks * fmt.bytes_per_block,) == (q.nbytes,)
        back = from_bytes(buf, fmt, x.shape)
        np.testing.assert_array_equal(eq.dequantize(back), eq.dequantize(q))
        assert fmt.nbytes(150) == buf.size
    with pytest.raises(ValueError, match="does not hold"):
        from_bytes(jnp.zeros(7, jnp.uint8), eq.Format.int8(), (32,))


def test_quantized_is_a_pytree():
    q = eq.quantize(jnp.ones((4, 16)), eq.Format.int4(block_size=8))
    leaves = jax.tree_util.tree_leaves(q)
    assert len(leaves) == 2
    q2 = jax.jit(lambda q: q)(q)
    assert q2.shape == (4, 16) and q2.fmt == q.fmt


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_gaussian_error_constant(name):
    fmt = FORMATS[name]
    x = jax.random.normal(jax.random.key(3), (1 << 16,))
    measured = float(jnp.linalg.norm(_roundtrip(fmt)(x) - x) / jnp.linalg.norm(x))
    predicted = eq.gaussian_relative_error(fmt)
    assert abs(measured / predicted - 1) < 0.03, (measured, predicted)
