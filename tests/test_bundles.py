"""Reading libtpu's static schedule (models/bundles.py): loops and their trips, nested loops,
inlined calls, the matrix units' stalls, and a real listing of a Pallas kernel.

The real listing (tests/fixtures/bundles/pallas_x1_v5e) is what libtpu 0.0.42.1 wrote for a
Pallas `x + 1` on (512, 128) bf16 tiles, a grid of 4, compiled for v5e
(`runs/tpu_schedule.py`'s yardstick at 256 Ki values; the runtime's own prologue and
epilogue listings left out). No libtpu is needed to run these tests.
"""

import re
from pathlib import Path

import pytest

from equarx_ref.models import bundles

FIXTURE = Path(__file__).parent / "fixtures" / "bundles" / "pallas_x1_v5e"


def _listing(*lines: str) -> str:
    return "\n".join(f"  {hex(i) if i else '0'}{line}" for i, line in enumerate(lines))


def _loop(region: int, reg: int, trips_to: int, body: list[str], *, step: int = 1,
          start: int = 0, cond: str = "ge") -> list[str]:
    """A counted loop as libtpu lists it: start, phi (opening the region), body, the
    counter's step, the exit test, the branch back."""
    c0, phi, c1, p = f"%s{reg}_s0", f"%s{reg + 1}_s1", f"%s{reg + 2}_s2", f"%p{reg}_p0"
    return [f"   :  {{ {c0} = smov {start} }}",
            f" LB: > {{ {phi} = sphi {c0}, {c1} }} /* Start region {region} */",
            *body,
            f"   : > {{ {c1} = sadd.s32 {step}, {phi} }}",
            f"   : > {{ {p} = scmp.{cond}.s32.totalorder {c1}, {trips_to} /* loop exit test */ }}",
            f"   :  {{ %{reg + 9} = sbr.rel (!{p}) target = $region{region} }}"]


def test_a_counted_loop_multiplies_its_bundles():
    text = _listing("   :  { %1 = vnop }",
                    *_loop(5, 10, 10, ["   : > { %2 = vadd.f32 %v1, %v2 }"] * 3))
    got = bundles.parse_listing(text, "k")
    # bundles: 1 before, the start, then phi + 3 + step + test + branch = 7 in the loop
    assert got.bundles == 9
    assert got.loops == ((2, 8, 10),)
    assert got.cycles == 2 + 7 * 10 and got.body() == 7 and got.unknown == 0


@pytest.mark.parametrize(("start", "step", "cond", "bound", "trips"), [
    (0, 1, "ge", 10, 10), (0, 2, "ge", 9, 5), (0, 1, "gt", 10, 11), (3, 1, "ge", 10, 7),
    (10, -1, "le", 0, 10), (10, -3, "lt", 0, 4), (0, 1, "ge", 0, 1)])
def test_trip_counts_from_the_exit_test(start, step, cond, bound, trips):
    """After turn t the counter is start + t step; the loop leaves at the first t whose
    counter passes the test (and a loop runs at least once)."""
    text = _listing(*_loop(7, 20, bound, ["   : > { %2 = vnop }"], step=step, start=start,
                           cond=cond))
    (loop,) = bundles.parse_listing(text).loops
    assert loop[2] == trips


def test_nested_loops_multiply_and_unknown_bounds_count_once():
    inner = _loop(9, 30, 4, ["   : > { %2 = vnop }"])
    outer = _loop(8, 40, 3, inner)
    got = bundles.parse_listing(_listing(*outer))
    assert sorted(t for _, _, t in got.loops) == [3, 4]
    # the outer loop's own bundles: start (outside), phi, step, test, branch; the inner loop:
    # its start runs with every outer turn, then phi + 1 + step + test + branch per turn
    assert got.cycles == 1 + 3 * (4 + 1 + 5 * 4)
    # a bound the listing does not give (a register, not an immediate): counted once
    text = _listing(*_loop(9, 30, 4, ["   : > { %2 = vnop }"])).replace(
        "%s30_s0 = smov 0", "%s30_s0 = sld [smem:[#allocation3]]")
    got = bundles.parse_listing(text)
    assert got.loops[0][2] is None and got.unknown == 1 and got.cycles == got.bundles


