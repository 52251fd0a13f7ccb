"""all_reduce on 8 simulated devices: bitwise against an independent NumPy reference, error
against the model, bytes against the HLO, and the AllReduce object."""

import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import spec as ref
from equarx_ref.models.predict import quantizing_saves_bytes

INT8 = eq.Format.int8()
QUANTIZED = ["ring", "bidir_ring", "two_shot", "one_shot"]


@functools.cache
def _mesh(shape):
    names = ("tp",) if len(shape) == 1 else ("a", "b")
    return eq.make_mesh(DEVICES[: int(np.prod(shape))], names, shape)


def _compiled(shape, algorithm, fmt, num_chunks, x_shape, dtype, every_device=False):
    """jit(shard_map(all_reduce)) for inputs [p, *x_shape]; every_device: one row per device.
    No size gate (min_bytes=0): the reference quantizes every message, short ones included.
    Compiled once for each program: the tests that check one program's result and its bytes
    share it."""
    return _compile(tuple(shape), algorithm, fmt, num_chunks, tuple(x_shape), jnp.dtype(dtype),
                    every_device)


@functools.cache
def _compile(shape, algorithm, fmt, num_chunks, x_shape, dtype, every_device):
    mesh = _mesh(shape)
    axis = mesh.axis_names if len(shape) == 2 else mesh.axis_names[0]

    def body(x):
        y = eq.all_reduce(x[0], axis, fmt=fmt, algorithm=algorithm, num_chunks=num_chunks,
                          min_bytes=0)
        return y[None] if every_device else y

    out = P(axis) if every_device else P()
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=out, check_vma=True))
    return f.lower(jax.ShapeDtypeStruct((int(np.prod(shape)), *x_shape), dtype)).compile()


def run(x, algorithm, fmt=INT8, num_chunks=1, shape=None, every_device=False):
    x = jnp.asarray(x)
    shape = shape or (x.shape[0],)
    f = _compiled(shape, algorithm, fmt, num_chunks, x.shape[1:], x.dtype, every_device)
    return np.asarray(f(x))


def gaussian(p, n=8192, seed=0):
    return jax.random.normal(jax.random.key(seed), (p, n), jnp.float32)


# ---- bitwise against the spec (equarx_ref.spec) -----------------------------

F = eq.Format.parse
# (algorithm, devices, format, dtype, shape of each device's x): every schedule, unquantized
# and quantized, block sizes 8 to 64, MX, f32 scales, bf16 and f32 inputs, ragged lengths.
REFERENCE_CASES = [
    ("ring", (8,), None, jnp.float32, (1000,)),
    ("bidir_ring", (8,), None, jnp.float32, (1000,)),
    ("two_shot", (8,), None, jnp.float32, (1000,)),
    ("one_shot", (8,), None, jnp.float32, (1000,)),
    ("ring", (8,), None, jnp.bfloat16, (4096,)),
    ("ring", (5,), INT8, jnp.bfloat16, (5, 7, 3)),
    ("bidir_ring", (7,), INT8, jnp.bfloat16, (5, 7, 3)),
    ("two_shot", (3,), INT8, jnp.bfloat16, (5, 7, 3)),
    ("one_shot", (5,), INT8, jnp.bfloat16, (5, 7, 3)),
    ("ring", (8,), F("int8/b8"), jnp.float32, (999,)),
    ("bidir_ring", (3,), F("int4/b16"), jnp.float32, (999,)),
    ("two_shot", (8,), F("fp8_e4m3/b64"), jnp.float32, (999,)),
    ("one_shot", (3,), F("int8/b8/f32"), jnp.float32, (999,)),
    ("ring", (8,), F("mxfp4/b16"), jnp.bfloat16, (999,)),
    ("two_shot", (5,), F("fp8_e5m2"), jnp.float32, (999,)),
    ("ring", (2, 4), F("int4/b16"), jnp.float32, (999,)),
    ("bidir_ring", (4, 2), F("mxfp8"), jnp.bfloat16, (999,)),
    ("ring", (4, 2), None, jnp.bfloat16, (999,)),
]


@pytest.mark.parametrize("algorithm,shape,fmt,dtype,x_shape", REFERENCE_CASES,
                         ids=[f"{a}-{'x'.join(map(str, s))}-{eq.format_label(f)}-"
                              f"{jnp.dtype(d).name}" for a, s, f, d, _ in REFERENCE_CASES])
