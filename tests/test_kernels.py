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
from equarx_ref.kernels import codec, tiles
from equarx_ref.kernels.mosaic_codec import MosaicCodec
from equarx_ref.quantize import zero_subnormals
from equarx_ref.runs import tpu_compile, tpu_matrix
from equarx_ref.wire import Codec, Message, decode, encode

encode = jax.jit(encode, static_argnums=1)  # eager, each small op would compile on its own
decode = jax.jit(decode, static_argnums=(1, 2))


def _kernel_checks():
    """runs/kernel_checks.py (the kernels' harness and the CLI's checks), imported by the
    tests that use it."""
    from equarx_ref.runs import kernel_checks

    return kernel_checks


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _explain(got, want) -> str:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = np.abs(got - want)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    return (f"{bad.sum()} of {bad.size} values differ; max |diff| {np.nanmax(diff):.3g}, "
            f"first at {np.argwhere(bad)[:3].tolist()}")


# ---- the Mosaic codec's kernels (kernels/codec.py) --------------------------------------------

HOP_FORMATS = [eq.Format.int8(), eq.Format.int4(16, "float32"), eq.Format.fp8_e4m3(),
               eq.Format.mxfp4()]


def _same(got: Message, want: Message, what=""):
    """Two messages, bitwise (both arrays, shapes and dtypes)."""
    for name, a, b in zip(("payload", "scales"), got, want, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name, a.dtype, a.shape,
                                                           b.dtype, b.shape)
        bad = np.argwhere(a != b)
        assert bad.size == 0, f"{what} {name}: {len(bad)} differ, first at {bad[:3].tolist()}"


def _xla_hop(message, local, fmt):
    """The XLA path's hop, as the executor runs it: decode, add in f32 (a subnormal local
    value read as a zero of its sign), encode."""
    m = local.size
    total = decode(message, fmt, m) + zero_subnormals(local.reshape(-1).astype(jnp.float32))
    return encode(total, fmt)


@pytest.mark.parametrize("fmt", HOP_FORMATS, ids=str)
@pytest.mark.slow
def test_mosaic_hop_is_bitwise_the_xla_hop(fmt):
    """`codec.hop` (interpret mode): 16 rows of 128 values over six decades, a zero row, a NaN
    block in the message and an Inf in the bf16 local values: the XLA hop's message bitwise,
    the non-finite blocks NaN and nothing else."""
    rows = 16
    k1, k2 = jax.random.split(jax.random.key(3))
    incoming = jax.random.normal(k1, (rows, 128)) * jnp.logspace(-3, 3, rows)[:, None]
    local = (jax.random.normal(k2, (rows, 128)) * 2).astype(jnp.bfloat16)
    incoming = incoming.at[1].set(0.0).at[2, 5].set(jnp.nan)  # a zero row; a NaN block
    local = local.at[1].set(0.0).at[3, -1].set(jnp.inf)  # an Inf in the local chunk
    message = encode(incoming.reshape(-1), fmt)
    got = codec.hop(message, local, fmt, interpret=True)
    want = _xla_hop(message, local, fmt)
    _same(got, want, "hop")
    _same(jax.jit(tiles.hop, static_argnums=2)(message, local, fmt), want, "tiles.hop")
    back = np.asarray(decode(got, fmt, rows * 128)).reshape(rows, 128)
    b = fmt.block_size
    assert np.isnan(back[2, :b]).all() and np.isfinite(back[2, b:]).all()
    assert np.isnan(back[3, -b:]).all() and np.isfinite(back[3, :-b]).all()
    assert (back[1] == 0).all() and np.isfinite(np.delete(back, [2, 3], axis=0)).all()


