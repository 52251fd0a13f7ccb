"""The Pallas kernels in TPU interpret mode: bitwise the XLA path, race-free, and a broken
variant that the race detector catches (so a zero race count means something)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import cli, kernels
from equarx_ref.runs import kernel_checks, tpu_compile, tpu_matrix
from equarx_ref.wire import decode, encode

encode = jax.jit(encode, static_argnums=1)  # eager, each small op would compile on its own
decode = jax.jit(decode, static_argnums=(1, 2))


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _explain(got, want) -> str:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = np.abs(got - want)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    return (f"{bad.sum()} of {bad.size} values differ; max |diff| {np.nanmax(diff):.3g}, "
            f"first at {np.argwhere(bad)[:3].tolist()}")


# ---- the fused hop ----------------------------------------------------------------------------

HOP_FORMATS = [eq.Format.int8(), eq.Format.int4(16, "float32"), eq.Format.fp8_e4m3(),
               eq.Format.mxfp4()]


@pytest.mark.parametrize("fmt", HOP_FORMATS, ids=str)
def test_fused_hop_is_bitwise_the_xla_hop(fmt):
    rows, m = 16, 4 * fmt.block_size
    k1, k2 = jax.random.split(jax.random.key(3))
    incoming = jax.random.normal(k1, (rows, m)) * jnp.logspace(-3, 3, rows)[:, None]
    local = (jax.random.normal(k2, (rows, m)) * 2).astype(jnp.bfloat16)
    incoming = incoming.at[1].set(0.0).at[2, 5].set(jnp.nan)  # a zero row; a NaN block
    local = local.at[1].set(0.0).at[3, -1].set(jnp.inf)  # an Inf in the local chunk
    wire = encode(incoming, fmt)
    got = kernels.fused_hop(wire, local, fmt)
    want = jax.jit(kernels.hop_reference, static_argnums=2)(wire, local, fmt)
    assert got.dtype == jnp.uint8 and got.shape == wire.shape
    assert np.array_equal(got, want), _explain(got, want)
    assert np.array_equal(encode(decode(wire, fmt, m) + local.astype(jnp.float32), fmt), want)
    back = np.asarray(decode(got, fmt, m))
    assert np.isnan(back[2, :fmt.block_size]).all() and np.isfinite(back[2, fmt.block_size:]).all()
    assert (back[1] == 0).all()


def test_fused_hop_refuses_bad_shapes():
    fmt = eq.Format.int8()
    wire, local = encode(jnp.ones((4, 64)), fmt), jnp.ones((4, 64))
    with pytest.raises(ValueError, match="wire must be uint8"):
        kernels.fused_hop(wire[:, :10], local, fmt)
    with pytest.raises(ValueError, match="not a multiple of block_size"):
        kernels.fused_hop(wire, jnp.ones((4, 60)), fmt)
    with pytest.raises(ValueError, match="block_rows=3"):
        kernels.fused_hop(wire, local, fmt, block_rows=3)
    with pytest.raises(TypeError, match="Format"):
        kernels.fused_hop(wire, local, "int8")


@pytest.mark.parametrize("name", ["int8", "mxfp4"])
def test_mosaic_codec_tiles_the_message(name):
    """`kernels.codec` on 16 rows of two tiles each (a 2 x 2 grid): the XLA codec's bytes,
    values and hop, tile seams included."""
    from equarx_ref.kernels import codec

    fmt = eq.Format.parse(name)
    m = 2 * codec.TILE_BLOCKS * fmt.block_size
    k1, k2 = jax.random.split(jax.random.key(5))
    x = (jax.random.normal(k1, (16, m)) * jnp.logspace(-3, 3, 16)[:, None]).astype(jnp.bfloat16)
    local = jax.random.normal(k2, (16, m)).astype(jnp.bfloat16)
    wire = codec.encode(x, fmt)
    assert np.array_equal(wire, encode(x, fmt))
    back = codec.decode(wire, fmt, m, jnp.bfloat16)
    assert back.dtype == jnp.bfloat16
    assert np.array_equal(back, decode(wire, fmt, m).astype(jnp.bfloat16))
    assert np.array_equal(codec.hop(wire, local, fmt), kernels.hop_reference(wire, local, fmt))
    # one tile a row: the values travel lane-dense, f32 through the kernels' bitcast route
    dense_wire, dense_x = wire.reshape(32, -1), x.reshape(32, m // 2).astype(jnp.float32)
    assert codec._dense((8, m // 2), m // 2)
    assert np.array_equal(codec.encode(dense_x, fmt), dense_wire)
    assert np.array_equal(codec.decode(dense_wire, fmt, m // 2), decode(dense_wire, fmt, m // 2))


@pytest.mark.parametrize("rows, m, want", [(16, 2 * 4096, (2, 2)), (4, 96, (1, 1)),
                                           (8, 3 * 4096, (1, 3))])
def test_mosaic_codec_grid_is_the_kernels(rows, m, want):
    """`codec.grid` says what `pallas_call` is given: groups of 8 rows by tiles of 128 blocks,
    a short message as one tile."""
    from equarx_ref.kernels import codec

    fmt = eq.Format.int8()
    jaxpr = jax.make_jaxpr(lambda v: codec.encode(v, fmt))(jnp.zeros((rows, m), jnp.bfloat16))
    calls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert codec.grid(rows, m, fmt) == want == tuple(calls[0].params["grid_mapping"].grid)


def test_mosaic_codec_refuses_bad_shapes():
    from equarx_ref.kernels import codec

    fmt = eq.Format.int8()
    with pytest.raises(ValueError, match="not a multiple of block_size 32"):
        codec.encode(jnp.ones((8, 100)), fmt)
    with pytest.raises(ValueError, match=r"block_cols=2048 must divide .* multiple of 4096"):
        codec.encode(jnp.ones((8, 8192)), fmt, block_cols=2048)
    with pytest.raises(ValueError, match=r"8 rows at a time: 12 rows is not a multiple of 8"):
        codec.encode(jnp.ones((12, 32)), fmt)
    with pytest.raises(ValueError, match=r"x must be \[rows, m\]"):
        codec.encode(jnp.ones(64), fmt)
    with pytest.raises(ValueError, match=r"wire must be uint8 \[8, 34\]"):
        codec.decode(jnp.zeros((8, 10), jnp.uint8), fmt, 32)
    with pytest.raises(ValueError, match=r"wire must be uint8 \[4, 34\]"):
        codec.hop(jnp.zeros((8, 34), jnp.uint8), jnp.ones((4, 32)), fmt)
    with pytest.raises(ValueError, match=r"wire must be uint8 \[p, rows, 34\]"):
        codec.reduce(jnp.zeros((8, 34), jnp.uint8), fmt, 32)
    with pytest.raises(TypeError, match="Format"):
        codec.encode(jnp.ones((8, 32)), "int8")


# ---- the ring kernel ------------------------------------------------------------------------


def _both(x: np.ndarray, *, fmt, algorithm, num_chunks, dtype=jnp.float32):
    """impl="pallas" (races counted) and impl="xla" on the first p devices, out_specs=P()."""
    p = x.shape[0]
    mesh = jax.make_mesh((p,), ("tp",), devices=DEVICES[:p])
    xs = jax.device_put(jnp.asarray(x, dtype), NamedSharding(mesh, P("tp")))

    def run(impl):
        body = lambda v: eq.all_reduce(v[0], "tp", fmt=fmt, algorithm=algorithm,  # noqa: E731
                                       num_chunks=num_chunks, impl=impl)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P(),
                                     check_vma=True))(xs)

    with kernels.RaceLog() as log:
        got = jax.block_until_ready(run("pallas"))
    return got, run("xla"), log


# Interpret mode compiles every step of the kernel (2p - 1 hops x pieces x lanes) into one CPU
# program: the cases are chosen to cover p = 2, 3, 4, 8, both lanes, pipelining (pieces > 1,
# receive slots reused) and every wire codec at a few seconds each.
CASES = [  # p, algorithm, format, values per device, pipeline pieces, input dtype
    (2, "ring", eq.Format.int8(), 37, 1, jnp.float32),
    (4, "bidir_ring", eq.Format.int4(), 301, 1, jnp.bfloat16),
    (8, "ring", eq.Format.int8(), 515, 1, jnp.float32),
    (3, "ring", eq.Format.fp8_e4m3(), 333, 2, jnp.float32),
    (2, "bidir_ring", None, 150, 2, jnp.bfloat16),
]


@pytest.mark.parametrize(("p", "algorithm", "fmt", "n", "k", "dtype"), CASES,
                         ids=lambda v: str(v) if not hasattr(v, "dtype") else None)
def test_pallas_ring_is_bitwise_xla(p, algorithm, fmt, n, k, dtype):
    x = np.array(jax.random.normal(jax.random.key(p * n), (p, n)))
    x[:, 32:64] = 0.0  # an all-zero block on every device
    if n > 300:
        x[1, 100] = np.nan  # a NaN block: that block's sum is NaN, the others are not
    got, want, log = _both(x, fmt=fmt, algorithm=algorithm, num_chunks=k, dtype=dtype)
    assert log.count == 0 and not log.found, "\n".join(log.reports[:2])
    assert got.shape == (n,) and got.dtype == dtype
    assert np.array_equal(_bits(got), _bits(want)), _explain(got, want)
    exact = np.asarray(jnp.asarray(x, dtype), np.float64).sum(0)
    finite = np.isfinite(exact)
    if n > 300:  # NaN decides its whole block (block 3: values 96..127), nothing else
        block = np.arange(n) // (fmt.block_size if fmt is not None else n)
        assert np.isnan(np.asarray(got, np.float64)[block == 3]).all()
        finite &= block != 3
    tol = p * (0.05 if fmt is None or fmt.name == "int8" else 0.5)
    assert np.abs(np.asarray(got, np.float64) - exact)[finite].max() < tol


@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring"])
def test_broken_kernel_is_caught_by_the_race_detector(algorithm):
    """A receiver that reads its slot before waiting for the message races on every message,
    whatever the threads' timing: no semaphore orders the DMA's write before that read, in the
    happens-before sense the detector checks (at p >= 3 no other path carries the sender's
    clock to the receiver first). So one run must report it, every time; a zero race count
    above then means something. (The "capacity" sabotage races only on some schedules: at
    p = 2 the neighbours' other semaphores can order the accesses, and it was once missed.)"""
    result = kernel_checks.check(4, fmt=eq.Format.int8(), algorithm=algorithm, n=256, num_chunks=2,
                           sabotage="early_read")
    assert result.races > 0 and result.sabotage == "early_read", result


def test_plan_sends_the_xla_bytes():
    """The kernel's messages are the XLA path's messages: the same count of the same sizes."""
    for p, algorithm, n, k in [(2, "ring", 37, 1), (4, "bidir_ring", 301, 2), (8, "ring", 4096, 4)]:
        for fmt in (eq.Format.int8(), eq.Format.int4(), None):
            plan = kernels.plan_ring(n, p, fmt=fmt, algorithm=algorithm, num_chunks=k,
                                     dtype="bfloat16")
            assert plan.bytes_sent == eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm,
                                                    dtype="bfloat16", num_chunks=k)
            steps = plan.program(device=1)
            assert len(steps) == (2 * p - 1) * plan.k and plan.slots == plan.k + 1
            assert sum(s["send_slot"] is not None for s in steps) == 2 * (p - 1) * plan.k
            own = [s for s in steps if s["phase"] == "own"]
            assert {s["chunk"] for s in own} == {1}  # device 1 owns chunk 1 (lane 0)


