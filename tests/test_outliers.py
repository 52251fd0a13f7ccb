"""Static int4 with bf16 outlier features (equarx_ref.outliers, Dong et al.).

Calibration: the moving average and the device windows against a plain NumPy reference, npz
round trip, clear errors for states that do not fit. The collective, on synthetic partial sums
with planted outlier features: every device bitwise equal, outlier features exactly the f32 sum
of their bf16 roundings (one-shot) or the bf16 ring's, the others within the int4 steps; bytes
counted against the compiled HLO. End to end on a small random-weight Gemma: calibrated on one
batch, run inside `forward` at its 12 sites, compiled once per format.
"""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_gemma import SMALL, random_params, tokens_for

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import outliers as O
from equarx_ref.cli import main

p, SITES, T, E = 4, 3, 50, 97       # E - k odd (a padding nibble), T not a multiple of p
PLANTED = [3, 40, 77]


def planted(seed, sites=SITES, tokens=T):
    """[p, sites, tokens, E] partial sums: unit Gaussians, three features 60x wider, shifted."""
    r = np.random.default_rng(seed)
    w = np.ones(E)
    w[PLANTED] = 60.0
    x = r.standard_normal((p, sites, tokens, E)) * w + 0.5 * np.arange(p)[:, None, None, None]
    return x.astype(np.float32)


def mesh():
    return eq.make_mesh(DEVICES[:p], ("tp",))


def run(ar, x, site):
    """ar on x [p, T, E] (device d's rows at [d]): [p, T, E], each device's result."""
    m = mesh()
    f = jax.jit(jax.shard_map(lambda v: ar(v[0], "tp", site=site)[None], mesh=m,
                              in_specs=P("tp"), out_specs=P("tp"), check_vma=True))
    xs = jax.device_put(x, NamedSharding(m, P("tp")))
    return np.asarray(f(xs)), f.lower(xs).compile().as_text()


@pytest.fixture(scope="module")
def state():
    s = O.init_calibration(SITES, p, E, momentum=0.0)    # m = 0: the ranges of this batch
    return O.update_calibration(s, planted(0))


