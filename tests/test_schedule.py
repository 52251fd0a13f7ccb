"""Schedules as data: every chunk reduced exactly once, everywhere, with the traffic promised."""

from collections import Counter

import numpy as np
import pytest

import equarx_ref as eq

SHAPES = [(p,) for p in range(1, 9)] + [(2, 2), (2, 4), (4, 2), (3, 2)]


def _schedules():
    for shape in SHAPES:
        algorithms = ["ring", "bidir_ring"]
        if len(shape) == 1:
            algorithms += ["two_shot", "one_shot"]
        for alg in algorithms:
            yield pytest.param(alg, shape, id=f"{alg}-{'x'.join(map(str, shape))}")


@pytest.mark.parametrize("algorithm,shape", list(_schedules()))
def test_every_chunk_reduced_exactly_once_and_everywhere(algorithm, shape):
    sched = eq.make_schedule(algorithm, shape)
    everyone = Counter(range(sched.p))
    held = eq.simulate(sched)
    for d in range(sched.p):
        for c in range(sched.chunk_count):
            assert held[d][c] == everyone, f"device {d} chunk {c}: {dict(held[d][c])}"
    for c, owners in enumerate(sched.owners):  # the reduce phase alone completes each owner
        reduce_only = eq.Schedule(sched.name, sched.shape, sched.chunk_count,
                                  tuple(s for s in sched.steps if s.phase == "reduce"),
                                  sched.owners)
        for d in owners:
            assert eq.simulate(reduce_only)[d][c] == everyone


@pytest.mark.parametrize("algorithm,shape", list(_schedules()))
def test_permute_steps_are_permutations_between_neighbours(algorithm, shape):
    sched = eq.make_schedule(algorithm, shape)
    for step in sched.steps:
        if step.kind != "permute":
            continue
        srcs = [t.src for t in step.transfers]
        dsts = [t.dst for t in step.transfers]
        assert len(set(srcs)) == len(srcs) == sched.p and sorted(dsts) == sorted(srcs)
        grid = shape if len(shape) == 2 else (1, shape[0])
        axis = step.axis if len(shape) == 2 else 1
        for t in step.transfers:  # one hop along the step's axis of the grid
            src, dst = divmod(t.src, grid[1]), divmod(t.dst, grid[1])
            assert src[1 - axis] == dst[1 - axis]
            assert (dst[axis] - src[axis]) % grid[axis] in (1, grid[axis] - 1)


@pytest.mark.parametrize("p", range(2, 9))
def test_ring_traffic_is_2_p_minus_1_over_p(p):
    sched = eq.ring_schedule(p)
    for d in range(p):  # chunks are n/p values: 2(p-1) of them = 2(p-1)/p of the message
        assert sched.chunks_sent(d) == 2 * (p - 1)
        assert sched.chunks_sent(d, "reduce") == p - 1
    assert len([s for s in sched.steps if s.kind == "permute"]) == p - 1
    bidir = eq.bidir_ring_schedule(p)  # 2p chunks of n/(2p): the same bytes, two directions
    assert all(bidir.chunks_sent(d) == 4 * (p - 1) for d in range(p))
    directions = {(t.dst - t.src) % p for s in bidir.steps if s.kind == "permute"
                  for t in s.transfers}
    assert directions == ({1, p - 1} if p > 2 else {1})


def test_torus_traffic_matches_a_flat_ring():
    for p1, p2 in [(2, 4), (4, 2), (3, 3)]:
        sched = eq.torus_schedule(p1, p2)
        assert all(sched.chunks_sent(d) == 2 * (p1 * p2 - 1) for d in range(p1 * p2))


def test_two_and_one_shot_traffic():
    assert eq.two_shot_schedule(8).chunks_sent(0) == 2 * 7  # chunks of n/8
    assert eq.one_shot_schedule(8).chunks_sent(0) == 7  # whole vectors


def test_bad_input():
    with pytest.raises(ValueError, match="unknown algorithm"):
        eq.make_schedule("tree", (4,))
    with pytest.raises(ValueError, match="pair of mesh axes"):
        eq.make_schedule("two_shot", (2, 2))
    with pytest.raises(ValueError, match="p must be >= 1"):
        eq.ring_schedule(0)


# ---- quantized_sizes: what the error model reads off a schedule --------------------------