def test_unsupported_combinations_are_refused():
    mesh = jax.make_mesh((2, 2), ("a", "b"), devices=DEVICES[:4])
    x = jax.device_put(jnp.ones((4, 64)), NamedSharding(mesh, P(("a", "b"))))

    def call(**kw):
        return jax.shard_map(lambda v: eq.all_reduce(v[0], kw.pop("axis", "a"), **kw),
                             mesh=mesh, in_specs=P(("a", "b")), out_specs=P(),
                             check_vma=False)(x)

    with pytest.raises(ValueError, match="unknown impl 'triton'"):
        call(impl="triton")
    with pytest.raises(ValueError, match=r"impl='pallas' runs 'ring' and 'bidir_ring'.*two_shot"):
        call(impl="pallas", algorithm="two_shot")
    with pytest.raises(ValueError, match=r"impl='pallas'.*not a 2D torus"):
        call(impl="pallas", axis=("a", "b"))
    with pytest.raises(ValueError, match="psum"):
        call(impl="pallas", algorithm="psum", fmt=None)
    with pytest.raises(ValueError, match="unknown impl"):
        eq.AllReduce(impl="triton")
    with pytest.raises(ValueError, match="impl='pallas'"):
        eq.AllReduce(algorithm="one_shot", impl="pallas")
    with pytest.raises(ValueError, match="sabotage"):
        kernels.ring_all_reduce(jnp.ones(4), "a", sabotage="everything")
    ar = eq.AllReduce(algorithm="bidir_ring", impl="pallas")
    assert str(ar) == "bidir_ring int8 (pallas)" and hash(ar) == hash(eq.AllReduce(
        algorithm="bidir_ring", impl="pallas"))


