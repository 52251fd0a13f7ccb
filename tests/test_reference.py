"""Every format, bitwise, against the spec (equarx_ref.spec: NumPy + ml_dtypes, no jax):
stored scales, payload bytes, canonical bytes, messages and dequantized values, under jit and
eagerly.

The data: Gaussian blocks over twelve decades, bf16-valued blocks (amax / elem_max is then often
exactly a bf16 value: the case a reciprocal rounds one step too high), heavy tails (Student-t
with 2 degrees of freedom, lognormal magnitudes), blocks built on rounding ties (values exactly
half-way between grid points once scaled, and one f32 ulp either side), the blocks the issue
reported, all-zero, tiny, non-finite and near-overflow (amax up to f32's largest) blocks.
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import equarx_ref as eq
from equarx_ref import spec as ref
from equarx_ref.wire import encode, to_bytes

FORMATS = ["int8", "int4", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp8", "mxfp4", "mxint8",
           "int8/f32", "int4/f32", "fp8_e4m3/f32", "int8/b8", "int8/b64", "int4/b16",
           "int4/b8/f32", "fp8_e5m2/b64", "fp8_e4m3/b16/f32", "fp4_e2m1/b8", "mxfp8/b64",
           "mxfp4/b16"]
# Run under jit only (the eager path is the same code; CI time matters):
JIT_ONLY = [
    # OCP MX v1.0: six-bit elements; the no-clip ceil scale rule (the floor rule, OCP's,
    # is the default: FORMATS)
    "mxfp6_e2m3", "mxfp6_e3m2", "fp6_e2m3/b16", "fp6_e3m2/f32", "mxfp8/ceil",
    "mxfp4/ceil", "mxfp6_e2m3/ceil", "mxfp6_e3m2/ceil", "mxint8/ceil",
    "mxfp4/b16/ceil",
    # bit-packed integer widths (the hop-aware ring plans send them)
    "int6", "int7/b8", "int9", "int10/b64", "int12/f32", "int3/b8", "int5/b16", "int2/b8"]
BLOCKS = 96  # per kind of data: ~700 blocks per format in all


def _issue_blocks(B):
    """The blocks issue 8 reported: a scale one step too large under jit, a tie rounded up."""
    rows = []
    for head in ([208.359375, 46.7578125], [6.34375], [406.0], [406.0, 203.0, 29.0]):
        row = np.zeros(B, np.float32)
        row[: len(head)] = head
        rows += [row, -row]
    return np.stack(rows)


def _tie_blocks(fmt, rng, n):
    """Blocks whose scale is a chosen s (amax = elem_max * s) and whose other values sit exactly
    on midpoints between grid values, on grid values, or one f32 ulp off a midpoint."""
    G, _ = ref.grid(fmt.name)
    B = fmt.block_size
    if fmt.is_mx:
        s = 2.0 ** rng.integers(-30, 30, n)
    else:  # a bf16 value, so that midpoint * s is exact in f32 (also for f32 scales)
        s = rng.uniform(1, 2, n).astype(ml_dtypes.bfloat16).astype(np.float64)
        s *= 2.0 ** rng.integers(-30, 30, n)
    mids = (G[:-1] + G[1:]) / 2
    kind = rng.integers(0, 4, (n, B))
    pick_mid = mids[rng.integers(0, len(mids), (n, B))]
    pick_grid = G[rng.integers(0, len(G), (n, B))]
    v = np.where(kind == 0, pick_grid, pick_mid) * s[:, None]
    x = v.astype(np.float32)
    x = np.where(kind == 2, np.nextafter(x, np.float32(np.inf)), x)
    x = np.where(kind == 3, np.nextafter(x, np.float32(0)), x)
    x = np.where(rng.random((n, B)) < 0.5, -x, x)
    x[:, 0] = G[-1] * s * np.where(rng.random(n) < 0.5, -1, 1)  # amax: fixes the scale at s
    return x[:, rng.permutation(B)]


def _huge_blocks(fmt, rng, B):
    """amax between 2^126 and f32's largest value (that value itself in some blocks): scales,
    reciprocals, midpoint products and dequantized values near overflow. (int2's elem_max 1
    leaves no finite bf16 scale above bf16's largest value, 3.39e38: its top is that.)"""
    bf16_max = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    top = min(ref.F32_MAX, bf16_max * ref.grid(fmt.name)[0][-1])
    amax = np.float32(2.0**126) * rng.uniform(1, 2, 8).astype(np.float32)
    amax[::4] = top
    x = rng.uniform(-1, 1, (8, B)) * amax[:, None].astype(np.float64)
    x[:, 0] = amax
    return np.clip(x, -ref.F32_MAX, ref.F32_MAX)


def _zero_blocks(B):
    """All-zero blocks, one of them with -0.0 values: scale 0 (E8M0: 2^-127), zero payload."""
    neg_zero = np.where(np.arange(B) % 2 == 1, np.float32(-0.0), np.float32(0.0))
    return np.stack([np.zeros(B, np.float32), neg_zero])


def _non_finite_blocks(B):
    nan, inf = np.ones(B, np.float32), -np.ones(B, np.float32)
    nan[B // 2], inf[1] = np.nan, -np.inf
    return np.stack([nan, inf])


def _tiny_blocks(fmt, rng):
    """Blocks around the tiny threshold 2^T (T from amax's exponent bits: spec.tiny_exponent;
    below it: scale 0, E8M0 2^-127, and a zero payload), and blocks above it holding
    subnormal inputs (read as zeros of their sign) and values down to the grid's smallest
    step (dequantized values near f32's smallest normal)."""
    B = fmt.block_size
    top = 2.0 ** (ref.tiny_exponent(fmt.name) - 127)
    signs = np.where(np.arange(B) % 3 == 0, -1, 1)
    amaxes = [1e-37, 1.49e-36, top * (1 - 2.0**-10), top * (1 - 2.0**-24), top,
              top * (1 + 2.0**-10)]
    rows = [np.float32(a) * signs for a in amaxes]
    for amax in (top, top * 1.5, top * 2**10):
        row = rng.uniform(-1, 1, B) * amax * 2.0 ** -rng.integers(0, 24, B)
        row[rng.random(B) < 0.3] = rng.uniform(-1, 1) * ref.F32_TINY  # subnormal inputs
        row[0] = amax
        rows.append(row)
    return np.stack(rows).astype(np.float32)


def _small_blocks(rng, B):
    """Small but normal values: amax in [1e-36, 1e-31], every value within 16x of it (so no
    input and no dequantized value is subnormal). The documented rules hold here too."""
    sign = np.where(rng.random((BLOCKS, B)) < 0.5, -1.0, 1.0)
    mag = rng.uniform(1 / 16, 1, (BLOCKS, B)) * 10.0 ** rng.uniform(-36, -31, (BLOCKS, 1))
    return sign * mag


def _near_max_blocks(rng, B):
    """Blocks whose amax is f32's largest value or within 2^-6 of it, signs mixed: where the
    covering scale puts the grid's top past 3.4e38."""
    amax = ref.F32_MAX * (1 - np.array([0.0, 2.0**-24, 2.0**-12, 2.0**-8, 2.0**-6]))
    x = rng.uniform(-1, 1, (len(amax), B)) * amax[:, None]
    x[:, 0] = amax * np.where(np.arange(len(amax)) % 2, -1, 1)
    return x


@functools.cache
def dataset(name):
    """{kind: f32 blocks [blocks, B]} for one format, seeded by its name."""
    fmt = eq.Format.parse(name)
    B = fmt.block_size
    rng = np.random.default_rng(list(name.encode()))
    gauss = rng.standard_normal((BLOCKS, B)) * 10.0 ** rng.uniform(-6, 6, (BLOCKS, 1))
    bf16 = rng.standard_normal((BLOCKS, B)).astype(ml_dtypes.bfloat16).astype(np.float64)
    bf16 *= 2.0 ** rng.integers(-40, 40, (BLOCKS, 1))
    sign = np.where(rng.random((BLOCKS, B)) < 0.5, -1.0, 1.0)
    data = {
        "gaussian": gauss,
        "bf16-valued": bf16,
        "student-t(2)": rng.standard_t(2, (BLOCKS, B)),
        "lognormal(0, 3)": sign * rng.lognormal(0.0, 3.0, (BLOCKS, B)),
        "ties": _tie_blocks(fmt, rng, BLOCKS),
        "issue 8": _issue_blocks(B),
        "all-zero": _zero_blocks(B),
        "non-finite": _non_finite_blocks(B),
        "small normal": _small_blocks(rng, B),
        "near max": _near_max_blocks(rng, B),
        "huge": _huge_blocks(fmt, rng, B),
    }
    data["tiny"] = _tiny_blocks(fmt, rng)
    return {k: np.asarray(v, np.float32) for k, v in data.items()}


def _package(x, fmt):
    """The package's quantization of x (whole blocks), its canonical bytes, and the message
    of x padded with zero blocks to whole rows (what the collectives send)."""
    q = eq.quantize(x, fmt)
    rows = jnp.pad(x.reshape(-1), (0, -x.size % fmt.row))
    return q.payload, q.scales, eq.dequantize(q), to_bytes(q), encode(rows[None], fmt)


@functools.cache
def _jitted(fmt):
    return jax.jit(functools.partial(_package, fmt=fmt))


def _bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _check(name, mode, kinds):
    """Quantize the chosen kinds of data with the package (jit or eager) and the reference:
    a list of readable differences (empty when bitwise equal). (test_float_env.py uses it.)"""
    return _compare(name, mode, kinds)[0]


def _compare(name, mode, kinds):
    """`_check`'s differences, and the package's dequantized values and stored scales of the
    chosen blocks.

    The blocks are padded with all-zero blocks to as many as the REGULAR kinds have (507, an
    odd count: the message pads them to whole rows for every G > 1), so that every check of a
    format runs the same program: one compile under jit, and eagerly one per primitive, shared
    by every test of the format (and eagerly by the formats of its block size)."""
    fmt = eq.Format.parse(name)
    data = {k: v for k, v in dataset(name).items() if k in kinds}
    chosen = sum(len(v) for v in data.values())
    if chosen < _padded_blocks(name):
        data["padding (all-zero)"] = np.zeros((_padded_blocks(name) - chosen, fmt.block_size),
                                              np.float32)
    x = np.concatenate(list(data.values()))
    kind = np.concatenate([[k] * len(v) for k, v in data.items()])
    want = ref.quantize_blocks(x, fmt)
    fn = _jitted(fmt) if mode == "jit" else functools.partial(_package, fmt=fmt)
    payload, scales, values, wire, message = fn(jnp.asarray(x.ravel()))
    payload, scales, values, wire = (np.asarray(a) for a in (payload, scales, values, wire))
    message = [np.asarray(a)[0] for a in message]
    values = values.reshape(want.values.shape)
    fin = want.finite
    errors = []

    def differ(what, bad, ref_rows, pkg_rows):
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            errors.append(f"{name} {mode} {what}: {int(bad.sum())} of {bad.size} blocks differ; "
                          f"first in '{kind[b]}' block {b}: x={x[b][:4]}...\n"
                          f"    reference {ref_rows[b][:6]}\n    package   {pkg_rows[b][:6]}")

    flagged = (scales == 255) if fmt.is_mx else ~np.isfinite(scales.astype(np.float32))
    differ("non-finite scale", flagged != ~fin, want.scales[:, None], scales[:, None])
    differ("stored scale", (_bits(scales) != _bits(want.scales)) & fin, want.scales[:, None],
           scales[:, None])
    differ("payload bytes", np.any(payload != want.payload, axis=1), want.payload, payload)
    differ("dequantized values", np.any(_bits(values) != _bits(want.values), axis=1) & fin |
           np.any(np.isfinite(values), axis=1) & ~fin, want.values, values)
    # the wire buffer, block after block: its payload bytes, then its scale's bytes (NaN bit
    # patterns may vary)
    ref_wire, compare = ref.canonical_bytes(want), ref.fixed_bytes(want)
    if not errors and not np.array_equal(wire[compare], ref_wire[compare]):
        errors.append(f"{name} {mode}: to_bytes is not block after block (payload, scale)")
    # the message (encode, the collectives' path): the spec's message of the blocks padded
    # with zero blocks to whole rows, and a permutation of to_bytes' very bytes
    blocks = len(x)
    pad = np.zeros((-blocks % fmt.blocks_per_row, fmt.block_size), np.float32)
    padded = ref.quantize_blocks(np.concatenate([x, pad]), fmt)
    want_payload, want_scales = ref.message(padded, fmt)
    finite = padded.finite.reshape(-1, fmt.blocks_per_row).T
    if message[0].shape != want_payload.shape or message[1].dtype != want_scales.dtype or \
            not np.array_equal(message[0], want_payload) or \
            not np.array_equal(message[1][finite], want_scales[finite]):
        errors.append(f"{name} {mode}: encode's message is not the spec's message")
    back, bits = ref.from_message(*message, fmt)
    canonical = np.concatenate([back, bits.view(np.uint8).reshape(len(bits), -1)], axis=1)
    if not np.array_equal(canonical[:blocks].ravel(), wire):
        errors.append(f"{name} {mode}: encode (the collectives' path) differs from to_bytes")
    return errors, values[:chosen], scales[:chosen]


REGULAR = ["gaussian", "bf16-valued", "student-t(2)", "lognormal(0, 3)", "ties", "issue 8",
           "all-zero", "tiny", "huge"]


def _padded_blocks(name):
    """The blocks of the REGULAR kinds: what `_check` pads every other choice of kinds to."""
    return sum(len(dataset(name)[k]) for k in REGULAR)


@pytest.mark.parametrize("name,mode", [(n, m) for n in FORMATS for m in ("jit", "eager")]
                         + [(n, "jit") for n in JIT_ONLY])
def test_bitwise_against_reference(name, mode):
    errors = _check(name, mode, REGULAR)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("mode", ["jit", "eager"])
@pytest.mark.parametrize("name", ["int8", "int4/b16", "fp8_e4m3/f32", "fp4_e2m1", "mxfp8"])
def test_small_normal_blocks_follow_the_same_rules(name, mode):
    """Values between 1e-36 and 1e-31 are normal floats: the scale and rounding rules hold
    exactly there too (an exact comparison must not lose its difference to a flush to zero)."""
    errors = _check(name, mode, ["small normal"])
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("name", FORMATS)
def test_blocks_near_f32_max_stay_within_the_bound(name):
    """amax up to 3.4028e38: bitwise the reference, finite, and each value within the format's
    usual error (half a grid step of the block, as everywhere else) plus the saturation's
    loss, under one scale step (2^-7 of amax at most for a bf16 scale); under OCP MX's floor
    rule, values past elem_max s saturate by design: at most 1 - elem_max / 2^(emax_elem + 1)
    of them is lost (e4m3 12.5%, e2m1 25%). Under jit and eagerly, each bitwise and bounded."""
    for mode in ("jit", "eager"):
        errors, y, scales = _compare(name, mode, ["near max"])
        assert not errors, "\n".join(errors)
        _near_max_bound(name, y, scales)


def _near_max_bound(name, y, scales):
    """The near-max blocks' bound (the test's docstring) on the package's values and scales."""
    fmt = eq.Format.parse(name)
    x = dataset(name)["near max"]
    y = np.asarray(y, np.float64)
    assert np.isfinite(y).all()
    amax = np.abs(x).max(axis=1, keepdims=True)
    if fmt.is_int:
        half_step = amax / (2 * fmt.elem_max)
    else:  # half an ULP of the element format, relative to the value (or to amax, when small)
        half_step = np.maximum(np.abs(x), amax / 2**fmt.mant_bits) * 2.0 ** -(fmt.mant_bits + 1)
    half_step *= 2 if fmt.is_mx else 1 + 2.0**-7  # an E8M0 scale is up to 2x coarse
    err = np.abs(y - x)
    lost = 2.0**-7
    if fmt.scale_rule == "floor":  # saturation by design: each value's loss past elem_max s
        s = 2.0 ** (np.asarray(scales, np.float64) - 127)[:, None]
        err = np.maximum(err - np.maximum(np.abs(x) - fmt.elem_max * s, 0), 0)
        lost = 1 - fmt.elem_max / 2.0 ** (fmt.emax_elem + 1)
    worst = float((err / half_step).max())
    assert worst <= 1, f"{name}: error up to {worst:.2f} half steps near f32's maximum"
    top = np.abs(y).max(axis=1) / amax[:, 0]
    assert top.min() >= 1 - lost - 1e-6, f"{name}: the largest value lost {1 - top.min():.2%}"


@pytest.mark.parametrize("mode", ["jit", "eager"])
@pytest.mark.parametrize("name", ["int8", "int4/b8/f32", "fp8_e4m3", "fp8_e5m2", "mxfp8",
                                  "mxfp4/ceil"])
def test_tiny_blocks_get_a_zero_scale_and_a_zero_payload(name, mode):
    """amax below the format's tiny threshold (decided on amax's exponent bits, the same on
    every backend): scale 0 (E8M0: 2^-127), dequantized zeros, and (like an all-zero block) a
    zero payload. Just above it the usual rules, every dequantized value a normal f32; a
    subnormal input reads as a zero of its sign."""
    errors, y, _ = _compare(name, mode, ["tiny"])
    assert not errors, "\n".join(errors)
    fmt = eq.Format.parse(name)
    x = dataset(name)["tiny"]
    y = np.abs(y)
    assert np.all((y == 0) | (y >= ref.F32_TINY)), "a subnormal dequantized value"
    below = np.abs(x).max(axis=1) < 2.0 ** (ref.tiny_exponent(fmt.name) - 127)
    assert below.sum() >= 2 and np.all(y[below] == 0) and np.all(y[~below].max(axis=1) > 0)


@pytest.mark.parametrize("mode", ["jit", "eager"])
@pytest.mark.parametrize("name", ["int8", "mxfp8", "mxfp4/b16", "mxfp6_e3m2/ceil", "int9"])
@pytest.mark.slow
def test_non_finite_blocks(name, mode):
    """A NaN or inf makes the scale non-finite and every value non-finite; quantize.py
    documents that the payload of such a block is forced to 0."""
    errors = _check(name, mode, ["non-finite"])
    assert not errors, "\n".join(errors)


SR_FORMATS = ["int8", "int4", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp8", "mxfp4", "int7/b8",
              "mxfp6_e3m2/ceil", "int8/b8", "int12", "int8/f32", "int4/f32", "fp8_e4m3/f32",
              "int12/f32", "int3/f32/b8"]


def stochastic_errors(name, kinds=(*REGULAR, "non-finite")):
    """Stochastic rounding (key 0) by the package under jit and by the spec with the same
    uniforms: readable differences."""
    fmt = eq.Format.parse(name)
    x = np.concatenate([v for k, v in dataset(name).items() if k in kinds])
    key = jax.random.key(0)
    u = np.asarray(jax.random.uniform(key, x.shape, jnp.float32))
    want = ref.quantize_blocks(x, fmt, uniforms=u)
    q = jax.jit(lambda v: eq.quantize(v, fmt, key=key))(jnp.asarray(x.ravel()))
    payload = np.asarray(q.payload)
    bad = np.flatnonzero(np.any(payload != want.payload, axis=1))
    return [] if not bad.size else [
        f"{name} SR: {bad.size} blocks differ; first {bad[0]}: x={x[bad[0]][:4]}\n"
        f"    spec    {want.payload[bad[0]][:8]}\n    package {payload[bad[0]][:8]}"]


@pytest.mark.parametrize("name", SR_FORMATS)
@pytest.mark.slow
def test_stochastic_rounding_bitwise_against_the_spec(name):
    """Up from the grid value below exactly when |x| - lo s >= (1 - u)(hi - lo) s: the same
    codes as the spec for the same uniforms, ties and near-ties included."""
    errors = stochastic_errors(name)
    assert not errors, "\n".join(errors)
