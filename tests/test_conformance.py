"""Conformance: every codec x format x data class, bitwise the spec (`equarx_ref.spec`).

The codecs are the package's ways of turning values into what travels and back:

    quantize+to_bytes   the public API (`eq.quantize`, `wire.to_bytes`), eagerly and under jit:
                        the canonical single buffer (`spec.canonical_bytes`)
    wire.encode/decode  the collectives' messages, payload and scales (`spec.message`), jit
    tile code           `kernels.tiles` (encode, decode, hop, reduce) as XLA operations, under
                        jit: what impl="mosaic" runs off a TPU, and every kernel's body
    Mosaic kernels      `kernels.codec` (TPU interpret mode on CPU): encode, decode, a hop and
                        two-shot's reduce streaming messages through HBM, and their in-place
                        reads and writes (first_row, stride, stacked, order, into)
    Pallas ring         `all_reduce(impl="pallas")` (interpret mode): the spec's sum

A message is a permutation of the canonical bytes (`spec.message`, `spec.from_message`), held
here byte by byte for every format. The data classes are the spec's (`spec.data`: ties, tiny,
subnormal, huge, non-finite, zeros, outliers, ...), made the same on every machine. The spec's
own canonical bytes are held to golden digests (tests/fixtures/spec_golden.json), so the oracle
cannot drift without a deliberate rewrite: `python tests/test_conformance.py` rewrites the
file, and its diff shows which bytes moved.
"""

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import spec, wire
from equarx_ref.kernels import codec, tiles
from equarx_ref.schedule import make_schedule
from equarx_ref.spec import data as spec_data
from equarx_ref.wire import Message

GOLDEN = Path(__file__).parent / "fixtures" / "spec_golden.json"
#: Every element type the package names, every scale type and rule, odd widths and blocks.
FORMATS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2",
           "fp6_e3m2", "fp4_e2m1", "mxint8", "mxfp8/ceil", "int8/f32", "int4/f32", "int7/b8",
           "int3/b8", "int12", "int8/b64")
CLASSES = tuple(spec_data.CLASSES)
#: What the tile code and the Mosaic kernels take (`tiles.supports`): those of FORMATS, and
#: blocks of 8 and 16 (16 and 8 blocks a row).
KERNEL_FORMATS = (*(n for n in FORMATS if tiles.supports(eq.Format.parse(n))),
                  "int8/b8", "int4/b16", "fp8_e4m3/b16/f32")
#: Rows of a kernel's message: three tiles of 128 (three grid steps), the classes in each.
ROWS = 384
#: Rows the tile code runs on as XLA ops: two tiles of 128 rows.
XLA_ROWS = 256
#: The in-place reads and writes are index maps, the same for every format: a format of each
#: scale type and element width runs them.
IN_PLACE_FORMATS = ("int8", "mxfp4", "int8/f32")
_BITS = {"bfloat16": np.uint16, "float32": np.uint32, "e8m0": np.uint8}


