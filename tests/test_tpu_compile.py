"""The TPU program read back: wire bytes, overlap and bytes accessed from libtpu's compile.

The tests that compile need libtpu (`pip install "jax[tpu]==<jax>"`); the TPU compile tier
(tests/tpu_compile.sh) runs them with EQUARX_REQUIRE_LIBTPU=1, where a missing libtpu fails.
Elsewhere they skip, saying why. The HLO reader itself is tested on a written program."""

import json
import os
import pathlib
import re

import jax
import jax.numpy as jnp
import pytest

import equarx_ref as eq
from equarx_ref import data
from equarx_ref.models.hlo import collective_overlap
from equarx_ref.models.hlo_memory import kernel_io, memory_traffic
from equarx_ref.runs import tpu_compile, tpu_matrix, tpu_readback

DATA = pathlib.Path(__file__).resolve().parents[1] / "docs" / "data"

needs_libtpu = pytest.mark.skipif(
    tpu_compile.libtpu_version() is None and os.environ.get("EQUARX_REQUIRE_LIBTPU") != "1",
    reason="libtpu is not installed (the TPU compile tier, tests/tpu_compile.sh, runs these)")

# A scheduled program as XLA:TPU prints it, cut down: two sends in flight at once, an encode
# of the second message scheduled while the first travels, a decode after its done.
_HLO = """HloModule jit_f, is_scheduled=true

%fused_computation (p0: f32[8]) -> u8[8] {
  %p0 = f32[8]{0} parameter(0)
  ROOT %c = u8[8]{0} convert(%p0)
}

ENTRY %main (param.1: f32[16]) -> f32[8] {
  %param.1 = f32[16]{0} parameter(0)
  %slice.0 = f32[8]{0} slice(%param.1), slice={[0:8]}
  %encode.0 = u8[8]{0:T(1024)} fusion(%slice.0), kind=kLoop, calls=%fused_computation
  %collective-permute-start = (u8[8]{0}, u8[8]{0}, u32[]{:S(2)}, u32[]{:S(2)}) """ \
    """collective-permute-start(%encode.0), channel_id=1, source_target_pairs={{0,1},{1,0}}
  %slice.1 = f32[8]{0} slice(%param.1), slice={[8:16]}
  %encode.1 = u8[8]{0:T(1024)} fusion(%slice.1), kind=kLoop, calls=%fused_computation
  %collective-permute-start.1 = (u8[8]{0}, u8[8]{0}, u32[]{:S(2)}, u32[]{:S(2)}) """ \
    """collective-permute-start(%encode.1), channel_id=2, source_target_pairs={{0,1},{1,0}}
  %unrelated = f32[8]{0} fusion(%slice.0), kind=kLoop, calls=%fused_computation
  %collective-permute-done = u8[8]{0} collective-permute-done(%collective-permute-start)
  %collective-permute-done.1 = u8[8]{0} collective-permute-done(%collective-permute-start.1)
  ROOT %decode = f32[8]{0} fusion(%collective-permute-done), kind=kLoop, calls=%fused_computation
}
"""


def test_collective_overlap_reads_the_schedule():
    first, second = collective_overlap(_HLO)
    assert (first.start, first.done, first.nbytes) == ("collective-permute-start",
                                                       "collective-permute-done", 8)
    assert first.between == ("encode.1", "unrelated") and first.feeding == ("encode.1",)
    assert first.in_flight == 1 and second.in_flight == 2
    assert second.between == ("unrelated",) and second.feeding == ()
    assert collective_overlap(_HLO.replace("-start", "").replace("-done", "")) == []


def _wire_total(compiled, p):
    return sum(eq.hlo_wire_bytes(compiled.as_text(), p).values())


