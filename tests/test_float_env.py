"""No rule depends on the float environment (issue 30 item 1): subnormal flushing, FMA
contraction, how a division or a reciprocal rounds. What a CPU can emulate is tested here:

- an inexact reciprocal: `scales.reciprocal`, the quantizer's one inexact operation (XLA:GPU's
  1/y is correctly rounded for 87% of values), perturbed by up to +-2 ulps per element: the
  bits stay the spec's;
- flushing: the spec run on inputs whose subnormals are flushed or kept gives the same bits (a
  subnormal input reads as a signed zero by rule), and no dequantized value is subnormal; and
  the package's quantizer computed as a GPU computes it, subnormal operands kept: its jaxpr
  evaluated op by op in NumPy (IEEE f32, which XLA:CPU is not: it flushes, so the quantizer
  run on XLA:CPU cannot show a rule it lacks), bitwise the spec;
- contraction: fusing a*b + c into one rounding changes nothing when a*b is exact, so every
  product that feeds an addition or a comparison must fit f32's 24 bits: the bit budgets of
  each format are checked, and the fused and unfused forms compared in NumPy (float64 holds
  the exact product, rounded once, as an FMA would).
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jcore
from test_reference import _check, dataset

import equarx_ref as eq
from equarx_ref import spec
from equarx_ref.rounding import _midpoint_bits
from equarx_ref.scales import significant_bits

quantize_module = sys.modules["equarx_ref.quantize"]  # (equarx_ref.quantize is the function)
rounding_module = sys.modules["equarx_ref.rounding"]
scales_module = sys.modules["equarx_ref.scales"]

ALL = ["int8", "int4", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp8", "mxfp4", "int8/f32",
       "int4/f32", "fp8_e4m3/f32", "fp8_e5m2/f32", "int12/f32", "int12", "int7/b8", "int3/b8",
       "fp6_e2m3", "fp6_e3m2/f32", "int2/b8"]
KINDS = ["gaussian", "bf16-valued", "ties", "issue 8", "tiny", "small normal", "huge",
         "near max"]


def _off_by_ulps(r):
    """r moved by -2..+2 ulps, the amount chosen per element from its own bits."""
    bits = jax.lax.bitcast_convert_type(r, jnp.int32)
    k = (bits * 7919 >> 9) % 5 - 2
    off = jax.lax.bitcast_convert_type(bits + k, jnp.float32)
    return jnp.where(jnp.isfinite(r) & (r != 0), off, r)



def _inexact_reciprocal(monkeypatch):
    """The backend's 1/s (`scales.reciprocal`, where the quantizer reads it) off by +-2 ulps."""
    exact = scales_module.reciprocal

    def inexact(s):
        return _off_by_ulps(exact(s))

    monkeypatch.setattr(scales_module, "reciprocal", inexact)
    monkeypatch.setattr(quantize_module, "reciprocal", inexact)

@pytest.mark.parametrize("name", ALL)
@pytest.mark.slow
def test_a_reciprocal_off_by_two_ulps_changes_no_bit(name, monkeypatch):
    _inexact_reciprocal(monkeypatch)
    import test_reference
    monkeypatch.setattr(test_reference, "_jitted", functools.cache(  # compile anew
        lambda fmt: jax.jit(functools.partial(test_reference._package, fmt=fmt))))
    # (int2's top bf16 scale cannot reach f32's maximum: no near-max blocks, as elsewhere)
    errors = _check(name, "jit", KINDS[:-1] if name.startswith("int2") else KINDS)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "fp8_e5m2/f32", "mxfp8", "int4/b8/f32"])
