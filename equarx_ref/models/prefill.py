"""Prefill time of a tensor-parallel Gemma 3, modelled: where a faster AllReduce shows.

A prefill of T tokens at tensor parallelism p does two things per layer on every chip:

    matmuls      2 x (weights of the layer) / p  FLOPs per token, plus attention scores and
                 values: 4 x T_seen x N x H / p per token (T_seen = the window for a local
                 layer, the whole prefix for a global one, halved by causality)
    AllReduces   two, of T x D values each (after o_proj and after down_proj)

and the output projection once. In tensor-parallel inference the AllReduces sit on the critical
path (the next norm needs the full sum), so the model adds the two:

    T = FLOPs / (p x peak x efficiency)  +  2 L x AllReduce(T x D)

with the AllReduce priced by `cost.predicted_time` at its best pipeline depth. Everything else
(attention softmax, norms, embedding lookups, kernel launches, any overlap XLA finds between a
collective and independent work) is left out; `efficiency` states the fraction of peak the
matmuls reach. These are modelled figures, to be read beside the paper's measured ones
(EQuARX, arXiv 2506.17615: Gemma 3 12B 1.1x and 27B 1.25x faster prefill with int8).
"""

from __future__ import annotations

import dataclasses

from ..formats import Format
from .cost import as_chip, best_num_chunks, predicted_time

__all__ = ["PrefillTime", "prefill_time"]


@dataclasses.dataclass(frozen=True)
class PrefillTime:
    """Modelled seconds of one prefill: matmuls, AllReduces, their sum."""

    compute_s: float
    allreduce_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.allreduce_s


def _flops(config, tokens: int) -> float:
    """Matmul FLOPs of one prefill of `tokens` tokens (batch 1), all chips together."""
    d, n, k, h, f = (config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim,
                     config.hidden_dim)
    per_token_weights = d * (n + 2 * k) * h + n * h * d + 3 * d * f  # qkv, o, gate/up/down
    flops = 2.0 * tokens * per_token_weights * config.num_layers
    for layer in range(config.num_layers):
        seen = tokens if config.is_global(layer) else min(tokens, config.sliding_window)
        flops += 4.0 * tokens * seen / 2 * n * h  # scores and values, causal half
    return flops + 2.0 * tokens * d * config.vocab_size  # output projection (tied embedding)


def prefill_time(config, tokens: int, tp: int, *, chip, fmt: Format | None,
                 algorithm: str = "bidir_ring", efficiency: float = 0.5) -> PrefillTime:
    """Modelled prefill of `tokens` tokens at tensor parallelism `tp` (module essay)."""
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    c = as_chip(chip)
    compute = _flops(config, tokens) / (tp * c.peak_flops * efficiency)
    n = tokens * config.embed_dim
    k = best_num_chunks(n, tp, fmt=fmt, algorithm=algorithm, chip=c)
    one = predicted_time(n, tp, fmt=fmt, algorithm=algorithm, chip=c, num_chunks=k)
    return PrefillTime(compute, 2 * config.num_layers * one)
