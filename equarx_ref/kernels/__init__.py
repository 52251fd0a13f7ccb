"""Pallas TPU kernels: the fused per-hop kernel and the ring AllReduce with remote DMA.

`hop.py` is one quantized hop, `encode(decode(wire) + local)`, as a kernel; `codec.py` is the
Mosaic codec: encode, decode and that hop as kernels that stream a message through HBM in tiles,
moving the fewest bytes; `row_codec.py` hands them to the collectives, what
`eq.all_reduce(..., impl="mosaic")` codes every message with; `ring.py` is the whole quantized
ring AllReduce as one kernel (remote DMAs, semaphores, an in-kernel pipeline), what
`eq.all_reduce(..., impl="pallas")` runs. On a TPU they run natively; elsewhere in TPU
interpret mode on CPU devices, with the race detector on (`backend.py`). `plan.py` is the
ring's static plan (plain data: pieces, slots, each step's program); `timeline.py` lays it out
in time under assumed durations (plain Python, drawn by `viz.draw_kernel_timeline`). The
harness that checks the kernels against `impl="xla"` and times them is `runs/kernel_checks.py`.
`gpu.py` is the GPU codec, the same encode, decode and hop as Pallas kernels for Triton
(imported on its own: `from equarx_ref.kernels import gpu`).
"""

from . import codec, row_codec
from .backend import RaceLog, interpret_params, on_tpu, race_detecting
from .hop import fused_hop, hop_reference, wire_codec
from .plan import RingPlan, plan_ring
from .ring import SABOTAGES, ring_all_reduce
from .timeline import kernel_timeline

__all__ = [
    "SABOTAGES",
    "RaceLog",
    "RingPlan",
    "codec",
    "fused_hop",
    "hop_reference",
    "interpret_params",
    "kernel_timeline",
    "on_tpu",
    "plan_ring",
    "race_detecting",
    "ring_all_reduce",
    "row_codec",
    "wire_codec",
]