def test_measure_hop_refuses_without_a_tpu():
    with pytest.raises(RuntimeError, match="no TPU figure"):
        kernel_checks.measure_hop()


def test_cli_kernels(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(kernel_checks, "CHECKS", ((2, "ring", "int8", 1, None),
                                                   (4, "ring", "int8", 2, "early_read")))
    out = tmp_path / "kernels.json"
    assert cli.main(["kernels", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no TPU" in text and "interpret mode" in text
    report = json.loads(out.read_text())
    assert report["tpu"] is False and report["timings"] == [] and not report["timing_errors"]
    assert "--compile v5e:2x4" in text and "lowering" not in report
    good, broken = report["checks"]
    assert good["bitwise"] and good["races"] == 0 and broken["races"] > 0


def test_cli_compile_without_libtpu(capsys):
    """`kernels --compile` compiles with libtpu; where it is not installed (this suite's
    environment), one clear line says how to get it. The compiles themselves run in the TPU
    compile tier (tests/tpu_compile.sh, tests/test_tpu_compile.py)."""
    if tpu_compile.libtpu_version() is not None:
        pytest.skip("libtpu is installed here: the compile tier covers --compile")
    assert cli.main(["kernels", "--compile", "v5e:2x4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "libtpu is not installed" in err[0] and "jax[tpu]==" in err[0]


def test_cli_compile_options(tmp_path, capsys, monkeypatch):
    """The options reach `tpu_matrix.run` as parsed, and the report is stored with the
    command that made it (run replaced: the compiles need libtpu, the compile tier has it)."""
    calls = []

    def run(topologies, **kw):
        calls.append((topologies, kw))
        return 0, {"topologies": list(topologies), "results": []}
    monkeypatch.setattr(tpu_matrix, "run", run)
    out = tmp_path / "tpu.json"
    argv = ["kernels", "--compile", "v5e:2x4,v6e:2x4", "--only", "pallas", "hop",
            "--read-back", "--bytes", "0.25", "--jobs", "2", "--json", str(out)]
    assert cli.main(argv) == 0
    (topologies, kw), = calls
    assert topologies == ("v5e:2x4", "v6e:2x4") and kw["families"] == ("pallas", "hop")
    assert kw["read_back_too"] is True and kw["jobs"] == 2 and kw["bytes_mib"] == 0.25
    report = json.loads(out.read_text())
    assert report["command"] == ("equarx-ref kernels --compile v5e:2x4,v6e:2x4 --only pallas "
                                 f"hop --read-back --bytes 0.25 --jobs 2 --json {out}")
    assert report["topologies"] == ["v5e:2x4", "v6e:2x4"]


@pytest.mark.parametrize("argv, words", [
    (["--compile", "v5e"], "expected TPU slices like v5e:2x4"),
    (["--compile", ","], "expected TPU slices like v5e:2x4"),
    (["--compile", "v5e:2x4", "--jobs", "0"], "expected an integer >= 1"),
    (["--compile", "v5e:2x4", "--only", "mosaic"], "invalid choice: 'mosaic'"),
    (["--compile", "v5e:2x4", "--bytes", "0.001"], "a positive multiple of 1/64 MiB"),
])
def test_cli_compile_refuses_bad_options(argv, words, capsys, monkeypatch):
    monkeypatch.setattr(tpu_matrix, "run", lambda *a, **k: pytest.fail("the work started"))
    from conftest import cli_error

    with pytest.raises(SystemExit) as e:
        cli.main(["kernels", *argv])
    assert e.value.code == 2 and words in cli_error(capsys.readouterr().err)


@pytest.mark.parametrize("flag", [["--read-back"], ["--only", "xla"], ["--jobs", "2"],
                                  ["--bytes"]])
def test_cli_compile_options_need_compile(flag, capsys, monkeypatch):
    monkeypatch.setattr(kernel_checks, "report", lambda **k: pytest.fail("the work started"))
    assert cli.main(["kernels", *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "go with --compile TOPOLOGY" in err[0], err


def test_compile_matrix_refuses_an_unknown_family():
    with pytest.raises(ValueError, match="unknown compile families"):
        tpu_matrix.compile_matrix("v5e:2x4", families=("mosaic",))


def test_single_chip_tpu_runs_the_ring_in_interpret_mode(monkeypatch):
    """Free Colab: the default backend is one TPU chip and the ring runs on simulated CPU
    devices. The kernel must then interpret (Mosaic compiles for TPU devices only), chosen by
    the mesh's platform, and `check` must take the CPU devices rather than refuse."""
    real = jax.devices
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(jax, "devices", lambda backend=None: real(backend) if backend
                        else real()[:1])
    assert kernels.on_tpu() and len(jax.devices()) == 1  # default backend on purpose
    result = kernel_checks.check(2, fmt=eq.Format.int8(), n=64, num_chunks=1)
    assert result.bitwise and result.races == 0, result
    x = np.array(jax.random.normal(jax.random.key(5), (2, 64)))
    got, want, log = _both(x, fmt=eq.Format.int8(), algorithm="ring", num_chunks=1)
    assert log.count == 0 and np.array_equal(_bits(got), _bits(want)), _explain(got, want)


@pytest.mark.parametrize("name", ["int8", "mxfp4"])
def test_mosaic_codec_reads_rows_where_they_lie(name):
    """`first_row` (a traced index): encode and hop read their rows out of a larger array, and
    `order`: decode reads gathered messages in result order, each the same bytes and values as
    the slice, or the permuted messages, handed over whole (interpret mode)."""
    from equarx_ref.kernels import codec

    fmt = eq.Format.parse(name)
    m = codec.TILE_BLOCKS * fmt.block_size  # rows of 128 blocks: the values travel lane-dense
    k1, k2 = jax.random.split(jax.random.key(7))
    source = (jax.random.normal(k1, (32, m)) * jnp.logspace(-3, 3, 32)[:, None]
              ).astype(jnp.bfloat16)  # 4 messages of 8 rows
    wire = encode(jax.random.normal(k2, (8, m)), fmt)
    at = jax.jit(lambda s, w, i: (codec.encode(s, fmt, rows=8, first_row=i),
                                  codec.hop(w, s, fmt, first_row=i),
                                  codec.hop(w, s, fmt, first_row=(i // 8, 8))))  # row i/8 x 8
    for i in (0, 16, 24):
        got_encode, got_hop, got_pair = at(source, wire, jnp.int32(i))
        assert np.array_equal(got_encode, encode(source[i:i + 8], fmt)), i
        assert np.array_equal(got_hop, kernels.hop_reference(wire, source[i:i + 8], fmt)), i
        assert np.array_equal(got_pair, got_hop), i
    messages = encode(source, fmt)
    order = (2, 0, 3, 1)
    want = decode(messages.reshape(4, 8, -1)[np.array(order)].reshape(32, -1), fmt, m)
    assert np.array_equal(codec.decode(messages, fmt, m, order=order), want)
    with pytest.raises(ValueError, match="order must permute whole messages"):
        codec.decode(messages, fmt, m, order=(0, 1, 1, 2))
    with pytest.raises(ValueError, match="rows= and first_row= together"):
        codec.encode(source, fmt, rows=8)


def test_row_codec_in_place_steps_match_the_cut_ones():
    """`RowCodec.encode_at`, `hop_at`, `decode_in_order` and `decode_into` with the kernels
    (interpret mode): the bytes and values of the steps they stand for, on a slice cut out
    first (and for a pipelined piece, its columns), or joined after; and the XLA
    codec's `decode_in_order` (a transpose, or a gather) is `decode` of the permuted bytes."""
    from equarx_ref.kernels import codec, row_codec
    from equarx_ref.wire import Codec

    fmt = eq.Format.int8()
    m = 8 * codec.TILE_BLOCKS * fmt.block_size  # a message of 8 rows of 128 blocks
    source = jax.random.normal(jax.random.key(8), (4, m // 128, 128)).astype(jnp.bfloat16)
    kernel = row_codec.RowCodec(fmt, jnp.bfloat16, interpret=True)
    start = jnp.int32(2)
    cut = source[2:3].reshape(1, m)
    message = kernel.encode_at(source, start, 1)
    assert np.array_equal(message, kernel.encode(cut))
    assert np.array_equal(kernel.hop_at(message, source, start, 1), kernel.hop(message, cut))
    # two hops written into one message of two chunks (a bidirectional ring's gather), in
    # place: the two messages joined
    other = kernel.encode(source[0:1].reshape(1, m))
    both = kernel.hop_at(other, source, jnp.int32(3), 1, into=(2, 1))
    both = kernel.hop_at(message, source, start, 1, into=(both, 0))
    assert np.array_equal(both, jnp.concatenate([kernel.hop(message, cut),
                                                 kernel.hop(other, source[3:4].reshape(1, m))]))
    with pytest.raises(ValueError, match="into lays messages"):
        kernel.hop_at(message, source, start, 1, into=(1, 1))
    # a pipelined piece: chunks of two messages, the second's columns read in place
    pieces = jax.random.normal(jax.random.key(9), (4, 2 * m // 128, 128)).astype(jnp.bfloat16)
    window = (m // 128, m // 128)
    assert kernel._in_place(pieces.shape, 1, window)[1] == (8, 16, 8)  # rows 16 c + 8 .. 16 c + 15
    cut = pieces[2:3, m // 128:].reshape(1, m)
    message = kernel.encode_at(pieces, start, 1, window)
    assert np.array_equal(message, kernel.encode(cut))
    assert np.array_equal(kernel.hop_at(message, pieces, start, 1, window),
                          kernel.hop(message, cut))
    # and back: each piece's messages decoded over its columns of one result, in place
    halves = [(0, m // 128), window]
    assert all(kernel.places(pieces.shape, w) for w in halves)
    # a window off whole tiles of rows is not read in place: the executor cuts it out
    assert not kernel.places(pieces.shape, (4, m // 128))
    with pytest.raises(ValueError, match="cannot code 1 chunk"):
        kernel.encode_at(pieces, start, 1, (4, m // 128))
    sent = [jnp.stack([kernel.encode(pieces[c, a:a + n].reshape(1, m))[0] for c in range(4)])
            for a, n in halves]
    out = jax.ShapeDtypeStruct(pieces.shape, jnp.bfloat16)
    for got, w, order in zip(sent, halves, (None, (1, 3, 0, 2)), strict=True):
        out = kernel.decode_into(got if order is None else got[np.argsort(order)], out, w,
                                 jnp.bfloat16, order)
    want = jnp.concatenate([kernel.decode(got, m, jnp.bfloat16).reshape(4, -1, 128)
                            for got in sent], axis=1)
    assert out.dtype == jnp.bfloat16 and np.array_equal(out, want)
    gathered = jnp.stack([kernel.encode(source[c].reshape(1, m))[0] for c in range(4)])
    order = (1, 3, 0, 2)
    want = kernel.decode(gathered[np.array(order)], m)
    assert np.array_equal(kernel.decode_in_order(gathered, m, None, order), want)
    xla = Codec(fmt, jnp.bfloat16)
    flat = xla.encode(source.reshape(4, m).astype(jnp.float32))
    for order in ((0, 2, 1, 3), (3, 1, 2, 0)):  # a transpose of [2, 2], and a gather
        assert np.array_equal(xla.decode_in_order(flat, m, None, order),
                              xla.decode(flat[np.array(order)], m))
