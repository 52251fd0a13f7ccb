"""The GPU codec (`kernels.gpu`, Pallas kernels for Triton) against the spec, on any backend.

On a GPU the kernels run natively (Triton compiles them); elsewhere in Pallas' interpret mode,
the same kernel bodies on the CPU. Either way encode must give the spec's message
(`spec.message` of `spec.quantize_blocks`: payload `[G PB, R]` and scale bits `[G, R]`), decode
the spec's values and a hop the spec's message of the f32 sum, for every format the codec codes
and every data class of the spec. Without a GPU, CI still holds the kernels to Triton: each
lowers to Triton's IR for an H100 (what jax does before XLA hands the IR to Triton's compiler),
and the kernels' tile code is evaluated with Triton's float semantics.
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
from equarx_ref.quantize import zero_subnormals
from equarx_ref.spec import data as spec_data

CLASSES = tuple(spec_data.CLASSES)
SCALE_BITS = {"bfloat16": np.uint16, "float32": np.uint32, "e8m0": np.uint8}
#: A scale's exponent field, all ones in a NaN or an infinity (E8M0: its NaN byte, 255).
NON_FINITE = {"bfloat16": 0x7F80, "float32": 0x7F800000, "e8m0": 0xFF}


def _rows(fmt) -> np.ndarray:
    """One row per data class, each padded with zeros to the longest (whole message rows)."""
    xs = [spec.to_blocks(spec_data.make(cls, fmt), fmt.block_size).ravel() for cls in CLASSES]
    m = -(-max(v.size for v in xs) // fmt.row) * fmt.row
    x = np.zeros((len(xs), m), np.float32)
    for i, v in enumerate(xs):
        x[i, :v.size] = v
    return x


def _spec_messages(fmt, values):
    """The spec on rows `[L, m]`: (values `[L, m]`, payload `[L, G PB, R]`, scale bits
    `[L, G, R]`, the blocks' finiteness in the scales' layout `[L, G, R]`)."""
    qs = [spec.quantize_blocks(spec.to_blocks(v, fmt.block_size), fmt) for v in values]
    messages = [spec.message(q, fmt) for q in qs]
    g = fmt.blocks_per_row
    return (np.stack([q.values.reshape(-1) for q in qs]), np.stack([p for p, _ in messages]),
            np.stack([s for _, s in messages]),
            np.stack([q.finite.reshape(-1, g).T for q in qs]))


def _same_message(got, payload, scales, finite, fmt, what):
    """`got` is the spec's message to the bit: every payload byte, every finite block's scale
    bits; a non-finite block's scale is some NaN or infinity of the scale's type."""
    assert isinstance(got, wire.Message), f"{what}: not a wire.Message: {type(got).__name__}"
    p, s = np.asarray(got.payload), np.asarray(got.scales)
    assert p.dtype == np.uint8 and p.shape == payload.shape, \
        f"{what}: payload {p.dtype}{list(p.shape)}, the spec's uint8{list(payload.shape)}"
    assert s.dtype == scales.dtype and s.shape == scales.shape, \
        f"{what}: scales {s.dtype}{list(s.shape)}, the spec's {scales.dtype}{list(scales.shape)}"
    bad = np.argwhere(p != payload)
    assert bad.size == 0, f"{what}: {len(bad)} payload bytes differ from the spec, first at " \
        f"{bad[0].tolist()} ([..., G PB, R]): {p[tuple(bad[0])]} != {payload[tuple(bad[0])]}"
    field = NON_FINITE[fmt.scale_dtype]
    ok = np.where(finite, s == scales, (s.astype(np.uint32) & field) == field)
    bad = np.argwhere(~ok)
    assert bad.size == 0, f"{what}: {len(bad)} scales differ from the spec, first at " \
        f"{bad[0].tolist()} ([..., G, R]): {s[tuple(bad[0])]:#x} != {scales[tuple(bad[0])]:#x}"


def _same_values(got, want, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN where the spec has none, or not"
    bad = np.argwhere((got.view(np.uint32) != want.view(np.uint32)) & ~nan)
    assert bad.size == 0, f"{what}: {len(bad)} values differ from the spec, first at " \
        f"{bad[0].tolist()}: {got[tuple(bad[0])]!r} != {want[tuple(bad[0])]!r}"


def _hop_case(fmt, x, values):
    """The hop's local values (the classes one row down, subnormals as zeros of their sign, as
    the collectives add them) and the spec's next message, of the f32 sum."""
    local = np.roll(x, 1, axis=0)
    local = np.where(np.abs(local) < spec.F32_TINY, np.copysign(np.float32(0), local), local)
    with np.errstate(invalid="ignore", over="ignore"):
        return local, _spec_messages(fmt, (values + local).astype(np.float32))