def _compile_report():
    """The compile tier's report of the matrix, when the tier names it (tests/tpu_compile.sh:
    `equarx-ref kernels --compile ... --json PATH`, then EQUARX_TPU_COMPILE_JSON=PATH), so a
    program the matrix compiled is read from it, not compiled again; None elsewhere. A report
    of other code, jax or libtpu than this process's is refused, never read."""
    path = os.environ.get("EQUARX_TPU_COMPILE_JSON")
    if not path:
        return None
    report = json.loads(pathlib.Path(path).read_text())
    made = (report.get("source_digest"), report.get("jax"), report.get("libtpu"))
    here = (tpu_compile.source_digest(), jax.__version__, tpu_compile.libtpu_version())
    assert made == here, f"{path} was made by (code, jax, libtpu) {made}, this is {here}"
    return report


@needs_libtpu
@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring", "two_shot", "one_shot"])
def test_tpu_program_sends_wire_bytes(algorithm):
    """XLA:TPU's own program sends exactly what `eq.wire_bytes` counts, every format. In the
    compile tier the programs are the matrix's (the XLA path's bf16 cases on v5e), read from
    its report; elsewhere they are compiled here."""
    n, p = 4096 + 96, 8
    names = (None, "int8", "int4", "mxfp8", "fp8_e4m3")
    report = _compile_report()
    if report is None:
        sent = {}
        for name in names:
            fmt = None if name is None else eq.Format.parse(name)
            sent[name] = _wire_total(tpu_compile.compile_all_reduce(
                "v5e:2x4", n=n, p=p, fmt=fmt, algorithm=algorithm), p)
    else:
        want = {"n": n, "p": p, "dtype": "bfloat16", "algorithm": algorithm}
        rows = [r["read"] for r in report["results"] if r["topology"] == "v5e:2x4"
                and r["family"] == "xla" and r["ok"] and r["read"]["all_reduce"] == {
                    **want, "format": r["read"]["all_reduce"]["format"]}]
        sent = {r["all_reduce"]["format"]: r["wire_bytes_hlo"] for r in rows}
        assert set(names) <= set(sent), (algorithm, sorted(map(str, sent)))
    for name in names:
        fmt = None if name is None else eq.Format.parse(name)
        if (algorithm, name) == ("one_shot", None) and sent[name] == 4 * (p - 1) * 4224:
            # A defect, open: the unquantized one-shot's raw message (u16 bits of bf16) is
            # all-gathered by XLA:TPU as 32-bit lanes padded to 128 values: twice the bytes
            # `eq.wire_bytes` counts. Once the program sends what is counted, the assert holds it.
            pytest.xfail("XLA:TPU all-gathers the raw u16 message of an unquantized one_shot "
                         "as 32-bit lanes: 2x wire_bytes")
        assert sent[name] == eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm,
                                           dtype="bfloat16"), (algorithm, name)


@needs_libtpu
def test_tpu_overlaps_pieces_only_when_pipelined():
    """On v5e: at num_chunks=1 a hop's encode needs the previous hop's message, so nothing that
    feeds a send runs while one is in flight. At num_chunks=4 XLA:TPU schedules the encoding of
    other pieces inside every transfer but the last ones, several messages in flight at once.
    A message is two operands (payload and scales), each its own transfer: at num_chunks=1 the
    two of one message may be in flight together, and the only op that runs beside one is the
    other operand's own."""
    n, p, operands = 1 << 16, 8, 2
    one = collective_overlap(tpu_compile.compile_all_reduce(
        "v5e:2x4", n=n, p=p, fmt=eq.Format.int8()).as_text())
    four = collective_overlap(tpu_compile.compile_all_reduce(
        "v5e:2x4", n=n, p=p, fmt=eq.Format.int8(), num_chunks=4).as_text())
    assert len(one) == operands * (p - 1) and len(four) == operands * 4 * (p - 1)
    assert max(len(q.feeding) for q in one) <= 1 and max(q.in_flight for q in one) <= operands
    assert sum(len(q.feeding) > 1 for q in four) >= 3 * (p - 1)
    assert max(q.in_flight for q in four) > operands