def test_flushing_subnormals_changes_no_bit(name):
    """The spec on the tiny blocks (subnormal inputs among them) with subnormals flushed to
    zero first or kept: the same bits; no dequantized value is subnormal."""
    fmt = eq.Format.parse(name)
    x = dataset(name)["tiny"]
    assert (np.abs(x) < spec.F32_TINY).any() and (x != 0).any()
    flushed = np.where(np.abs(x) < spec.F32_TINY, np.copysign(np.float32(0), x), x)
    a, b = spec.quantize_blocks(x, fmt), spec.quantize_blocks(flushed, fmt)
    assert np.array_equal(spec.canonical_bytes(a), spec.canonical_bytes(b))
    assert np.array_equal(a.values.view(np.uint32), b.values.view(np.uint32))
    v = np.abs(a.values)
    assert np.all((v == 0) | (v >= spec.F32_TINY))


def _shift(x, y, kind):
    """lax's shifts in NumPy: a shift by the width or more gives 0 (or the sign)."""
    bits = x.dtype.itemsize * 8
    big = (y < 0) | (y >= bits)
    y = np.where(big, 0, y).astype(x.dtype)
    if kind == "left":
        return np.where(big, 0, np.left_shift(x, y))
    if kind == "arithmetic":
        return np.where(big, np.where(x < 0, -1, 0), np.right_shift(x, y))
    u = x.view(f"uint{bits}")
    return np.where(big, 0, np.right_shift(u, y.astype(u.dtype))).astype(u.dtype).view(x.dtype)


def _integer_div(x, y):  # lax.div of integers rounds towards zero
    q = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -q, q)


_NUMPY = {
    "abs": np.abs, "add": np.add, "sub": np.subtract, "mul": np.multiply, "neg": np.negative,
    "and": np.bitwise_and, "or": np.bitwise_or, "not": np.invert, "max": np.maximum,
    "min": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "gt": np.greater,
    "ge": np.greater_equal, "floor": np.floor, "is_finite": np.isfinite, "sign": np.sign,
    "div": lambda x, y: _integer_div(x, y) if x.dtype.kind in "iu" else x / y,
    "shift_left": lambda x, y: _shift(x, y, "left"),
    "shift_right_arithmetic": lambda x, y: _shift(x, y, "arithmetic"),
    "shift_right_logical": lambda x, y: _shift(x, y, "logical"),
    "select_n": lambda c, *cases: np.choose(c.astype(np.int32), cases),
    "stack": lambda *xs, axis: np.stack(xs, axis=axis),
    "concatenate": lambda *xs, dimension: np.concatenate(xs, axis=dimension),
    "convert_element_type": lambda x, new_dtype, **_: x.astype(new_dtype),
    "bitcast_convert_type": lambda x, new_dtype, **_: x.view(new_dtype),
    "reshape": lambda x, new_sizes, **_: x.reshape(new_sizes),
    "reduce_max": lambda x, axes, **_: np.max(x, axis=tuple(axes)),
    "reduce_sum": lambda x, axes, **_: np.sum(x, axis=tuple(axes), dtype=x.dtype),
    "round": lambda x, rounding_method: np.rint(x) if int(rounding_method) else
    np.copysign(np.floor(np.abs(x) + x.dtype.type(0.5)), x),
    "broadcast_in_dim": lambda x, shape, broadcast_dimensions, **_: np.broadcast_to(
        x.reshape([x.shape[broadcast_dimensions.index(i)] if i in broadcast_dimensions else 1
                   for i in range(len(shape))]), shape),
    "iota": lambda dtype, shape, dimension, **_: np.broadcast_to(
        np.arange(shape[dimension], dtype=dtype).reshape(
            [-1 if i == dimension else 1 for i in range(len(shape))]), shape),
}
_PARAMS = {"stack": ("axis",), "concatenate": ("dimension",), "round": ("rounding_method",)}