def _expected_sizes(algorithm, shape):
    """By hand. Ring over p: the hops quantize partial sums of 1, 2, ..., p - 1 inputs, the
    gather the full sum of p (the bidirectional ring's chunk 0 travels one ring the same way).
    Two-shot: every input once, then the owner's sum. One-shot: every input once. Torus
    (p1, p2): each of the p2 rings along axis 0 quantizes its own 1..p1-1, the ring along axis
    1 carries column sums of p1 inputs (p1, 2 p1, ..., (p2 - 1) p1), the gather p1 p2."""
    if len(shape) == 2:
        p1, p2 = shape
        return sorted([*range(1, p1)] * p2 + [p1 * k for k in range(1, p2)] + [p1 * p2])
    p = shape[0]
    if p == 1:
        return []  # one device: all_reduce sends and quantizes nothing
    return {"ring": list(range(1, p + 1)), "bidir_ring": list(range(1, p + 1)),
            "two_shot": [1] * p + [p], "one_shot": [1] * p}[algorithm]


def _symbolic_run(sched):
    """Execute a schedule on expressions, as the collectives' essay describes the executor:
    ("x", d) is device d's input, ("+", ...) an f32 sum, ("Q", e) e quantized and decoded.
    Returns final[device][chunk]."""
    p, chunks = sched.p, sched.chunk_count
    held = [[("x", d)] * chunks for d in range(p)]
    for step in (s for s in sched.steps if s.phase == "reduce"):
        new = [row[:] for row in held]
        if step.kind == "permute":  # receiver: its own copy + the sender's copy, quantized
            for t in step.transfers:
                for c in t.chunks:
                    new[t.dst][c] = ("+", ("Q", held[t.src][c]), held[t.dst][c])
        else:  # all_to_all / all_gather: every contribution quantized, own included, rank order
            senders = {}
            for t in step.transfers:
                for c in t.chunks:
                    senders.setdefault((t.dst, c), {t.dst}).add(t.src)
            for (d, c), srcs in senders.items():
                new[d][c] = ("+", *(("Q", held[r][c]) for r in sorted(srcs)))
        held = new
    gathers = [s for s in sched.steps if s.phase == "gather"]
    if not gathers:
        return held
    # gather phase: owners encode their chunks once; the gathers forward those bytes
    wire = [[None] * chunks for _ in range(p)]
    for c, owners in enumerate(sched.owners):
        wire[owners[0]][c] = ("Q", held[owners[0]][c])
    for step in gathers:
        new = [row[:] for row in wire]
        for t in step.transfers:
            for c in t.chunks:
                assert wire[t.src][c] is not None, f"device {t.src} forwards chunk {c} it lacks"
                new[t.dst][c] = wire[t.src][c]
        wire = new
    return wire


def _leaves(e):
    return [e[1]] if e[0] == "x" else [leaf for sub in e[1:] for leaf in _leaves(sub)]


def _quantized(e):
    """Sizes (inputs summed) of every quantization in expression e."""
    if e[0] == "x":
        return []
    inner = [k for sub in e[1:] for k in _quantized(sub)]
    return [len(_leaves(e[1])), *inner] if e[0] == "Q" else inner


@pytest.mark.parametrize("algorithm,shape", list(_schedules()))
def test_quantized_sizes_by_hand_and_by_symbolic_execution(algorithm, shape):
    sched = eq.make_schedule(algorithm, shape)
    final = _symbolic_run(sched)
    for d in range(sched.p):
        for c in range(sched.chunk_count):
            assert final[d][c] == final[0][c], f"device {d} chunk {c} differs from device 0"
            assert sorted(_leaves(final[d][c])) == list(range(sched.p))
    simulated = sorted(_quantized(final[0][0])) if sched.p > 1 else []
    expected = _expected_sizes(algorithm, shape)
    assert simulated == expected
    p = shape if len(shape) == 2 else shape[0]
    assert eq.quantized_sizes(p, algorithm=algorithm) == expected
    if sched.p > 1:  # the error model: c * sqrt(mean over chunks of sum(sizes) / p)
        fmt = eq.Format.int4()
        mean = np.mean([sum(_quantized(final[0][c])) for c in range(sched.chunk_count)])
        assert eq.predicted_relative_error(p, fmt=fmt, algorithm=algorithm) == pytest.approx(
            eq.gaussian_relative_error(fmt) * np.sqrt(mean / sched.p), rel=1e-12)


def test_quantized_sizes_refuses_psum_and_bad_shapes():
    with pytest.raises(ValueError, match="psum quantizes nothing"):
        eq.quantized_sizes(4, algorithm="psum")
    with pytest.raises(ValueError, match="pair of mesh axes"):
        eq.quantized_sizes((2, 2), algorithm="two_shot")
    with pytest.raises(ValueError, match="p"):
        eq.quantized_sizes(0, algorithm="ring")
