"""The GPU codec (`kernels.gpu`, Pallas kernels for Triton) against the spec, on any backend.

On a GPU the kernels run natively (Triton compiles them); elsewhere in Pallas' interpret mode,
the same kernel bodies on the CPU. Either way encode must give the spec's bytes, decode the
spec's values and a hop the spec's bytes of the f32 sum, for every format the codec codes and
every data class of the spec. Without a GPU, CI still holds the kernels to Triton: each lowers
to Triton's IR for an H100 (what jax does before XLA hands the IR to Triton's compiler).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import core as jex_core

import equarx_ref as eq
from equarx_ref import spec, wire
from equarx_ref.kernels import gpu
from equarx_ref.spec import data as spec_data

CLASSES = tuple(spec_data.CLASSES)


def _rows(name: str) -> np.ndarray:
    """One row per data class, each padded with zeros to the longest (whole blocks)."""
    fmt = eq.Format.parse(name)
    xs = [spec.to_blocks(spec_data.make(cls, fmt), fmt.block_size).ravel() for cls in CLASSES]
    x = np.zeros((len(xs), max(v.size for v in xs)), np.float32)
    for i, v in enumerate(xs):
        x[i, :v.size] = v
    return x


def _spec_rows(fmt, values):
    qs = [spec.quantize_blocks(spec.to_blocks(v, fmt.block_size), fmt) for v in values]
    return (np.stack([q.values.reshape(-1) for q in qs]),
            np.stack([spec.wire_bytes(q) for q in qs]),
            np.stack([spec.fixed_bytes(q) for q in qs]))


def _same_bytes(got, want, fixed, what):
    got = np.asarray(got)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    bad = np.argwhere((got != want) & fixed)
    assert bad.size == 0, f"{what}: {len(bad)} bytes differ from the spec, first at {bad[0]}"


def _same_values(got, want, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN where the spec has none, or not"
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), \
        f"{what}: values differ from the spec"


@pytest.mark.parametrize("name", gpu.FORMATS)
def test_gpu_codec_gives_the_spec_bytes(name):
    fmt = eq.Format.parse(name)
    x = _rows(name)
    m = x.shape[1]
    values, want, fixed = _spec_rows(fmt, x)
    _same_bytes(jax.jit(lambda v: gpu.encode(v, fmt))(jnp.asarray(x)), want, fixed,
                f"GPU codec encode {name}")
    _same_values(jax.jit(lambda w: gpu.decode(w, fmt, m))(jnp.asarray(want)), values,
                 f"GPU codec decode {name}")
    # the hop adds the classes one row down, subnormals as zeros of their sign (execute.py)
    local = np.roll(x, 1, axis=0)
    local = np.where(np.abs(local) < spec.F32_TINY, np.copysign(np.float32(0), local), local)
    with np.errstate(invalid="ignore", over="ignore"):
        _, next_want, next_fixed = _spec_rows(fmt, (values + local).astype(np.float32))
    _same_bytes(jax.jit(lambda w, v: gpu.hop(w, v, fmt))(jnp.asarray(want), jnp.asarray(local)),
                next_want, next_fixed, f"GPU codec hop {name}")


def test_gpu_codec_keeps_leading_axes_and_bf16():
    """A bf16 message with leading axes, as the collectives hand one over: the XLA codec's
    bytes, the bf16 values `Codec.decode` gives back."""
    fmt = eq.Format.int8()
    x = jax.random.normal(jax.random.key(1), (2, 3, 1024), jnp.float32).astype(jnp.bfloat16)
    w = gpu.encode(x, fmt)
    assert w.shape == (2, 3, fmt.nbytes(1024))
    assert np.array_equal(w, wire.encode(x.astype(jnp.float32), fmt))
    assert np.array_equal(gpu.decode(w, fmt, 1024, jnp.bfloat16),
                          wire.decode(w, fmt, 1024).astype(jnp.bfloat16))


def test_round_half_even_is_jnp_round():
    """The `round` lowering the codec adds for Triton: ties to even, exactly, everywhere."""
    ties = np.arange(-64, 64, dtype=np.float32) + 0.5
    near = np.concatenate([np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    big = np.float32([2**22 + 0.5, 2**23 - 0.5, 2**23, 2**23 + 1, 3e38, -3e38])
    odd = np.float32([np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 0.49999997, -0.49999997])
    rng = np.random.default_rng(0)
    x = np.concatenate([ties, near, big, odd, rng.standard_normal(4096).astype(np.float32) * 100,
                        rng.uniform(2**22, 2**23, 4096).astype(np.float32),  # steps of 1/2
                        rng.integers(0, 2**32, 1 << 16, dtype=np.uint32).view(np.float32)])
    x = x[~np.isnan(x)]  # NaN below (its payload bits are not the rule's)
    got = np.asarray(jax.jit(gpu._round_half_even)(jnp.asarray(x)))
    assert np.array_equal(got.view(np.uint32), np.round(x).view(np.uint32))
    assert np.isnan(gpu._round_half_even(jnp.float32(np.nan)))
    # lax.round's default, ties away from zero, is the rule's other method
    away = np.asarray(jax.jit(lambda v: gpu._round_half_even(v, ties_to_even=False))(x))
    want = np.asarray(lax.round(jnp.asarray(x), lax.RoundingMethod.AWAY_FROM_ZERO))
    assert np.array_equal(away.view(np.uint32), want.view(np.uint32))


def test_round_lowering_in_a_kernel():
    """`lax.round` inside a Pallas kernel, both methods, against numpy: on a GPU the kernel
    runs natively, through the lowering the codec adds to Triton; elsewhere interpreted."""
    from jax.experimental import pallas as pl

    rng = np.random.default_rng(1)
    ties = np.arange(-300, 300, dtype=np.float32) + 0.5
    x = np.concatenate([ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf),
                        np.float32([2**23 - 0.5, 2**23, 3e38, np.inf, -np.inf, -0.0, 1e-40,
                                    -0.4, 0.49999997]),
                        rng.uniform(2**22, 2**23, 2048).astype(np.float32),
                        rng.integers(0, 2**32, 8192, dtype=np.uint32).view(np.float32)])
    x = x[~np.isnan(x)]
    x = np.pad(x, (0, -x.size % 1024))
    gpu._lowering_rules()
    spec = pl.BlockSpec((1024,), lambda i: (i,))

    def kernel_round(v, method):
        def body(x_ref, o_ref):
            o_ref[...] = lax.round(x_ref[...], method)

        return pl.pallas_call(body, grid=(v.size // 1024,), in_specs=[spec], out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct(v.shape, v.dtype),
                              interpret=gpu._interpret(None))(v)

    for method in (lax.RoundingMethod.TO_NEAREST_EVEN, lax.RoundingMethod.AWAY_FROM_ZERO):
        got = np.asarray(jax.jit(kernel_round, static_argnums=1)(x, method))
        big = np.abs(x) >= 2**23
        want = np.round(x) if method == lax.RoundingMethod.TO_NEAREST_EVEN else np.where(
            big, x, np.trunc(x.astype(np.float64) + np.copysign(0.5, x)))  # exact in f64
        assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)), method


@pytest.mark.parametrize("name, why", [("int6", "8-bit and 4-bit elements, not 6-bit"),
                                       ("mxfp6_e2m3", "not 6-bit"),
                                       ("int8/b24", "powers of two, not block_size 24")])
def test_gpu_codec_refuses_what_it_does_not_code(name, why):
    fmt = eq.Format.parse(name)
    assert why in gpu.supports(fmt)
    with pytest.raises(ValueError, match=why):
        gpu.encode(jnp.zeros(fmt.block_size * 4), fmt)


def test_gpu_codec_refuses_bad_messages_in_one_line():
    fmt = eq.Format.int8()
    with pytest.raises(ValueError, match="whole blocks of 32"):
        gpu.encode(jnp.zeros(40), fmt)
    with pytest.raises(ValueError, match=r"wire must be uint8 \[\.\.\., 68\]"):
        gpu.decode(jnp.zeros(60, jnp.uint8), fmt, 64)
    with pytest.raises(ValueError, match=r"wire must be uint8 \[2, 68\]"):
        gpu.hop(jnp.zeros((3, 68), jnp.uint8), jnp.zeros((2, 64)), fmt)
    with pytest.raises(TypeError, match=r"fmt must be an equarx_ref\.Format"):
        gpu.encode(jnp.zeros(64), "int8")


def _h100(monkeypatch):
    """Lowering for a GPU without one: newer jax asks which GPU (jax 0.10 assumes one)."""
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        return
    monkeypatch.setattr(gpu_info, "get_gpu_info",
                        lambda *a, **k: type("Info", (), {"compute_capability": 90})())


@pytest.mark.parametrize("name", ("int8", "mxfp8", "int8/f32", "int4", "mxfp4", "int4/b16"))
def test_gpu_codec_lowers_to_triton(name, monkeypatch):
    """Every kernel lowers to Triton's IR for an H100 (sm_90), from this machine: the lowering
    rules the codec adds are in place, and nothing in the rule is outside Triton's ops."""
    _h100(monkeypatch)
    fmt, n = eq.Format.parse(name), 1 << 13
    x = jax.ShapeDtypeStruct((n,), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((fmt.nbytes(n),), jnp.uint8)
    for fn, args in ((lambda v: gpu.encode(v, fmt, interpret=False), (x,)),
                     (lambda b: gpu.decode(b, fmt, n, jnp.bfloat16, interpret=False), (w,)),
                     (lambda b, v: gpu.hop(b, v, fmt, interpret=False), (w, x))):
        try:
            text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        except ValueError as e:  # jax 0.10 registers Pallas' GPU lowering with its CUDA plugin
            if "install jaxlib GPU" not in str(e) or jax.__version_info__ >= (0, 11):
                raise
            pytest.skip(f"jax {jax.__version__} lowers Pallas for GPUs only with jaxlib's CUDA "
                        "plugin (CI's newest-jax tier lowers it)")
        assert "triton" in text


# ---- Triton's float semantics, emulated on the CPU ----------------------------------------
#
# jax lowers three lax operations to Triton differently from XLA: `neg` as 0 - x (the negation
# of +-0 is +0), `max` and `min` as `maxnumf` and `minnumf` (a NaN operand is dropped), and the
# codec adds `round` (`gpu._round_half_even`). The H100 found the first two in the codec's rule
# (a decoded -0 came back +0, a non-finite block's NaN saturated to 3.4e38); this evaluates
# what the kernels compute with those semantics, so CI holds them to it without a GPU.


def _fmax(x, y):
    return jnp.where(jnp.isnan(x), y, jnp.where(jnp.isnan(y), x, lax.max(x, y)))


def _fmin(x, y):
    return jnp.where(jnp.isnan(x), y, jnp.where(jnp.isnan(y), x, lax.min(x, y)))


def _float(x):
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


TRITON = {
    lax.neg_p: lambda x: jnp.zeros_like(x) - x if _float(x) else lax.neg(x),
    lax.max_p: lambda x, y: _fmax(x, y) if _float(x) else lax.max(x, y),
    lax.min_p: lambda x, y: _fmin(x, y) if _float(x) else lax.min(x, y),
    lax.clamp_p: lambda lo, x, hi: _fmin(_fmax(lo, x), hi) if _float(x) else lax.clamp(lo, x, hi),
    lax.round_p: lambda x, rounding_method: gpu._round_half_even(x),
}


def _eval_as_triton(jaxpr, consts, *args):
    env = {}

    def read(v):
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    for v, val in zip(jaxpr.constvars, consts, strict=True):
        env[v] = val
    for v, val in zip(jaxpr.invars, args, strict=True):
        env[v] = val
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if eqn.primitive in TRITON:
            outs = [TRITON[eqn.primitive](*invals, **eqn.params)]
        elif inner is not None:  # jit, custom_jvp: their bodies under the same semantics
            closed = inner if hasattr(inner, "consts") else jex_core.ClosedJaxpr(inner, ())
            outs = _eval_as_triton(closed.jaxpr, closed.consts, *invals)
        else:
            outs = eqn.primitive.bind(*invals, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, val in zip(eqn.outvars, outs, strict=True):
            env[v] = val
    return [read(v) for v in jaxpr.outvars]


def _as_triton(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    return _eval_as_triton(closed.jaxpr, closed.consts, *args)[0]


def test_the_emulation_is_tritons():
    """The emulated semantics are the ones described, and XLA's differ (else this proves
    nothing): -0 negates to +0, a NaN drops out of max and min."""
    z, nan = jnp.float32(0.0), jnp.float32(np.nan)
    assert not jnp.signbit(_as_triton(lambda v: -v, z)) and jnp.signbit(-z)
    assert _as_triton(lambda a, b: jnp.maximum(a, b), nan, z) == 0 and jnp.isnan(
        jnp.maximum(nan, z))
    assert _as_triton(lambda a: jnp.clip(a, -1.0, 1.0), nan) == -1 or \
        _as_triton(lambda a: jnp.clip(a, -1.0, 1.0), nan) == 1


@pytest.mark.parametrize("name", gpu.FORMATS)
def test_the_rule_gives_the_spec_bytes_under_tritons_semantics(name):
    """What the GPU codec's kernels compute (`quantize_blocks` and the wire's bytes; the decode
    body, `_decode_values`; a hop is one after the other) evaluated with Triton's negation,
    max, min and the added round: the spec's bytes and values, every data class."""
    fmt = eq.Format.parse(name)
    x = _rows(name)
    m = x.shape[1]
    values, want, fixed = _spec_rows(fmt, x)
    _same_bytes(_as_triton(lambda v: wire.encode(v, fmt), jnp.asarray(x)), want, fixed,
                f"encode {name} as Triton computes")
    pb = fmt.payload_bytes_per_block

    def decode(w):  # the decode kernel's body on every row's blocks
        rows = w.reshape(-1, fmt.bytes_per_block)
        cols = [rows[:, pb + i] for i in range(fmt.scale_bytes)]
        return gpu._decode_values(fmt, rows[:, :pb], cols).reshape(w.shape[0], m)

    _same_values(_as_triton(decode, jnp.asarray(want)), values,
                 f"decode {name} as Triton computes")
