"""The kernel timeline (kernels.kernel_timeline, drawn by viz.draw_kernel_timeline): the plan's
waits, slots and sends laid out in time. It must respect what the kernel promises: one thing at
a time per resource, a message read only after it arrived, no slot holding two messages at
once, and pipelining shortening the run."""

import itertools

import matplotlib
import pytest

matplotlib.use("Agg")

import equarx_ref as eq
from equarx_ref import kernels, viz

PLANS = [(p, algorithm, k) for p in (2, 3, 4) for algorithm in ("ring", "bidir_ring")
         for k in (1, 2, 3)]


def _plan(p, algorithm, k, n=None):
    return kernels.plan_ring(n or p * 2 * 32 * 6, p, fmt=eq.Format.int8(), algorithm=algorithm,
                             num_chunks=k)


@pytest.mark.parametrize(("p", "algorithm", "k"), PLANS)
def test_timeline_respects_the_kernel(p, algorithm, k):
    plan = _plan(p, algorithm, k)
    for device in range(p):
        for lane in range(len(plan.lanes)):
            events = kernels.kernel_timeline(plan, device=device, lane=lane, compute=1.0,
                                             link=0.7, fetch=0.2)
            by = {}
            for resource, label, _, start, end in events:
                assert 0 <= start <= end, (resource, label, start, end)
                by.setdefault(resource, []).append((start, end, label))
            assert len(by["compute"]) == plan.steps
            assert len(by["link"]) == plan.messages
            assert len(by["x → VMEM"]) == p * plan.k  # hops 0..p-1 read x, one piece each
            for resource, spans in by.items():  # one message per slot, one DMA per link...
                spans.sort()
                for (_, e0, l0), (s1, _, l1) in itertools.pairwise(spans):
                    assert s1 >= e0 - 1e-9, f"{resource}: {l0} until {e0}, {l1} from {s1}"
            slots = {r for r in by if r.startswith("recv slot")}
            assert slots <= {f"recv slot {i}" for i in range(plan.slots)}
            assert len(slots) == min(plan.slots, 2 * (p - 1) * plan.k)
            # a message is read (its slot freed, at the start of a compute) only after it
            # arrived: the link carries messages in order, message m = hop * k + piece
            links = sorted(by["link"])
            starts = {s for s, _, _ in by["compute"]}
            for resource in slots:
                for start, end, label in by[resource]:
                    hop, piece = map(int, label.split("."))
                    sent = links[hop * plan.k + piece]
                    assert start == sent[0] and end >= sent[1] and end in starts, (label, sent)

def test_pipelining_shortens_the_modelled_run():
    """Equal work: with compute = link, k pieces overlap the DMA of one piece with the compute
    of the next; with no link time the run is just the computes (and the first fetch)."""
    makespan = {k: max(e[4] for e in kernels.kernel_timeline(_plan(4, "ring", k,
                                                                   n=4 * 32 * 12)))
                for k in (1, 2, 4)}
    assert makespan[4] < makespan[2] < makespan[1], makespan
    steps = 2 * 4 - 1
    assert makespan[1] == pytest.approx(0.25 + steps + (steps - 1))  # nothing overlaps
    plan = _plan(4, "ring", 3, n=4 * 32 * 12)
    alone = max(e[4] for e in kernels.kernel_timeline(plan, link=0.0, fetch=0.0))
    assert alone == pytest.approx(steps)


def test_kernel_timeline_figure(tmp_path):
    plan = _plan(3, "ring", 2)
    ax = viz.draw_kernel_timeline(plan, title="k = 2")
    ax.figure.savefig(tmp_path / "k.png")
    assert len(ax.patches) == len(kernels.kernel_timeline(plan))
    assert [t.get_text() for t in ax.get_yticklabels()][:3] == ["x → VMEM", "compute", "link"]
