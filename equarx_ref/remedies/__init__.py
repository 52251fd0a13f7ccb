"""Remedies for the error of re-quantized partial sums, beyond rounding to nearest.

`rotation.py` spreads an outlier over its block with a randomized Hadamard transform
(`all_reduce(..., rotate=True)`). Stochastic rounding (`key=`) is a rounding mode of the
quantizer itself (`quantize.py`), with one key per hop, piece and device folded by the executor;
hop-aware bit plans (`hop_bits="adaptive"`) are chosen by the error model (`models/hops.py`).
"""

from .._lazy import submodules

__getattr__ = submodules(__name__)  # eq.remedies.MODULE loads MODULE on first read
