"""Tensor-parallel Gemma 3: Megatron-style sharding over one mesh axis, and `forward`.

With `p` devices on the tensor-parallel axis, each device holds:

    q, k, v   column-parallel: N/p query heads (and their key/value heads)     [D, N/p, H]
    o_proj    row-parallel:    the rows of those same heads                    [N/p, H, D]
    gate, up  column-parallel: F/p MLP columns                                 [D, F/p]
    down      row-parallel:    the same F/p rows                               [F/p, D]
    embedding vocabulary-parallel: V/p rows, used for the lookup and the tied output
    norms     replicated

so attention and the MLP run without communication until `o_proj` and `down_proj`, whose
outputs are partial sums: `y = sum_d y_d`. Those two AllReduces per layer are the only
communication in a block, and they are what `all_reduce(x, axis_name)` replaces. When there are
fewer key/value heads than devices (`K < p`, e.g. the 270M's single KV head), each device keeps a
copy of the KV head its query heads need. The embedding lookup sums one non-zero row across
devices (an exact `psum`), and the logits stay sharded over the vocabulary: no device ever holds
all `V` columns.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .config import Gemma3Config, check_params
from .model import HIGHEST, SITES_PER_LAYER, check_precision, decoder, rms_norm

__all__ = ["ShardedParams", "forward", "forward_with_partials", "reduce_at", "shard_params",
           "tp_size_error"]

ReduceFn = Callable[[jax.Array, str], jax.Array]


class ShardedParams(NamedTuple):
    """Weights already placed on `mesh` in the tensor-parallel layout (from `shard_params`)."""

    tree: dict
    mesh: Mesh
    config: Gemma3Config


def tp_size_error(config: Gemma3Config, p: int) -> str | None:
    """Why `config` cannot be split over `p` devices, or None if it can."""
    N, K, F, V = config.num_heads, config.num_kv_heads, config.hidden_dim, config.vocab_size
    if N % p:
        return f"{N} query heads do not split over {p} devices (TP size must divide num_heads)"
    if K % p and p % K:
        return f"{K} KV heads neither split over nor replicate onto {p} devices"
    if F % p:
        return f"MLP width {F} does not split over {p} devices"
    if V % p:
        return f"vocabulary {V} does not split over {p} devices"
    return None


def _axis(mesh: Mesh) -> str:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (eq.make_mesh) or None, got "
                        f"{type(mesh).__name__}")
    if not isinstance(mesh, Mesh) or len(mesh.axis_names) != 1:
        raise ValueError(f"forward needs a 1-D mesh (its axis is the tensor-parallel axis), "
                         f"got {mesh!r}")
    return mesh.axis_names[0]


def _specs(axis: str) -> dict:
    rep = P()
    return {
        "embed": P(axis, None),
        "final_norm": rep,
        "layers": {
            "attn_norm": rep, "q_norm": rep, "k_norm": rep,
            "post_attn_norm": rep, "ffw_norm": rep, "post_ffw_norm": rep,
            "q": P(None, None, axis, None), "k": P(None, None, axis, None),
            "v": P(None, None, axis, None), "o": P(None, axis, None, None),
            "gate": P(None, None, axis), "up": P(None, None, axis), "down": P(None, axis, None),
        },
    }


def _kv_heads_for(config: Gemma3Config, p: int) -> np.ndarray | None:
    """KV head indices laid out device after device, or None when K splits evenly over p."""
    N, K = config.num_heads, config.num_kv_heads
    if K % p == 0:
        return None
    group = N // K
    return np.array([(d * (N // p)) // group for d in range(p)])   # one KV head per device


def shard_params(params: dict, config: Gemma3Config, mesh: Mesh) -> ShardedParams:
    """Place `params` on `mesh` in the tensor-parallel layout (KV heads replicated if K < p).

    Pass the result to `forward` instead of `params` to skip placing the weights on every call.
    """
    _check_config(config)
    if isinstance(params, ShardedParams):
        if params.mesh != mesh or params.config != config:
            raise ValueError("these ShardedParams were placed for another mesh or config")
        return params
    axis = _axis(mesh)
    p = mesh.shape[axis]
    if (why := tp_size_error(config, p)) is not None:
        raise ValueError(f"Gemma 3 {config.name} cannot run tensor-parallel on {p} devices: {why}")
    check_params(params, config)
    layers = dict(params["layers"])
    idx = _kv_heads_for(config, p)
    if idx is not None:                             # [L, D, K, H] -> [L, D, p, H]
        for name in ("k", "v"):
            xp = np if isinstance(layers[name], np.ndarray) else jnp
            layers[name] = xp.take(layers[name], idx, axis=2)
    tree = {"embed": params["embed"], "final_norm": params["final_norm"], "layers": layers}
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), _specs(axis))
    return ShardedParams(jax.device_put(tree, shardings), mesh, config)


def _check_config(config) -> None:
    if not isinstance(config, Gemma3Config):
        raise TypeError(f"config must be a gemma.Gemma3Config, got {type(config).__name__}")


def _check_tokens(tokens, config: Gemma3Config):
    """Shape, dtype and length always; the id range only for concrete (not traced) tokens."""
    tokens = np.asarray(tokens) if isinstance(tokens, (list, tuple)) else tokens
    if not hasattr(tokens, "ndim") or not hasattr(tokens, "dtype"):
        raise TypeError(f"tokens must be an integer array [batch, seq], got "
                        f"{type(tokens).__name__}")
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    if tokens.shape[1] > config.context_length:
        raise ValueError(f"{tokens.shape[1]} tokens exceed the context of Gemma 3 {config.name} "
                         f"({config.context_length} tokens)")
    if not isinstance(tokens, jax.core.Tracer) and tokens.size and \
            (int(tokens.min()) < 0 or int(tokens.max()) >= config.vocab_size):
        raise ValueError(f"tokens: token ids must lie in [0, {config.vocab_size}), "
                         f"got [{tokens.min()}, {tokens.max()}]")
    return tokens


def _poison_unknown(x, tokens, vocab_size: int):
    """NaN where the id is outside the vocabulary: under an outer jit the ids cannot be checked
    before they run, and a silent wrong row (jnp.take wraps -1 to the last row, a sharded lookup
    finds no owner and gives zeros) would give plausible logits."""
    ok = (tokens >= 0) & (tokens < vocab_size)                                     # [B, S]
    return jnp.where(ok[..., None], x, jnp.nan)


@functools.partial(jax.jit, static_argnames=("config", "precision"))
def _forward_single(params, tokens, config: Gemma3Config, precision):
    x = jnp.take(params["embed"], tokens, axis=0) * jnp.asarray(math.sqrt(config.embed_dim),
                                                               jnp.float32)  # [B, S, D]
    x = _poison_unknown(x, tokens, config.vocab_size)
    x = decoder(x, params["layers"], config, reduce=lambda a, site: a, precision=precision)
    x = rms_norm(x, params["final_norm"], config.norm_eps)
    return jnp.einsum("bsd,vd->bsv", x, params["embed"], precision=precision)  # [B, S, V]


def reduce_at(all_reduce: ReduceFn | None, x: jax.Array, site, *, axis_name: str) -> jax.Array:
    """`all_reduce(x, axis_name)` at reduction site `site` (`lax.psum` if None).

    A collective whose `takes_site` attribute is true (calibrated, per-site state, such as
    `equarx_ref.outliers.StaticAllReduce`) is called as `all_reduce(x, axis_name, site=site)`.
    """
    if all_reduce is None:
        return lax.psum(x, axis_name)
    if getattr(all_reduce, "takes_site", False):
        return all_reduce(x, axis_name, site=site)
    return all_reduce(x, axis_name)


def _check_sites(all_reduce, config: Gemma3Config) -> None:
    """A per-site collective must have been made for this model's number of sites."""
    sites = getattr(all_reduce, "sites", None) if getattr(all_reduce, "takes_site", False) \
        else None
    if sites is not None and sites != SITES_PER_LAYER * config.num_layers:
        raise ValueError(f"all_reduce holds state for {sites} AllReduce sites, but Gemma 3 "
                         f"{config.name} has {SITES_PER_LAYER * config.num_layers} "
                         f"({config.num_layers} layers x {SITES_PER_LAYER}); calibrate it on "
                         f"this model")