def _message(payload, scales):
    return wire.Message(jnp.asarray(payload), jnp.asarray(scales))


@pytest.mark.parametrize("name", gpu.FORMATS)
@pytest.mark.slow
def test_gpu_codec_gives_the_spec_message(name):
    """encode, decode and a hop of every data class, a message of rows each (several
    messages to a grid step): the spec's payload, scales and values, to the bit."""
    fmt = eq.Format.parse(name)
    x = _rows(fmt)
    m = x.shape[1]
    values, payload, scales, finite = _spec_messages(fmt, x)
    _same_message(jax.jit(lambda v: gpu.encode(v, fmt))(jnp.asarray(x)), payload, scales,
                  finite, fmt, f"GPU codec encode {name}")
    message = _message(payload, scales)
    _same_values(jax.jit(lambda w: gpu.decode(w, fmt, m))(message), values,
                 f"GPU codec decode {name}")
    local, (_, *want) = _hop_case(fmt, x, values)
    _same_message(jax.jit(lambda w, v: gpu.hop(w, v, fmt))(message, jnp.asarray(local)), *want,
                  fmt, f"GPU codec hop {name}")


@pytest.mark.parametrize("name, shape", [("int8", (2, 3, 64 * 128)),  # 32-row tiles, 2 a message
                                         ("mxfp4", (3, 3 * 128)),  # a row a step, 3 messages
                                         ("int8/b256", (2, 3 * 256))])  # G = 1: a row a block
@pytest.mark.slow
def test_gpu_codec_keeps_leading_axes_and_bf16(name, shape):
    """bf16 messages with leading axes, as the collectives hand them over, in tiles of 32 rows,
    of one row, and with one block a row: the XLA codec's message, the bf16 values
    `Codec.decode` gives back, and the XLA hop's message (each side under jit, as the
    collectives run them)."""
    fmt = eq.Format.parse(name)
    m = shape[-1]
    x = (jax.random.normal(jax.random.key(1), shape, jnp.float32) * 8).astype(jnp.bfloat16)
    local = jax.random.normal(jax.random.key(2), shape, jnp.float32).astype(jnp.bfloat16)
    got = jax.jit(lambda v: gpu.encode(v, fmt))(x)
    want = jax.jit(lambda v: wire.encode(v.astype(jnp.float32), fmt))(x)
    (pb, rows), (g, _) = wire.message_shapes(m, fmt)
    assert got.payload.shape == (*shape[:-1], pb, rows) and got.scales.shape == (
        *shape[:-1], g, rows)
    for a, b, part in ((got.payload, want.payload, "payload"), (got.scales, want.scales,
                                                               "scales")):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"encode {name}: {part} differs"
    decoded = jax.jit(lambda w: wire.decode(w, fmt, m))(want)
    assert np.array_equal(np.asarray(jax.jit(lambda w: gpu.decode(w, fmt, m, jnp.bfloat16))(
        want)).view(np.uint16),
                          np.asarray(decoded.astype(jnp.bfloat16)).view(np.uint16))
    # the spec agrees on the 2-D case's rows (its values are all finite here)
    flat = np.asarray(x, np.float32).reshape(-1, m)
    _, payload, scales, finite = _spec_messages(fmt, flat)
    _same_message(jax.tree.map(lambda a: a.reshape(-1, *a.shape[-2:]), got), payload, scales,
                  finite, fmt, f"encode {name}")
    nxt = jax.jit(lambda d, v: wire.encode(d + zero_subnormals(v.astype(jnp.float32)), fmt))(
        decoded, local)
    hopped = jax.jit(lambda w, v: gpu.hop(w, v, fmt))(want, local)
    for a, b, part in ((hopped.payload, nxt.payload, "payload"), (hopped.scales, nxt.scales,
                                                                  "scales")):
        assert a.dtype == b.dtype and np.array_equal(a, b), f"hop {name}: {part} differs"


