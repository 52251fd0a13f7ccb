"""The byte and error models count in closed form what the schedules do: held equal here to the
schedule data for every family, and fast at the sizes of real TPU slices."""

import itertools

import pytest

import equarx_ref as eq
from equarx_ref.models import error, predict
from equarx_ref.schedule import make_schedule

SHAPES = [(p,) for p in range(2, 14)]
TORI = [s for s in itertools.product(range(1, 6), repeat=2) if s[0] * s[1] >= 2]


def _cases():
    for alg in ["ring", "bidir_ring", "two_shot", "one_shot"]:
        yield from ((alg, s) for s in SHAPES)
    for alg in ["ring", "bidir_ring"]:
        yield from ((alg, s) for s in TORI)


@pytest.mark.parametrize("algorithm,shape", list(_cases()))
def test_closed_forms_equal_the_schedule(algorithm, shape):
    sched = make_schedule(algorithm, shape)
    sent = {sched.chunks_sent(d) for d in range(sched.p)}
    assert sent == {predict._chunks_sent(algorithm, shape)}, "every device sends the same"
    sums = {sum(k for _, k in h) for h in error.quantizations(sched)}
    assert sums == {error._size_sum(algorithm, shape)}, "every chunk's history weighs the same"


def test_quantized_sizes_follow_the_schedule():
    assert eq.quantized_sizes(4, algorithm="ring") == [1, 2, 3, 4]
    assert eq.quantized_sizes((2, 2), algorithm="ring") == [1, 1, 2, 4]
    assert eq.quantized_sizes(4, algorithm="two_shot") == [1, 1, 1, 1, 4]
    assert eq.quantized_sizes(4, algorithm="one_shot") == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="psum quantizes nothing"):
        eq.quantized_sizes(4, algorithm="psum")


@pytest.mark.parametrize("p", [2048, 8960, (64, 140)])
def test_models_count_in_closed_form_at_slice_scale(p, monkeypatch):
    """At a real slice's size the models never build a schedule (p^2 transfers, 80 million at
    8,960 chips): they count in closed form, which is why they take milliseconds. Checked by
    what runs, not by a wall clock (which a loaded machine would fail by chance)."""
    def refuse(*_args, **_kw):
        raise AssertionError("a model built or walked a schedule at slice scale")

    for module, name in ((predict, "make_schedule"), (error, "make_schedule"), (error, "walk"),
                         (predict, "step_weights")):
        monkeypatch.setattr(module, name, refuse)
    fmt = eq.Format.int8()
    for algorithm in ["ring", "bidir_ring"] + (["two_shot", "one_shot"] if isinstance(p, int)
                                              else []):
        n = 1 << 30
        sent = eq.wire_bytes(n, p, fmt=fmt, algorithm=algorithm)
        assert sent > 0
        assert 0 < eq.predicted_relative_error(p, fmt=fmt, algorithm=algorithm) < 1
    total = p if isinstance(p, int) else p[0] * p[1]
    ring = eq.wire_bytes(1 << 30, p, fmt=None, algorithm="ring")
    assert ring == pytest.approx(2 * (total - 1) / total * 2 * (1 << 30), rel=1e-3)