def test_mosaic_codec_refuses_bad_arguments():
    """Each kernel refuses what it cannot code, in one line naming the argument."""
    fmt = eq.Format.int8()
    x = jnp.ones((16, 128))
    message = encode(x.reshape(-1), fmt)
    stack = jax.tree.map(lambda a: jnp.stack([a, a]), message)
    kw = {"interpret": True}
    cases = [
        (lambda: codec.encode(jnp.ones((16, 100)), fmt, **kw), r"x must be rows of 128 values"),
        (lambda: codec.encode(jnp.ones(64), fmt, **kw), r"x must be rows of 128 values"),
        (lambda: codec.encode(jnp.ones((24, 128)), fmt, **kw),
         rf"whole tiles: 24 rows is not a multiple of 128, nor a multiple of 16 up to "
         rf"{codec.ROWS}"),
        (lambda: codec.encode(jnp.ones((16, 128), jnp.int32), fmt, **kw), r"x must hold float"),
        (lambda: codec.encode(x, "int8", **kw), r"fmt must be an equarx_ref.Format"),
        (lambda: codec.encode(x, eq.Format.parse("int7/b8"), **kw),
         r"takes 8-bit and 4-bit elements.*int7/b8 is not one"),
        (lambda: codec.encode(x, fmt, count=3, **kw), r"16 rows are not 3 chunks"),
        (lambda: codec.encode(x, fmt, count=0, **kw), r"count must be >= 1"),
        (lambda: codec.encode(x, fmt, rows=2.5, **kw), r"rows must be an integer"),
        (lambda: codec.encode(x, fmt, first_row=0, **kw), r"rows= says how many rows"),
        (lambda: codec.encode(x, fmt, rows=16, first_row=(0, 8), **kw),
         r"offsets of whole tiles of 16 rows"),
        (lambda: codec.encode(x, fmt, rows=16, first_row=8, **kw),
         r"offsets of whole tiles of 16 rows; got \(16, 8\)"),
        (lambda: codec.encode(x, fmt, rows=16, first_row=(0,), **kw),
         r"first_row must be a row index or a tuple \(i, a\[, o\]\)"),
        (lambda: codec.encode(x, fmt, rows=16, first_row=2.0, **kw),
         r"first_row must be a row index \(an integer, or a 0-d integer array\), got 2.0"),
        (lambda: codec.encode(x, fmt, rows=16, first_row=jnp.zeros(2, jnp.int32), **kw),
         r"first_row must be a row index.*got an array int32\[2\]"),
        (lambda: codec.encode(x, fmt, into=(message, 3), **kw), r"into lays 1 chunks from chunk 3"),
        (lambda: codec.encode(x, fmt, interpret="yes"), r"interpret must be None, True"),
        (lambda: codec.decode(x, fmt, **kw), r"message must be an equarx_ref.wire.Message"),
        (lambda: codec.decode(Message(message.payload[:3], message.scales), fmt, **kw),
         r"message must be uint8 \[\.\.\., 128, rows\] and uint16\[\.\.\., 4, rows\]"),
        (lambda: codec.decode(Message(message.payload, message.scales.astype(jnp.uint32)), fmt,
                              **kw), r"message must be uint8"),
        (lambda: codec.decode(message, fmt, "int8", **kw), r"dtype must be a floating dtype"),
        (lambda: codec.decode(stack, fmt, order=(0, 0), **kw), r"order must permute the 2"),
        (lambda: codec.decode(message, fmt, order=(0,), **kw), r"order must permute"),
        (lambda: codec.decode(stack, fmt, into=(x, 16, 0), **kw), r"into lays 2 chunks"),
        (lambda: codec.decode(stack, fmt, into=(x.astype(jnp.bfloat16), 0, 0), **kw),
         r"into must be float32 rows"),
        (lambda: codec.hop(message, jnp.ones((32, 128)), fmt, **kw),
         r"local must be the message's 16 rows"),
        (lambda: codec.hop(message, jnp.ones((16, 64)), fmt, **kw), r"local must be rows of 128"),
        (lambda: codec.hop(message.payload, x, fmt, **kw), r"message must be an equarx_ref"),
        (lambda: codec.hop(message, x, fmt, count=3, **kw), r"not 3 equal chunks"),
        (lambda: codec.hop(stack, jnp.ones((32, 128)), fmt, count=3, **kw),
         r"a stack of 2 messages is that many chunks, not count=3"),
        (lambda: codec.reduce(message, fmt, **kw), r"reduce takes p messages stacked"),
        (lambda: codec.reduce(None, fmt, **kw), r"messages must be an equarx_ref.wire.Message"),
    ]
    for call, match in cases:
        with pytest.raises((ValueError, TypeError), match=match) as e:
            call()
        assert "\n" not in str(e.value).strip(), str(e.value)


