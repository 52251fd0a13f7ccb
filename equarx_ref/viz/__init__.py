"""Every figure of the package, for the notebooks, the docs and the command line (matplotlib only).

Drawing only: each function takes what a schedule, a model or a command produced and draws it;
nothing here computes a result. By subject:

- `schedules.py`: a `Schedule` as a table of who sends which chunk where (`draw_schedule`),
  and a TPU slice's ICI network with one ring through it (`draw_torus`).
- `results.py`: what the commands measured and modelled: bytes against error and CPU time
  (`equarx-ref demo`), modelled speedup (`model`), measured against modelled seconds
  (`bench --hosts`), the map of bits against error (`sweep`), calibrated feature ranges
  (`outliers`); one colour per wire format and one marker per algorithm (`MARKERS`).
- `timelines.py`: Gantt charts of the modelled pipeline (`draw_timeline`) and of the Pallas
  ring kernel's plan (`draw_kernel_timeline`, from `kernels.kernel_timeline`).

Every name is re-exported here: `eq.viz.draw_schedule`, `from equarx_ref.viz import
plot_measured`. `import equarx_ref` does not load this package (nor matplotlib) until
`eq.viz` is used.
"""

from .._lazy import submodules
from .results import (
    MARKERS,
    plot_bytes_error,
    plot_comparison,
    plot_cpu_time,
    plot_feature_ranges,
    plot_measured,
    plot_speedup,
    plot_sweep,
)
from .schedules import draw_schedule, draw_torus
from .timelines import draw_kernel_timeline, draw_timeline

__all__ = [
    "MARKERS",
    "draw_kernel_timeline",
    "draw_schedule",
    "draw_timeline",
    "draw_torus",
    "plot_bytes_error",
    "plot_comparison",
    "plot_cpu_time",
    "plot_feature_ranges",
    "plot_measured",
    "plot_speedup",
    "plot_sweep",
]

__getattr__ = submodules(__name__)  # eq.viz.MODULE loads MODULE on first read