@pytest.mark.slow
def test_bitwise_equal_to_the_numpy_reference(algorithm, shape, fmt, dtype, x_shape):
    """The documented semantics, step by step in NumPy with the reference quantizer: every
    hop's quantization, f32 accumulation and rank-order sums, padding and the final cast. The
    program that ran sends the bytes `wire_bytes` counts."""
    p = int(np.prod(shape))
    x = np.asarray(jax.random.normal(jax.random.key(p), (p, *x_shape), jnp.float32)
                   .astype(dtype))
    want = ref.all_reduce(x, eq.make_schedule(algorithm, shape), fmt)
    rows = run(x, algorithm, fmt=fmt, shape=shape, every_device=True)
    hlo = _compiled(shape, algorithm, fmt, 1, x_shape, dtype, True).as_text()
    assert sum(eq.hlo_wire_bytes(hlo, p).values()) == eq.wire_bytes(
        int(np.prod(x_shape)), shape if len(shape) > 1 else p, fmt=fmt, algorithm=algorithm,
        dtype=jnp.dtype(dtype).name, min_bytes=0)
    assert rows.shape == (p, *x_shape) and rows.dtype == dtype
    for d, got in enumerate(rows):
        diff = got.astype(np.float64) != want.astype(np.float64)
        assert not diff.any(), (f"device {d}: {int(diff.sum())} of {diff.size} values differ "
                                f"from the reference, first at {np.argwhere(diff)[0]}")


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring", "two_shot", "one_shot"])
@pytest.mark.parametrize("name", ["fp8_e4m3", "int8"])
def test_subnormal_inputs_and_sums_follow_the_spec_to_the_sign_of_zero(algorithm, name):
    """Subnormal inputs, zeros of both signs and values that cancel to subnormal sums: every
    f32 value a quantized step adds reads a subnormal as a zero of its sign (execute.py
    `settle`, spec/sums.py), so a GPU, which keeps subnormals, gives what XLA:CPU gives. The
    spec (NumPy keeps subnormals) is the GPU-like side; compared bit for bit, -0 against +0."""
    p, n = 4, 256
    rng = np.random.default_rng(7)
    x = rng.choice(np.array([0.0, -0.0, 1e-40, -1e-40, -3e-39, 1.2e-38, -1.3e-38, 2e-38, 1.0],
                            np.float32), size=(p, n))
    fmt = eq.Format.parse(name)
    want = ref.all_reduce(x, eq.make_schedule(algorithm, (p,)), fmt)
    rows = run(x, algorithm, fmt=fmt, shape=(p,), every_device=True)
    for d, got in enumerate(rows):
        diff = got.view(np.uint32) != want.view(np.uint32)
        assert not diff.any(), (f"device {d}: {int(diff.sum())} values differ from the spec, "
                                f"first {got[diff][0]!r} against {want[diff][0]!r}")


def test_psum_is_the_exact_sum_within_f32_rounding():
    """lax.psum of 8 f32 inputs: within (p - 1) u sum|x_i| (u = 2^-24, any summation order)
    of the exact float64 sum, and bitwise the same on every device."""
    x = np.asarray(gaussian(8, 4096, seed=12)) * np.float32(3.0) ** np.arange(8)[:, None]
    rows = run(x, "psum", fmt=None, every_device=True)
    assert all(np.array_equal(rows[0], r) for r in rows[1:])
    exact = x.astype(np.float64).sum(0)
    bound = 7 * 2.0**-24 * np.abs(x.astype(np.float64)).sum(0) * (1 + 1e-6)
    err = np.abs(rows[0] - exact)
    assert np.all(err <= bound), f"max error / bound {np.max(err / bound):.2f}"


def test_unquantized_bf16_ring_sends_two_bytes_a_value():
    """(every_device: the program the bf16 reference case runs)"""
    hlo = _compiled((8,), "ring", None, 1, (4096,), jnp.bfloat16, True).as_text()
    assert sum(eq.hlo_wire_bytes(hlo, 8).values()) == 2 * 7 / 8 * 4096 * 2


# ---- error against the model in predict.py ----------------------------------------------

ERROR_N = 32768  # values per device: 1024 blocks of 32