def _numpy_eval(jaxpr, consts, args):
    """A jaxpr evaluated op by op in NumPy: f32 arithmetic as IEEE has it, subnormal operands
    and results kept, as on a GPU (every result cast to its jaxpr dtype)."""
    env = dict(zip(jaxpr.constvars, map(np.asarray, consts), strict=True))
    env.update(zip(jaxpr.invars, map(np.asarray, args), strict=True))
    read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]  # noqa: E731
    for eqn in jaxpr.eqns:
        ins = [np.asarray(read(v)) for v in eqn.invars]
        name, params = eqn.primitive.name, eqn.params
        if "jaxpr" in params or "call_jaxpr" in params:  # jit, custom_jvp_call: their body
            sub = params.get("jaxpr") or params["call_jaxpr"]
            outs = _numpy_eval(sub.jaxpr, sub.consts, ins)
        elif name in ("select_n", "abs", "add", "sub", "mul", "neg", "and", "or", "not",
                      "max", "min", "eq", "ne", "lt", "gt", "ge", "floor", "is_finite",
                      "sign", "div") or name.startswith("shift"):
            outs = [_NUMPY[name](*ins)]
        elif name in _PARAMS:
            outs = [_NUMPY[name](*ins, **{k: params[k] for k in _PARAMS[name]})]
        elif name == "call_hi_primitive" and type(params["_prim"]).__name__ == "Frexp":
            # jax 0.12's frexp, a primitive of its own
            mantissa, exponent = np.frexp(ins[0])
            outs = [mantissa, exponent.astype(np.int32)]
        else:  # one operand (or none: iota) and keyword parameters
            outs = [_NUMPY[name](*ins, **params)]
        for v, out in zip(eqn.outvars, outs, strict=True):
            env[v] = np.asarray(out).astype(v.aval.dtype)
    return [np.asarray(read(v)) for v in jaxpr.outvars]


@pytest.mark.parametrize("name", ["int8", "int4", "fp8_e4m3", "fp4_e2m1", "mxfp8", "mxint8",
                                  "int8/f32", "int4/b8/f32", "fp8_e5m2/f32", "int7/b8"])
@pytest.mark.slow
def test_a_backend_that_keeps_subnormals_gives_the_spec_bits(name):
    """`quantize_blocks` (round to nearest) as a GPU computes it, subnormal operands kept: its
    jaxpr in NumPy, on every data class (the tiny blocks hold subnormal inputs above half a grid
    step, which only the rule, a subnormal reads as a zero of its sign, keeps from rounding
    away from zero): the spec's payload and scales, bit for bit."""
    from equarx_ref.quantize import quantize_blocks

    fmt = eq.Format.parse(name)
    for kind, x in dataset(name).items():
        x = np.asarray(x, np.float32)
        want = spec.quantize_blocks(x, fmt)
        closed = jax.make_jaxpr(lambda v: quantize_blocks(v, fmt, None))(x)
        with np.errstate(all="ignore"):
            payload, stored = _numpy_eval(closed.jaxpr, closed.consts, [x])
        fin = want.finite  # (a non-finite block's scale bytes are not fixed by the rule)
        assert np.array_equal(payload, want.payload), f"{name} {kind}: payload"
        assert np.array_equal(np.asarray(stored)[fin].view(np.uint8),
                              np.asarray(want.scales)[fin].view(np.uint8)), f"{name} {kind}"


@pytest.mark.parametrize("name", [*eq.formats.FORMAT_NAMES, "int2", "int3", "int5", "int6",
                                  "int7", "int9", "int10", "int11", "int12", "fp6_e2m3",
                                  "fp6_e3m2", "fp4_e2m1", "mxint8"])
