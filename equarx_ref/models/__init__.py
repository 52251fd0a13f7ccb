"""Models: what a collective costs before it runs, read off the schedules it executes.

- `predict.py`: the bytes one device sends (`wire_bytes`) and the expected relative error
  (`predicted_relative_error`), the two numbers every comparison starts from;
- `error.py`: the error of one quantization of Gaussian data, c(F), and the sizes of the
  partial sums a value is quantized at, from the schedule's walk;
- `hops.py`: hop-aware bit plans, the error model's choice of a format per hop at the same bytes
  (`all_reduce(..., hop_bits="adaptive")`);
- `cost.py`: time on a TPU slice (or on hosts behind a switch) from public chip figures, the
  pipeline, the crossover and the size gate;
- `chips.py`: those figures, one `Chip` per kind (the TPU presets, `CHIPS`), and where each
  comes from;
- `prefill.py`: the modelled prefill time of a tensor-parallel Gemma 3;
- `hlo.py`: the bytes a compiled program really sends, to hold the predictions to.

Everything here imports only the core (formats, quantize, schedule); the core imports nothing
from here, and looks up the size gates and the hop plan by name (`extensions.py`).
"""

from .._lazy import submodules

__getattr__ = submodules(__name__)  # eq.models.MODULE loads MODULE on first read
