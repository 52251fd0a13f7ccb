"""No rule depends on the float environment (issue 30 item 1): subnormal flushing, FMA
contraction, how a division or a reciprocal rounds. What a CPU can emulate is tested here:

- an inexact reciprocal: `scales.reciprocal`, the quantizer's one inexact operation (XLA:GPU's
  1/y is correctly rounded for 87% of values), perturbed by up to +-2 ulps per element: the
  bits stay the spec's;
- flushing: the spec run on inputs whose subnormals are flushed or kept gives the same bits (a
  subnormal input reads as a signed zero by rule), and no dequantized value is subnormal;
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
from test_reference import _check, dataset

import equarx_ref as eq
from equarx_ref import spec
from equarx_ref.quantize import _midpoint_bits
from equarx_ref.scales import significant_bits

quantize_module = sys.modules["equarx_ref.quantize"]  # (equarx_ref.quantize is the function)
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
    assert np.array_equal(spec.wire_bytes(a), spec.wire_bytes(b))
    assert np.array_equal(a.values.view(np.uint32), b.values.view(np.uint32))
    v = np.abs(a.values)
    assert np.all((v == 0) | (v >= spec.F32_TINY))


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
    got = np.asarray(jax.jit(quantize_module._at_least)(r, m, S))
    assert 0.2 < want.mean() < 0.8 and np.array_equal(got, want), np.flatnonzero(got != want)[:5]

    rng = np.random.default_rng(1)
    n = rng.integers(0, 2048, r.size)  # int12's codes: 11 bits
    a = ((n + rng.random(r.size)) * S64).astype(np.float32)
    floor = np.floor(a / S64)
    unfused = a - (floor * S64).astype(np.float32)  # a * b rounded, then - : a GPU's a - n S
    assert np.sum(unfused != a - floor * S64) > r.size // 4  # so the data needs the split
    minus = jax.jit(quantize_module._minus)
    assert np.array_equal(np.asarray(minus(a, floor.astype(np.float32), S)), a - floor * S64)
    for k in (np.maximum(floor - 1, 0), floor + 1):
        got = np.sign(np.asarray(minus(a, k.astype(np.float32), S)))
        assert np.array_equal(got, np.sign(a - k * S64))