def error_and_standard_error(y, x, slices=64):
    """||y - exact|| / ||exact|| and its standard error, from `slices` contiguous slices of
    the message (ratio estimator, delta method): rel^2 = E / X, SE(rel) = rel SE(E/X) / 2."""
    exact = np.asarray(x, np.float64).sum(0).reshape(slices, -1)
    e2 = ((np.asarray(y, np.float64).reshape(slices, -1) - exact) ** 2).sum(1)
    x2 = (exact**2).sum(1)
    ratio = e2.sum() / x2.sum()
    se_ratio = np.sqrt(slices / (slices - 1) * ((e2 - ratio * x2) ** 2).sum()) / x2.sum()
    return float(np.sqrt(ratio)), float(np.sqrt(ratio) * se_ratio / ratio / 2)


# int8: each algorithm on two device counts and each count under two algorithms (rotating:
# algorithm i takes counts i and i + 1 of [8, 2, 3, 5]); each torus shape with int8 (ring on
# two, bidir_ring on two); int4 on every algorithm, 1D and torus.
ERROR_CASES = ([(a, p, INT8) for i, a in enumerate(QUANTIZED)
                for p in ([8, 2, 3, 5] * 2)[i:i + 2]]
               + [("ring", (2, 2), INT8), ("ring", (4, 2), INT8), ("bidir_ring", (2, 4), INT8),
                  ("bidir_ring", (2, 2), INT8)]
               + [("ring", 8, eq.Format.int4()), ("two_shot", 5, eq.Format.int4()),
                  ("one_shot", 3, eq.Format.int4()), ("ring", (4, 2), eq.Format.int4()),
                  ("bidir_ring", (2, 4), eq.Format.int4())])


@pytest.mark.parametrize("algorithm,p,fmt", ERROR_CASES, ids=[
    f"{a}-{p if isinstance(p, int) else 'x'.join(map(str, p))}-{f}" for a, p, f in ERROR_CASES])
@pytest.mark.slow
def test_error_matches_the_model_within_5_percent(algorithm, p, fmt):
    """measured / predicted relative error in [0.95, 1.05] on i.i.d. Gaussian inputs.

    With 32768 values per device the standard error of the measured relative error is about
    0.4-0.6% (computed here, from 64 slices of the message), so +-5% is eight or more standard
    errors: a miss is the model's, not the sample's. The test checks that margin too.
    """
    shape = p if isinstance(p, tuple) else (p,)
    x = gaussian(int(np.prod(shape)), ERROR_N, seed=int(np.prod(shape)))
    measured, se = error_and_standard_error(run(x, algorithm, fmt=fmt, shape=shape), x)
    predicted = eq.predicted_relative_error(p, fmt=fmt, algorithm=algorithm)
    assert se / measured < 0.05 / 6, f"sample too small: relative SE {se / measured:.2%}"
    assert 0.95 <= measured / predicted <= 1.05, (
        f"{algorithm} {p} {fmt}: measured {measured:.5f} +- {se:.5f}, predicted "
        f"{predicted:.5f}, ratio {measured / predicted:.4f}")


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring"])
@pytest.mark.slow
def test_torus_2d_pipelined(algorithm):
    """Pipelined torus (3 pieces a chunk): bitwise the reference, hence the unpipelined run."""
    x = np.asarray(gaussian(8, 8192, seed=5))
    want = ref.all_reduce(x, eq.make_schedule(algorithm, (2, 4)), INT8)
    np.testing.assert_array_equal(run(x, algorithm, num_chunks=3, shape=(2, 4)), want)


def test_torus_axis_pair_in_either_order():
    """ppermute numbers devices in mesh order whatever the pair's order: both must be right."""
    x = gaussian(8, 1024, seed=8)
    mesh = _mesh((2, 4))
    want = ref.all_reduce(np.asarray(x), eq.make_schedule("ring", (2, 4)), None)
    for axes in [("a", "b"), ("b", "a")]:
        f = jax.jit(jax.shard_map(lambda v, axes=axes: eq.all_reduce(v[0], axes, fmt=None),
                                  mesh=mesh, in_specs=P(("a", "b")), out_specs=P()))
        np.testing.assert_array_equal(np.asarray(f(x)), want, err_msg=str(axes))
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
@pytest.mark.slow
def test_bitwise_identical_on_every_device_and_deterministic(algorithm):
    x = gaussian(8, 1000, seed=3)
    rows = run(x, algorithm, every_device=True)
    assert all(np.array_equal(rows[0], r) for r in rows[1:])
    np.testing.assert_array_equal(rows, run(x, algorithm, every_device=True))
    np.testing.assert_array_equal(rows[0], run(x, algorithm))


