"""eq.all_reduce under autodiff, vmap and on pytrees: psum's derivative (straight-through),
exactly where the backward is unquantized and within the error model where it is quantized;
pytrees flattened into buckets whose bytes are those of the HLO; the invariant-gradient trap;
fp8 input, scalars and bad keywords."""

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
from equarx_ref.autodiff import InvariantInputWarning
from equarx_ref.models.predict import quantizing_saves_bytes

AX = "x"
INT8 = eq.Format.int8()
ALGORITHMS = ["ring", "bidir_ring", "two_shot", "one_shot"]


ar = functools.partial(eq.all_reduce, axis_name=AX)  # the public collective, on pytrees too


@functools.cache
def _mesh():
    return eq.make_mesh(DEVICES, (AX,))


def smap(f, out=None, check_vma=True):
    out = P() if out is None else out
    return jax.jit(jax.shard_map(f, mesh=_mesh(), in_specs=P(AX), out_specs=out,
                                 check_vma=check_vma))


#: 1024 values a device: long enough that the default size gate sends int8 for every
#: algorithm (chunks are whole rows of 128 values; `test_the_data_goes_quantized`)
X = jax.random.normal(jax.random.key(0), (8, 1024))
W = jax.random.normal(jax.random.key(1), (1024,))


def rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


CASES = [(a, f) for a in ALGORITHMS for f in (None, INT8)] + [("psum", None)]

#: First derivatives of a linear loss through a collective `red`, each a jitted function of X.
DERIVATIVES = {
    "inner_grad": lambda red, check_vma: smap(
        lambda v: jax.grad(lambda v: jnp.sum(W * red(v[0])))(v), P(AX), check_vma),
    "jvp": lambda red, check_vma: smap(
        lambda v: jax.jvp(red, (v[0],), (2 * v[0] + 1,))[1], P(), check_vma),
    "vjp": lambda red, check_vma: smap(
        lambda v: jax.vjp(red, v[0])[1](W)[0][None], P(AX), check_vma),
}


def _outer(red, check_vma):
    """value_and_grad of a linear loss of the collective's (replicated) result, outside
    shard_map."""
    return jax.jit(jax.value_and_grad(lambda x: jnp.sum(W * smap(lambda v: red(v[0]), P(),
                                                                     check_vma)(x))))


_PSUM_RESULTS = {}


def _of_psum(key, build, check_vma):
    """build(lax.psum, check_vma)(X) as NumPy: what the cases compare with, computed once for
    each `key` and shared by them (psum's side does not depend on the case's collective)."""
    if key not in _PSUM_RESULTS:
        f = build(functools.partial(lax.psum, axis_name=AX), check_vma)
        _PSUM_RESULTS[key] = jax.tree.map(np.asarray, f(X))
    return _PSUM_RESULTS[key]


def test_the_data_goes_quantized():
    """The tests below check what int8 does to derivatives: the default size gate must send
    X (and W, a cotangent) quantized for every algorithm, on 8 devices and on vmap's 4."""
    for algorithm in ALGORITHMS:
        for p in (8, 4):
            assert quantizing_saves_bytes(X.shape[1], p, fmt=INT8, algorithm=algorithm,
                                          dtype="float32"), (algorithm, p)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("algorithm,fmt", CASES)
@pytest.mark.slow
def test_derivatives_are_psums_exactly_where_unquantized(algorithm, fmt, check_vma):
    """The tangent is psum's tangent and the cotangent psum's cotangent, bitwise, whatever the
    forward sends (a linear loss, so the forward's error cannot enter the gradient). psum's
    side is computed once for each check_vma and shared by the cases."""
    mine = functools.partial(ar, fmt=fmt, algorithm=algorithm)
    for name, build in DERIVATIVES.items():
        got, want = build(mine, check_vma)(X), _of_psum((name, check_vma), build, check_vma)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=name)
    (v1, g1), (v2, g2) = _outer(mine, check_vma)(X), _of_psum(("outer", check_vma), _outer,
                                                               check_vma)
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
    want = _of_psum(("grad of sum(y^2)", check_vma), lambda red, _: loss(red), check_vma)
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