@pytest.mark.parametrize("name", ["int8", "mxfp4"])
@pytest.mark.slow
def test_mosaic_codec_tiles_the_message(name):
    """`kernels.codec` on 256 rows (one grid step of two of the tile code's 128-row tiles), as
    `count` = 2 chunks (two grid steps), and on 48 rows (one short tile): the XLA codec's
    messages, values (to bf16 too) and hop, tile seams included; a stacked result is the flat
    one cut at the chunks."""
    fmt = eq.Format.parse(name)
    k1, k2 = jax.random.split(jax.random.key(5))
    for rows in (48, 256):
        x = (jax.random.normal(k1, (rows, 128)) * jnp.logspace(-3, 3, rows)[:, None]
             ).astype(jnp.bfloat16)
        local = jax.random.normal(k2, (rows, 128)).astype(jnp.bfloat16)
        m = rows * 128
        want = encode(x.reshape(-1), fmt)
        _same(codec.encode(x, fmt, interpret=True), want, f"encode {rows}")
        back = codec.decode(want, fmt, "bfloat16", interpret=True)
        assert back.dtype == jnp.bfloat16 and back.shape == (rows, 128)
        assert np.array_equal(_bits(back), _bits(decode(want, fmt, m).astype(jnp.bfloat16)
                                                 .reshape(rows, 128)))
        _same(codec.hop(want, local, fmt, interpret=True), _xla_hop(want, local, fmt),
              f"hop {rows}")
    _same(codec.encode(x, fmt, count=2, interpret=True), want, "two chunks")
    halves = codec.encode(x, fmt, count=2, stacked=True, interpret=True)
    for c in range(2):
        _same(jax.tree.map(lambda a, c=c: a[c], halves),
              encode(x[c * 128:(c + 1) * 128].reshape(-1), fmt), f"stacked chunk {c}")


@pytest.mark.parametrize("rows, count, want", [(4 * codec.ROWS, 1, (1, 4)), (512, 2, (2, 1)),
                                               (48, 1, (1, 1)), (256, 4, (4, 1))])
