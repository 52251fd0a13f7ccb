"""Pallas TPU kernels: the fused per-hop kernel and the ring AllReduce with remote DMA.

`hop.py` is one quantized hop, `encode(decode(wire) + local)`, as a kernel; `ring.py` is the
whole quantized ring AllReduce as one kernel (remote DMAs, semaphores, an in-kernel pipeline),
what `eq.all_reduce(..., impl="pallas")` runs. On a TPU they run natively; elsewhere in TPU
interpret mode on CPU devices, with the race detector on (`backend.py`). `timeline.py` lays the
ring's plan out in time under assumed durations (plain Python, drawn by
`viz.draw_kernel_timeline`). The harness that checks the kernels against `impl="xla"` and times
them is `runs/kernel_checks.py`.
"""

from .backend import RaceLog, interpret_params, on_tpu, race_detecting
from .hop import fused_hop, hop_reference, lowering_error, wire_codec
from .ring import SABOTAGES, RingPlan, plan_ring, ring_all_reduce
from .timeline import kernel_timeline

__all__ = [
    "SABOTAGES",
    "RaceLog",
    "RingPlan",
    "fused_hop",
    "hop_reference",
    "interpret_params",
    "kernel_timeline",
    "lowering_error",
    "on_tpu",
    "plan_ring",
    "race_detecting",
    "ring_all_reduce",
    "wire_codec",
]