@pytest.mark.slow
def test_pytree_is_one_buffer_or_buckets_and_keeps_dtypes():
    tree = {"a": X[:, :50].reshape(8, 5, 10), "b": (X[:, 50:120].astype(jnp.bfloat16),
                                                    X[:, 120:])}
    flat = smap(lambda v: ar(v[0], fmt=INT8))(X)

    def run(**kw):
        return smap(lambda a, b, c: ar({"a": a[0], "b": (b[0], c[0])}, fmt=INT8, **kw))(
            tree["a"], *tree["b"])

    got = run()
    assert jax.tree.map(lambda x: (x.shape, x.dtype), got) == {
        "a": ((5, 10), jnp.float32), "b": (((70,), jnp.bfloat16), ((904,), jnp.float32))}
    # one buffer: the f32 concatenation, quantized as one message (bf16 leaf widened exactly)
    one = smap(lambda v: ar(jnp.concatenate([v[0, :50], v[0, 50:120].astype(jnp.bfloat16)
                                             .astype(jnp.float32), v[0, 120:]]), fmt=INT8))(X)
    np.testing.assert_array_equal(np.asarray(got["a"]).reshape(-1), np.asarray(one[:50]))
    np.testing.assert_array_equal(np.asarray(got["b"][1]), np.asarray(one[120:]))
    assert rel(flat, X.sum(0)) < 0.02
    # buckets of at most 300 bytes (75 f32): the leaves of 50, 70 and 904 values go alone
    buckets = run(bucket_bytes=300)
    alone = smap(lambda v: ar(v[0, 120:], fmt=INT8))(X)
    np.testing.assert_array_equal(np.asarray(buckets["b"][1]), np.asarray(alone))


@pytest.mark.slow
def test_bucket_and_dtype_bytes_match_the_hlo():
    """What is counted is what is sent: wire_bytes of each bucket (in the buffer's dtype) sum
    to the compiled HLO's collective bytes; fmt=None with dtype=bf16 sends 2 bytes a value."""
    shapes = {"a": (8, 300), "b": (8, 44), "c": (8, 1000)}  # leaves in key order
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes.values()]

    def hlo(**kw):
        f = smap(lambda a, b, c: ar({"a": a[0], "b": b[0], "c": c[0]}, **kw))
        return sum(eq.hlo_wire_bytes(f.lower(*args).compile().as_text(), 8).values())

    n = 1344
    assert hlo(fmt=INT8) == eq.wire_bytes(n, 8, fmt=INT8, algorithm="ring", dtype="float32")
    assert hlo(fmt=None, dtype=jnp.bfloat16) == eq.wire_bytes(n, 8, fmt=None, algorithm="ring",
                                                              dtype="bfloat16")
    assert hlo(fmt=None) == eq.wire_bytes(n, 8, fmt=None, algorithm="ring", dtype="float32")
    # buckets of <= 2000 bytes: {a, b} (1376 bytes) then {c} (4000 bytes alone)
    assert hlo(fmt=INT8, bucket_bytes=2000) == sum(
        eq.wire_bytes(m, 8, fmt=INT8, algorithm="ring", dtype="float32") for m in (344, 1000))


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


@pytest.mark.slow
def test_vmap_and_pmap_axes_work_like_psum():
    """Under vmap(axis_name=...) (and pmap) the same schedules run: the gathers are typed
    invariant only over mesh axes. Unquantized: psum's sum; int8: within the model."""
    x = X[:4]
    want = np.asarray(jax.vmap(lambda r: lax.psum(r, "b"), axis_name="b")(x))
    for algorithm in ALGORITHMS:
        got = jax.vmap(lambda r, a=algorithm: eq.all_reduce(r, "b", fmt=None, algorithm=a),
                       axis_name="b")(x)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5,
                                   err_msg=algorithm)
        q = jax.vmap(lambda r, a=algorithm: eq.all_reduce(r, "b", algorithm=a),
                     axis_name="b")(x)
        assert rel(q[0], want[0]) < 1.5 * eq.predicted_relative_error(4, fmt=INT8,
                                                                       algorithm=algorithm)
    g = jax.vmap(jax.grad(lambda r: jnp.sum(W * eq.all_reduce(r, "b"))), axis_name="b")(x)
    np.testing.assert_array_equal(np.asarray(g), np.tile(np.asarray(W) * 4, (4, 1)))
    pm = jax.pmap(lambda r: eq.all_reduce(r, "b", fmt=None), axis_name="b", devices=DEVICES)(X)
    np.testing.assert_allclose(np.asarray(pm), np.tile(np.asarray(X.sum(0)), (8, 1)), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match="unknown mesh axis 'c'"):
        jax.vmap(lambda r: eq.all_reduce(r, "c"), axis_name="b")(x)


