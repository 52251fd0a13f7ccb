"""all_reduce under autodiff and on pytrees: psum's derivative (straight-through), exactly where
the backward is unquantized and within the error model where it is quantized; pytrees flattened
into buckets whose bytes are those of the HLO; the invariant-gradient trap."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref.autodiff import InvariantInputWarning, reduce_tree

AX = "x"
INT8 = eq.Format.int8()
ALGORITHMS = ["ring", "bidir_ring", "two_shot", "one_shot"]


def ar(x, axis=AX, *, backward="psum", bucket_bytes=None, dtype=None, key=None, **kw):
    """all_reduce of a pytree with the straight-through derivative (the autodiff rule)."""
    if kw.get("algorithm") == "psum":
        return lax.psum(x, axis)
    return reduce_tree(x, (axis,), lambda f, b: eq.all_reduce(
        f, axis, key=None if key is None else jax.random.fold_in(key, b), **kw),
        backward=backward, bucket_bytes=bucket_bytes, dtype=dtype)


@functools.cache
def _mesh():
    return eq.make_mesh(DEVICES, (AX,))


def smap(f, out=None, check_vma=True):
    out = P() if out is None else out
    return jax.jit(jax.shard_map(f, mesh=_mesh(), in_specs=P(AX), out_specs=out,
                                 check_vma=check_vma))


X = jax.random.normal(jax.random.key(0), (8, 200))
W = jax.random.normal(jax.random.key(1), (200,))


def rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


CASES = [(a, f) for a in ALGORITHMS for f in (None, INT8)] + [("psum", None)]


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("algorithm,fmt", CASES)
def test_derivatives_are_psums_exactly_where_unquantized(algorithm, fmt, check_vma):
    """The tangent is psum's tangent and the cotangent psum's cotangent, bitwise, whatever the
    forward sends (a linear loss, so the forward's error cannot enter the gradient)."""
    mine = functools.partial(ar, fmt=fmt, algorithm=algorithm)
    exact = functools.partial(lax.psum, axis_name=AX)

    def inner_grad(red):
        return smap(lambda v: jax.grad(lambda v: jnp.sum(W * red(v[0])))(v), P(AX), check_vma)

    def jvp(red):
        return smap(lambda v: jax.jvp(red, (v[0],), (2 * v[0] + 1,))[1], P(), check_vma)

    def vjp(red):
        return smap(lambda v: jax.vjp(red, v[0])[1](W)[0][None], P(AX), check_vma)

    def outer(red):
        return jax.jit(jax.value_and_grad(lambda x: jnp.sum(W * smap(lambda v: red(v[0]),
                                                                         P(), check_vma)(x))))

    for build in (inner_grad, jvp, vjp):
        got, want = build(mine)(X), build(exact)(X)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=build.__name__)
    (v1, g1), (v2, g2) = outer(mine)(X), outer(exact)(X)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))
    assert abs(float(v1) - float(v2)) <= 0.02 * float(jnp.sum(jnp.abs(W * X.sum(0))))
    if fmt is None:  # unquantized: the forward is the sum to f32 rounding
        np.testing.assert_allclose(float(v1), float(v2), rtol=1e-5)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gradient_within_the_error_model_where_the_forward_enters(algorithm, check_vma):
    """d/dx sum(y^2) = 2 y psum^T(1): the quantized y puts the forward's error into the
    gradient, no more than the model says (Gaussian data, 1.5 times the prediction)."""
    def loss(red):
        return jax.jit(jax.grad(lambda x: jnp.sum(smap(lambda v: red(v[0]), P(),
                                                       check_vma)(x) ** 2)))

    g = loss(functools.partial(ar, fmt=INT8, algorithm=algorithm))(X)
    want = loss(functools.partial(lax.psum, axis_name=AX))(X)
    bound = 1.5 * eq.predicted_relative_error(8, fmt=INT8, algorithm=algorithm)
    assert 0 < rel(g, want) < bound, (rel(g, want), bound)


def test_quantized_backward_sends_the_cotangent_through_the_collective():
    """backward="quantized": under check_vma=False psum's transpose is a psum, and it goes
    through the same quantized collective (error within the model); under check_vma=True it
    sends nothing, so the cotangent is psum's exactly."""
    def grad(check_vma, backward=None):
        red = functools.partial(lax.psum, axis_name=AX) if backward is None else \
            functools.partial(ar, fmt=INT8, backward=backward)
        return np.asarray(smap(lambda v: jax.grad(lambda v: jnp.sum(W * red(v[0])))(v),
                               P(AX), check_vma)(X))

    exact = grad(False)  # psum(W) on every device
    np.testing.assert_allclose(exact, np.tile(np.asarray(W) * 8, (8, 1)), rtol=1e-6)
    np.testing.assert_array_equal(grad(False, "psum"), exact)
    err = rel(grad(False, "quantized"), exact)
    assert 0 < err < 1.5 * eq.predicted_relative_error(8, fmt=INT8, algorithm="ring"), err
    np.testing.assert_array_equal(grad(True, "quantized"), grad(True))
    with pytest.raises(ValueError, match="backward must be one of"):
        smap(lambda v: ar(v[0], fmt=INT8, backward="int8"))(X)


