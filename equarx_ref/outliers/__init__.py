"""Static int4 with BF16 outlier features: calibrated AllReduce (Dong et al., arXiv 2411.07942).

The dynamic formats of `quantize.py` compute a scale from every block of data as it is sent, and
pay for it on the wire (a bf16 scale per 32 values: int4 costs 4.5 bits). Tensor-parallel
partial sums are more regular than that: a given hidden feature at a given AllReduce site has
about the same range for every token, and a handful of features are far wider than the rest,
for every token. So measure the ranges once, offline, and send no scales at all:

1. `calibration.py`: the ranges of every site's partial sums, per device (and per run of
   consecutive devices, for the ring), as a moving average over calibration batches; the
   `k = floor(E / 64)` widest features of each site are the outliers.
2. `wire.py`: the format. Outliers travel as bfloat16, every other feature as a 4-bit code of
   a static grid spanning its calibrated range with 0 on it, so a row of E features costs
   `(4 (E - k) + 16 k) / E` bits per value: 4.1875 for Gemma 3 270M (E = 640, k = 10).
3. `collective.py`: `static_all_reduce` / `StaticAllReduce`, the paper's one-shot (one
   quantization per value, bitwise identical everywhere) and the ring for comparison;
   `gemma.forward` tells it which site it serves.

Every public name is re-exported here: `eq.outliers.StaticAllReduce`,
`from equarx_ref.outliers import init_calibration`. Calibrating it on Gemma:
`equarx_ref.gemma.calibrate`.
"""

from .._lazy import submodules
from .calibration import (
    check_calibration,
    default_outliers,
    init_calibration,
    load_calibration,
    save_calibration,
    select_outliers,
    update_calibration,
    window_sums,
)
from .collective import StaticAllReduce, static_all_reduce
from .wire import ALGORITHMS, StaticFormat, static_wire_bytes

__all__ = [
    "ALGORITHMS",
    "StaticAllReduce",
    "StaticFormat",
    "check_calibration",
    "default_outliers",
    "init_calibration",
    "load_calibration",
    "save_calibration",
    "select_outliers",
    "static_all_reduce",
    "static_wire_bytes",
    "update_calibration",
    "window_sums",
]

__getattr__ = submodules(__name__)  # eq.outliers.MODULE loads MODULE on first read