@pytest.mark.slow
def test_fp8_input_accumulates_in_f32_and_the_public_keywords_are_checked():
    """A float8 buffer travels as one byte a value (fmt=None) or is quantized from f32 sums;
    the result comes back in float8. Bad keywords: one line each, from all_reduce and
    AllReduce alike (one set of rules)."""
    f8 = X.astype(jnp.float8_e4m3fn)
    exact = np.asarray(f8.astype(jnp.float32).sum(0))
    err = {}
    for fmt in (None, INT8):
        got = smap(lambda v, f=fmt: ar(v[0], fmt=f))(f8)
        assert got.dtype == jnp.float8_e4m3fn
        err[fmt] = rel(got.astype(jnp.float32), exact)
        assert err[fmt] < 0.07, fmt  # e4m3: 3 mantissa bits
    # int8 sends no fewer bytes than fp8 at any size, so the default gate leaves it quantized:
    # f32 partial sums, where the raw fp8 ring rounds every hop's sum to e4m3
    assert err[INT8] < err[None], err
    for kw, err, msg in [
            ({"backward": "int8"}, ValueError, "backward must be one of"),
            ({"bucket_bytes": 0}, ValueError, "bucket_bytes must be >= 1"),
            ({"dtype": "int8"}, TypeError, "dtype must be a floating-point dtype")]:
        with pytest.raises(err, match=msg):
            smap(lambda v, kw=kw: ar(v[0], **kw))(X)
        with pytest.raises(err, match=msg):
            eq.AllReduce(**kw)
    with pytest.raises(TypeError, match="have no common dtype; pass dtype="):
        smap(lambda v: ar({"a": v[0], "b": v[0].astype(jnp.float8_e4m3fn)}))(X)
    ok = smap(lambda v: ar({"a": v[0], "b": v[0].astype(jnp.float8_e4m3fn)},
                           dtype="float32"))(X)
    assert ok["b"].dtype == jnp.float8_e4m3fn
    with pytest.raises(TypeError, match="floating-point arrays, got str at x"):
        smap(lambda v: ar("a"))(X)
    a, b = eq.AllReduce(fmt=None, dtype=jnp.bfloat16), eq.AllReduce(fmt=None, dtype="bfloat16")
    assert a == b and hash(a) == hash(b) and str(a) == "ring bf16 as bfloat16"
    np.testing.assert_array_equal(np.asarray(smap(lambda v: a(v[0], AX))(X)),
                                  np.asarray(smap(lambda v: ar(v[0], fmt=None,
                                                               dtype="bfloat16"))(X)))


def _psum_or(backward):
    """The collective under test (int8 ring with `backward`), or lax.psum for None."""
    if backward is None:
        return functools.partial(lax.psum, axis_name=AX)
    # min_bytes=0: the hessians run on 16 values, which the default gate would send unrounded
    return functools.partial(ar, fmt=INT8, backward=backward, min_bytes=0)


