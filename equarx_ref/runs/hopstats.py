"""Why the hop plan made for Gaussian data hurts on gradients: partial sums measured hop by hop.

`hop_bits="adaptive"` (`hops.py`) chooses a format per ring hop under the bytes of `fmt`,
minimising the modelled L2 error for i.i.d. Gaussian inputs, whose partial sum of k inputs has
k times an input's variance. Two of its assumptions can be checked on real gradients, hop by
hop, by quantizing the same partial sums the ring quantizes (the sum of k devices' gradients,
k = 1 .. p - 1 on the reduce hops, p in the gather) with the format each hop uses:

- growth: RMS(partial sum of k) / RMS(one device's gradient) is sqrt(k) for independent
  inputs; per-device gradients share their mean, so it grows faster, towards k;
- what is lost: the share of coordinates with a non-zero partial sum that quantize to exactly 0
  ("flushed": below half a grid step of their block's absmax) and the relative L2 error, with
  the uniform format and with the plan's format of that hop.

To save scale bits within the same bytes the plan takes blocks of 64 or 128 values on most
hops; on gradients, whose blocks mix a few large coordinates with many small ones, a larger
block flushes more of them (`measure` reports it), which the Gaussian L2 model does not see.
The measurement (`train.hop_statistics`) uses the per-device gradients of the f32 baseline of
`train` at a few steps.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import Format, dequantize, quantize
from ..models.hops import hop_plan

__all__ = ["hop_table"]


def _loss_of(fmt: Format, s: np.ndarray) -> tuple[float, float]:
    """(flushed share, relative error) of quantizing the partial sums `s` with `fmt`."""
    q = np.asarray(dequantize(quantize(jnp.asarray(s, jnp.float32), fmt)))
    live = s != 0
    flushed = float(np.sum(live & (q == 0)) / max(np.sum(live), 1))
    return flushed, float(np.linalg.norm(q - s) / np.linalg.norm(s))


def hop_table(grads: np.ndarray, fmt: Format) -> list[dict]:
    """Per ring hop (k inputs summed; k = p is the gather): RMS growth, and flushed share and
    relative error under `fmt` and under the adaptive plan's format for that hop."""
    p = grads.shape[0]
    plan = hop_plan(p, fmt=fmt, algorithm="ring", hop_bits="adaptive")
    formats = [f for _, f in plan.reduce] + [plan.gather]  # reduce step t sums t + 1 inputs
    rms1 = float(np.sqrt(np.mean(grads ** 2)))
    rows, total = [], np.zeros(grads.shape[1])
    for k in range(1, p + 1):
        total = total + grads[k - 1]
        uf, ue = _loss_of(fmt, total)
        af, ae = _loss_of(formats[k - 1], total)
        rows.append({"k": k, "rms_growth": float(np.sqrt(np.mean(total ** 2))) / rms1,
                     "uniform": str(fmt), "uniform_flushed": uf, "uniform_error": ue,
                     "adaptive": str(formats[k - 1]), "adaptive_flushed": af,
                     "adaptive_error": ae})
    return rows
