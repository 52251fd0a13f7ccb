"""all_reduce on 8 simulated devices: exactness, error against theory, bytes against the HLO."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES

INT8 = eq.Format.int8()
QUANTIZED = ["ring", "bidir_ring", "two_shot", "one_shot"]


@functools.cache
def _mesh(shape):
    names = ("tp",) if len(shape) == 1 else ("a", "b")
    return eq.make_mesh(DEVICES[: int(np.prod(shape))], names, shape)


@functools.cache
def _compiled(shape, algorithm, fmt, num_chunks, x_shape, dtype, every_device=False):
    """jit(shard_map(all_reduce)) for inputs [p, *x_shape]; every_device: one row per device."""
    mesh = _mesh(shape)
    axis = mesh.axis_names if len(shape) == 2 else mesh.axis_names[0]

    def body(x):
        y = eq.all_reduce(x[0], axis, fmt=fmt, algorithm=algorithm, num_chunks=num_chunks)
        return y[None] if every_device else y

    out = P(axis) if every_device else P()
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=out, check_vma=True))
    return f.lower(jax.ShapeDtypeStruct((int(np.prod(shape)), *x_shape), dtype)).compile()


def run(x, algorithm, fmt=INT8, num_chunks=1, shape=None, every_device=False):
    x = jnp.asarray(x)
    shape = shape or (x.shape[0],)
    f = _compiled(shape, algorithm, fmt, num_chunks, x.shape[1:], x.dtype, every_device)
    return np.asarray(f(x))


def rel_err(y, x):
    exact = np.asarray(x, np.float64).sum(0)
    return float(np.linalg.norm(y.astype(np.float64) - exact) / np.linalg.norm(exact))


def gaussian(p, n=8192, seed=0):
    return jax.random.normal(jax.random.key(seed), (p, n), jnp.float32)


# ---- exactness without quantization -----------------------------------------------------------


@pytest.mark.parametrize("algorithm", [*QUANTIZED, "psum"])
def test_unquantized_matches_psum_and_exact_sum(algorithm):
    x = gaussian(8, 1000)
    y = run(x, algorithm, fmt=None)
    psum = run(x, "psum", fmt=None)
    np.testing.assert_allclose(y, psum, rtol=0, atol=1e-5)
    assert rel_err(y, x) < 3e-7, f"{algorithm}: rel err {rel_err(y, x):.2e}"


def test_unquantized_bf16_sends_bf16_and_rounds_each_hop():
    x = gaussian(8, 4096).astype(jnp.bfloat16)
    y = run(x, "ring", fmt=None)
    assert y.dtype == jnp.bfloat16
    assert 1e-3 < rel_err(y, x) < 6e-3  # bf16 rounding of the partial sums, hop after hop
    hlo = _compiled((8,), "ring", None, 1, (4096,), jnp.bfloat16).as_text()
    assert sum(eq.hlo_wire_bytes(hlo, 8).values()) == 2 * 7 / 8 * 4096 * 2  # 2 bytes a value


# ---- error against the theory in collectives.py ---------------------------------------------


@pytest.mark.parametrize("p", range(2, 9))
@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "one_shot"])
def test_int8_error_matches_theory(algorithm, p):
    x = gaussian(p, 16384, seed=p)
    measured = rel_err(run(x, algorithm), x)
    predicted = eq.predicted_relative_error(p, fmt=INT8, algorithm=algorithm)
    assert 0.85 < measured / predicted < 1.15, (
        f"{algorithm} p={p}: measured {measured:.4%}, predicted {predicted:.4%}")


def test_int8_error_at_eight_devices_as_advertised():
    x = gaussian(8, 16384, seed=11)
    errs = {a: rel_err(run(x, a), x) for a in ["ring", "bidir_ring", "two_shot", "one_shot"]}
    assert 0.0100 < errs["ring"] < 0.0125 and 0.0100 < errs["bidir_ring"] < 0.0125
    assert 0.0070 < errs["two_shot"] < 0.0085
    assert 0.0050 < errs["one_shot"] < 0.0060
    assert rel_err(run(x, "ring", fmt=None), x) < 3e-7


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring"])
def test_torus_2d(algorithm):
    x = gaussian(8, 8192, seed=5)
    y = run(x, algorithm, shape=(2, 4))
    predicted = eq.predicted_relative_error((2, 4), fmt=INT8, algorithm=algorithm)
    assert 0.85 < rel_err(y, x) / predicted < 1.15
    exact = run(x, algorithm, fmt=None, shape=(2, 4))
    assert rel_err(exact, x) < 3e-7
    np.testing.assert_array_equal(run(x, algorithm, num_chunks=3, shape=(2, 4)), y)
    rows = run(x, algorithm, shape=(2, 4), every_device=True)
    assert all(np.array_equal(rows[0], r) for r in rows[1:])


def test_torus_axis_pair_in_either_order():
    """ppermute numbers devices in mesh order whatever the pair's order: both must be right."""
    x = gaussian(8, 1024, seed=8)
    mesh = _mesh((2, 4))
    for axes in [("a", "b"), ("b", "a")]:
        f = jax.jit(jax.shard_map(lambda v, axes=axes: eq.all_reduce(v[0], axes, fmt=None),
                                  mesh=mesh, in_specs=P(("a", "b")), out_specs=P()))
        assert rel_err(np.asarray(f(x)), x) < 3e-7, axes
    with pytest.raises(ValueError, match="distinct"):
        jax.jit(jax.shard_map(lambda v: eq.all_reduce(v[0], ("a", "a")), mesh=mesh,
                              in_specs=P(("a", "b")), out_specs=P()))(x)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("algorithm", QUANTIZED)