# Derivatives of every order and transformation: d(psum(x)^2) does not depend on the forward's
# error at second order, so each is psum's exactly, or refused (a custom_vjp has no jvp).
HIGHER = {
    "hessian": lambda red, v: jax.hessian(lambda u: jnp.sum(red(u) ** 2))(v[:16]),
    "jacfwd(grad)": lambda red, v: jax.jacfwd(jax.grad(lambda u: jnp.sum(red(u) ** 2)))(v[:16]),
    "jvp(grad)": lambda red, v: jax.jvp(jax.grad(lambda u: jnp.sum(red(u) ** 2)), (v,),
                                        (jnp.cos(v),))[1],
    "grad(grad)": lambda red, v: jax.grad(lambda u: jnp.vdot(W, jax.grad(
        lambda u: jnp.sum(red(u) ** 2))(u)))(v),
    "vmap(grad)": lambda red, v: jax.vmap(jax.grad(lambda u: jnp.sum(W * red(u))))(
        jnp.stack([v, 2 * v])),
    "jacrev": lambda red, v: jax.jacrev(lambda u: red(u)[:4])(v),
}
FIRST_ORDER_REVERSE = ("vmap(grad)", "jacrev")
FORWARD = {  # forward mode: exact with backward="psum", refused by jax with "quantized"
    "jvp": lambda red, v: jax.jvp(red, (v,), (jnp.cos(v),))[1],
    "jacfwd": lambda red, v: jax.jacfwd(red)(v[:8]),
    "linearize": lambda red, v: jax.linearize(red, v)[1](jnp.cos(v)),
}


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("backward", ["psum", "quantized"])
@pytest.mark.slow
def test_every_order_and_transformation_is_psums_or_refused(backward, check_vma):
    """#wrong, derivatives: a hessian through the quantized backward was all zeros (forward
    over reverse differentiated the rounding). Now every transformation gives psum's result
    bitwise, or a clear TypeError (forward mode of the quantized backward, where it
    communicates: a custom_vjp has no jvp; refused in one line naming all_reduce, where it was
    jax's own message)."""
    def run(build, red):
        return np.asarray(smap(lambda v: build(red, v[0])[None], P(AX), check_vma)(X))

    for name, build in {**HIGHER, **FORWARD}.items():
        # psum's result: computed once for each check_vma, shared by both backwards
        want = _of_psum((f"order {name}", check_vma), lambda red, c, b=build: smap(
            lambda v: b(red, v[0])[None], P(AX), c), check_vma)
        if name in FORWARD and backward == "quantized" and not check_vma:
            with pytest.raises(TypeError, match=r"^all_reduce: forward-mode autodiff \(jax.jvp, "
                               r"jax.jacfwd, jax.linearize\) is not supported with "
                               r"backward='quantized' .* use reverse mode") as e:
                run(build, _psum_or(backward))
            assert "\n" not in str(e.value), name
            continue
        got = run(build, _psum_or(backward))
        assert np.abs(want).sum() > 0, name
        if name in FIRST_ORDER_REVERSE and backward == "quantized" and not check_vma:
            # the cotangent itself goes through the quantized collective: within its model
            assert rel(got, want) < 1.5 * eq.predicted_relative_error(8, fmt=INT8,
                                                                      algorithm="ring"), name
            continue
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_linear_transpose_is_psums_or_refused():
    """#wrong, linear_transpose: the unquantized collective is a linear sum and transposes as
    psum does (it raised on bitcast_convert_type); a quantized one rounds, so it is not linear
    and is refused in one line naming what to use instead."""
    def transpose(red, check_vma):  # the cotangent typed as the output is (invariant)
        ct = (lambda v: lax.psum(v, AX)) if check_vma else (lambda v: v)
        return smap(lambda v: jax.linear_transpose(red, v[0])(ct(v[0]))[0][None], P(AX),
                    check_vma)

    for check_vma in (True, False):
        want = np.asarray(transpose(functools.partial(lax.psum, axis_name=AX), check_vma)(X))
        for algorithm in ("ring", "two_shot", "psum"):
            for backward in ("psum", "quantized"):
                red = functools.partial(ar, fmt=None, algorithm=algorithm, backward=backward)
                np.testing.assert_array_equal(np.asarray(transpose(red, check_vma)(X)), want,
                                              err_msg=(algorithm, backward, check_vma))
        with pytest.raises(TypeError, match=r"quantized fmt is not linear .* use jax.vjp"):
            transpose(functools.partial(ar, fmt=INT8), check_vma)(X)


