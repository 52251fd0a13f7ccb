"""`all_reduce(impl="mosaic")`: the XLA path's collectives with the Mosaic codec coding every
message. Bitwise impl="xla"'s result, the same bytes on the wire, each hop one fused step, and
refused where the kernels cannot follow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref.kernels import codec, tiles
from equarx_ref.kernels.mosaic_codec import MosaicCodec
from equarx_ref.models.hlo import hlo_wire_bytes


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _data(p: int, n: int, dtype, seed: int = 0) -> np.ndarray:
    """Normal values over six decades, with zeros, -0, subnormals and an Inf's neighbours."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((p, n)) * np.logspace(-3, 3, n)[None] ** rng.integers(0, 2, (p, 1))
    x = x.astype(np.float32)
    x[0, :40] = 0.0
    x[1, :40] = -0.0
    x[2, 5:9] = np.float32(-1e-40)  # subnormal inputs read as zeros of their sign
    return np.asarray(jnp.asarray(x, dtype))


def _run(x, impl, *, axes=("x",), shape=None, **kw):
    p = x.shape[0]
    mesh = jax.make_mesh(shape or (p,), axes, devices=DEVICES[:p])
    spec = P(axes)
    xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))
    body = lambda v: eq.all_reduce(v[0], axes if len(axes) > 1 else axes[0], impl=impl,  # noqa: E731
                                   min_bytes=0, **kw)
    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P(), check_vma=True))
    return fn, xs


# values per device: chunks (pipeline pieces) of whole tiles of 128 rows of 128 values, of 16
# to 48 rows (a short tile), and chunks the kernels do not take (not whole sublane groups of
# rows: the XLA codec carries them, the same bytes); `kernels`: whether the tile code codes
# any message (off a TPU `MosaicCodec` runs it as XLA ops). A case's compile grows with p and
# with the values a device holds: p = 8 in three cases (two-shot, a ring with rotation, a ring
# of chunks the kernels do not take), p = 4 (a 2 x 2 mesh for two axes) in the rest.
CASES = [  # algorithm, format, p, values per device, num_chunks, dtype, extra, kernels
    ("ring", "int8", 4, 4 * 256 * 128, 1, jnp.bfloat16, {}, True),
    ("ring", "mxfp4", 4, 4 * 32 * 128, 2, jnp.float32, {}, True),
    ("bidir_ring", "int4", 4, 8 * 16 * 128, 1, jnp.bfloat16, {}, True),
    ("two_shot", "fp8_e4m3", 8, 8 * 48 * 128, 1, jnp.float32, {}, True),
    ("one_shot", "mxfp8", 4, 16 * 128, 1, jnp.bfloat16, {}, True),
    ("ring", "int8/f32", 8, 8 * 16 * 128 + 5, 1, jnp.float32, {}, False),
    ("ring", "int8", 8, 8 * 32 * 128, 1, jnp.float32, {"rotate": True}, True),
    ("bidir_ring", "fp8_e5m2", 4, 8 * 16 * 128, 1, jnp.float32,
     {"axes": ("a", "b"), "shape": (2, 2)}, True),
    ("ring", "int8/b16", 4, 4 * 32 * 128, 2, jnp.bfloat16, {}, True),
    # chunks of 144 rows, which the kernels take (`codec.takes`): a tile and a short one
    ("ring", "int8", 4, 4 * 144 * 128, 1, jnp.float32, {}, True),
    # every format the rules let through to the kernels (`tiles.supports`)
    ("ring", "mxint8", 4, 4 * 16 * 128, 1, jnp.float32, {}, True),
]


@pytest.mark.parametrize(("algorithm", "name", "p", "n", "k", "dtype", "extra", "kernels"),
                         CASES, ids=[f"{c[0]}-{c[1]}-{c[3]}-{c[4]}-{sorted(c[6])}"
                                     for c in CASES])
@pytest.mark.slow
def test_mosaic_is_bitwise_xla_with_the_same_wire_bytes(algorithm, name, p, n, k, dtype, extra,
                                                        kernels, monkeypatch):
    jax.clear_caches()  # a compiled schedule would not trace the codec again
    coded = []
    encode = tiles.encode
    monkeypatch.setattr(tiles, "encode", lambda *a, **kw: coded.append(1) or encode(*a, **kw))
    x = _data(p, n, dtype)
    kw = dict(fmt=eq.Format.parse(name), algorithm=algorithm, num_chunks=k, **extra)
    outs, sent = {}, {}
    for impl in ("xla", "mosaic"):
        fn, xs = _run(x, impl, **kw)
        outs[impl] = np.asarray(fn(xs))
        sent[impl] = hlo_wire_bytes(fn.lower(xs).compile().as_text(), p)
    assert bool(coded) == kernels, "the tile code coded a message" if coded else "it did not"
    assert np.array_equal(_bits(outs["mosaic"]), _bits(outs["xla"])), algorithm
    assert sent["mosaic"] == sent["xla"]