def test_gpu_codec_fails_on_wrong_bytes(monkeypatch):
    """The checks above fail on one wrong bit: with the tile code's payload or its scale
    bits sabotaged, encode is no longer the spec's."""
    fmt = eq.Format.int8()
    x = _rows(fmt)[:4]
    _, payload, scales, finite = _spec_messages(fmt, x)
    tile = gpu._encode_tile
    for sabotage in (lambda p, s: (p ^ 1, s), lambda p, s: (p, s ^ 1),
                     lambda p, s: (p, jnp.roll(s, 1, axis=-1))):
        monkeypatch.setattr(gpu, "_encode_tile", lambda v, f, sabotage=sabotage: sabotage(
            *tile(v, f)))
        with pytest.raises(AssertionError, match="differ from the spec"):
            _same_message(gpu.encode(jnp.asarray(x), fmt), payload, scales, finite, fmt,
                          "sabotaged")


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
        gpu.encode(jnp.zeros(fmt.row * 4), fmt)


@pytest.mark.slow
def test_gpu_codec_refuses_bad_messages_in_one_line():
    fmt = eq.Format.int8()
    good = jax.jit(wire.encode, static_argnums=1)(jnp.zeros((2, 256)), fmt)  # payload
    # [2, 128, 2], scales [2, 4, 2]
    cases = [
        (ValueError, r"x must be values \[\.\.\., m\] of whole rows of 128",
         lambda: gpu.encode(jnp.zeros(160), fmt)),
        (TypeError, r"x must hold floating-point values",
         lambda: gpu.encode(jnp.zeros(128, jnp.int32), fmt)),
        (TypeError, r"fmt must be an equarx_ref\.Format",
         lambda: gpu.encode(jnp.zeros(128), "int8")),
        (TypeError, r"message must be an equarx_ref\.wire\.Message",
         lambda: gpu.decode(jnp.zeros((2, 160), jnp.uint8), fmt, 256)),
        (TypeError, r"message must be an equarx_ref\.wire\.Message.* without scales",
         lambda: gpu.decode(wire.Message(good.payload), fmt, 256)),
        (ValueError, r"message must be uint8 \[\.\.\., 128, 3\] and uint16\[\.\.\., 4, 3\]",
         lambda: gpu.decode(good, fmt, 384)),
        (ValueError, r"got uint8\[2, 128, 2\] and uint32\[2, 4, 2\]",
         lambda: gpu.decode(good._replace(scales=good.scales.astype(jnp.uint32)), fmt, 256)),
        (ValueError, r"whole rows of 128 values: 200 values",
         lambda: gpu.decode(good, fmt, 200)),
        (ValueError, r"message must be uint8 \[3, 128, 2\] and uint16\[3, 4, 2\]",
         lambda: gpu.hop(good, jnp.zeros((3, 256)), fmt)),
    ]
    for kind, match, call in cases:
        with pytest.raises(kind, match=match) as e:
            call()
        assert "\n" not in str(e.value), str(e.value)


def _h100(monkeypatch):
    """Lowering for a GPU without one: newer jax asks which GPU (jax 0.10 assumes one); where
    it asks moved from Pallas' Triton backend (jax 0.11) to jax._src.gpu_info (jax 0.12)."""
    import importlib

    for where in ("jax._src.pallas.triton.gpu_info", "jax._src.gpu_info"):
        try:
            gpu_info = importlib.import_module(where)
        except ImportError:
            continue
        monkeypatch.setattr(gpu_info, "get_gpu_info",
                            lambda *a, **k: type("Info", (), {"compute_capability": 90})())


