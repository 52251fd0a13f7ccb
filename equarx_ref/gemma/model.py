"""The Gemma 3 decoder in pure JAX, written for one tensor-parallel shard.

Every function here sees the *local* slice of the weights: `n` of the `N` query heads, `k` of
the key/value heads, `f` of the `F` MLP columns. With one device those are the whole model; under
`jax.shard_map` (see `parallel.py`) each device runs the same code on its slice, and the only
cross-device step is the reduction `reduce(x)` that closes attention and the MLP:

    x <- x + post_attn_norm( reduce( o_proj( attention( pre_attn_norm(x) ) ) ) )
    x <- x + post_ffw_norm ( reduce( down  ( gelu_tanh(gate(h)) * up(h) ) ) ),  h = pre_ffw_norm(x)

The reduction must come *before* the post-norms: RMSNorm of a partial sum is not the partial of
an RMSNorm. That is where EQuARX's quantized AllReduce replaces the exact one. The `2 L` reduction
sites are numbered `site = 2 * layer + kind` (kind 0 after attention, 1 after the MLP), and
`reduce` is told the site, as a traced int32 scalar (the layers run under `lax.scan`, so one
traced block serves every layer): a collective with calibrated, per-site state (`outliers/`)
looks its tables up by it.

Faithful to Gemma 3: RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + w)` in float32; QK-norm over
`head_dim`; rotate-half RoPE with base 10k (local) or 1M (global, positions divided by the linear
scale); a sliding window on local layers (query `i` sees keys `i - window < j <= i`); queries
scaled by `query_pre_attn_scalar ** -0.5`; no soft-capping. All activations are float32, and the
layers run under `lax.scan` over weights stacked on a leading layer axis, so one compiled block
serves all `L` layers.

Every matmul states its precision. Left to the backend, an f32 matmul is not an f32 matmul:
GPUs run it in TF32 (10 mantissa bits), TPUs in one bf16 pass, XLA:CPU in full f32, so the same
logits differed by up to 7.7e-3 between an H100 and a CPU. By default every `einsum` here runs
at `lax.Precision.HIGHEST` (full f32 on every backend: the same model everywhere, and "matches
Hugging Face" holds on each); `precision="default"` (or "high") hands the choice back to the
backend for speed, and the logits then depend on the chip.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from .config import Gemma3Config

__all__ = ["PRECISIONS", "SITES_PER_LAYER", "apply_rope", "attention", "check_precision",
           "decoder", "mlp", "rms_norm", "rope_tables"]

f32 = jnp.float32
#: AllReduce sites per block: `site = 2 * layer + kind`, kind 0 (attention), 1 (MLP).
SITES_PER_LAYER = 2
#: The matmul precisions the forward takes by name: "highest" (full f32 everywhere, the
#: default), "high" (bf16x3 / TF32-class, backend-defined), "default" (the backend's choice).
PRECISIONS = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH,
              "default": lax.Precision.DEFAULT}
HIGHEST = lax.Precision.HIGHEST


def check_precision(precision) -> lax.Precision:
    """`precision` as a `jax.lax.Precision`: one of them, or its name in `PRECISIONS`."""
    if isinstance(precision, lax.Precision):
        return precision
    if isinstance(precision, str) and precision.lower() in PRECISIONS:
        return PRECISIONS[precision.lower()]
    raise ValueError(f"precision must be a jax.lax.Precision or one of {tuple(PRECISIONS)}, "
                     f"got {precision!r}")


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """Gemma's RMSNorm over the last axis, in float32: `x * rsqrt(mean(x^2) + eps) * (1 + w)`."""
    x32 = x.astype(f32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * (1.0 + w.astype(f32))).astype(x.dtype)