@pytest.mark.slow
def test_kernels_in_place_inside_the_collective_are_bitwise_xla(monkeypatch):
    """Off a TPU the collectives code with the kernels' tile code on whole messages
    (`MosaicCodec`, XLA ops); here the kernels themselves run, in TPU interpret mode, on 4
    devices (8 would deadlock a 2-core XLA:CPU, mosaic_codec.py): a pipelined bidirectional
    ring, whose steps read the input where it lies (`encode_at`, `hop_at`), write both lanes'
    last sums into one message (`hop_at(into=...)`) and decode each piece into its place in
    the result (`decode_into`), gives bitwise the XLA path's result. Pieces of 16 rows, one
    short tile each: the smallest the kernels take in place."""
    init, used = MosaicCodec.__init__, []
    monkeypatch.setattr(MosaicCodec, "__init__", lambda self, fmt, dtype: init(
        self, fmt, dtype, interpret=True))
    for name in ("encode_at", "hop_at", "decode_into"):
        step = getattr(MosaicCodec, name)
        monkeypatch.setattr(MosaicCodec, name, lambda self, *a, _s=step, _n=name, **kw:
                            used.append((_n, kw.get("into") is not None)) or
                            _s(self, *a, **kw))
    x = _data(4, 8 * 32 * 128, jnp.bfloat16)  # 8 chunks of 2 pieces of 16 rows (a tile each)
    kw = {"fmt": eq.Format.int8(), "algorithm": "bidir_ring", "num_chunks": 2}
    fn, xs = _run(x, "mosaic", **kw)
    mosaic = np.asarray(fn(xs))
    assert {("encode_at", False), ("hop_at", False), ("hop_at", True),
            ("decode_into", False)} == set(used), used
    fn, xs = _run(x, "xla", **kw)
    assert np.array_equal(_bits(mosaic), _bits(fn(xs)))


def test_each_ring_hop_is_one_fused_step(monkeypatch):
    """A ring of p = 8 with 2 pieces of 16 rows: every hop after the first message, and each
    owner's gather message, is `MosaicCodec.hop` (decode, add and encode in one pass): 7 a
    piece, each on one piece's message."""
    calls = []
    hop = MosaicCodec.hop
    monkeypatch.setattr(MosaicCodec, "hop", lambda self, w, local: calls.append(
        (w.payload.shape, local.shape)) or hop(self, w, local))
    x = _data(8, 8 * 32 * 128, jnp.float32)
    fn, xs = _run(x, "mosaic", fmt=eq.Format.int8(), num_chunks=2)
    fn.lower(xs)
    assert len(calls) == 2 * 7, calls
    assert all(local[-1] == 16 * 128 and payload[-2:] == (128, 16)
               for payload, local in calls), calls


def test_the_kernels_take_whole_sublane_groups_of_rows():
    """Which messages the kernels code (`codec.takes`, tiles of `codec.tile_rows`): whole
    tiles of `codec.ROWS` rows or a half, a quarter, an eighth of it, or one short tile of
    whole 16-row groups up to `codec.ROWS`; `MosaicCodec.fuses` the same for an f32
    accumulation."""
    int8, t = eq.Format.int8(), codec.ROWS  # the largest tile
    assert [codec.tile_rows(r) for r in (4 * t, 2 * t, 3 * t // 2, 3 * t // 4, 3 * t // 8, t,
                                         48, 16)] == [t, t, t // 2, t // 4, t // 8, t, 48, 16]
    assert [codec.tile_rows(r) for r in (8, 24, 520, 1000, t + 16)] == [None] * 5
    assert codec.takes(int8, 1024 * 128) and codec.takes(int8, 16 * 128)
    assert not codec.takes(int8, 24 * 128) and not codec.takes(int8, 100)
    assert not codec.takes(eq.Format.parse("int7/b8"), 1024 * 128)
    assert MosaicCodec(int8, jnp.bfloat16).fuses(48 * 128)
    assert not MosaicCodec(int8, jnp.bfloat16).fuses(24 * 128)


def test_mosaic_refuses_what_the_kernels_cannot_do():
    x = np.ones((2, 64), np.float32)
    for kw, match in (({"key": jax.random.key(0)}, r"impl='mosaic' rounds to nearest.*key="),
                      ({"hop_bits": "adaptive"}, r"impl='mosaic'.*hop_bits='adaptive'"),
                      ({"fmt": eq.Format.parse("int7/b8")},
                       r"impl='mosaic' codes 8-bit and 4-bit elements in blocks that divide "
                       r"128, not int7/b8")):
        kw.setdefault("fmt", eq.Format.int8())
        fn, xs = _run(x, "mosaic", **kw)
        with pytest.raises(ValueError, match=match):
            fn(xs)
    for name in ("int5", "mxfp6_e2m3", "int8/b96", "int4/b8"):  # 5, 6 bits; 96; 4-bit b8
        with pytest.raises(ValueError, match=r"impl='mosaic' codes 8-bit and 4-bit"):
            eq.AllReduce(fmt=eq.Format.parse(name), impl="mosaic")
    assert str(eq.AllReduce(impl="mosaic")) == "ring int8 (mosaic)"