def test_every_product_feeding_an_add_or_a_comparison_is_exact(name):
    """The bit budgets that make contraction harmless (quantize.py, scales.py): a midpoint
    times a bf16 scale, a midpoint or an integer n times an f32 scale's 12-bit half, elem_max
    times either; and fused against unfused in NumPy at those budgets."""
    for scale in ("bfloat16", "float32"):
        fmt = eq.Format(name, scale_dtype=None if name.startswith("mx") else scale)
        mid = _midpoint_bits(fmt)
        assert significant_bits(fmt.elem_max) <= 12  # product_vs: coef * 12-bit halves
        assert mid + 12 <= 24 and (fmt.scale_dtype != "bfloat16" or mid + 8 <= 24)
    rng = np.random.default_rng(0)
    a = (rng.integers(1, 2**12, 1000) * 0.5).astype(np.float32)  # a 13-bit midpoint
    b = (rng.integers(2**11, 2**12, 1000) * 2.0 ** rng.integers(-60, 60, 1000))  # 12-bit half
    c = rng.standard_normal(1000).astype(np.float32) * a * b.astype(np.float32)
    b = b.astype(np.float32)
    fused = (a.astype(np.float64) * b + c).astype(np.float32)  # one rounding, as an FMA
    unfused = (a * b).astype(np.float32) + c  # two roundings: a * b is exact, so the same
    assert np.array_equal(fused, unfused)


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3", "mxfp4", "int7/b8", "int8/f32",
                                  "int4/f32", "fp8_e4m3/f32"])
def test_stochastic_rounding_ignores_the_reciprocal_s_last_bits(name, monkeypatch):
    """Stochastic rounding with 1/s off by +-2 ulps: the spec's codes."""
    from test_reference import stochastic_errors

    _inexact_reciprocal(monkeypatch)
    errors = stochastic_errors(name, KINDS)
    assert not errors, "\n".join(errors)


def _near_ties(n=4000, seed=0):
    """f32 scales S with full 24-bit significands, multipliers m in [1, 2^23] and remainders
    r < S within two f32 ulps of m 2^-23 S (on it, where it is an f32): the 47-bit near-ties
    that no f32 product can resolve."""
    rng = np.random.default_rng(seed)
    S = (rng.integers(2**23, 2**24, n) * 2.0 ** rng.integers(-90, 40, n)).astype(np.float32)
    S[:8] = np.float32((2**24 - 1) * 2.0**-20)  # the top of a binade: `split_up` carries
    m = rng.integers(1, 2**23 + 1, n)
    m[:4] = 2**23
    r = (m * 2.0**-23 * S.astype(np.float64)).astype(np.float32)  # the nearest f32
    r = (r.view(np.int32) + rng.integers(-2, 3, n).astype(np.int32)).view(np.float32)
    return np.minimum(r, np.nextafter(S, np.float32(0))), m.astype(np.int32), S


def test_stochastic_decision_with_an_f32_scale_is_exact():
    """`_at_least(r, m, S)` is r >= m 2^-23 S as float64 decides it (both sides exact there),
    at near-ties no f32 product can see; `_minus(a, n, S)` is a - n S exactly for
    n = floor(a / S), and its sign is right for n one off either way."""
    r, m, S = _near_ties()
    S64 = S.astype(np.float64)
    want = r.astype(np.float64) >= m * 2.0**-23 * S64
    got = np.asarray(jax.jit(rounding_module._at_least)(r, m, S))
    assert 0.2 < want.mean() < 0.8 and np.array_equal(got, want), np.flatnonzero(got != want)[:5]

    rng = np.random.default_rng(1)
    n = rng.integers(0, 2048, r.size)  # int12's codes: 11 bits
    a = ((n + rng.random(r.size)) * S64).astype(np.float32)
    floor = np.floor(a / S64)
    unfused = a - (floor * S64).astype(np.float32)  # a * b rounded, then - : a GPU's a - n S
    assert np.sum(unfused != a - floor * S64) > r.size // 4  # so the data needs the split
    minus = jax.jit(rounding_module._minus)
    assert np.array_equal(np.asarray(minus(a, floor.astype(np.float32), S)), a - floor * S64)
    for k in (np.maximum(floor - 1, 0), floor + 1):
        got = np.sign(np.asarray(minus(a, k.astype(np.float32), S)))
        assert np.array_equal(got, np.sign(a - k * S64))