@functools.partial(jax.jit, static_argnames=("config", "mesh", "all_reduce", "record",
                                             "precision"))
def _forward_tp(params, tokens, config: Gemma3Config, mesh: Mesh, all_reduce, record: bool,
                precision):
    axis = mesh.axis_names[0]
    p = mesh.shape[axis]
    Vl = config.vocab_size // p
    reduce = functools.partial(reduce_at, all_reduce, axis_name=axis)

    def body(params, tokens):
        # Vocabulary-parallel lookup: the device owning a token's row contributes it, others 0.
        local = tokens - lax.axis_index(axis) * Vl                                 # [B, S]
        ok = (local >= 0) & (local < Vl)
        rows = jnp.take(params["embed"], jnp.clip(local, 0, Vl - 1), axis=0)       # [B, S, D]
        x = lax.psum(jnp.where(ok[..., None], rows, 0.0), axis)                    # exact
        x = x * jnp.asarray(math.sqrt(config.embed_dim), jnp.float32)
        x = _poison_unknown(x, tokens, config.vocab_size)
        out = decoder(x, params["layers"], config, reduce=reduce, record=record,
                      precision=precision)
        x, parts = out if record else (out, None)
        x = rms_norm(x, params["final_norm"], config.norm_eps)
        logits = jnp.einsum("bsd,vd->bsv", x, params["embed"],
                            precision=precision)                                   # [B, S, V/p]
        if record:
            return logits, jax.tree.map(lambda a: a[None], parts)                  # [1, L, B, S, D]
        return logits

    out_specs = P(None, None, axis)
    if record:
        out_specs = (out_specs, {"attn": P(axis), "mlp": P(axis)})
    fn = jax.shard_map(body, mesh=mesh, in_specs=(_specs(axis), P()), out_specs=out_specs,
                       check_vma=True)
    return fn(params, tokens)