@needs_libtpu
@pytest.mark.parametrize("topology", ["v5e:2x4", "v6e:2x4"])
def test_mosaic_pipelines_its_kernels_inside_transfers(topology):
    """Issue 29 on the kernels' path: at num_chunks=2 the int8 ring on the Mosaic codec
    (`impl="mosaic"`) keeps more than one message in flight (a message is two transfers,
    payload and scales), with a kernel of another piece scheduled inside the transfers of the
    middle hops; at num_chunks=1 nothing overlaps. `collective_overlap` lists fusions, and the
    kernels are custom calls: they are counted from the schedule here (1/4 MiB)."""
    from equarx_ref.models import hlo

    n, p, operands = 1 << 16, 8, 2  # a message: payload and scales, a transfer each
    for k, overlapped in ((1, 0), (2, p - 1)):
        text = tpu_compile.compile_all_reduce(topology, n=n, p=p, fmt=eq.Format.int8(),
                                              num_chunks=k, impl="mosaic").as_text()
        pairs, schedule = collective_overlap(text), hlo._entry(text)
        at = {name: i for i, (name, _, _) in enumerate(schedule)}
        kernels = [sum(op == "custom-call" for _, op, _ in schedule[at[q.start] + 1:at[q.done]])
                   for q in pairs]
        assert len(pairs) == operands * k * (p - 1), (k, len(pairs))
        flying = max(q.in_flight for q in pairs)  # k=1: one message; k=2: more than one
        assert flying <= operands if k == 1 else flying > operands, (k, pairs)
        assert sum(c > 0 for c in kernels) >= overlapped and (k > 1 or not any(kernels)), \
            (k, kernels)


@needs_libtpu
@pytest.mark.parametrize("topology", ["v5e:2x4", "v6e:2x4"])
def test_overlap_as_recorded(topology):
    """The overlap chapter 05 shows is this compiler's: the int8 ring at num_chunks=4, compiled
    afresh, has the stored encodings inside each transfer (v5e: nearly all; v6e with libtpu
    0.0.42.1: 4 transfers of 28), for the libtpu the record names."""
    old = next(c for c in _stored()["read_back"] if c["topology"] == topology
               and (c["algorithm"], c["format"], c["num_chunks"], c["impl"])
               == ("ring", "int8", 4, "xla"))
    if tpu_compile.libtpu_version() != _stored()["libtpu"]:
        pytest.skip(f"the record is of libtpu {_stored()['libtpu']}, this is "
                    f"{tpu_compile.libtpu_version()}: its schedule may differ")
    pairs = collective_overlap(tpu_compile.compile_all_reduce(
        topology, n=old["n"], p=old["p"], fmt=eq.Format.int8(), num_chunks=4).as_text())
    assert [len(q.feeding) for q in pairs] == old["feeding_other_sends"]
    assert max(q.in_flight for q in pairs) == old["max_in_flight"]


_TRAFFIC = """HloModule jit_f, is_scheduled=true

%body (p: (u32[], f32[1024])) -> (u32[], f32[1024]) {
  %p = (u32[], f32[1024]{0:T(1024)}) parameter(0)
  %x = f32[1024]{0:T(1024)} get-tuple-element(%p), index=1
  %y = f32[1024]{0:T(1024)S(1)} fusion(%x), kind=kLoop, calls=%f
  ROOT %t = (u32[], f32[1024]{0:T(1024)S(1)}) tuple(%i, %y)
}

ENTRY %main (param.1: u8[1024,34]) -> u8[34816] {
  %param.1 = u8[1024,34]{1,0:T(8,128)(4,1)} parameter(0)
  %copy.1 = u8[1024,34]{0,1:T(8,128)(4,1)S(1)} copy(%param.1)
  %fusion.1 = u8[1024,34]{0,1:T(8,128)(4,1)S(1)} fusion(%copy.1), kind=kLoop, calls=%g
  %bitcast.1 = u8[34816]{0} bitcast(%fusion.1)
  ROOT %reshape.1 = u8[34816]{0:T(1024)} reshape(%fusion.1)
  %while.1 = (u32[], f32[1024]) while(%t0), condition=%cond, body=%body
}
"""