def test_unquantized_two_devices_is_one_exact_addition(algorithm, dtype):
    """With fmt=None the payload travels bit for bit: on 2 devices the result is x0 + x1 in
    f32, rounded once to x's dtype, bitwise."""
    x = gaussian(2, 999, seed=9).astype(dtype)
    expected = (np.asarray(x[0], np.float32) + np.asarray(x[1], np.float32)).astype(x.dtype)
    np.testing.assert_array_equal(run(x, algorithm, fmt=None), expected)


# ---- the contract: shapes, devices, determinism, pipelining ------------------------------


@pytest.mark.parametrize("algorithm", QUANTIZED)
def test_bitwise_identical_on_every_device_and_deterministic(algorithm):
    x = gaussian(8, 1000, seed=3)
    rows = run(x, algorithm, every_device=True)
    assert all(np.array_equal(rows[0], r) for r in rows[1:])
    np.testing.assert_array_equal(rows, run(x, algorithm, every_device=True))
    np.testing.assert_array_equal(rows[0], run(x, algorithm))


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring"])
@pytest.mark.parametrize("num_chunks", [2, 3, 8])
def test_pipelining_is_bitwise_equal(algorithm, num_chunks):
    x = gaussian(8, 5000, seed=4)
    np.testing.assert_array_equal(run(x, algorithm, num_chunks=num_chunks), run(x, algorithm))


@pytest.mark.parametrize("p", [3, 5, 7])
@pytest.mark.parametrize("algorithm", QUANTIZED)
def test_any_length_any_device_count(algorithm, p):
    x = jax.random.normal(jax.random.key(p), (p, 5, 7, 3), jnp.bfloat16)
    y = run(x, algorithm)
    assert y.shape == (5, 7, 3) and y.dtype == jnp.bfloat16
    assert rel_err(y, x) < 0.03


@pytest.mark.parametrize("algorithm", QUANTIZED)
def test_zeros_nan_and_huge_values(algorithm):
    zeros = np.zeros((8, 100), np.float32)
    np.testing.assert_array_equal(run(zeros, algorithm), 0.0)
    x = np.array(gaussian(8, 8 * 64, seed=6))
    x[3, 5] = np.nan  # block 0 of chunk 0
    y = run(x, algorithm)
    assert not np.isfinite(y[:32]).any(), "the NaN's block must be non-finite"
    assert np.isfinite(y[32:]).all(), "a NaN must not spread beyond its block"
    huge = np.asarray(gaussian(8, 256, seed=7)) * 2e37  # sums stay below f32 max (3.4e38)
    y = run(huge, algorithm)
    assert np.isfinite(y).all() and rel_err(y, huge) < 0.02


# ---- bad input ----------------------------------------------------------------------------


def _trace(fn, x):
    mesh = _mesh((8,))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("tp"), out_specs=P()))(x)


def test_bad_input_is_refused_clearly():
    x = jnp.zeros((8, 32))
    with pytest.raises(TypeError, match="floating-point"):
        _trace(lambda v: eq.all_reduce(v[0], "tp"), jnp.zeros((8, 32), jnp.int32))
    with pytest.raises(ValueError, match=r"unknown algorithm 'tree'.*ring"):
        _trace(lambda v: eq.all_reduce(v[0], "tp", algorithm="tree"), x)
    with pytest.raises(ValueError, match=r"unknown mesh axis 'dp'.*tp"):
        _trace(lambda v: eq.all_reduce(v[0], "dp"), x)
    with pytest.raises(ValueError, match="fmt=None"):
        _trace(lambda v: eq.all_reduce(v[0], "tp", algorithm="psum"), x)
    with pytest.raises(ValueError, match="num_chunks"):
        _trace(lambda v: eq.all_reduce(v[0], "tp", algorithm="two_shot", num_chunks=2), x)
    with pytest.raises(TypeError, match="Format"):
        _trace(lambda v: eq.all_reduce(v[0], "tp", fmt="int8"), x)