def test_linear_transpose_of_a_cast_sum_is_refused():
    """#wrong, linear_transpose of fmt=None sent in another dtype (`dtype=`): it was psum's
    transpose in the leaf's dtype, skipping the casts the forward makes (f32 leaves sent as bf16
    came back unrounded, unlike jax.vjp's). The casts round, so it is refused in one line; a
    sum sent in the leaves' own dtype still transposes as psum."""
    def transpose(red, check_vma, leaf_dtype, pytree=False):
        def body(v):
            x = v[0].astype(leaf_dtype)
            ct = lax.psum(x, AX) if check_vma else x
            if pytree:  # leaves of two dtypes, sent in their common one
                x, ct = (x, v[0].astype(jnp.bfloat16)), (ct, ct.astype(jnp.bfloat16))
            return jax.tree.leaves(jax.linear_transpose(red, x)(ct))[0][None]
        return smap(body, P(AX), check_vma)

    for check_vma in (True, False):
        for algorithm in ("ring", "psum"):
            for leaf_dtype, dtype in ((jnp.float32, "bfloat16"), (jnp.bfloat16, "float32")):
                red = functools.partial(ar, fmt=None, algorithm=algorithm, dtype=dtype)
                with pytest.raises(TypeError, match=r"^jax.linear_transpose: all_reduce sends "
                                   r"\S+ values as \w+ \(dtype=\), a cast that rounds") as e:
                    transpose(red, check_vma, leaf_dtype)(X)
                assert "\n" not in str(e.value)
            with pytest.raises(TypeError, match=r"sends bfloat16 values as float32"):
                transpose(functools.partial(ar, fmt=None, algorithm=algorithm), check_vma,
                          jnp.float32, pytree=True)(X)
            same = functools.partial(ar, fmt=None, algorithm=algorithm, dtype="f32")
            np.testing.assert_array_equal(
                np.asarray(transpose(same, check_vma, jnp.float32)(X)),
                np.asarray(transpose(functools.partial(lax.psum, axis_name=AX), check_vma,
                                     jnp.float32)(X)))


@pytest.mark.slow
def test_a_traced_key_does_not_leak_from_the_backward():
    """#wrong, tracer leaks: jit(grad) of a quantized backward with stochastic rounding, the key
    a jit argument or made inside the trace (AllReduce(stochastic_seed=)), check_vma=False:
    the custom rule closed over the key and raised UnexpectedTracerError. Now it is the
    gradient eager grad gives with the same key."""
    key = jax.random.key(3)

    def loss(red):
        f = jax.shard_map(lambda v, k: red(v[0], k), mesh=_mesh(), in_specs=(P(AX), P()),
                          out_specs=P(), check_vma=False)
        return lambda x, k: jnp.sum(f(x, k) ** 2)

    by_key = loss(lambda v, k: ar(v, fmt=INT8, key=k, backward="quantized"))
    seeded = eq.AllReduce(stochastic_seed=3, backward="quantized")
    by_seed = loss(lambda v, _k: seeded(v, AX))
    exact = np.asarray(jax.grad(loss(lambda v, _k: lax.psum(v, AX)))(X, key))
    jitted = {}
    for f in (by_key, by_seed):
        eager = np.asarray(jax.grad(f)(X, key))
        jitted[f] = np.asarray(jax.jit(jax.grad(f))(X, key))
        np.testing.assert_allclose(jitted[f], eager, rtol=1e-6)
        assert 0 < rel(eager, exact) < 0.05  # stochastic rounding, forward and backward
    np.testing.assert_allclose(jitted[by_key], jitted[by_seed], rtol=1e-6)


def test_the_warning_points_at_the_callers_line_and_bf16_names_a_dtype():
    """InvariantInputWarning names the line that called all_reduce (or an AllReduce), not a
    frame of jax; dtype="bf16", as the package names bfloat16 everywhere, is bfloat16."""
    for red in (lambda v: ar(v, fmt=None), lambda v: eq.AllReduce(fmt=None)(v, AX)):
        with pytest.warns(InvariantInputWarning) as caught:
            smap(lambda v, red=red: red(jnp.ones(3)))(X)
        assert caught[0].filename == __file__, caught[0].filename
    got = smap(lambda v: ar(v[0], fmt=None, dtype="bf16"))(X)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(
        smap(lambda v: ar(v[0], fmt=None, dtype="bfloat16"))(X)))
    assert eq.AllReduce(fmt=None, dtype="bf16") == eq.AllReduce(fmt=None, dtype="bfloat16")
    assert eq.wire_bytes(64, 8, fmt=None, algorithm="ring", dtype="bf16") == eq.wire_bytes(
        64, 8, fmt=None, algorithm="ring", dtype="bfloat16")