@pytest.mark.parametrize("name", ("int8", "mxfp8", "int8/f32", "int4", "mxfp4", "int4/b16"))
def test_gpu_codec_lowers_to_triton(name, monkeypatch):
    """Every kernel lowers to Triton's IR for an H100 (sm_90), from this machine, in both of
    its tilings (32-row tiles of one message; several short messages a step): the lowering
    rules the codec adds are in place, and nothing in the rule is outside Triton's ops."""
    _h100(monkeypatch)
    fmt = eq.Format.parse(name)
    for shape in ((1 << 13,), (8, 256)):
        m, lead = shape[-1], shape[:-1]
        (pb, rows), (g, _) = wire.message_shapes(m, fmt)
        x = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
        w = wire.Message(jax.ShapeDtypeStruct((*lead, pb, rows), jnp.uint8),
                         jax.ShapeDtypeStruct((*lead, g, rows), SCALE_BITS[fmt.scale_dtype]))
        for fn, args in ((lambda v: gpu.encode(v, fmt, interpret=False), (x,)),
                         (lambda b, m=m: gpu.decode(b, fmt, m, jnp.bfloat16, interpret=False),
                          (w,)),
                         (lambda b, v: gpu.hop(b, v, fmt, interpret=False), (w, x))):
            try:
                text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
            except ValueError as e:  # jax 0.10 registers Pallas' GPU lowering with its plugin
                if "install jaxlib GPU" not in str(e) or jax.__version_info__ >= (0, 11):
                    raise
                pytest.skip(f"jax {jax.__version__} lowers Pallas for GPUs only with jaxlib's "
                            "CUDA plugin (CI's newest-jax tier lowers it)")
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
    """fn(*args) evaluated with Triton's semantics: its outputs, as a list. The evaluation is
    traced and compiled as one program (op by op, eagerly, each operation would compile on
    its own); test_the_emulation_is_tritons holds that program to Triton's semantics."""
    closed = jax.make_jaxpr(fn)(*args)
    return jax.jit(lambda *a: _eval_as_triton(closed.jaxpr, closed.consts, *a))(*args)


def test_the_emulation_is_tritons():
    """The emulated semantics are the ones described, and XLA's differ (else this proves
    nothing): -0 negates to +0, a NaN drops out of max and min, in the one compiled program
    `_as_triton` makes (XLA's simplifier does not turn 0 - x back into -x)."""
    z, nan = jnp.float32(0.0), jnp.float32(np.nan)
    assert not jnp.signbit(_as_triton(lambda v: -v, z)[0]) and jnp.signbit(-z)
    assert _as_triton(lambda a, b: jnp.maximum(a, b), nan, z)[0] == 0 and jnp.isnan(
        jnp.maximum(nan, z))
    assert _as_triton(lambda a: jnp.clip(a, -1.0, 1.0), nan)[0] in (-1, 1)


@pytest.mark.parametrize("name", gpu.FORMATS)
@pytest.mark.slow
def test_the_tile_code_gives_the_spec_under_tritons_semantics(name):
    """What the GPU codec's kernels compute on a tile (`_encode_tile`, `_decode_tile`,
    `_hop_tile`: every grid step's body but its loads and stores), evaluated with Triton's
    negation, max, min and the added round on the data classes' messages as one tile: the
    spec's message and values."""
    fmt = eq.Format.parse(name)
    x = _rows(fmt)
    L, m = x.shape
    g, b = fmt.blocks_per_row, fmt.block_size
    values, payload, scales, finite = _spec_messages(fmt, x)
    tile = (L, m // fmt.row, g, b)  # [L, T, G, B]
    got = _as_triton(lambda v: gpu._encode_tile(v.reshape(tile), fmt), jnp.asarray(x))
    _same_message(wire.Message(got[0].reshape(payload.shape), got[1]), payload, scales, finite,
                  fmt, f"encode {name} as Triton computes")
    got = _as_triton(lambda p, s: gpu._decode_tile(p.reshape(L, g, -1, m // fmt.row), s, fmt),
                     jnp.asarray(payload), jnp.asarray(scales))
    _same_values(got[0].reshape(L, m), values, f"decode {name} as Triton computes")
    local, (_, *want) = _hop_case(fmt, x, values)
    got = _as_triton(lambda p, s, v: gpu._hop_tile(p.reshape(L, g, -1, m // fmt.row), s,
                                                   v.reshape(tile), fmt),
                     jnp.asarray(payload), jnp.asarray(scales), jnp.asarray(local))
    _same_message(wire.Message(got[0].reshape(payload.shape), got[1]), *want, fmt,
                  f"hop {name} as Triton computes")
