"""Adding a format or a schedule is local (docs/contributing.md, "Adding a format or a
schedule"): a toy format and a toy schedule, each added in-process through the tables that page
names and nothing else, run through the spec, `all_reduce` (bitwise the spec's), `wire_bytes`,
`predicted_time` and `predicted_relative_error`.

The toy format is `fp8_e3m4` (ml_dtypes' float8_e3m4: 3 exponent bits, 4 mantissa bits, IEEE
infinities), one row of `spec.formats.ELEMENTS`. The toy schedule is a ring run the other way
round (device d sends to d - 1), one function and its row of `schedule.SCHEDULES`, priced by
the ring's entry of `cost.PHASES`.
"""

import re
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import schedule, spec
from equarx_ref.models import cost
from equarx_ref.schedule import Schedule, Step, Transfer

ROOT = Path(__file__).resolve().parent.parent
TOY_FORMAT = "fp8_e3m4"
TOY_SCHEDULE = "reverse_ring"


def reverse_ring_schedule(p: int) -> Schedule:
    """A ring the other way round: at step s device d sends chunk (d + s + 1) mod p to d - 1,
    which adds its own copy; device d ends owning chunk d; an all-gather."""
    steps = [Step("permute", "reduce", 0, s, tuple(
        Transfer(d, (d - 1) % p, ((d + s + 1) % p,)) for d in range(p))) for s in range(p - 1)]
    steps.append(Step("all_gather", "gather", 0, p - 1, tuple(
        Transfer(src, dst, (src,)) for src in range(p) for dst in range(p) if dst != src)))
    return Schedule(TOY_SCHEDULE, (p,), p, tuple(steps), tuple((c,) for c in range(p)))


@pytest.fixture
def toy_format(monkeypatch):
    """The toy format: one row of the spec's table."""
    monkeypatch.setitem(spec.formats.ELEMENTS, TOY_FORMAT, (ml_dtypes.float8_e3m4, 8))
    return eq.Format(TOY_FORMAT)


@pytest.fixture
def toy_schedule(monkeypatch):
    """The toy schedule: its builder and row, and its entry in the cost model (the ring's)."""
    monkeypatch.setitem(schedule.SCHEDULES, TOY_SCHEDULE,
                        schedule.Algorithm(reverse_ring_schedule))
    monkeypatch.setitem(cost.PHASES, TOY_SCHEDULE, cost.PHASES["ring"])
    return TOY_SCHEDULE


def _all_reduce(x, algorithm, fmt):
    """eq.all_reduce over one device per row of x, every message in `fmt` (min_bytes=0)."""
    p = x.shape[0]
    mesh = eq.make_mesh(DEVICES[:p], ("tp",), (p,))
    f = jax.jit(jax.shard_map(
        lambda v: eq.all_reduce(v[0], "tp", fmt=fmt, algorithm=algorithm, min_bytes=0)[None],
        mesh=mesh, in_specs=P("tp"), out_specs=P("tp")))
    return np.asarray(f(x))


def _same_bits(got, want, what):
    diff = got.view(np.uint32) != want.view(np.uint32)
    assert not diff.any(), (f"{what}: {int(diff.sum())} of {diff.size} values differ from the "
                            f"spec, first {got[diff][0]!r} against {want[diff][0]!r}")