def test_moving_average_and_windows_match_numpy():
    a, b = planted(1), planted(2)
    s = O.update_calibration(O.update_calibration(O.init_calibration(SITES, p, E), a), b)
    assert (int(s["batches"]), int(s["tokens"])) == (2, 2 * T)

    def window(x, length, start):
        return sum(x[(start + i) % p].astype(np.float64) for i in range(length))
    for length in (1, 2, p):
        for start in range(p):
            lo = 0.9 * window(a, length, start).min(1) + 0.1 * window(b, length, start).min(1)
            hi = 0.9 * window(a, length, start).max(1) + 0.1 * window(b, length, start).max(1)
            np.testing.assert_allclose(s["lo"][:, length - 1, start], lo, rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(s["hi"][:, length - 1, start], hi, rtol=1e-5, atol=1e-4)


def test_outliers_found_and_bits(state):
    assert (O.select_outliers(state, 3) == PLANTED).all()
    fmt = O.StaticFormat.from_calibration(state)              # default k = floor(97 / 64) = 1
    assert fmt.k == 1 and fmt.outliers[0, 0] in PLANTED
    fmt3 = O.StaticFormat.from_calibration(state, outliers=3)
    assert fmt3.row_bytes == (E - 3 + 1) // 2 + 2 * 3 and fmt3.bits_per_value == 8 * 53 / 97
    assert str(fmt3) == "int4 static + 3 bf16"


def test_npz_round_trip_and_mismatch_errors(state, tmp_path):
    path = tmp_path / "calib.npz"
    O.save_calibration(path, state)
    back = O.load_calibration(path, sites=SITES, features=E, devices=p)
    assert set(back) == set(state)
    for k in state:
        np.testing.assert_array_equal(back[k], state[k])
    assert O.StaticFormat.from_calibration(back) == O.StaticFormat.from_calibration(state)
    for kw, said in [({"sites": 36}, "3 sites (the model has 36)"),
                     ({"features": 640}, "97 features (the model has 640)"),
                     ({"devices": 8}, "4 devices (the model has 8)")]:
        with pytest.raises(ValueError, match=f"does not match the model.*{re.escape(said)}"):
            O.load_calibration(path, **kw)
    with pytest.raises(ValueError, match="cannot read a calibration"):
        O.load_calibration(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="keys"):
        O.check_calibration({"lo": state["lo"]})
    with pytest.raises(ValueError, match="seen no batch"):
        O.save_calibration(path, O.init_calibration(SITES, p, E))
    with pytest.raises(ValueError, match=r"parts must be \[devices=4, sites=3"):
        O.update_calibration(state, planted(0)[:, :2])
    with pytest.raises(ValueError, match="momentum"):
        O.init_calibration(1, 2, 3, momentum=1.0)


@pytest.mark.parametrize("algorithm", ["one_shot", "ring"])
def test_collective_on_planted_outliers(state, algorithm):
    site = 1
    x = planted(0)[:, site]                                   # the calibration batch: no clipping
    fmt = O.StaticFormat.from_calibration(state, outliers=3)
    y, hlo = run(O.StaticAllReduce(fmt, algorithm), x, site)
    assert all((y[d] == y[0]).all() for d in range(p)), "devices differ"
    y = y[0]
    bf = lambda v: np.asarray(v, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
    out = PLANTED
    if algorithm == "one_shot":                               # f32 sum of bf16 values, rank order
        ref = bf(x[0][:, out])
        for d in range(1, p):
            ref = ref + bf(x[d][:, out])
    else:                                                     # chunk c: devices c+1, c+2, .., c
        tc = -(-T // p)
        ref = np.zeros((T, 3), np.float32)
        for c in range(p):
            rows = slice(c * tc, min(T, (c + 1) * tc))
            acc = x[(c + 1) % p][rows][:, out]
            for i in range(2, p + 1):
                acc = bf(acc) + x[(c + i) % p][rows][:, out]
            ref[rows] = bf(acc)
    np.testing.assert_array_equal(y[:, out], ref, err_msg="outlier features are not bf16-exact")
    inl = np.setdiff1d(np.arange(E), out)
    err = np.abs(y[:, inl] - x.astype(np.float64).sum(0)[:, inl])
    steps = fmt.step[site][0][:, inl]                         # [p, E - k]: each device's step
    if algorithm == "one_shot":
        bound = steps.sum(0) / 2 * (1 + 1e-4) + 1e-5          # half a step per device
    else:                                                     # p - 1 hops + the owner's encode
        bound = sum(fmt.step[site][i].max(0)[inl] for i in range(p)) * 0.5 + 0.05
    assert (err <= bound).all(), f"max err/bound {(err / bound).max():.3f}"
    assert err.mean() < 0.35 * bound.mean()                   # rounding errors partly cancel
    assert sum(eq.hlo_wire_bytes(hlo, p).values()) == O.static_wire_bytes(T, p, fmt, algorithm)


def test_bits_and_bytes_for_gemma_270m_shape():
    s = O.init_calibration(1, p, 640, momentum=0.0)
    s = O.update_calibration(s, np.random.default_rng(0).standard_normal((p, 1, 8, 640)))
    fmt = O.StaticFormat.from_calibration(s)
    assert (fmt.k, fmt.row_bytes, fmt.bits_per_value) == (10, 335, 4.1875)
    x = np.random.default_rng(1).standard_normal((p, 16, 640)).astype(np.float32)
    for algorithm in O.ALGORITHMS:
        _, hlo = run(O.StaticAllReduce(fmt, algorithm), x, 0)
        want = {"one_shot": 3 * 16 * 335, "ring": 2 * 3 * 4 * 335}[algorithm]
        assert sum(eq.hlo_wire_bytes(hlo, p).values()) == \
            O.static_wire_bytes(16, p, fmt, algorithm) == want


def test_zero_rows_stay_zero(state):
    """0 is on every grid: a token whose partial sums are all zero comes back exactly zero
    (Gemma's BOS token has near-zero MLP sums, and a grid without 0 wrecked it)."""
    fmt = O.StaticFormat.from_calibration(state, outliers=3)
    x = planted(0)[:, 0].copy()
    x[:, 5] = 0.0
    for algorithm in O.ALGORITHMS:
        y, _ = run(O.StaticAllReduce(fmt, algorithm), x, 0)
        assert (y[0][5] == 0).all(), algorithm


def test_non_finite_rows_are_carried_by_the_outliers(state):
    fmt = O.StaticFormat.from_calibration(state, outliers=3)
    x = planted(0)[:, 0].copy()
    x[2, 7, 50] = np.inf                                       # an int4 feature of token 7
    y, _ = run(O.StaticAllReduce(fmt), x, 0)
    assert np.isnan(y[0][7, PLANTED]).all()
    assert np.isfinite(np.delete(y[0], 7, axis=0)).all()


def test_bad_use_is_refused(state):
    fmt = O.StaticFormat.from_calibration(state)
    ar = O.StaticAllReduce(fmt)
    x = planted(0)[:, 0]
    with pytest.raises(ValueError, match="say which"):
        run(ar, x, None)
    with pytest.raises(ValueError, match=r"site must be in \[0, 2\], got 3"):
        run(ar, x, 3)
    with pytest.raises(ValueError, match="calibrated on 4 devices"):
        m = eq.make_mesh(DEVICES[:2], ("tp",))
        jax.shard_map(lambda v: ar(v, "tp", site=0), mesh=m, in_specs=P("tp"),
                      out_specs=P("tp"))(jax.device_put(x[:2].reshape(-1, E),
                                                        NamedSharding(m, P("tp"))))
    with pytest.raises(ValueError, match=r"reduces \[\.\.\., 97\] features"):
        run(ar, x[..., :64], 0)
    with pytest.raises(ValueError, match="unknown algorithm"):
        O.StaticAllReduce(fmt, "two_shot")
    with pytest.raises(TypeError, match="StaticFormat"):
        O.StaticAllReduce(eq.Format.int4())


# ---- end to end on a small random-weight Gemma ------------------------------------------------


@pytest.fixture(scope="module")
def small_model():
    from equarx_ref.gemma import calibrate, forward

    params, tokens = random_params(SMALL), tokens_for(SMALL, batch=2, seq=24)
    m = mesh()
    s = O.init_calibration(2 * SMALL.num_layers, p, SMALL.embed_dim, momentum=0.5)
    for seed in (2, 3):
        s = O.update_calibration(s, calibrate.capture(params, tokens_for(SMALL, seed=seed),
                                                      SMALL, m))
    exact = np.asarray(forward(params, tokens, SMALL, mesh=m))
    return params, tokens, s, exact


@pytest.mark.slow
def test_static_collective_in_the_model(small_model):
    from equarx_ref.gemma import calibrate, forward, parallel, shard_params

    params, tokens, s, exact = small_model
    m = mesh()
    placed = shard_params(params, SMALL, m)
    ar = calibrate.static_collective(s, SMALL, p)
    assert ar.sites == 12 and ar.fmt.k == 1
    out = np.asarray(forward(placed, tokens, SMALL, mesh=m, all_reduce=ar))
    tv = 0.5 * np.abs(jax.nn.softmax(out, -1) - jax.nn.softmax(exact, -1)).sum(-1)
    assert 0 < tv.mean() < 0.2 and tv.max() < 0.35, (tv.mean(), tv.max())   # int4: lossy
    # a site-blind collective would use site 0's tables everywhere: the model passes the site
    blind = np.asarray(forward(placed, tokens, SMALL, mesh=m,
                               all_reduce=lambda x, a: ar(x, a, site=0)))
    assert np.abs(blind - exact).mean() > np.abs(out - exact).mean()
    before = parallel._forward_tp._cache_size()
    again = calibrate.static_collective(s, SMALL, p)           # equal, new object
    np.testing.assert_array_equal(
        np.asarray(forward(placed, tokens, SMALL, mesh=m, all_reduce=again)), out)
    assert parallel._forward_tp._cache_size() == before, "an equal format compiled again"


def test_calibration_must_fit_the_model(small_model):
    import dataclasses

    from equarx_ref.gemma import calibrate, forward

    params, tokens, s, _ = small_model
    with pytest.raises(ValueError, match=re.escape("4 devices (the model has 2)")):
        calibrate.static_collective(s, SMALL, 2)
    with pytest.raises(ValueError, match=re.escape("12 sites (the model has 8)")):
        calibrate.static_collective(s, dataclasses.replace(SMALL, num_layers=4), p)
    fewer = {**s, "lo": s["lo"][:8], "hi": s["hi"][:8]}
    ar = O.StaticAllReduce.from_calibration(fewer)
    with pytest.raises(ValueError, match=r"state for 8 AllReduce sites.*has 12"):
        forward(params, tokens, SMALL, mesh=mesh(), all_reduce=ar)


def test_sequences_cut_with_bos():
    from equarx_ref.gemma.calibrate import sequences

    got = sequences([2, 10, 11, 12, 13, 14, 15, 16], 4)
    np.testing.assert_array_equal(got, [[2, 10, 11, 12], [2, 13, 14, 15]])
    with pytest.raises(ValueError, match="one sequence"):
        sequences([2, 10], 4)


def test_cli_refuses_a_missing_calibration_in_one_line(capsys, tmp_path):
    assert main(["outliers", "--calibration", str(tmp_path / "none.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("equarx-ref outliers: error: cannot read a calibration") and \
        "\n" not in err


def test_jnp_input_dtypes_kept(state):
    fmt = O.StaticFormat.from_calibration(state)
    x = jnp.asarray(planted(0)[:, 0], jnp.bfloat16)
    y, _ = run(O.StaticAllReduce(fmt), x, 0)
    assert y.dtype == jnp.bfloat16


def test_derivative_is_psums_and_the_collective_is_a_static_value(state):
    """#wrong, derivatives: the gradient through the static int4 collective was silently zero
    (the rounding's); it is psum's, as all_reduce's, under either check_vma. linear_transpose
    is refused in one line (a quantized sum is not linear). As a value it is static to jit."""
    ar = O.StaticAllReduce(O.StaticFormat.from_calibration(state, outliers=3), "one_shot")
    x = planted(0)[:, 1]
    w = np.random.default_rng(1).standard_normal((T, E)).astype(np.float32)

    def grads(red, check_vma):
        body = lambda v: jax.grad(lambda u: jnp.sum(w * red(u)))(v[0])[None]  # noqa: E731
        return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh(), in_specs=P("tp"),
                                                out_specs=P("tp"), check_vma=check_vma))(x))

    for check_vma in (True, False):
        want = grads(lambda u: jax.lax.psum(u, "tp"), check_vma)
        assert np.abs(want).sum() > 0
        np.testing.assert_array_equal(grads(lambda u: ar(u, "tp", site=1), check_vma), want)
    with pytest.raises(TypeError, match=r"static int4 .* not linear"):
        jax.shard_map(lambda v: jax.linear_transpose(lambda u: ar(u, "tp", site=1), v[0])(
            v[0])[0], mesh=mesh(), in_specs=P("tp"), out_specs=P("tp"), check_vma=False)(x)
    assert jax.tree.leaves(ar) == []
    same = jax.jit(lambda a, v: jax.shard_map(lambda u: a(u[0], "tp", site=1)[None],
                                              mesh=mesh(), in_specs=P("tp"),
                                              out_specs=P("tp"))(v))(ar, x)
    np.testing.assert_array_equal(np.asarray(same), run(ar, x, 1)[0])
