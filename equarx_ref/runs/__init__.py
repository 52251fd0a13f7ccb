"""Runs: the library function behind every `equarx-ref` command, each usable from Python.

- `demo.py`: `equarx-ref demo` (every algorithm x format side by side); `bench.py`:
  `equarx-ref bench` (the codec's encode, decode and hop against a copy on jax's device);
- `sweep.py`: `equarx-ref sweep`, the map of bits on the wire against error;
- `kernel_checks.py`: `equarx-ref kernels`, the Pallas kernels against `impl="xla"`;
- `tpu_compile.py`, `tpu_matrix.py`, `tpu_readback.py`: `equarx-ref kernels --compile`, every
  kernel and collective compiled with libtpu's compilers from a CPU machine (one program; the
  matrix and its table; the programs read back against the models); `tpu_bytes.py`: XLA:TPU's
  bytes accessed by the codec and the AllReduces over the fewest bytes each must move;
- `train.py`: `equarx-ref train`, data-parallel training with quantized gradient AllReduces
  (chapter 08; its stored results are `equarx_ref.data`'s "train" and "train-hops");
  `hopstats.py`: the partial sums a ring quantizes, hop by hop, on those gradients;
- `check.py`: `equarx-ref check`, this chip's quantizer and all_reduce bitwise against the spec.

The multi-host run (`equarx-ref bench --hosts`) is `multihost/`, Gemma's quality and
calibration runs are in `gemma/`. The CLI (`cli/`) only parses, calls one of these and prints.
"""

from .._lazy import submodules

__getattr__ = submodules(__name__)  # eq.runs.MODULE loads MODULE on first read