def test_memory_traffic_counts_tiles_and_memories():
    """Bytes per op in the tiled layouts XLA:TPU prints: a row of 34 bytes takes a 128-byte
    tile row; ops on S(1) arrays only stay in VMEM; bitcasts are free; a loop body counts."""
    t = memory_traffic(_TRAFFIC)
    row_major, col_major = 1024 * 128, 1024 * 40  # {1,0}: 34 -> 128 lanes; {0,1}: 34 -> 40 rows
    assert t.by_kind["copy"] == row_major + col_major
    assert t.by_kind["fusion"] == 2 * col_major + 4096 + 4096
    assert t.by_kind["reshape"] == col_major + 34816
    assert t.vmem == 2 * col_major  # the fusion between two VMEM arrays only
    assert t.total == sum(t.by_kind.values()) and t.hbm == t.total - t.vmem
    assert t.logical == 6 * 34816 + 2 * 4096 and t.padding == t.total / t.logical
    with pytest.raises(ValueError, match="ENTRY"):
        memory_traffic("HloModule nothing")


_KERNEL = """HloModule k
ENTRY %main (x.1: bf16[8,32768]) -> u8[8,34816] {
  %x.1 = bf16[8,32768]{1,0:T(8,128)(2,1)} parameter(0)
  %other = u8[8,34816]{1,0:T(8,128)(4,1)} custom-call(%x.1), custom_call_target="Sharding"
  ROOT %k.1 = u8[8,34816]{1,0:T(8,128)(4,1)} custom-call(%x.1), \
custom_call_target="tpu_custom_call", backend_config={}
}
"""


def test_kernel_io_counts_a_kernels_operands_and_results_once():
    """A Pallas kernel is a custom call XLA counts as free: `kernel_io` counts its operands and
    results in their tiled layouts (bf16 [8, 32768] in, u8 [8, 34816] out), other custom calls
    not at all; a kernel that declares its bytes (`pl.CostEstimate`) at what it declares."""
    assert memory_traffic(_KERNEL).total == 0
    assert kernel_io(_KERNEL) == 2 * 8 * 32768 + 8 * 34816
    declared = _KERNEL.replace("backend_config={}", 'backend_config={"custom_call_config":{'
                               '"cost_estimate":{"flops":"0","transcendentals":"0",'
                               '"bytes_accessed":"12345","remote_bytes_transferred":"0"}}}')
    assert kernel_io(declared) == 12345
    with pytest.raises(ValueError, match="ENTRY"):
        kernel_io("HloModule nothing")


@needs_libtpu
@pytest.mark.parametrize("name", ["int8", "int4", "mxfp4", "int8/f32"])
def test_the_codec_kernels_declare_what_their_grids_move(name):
    """Every Mosaic codec kernel declares its cost as the fewest bytes it must move (each
    operand read once, each result written once: `tpu_schedule.codec_program`, counted from
    the format), no more and no less. Lowered for v5e (Mosaic asks libtpu for the chip)."""
    from equarx_ref.runs.tpu_schedule import CODEC_KERNELS, codec_program

    fmt = eq.Format.parse(name)
    for kernel in CODEC_KERNELS:
        fn, args, fewest = codec_program(kernel, fmt, 8 * 128 * 64)
        lowered = tpu_compile.compile_on_chip("v5e:2x4", fn, args, lowered=True)
        got = [int(v) for v in re.findall(r'bytes_accessed(?:\\22|")?:"?(\d+)',
                                          lowered.as_text())]
        assert got == [fewest], (kernel, got, fewest)


def test_the_compile_tier_compiles_every_kernel_format():
    """`equarx-ref check` runs the Mosaic codec on every format of its list the kernels code
    (`kernels.tiles.supports`): the formats the compile tier proves (family "codec")."""
    from equarx_ref.kernels import tiles
    from equarx_ref.runs import check, tpu_matrix

    checked = {name for name in check.CHECK_FORMATS if tiles.supports(eq.Format.parse(name))}
    assert checked == set(tpu_matrix.CODEC_FORMATS)


def _stored():
    return data.load("tpu")  # the record the course reads, shipped with the package