@pytest.mark.parametrize("algorithm,num_chunks", [("ring", 3), ("ring", 8), ("bidir_ring", 2),
                                                  ("bidir_ring", 3)])
@pytest.mark.slow
def test_pipelining_is_bitwise_equal(algorithm, num_chunks):
    """int8, 5000 f32 values a device: the pipelined result is the unpipelined one bitwise, and
    both programs send the bytes `wire_bytes` counts (the int8 cases of the byte check)."""
    x = gaussian(8, 5000, seed=4)
    np.testing.assert_array_equal(run(x, algorithm, num_chunks=num_chunks), run(x, algorithm))
    for k in (1, num_chunks):
        hlo = _compiled((8,), algorithm, INT8, k, (5000,), jnp.float32).as_text()
        counted = eq.hlo_wire_bytes(hlo, 8)
        assert sum(counted.values()) == eq.wire_bytes(
            5000, 8, fmt=INT8, algorithm=algorithm, num_chunks=k, min_bytes=0), (k, counted)
        assert "all-reduce" not in counted


@pytest.mark.parametrize("algorithm", QUANTIZED)
@pytest.mark.slow
def test_zeros_nan_and_huge_values(algorithm):
    """(1000 values a device: the programs of the test above)"""
    np.testing.assert_array_equal(run(np.zeros((8, 1000), np.float32), algorithm), 0.0)
    x = np.array(gaussian(8, 1000, seed=6))
    x[3, 5] = np.nan  # block 0 of chunk 0
    y = run(x, algorithm)
    assert not np.isfinite(y[:32]).any(), "the NaN's block must be non-finite"
    assert np.isfinite(y[32:]).all(), "a NaN must not spread beyond its block"
    huge = np.asarray(gaussian(8, 1000, seed=7)) * np.float32(2e37)  # sums stay below f32 max
    want = ref.all_reduce(huge, eq.make_schedule(algorithm, (8,)), INT8)
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(run(huge, algorithm), want)


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


# ---- bytes: the model equals what the compiled program sends --------------------------------

# bf16 inputs of 3000 values on 8 devices: each format unpipelined (the algorithms rotating)
# and the pipelined ring on each kind of wire layout: raw bf16, 4-bit packed with E8M0 scales,
# f32 scales on blocks of 8. Elsewhere: int8 on every pipelining
# (test_pipelining_is_bitwise_equal), every reference case's program
# (test_bitwise_equal_to_the_numpy_reference), and test_wrong.py's every format but
# int8/b8/f32 with every algorithm, unpipelined, at several device counts and lengths.
BYTES_CASES = [
    (None, "ring", 1), (eq.Format.int4(), "bidir_ring", 1), (eq.Format.fp8_e4m3(), "two_shot", 1),
    (eq.Format.mxfp4(), "one_shot", 1), (eq.Format.parse("int8/b8/f32"), "bidir_ring", 1),
    (eq.Format.parse("int8/b8/f32"), "two_shot", 1),
    (None, "ring", 3), (eq.Format.mxfp4(), "ring", 3), (eq.Format.parse("int8/b8/f32"), "ring", 3),
]


@pytest.mark.parametrize("fmt,algorithm,num_chunks", BYTES_CASES,
                         ids=[f"{a}-{k}-{eq.format_label(f)}" for f, a, k in BYTES_CASES])
@pytest.mark.slow
def test_wire_bytes_equal_compiled_hlo(algorithm, fmt, num_chunks):
    """The bytes of the compiled program are `wire_bytes`, and no psum hides in it
    (`BYTES_CASES`: rotated, see above)."""
    n = 3000
    hlo = _compiled((8,), algorithm, fmt, num_chunks, (n,), jnp.bfloat16).as_text()
    counted = eq.hlo_wire_bytes(hlo, 8)
    model = eq.wire_bytes(n, 8, fmt=fmt, algorithm=algorithm, dtype="bfloat16",
                          num_chunks=num_chunks, min_bytes=0)  # as compiled: no size gate
    assert sum(counted.values()) == model, counted
    assert "all-reduce" not in counted  # no hidden psum