def test_psum_baseline_is_lax_psum():
    x = gaussian(8, 64)
    np.testing.assert_array_equal(run(x, "psum", fmt=None),
                                  np.asarray(_trace(lambda v: lax.psum(v[0], "tp"), x)))


# ---- bytes: the model equals what the compiled program sends --------------------------------

FORMATS = [None, INT8, eq.Format.int4(), eq.Format.fp8_e4m3(), eq.Format.mxfp4()]


@pytest.mark.parametrize("fmt", FORMATS, ids=eq.format_label)
@pytest.mark.parametrize("algorithm,num_chunks", [("ring", 1), ("ring", 3), ("bidir_ring", 1),
                                                  ("two_shot", 1), ("one_shot", 1)])
def test_wire_bytes_equal_compiled_hlo(algorithm, fmt, num_chunks):
    n = 3000
    hlo = _compiled((8,), algorithm, fmt, num_chunks, (n,), jnp.bfloat16).as_text()
    counted = eq.hlo_wire_bytes(hlo, 8)
    model = eq.wire_bytes(n, 8, fmt=fmt, algorithm=algorithm, dtype="bfloat16",
                          num_chunks=num_chunks)
    assert sum(counted.values()) == model, counted
    assert "all-reduce" not in counted  # no hidden psum


def test_wire_bytes_torus_and_psum():
    n = 4096
    for algorithm in ["ring", "bidir_ring"]:
        hlo = _compiled((2, 4), algorithm, INT8, 1, (n,), jnp.float32).as_text()
        assert sum(eq.hlo_wire_bytes(hlo, 8).values()) == eq.wire_bytes(
            n, (2, 4), fmt=INT8, algorithm=algorithm)
    hlo = _compiled((8,), "psum", None, 1, (n,), jnp.float32).as_text()
    assert eq.hlo_wire_bytes(hlo, 8) == {"all-reduce": eq.wire_bytes(
        n, 8, fmt=None, algorithm="psum", dtype="float32")}
    # XLA:CPU runs a bf16 psum in f32: the HLO moves twice the bytes the (TPU) model counts.
    hlo = _compiled((8,), "psum", None, 1, (n,), jnp.bfloat16).as_text()
    assert eq.hlo_wire_bytes(hlo, 8)["all-reduce"] == 2 * eq.wire_bytes(
        n, 8, fmt=None, algorithm="psum", dtype="bfloat16")


def test_hlo_byte_counting_of_async_collectives():
    """TPU and GPU print collectives as *-start ops returning (operands, results, contexts)."""
    lines = {
        "(u8[100]{0}, u8[800]{0}) all-gather-start(u8[100]{0} %x), "
        "replica_groups={{0,1,2,3,4,5,6,7}}": {"all-gather": 700},
        "(u8[100]{0}, u8[100]{0}, u32[], u32[]) collective-permute-start(u8[100]{0} %x)":
            {"collective-permute": 100},
        "f32[64]{0} all-reduce-start(f32[64]{0} %x), replica_groups={{0,1,2,3}}":
            {"all-reduce": 384},
        "u8[8,16]{1,0} all-to-all(u8[8,16]{1,0} %x), replica_groups=[1,8]<=[8]":
            {"all-to-all": 112},
        "f32[] all-reduce(f32[] %x), replica_groups={{0,1}}": {"all-reduce": 4},
    }
    for line, expected in lines.items():
        assert eq.hlo_wire_bytes(f"  %op = {line}", 8) == expected, line


def test_wire_bytes_refuses_bad_sizes():
    with pytest.raises(ValueError, match=r"n \(values\) must be >= 0"):
        eq.wire_bytes(-100, 8, fmt=INT8, algorithm="ring")
    with pytest.raises(ValueError, match=r"p \(devices\) must be >= 1"):
        eq.wire_bytes(100, 0, fmt=INT8, algorithm="ring")
    assert eq.wire_bytes(100, np.int64(8), fmt=INT8, algorithm="ring") == eq.wire_bytes(
        100, 8, fmt=INT8, algorithm="ring")


def test_byte_ratios():
    n = 1 << 20
    bf16 = eq.wire_bytes(n, 8, fmt=None, algorithm="ring", dtype="bfloat16")
    assert bf16 == 2 * 7 * n * 2 // 8
    assert bf16 / eq.wire_bytes(n, 8, fmt=INT8, algorithm="ring") == pytest.approx(16 / 8.5)
    assert bf16 / eq.wire_bytes(n, 8, fmt=eq.Format.int4(), algorithm="ring") == pytest.approx(
        16 / 4.5)