def _case(row) -> tuple:
    """A stored read-back row as the `tpu_readback.read_back` case that made it."""
    return (row["algorithm"], None if row["format"] == "bfloat16" else row["format"],
            row["num_chunks"], row["impl"])


def test_stored_record_is_whole():
    """The stored compile record covers both topologies, every case compiled, and its wire
    bytes read from XLA:TPU's programs equal `eq.wire_bytes` in every case."""
    stored = _stored()
    assert stored["topologies"] == ["v5e:2x4", "v6e:2x4"]
    assert all(r["ok"] for r in stored["results"]), [r for r in stored["results"] if not r["ok"]]
    per = {t: sum(r["topology"] == t for r in stored["results"]) for t in stored["topologies"]}
    assert per == {t: len(tpu_matrix.matrix_cases(t)) for t in stored["topologies"]}, per
    for r in stored["read_back"]:
        assert r["wire_bytes_hlo"] == r["wire_bytes"], r


def _at_scale() -> list[dict]:
    """The AllReduces read back at 16 MiB per chip on v5e: the schedule record's."""
    return data.load("tpu-schedule")["schedule"]["all_reduce"]


def test_the_kernels_bytes_are_the_models_at_scale_as_recorded():
    """Issue 29's byte target at 16 MiB per chip on v5e, in the stored read-back: every
    AllReduce on the kernels, one message at a time or pipelined, is re-priced with all of
    XLA:TPU's bytes within 25% of the model's time (bytes only: its cycles are the schedule
    tests', tests/test_tpu_schedule.py)."""
    rows = [r for r in _at_scale() if r["impl"] == "mosaic"]
    assert {r["num_chunks"] for r in rows} == {1, 2}
    for r in rows:
        t = r["seconds"]
        assert t["all"] / t["model"] <= 1.25, r


def test_kernels_move_the_models_passes_as_recorded():
    """Every AllReduce on the kernels, in the stored read-backs (both chips at 256 Ki values per
    chip, v5e at 16 MiB), declares through its kernels exactly the HBM bytes the time model
    prices (`tpu_readback.model_hbm_bytes`, today's model): the model's passes are the spec's,
    and the kernels make each once. The rest of XLA:TPU's count is the collectives' buffers.
    (Declared bytes: each kernel's `pl.CostEstimate`, held to its grid by
    `test_the_codec_kernels_declare_what_their_grids_move`.)"""
    rows = [r for r in (*_stored()["read_back"], *_at_scale()) if r["impl"] == "mosaic"]
    assert len(rows) == 2 * 12 + sum(c[3:] == ("mosaic",) for c in tpu_readback.AT_SCALE)
    for r in rows:
        model = tpu_readback.model_hbm_bytes(
            r["n"], r["p"], fmt=eq.Format.parse(r["format"]), algorithm=r["algorithm"],
            dtype=r["dtype"], num_chunks=r["num_chunks"])
        assert r["traffic"]["kernels"] == r["model_hbm_bytes"] == model, r


def test_stored_other_chips():
    """What kernels/ring.py says of v5p and v4 is the stored record's: on v5p every Pallas
    kernel compiled; on v4 none did, each refused with Mosaic's unsupported shape cast."""
    v5p, v4 = json.loads((DATA / "tpu-v5p-v4.json").read_text())["records"]
    assert v5p["topologies"] == ["v5p:2x2x2"] and v4["topologies"] == ["v4:2x2x2"]
    assert len(v5p["results"]) == len(v4["results"]) >= 30
    assert {r["family"] for r in v5p["results"]} == {"pallas", "hop"}
    assert all(r["ok"] for r in v5p["results"])
    assert not any(r["ok"] for r in v4["results"])
    assert all("unsupported shape cast" in r["error"] for r in v4["results"])


def test_stored_bytes_are_explained():
    """`memory_traffic` accounts for XLA:TPU's own bytes accessed in every stored program
    (within 20%: 17% over at worst, on one_shot; within 6% on the rings but for the bf16 one),
    so the breakdown the course shows is of the count it quotes."""
    for r in _stored()["read_back"]:
        assert abs(r["traffic"]["tally"] / r["bytes_accessed"] - 1) < 0.20, r