def rope_tables(seq: int, head_dim: int, base: float, scale: float = 1.0):
    """cos and sin tables of rotate-half RoPE, each `[seq, head_dim]`.

    Angle of position `t`, pair `i`: `(t / scale) * base ** (-2i / head_dim)`; the two halves of
    the head share the frequencies (`cat(freqs, freqs)`).
    """
    inv_freq = 1.0 / (base ** (jnp.arange(0, head_dim, 2, dtype=f32) / head_dim))  # [H/2]
    inv_freq = inv_freq / scale
    t = jnp.arange(seq, dtype=f32)
    ang = t[:, None] * inv_freq[None, :]                                           # [S, H/2]
    ang = jnp.concatenate([ang, ang], axis=-1)                                     # [S, H]
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate `x` `[batch, seq, heads, head_dim]` by position: `x cos + rotate_half(x) sin`."""
    h = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., h:], x[..., :h]], axis=-1)   # rotate_half
    return x * cos[None, :, None, :] + rot * sin[None, :, None, :]


def attention(x, w, cos, sin, mask, config: Gemma3Config,
              precision: lax.Precision = HIGHEST) -> jax.Array:
    """Grouped-query attention on this shard's heads; returns the `o_proj` partial sum.

    Args:
        x: `[batch, seq, D]`, already pre-normed.
        w: layer weights: q `[D, n, H]`, k/v `[D, k, H]`, q_norm/k_norm `[H]`, o `[n, H, D]`.
        cos, sin: `[seq, H]` RoPE tables of this layer's kind.
        mask: `[seq, seq]` bool, True where query i may attend to key j.
        precision: of every matmul (module essay).

    Returns:
        `[batch, seq, D]`: this shard's contribution to the attention output (sum over shards).
    """
    eps = config.norm_eps
    mm = functools.partial(jnp.einsum, precision=precision)        # every matmul pinned
    q = mm("bsd,dnh->bsnh", x, w["q"])                             # [B, S, n, H]
    k = mm("bsd,dkh->bskh", x, w["k"])                             # [B, S, k, H]
    v = mm("bsd,dkh->bskh", x, w["v"])                             # [B, S, k, H]
    q = apply_rope(rms_norm(q, w["q_norm"], eps), cos, sin)
    k = apply_rope(rms_norm(k, w["k_norm"], eps), cos, sin)
    B, S, n, H = q.shape
    kh = k.shape[2]
    q = q.reshape(B, S, kh, n // kh, H)                            # [B, S, k, g, H]
    scores = mm("bskgh,btkh->bkgst", q, k) * config.query_scale    # [B, k, g, S, T]
    scores = jnp.where(mask[None, None, None], scores, jnp.finfo(f32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = mm("bkgst,btkh->bskgh", probs, v).reshape(B, S, n, H)    # [B, S, n, H]
    return mm("bsnh,nhd->bsd", out, w["o"])                        # [B, S, D] partial


def mlp(x, w, precision: lax.Precision = HIGHEST) -> jax.Array:
    """Gated gelu-tanh MLP on this shard's `f` columns; returns the `down_proj` partial sum."""
    mm = functools.partial(jnp.einsum, precision=precision)        # every matmul pinned
    gate = mm("bsd,df->bsf", x, w["gate"])                         # [B, S, f]
    up = mm("bsd,df->bsf", x, w["up"])                             # [B, S, f]
    h = jax.nn.gelu(gate, approximate=True) * up
    return mm("bsf,fd->bsd", h, w["down"])                         # [B, S, D] partial


def masks(seq: int, window: int):
    """(global, local) attention masks `[seq, seq]`: causal, and causal within `window`."""
    i = jnp.arange(seq)[:, None]
    j = jnp.arange(seq)[None, :]
    causal = j <= i
    return causal, causal & (j > i - window)


def decoder(x: jax.Array, layers: dict, config: Gemma3Config,
            reduce: Callable[[jax.Array, jax.Array], jax.Array], record: bool = False,
            precision: lax.Precision = HIGHEST):
    """Run all `L` blocks over the residual stream `x` `[batch, seq, D]` with `lax.scan`.

    Args:
        x: embedded tokens, `[batch, seq, D]`, float32.
        layers: stacked (local-shard) layer weights, each with a leading `L` axis.
        config: the model configuration.
        reduce: `reduce(partial, site)`, the cross-shard sum of a partial `[batch, seq, D]`
            (identity on one device); `site` is `2 * layer + kind` as a traced int32 scalar.
        record: also return the partial sums that entered `reduce`.
        precision: of every matmul (module essay; HIGHEST unless asked).

    Returns:
        The residual stream after the last block; with `record`, also a dict with "attn" and
        "mlp" partial sums, each `[L, batch, seq, D]`.
    """
    S = x.shape[1]
    eps = config.norm_eps
    H = config.head_dim
    local_cs = rope_tables(S, H, config.local_rope_base)
    global_cs = rope_tables(S, H, config.global_rope_base, config.global_rope_scale)
    global_mask, local_mask = masks(S, config.sliding_window)
    is_global = jnp.array([config.is_global(i) for i in range(config.num_layers)])
    layer = jnp.arange(config.num_layers, dtype=jnp.int32)

    def block(x, args):
        w, g, i = args
        cos = jnp.where(g, global_cs[0], local_cs[0])
        sin = jnp.where(g, global_cs[1], local_cs[1])
        mask = jnp.where(g, global_mask, local_mask)
        a_part = attention(rms_norm(x, w["attn_norm"], eps), w, cos, sin, mask, config,
                           precision)
        x = x + rms_norm(reduce(a_part, SITES_PER_LAYER * i), w["post_attn_norm"], eps)
        m_part = mlp(rms_norm(x, w["ffw_norm"], eps), w, precision)
        x = x + rms_norm(reduce(m_part, SITES_PER_LAYER * i + 1), w["post_ffw_norm"], eps)
        return x, ({"attn": a_part, "mlp": m_part} if record else None)

    x, parts = lax.scan(block, x, (layers, is_global, layer))
    return (x, parts) if record else x