def test_mosaic_codec_grid_is_the_kernels(rows, count, want):
    """What `pallas_call` is given: a grid of (chunks, tiles a chunk), tiles of `tile_rows`
    rows (`codec.ROWS`, or a half, a quarter, an eighth of it where it divides a chunk, else
    the whole of a short one)."""
    fmt = eq.Format.int8()
    jaxpr = jax.make_jaxpr(lambda v: codec.encode(v, fmt, count=count))(
        jnp.zeros((rows, 128), jnp.bfloat16))
    (call,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert tuple(call.params["grid_mapping"].grid) == want
    assert want[1] * codec.tile_rows(rows // count) == rows // count


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
@pytest.mark.slow
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
@pytest.mark.slow
def test_broken_kernel_is_caught_by_the_race_detector(algorithm):
    """A receiver that reads its slot before waiting for the message races on every message,
    whatever the threads' timing: no semaphore orders the DMA's write before that read, in the
    happens-before sense the detector checks (at p >= 3 no other path carries the sender's
    clock to the receiver first). So one run must report it, every time; a zero race count
    above then means something. (The "capacity" sabotage races only on some schedules: at
    p = 2 the neighbours' other semaphores can order the accesses, and it was once missed.)"""
    result = _kernel_checks().check(4, fmt=eq.Format.int8(), algorithm=algorithm, n=256,
                                    num_chunks=2, sabotage="early_read")
    assert result.races > 0 and result.sabotage == "early_read", result


def test_plan_sends_the_xla_bytes():
    """The kernel's messages are the XLA path's messages: the same count of the same sizes."""
    for p, algorithm, n, k in [(2, "ring", 37, 1), (4, "bidir_ring", 301, 2), (8, "ring", 4096, 4)]:
        for fmt in (eq.Format.int8(), eq.Format.int4(), None):
            plan = kernels.plan_ring(n, p, fmt=fmt, algorithm=algorithm, num_chunks=k,
                                     dtype="bfloat16")
            assert plan.bytes_sent == eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm,
                                                    dtype="bfloat16", num_chunks=k,
                                                    min_bytes=0)  # the kernel: no size gate
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


@pytest.mark.parametrize(("fmt", "n"), [(eq.Format.int8(), 2 * 144 * 128),
                                        (eq.Format.parse("mxfp6_e2m3"), 256),
                                        (eq.Format.parse("int7/b8"), 256)], ids=str)
def test_pallas_ring_codes_what_it_accepts(fmt, n):
    """impl="pallas" takes every format and length `all_reduce` lets through to it (the
    ring's essay lists mxfp6 among the formats it builds with): bitwise impl="xla", or a
    clear refusal naming impl='pallas' (not an error from inside the kernel). A chunk of
    144 rows (a whole tile of 128 and a short one); 6-bit and odd-width elements."""
    x = np.array(jax.random.normal(jax.random.key(11), (2, n)))
    try:
        got, want, log = _both(x, fmt=fmt, algorithm="ring", num_chunks=1)
    except ValueError as e:
        assert "impl='pallas'" in str(e) and "\n" not in str(e).strip(), str(e)
        return
    assert log.count == 0 and np.array_equal(_bits(got), _bits(want)), _explain(got, want)


def test_measure_hop_refuses_without_a_tpu():
    with pytest.raises(RuntimeError, match="no TPU figure"):
        _kernel_checks().measure_hop()


@pytest.mark.slow
def test_cli_kernels(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_kernel_checks(), "CHECKS", ((2, "ring", "int8", 1, None),
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
    argv = ["kernels", "--compile", "v5e:2x4,v6e:2x4", "--only", "pallas", "codec",
            "--read-back", "--bytes", "0.25", "--jobs", "2", "--json", str(out)]
    assert cli.main(argv) == 0
    (topologies, kw), = calls
    assert topologies == ("v5e:2x4", "v6e:2x4") and kw["families"] == ("pallas", "codec")
    assert kw["read_back_too"] is True and kw["jobs"] == 2 and kw["bytes_mib"] == 0.25
    report = json.loads(out.read_text())
    assert report["command"] == ("equarx-ref kernels --compile v5e:2x4,v6e:2x4 --only pallas "
                                 f"codec --read-back --bytes 0.25 --jobs 2 --json {out}")
    assert report["topologies"] == ["v5e:2x4", "v6e:2x4"]


@pytest.mark.parametrize("argv, words", [
    (["--compile", "v5e"], "expected TPU slices like v5e:2x4"),
    (["--compile", ","], "expected TPU slices like v5e:2x4"),
    (["--compile", "v5e:2x4", "--jobs", "0"], "expected an integer >= 1"),
    (["--compile", "v5e:2x4", "--only", "hop"], "invalid choice: 'hop'"),  # a family gone
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
    monkeypatch.setattr(_kernel_checks(), "report", lambda **k: pytest.fail("the work started"))
    assert cli.main(["kernels", *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "go with --compile TOPOLOGY" in err[0], err


@pytest.mark.parametrize("entry", [tpu_matrix.compile_matrix, tpu_matrix.run])
def test_compile_matrix_refuses_an_unknown_family(entry, monkeypatch):
    """Named as a typo before libtpu is looked for (or a topology described)."""
    def no_libtpu(*_):
        pytest.fail("libtpu was looked for before the families were checked")
    monkeypatch.setattr(tpu_matrix, "prepare_environment", no_libtpu)
    monkeypatch.setattr(tpu_matrix, "tpu_devices", no_libtpu)
    assert "hop" not in tpu_matrix.FAMILIES
    with pytest.raises(ValueError, match=r"unknown compile families \['hop'\]"):
        entry(("v5e:2x4",), families=("pallas", "hop"))
    with pytest.raises(TypeError, match="families must be a tuple"):
        entry(("v5e:2x4",), families="pallas")


def test_single_chip_tpu_runs_the_ring_in_interpret_mode(monkeypatch):
    """Free Colab: the default backend is one TPU chip and the ring runs on simulated CPU
    devices. The kernel must then interpret (Mosaic compiles for TPU devices only), chosen by
    the mesh's platform, and `check` must take the CPU devices rather than refuse."""
    real = jax.devices
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    monkeypatch.setattr(jax, "devices", lambda backend=None: real(backend) if backend
                        else real()[:1])
    assert kernels.on_tpu() and len(jax.devices()) == 1  # default backend on purpose
    result = _kernel_checks().check(2, fmt=eq.Format.int8(), n=64, num_chunks=1)
    assert result.bitwise and result.races == 0, result
    x = np.array(jax.random.normal(jax.random.key(5), (2, 64)))
    got, want, log = _both(x, fmt=eq.Format.int8(), algorithm="ring", num_chunks=1)
    assert log.count == 0 and np.array_equal(_bits(got), _bits(want)), _explain(got, want)


@pytest.mark.parametrize("name", ["int8", "mxfp4"])
@pytest.mark.slow
def test_mosaic_codec_reads_rows_where_they_lie(name):
    """`first_row` (traced, one compile for every value): encode and hop read their rows out
    of a larger array, from row i a (`(i, a)`) or i a + o (`(i, a, o)`); `order`: decode reads
    gathered messages in result order; each the same bytes and values as the slice, or the
    permuted messages, handed over whole (interpret mode)."""
    fmt = eq.Format.parse(name)
    k1, k2 = jax.random.split(jax.random.key(7))
    source = (jax.random.normal(k1, (4 * 128, 128)) * jnp.logspace(-3, 3, 512)[:, None]
              ).astype(jnp.bfloat16)  # 4 chunks of 128 rows
    message = encode(jax.random.normal(k2, (128 * 128,)), fmt)
    at = jax.jit(lambda s, w, i: (
        codec.encode(s, fmt, rows=128, first_row=(i, 128), interpret=True),
        codec.hop(w, s, fmt, first_row=(i, 128), interpret=True),
        codec.hop(w, s, fmt, first_row=(i // 2, 256, 128), interpret=True)))  # odd i: i a + o
    for i in (0, 1, 3):
        got_encode, got_hop, got_odd = at(source, message, jnp.int32(i))
        rows = source[i * 128:(i + 1) * 128]
        _same(got_encode, encode(rows.reshape(-1), fmt), f"encode at chunk {i}")
        _same(got_hop, _xla_hop(message, rows, fmt), f"hop at chunk {i}")
        if i % 2:
            _same(got_odd, got_hop, f"hop at ({i // 2}, 256, 128)")
    assert at._cache_size() == 1
    stack = jax.tree.map(lambda *a: jnp.stack(a), *[
        encode(source[c * 128:(c + 1) * 128].reshape(-1), fmt) for c in range(4)])
    order = (2, 0, 3, 1)
    want = decode(jax.tree.map(lambda a: a[np.array(order)], stack), fmt, 128 * 128)
    got = codec.decode(stack, fmt, order=order, interpret=True)
    assert np.array_equal(_bits(got), _bits(want.reshape(512, 128)))


def test_mosaic_codec_takes_first_row_as_an_index():
    """`encode`'s and `hop`'s docstrings: `first_row` is "an index, traced or not, or
    `(i, a[, o])` for row i a + o": the index alone (row i) reads there too."""
    fmt = eq.Format.int8()
    source = jax.random.normal(jax.random.key(10), (64, 128))
    got = codec.encode(source, fmt, rows=16, first_row=jnp.int32(32), interpret=True)
    _same(got, encode(source[32:48].reshape(-1), fmt), "encode from row 32")


@pytest.mark.slow
def test_mosaic_codec_steps_in_place_match_the_cut_ones():
    """`MosaicCodec.encode_at`, `hop_at`, `decode_in_order` and `decode_into` with the kernels
    (interpret mode): the messages and values of the steps they stand for, on a slice cut out
    first (and for a pipelined piece, its window of rows), or joined after; and the XLA
    codec's `decode_in_order` (a transpose, or a gather) is `decode` of the permuted
    messages. The steps they stand for are taken of the XLA codec (jit): the kernels' own
    whole-message encode, decode and hop are bitwise those (test_mosaic_codec_tiles_the_message,
    test_mosaic_hop_is_bitwise_the_xla_hop, and the spec's bytes in test_conformance.py), so
    each in-place kernel program is compiled here, and no other."""
    fmt = eq.Format.int8()
    r = 16  # rows a chunk (one short tile): m = 2048 values
    m = r * 128
    source = jax.random.normal(jax.random.key(8), (4, r, 128)).astype(jnp.bfloat16)
    kernel = MosaicCodec(fmt, jnp.bfloat16, interpret=True)

    def cut_encode(rows):  # the XLA codec's encode of bf16 rows [chunks, m]
        return encode(rows.astype(jnp.float32), fmt)

    start = jnp.int32(2)
    cut = source[2:3].reshape(1, m)
    message = kernel.encode_at(source, start, 1)
    _same(message, cut_encode(cut), "encode_at, the XLA codec's encode of the cut")
    cut_hop = _xla_hop(message, cut, fmt)
    _same(kernel.hop_at(message, source, start, 1), cut_hop, "hop_at, the XLA hop of the cut")
    # two hops written into one stack of two messages (a bidirectional ring's gather), in
    # place: the two messages joined
    other = cut_encode(source[0:1].reshape(1, m))
    both = kernel.hop_at(other, source, jnp.int32(3), 1, into=(2, 1))
    both = kernel.hop_at(message, source, start, 1, into=(both, 0))
    _same(both, jax.tree.map(lambda *a: jnp.concatenate(a), cut_hop,
                             _xla_hop(other, source[3:4].reshape(1, m), fmt)), "hop_at into")
    with pytest.raises(ValueError, match="into lays 1 chunks from chunk 1: past its 1"):
        kernel.hop_at(message, source, start, 1, into=(1, 1))
    # a pipelined piece: chunks of two pieces of r rows, the second's rows read in place
    pieces = jax.random.normal(jax.random.key(9), (4, 2 * r, 128)).astype(jnp.bfloat16)
    window = (r, r)
    cut = pieces[2:3, r:].reshape(1, m)
    message = kernel.encode_at(pieces, start, 1, window)
    _same(message, cut_encode(cut), "encode_at a window")
    _same(kernel.hop_at(message, pieces, start, 1, window), _xla_hop(message, cut, fmt),
          "hop_at a window")
    # and back: each piece's messages decoded over its rows of one result, in place
    halves = [(0, r), window]
    assert all(kernel.places(pieces.shape, w) for w in halves)
    # a window off whole tiles of rows is not read in place: the executor cuts it out
    assert not kernel.places(pieces.shape, (8, r))
    with pytest.raises(ValueError, match="cannot code 1 chunk"):
        kernel.encode_at(pieces, start, 1, (8, r))
    sent = [cut_encode(pieces[:, a:a + n].reshape(4, m)) for a, n in halves]
    out = jax.ShapeDtypeStruct(pieces.shape, jnp.bfloat16)
    for got, w, order in zip(sent, halves, (None, (1, 3, 0, 2)), strict=True):
        if order is not None:
            got = jax.tree.map(lambda a, o=order: a[np.argsort(o)], got)
        out = kernel.decode_into(got, out, w, jnp.bfloat16, order)
    want = jnp.concatenate([decode(got, fmt, m).astype(jnp.bfloat16).reshape(4, -1, 128)
                            for got in sent], axis=1)
    assert out.dtype == jnp.bfloat16 and np.array_equal(_bits(out), _bits(want))
    gathered = cut_encode(source.reshape(4, m))
    order = (1, 3, 0, 2)
    want = decode(jax.tree.map(lambda a: a[np.array(order)], gathered), fmt, m)
    assert np.array_equal(_bits(kernel.decode_in_order(gathered, m, None, order)), _bits(want))
    xla = Codec(fmt, jnp.bfloat16)
    for order in ((0, 2, 1, 3), (3, 1, 2, 0)):  # a transpose of [2, 2], and a gather
        in_order = jax.jit(lambda w, o=order: xla.decode_in_order(w, m, None, o))
        assert np.array_equal(
            _bits(in_order(gathered)),
            _bits(decode(jax.tree.map(lambda a, o=order: a[np.array(o)], gathered), fmt, m)))