@needs_libtpu
@pytest.mark.parametrize("topology", ["v5e:2x4", "v6e:2x4"])
def test_bytes_accessed_as_recorded(topology):
    """The ratio holds: XLA:TPU's bytes accessed per AllReduce, over the model's HBM passes, is
    what the stored record (and so the course) says, within 5%, for psum, the int8 ring and
    the int8 two-shot, and the int8 ring on the Mosaic codec's kernels: a change to either path
    that adds memory work fails here."""
    keys = {("psum", "bfloat16", 1, "xla"), ("ring", "int8", 1, "xla"),
            ("two_shot", "int8", 1, "xla"), ("ring", "int8", 1, "mosaic")}
    old = [c for c in _stored()["read_back"] if c["topology"] == topology
           and (c["algorithm"], c["format"], c["num_chunks"], c["impl"]) in keys]
    assert len(old) == 4
    fresh = tpu_readback.read_back(topology, n=old[0]["n"], p=old[0]["p"],
                                   cases=tuple(_case(c) for c in old))
    for was, new in zip(old, fresh, strict=True):
        assert new["wire_bytes_hlo"] == new["wire_bytes"] == was["wire_bytes"]
        assert abs(new["ratio_to_model"] / was["ratio_to_model"] - 1) < 0.05, (was, new)
        assert abs(new["traffic"]["tally"] / new["bytes_accessed"] - 1) < 0.20, new



def test_byte_ratio_table_reads_the_report():
    """`format_byte_ratios` on a written report: a row per topology x format, a column per
    program (codec) and per algorithm (AllReduce over psum), `x + 1` and each naive yardstick
    a line of its own, named, and psum over its own floor."""
    from equarx_ref.runs import tpu_bytes

    codec = [{"topology": "v5e:2x4", "program": "x + 1", "format": "bfloat16", "ratio": 1.0},
             *({"topology": "v5e:2x4", "program": p, "format": "int8", "ratio": r}
               for p, r in (("encode", 27.8), ("naive rows", 9.0), ("decode", 12.5),
                            ("hop", 38.6))),
             *({"topology": "v5e:2x4", "path": "pallas", "program": p, "format": "int8",
                "ratio": r} for p, r in (("encode", 1.0), ("decode", 1.1), ("hop", 1.2)))]
    ar = [{"topology": "v5e:2x4", "algorithm": "psum", "format": "bfloat16", "ratio": 1.0,
           "to_psum": 1.0},
          {"topology": "v5e:2x4", "algorithm": "ring", "format": "int8", "ratio": 53.7,
           "to_psum": 53.7},
          {"topology": "v5e:2x4", "path": "pallas", "algorithm": "ring", "format": "int8",
           "ratio": 6.8, "to_psum": 6.8}]
    text = tpu_bytes.format_byte_ratios({"mib": 0.25, "p": 8, "target": 2.0, "codec": codec,
                                         "all_reduce": ar})
    lines = text.splitlines()
    assert "0.25 MiB" in lines[0] and "target <= 2x" in lines[0]
    assert any(ln.split() == ["v5e:2x4", "int8", "xla", "27.8x", "12.5x", "38.6x"]
               for ln in lines)
    assert any(ln.split() == ["v5e:2x4", "int8", "pallas", "1.0x", "1.1x", "1.2x"]
               for ln in lines)
    assert any(ln.split() == ["v5e:2x4", "bfloat16", "xla", "1.0x", "(x", "+", "1)"]
               for ln in lines)
    assert any(ln.split() == ["v5e:2x4", "int8", "xla", "9.0x", "(naive", "rows)"]
               for ln in lines)
    assert any(ln.split() == ["v5e:2x4", "int8", "xla", "53.7x"] for ln in lines)
    assert any(ln.split() == ["v5e:2x4", "int8", "pallas", "6.8x"] for ln in lines)
    assert any(ln.split()[:3] == ["v5e:2x4", "psum", "1.00x"] for ln in lines)