def _padded(x: np.ndarray, unit: int) -> np.ndarray:
    out = np.zeros(-(-x.size // unit) * unit, np.float32)
    out[:x.size] = x
    return out


def _quantized(values, fmt) -> spec.SpecQuantized:
    """The spec's quantization of f32 values, whole blocks."""
    flat = np.asarray(values, np.float32).reshape(-1)
    return spec.quantize_blocks(spec.to_blocks(flat, fmt.block_size), fmt)


def _spec(name: str, cls: str, unit: str = "block"):
    """(fmt, class x padded with zeros to whole blocks or rows, the spec's quantized blocks)."""
    fmt = eq.Format.parse(name)
    padded = _padded(spec_data.make(cls, fmt), fmt.block_size if unit == "block" else fmt.row)
    return fmt, padded, _quantized(padded, fmt)


def _digest(name: str, cls: str) -> str:
    _, _, q = _spec(name, cls)
    fixed = spec.fixed_bytes(q)
    return hashlib.sha256(np.where(fixed, spec.canonical_bytes(q), 0).astype(np.uint8)
                          .tobytes()).hexdigest()


def _flush(v):
    """Subnormals as zeros of their sign: what a kernel adds on a TPU (and XLA:CPU), and
    what the collectives make explicit (execute.py `settle`)."""
    return np.where(np.abs(v) < spec.F32_TINY, np.copysign(np.float32(0), v), v)


def _same_bytes(got, expected, fixed, what):
    got = np.asarray(got)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    diff = np.flatnonzero((got != expected) & fixed)
    assert diff.size == 0, (f"{what}: {diff.size} bytes differ from the spec, first at byte "
                            f"{diff[0]}: got {got.ravel()[diff[0]]}, spec "
                            f"{expected.ravel()[diff[0]]}")


def _non_finite_bits(bits: np.ndarray, fmt) -> np.ndarray:
    if fmt.scale_dtype == "e8m0":
        return bits == 255
    view = bits.view(ml_dtypes.bfloat16 if fmt.scale_dtype == "bfloat16" else np.float32)
    return ~np.isfinite(view.astype(np.float32))


def _same_message(got, q: spec.SpecQuantized, fmt, what):
    """`got` (a Message, leading axes none) is `spec.message(q)`: every payload byte, every
    scale of a finite block to the bit, and a non-finite block's scale some NaN or infinity."""
    want_p, want_s = spec.message(q, fmt)
    assert isinstance(got, Message), (what, type(got))
    got_p, got_s = np.asarray(got.payload), np.asarray(got.scales)
    assert got_p.dtype == np.uint8 and got_s.dtype == want_s.dtype, (what, got_p.dtype,
                                                                      got_s.dtype)
    _same_bytes(got_p, want_p, np.ones(want_p.shape, bool), f"{what} payload")
    finite = q.finite.reshape(-1, fmt.blocks_per_row).T  # [G, R], as the scales
    _same_bytes(got_s, want_s, finite, f"{what} scales")
    bad = ~finite & ~_non_finite_bits(got_s, fmt)
    assert not bad.any(), f"{what}: a non-finite block's scale is finite: {got_s[bad][:4]}"


def _same_values(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape,
                                                                 want.dtype, want.shape)
    got, want = got.astype(np.float32).ravel(), want.astype(np.float32).ravel()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN where the spec has none, or not"
    diff = np.flatnonzero(got[~nan].view(np.uint32) != want[~nan].view(np.uint32))
    assert diff.size == 0, (f"{what}: {diff.size} values differ from the spec, first "
                            f"{got[~nan][diff[0]]!r} against {want[~nan][diff[0]]!r}")


def _message_of(q, fmt) -> Message:
    return Message(*map(jnp.asarray, spec.message(q, fmt)))


# ---- the spec's own bytes and layout --------------------------------------------------------


def test_the_spec_is_its_golden_bytes():
    """The spec's canonical bytes for every format x class, against digests written when it
    was last changed on purpose (non-finite blocks' scale bytes, not fixed by the rule, left
    out)."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert set(golden) == {f"{n}|{c}" for n in FORMATS for c in CLASSES}, (
        "tests/fixtures/spec_golden.json lists other cases: python tests/test_conformance.py")
    moved = [key for key in golden if _digest(*key.split("|")) != golden[key]]
    assert not moved, f"the spec's bytes changed for {moved}: if on purpose, rewrite the golden"


@pytest.mark.parametrize("name", FORMATS)
def test_a_message_is_a_permutation_of_the_canonical_bytes(name):
    """`spec.message`: every byte of the canonical buffer lands in exactly one place of the
    two operands (payload byte i of block r G + j at payload[j PB + i, r], its scale's
    little-endian bytes in lane r of slot j), nothing added, and `from_message` undoes it;
    on random bytes (so no byte is told apart by chance) and on the data classes."""
    fmt = eq.Format.parse(name)
    g, pb, sb = fmt.blocks_per_row, fmt.payload_bytes_per_block, fmt.scale_bytes
    assert (spec.blocks_per_row(fmt.block_size), spec.row_values(fmt)) == (g, fmt.row)
    assert fmt.row == (128 if 128 % fmt.block_size == 0 else fmt.block_size)
    rng = np.random.default_rng(list(name.encode()))
    classes = np.concatenate([_spec(name, c, "row")[1] for c in CLASSES])
    real = _quantized(classes, fmt)
    blocks = len(real.payload)
    noise = dataclasses.replace(
        real, payload=rng.integers(0, 256, real.payload.shape).astype(np.uint8),
        scales=rng.integers(0, 256, (blocks, sb)).astype(np.uint8).view(
            real.scales.dtype).reshape(blocks))
    rows = blocks // g
    r, j, i = np.meshgrid(np.arange(rows), np.arange(g), np.arange(pb), indexing="ij")
    at_payload = np.zeros((g * pb, rows), np.int64)  # canonical index of each message byte
    at_payload[j * pb + i, r] = (r * g + j) * fmt.bytes_per_block + i
    r, j, b = np.meshgrid(np.arange(rows), np.arange(g), np.arange(sb), indexing="ij")
    at_scales = np.zeros((g, rows, sb), np.int64)
    at_scales[j, r, b] = (r * g + j) * fmt.bytes_per_block + pb + b
    every = np.sort(np.concatenate([at_payload.ravel(), at_scales.ravel()]))
    assert np.array_equal(every, np.arange(blocks * fmt.bytes_per_block))
    for q in (noise, real):
        canonical = spec.canonical_bytes(q)
        assert canonical.size == blocks * fmt.bytes_per_block == fmt.nbytes(classes.size)
        payload, scales = spec.message(q, fmt)
        assert payload.dtype == np.uint8 and payload.shape == (g * pb, rows)
        assert scales.dtype == _BITS[fmt.scale_dtype] and scales.shape == (g, rows)
        assert payload.nbytes + scales.nbytes == canonical.size
        assert np.array_equal(payload, canonical[at_payload])
        scale_bytes = np.ascontiguousarray(scales[..., None]).view(np.uint8)
        assert np.array_equal(scale_bytes.reshape(g, rows, sb), canonical[at_scales])
        back, bits = spec.from_message(payload, scales, fmt)
        assert np.array_equal(np.concatenate([back, bits.view(np.uint8).reshape(blocks, sb)],
                                             axis=1).ravel(), canonical)
    if g > 1:
        with pytest.raises(ValueError, match="whole rows"):
            spec.message(dataclasses.replace(  # a well-formed q, one block short of whole rows
                real, **{f.name: getattr(real, f.name)[1:] for f in dataclasses.fields(real)}),
                fmt)
    with pytest.raises(ValueError, match="message payload"):
        spec.from_message(payload[1:], scales, fmt)
    with pytest.raises(ValueError, match="its scales are"):
        spec.from_message(payload, scales.astype(np.float32), fmt)


# ---- the XLA codec: canonical bytes and messages ---------------------------------------------


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.slow
def test_encoders_give_the_spec_bytes(name, jit):
    """quantize+to_bytes (eager and jit) is the spec's canonical bytes, every class (each
    padded with zeros to whole blocks, then to the longest: one row each of one array, one
    call); and `wire.encode` (jit, every class at once along a leading axis) is `spec.message`
    of the spec's quantization."""
    def public(v, fmt):
        return wire.to_bytes(eq.quantize(v, fmt))

    fmt = eq.Format.parse(name)
    blocks = [_spec(name, cls)[1] for cls in CLASSES]
    x = np.zeros((len(blocks), max(b.size for b in blocks)), np.float32)
    for k, b in enumerate(blocks):
        x[k, :b.size] = b
    q = _quantized(x, fmt)  # whole blocks: a row's blocks are its class's, then zero blocks
    run = jax.jit(public, static_argnums=1) if jit else public
    got = np.asarray(run(jnp.asarray(x), fmt)).reshape(len(CLASSES), -1)
    want, fixed = (a.reshape(len(CLASSES), -1) for a in (spec.canonical_bytes(q),
                                                          spec.fixed_bytes(q)))
    for k, cls in enumerate(CLASSES):
        _same_bytes(got[k], want[k], fixed[k], f"quantize+to_bytes {name} {cls}")
    if jit:
        fmt = eq.Format.parse(name)
        rows = [_spec(name, cls, "row")[1] for cls in CLASSES]
        x = np.zeros((len(rows), max(r.size for r in rows)), np.float32)
        for k, r in enumerate(rows):
            x[k, :r.size] = r
        got = jax.jit(wire.encode, static_argnums=1)(jnp.asarray(x), fmt)
        for k, cls in enumerate(CLASSES):
            _same_message(jax.tree.map(lambda a, k=k: a[k], got), _quantized(x[k], fmt), fmt,
                          f"wire.encode {name} {cls}")


@pytest.mark.parametrize("name", FORMATS)
def test_decoders_give_the_spec_values(name):
    """`wire.decode` of the spec's messages (every class at once along a leading axis) is the
    spec's values, bit for bit (NaN where NaN); `from_bytes` + `dequantize` of its canonical
    bytes the same."""
    fmt = eq.Format.parse(name)
    rows = [_spec(name, cls, "row")[1] for cls in CLASSES]
    m = max(r.size for r in rows)
    qs = [_quantized(np.pad(r, (0, m - r.size)), fmt) for r in rows]
    stack = Message(*(jnp.asarray(np.stack(a)) for a in zip(*[spec.message(q, fmt)
                                                              for q in qs], strict=True)))
    got = np.asarray(jax.jit(wire.decode, static_argnums=(1, 2))(stack, fmt, m))
    for k, (cls, q) in enumerate(zip(CLASSES, qs, strict=True)):
        _same_values(got[k], q.values.reshape(-1), f"wire.decode {name} {cls}")
    canonical = jnp.asarray(np.stack([spec.canonical_bytes(q) for q in qs]))
    back = jax.jit(lambda b: eq.dequantize(wire.from_bytes(b, fmt, (m,))))(canonical)
    for k, (cls, q) in enumerate(zip(CLASSES, qs, strict=True)):
        _same_values(back[k], q.values.reshape(-1), f"from_bytes {name} {cls}")


def _source(jaxpr, var, through=("reshape", "transpose", "copy", "squeeze")):
    """The equation that makes `var`, looking through layout-only operations."""
    made = {v: e for e in jaxpr.eqns for v in e.outvars}
    eqn = made[var]
    while eqn.primitive.name in through:
        eqn = made[eqn.invars[0]]
    return eqn, made


def test_the_xla_route_writes_a_scale_by_a_bitcast():
    """wire.py's essay: a message's bf16 or f32 scales travel as their bits, one bitcast to an
    unsigned integer of their width (no backend widens that) laid out by transposes, and the
    canonical buffer writes them by one bitcast to bytes: no shifts that a backend could
    miscompile (XLA:GPU once did, fused into odd-width rows: jax 0.11.2, an H100)."""
    for name in ("int7/b8", "int3/b8", "int8", "int8/f32"):
        fmt = eq.Format.parse(name)
        x = jnp.zeros(fmt.row * 4, jnp.float32)
        jaxpr = jax.make_jaxpr(lambda v, fmt=fmt: wire.encode(v, fmt))(x).jaxpr
        cast, _ = _source(jaxpr, jaxpr.outvars[1])
        assert cast.primitive.name == "bitcast_convert_type", (name, cast)
        assert cast.invars[0].aval.dtype == jnp.dtype(fmt.scale_dtype), name
        assert cast.outvars[0].aval.dtype == _BITS[fmt.scale_dtype], name
        jaxpr = jax.make_jaxpr(lambda v, fmt=fmt: wire.to_bytes(eq.quantize(v, fmt)))(x).jaxpr
        joined, made = _source(jaxpr, jaxpr.outvars[0])
        assert joined.primitive.name == "concatenate", (name, joined)
        cast = made[joined.invars[1]]
        assert cast.primitive.name == "bitcast_convert_type", (name, cast)
        assert cast.invars[0].aval.dtype == jnp.dtype(fmt.scale_dtype), name
        assert cast.outvars[0].aval.shape == (4 * fmt.blocks_per_row, fmt.scale_bytes), name


# ---- the tile code and the Mosaic kernels ---------------------------------------------------


@functools.cache
def _values(name: str, shift: int = 0, rows: int = ROWS) -> np.ndarray:
    """f32 rows [rows, 128]: the classes, each padded to whole rows, one after another, then
    again shifted by a few values each time (so blocks mix classes: a NaN beside a tiny
    value, huge beside zeros) and sign-flipped, until `rows` rows; `shift` rows rolled."""
    fmt = eq.Format.parse(name)
    base = np.concatenate([_spec(name, cls, "row")[1] for cls in CLASSES])
    parts, k = [], 0
    while sum(p.size for p in parts) < rows * 128:
        parts.append(np.roll(base, 37 * k) * np.float32((-1) ** k))
        k += 1
    assert fmt.row == 128
    return np.roll(np.concatenate(parts)[:rows * 128].reshape(rows, 128), shift, axis=0)


def _as(values: np.ndarray, dtype) -> np.ndarray:
    """values in dtype (bf16: rounded, as a bf16 input is), as f32 for the spec."""
    with np.errstate(over="ignore"):
        return values.astype(dtype).astype(np.float32)


def _reduce_inputs(name: str, rows: int = ROWS) -> tuple[list[np.ndarray], np.ndarray]:
    """Three ranks' values [rows, 128] (the classes, rotated per rank) with two rows where the
    order and the flush decide (a large value plus two ones; a partial sum that cancels to a
    subnormal before the third joins it), and the spec's rank-order sum of their messages'
    values, each partial sum's subnormals read as zeros of their sign."""
    ranks = [_values(name, shift, rows).copy() for shift in (0, 5, 11)]
    tiny = 127 * 2.0 ** -126  # the smallest block of 127s an int8 block scale reaches
    for r, (big, small) in enumerate(zip([3 * 2.0 ** 23, 1, 1],
                                         [tiny * (1 + 2 ** -7), -tiny, tiny], strict=True)):
        ranks[r][rows - 2] = big  # ties to even twice, in rank order
        ranks[r][rows - 1] = small  # sums to a subnormal, then joins the third
    fmt = eq.Format.parse(name)
    with np.errstate(invalid="ignore", over="ignore"):
        parts = [_quantized(v, fmt).values.reshape(rows, 128) for v in ranks]
        total = parts[0]
        for v in parts[1:]:
            total = _flush((total + v).astype(np.float32))
    return ranks, total


def _hop_inputs(name: str, dtype, rows: int = ROWS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the incoming message's values, local values in dtype, the spec's f32 sum)."""
    fmt = eq.Format.parse(name)
    incoming = _values(name, 0, rows)
    local = _values(name, 3, rows).astype(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        total = (_quantized(incoming, fmt).values.reshape(rows, 128) +
                 _flush(local.astype(np.float32))).astype(np.float32)
    return incoming, local, total


#: The tile code on f32 input for every format; on bf16 input (whose values are f32's, rounded
#: first) for one format of each scale type and element width: the code path differs only there.
TILE_CASES = [(name, np.float32) for name in KERNEL_FORMATS] + [
    (name, ml_dtypes.bfloat16) for name in ("int8", "int4", "mxfp4", "int8/f32")]


@pytest.mark.parametrize(("name", "dtype"), TILE_CASES,
                         ids=[f"{n}-{'f32' if d is np.float32 else 'bf16'}" for n, d in TILE_CASES])
@pytest.mark.slow
def test_the_tile_code_gives_the_spec_bytes(name, dtype):
    """`kernels.tiles` as XLA ops (jit, the operations of a case in one program), on two tiles
    of values in f32 and bf16: encode is the spec's message, decode (to f32 and to the input
    dtype) its values, a hop (the message plus local values, f32) the message of that sum,
    and reduce (three messages) of their rank-order sum. Reduce takes messages only, the same
    for either input dtype: the f32 case runs it (the bf16 case would repeat it exactly)."""
    fmt, rows, dtype = eq.Format.parse(name), XLA_ROWS, np.dtype(dtype)
    f32 = dtype == np.float32

    def run(x, message, incoming, local, ranks):
        out = {"encode": tiles.encode(x, fmt), "decode": tiles.decode(message, fmt),
               "hop": tiles.hop(incoming, local, fmt)}
        if not f32:
            out["decode to dtype"] = tiles.decode(message, fmt, dtype)
        if ranks:
            out["reduce"] = tiles.reduce(ranks, fmt)
        return out

    x = _as(_values(name, 0, rows), dtype)
    q = _quantized(x, fmt)
    incoming, local, hop_total = _hop_inputs(name, dtype, rows)
    ranks, total = _reduce_inputs(name, rows)
    got = jax.jit(run)(jnp.asarray(x.astype(dtype)), _message_of(q, fmt),
                       _message_of(_quantized(incoming, fmt), fmt), jnp.asarray(local),
                       [_message_of(_quantized(v, fmt), fmt) for v in ranks] if f32 else [])
    _same_message(got["encode"], q, fmt, f"tiles.encode {name}")
    values = q.values.reshape(rows, 128)
    _same_values(got["decode"], values, f"tiles.decode {name}")
    if not f32:
        _same_values(got["decode to dtype"], values.astype(dtype),
                     f"tiles.decode to {dtype.name} {name}")
    _same_message(got["hop"], _quantized(hop_total, fmt), fmt, f"tiles.hop {name}")
    if f32:
        _same_message(got["reduce"], _quantized(total, fmt), fmt, f"tiles.reduce {name}")


def test_the_tile_code_takes_a_short_last_tile():
    """A message of 144 rows, which the kernels take (`codec.takes`: whole sublane groups up
    to `codec.ROWS` rows) and off a TPU the tile code codes as XLA ops (`MosaicCodec`): a whole tile
    of 128 rows and a short one of 16, bitwise the spec like any other."""
    fmt, rows = eq.Format.int8(), 144
    assert codec.takes(fmt, rows * 128) and codec.tile_rows(rows) == rows
    x = _values("int8", 0, rows)
    q = _quantized(x, fmt)
    incoming, local, total = _hop_inputs("int8", np.float32, rows)
    encoded, decoded, hopped = jax.jit(lambda x, m, i, v: (  # one program
        tiles.encode(x, fmt), tiles.decode(m, fmt), tiles.hop(i, v, fmt)))(
        jnp.asarray(x), _message_of(q, fmt), _message_of(_quantized(incoming, fmt), fmt),
        jnp.asarray(local))
    _same_message(encoded, q, fmt, "tiles.encode of 144 rows")
    _same_values(decoded, q.values.reshape(rows, 128), "tiles.decode of 144 rows")
    _same_message(hopped, _quantized(total, fmt), fmt, "tiles.hop of 144 rows")


def _stack(qs, fmt) -> Message:
    return Message(*(jnp.asarray(np.stack(a)) for a in zip(*[spec.message(q, fmt)
                                                              for q in qs], strict=True)))


@pytest.mark.parametrize("name", KERNEL_FORMATS)
@pytest.mark.slow
def test_mosaic_kernels_give_the_spec_bytes(name):
    """`kernels.codec` (TPU interpret mode, the four kernels under one jit) on messages of
    three tiles: encode (f32 values) is the spec's message, decode its values, a hop (bf16
    local values, as impl="mosaic" hands them over) the message of the sum, and two-shot's
    reduce (three messages) the message of their rank-order sum."""
    fmt = eq.Format.parse(name)
    x = _values(name)
    q = _quantized(x, fmt)
    incoming, local, hop_total = _hop_inputs(name, ml_dtypes.bfloat16)
    ranks, total = _reduce_inputs(name)
    encoded, decoded, hopped, reduced = jax.jit(lambda x, m, i, v, s: (
        codec.encode(x, fmt, interpret=True), codec.decode(m, fmt, interpret=True),
        codec.hop(i, v, fmt, interpret=True), codec.reduce(s, fmt, interpret=True)))(
        jnp.asarray(x), _message_of(q, fmt), _message_of(_quantized(incoming, fmt), fmt),
        jnp.asarray(local), _stack([_quantized(v, fmt) for v in ranks], fmt))
    _same_message(encoded, q, fmt, f"codec.encode {name}")
    _same_values(decoded, q.values.reshape(ROWS, 128), f"codec.decode {name}")
    _same_message(hopped, _quantized(hop_total, fmt), fmt, f"codec.hop {name}")
    _same_message(reduced, _quantized(total, fmt), fmt, f"codec.reduce {name}")


@pytest.mark.parametrize("name", IN_PLACE_FORMATS)
@pytest.mark.slow
def test_mosaic_kernels_read_and_write_in_place(name):
    """The kernels' in-place features (interpret mode), each against the spec on the rows it
    names: bf16 source rows [4 chunks of 128, 128] read from `first_row` (traced, (i, a)),
    `count` chunks `stride` rows apart, into a `stacked` result or over chunks of a larger
    message (`into`, the rest of it kept); a hop the same way, and into a new stack; decode of
    a stack in `order`, to bf16, and over rows c b + o of a larger array (`into`, the rest kept).
    The six kernel calls run under one jit."""
    fmt = eq.Format.parse(name)
    c_rows = 128
    source = _values(name, 7, 4 * c_rows).astype(ml_dtypes.bfloat16)
    src = source.astype(np.float32)
    chunk = [src[c * c_rows:(c + 1) * c_rows] for c in range(4)]
    other = [_quantized(v, fmt) for v in np.split(_values(name, 13, 4 * c_rows), 4)]
    kw = {"interpret": True}
    flat = Message(*(jnp.asarray(np.concatenate(a, axis=-1)) for a in zip(
        *[spec.message(o, fmt) for o in other], strict=True)))  # 4 chunks' messages, flat
    incoming = _stack(other[:2], fmt)  # two chunks' messages, stacked
    stack = _stack(other, fmt)  # all four, stacked
    order = (2, 0, 3, 1)
    target = np.full((4 * 2 * c_rows, 128), 7.0, np.float32)

    def run(s, one, two, flat, incoming, stack, target):  # every kernel call, one program
        got = {}
        # encode chunks 1 and 3, read where they lie (first_row traced), as a stack
        got["encode stacked"] = codec.encode(s, fmt, rows=c_rows, count=2,
                                             first_row=(one, c_rows), stride=2 * c_rows,
                                             stacked=True, **kw)
        # encode chunk 2 over chunk 1 of a flat message of 4 chunks; the others are kept
        got["encode into"] = codec.encode(s, fmt, rows=c_rows, first_row=(two, c_rows),
                                          into=(flat, 1), **kw)
        # hop: the stacked messages of two chunks plus chunks 0 and 2 of the source
        got["hop stacked"] = codec.hop(incoming, s, fmt, first_row=(jnp.int32(0), c_rows),
                                       stride=2 * c_rows, stacked=True, **kw)
        # the two chunks' messages side by side (flat, count=2), written as messages 1 and 2
        # of a new stack of 4
        side = jax.tree.map(lambda a: jnp.concatenate([a[0], a[1]], axis=-1), incoming)
        got["hop into"] = codec.hop(side, s, fmt, count=2, first_row=(jnp.int32(1), c_rows),
                                    stacked=True, into=(4, 1), **kw)
        # decode a stack of 4 in order, to bf16, and over rows c 256 + 128 of a larger array
        got["decode in order"] = codec.decode(stack, fmt, "bfloat16", order=order, **kw)
        got["decode into"] = codec.decode(stack, fmt, order=order,
                                          into=(target, 2 * c_rows, c_rows), **kw)
        return got

    got = jax.jit(run)(jnp.asarray(source), jnp.int32(1), jnp.int32(2), flat, incoming, stack,
                       jnp.asarray(target))

    assert got["encode stacked"].payload.shape[0] == 2
    for k, c in enumerate((1, 3)):
        _same_message(jax.tree.map(lambda a, k=k: a[k], got["encode stacked"]),
                      _quantized(chunk[c], fmt), fmt, f"encode stacked chunk {c} {name}")
    want = [other[0], _quantized(chunk[2], fmt), other[2], other[3]]
    for c in range(4):
        _same_message(jax.tree.map(lambda a, c=c: a[:, c * c_rows:(c + 1) * c_rows],
                                   got["encode into"]),
                      want[c], fmt, f"encode into chunk {c} {name}")

    def hop_sum(q, c):
        with np.errstate(invalid="ignore", over="ignore"):
            return _quantized((q.values.reshape(c_rows, 128) + _flush(chunk[c])).astype(
                np.float32), fmt)

    for k, c in enumerate((0, 2)):
        _same_message(jax.tree.map(lambda a, k=k: a[k], got["hop stacked"]),
                      hop_sum(other[k], c), fmt, f"hop stacked chunk {c} {name}")
    assert got["hop into"].payload.shape[0] == 4
    for k, c in enumerate((1, 2)):
        _same_message(jax.tree.map(lambda a, k=k: a[k + 1], got["hop into"]),
                      hop_sum(other[k], c), fmt, f"hop into a new stack, chunk {c} {name}")

    want = np.concatenate([other[o].values.reshape(c_rows, 128) for o in order])
    _same_values(got["decode in order"], want.astype(ml_dtypes.bfloat16),
                 f"decode in order to bf16 {name}")
    for k in range(4):
        target[(2 * k + 1) * c_rows:(2 * k + 2) * c_rows] = want[k * c_rows:(k + 1) * c_rows]
    _same_values(got["decode into"], target, f"decode in order into rows c 256 + 128 {name}")


def test_the_kernels_take_what_the_tile_code_takes():
    """`codec.takes` and `tiles.supports` name the formats and sizes the kernels code; the
    rest of FORMATS is refused with a clear error, not coded wrongly."""
    for name in FORMATS:
        fmt = eq.Format.parse(name)
        assert tiles.supports(fmt) == (name in KERNEL_FORMATS), name
        if not tiles.supports(fmt):
            with pytest.raises(ValueError, match="the Mosaic codec takes 8-bit and 4-bit"):
                codec.encode(jnp.zeros((16, 128)), fmt, interpret=True)
    int8, t = eq.Format.int8(), codec.ROWS  # the largest tile
    assert codec.takes(int8, t * 128) and codec.takes(int8, 48 * 128)
    assert not codec.takes(int8, 24 * 128) and not codec.takes(int8, (t + 8) * 128)
    assert not codec.takes(int8, 100)
    assert [codec.tile_rows(r) for r in (2 * t, t // 4, 3 * t // 8, 48, t + 16, 24)] == \
        [t, t // 4, t // 8, 48, None, None]


# ---- the Pallas ring ----------------------------------------------------------------------

RING_CASES = [  # format, p, algorithm, pipeline pieces, input dtype
    ("int8", 2, "ring", 1, np.float32),
    ("mxfp4", 2, "ring", 2, np.float32),
    ("int8/f32", 2, "ring", 1, ml_dtypes.bfloat16),
    ("fp8_e4m3/b16/f32", 2, "ring", 1, np.float32),
    (None, 2, "ring", 1, ml_dtypes.bfloat16),
]


@pytest.mark.parametrize(("name", "p", "algorithm", "k", "dtype"), RING_CASES,
                         ids=[f"{c[0]}-{c[2]}-p{c[1]}-k{c[3]}-{np.dtype(c[4]).name}"
                              for c in RING_CASES])
@pytest.mark.slow
def test_the_pallas_ring_gives_the_spec_sum(name, p, algorithm, k, dtype):
    """`all_reduce(impl="pallas")` (interpret mode) on the data classes (each device's the
    classes, shifted and scaled by its rank) is `spec.all_reduce` of the same schedule, bit
    for bit: the ring kernel's messages are the spec's, every scale type and lane count. (Every
    p, both lanes and the race detector: test_kernels.py, against the XLA path.)"""
    fmt = eq.Format.parse(name) if name is not None else None
    base = _values(name or "int8", 0, 24).reshape(-1)
    with np.errstate(over="ignore"):
        x = np.stack([np.roll(base, 37 * d) * np.float32(1 + d / 3) for d in range(p)])
        x = x.astype(dtype)
    if fmt is None:  # unquantized sums follow the float environment: XLA:CPU flushes
        x = np.where(np.abs(x.astype(np.float32)) < spec.F32_TINY, 0, x).astype(dtype)
    mesh = jax.make_mesh((p,), ("tp",), devices=DEVICES[:p])
    xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("tp")))
    body = lambda v: eq.all_reduce(v[0], "tp", fmt=fmt, algorithm=algorithm,  # noqa: E731
                                   num_chunks=k, impl="pallas", min_bytes=0)
    got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P(),
                                check_vma=True))(xs)
    want = spec.all_reduce(x, make_schedule(algorithm, (p,)), fmt)
    if fmt is None:  # and a sum that cancels to a subnormal
        want = _flush(want.astype(np.float32)).astype(want.dtype)
    _same_values(got, want, f"pallas {algorithm} {name} p={p} k={k}")


if __name__ == "__main__":  # rewrite the golden digests from the spec as it is now
    GOLDEN.write_text(json.dumps({f"{n}|{c}": _digest(n, c) for n in FORMATS for c in CLASSES},
                                 indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}: {len(FORMATS) * len(CLASSES)} digests")
