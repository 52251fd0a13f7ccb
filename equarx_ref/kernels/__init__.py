"""Pallas TPU kernels: the Mosaic codec and the ring AllReduce with remote DMA.

`tiles.py` is the codec's arithmetic on tiles of rows as a TPU core does it (one transpose,
then blocks down sublanes), the code every kernel here runs; `codec.py` is the Mosaic codec:
encode, decode, a ring hop and two-shot's reduce as kernels that stream a message through HBM;
`mosaic_codec.py` hands them to the collectives, what `eq.all_reduce(..., impl="mosaic")` codes
every message with; `ring.py` is the whole quantized ring AllReduce as one kernel (remote DMAs,
semaphores, an in-kernel pipeline), what `eq.all_reduce(..., impl="pallas")` runs. On a TPU
they run natively; elsewhere in TPU interpret mode on CPU devices, with the race detector on
(`backend.py`). `plan.py` is the ring's static plan (plain data: pieces, slots, each step's
program); `timeline.py` lays it out in time under assumed durations (plain Python, drawn by
`viz.draw_kernel_timeline`). The harness that checks the kernels against `impl="xla"` and
times them is `runs/kernel_checks.py`. `gpu.py` is the GPU codec, the same encode, decode and
hop as Pallas kernels for Triton (imported on its own: `from equarx_ref.kernels import gpu`).
"""

from .._lazy import submodules
from . import codec, mosaic_codec, tiles
from .backend import RaceLog, interpret_params, on_tpu, race_detecting
from .plan import RingPlan, plan_ring
from .ring import SABOTAGES, ring_all_reduce
from .timeline import kernel_timeline

__all__ = [
    "SABOTAGES",
    "RaceLog",
    "RingPlan",
    "codec",
    "interpret_params",
    "kernel_timeline",
    "mosaic_codec",
    "on_tpu",
    "plan_ring",
    "race_detecting",
    "ring_all_reduce",
    "tiles",
]

__getattr__ = submodules(__name__)  # eq.kernels.MODULE loads MODULE on first read