def test_matrix_unit_rows_add_stall_cycles():
    """A bf16 multiply pushes 16 rows through its MXU, a row a cycle: a loop body of 5
    bundles with one multiply takes 16 cycles a turn, 11 more than its bundles."""
    body = ["   : > { %v5 = vmatmul.bf16.gmr.mxu0 %v1 }", "   : > { %2 = vnop }"]
    got = bundles.parse_listing(_listing(*_loop(5, 10, 8, body)))
    assert got.mxu_stall == (16 - 6) * 8  # phi + 2 + step + test + branch = 6 bundles
    # two units each take their own rows: no stall beyond the busier one
    two = ["   : > { %v5 = vmatmul.bf16.gmr.mxu0 %v1 ;; %v6 = vmatmul.f32.gmr.mxu1 %v2 }"]
    assert bundles.parse_listing(_listing(*two)).mxu_stall == 16 - 1


def test_calls_are_priced_at_their_multiplicity(tmp_path):
    kernel = _listing(*_loop(5, 10, 4, ["   : > { %2 = vnop }"]))
    top = _listing("   :  { %1 = vnop }",
                   *_loop(6, 20, 3, ["   : > { %30 = inlined_call %s1_s0 /* %k.1 = "
                                     "custom-call(%p.1) */ }"]))
    (tmp_path / "1-TLP-01-final_bundles.txt").write_text(top)
    (tmp_path / "1-k.1-01-final_bundles.txt").write_text(kernel)
    (tmp_path / "1-k.1-00-schedule-analysis_final_bundles.txt").write_text("ignored")
    schedule = bundles.read_dump(tmp_path)
    k = schedule.listings["k.1"].cycles
    assert k == 1 + 5 * 4
    assert schedule.called() == {"k.1": 3 * k}
    assert schedule.cycles() == schedule.listings["TLP"].cycles + 3 * k
    with pytest.raises(ValueError, match="no top-level program"):
        bundles.read_dump(tmp_path / "nowhere")


def test_a_real_pallas_kernel_listing():
    """libtpu's listing of a Pallas `x + 1` on a grid of 4: one loop, the grid's 4 steps and
    the software pipeline's 2 extra turns, and the top-level program calls it once."""
    schedule = bundles.read_dump(FIXTURE)
    kernel = schedule.listings["pallas_x1.1"]
    ((first, last, trips),) = kernel.loops
    assert trips == 4 + 2
    assert kernel.body() == last - first + 1
    assert kernel.cycles == kernel.bundles + (trips - 1) * kernel.body()
    assert kernel.mxu_stall == 0 and kernel.unknown == 0
    assert schedule.called() == {"pallas_x1.1": kernel.cycles}
    assert [c for _, c in schedule.listings["TLP"].calls].count("pallas_x1.1") == 1


def test_a_bundle_over_several_lines_is_one_bundle():
    """A DMA's bundle carries its window's bounds in a comment of several lines; it is one
    bundle, so the listing has as many bundles as its last address says."""
    text = (FIXTURE / "0-pallas_x1.1-01-final_bundles.txt").read_text()
    addresses = re.findall(r"^\s*(0x[0-9a-f]+|0)\s+(?:[A-Z]{2})?:", text, re.M)
    assert any(not line.rstrip().endswith(("}", "*/")) for line in text.splitlines()
               if re.match(r"^\s*0x[0-9a-f]+\s", line))  # the fixture has such bundles
    kernel = bundles.parse_listing(text)
    assert kernel.bundles == int(addresses[-1], 16) + 1 == len(addresses)


def test_body_ops_counts_one_turn_of_the_outer_loop():
    text = _listing("   :  { %1 = vnop }",
                    *_loop(5, 10, 10, ["   : > { %v2 = vadd.f32 %v1, %v1 ;; "
                                       "%v3 = vrot.slane %v2, 4 }"] * 3))
    ops = bundles.body_ops(text)
    assert ops["vadd"] == ops["vrot.slane"] == 3 and "vnop" not in ops  # once, not x trips
    assert ops["sphi"] == ops["sadd"] == ops["sbr.rel"] == 1
    assert list(ops)[:2] == ["vadd", "vrot.slane"]  # most frequent first
    real = bundles.body_ops((FIXTURE / "0-pallas_x1.1-01-final_bundles.txt").read_text())
    assert real["vadd"] > 0 and real["vld"] > 0 and real["vst"] > 0  # x + 1: load, add, store


def test_roofline_is_the_larger_of_compute_and_memory():
    assert bundles.roofline(1_000, 1e9, 1e3, 1e9) == 1e-6  # equal
    assert bundles.roofline(2_000, 1e9, 1e3, 1e9) == 2e-6  # compute bound
    assert bundles.roofline(1_000, 1e9, 4e3, 1e9) == 4e-6  # memory bound
