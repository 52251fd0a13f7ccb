"""The TPU program read back: wire bytes, overlap and bytes accessed from libtpu's compile.

The tests that compile need libtpu (`pip install "jax[tpu]==<jax>"`); the TPU compile tier
(tests/tpu_compile.sh) runs them with EQUARX_REQUIRE_LIBTPU=1, where a missing libtpu fails.
Elsewhere they skip, saying why. The HLO reader itself is tested on a written program."""

import json
import os
import pathlib

import pytest

import equarx_ref as eq
from equarx_ref.models.hlo import collective_overlap
from equarx_ref.runs import tpu_compile

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


@needs_libtpu
@pytest.mark.parametrize("algorithm", ["ring", "bidir_ring", "two_shot", "one_shot"])
def test_tpu_program_sends_wire_bytes(algorithm):
    """XLA:TPU's own program sends exactly what `eq.wire_bytes` counts, every format."""
    n, p = 4096 + 96, 8
    for name in (None, "int8", "int4", "mxfp8", "fp8_e4m3"):
        fmt = None if name is None else eq.Format.parse(name)
        compiled = tpu_compile.compile_all_reduce("v5e:2x4", n=n, p=p, fmt=fmt,
                                                  algorithm=algorithm)
        assert _wire_total(compiled, p) == eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm,
                                                         dtype="bfloat16"), (algorithm, name)


@needs_libtpu
def test_tpu_overlaps_pieces_only_when_pipelined():
    """At num_chunks=1 a hop's encode needs the previous hop's message: nothing that feeds a
    send runs while one is in flight. At num_chunks=4 XLA:TPU schedules the encoding of other
    pieces inside every transfer but the last ones, several messages in flight at once."""
    n, p = 1 << 16, 8
    one = collective_overlap(tpu_compile.compile_all_reduce(
        "v5e:2x4", n=n, p=p, fmt=eq.Format.int8()).as_text())
    four = collective_overlap(tpu_compile.compile_all_reduce(
        "v5e:2x4", n=n, p=p, fmt=eq.Format.int8(), num_chunks=4).as_text())
    assert len(one) == p - 1 and len(four) == 4 * (p - 1)
    assert all(not q.feeding for q in one) and max(q.in_flight for q in one) == 1
    assert sum(bool(q.feeding) for q in four) >= 3 * (p - 1)
    assert max(q.in_flight for q in four) >= 2


@needs_libtpu
@pytest.mark.parametrize("chip", ["v5e", "v6e"])
def test_bytes_accessed_as_recorded(chip):
    """XLA:TPU's bytes accessed for the int8 ring and psum match the stored record the docs
    show (docs/data/tpu-CHIP.json, within 5%), so the ratio the course quotes is this code's."""
    stored = json.loads((DATA / f"tpu-{chip}.json").read_text())
    topology = stored["topology"]
    cases = [c for c in stored["read_back"] if (c["algorithm"], c["format"], c["num_chunks"])
             in {("psum", "bfloat16", 1), ("ring", "int8", 1)}]
    assert len(cases) == 2
    fresh = tpu_compile.read_back(topology, n=cases[0]["n"], p=cases[0]["p"],
                                  cases=(("psum", None, 1), ("ring", "int8", 1)))
    for old, new in zip(cases, fresh, strict=True):
        assert new["wire_bytes_hlo"] == new["wire_bytes"] == old["wire_bytes"]
        assert abs(new["bytes_accessed"] / old["bytes_accessed"] - 1) < 0.05, (old, new)