def test_pytree_is_one_buffer_or_buckets_and_keeps_dtypes():
    tree = {"a": X[:, :50].reshape(8, 5, 10), "b": (X[:, 50:120].astype(jnp.bfloat16),
                                                    X[:, 120:])}
    flat = smap(lambda v: ar(v[0], fmt=INT8))(X)

    def run(**kw):
        return smap(lambda a, b, c: ar({"a": a[0], "b": (b[0], c[0])}, fmt=INT8, **kw))(
            tree["a"], *tree["b"])

    got = run()
    assert jax.tree.map(lambda x: (x.shape, x.dtype), got) == {
        "a": ((5, 10), jnp.float32), "b": (((70,), jnp.bfloat16), ((80,), jnp.float32))}
    # one buffer: the f32 concatenation, quantized as one message (bf16 leaf widened exactly)
    one = smap(lambda v: ar(jnp.concatenate([v[0, :50], v[0, 50:120].astype(jnp.bfloat16)
                                             .astype(jnp.float32), v[0, 120:]]), fmt=INT8))(X)
    np.testing.assert_array_equal(np.asarray(got["a"]).reshape(-1), np.asarray(one[:50]))
    np.testing.assert_array_equal(np.asarray(got["b"][1]), np.asarray(one[120:]))
    assert rel(flat, X.sum(0)) < 0.02
    # buckets of at most 300 bytes (75 f32): the leaves of 50, 70 and 80 values go alone
    buckets = run(bucket_bytes=300)
    alone = smap(lambda v: ar(v[0, 120:], fmt=INT8))(X)
    np.testing.assert_array_equal(np.asarray(buckets["b"][1]), np.asarray(alone))


def test_bucket_and_dtype_bytes_match_the_hlo():
    """What is counted is what is sent: wire_bytes of each bucket (in the buffer's dtype) sum
    to the compiled HLO's collective bytes; fmt=None with dtype=bf16 sends 2 bytes a value."""
    shapes = {"a": (8, 300), "b": (8, 44), "c": (8, 1000)}  # leaves in key order
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes.values()]

    def hlo(**kw):
        f = smap(lambda a, b, c: ar({"a": a[0], "b": b[0], "c": c[0]}, **kw))
        return sum(eq.hlo_wire_bytes(f.lower(*args).compile().as_text(), 8).values())

    n = 1344
    assert hlo(fmt=INT8) == eq.wire_bytes(n, 8, fmt=INT8, algorithm="ring")
    assert hlo(fmt=None, dtype=jnp.bfloat16) == eq.wire_bytes(n, 8, fmt=None, algorithm="ring",
                                                              dtype="bfloat16")
    assert hlo(fmt=None) == eq.wire_bytes(n, 8, fmt=None, algorithm="ring", dtype="float32")
    # buckets of <= 2000 bytes: {a, b} (1376 bytes) then {c} (4000 bytes alone)
    assert hlo(fmt=INT8, bucket_bytes=2000) == sum(
        eq.wire_bytes(m, 8, fmt=INT8, algorithm="ring") for m in (344, 1000))


def test_the_trap_is_caught_and_the_tell_reads_sqrt_p():
    """grad w.r.t. replicated params under check_vma=True is already summed: all_reduce warns
    with the fix; after lax.pcast the gradients are per device and nothing is said."""
    from equarx_ref.runs.train import gradient_tell

    params = {"w": jnp.ones(16)}

    def step(pcast):
        def body(x):
            p = lax.pcast(params, AX, to="varying") if pcast else params
            g = jax.grad(lambda p: jnp.sum(jnp.sin(p["w"] * x[0])))(p)
            return ar(g, fmt=INT8)["w"], gradient_tell(g, AX)
        return jax.jit(jax.shard_map(body, mesh=_mesh(), in_specs=P(AX), out_specs=(P(), P())))

    x = jax.random.normal(jax.random.key(2), (8, 16))
    with pytest.warns(InvariantInputWarning, match=r"lax.pcast\(params, 'x', to='varying'\)"):
        summed, tell = step(False)(x)
    np.testing.assert_allclose(float(tell), np.sqrt(8), rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        right, tell = step(True)(x)
    assert float(tell) < 2.0
    exact = jnp.sum(jnp.cos(params["w"] * x) * x, axis=0)
    assert rel(right, exact) < 0.02
    assert rel(summed, 8 * exact) < 0.02  # the trap: p times the sum


def test_scalars_and_bad_leaves():
    with pytest.warns(InvariantInputWarning):  # a constant is the same on every device
        got = smap(lambda v: ar({"s": 2.0, "v": v[0]}, fmt=None))(X)
    assert float(got["s"]) == 16.0
    with pytest.raises(TypeError, match=r"floating-point arrays, got dtype int32 at \['i'\]"):
        smap(lambda v: ar({"i": jnp.arange(3), "v": v[0]}, fmt=INT8))(X)
