"""Schedules as data: every chunk reduced exactly once, everywhere, with the traffic promised."""

from collections import Counter

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
        for c in range(sched.num_chunks):
            assert held[d][c] == everyone, f"device {d} chunk {c}: {dict(held[d][c])}"
    for c, owners in enumerate(sched.owners):  # the reduce phase alone completes each owner
        reduce_only = eq.Schedule(sched.name, sched.shape, sched.num_chunks,
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