@pytest.mark.slow
def test_naive_yardsticks_count_their_bytes_and_decode():
    """`tpu_bytes.naive_programs`, on CPU: each yardstick's fewest bytes are its input's and
    outputs' logical bytes, and it is a quantizer: the bf16 scale it writes times its codes is
    within half a scale of every value, a block's largest included (the scale it divides by is
    the one it writes), a zero block all zeros. A bad multiple is one clear line."""
    import math

    import numpy as np

    from equarx_ref.runs.tpu_bytes import NAIVE_ROW, naive_programs

    n = 4 * NAIVE_ROW
    rng = np.random.default_rng(29)
    magnitude = 2.0 ** rng.integers(-30, 30, size=(n // 32, 1))
    values = rng.standard_normal((n // 32, 32)) * magnitude
    values[5] = 0.0
    x = jnp.asarray(values.reshape(n), jnp.bfloat16)
    progs = naive_programs(n)
    assert [p.name for p in progs] == ["naive", "naive rows"]
    for prog in progs:
        (dtype, shape), = prog.args
        out = jax.eval_shape(prog.fn, jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)))
        moved = math.prod(shape) * jnp.dtype(dtype).itemsize + sum(
            o.size * o.dtype.itemsize for o in jax.tree.leaves(out))
        assert moved == prog.fewest_bytes == 3 * n + n // 16, prog.name
        codes, scale = prog.fn(x.reshape(shape))
        codes = np.asarray(codes, np.float64).reshape(-1, 32)
        scale = np.asarray(scale.astype(jnp.float32), np.float64).reshape(-1, 1)
        exact = np.asarray(x.astype(jnp.float32), np.float64).reshape(-1, 32)
        err = np.abs(codes * scale - exact)
        assert (err <= 0.5 * scale).all(), prog.name
        assert not codes[5].any() and scale[5, 0] == 0
    with pytest.raises(ValueError, match=f"expected a multiple of {NAIVE_ROW}"):
        naive_programs(n + 32)


def test_layout_yardsticks_write_the_same_bytes_in_two_layouts():
    """`tpu_schedule.naive_rows34` and `naive_two_operands` in TPU interpret mode on CPU: the
    same naive int8 blocks, once as the old wire's interleaved rows (each block's 32 codes,
    then its bf16 scale's two bytes) and once as the wire's message (the spec's
    `from_message` reads it back into the same blocks); every value within half a scale of
    its code times the scale written, a zero block all zeros."""
    import numpy as np

    from equarx_ref import spec
    from equarx_ref.runs.tpu_schedule import LAYOUT_STEP, naive_rows34, naive_two_operands

    n = LAYOUT_STEP
    rng = np.random.default_rng(50)
    values = rng.standard_normal((n // 32, 32)) * 2.0 ** rng.integers(-30, 30, (n // 32, 1))
    values[7] = 0.0
    x = jnp.asarray(values.reshape(n), jnp.bfloat16)
    rows = np.asarray(naive_rows34(x.reshape(-1, 4096), interpret=True)).reshape(-1, 34)
    payload, scales = map(np.asarray, naive_two_operands(x.reshape(-1, 128), interpret=True))
    blocks, stored = spec.from_message(payload, scales, eq.Format("int8"))
    assert np.array_equal(rows[:, :32], blocks)
    assert np.array_equal(rows[:, 32:].copy().view("<u2")[:, 0], stored.view(np.uint16))
    scale = stored.astype(np.float64)[:, None]
    err = np.abs(blocks.view(np.int8) * scale - np.asarray(x, np.float64).reshape(-1, 32))
    assert (err <= 0.5 * scale).all()
    assert not blocks[7].any() and scale[7, 0] == 0


#: Today's XLA path on v5e: XLA:TPU's bytes accessed over the fewest bytes (codec programs,
#: `tpu_bytes.codec_bytes`) and an AllReduce's over psum's (`tpu_bytes.all_reduce_bytes`), at
#: 1/4 MiB of bf16 with libtpu 0.0.42.1, in the order of TODAY_COLUMNS; `x + 1` (1.0x) and psum
#: (1.0x of 4n) are the floor's own checks. v6e's were the same to 0.3% (XLA:TPU tiles both
#: chips' arrays alike), so the bound is held on one chip; the compile matrix compiles the XLA
#: path for both. git log has how these came to be.
TODAY = {
    "int8": (46.3, 32.5, 59.5, 87.2, 95.2, 96.1),
    "int4": (66.3, 19.9, 80.9, 74.8, 76.5, 77.6),
    "fp8_e4m3": (46.6, 32.5, 59.7, 87.4, 95.6, 85.4),
    "mxfp8": (40.3, 51.6, 69.5, 103.6, 111.4, 111.7),
    "mxfp4": (59.9, 22.1, 77.5, 70.0, 72.0, 71.7),
}
TODAY_COLUMNS = ("encode", "decode", "hop", "ring", "bidir_ring", "two_shot")


@needs_libtpu
def test_codec_bytes_accessed_held_to_today():
    """The XLA path's bytes accessed on a TPU, held: `x + 1` costs its fewest bytes (<= 1.1x),
    psum its 4n; no XLA-path ratio grows more than 10% over today's (regression bounds, not
    goals: they miss the target, printed beside each figure); and the naive yardsticks stay
    above twice the target (`tpu_bytes.naive_programs`). The Mosaic codec's kernels, the TPU
    path, are held by their cycles instead (`test_tpu_schedule.py`): their bytes accessed are
    what they declare."""
    from equarx_ref.runs import tpu_bytes

    report = tpu_bytes.byte_ratios("v5e:2x4", mib=0.25)
    print(tpu_bytes.format_byte_ratios(report))
    worse, met = [], []
    for r in report["codec"] + report["all_reduce"]:
        program = r.get("program") or r["algorithm"]
        ratio = r["ratio"] if "program" in r or program == "psum" else r["to_psum"]
        path = r.get("path", "xla")
        target = tpu_bytes.TARGET if "program" in r else tpu_bytes.ALL_REDUCE_TARGET
        met.append(f"{path} {program} {r['format']}: {ratio:.1f}x "
                   f"{'meets' if ratio <= target else 'misses'} the {target:g}x target")
        today = dict(zip(TODAY_COLUMNS, TODAY.get(r["format"], ()), strict=False))
        if program.startswith("naive"):
            # the yardsticks hold the module's claim: no XLA-op quantizer of 32-value blocks,
            # not even the naive one without exactness rules, comes near the target
            if not ratio > 2 * target:
                worse.append(f"{path} {program}: {ratio:.2f}x, within twice the target: the "
                             f"essays' claim that XLA ops cannot come near it is stale")
            continue
        bound = 1.1 * today.get(program, 1.0)
        if not ratio <= bound:
            worse.append(f"{path} {program} {r['format']}: {ratio:.2f}x > {bound:.2f}x")
    xla = {(r["program"], r["format"]) for r in report["codec"] if r["program"] in TODAY_COLUMNS}
    assert len(xla) == 3 * len(tpu_bytes.BENCH_FORMATS), xla
    ring = {(r["algorithm"], r["format"]) for r in report["all_reduce"] if r["format"] != "bfloat16"
            and r["algorithm"] != "psum"}
    assert len(ring) == 3 * len(tpu_bytes.BENCH_FORMATS), ring
    print("\n".join(met))
    assert {r["program"] for r in report["codec"] if r["program"].startswith("naive")} == {
        "naive", "naive rows"}
    plain = next(r for r in report["codec"] if r["program"] == "x + 1")
    psum = next(r for r in report["all_reduce"] if r["algorithm"] == "psum")
    assert plain["ratio"] <= 1.1 and psum["ratio"] <= 1.1, (plain, psum)
    assert not worse, ("v5e:2x4: the XLA path's bytes accessed grew past today's +10%, or a "
                       f"naive yardstick came within twice the target: {worse}")