def forward(params: dict, tokens, config: Gemma3Config, *, mesh: Mesh | None = None,
            all_reduce: ReduceFn | None = None, precision=HIGHEST) -> jax.Array:
    """Logits of Gemma 3 for `tokens` `[batch, seq]`: `[batch, seq, vocab]`, float32.

    Args:
        params: weights as `load_gguf` returns them (numpy or jax arrays, or `shard_params`'s
            placed copy).
        tokens: integer ids `[batch, seq]`.
        config: the model configuration.
        mesh: a 1-D mesh; its axis is the tensor-parallel axis. None: one device, no
            communication.
        all_reduce: `(x, axis_name) -> x` used at the two reduction sites of every layer (after
            `o_proj` and after `down_proj`), e.g. `eq.AllReduce(fmt=eq.Format.int8(),
            algorithm="ring")`. None means `lax.psum`. It is a static argument of the compiled
            forward: an `eq.AllReduce` hashes by value, so equal ones share one compilation; a
            lambda or `functools.partial` hashes by identity and compiles anew for every new
            object. A collective with a true `takes_site` attribute is also given `site=`, the
            index of the reduction (`2 * layer` after attention, `2 * layer + 1` after the
            MLP) as a traced int32 scalar, and its `sites` attribute (if any) must equal
            `2 * num_layers` (see `reduce_at`).
        precision: of every matmul, a `jax.lax.Precision` or its name ("highest", "high",
            "default"). Default HIGHEST: full float32 on every backend, so the logits are the
            same model's on a CPU, a GPU (whose default is TF32) and a TPU (one bf16 pass).
            "default" leaves it to the backend: faster on accelerators, and chip-dependent.

    Returns:
        Logits `[batch, seq, vocab]`; with a mesh, sharded over the vocabulary.

    Raises:
        ValueError: wrong parameter names/shapes, a mesh that is not 1-D, a TP size that does
            not divide the heads, `all_reduce` without a mesh, more tokens than
            `config.context_length`, ids outside `[0, vocab_size)`, or an unknown
            `precision`.

    Under an outer `jax.jit` the token values are not known when `forward` runs, so only the
    shape, dtype and length are checked; an id outside the vocabulary then makes the logits of
    its whole sequence NaN (its embedding is NaN, and attention multiplies it into every
    position, if only by a zero weight), on one device and under tensor parallelism alike; the
    other sequences of the batch are unaffected.
    """
    _check_config(config)
    tokens = _check_tokens(tokens, config)
    precision = check_precision(precision)
    if all_reduce is not None and not callable(all_reduce):
        raise TypeError(f"all_reduce must be a collective (x, axis_name) -> x or None, got "
                        f"{all_reduce!r}")
    if mesh is None:
        if all_reduce is not None:
            raise ValueError("all_reduce needs a mesh: without one there is nothing to reduce")
        if isinstance(params, ShardedParams):
            raise ValueError("these params were placed on a mesh: pass mesh= as well")
        check_params(params, config)
        return _forward_single(params, jnp.asarray(tokens), config, precision)
    _axis(mesh)
    _check_sites(all_reduce, config)
    placed = shard_params(params, config, mesh).tree
    tokens = jax.device_put(tokens, NamedSharding(mesh, P()))
    return _forward_tp(placed, tokens, config, mesh, all_reduce, False, precision)


def forward_with_partials(params, tokens, config, *, mesh, all_reduce=None, precision=HIGHEST):
    """`forward`, also returning the partial sums that entered each AllReduce.

    Returns:
        (logits, parts) with parts["attn"], parts["mlp"] of shape `[p, L, batch, seq, D]`
        (device d's partial of layer l at `[d, l]`), sharded over devices.
    """
    tokens = _check_tokens(tokens, config)
    precision = check_precision(precision)
    _axis(mesh)
    _check_sites(all_reduce, config)
    placed = shard_params(params, config, mesh).tree
    tokens = jax.device_put(tokens, NamedSharding(mesh, P()))
    return _forward_tp(placed, tokens, config, mesh, all_reduce, True, precision)
