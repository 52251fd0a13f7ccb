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
from equarx_ref.kernels import row_codec
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


# values per device: whole tiles (rows of 128 blocks), 8 short rows, and a chunk the kernels do
# not take (the XLA codec carries it); int4's block is 16, the others' 32
CASES = [  # algorithm, format, p, values per device, num_chunks, dtype, extra
    ("ring", "int8", 8, 8 * 1024 * 32, 1, jnp.bfloat16, {}),
    ("ring", "mxfp4", 8, 8 * 200 * 32, 2, jnp.float32, {}),
    ("bidir_ring", "int4", 4, 8 * 96 * 16, 1, jnp.bfloat16, {}),
    ("two_shot", "fp8_e4m3", 8, 8 * 40 * 32, 1, jnp.float32, {}),
    ("one_shot", "mxfp8", 4, 4 * 8 * 32, 1, jnp.bfloat16, {}),
    ("ring", "int8/f32", 8, 8 * 77 * 32 + 5, 1, jnp.float32, {}),
    ("ring", "int8", 8, 8 * 8 * 32 * 2, 1, jnp.float32, {"rotate": True}),
    ("bidir_ring", "fp8_e5m2", 8, 2 * 4 * 8 * 8 * 32, 1, jnp.float32,
     {"axes": ("a", "b"), "shape": (2, 4)}),
]


@pytest.mark.parametrize(("algorithm", "name", "p", "n", "k", "dtype", "extra"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[3]}-{c[4]}-{sorted(c[6])}" for c in CASES])
def test_mosaic_is_bitwise_xla_with_the_same_wire_bytes(algorithm, name, p, n, k, dtype, extra):
    x = _data(p, n, dtype)
    kw = dict(fmt=eq.Format.parse(name), algorithm=algorithm, num_chunks=k, **extra)
    outs, sent = {}, {}
    for impl in ("xla", "mosaic"):
        fn, xs = _run(x, impl, **kw)
        outs[impl] = np.asarray(fn(xs))
        sent[impl] = hlo_wire_bytes(fn.lower(xs).compile().as_text(), p)
    assert np.array_equal(_bits(outs["mosaic"]), _bits(outs["xla"])), algorithm
    assert sent["mosaic"] == sent["xla"]


def test_kernels_in_place_inside_the_collective_are_bitwise_xla(monkeypatch):
    """Off a TPU the collectives code with the kernels' body on whole messages (`RowCodec`);
    here the kernels themselves run, in TPU interpret mode, on 4 devices (8 would deadlock a
    2-core XLA:CPU, row_codec.py): a pipelined bidirectional ring, whose steps read the input
    where it lies (`encode_at`, `hop_at`), write both lanes' last sums into one message
    (`hop_at(into=...)`) and decode each piece into its place in the result (`decode_into`),
    gives bitwise the XLA path's result."""
    init, used = row_codec.RowCodec.__init__, []
    monkeypatch.setattr(row_codec.RowCodec, "__init__", lambda self, fmt, dtype: init(
        self, fmt, dtype, interpret=True))
    for name in ("encode_at", "hop_at", "decode_into"):
        step = getattr(row_codec.RowCodec, name)
        monkeypatch.setattr(row_codec.RowCodec, name, lambda self, *a, _s=step, _n=name, **kw:
                            used.append((_n, kw.get("into") is not None)) or
                            _s(self, *a, **kw))
    x = _data(4, 2 * 4 * 1024 * 32 * 2, jnp.bfloat16)  # 8 chunks of 2 pieces of one tile
    kw = {"fmt": eq.Format.int8(), "algorithm": "bidir_ring", "num_chunks": 2}
    fn, xs = _run(x, "mosaic", **kw)
    mosaic = np.asarray(fn(xs))
    assert {("encode_at", False), ("hop_at", False), ("hop_at", True),
            ("decode_into", False)} == set(used), used
    fn, xs = _run(x, "xla", **kw)
    assert np.array_equal(_bits(mosaic), _bits(fn(xs)))


def test_each_ring_hop_is_one_fused_step(monkeypatch):
    """A ring of p = 8 with 2 pieces: every hop after the first message, and each owner's
    gather message, is `RowCodec.hop` (decode, add and encode in one pass): 7 a piece."""
    calls = []
    hop = row_codec.RowCodec._hop
    monkeypatch.setattr(row_codec.RowCodec, "_hop", lambda self, w, local: calls.append(
        w.shape) or hop(self, w, local))
    x = _data(8, 8 * 8 * 2 * 32, jnp.float32)
    fn, xs = _run(x, "mosaic", fmt=eq.Format.int8(), num_chunks=2)
    fn.lower(xs)
    assert len(calls) == 2 * 7


def test_message_rows():
    int8 = eq.Format.int8()
    assert row_codec.message_rows(1024 * 32, int8) == 8  # one tile: 8 rows of 128 blocks
    assert row_codec.message_rows(4096 * 32, int8) == 32  # whole tiles
    assert row_codec.message_rows(200 * 32, int8) == 8  # 8 rows of 25 blocks
    assert row_codec.message_rows(78 * 32, int8) is None  # not whole rows of blocks
    assert row_codec.message_rows(1032 * 32, int8) is None  # too long for one tile, not whole tiles
    assert row_codec.message_rows(100, int8) is None


def test_mosaic_refuses_what_the_kernels_cannot_do():
    x = np.ones((2, 64), np.float32)
    for kw, match in (({"key": jax.random.key(0)}, r"impl='mosaic' rounds to nearest.*key="),
                      ({"hop_bits": "adaptive"}, r"impl='mosaic'.*hop_bits='adaptive'"),
                      ({"fmt": eq.Format.parse("int7/b8")}, r"impl='mosaic' codes int8.*int7")):
        kw.setdefault("fmt", eq.Format.int8())
        fn, xs = _run(x, "mosaic", **kw)
        with pytest.raises(ValueError, match=match):
            fn(xs)
    with pytest.raises(ValueError, match=r"impl='mosaic' codes"):
        eq.AllReduce(fmt=eq.Format.parse("int5"), impl="mosaic")
    assert str(eq.AllReduce(impl="mosaic")) == "ring int8 (mosaic)"
