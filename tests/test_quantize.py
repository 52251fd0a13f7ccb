"""The quantizer: formats, error bounds (property tests), edge cases, wire layout."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import equarx_ref as eq
from equarx_ref import wire
from equarx_ref.scales import apply_scale
from equarx_ref.wire import (
    Message,
    decode,
    decode_raw,
    encode,
    encode_raw,
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
    "mxfp8_ceil": eq.Format.mxfp8(scale_rule="ceil"),
    "int8_f32_b16": eq.Format.int8(block_size=16, scale_dtype=jnp.float32),
    "int4_b8": eq.Format.int4(block_size=8),
}


@functools.cache
def _codec(fmt):
    """jit: x -> (dequantize(quantize(x)), each block's scale as f32): one program for both, so
    a test that needs the values and their bound compiles once per shape."""
    def run(x):
        q = eq.quantize(x, fmt)
        return eq.dequantize(q), apply_scale(jnp.ones((*q.payload.shape[:-1], 1)), q.scales,
                                             fmt)[:, 0]
    return jax.jit(run)


def _roundtrip(fmt):
    return lambda x: _codec(fmt)(x)[0]


@functools.cache
def _wire(fmt):
    """jit: x -> (quantize(x), to_bytes of it, dequantize of it)."""
    def run(x):
        q = eq.quantize(x, fmt)
        return q, to_bytes(q), eq.dequantize(q)
    return jax.jit(run)


def _block_scales(x, fmt):
    return np.repeat(np.asarray(_codec(fmt)(x)[1]), fmt.block_size)[: x.size]


def _error_bound(x, fmt):
    """Half a step (integers) or half an ULP of the element grid (floats), per element; under
    OCP MX's floor rule, also what saturating at elem_max s takes off a value past it."""
    s = _block_scales(x, fmt)
    if fmt.is_int:
        half = s / 2
    else:
        with np.errstate(invalid="ignore"):  # non-finite blocks have no bound
            v = np.abs(np.asarray(x, np.float64)) / np.where(s > 0, s, 1)
        e = np.maximum(np.floor(np.log2(np.maximum(v, 1e-300))), fmt.min_exponent)
        half = 0.5 * 2.0 ** (e - fmt.mant_bits) * s
    a = np.abs(np.asarray(x, np.float64))
    half = np.where(s > 0, half, a)  # a tiny block (scale 0) dequantizes to zeros, by rule
    if fmt.scale_rule != "floor":
        return half
    return np.maximum(half, a - fmt.elem_max * s)


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


def test_grids():
    assert list(eq.Format.mxfp4().grid) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert eq.Format.fp8_e4m3().grid.max() == 448 and len(eq.Format.fp8_e4m3().grid) == 127
    assert eq.Format.int4().grid.max() == 7


@settings(deadline=None, max_examples=60, derandomize=True, database=None)  # deterministic
@given(
    name=st.sampled_from(sorted(FORMATS)),
    n=st.sampled_from([1, 45, 256]),
    log_scale=st.floats(-30, 30),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.slow
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


def test_tiny_blocks_read_as_zeros_documented():
    """amax below the format's tiny threshold (int8: 2^-119, about 1.5e-36; mxfp8: 2^-108,
    about 3.1e-33): the block reads 0 and its payload is zeros, for bf16 and E8M0 scales
    alike (under jit; eagerly too: test_reference.py's tiny blocks)."""
    x = jnp.full((32,), 1e-37, jnp.float32)
    for fmt in (eq.Format.int8(), eq.Format.mxfp8()):
        q, _, y = _wire(fmt)(x)
        np.testing.assert_array_equal(np.asarray(y), 0.0)
        np.testing.assert_array_equal(np.asarray(q.payload), 0)
    _, _, y = _wire(eq.Format.int8())(jnp.full((32,), 2.0**-118, jnp.float32))
    assert np.allclose(np.asarray(y), 2.0**-118, rtol=2**-7)  # one binade above: kept


def test_large_values_do_not_overflow():
    x = jnp.asarray(np.linspace(-3e38, 3e38, 64), jnp.float32)
    for name in ["int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8"]:
        y = np.asarray(_roundtrip(FORMATS[name])(x))
        assert np.isfinite(y).all(), name


def test_integer_input_refused():
    with pytest.raises(TypeError, match="floating-point"):
        eq.quantize(jnp.arange(32), eq.Format.int8())


@pytest.mark.slow
def test_wire_layout_and_packing():
    """quantize's payload is uint8, 4-bit elements packed two to a byte; to_bytes is q.nbytes
    bytes, fmt.nbytes(150) for 150 values (a partial last block); from_bytes reads back the
    same values. Under jit (quantize, to_bytes, dequantize in one program; from_bytes and
    dequantize in another); eagerly: test_stacked_buffers_dequantize_with_their_leading_axes
    and test_reference.py."""
    x = jax.random.normal(jax.random.key(2), (3, 50))
    for fmt in FORMATS.values():
        q, buf, y = _wire(fmt)(x)
        blocks = -(-150 // fmt.block_size)
        assert q.payload.dtype == jnp.uint8
        assert q.payload.shape == (blocks, fmt.block_size * fmt.elem_bits // 8)  # 4-bit: packed
        assert buf.shape == (blocks * fmt.bytes_per_block,) == (q.nbytes,)
        back = jax.jit(lambda b, fmt=fmt: eq.dequantize(from_bytes(b, fmt, x.shape)))(buf)
        np.testing.assert_array_equal(back, y)
        assert fmt.nbytes(150) == buf.size
    with pytest.raises(ValueError, match="does not hold"):
        from_bytes(jnp.zeros(7, jnp.uint8), eq.Format.int8(), (32,))


@pytest.mark.parametrize("name", list(FORMATS))
def test_message_layout_is_the_quantized_blocks_transposed(name):
    """`encode` of rows [3, m]: payload uint8 [3, G PB, R] and scale bits [3, G, R], block
    r G + j in lane r of slot j (payload[j PB + i, r] = byte i of its payload), the very
    blocks `quantize` makes; `decode` gives `dequantize`'s values; messages are whole rows.
    Each under jit, three programs a format: encode, quantize + dequantize of each row, and
    decode."""
    fmt = FORMATS[name]
    g, pb = fmt.blocks_per_row, fmt.payload_bytes_per_block
    assert fmt.row == (128 if 128 % fmt.block_size == 0 else fmt.block_size) == g * fmt.block_size
    m = 3 * fmt.row
    x = jax.random.normal(jax.random.key(12), (3, m)) * jnp.logspace(-2, 2, m)
    x = x.at[1, :fmt.block_size].set(jnp.nan)  # a non-finite block: its payload is zeros
    message = jax.jit(encode, static_argnums=1)(x, fmt)
    rows = m // fmt.row
    assert message.payload.dtype == jnp.uint8 and message.payload.shape == (3, g * pb, rows)
    bits = {"bfloat16": np.uint16, "float32": np.uint32, "e8m0": np.uint8}[fmt.scale_dtype]
    assert message.scales.dtype == bits and message.scales.shape == (3, g, rows)
    assert wire.message_shapes(m, fmt) == ((g * pb, rows), (g, rows))
    payload, scales = np.asarray(message.payload), np.asarray(message.scales)
    quantized = jax.jit(lambda x: [(q, eq.dequantize(q)) for q in (
        eq.quantize(x[k], fmt) for k in range(3))])(x)
    decoded = np.asarray(jax.jit(decode, static_argnums=(1, 2))(message, fmt, m))
    for k, (q, values) in enumerate(quantized):
        qp, qs, values = np.asarray(q.payload), np.asarray(q.scales).view(bits), \
            np.asarray(values)
        for r in range(rows):
            for j in range(g):
                block = r * g + j
                np.testing.assert_array_equal(payload[k, j * pb:(j + 1) * pb, r], qp[block])
                assert scales[k, j, r] == qs[block] or not np.isfinite(
                    values[block * fmt.block_size]), (k, r, j)
        np.testing.assert_array_equal(decoded[k], values)
    assert not payload[1, :pb, 0].any()
    with pytest.raises(ValueError, match="whole rows"):
        encode(x[:, :m - fmt.block_size], fmt) if g > 1 else wire.message_shapes(m - 1, fmt)
    with pytest.raises(ValueError, match="a message of"):
        decode(Message(message.payload[..., :-1], message.scales), fmt, m)
    with pytest.raises(ValueError, match="a message of"):
        decode(Message(message.payload), fmt, m)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_unquantized_messages_are_the_raw_bits(dtype):
    """An unquantized message (fmt=None) is the values' bits as an unsigned integer of their
    width (uint16 for bf16: XLA:CPU cannot widen it), a bitcast and nothing else, and back:
    every bit pattern, signed zeros, subnormals, infinities and NaN payloads included; its
    little-endian bytes are the values' bytes in memory."""
    uint = jnp.uint16 if dtype == jnp.bfloat16 else jnp.uint32
    bits = np.random.default_rng(3).integers(0, np.iinfo(uint).max, 4096, dtype=np.uint64)
    special = [0, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0x0001]
    if dtype == jnp.float32:
        special += [0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0x00000001, 0x807FFFFF]
    bits = np.concatenate([bits, special, special[:2]]).astype(uint).reshape(2, -1)
    v = jax.lax.bitcast_convert_type(jnp.asarray(bits), dtype)
    message = jax.jit(encode_raw, static_argnums=1)(v, dtype)
    assert isinstance(message, Message) and message.scales is None
    assert message.payload.dtype == uint and message.payload.shape == bits.shape
    np.testing.assert_array_equal(np.asarray(message.payload), bits)
    little = bits.astype(np.dtype(uint).newbyteorder("<")).view(np.uint8)
    np.testing.assert_array_equal(np.asarray(message.payload).view(np.uint8), little)
    back = jax.jit(decode_raw, static_argnums=(1, 2))(message, dtype, bits.shape[-1])
    assert back.dtype == dtype
    np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(back, uint)), bits)
    with pytest.raises(ValueError, match="unquantized message"):
        decode_raw(Message(message.payload.astype(jnp.uint8)), dtype, bits.shape[-1])
    with pytest.raises(ValueError, match="unquantized message"):
        decode_raw(message, dtype, bits.shape[-1] - 1)


@pytest.mark.parametrize("name", ["int4", "fp4_e2m1", "mxfp4"])
def test_four_bit_decode_is_the_same_in_bytes_and_in_32_bit_words(name):
    """`decode` unpacks 4-bit elements in uint8 on the XLA path, the TPU kernels' tile code
    (`kernels.tiles`) widened to int32 down sublanes: every payload byte (every nibble pair)
    and scale must give the same values, which are `dequantize` of the same blocks read
    from their canonical bytes (the message is a permutation of them: `spec.from_message`).
    Each under jit."""
    from equarx_ref import spec
    from equarx_ref.kernels import tiles

    fmt = eq.parse_format(name)
    rng = np.random.default_rng(5)
    m = 8 * 128  # 8 rows of a message
    x = jnp.asarray(rng.standard_normal((3, m), dtype=np.float32))
    message = jax.jit(encode, static_argnums=1)(x, fmt)
    payload = rng.integers(0, 256, message.payload.shape).astype(np.uint8)
    payload[0, :fmt.payload_bytes_per_block, 0] = np.arange(fmt.payload_bytes_per_block) * 17
    payload[0, :, 1] = np.arange(payload.shape[1]) * 16 + 15  # block 4: nibbles 15 / x0
    message = Message(jnp.asarray(payload), message.scales)
    got = np.asarray(jax.jit(decode, static_argnums=(1, 2))(message, fmt, m))
    from_canonical = jax.jit(lambda b: eq.dequantize(from_bytes(b, fmt, (m,))))
    for r in range(3):
        row = Message(np.asarray(message.payload[r]), np.asarray(message.scales[r]))
        np.testing.assert_array_equal(
            np.asarray(jax.jit(tiles.decode, static_argnums=1)(row, fmt)).reshape(-1), got[r])
        blocks, scale_bits = spec.from_message(row.payload, row.scales, fmt)
        scale_bytes = scale_bits.view(np.uint8).reshape(len(scale_bits), -1)
        buf = jnp.asarray(np.concatenate([blocks, scale_bytes], axis=1).reshape(-1))
        np.testing.assert_array_equal(np.asarray(from_canonical(buf)), got[r])


def test_quantized_is_a_pytree_with_static_metadata():
    """A Quantized flattens to its arrays (payload, scales) and back with its static fields;
    it comes out of jit (`_wire`) and goes into it as an argument: the static fields travel
    in the tree, the arrays as data."""
    x = jax.random.normal(jax.random.key(4), (4, 16))
    fmt = eq.Format.int4(block_size=8)
    q, _, want = _wire(fmt)(x)
    leaves, tree = jax.tree_util.tree_flatten(q)
    assert [leaf.dtype for leaf in leaves] == [jnp.uint8, jnp.bfloat16]
    back = jax.tree_util.tree_unflatten(tree, leaves)
    assert (back.shape, back.dtype, back.fmt) == ((4, 16), "float32", fmt)
    np.testing.assert_array_equal(jax.jit(eq.dequantize)(back), want)


@pytest.mark.parametrize("name", ["int8", "int4/b16", "mxfp4", "fp8_e5m2/b64/f32"])
def test_stacked_buffers_dequantize_with_their_leading_axes(name):
    """from_bytes of a [k, nbytes] buffer (what a gather brings) -> dequantize -> [k, *shape],
    row i equal to the dequantized row i (quantize, to_bytes, dequantize of each row under
    jit), eagerly, under jit and under jit(vmap) alike; two leading axes give [k, 1, *shape]
    (traced: the shape alone is asserted)."""
    fmt = eq.Format.parse(name)
    shape = (3, 50)  # 150 values: a partial last block
    xs = jax.random.normal(jax.random.key(6), (5, *shape))
    rows = [_wire(fmt)(x) for x in xs]  # (q, to_bytes, dequantize) of each row
    bufs = jnp.stack([buf for _, buf, _ in rows])  # [5, nbytes]
    assert bufs.shape == (5, fmt.nbytes(150))
    q = from_bytes(bufs, fmt, shape)
    assert q.payload.shape[0] == q.scales.shape[0] == 5
    y = np.asarray(eq.dequantize(q))
    assert y.shape == (5, *shape)
    for (_, _, want), row in zip(rows, y, strict=True):
        np.testing.assert_array_equal(row, want)
    np.testing.assert_array_equal(jax.jit(eq.dequantize)(q), y)
    per_row = jax.jit(jax.vmap(lambda b: eq.dequantize(from_bytes(b, fmt, shape))))(bufs)
    np.testing.assert_array_equal(per_row, y)
    more = jax.eval_shape(lambda b: eq.dequantize(from_bytes(b, fmt, shape)),
                          bufs.reshape(5, 1, -1))  # two leading axes
    assert more.shape == (5, 1, *shape)


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "mxfp8", "int4/b16"])
@pytest.mark.parametrize("blocks", [4, 500, 2000])
def test_a_nan_anywhere_makes_its_block_non_finite(name, blocks):
    """In small and large arrays alike, at the first, a middle and the last block, and at the
    block's first and last element; the other blocks stay finite."""
    fmt = eq.Format.parse(name)
    B = fmt.block_size
    f = _roundtrip(fmt)
    missed = []
    for block in (0, blocks // 2, blocks - 1):
        for i in (0, B - 1):
            x = np.ones((blocks, B), np.float32)
            x[block, i] = np.nan
            y = np.asarray(f(jnp.asarray(x.reshape(-1)))).reshape(blocks, B)
            if np.isfinite(y[block]).any():
                missed.append((block, i))
            assert np.isfinite(np.delete(y, block, axis=0)).all()
    assert not missed, f"NaN at (block, element) {missed} came back finite"


@pytest.mark.parametrize("name", ["int8", "int4", "int8/f32", "int4/b8", "int8/b8", "int8/b64",
                                  "mxint8", "fp8_e4m3", "mxfp4"])
@pytest.mark.slow
def test_gaussian_error_constant(name):
    """gaussian_relative_error against a measurement on 2^20 other Gaussian values (relative
    standard error ~0.1%, computed here): a closed form should be within 2%."""
    fmt = eq.Format.parse(name)
    x = jax.random.normal(jax.random.key(3), (1 << 20,))
    err2 = np.asarray((_roundtrip(fmt)(x) - x) ** 2, np.float64).reshape(256, -1).sum(1)
    x2 = np.asarray(x, np.float64).reshape(256, -1) ** 2
    x2 = x2.sum(1)
    ratio = err2.sum() / x2.sum()
    se = np.sqrt(256 / 255 * ((err2 - ratio * x2) ** 2).sum()) / x2.sum() / ratio / 2
    measured = np.sqrt(ratio)
    predicted = eq.gaussian_relative_error(fmt)
    assert se < 0.02 / 5, f"relative SE {se:.2%}"
    assert abs(measured / predicted - 1) < 0.02, (
        f"{name}: measured {measured:.6f} (+- {se:.2%}), predicted {predicted:.6f}, "
        f"ratio {measured / predicted:.4f}")
