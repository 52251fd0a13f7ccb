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
    x = np.concatenate([ties, near, big, odd,
                        np.random.default_rng(0).standard_normal(4096).astype(np.float32) * 100])
    got = np.asarray(jax.jit(gpu._round_half_even)(jnp.asarray(x)))
    assert np.array_equal(got.view(np.uint32), np.round(x).view(np.uint32))
    assert np.isnan(gpu._round_half_even(jnp.float32(np.nan)))


@pytest.mark.parametrize("name, why", [("int4", "whole-byte elements, not 4-bit"),
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


@pytest.mark.parametrize("name", ("int8", "mxfp8", "int8/f32"))
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