@pytest.mark.slow
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
        # jax >= 0.11 prints the groups of a 2D mesh by axis name: g = 4 along 'b', 2 along 'a'
        "u8[4,1,544]{2,1,0} all-gather(u8[1,1,544]{2,1,0} %x), channel_id=1, "
        "replica_groups=mesh['a'=2,'b'=4] {'b'}, dimensions={0}": {"all-gather": 3 * 544},
        "u8[2,4,1,544]{3,2,1,0} all-gather(u8[1,4,1,544]{3,2,1,0} %x), channel_id=1, "
        "replica_groups=mesh['a'=2,'b'=4] {'a'}, dimensions={0}": {"all-gather": 4 * 544},
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


# ---- AllReduce: one configuration as a hashable value ------------------------------------


def test_all_reduce_object_is_a_hashable_validated_value():
    a = eq.AllReduce(fmt=INT8, algorithm="ring", num_chunks=2)
    b = eq.AllReduce(fmt=eq.Format("int8"), algorithm="ring", num_chunks=2)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    others = [eq.AllReduce(fmt=INT8, algorithm="ring"),
              eq.AllReduce(fmt=eq.Format.int4(), algorithm="ring", num_chunks=2),
              eq.AllReduce(fmt=INT8, algorithm="bidir_ring", num_chunks=2),
              eq.AllReduce(fmt=None, algorithm="ring", num_chunks=2)]
    assert all(a != o for o in others) and len({a, *others}) == 5
    assert str(eq.AllReduce()) == "ring int8" and eq.AllReduce() == eq.AllReduce(INT8, "ring", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.algorithm = "one_shot"
    with pytest.raises(ValueError, match="unknown algorithm 'tree'"):
        eq.AllReduce(algorithm="tree")
    with pytest.raises(ValueError, match="fmt=None"):
        eq.AllReduce(fmt=INT8, algorithm="psum")
    with pytest.raises(ValueError, match="num_chunks"):
        eq.AllReduce(algorithm="two_shot", num_chunks=2)
    with pytest.raises(ValueError, match="num_chunks"):
        eq.AllReduce(num_chunks=0)
    with pytest.raises(TypeError, match="num_chunks"):
        eq.AllReduce(num_chunks=True)
    with pytest.raises(TypeError, match="Format"):
        eq.AllReduce(fmt="int8")


@pytest.mark.parametrize("config,shape", [
    (eq.AllReduce(eq.Format.parse("int4/b16"), "ring", 2), (4,)),
    (eq.AllReduce(eq.Format.fp8_e4m3(), "one_shot"), (5,)),
    (eq.AllReduce(INT8, "bidir_ring"), (2, 4)),
    (eq.AllReduce(None, "psum"), (8,)),
], ids=str)
@pytest.mark.slow
def test_all_reduce_object_is_all_reduce(config, shape):
    """Called inside shard_map it is all_reduce with its fields, bitwise."""
    mesh = _mesh(shape)
    axis = mesh.axis_names if len(shape) == 2 else mesh.axis_names[0]
    f = jax.jit(jax.shard_map(lambda v: config(v[0], axis), mesh=mesh, in_specs=P(axis),
                              out_specs=P(), check_vma=True))
    x = gaussian(int(np.prod(shape)), 1024, seed=13)  # long enough to go quantized (the gate)
    if config.fmt is not None:
        assert quantizing_saves_bytes(1024, shape if len(shape) > 1 else shape[0],
                                      fmt=config.fmt, algorithm=config.algorithm,
                                      num_chunks=config.num_chunks, dtype="float32")
    np.testing.assert_array_equal(np.asarray(f(x)), run(x, config.algorithm, fmt=config.fmt,
                                                        num_chunks=config.num_chunks,
                                                        shape=shape))


def test_equal_all_reduce_objects_compile_once():
    """As a static argument of jit, equal configurations share one trace (a partial would not)."""
    mesh = _mesh((8,))
    traces = []

    @functools.partial(jax.jit, static_argnums=1)
    def total(x, collective):
        traces.append(collective)
        return jax.shard_map(lambda v: collective(v[0], "tp"), mesh=mesh, in_specs=P("tp"),
                             out_specs=P())(x)

    x = gaussian(8, 256)
    first = total(x, eq.AllReduce(INT8, "two_shot"))
    again = total(x, eq.AllReduce(eq.Format("int8"), "two_shot"))
    assert len(traces) == 1
    np.testing.assert_array_equal(first, again)
    total(x, eq.AllReduce(eq.Format.int4(), "two_shot"))
    assert len(traces) == 2


def test_an_all_reduce_object_is_a_static_value_as_an_ordinary_jit_argument():
    """#wrong, AllReduce as a value: passed to jit without static_argnums it was taken for an
    array (it has a field `dtype`) and traced ('DynamicJaxprTracer' object is not callable).
    It is a pytree with no leaves: the same result as static, compiled once per configuration."""
    mesh = _mesh((8,))
    traces = []

    @jax.jit
    def total(collective, x):
        traces.append(collective)
        return jax.shard_map(lambda v: collective(v[0], "tp"), mesh=mesh, in_specs=P("tp"),
                             out_specs=P())(x)

    x = gaussian(8, 1024)  # long enough to go quantized (the size gate)
    assert quantizing_saves_bytes(1024, 8, fmt=INT8, algorithm="two_shot", dtype="float32")
    config = eq.AllReduce(INT8, "two_shot", dtype="float32")
    assert jax.tree.leaves(config) == []
    np.testing.assert_array_equal(np.asarray(total(config, x)),
                                  run(x, "two_shot", fmt=INT8, shape=(8,)))
    total(eq.AllReduce(eq.Format("int8"), "two_shot", dtype="float32"), x)
    assert len(traces) == 1 and traces[0] == config


def _gated_run(x, monkeypatch, device_kind, **kw):
    """all_reduce over DEVICES[:p] (a fresh trace) with the chip lookup answering
    `device_kind`, as on that platform: (result, wire bytes read from the compiled HLO)."""
    from equarx_ref import collectives

    monkeypatch.setattr(collectives, "mesh_device_kind", lambda: device_kind)
    mesh = _mesh((x.shape[0],))
    f = jax.jit(jax.shard_map(lambda v: eq.all_reduce(v[0], "tp", **kw)[None], mesh=mesh,
                              in_specs=P("tp"), out_specs=P("tp")))
    compiled = f.lower(x).compile()
    return np.asarray(compiled(x)), sum(eq.hlo_wire_bytes(compiled.as_text(), x.shape[0])
                                        .values())


@pytest.mark.parametrize("n,quantized", [(640, True), (256, False), (4, False)])
@pytest.mark.slow
def test_default_size_gate_reads_the_message_never_the_chip(monkeypatch, n, quantized):
    """min_bytes=None: quantize only when that sends fewer bytes, whatever the platform. The
    issue's case: an int8 ring of 640 bf16 values per device on 8 devices sends 1904 bytes
    quantized (chunks of one 128-value row), 2240 as bf16: quantized on CPU and on a v5e alike
    (the chip's crossover, 1358 bytes, would send bf16 there). 256 values a device pad to the
    same whole rows, more bytes than 896 as bf16, so bf16; 4 values, the same."""
    p = 8
    x = jax.random.normal(jax.random.key(3), (p, n)).astype(jnp.bfloat16)
    fmt = eq.Format.int8()
    sent = {f: eq.wire_bytes(n, p, fmt=f, algorithm="ring", dtype="bfloat16", min_bytes=0)
            for f in (fmt, None)}
    assert (sent[fmt] < sent[None]) == quantized
    assert (sent[fmt], sent[None]) == {640: (1904, 2240), 256: (1904, 896), 4: (1904, 28)}[n]
    assert quantizing_saves_bytes(n, p, fmt=fmt, algorithm="ring", dtype="bfloat16") \
        == quantized
    assert eq.wire_bytes(n, p, fmt=fmt, algorithm="ring", dtype="bfloat16") == \
        sent[fmt if quantized else None]
    runs = {kind: _gated_run(x, monkeypatch, kind, fmt=fmt) for kind in ("cpu", "TPU v5 lite")}
    want, want_bytes = _gated_run(x, monkeypatch, "cpu", fmt=fmt if quantized else None,
                                  min_bytes=0)
    for kind, (got, hlo_bytes) in runs.items():
        assert np.array_equal(got, want), kind                       # the same bits
        assert hlo_bytes == want_bytes == sent[fmt if quantized else None], kind


def test_auto_size_gate_reads_the_mesh_devices(monkeypatch):
    """min_bytes="auto" (opt-in) takes the chip's time-model crossover for the devices the
    collective runs on: a v5e sends this message in bf16, CPU devices quantize it."""
    p, n = 8, 640
    fmt = eq.Format.int8()
    x = jax.random.normal(jax.random.key(3), (p, n)).astype(jnp.bfloat16)
    assert _cost_module().default_min_bytes(p, fmt=fmt, algorithm="ring",
                                              device_kind="TPU v5 lite") > 2 * n
    quantized, q_bytes = _gated_run(x, monkeypatch, "cpu", fmt=fmt, min_bytes=0)
    raw, raw_bytes = _gated_run(x, monkeypatch, "cpu", fmt=None)
    assert not np.array_equal(quantized, raw) and (q_bytes, raw_bytes) == (1904, 2240)
    on_cpu, cpu_bytes = _gated_run(x, monkeypatch, "cpu", fmt=fmt, min_bytes="auto")
    on_v5e, v5e_bytes = _gated_run(x, monkeypatch, "TPU v5 lite", fmt=fmt, min_bytes="auto")
    assert np.array_equal(on_cpu, quantized) and cpu_bytes == 1904
    assert np.array_equal(on_v5e, raw) and v5e_bytes == 2240


def test_auto_size_gate_reads_the_mesh_not_the_default_backend(monkeypatch):
    """A TPU runtime with one chip (free Colab) runs the ring on simulated CPU devices: the
    default backend says TPU, the mesh says CPU, and "auto" must not gate as on a TPU."""
    from equarx_ref.devices import mesh_device_kind

    class Chip:  # the default backend's first device, as a TPU runtime reports it
        device_kind, platform = "TPU v5 lite", "tpu"

    real = jax.devices
    monkeypatch.setattr(jax, "devices", lambda backend=None: real(backend) if backend
                        else [Chip()])
    kinds = []

    def body(v):
        kinds.append(mesh_device_kind())
        return eq.all_reduce(v[0], "tp", min_bytes="auto")[None]

    x = jax.random.normal(jax.random.key(1), (2, 32))
    assert _cost_module().default_min_bytes(2, fmt=eq.Format.int8(), algorithm="ring",
                                              device_kind="TPU v5 lite") > x[0].nbytes
    auto = jax.jit(jax.shard_map(body, mesh=_mesh((2,)), in_specs=P("tp"),
                                 out_specs=P("tp")))(x)
    assert kinds == [DEVICES[0].device_kind]
    ungated = jax.jit(jax.shard_map(lambda v: eq.all_reduce(v[0], "tp", min_bytes=0)[None],
                                    mesh=_mesh((2,)), in_specs=P("tp"), out_specs=P("tp")))(x)
    np.testing.assert_array_equal(np.asarray(auto), np.asarray(ungated))  # quantized, as CPU


def test_bad_size_gate_is_refused_in_one_line():
    for bad, err in (("Auto", ValueError), ("fast", ValueError), (-1, ValueError),
                     (2.5, TypeError)):
        with pytest.raises(err, match=r"^min_bytes must be") as e:
            eq.AllReduce(min_bytes=bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"'auto' .*chip's crossover"):
        eq.AllReduce(min_bytes="AUTO")
    with pytest.raises(ValueError, match=r"^min_bytes='auto' needs the chip, which wire_bytes "
                                         r"cannot read"):
        eq.wire_bytes(256, 8, fmt=eq.Format.int8(), algorithm="ring", min_bytes="auto")


def _cost_module():
    """The time model's module, where it lives (models/ after the reorganization)."""
    for name in ("equarx_ref.models.cost", "equarx_ref.cost"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("no equarx_ref cost module")


@pytest.mark.parametrize("name", ["int8", "int4", "mxfp8"])
@pytest.mark.slow
def test_the_essays_ring_is_all_reduce_bitwise(name):
    """The dozen lines of ring that open collectives.py's essay run, and give bitwise what
    `all_reduce(..., algorithm="ring")` gives: the essay cannot drift from the code."""
    import textwrap

    from jax import lax

    from equarx_ref import collectives, wire

    doc = collectives.__doc__
    block = textwrap.dedent(doc[doc.index("    p, me ="):doc.index("\nis bitwise")])
    scope = {"lax": lax, "wire": wire}
    exec("def ring(x, axis, fmt):\n" + textwrap.indent(block, "    "), scope)
    fmt, mesh = eq.Format.parse(name), _mesh((8,))
    f = jax.jit(jax.shard_map(lambda v: scope["ring"](v[0], "tp", fmt)[None], mesh=mesh,
                              in_specs=P("tp"), out_specs=P("tp"), check_vma=False))
    x = gaussian(8, n=8 * 32 * 16, seed=5)
    assert np.array_equal(np.asarray(f(x)), run(x, "ring", fmt, every_device=True))