def _inputs(p, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((p, n)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-20, 20, (p, 1)).astype(np.float32)
    x[:, :32] = 0.0  # a zero block
    return x


@pytest.mark.slow
def test_a_format_is_a_row_of_the_spec_table(toy_format):
    fmt = toy_format
    assert (fmt.element, fmt.elem_bits, fmt.mant_bits, fmt.min_exponent, fmt.elem_max) == \
        ("e3m4", 8, 4, -2, 15.5)
    assert str(eq.Format.parse(TOY_FORMAT)) == TOY_FORMAT and fmt.bits_per_element == 8.5
    np.testing.assert_array_equal(fmt.grid, spec.grid(TOY_FORMAT)[0])
    x = _inputs(1, 4096, 0)[0]
    x[32:64] = np.float32(1e-39)  # subnormal inputs
    _same_bits(np.asarray(eq.dequantize(eq.quantize(x, fmt))), spec.round_trip(x, fmt),
               "quantize")
    p, n = 4, 1000
    x = _inputs(p, n, 1)
    want = spec.all_reduce(x, eq.make_schedule("two_shot", (p,)), fmt)
    for d, got in enumerate(_all_reduce(x, "two_shot", fmt)):
        _same_bits(got, want, f"all_reduce, device {d}")
    int8 = eq.Format.int8()
    assert eq.wire_bytes(n, p, fmt=fmt, algorithm="ring", min_bytes=0) == \
        eq.wire_bytes(n, p, fmt=int8, algorithm="ring", min_bytes=0)  # 8.5 bits each
    assert eq.predicted_time(1 << 20, p, fmt=fmt, algorithm="ring", chip="v5e") > 0
    e4m3 = eq.predicted_relative_error(p, fmt=eq.Format.fp8_e4m3(), algorithm="ring")
    assert 0 < eq.predicted_relative_error(p, fmt=fmt, algorithm="ring") < e4m3  # a bit more


def test_a_schedule_is_a_function_and_its_rows(toy_schedule):
    algorithm, p = toy_schedule, 4
    sched = eq.make_schedule(algorithm, (p,))
    assert all(counter == dict.fromkeys(range(p), 1) for row in eq.simulate(sched)
               for counter in row)
    x = _inputs(p, 1000, 2)
    for fmt in (eq.Format.int8(), eq.Format("int4", 16), None):
        want = spec.all_reduce(x, sched, fmt)
        for d, got in enumerate(_all_reduce(x, algorithm, fmt)):
            _same_bits(got, want, f"{eq.format_label(fmt)}, device {d}")
    for n in (0, 1, 1000, 1 << 20):  # the same traffic as the ring's, counted off the schedule
        for fmt in (eq.Format.int8(), None):
            kw = {"fmt": fmt, "algorithm": algorithm}
            ring = {"fmt": fmt, "algorithm": "ring"}
            assert eq.wire_bytes(n, p, **kw) == eq.wire_bytes(n, p, **ring)
            assert eq.predicted_time(n, p, chip="v5e", **kw) == \
                eq.predicted_time(n, p, chip="v5e", **ring)
    assert eq.predicted_relative_error(p, fmt=eq.Format.int8(), algorithm=algorithm) == \
        eq.predicted_relative_error(p, fmt=eq.Format.int8(), algorithm="ring")
    with pytest.raises(ValueError, match="2D torus"):  # not of the ring family
        eq.wire_bytes(64, (2, 2), fmt=None, algorithm=algorithm)
    with pytest.raises(ValueError, match="num_chunks"):
        eq.AllReduce(algorithm=algorithm, num_chunks=2)


def test_both_at_once(toy_format, toy_schedule):
    p = 4
    x = _inputs(p, 777, 3)
    want = spec.all_reduce(x, eq.make_schedule(toy_schedule, (p,)), toy_format)
    for d, got in enumerate(_all_reduce(x, toy_schedule, toy_format)):
        _same_bits(got, want, f"device {d}")


@pytest.mark.parametrize("algorithm", list(schedule.SCHEDULES))
def test_the_closed_forms_are_the_schedules_counts(algorithm):
    """A row's closed forms (`Algorithm.sent`, `sizes`, `chunks`) against its schedule, built
    and walked, over one axis and (for rings) a torus: what `wire_bytes` and the error model
    read where p is too large to build a schedule."""
    from equarx_ref.models.error import quantizations

    row = schedule.SCHEDULES[algorithm]
    shapes = [(p,) for p in range(1, 10)]
    shapes += [(p1, p2) for p1 in range(1, 5) for p2 in range(1, 5)] if row.ring else []
    for shape in shapes:
        sched = eq.make_schedule(algorithm, shape)
        assert {sched.chunks_sent(d) for d in range(sched.p)} == {row.sent(shape)}, shape
        assert row.chunks(shape) == sched.chunk_count, shape
        if sched.p > 1:  # one device quantizes nothing (the error model answers 0 first)
            assert row.sizes(shape) == sum(k for _, k in quantizations(sched)[0]), shape


def _touched(kind: str) -> list[str]:
    """The files docs/contributing.md says a new `kind` ("format", "schedule") touches."""
    page = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = page[page.index("### Adding a format or a schedule"):]
    part = section[section.index(f"A new {kind} touches:"):]
    part = part[:part.index("\n\n", part.index("\n- "))]
    return re.findall(r"^- `([\w/]+\.py)`", part, re.MULTILINE)


def test_the_contributing_page_names_at_most_three_files_each():
    """The files this test patched the tables of are the page's, and there are few."""
    fmt, sched = _touched("format"), _touched("schedule")
    assert fmt[0] == "equarx_ref/spec/formats.py" and len(fmt) <= 3, fmt
    assert sched == ["equarx_ref/schedule.py", "equarx_ref/models/cost.py"], sched
    assert all((ROOT / f).is_file() for f in fmt + sched)
    assert Path(spec.formats.__file__).resolve() == ROOT / fmt[0]
    assert [Path(m.__file__).resolve() for m in (schedule, cost)] == [ROOT / f for f in sched]
