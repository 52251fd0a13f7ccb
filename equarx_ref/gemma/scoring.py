"""Per-token scores of next-token prediction, and the error of one AllReduce site.

For logits `[1, S, V]` over ids `x_0 .. x_{S-1}`, with `p` the exact and `q` a perturbed run's
next-token distribution at position `t`:

    NLL_t = -log q(x_{t+1})                   (what the model pays for the true next token)
    KL_t  = sum_v p_v (log p_v - log q_v)     (how far the whole distribution moved)
    top1_t = argmax_v q_v                     (first maximum, like numpy)

`token_scores` works on logits held by one device; `sharded_scores` on logits sharded over the
vocabulary (as tensor-parallel `forward` returns them), exchanging only per-token numbers.
`site_errors` measures an AllReduce where the error is made: on the partial sums an exact run
recorded, `||AR(parts) - sum(parts)|| / ||sum(parts)||` per layer.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from .model import SITES_PER_LAYER
from .parallel import reduce_at

__all__ = ["sharded_scores", "site_errors", "token_scores"]


@jax.jit
def token_scores(logits, ids):
    """Per-token NLL of the next token and the top-1 prediction, for logits `[1, S, V]`.

    Returns:
        (nll, top1, logp): `[S-1]`, `[S-1]`, and the log-probabilities `[S-1, V]`.
    """
    lg = logits[0, :-1]                                                  # [S-1, V]
    logp = jax.nn.log_softmax(lg, axis=-1)
    nll = -jnp.take_along_axis(logp, ids[0, 1:, None], axis=1)[:, 0]
    return nll, jnp.argmax(lg, axis=-1), logp


@partial(jax.jit, static_argnames=("mesh", "with_kl"))
def sharded_scores(logits, ids, logp_exact, mesh, with_kl):
    """NLL, top-1 and KL (or the log-probabilities) from vocabulary-sharded logits `[1, S, V]`.

    Each device holds `[1, S, V/p]`; only per-token numbers cross devices (a max, a sum, the
    target's logit, the argmax candidate), so the 1 GB of logits never moves.

    Returns:
        with_kl=False: (nll `[S-1]`, top1 `[S-1]`, logp `[S-1, V]` sharded over V), the exact
        run's, to pass back as `logp_exact`; with_kl=True: (nll, top1, kl `[S-1]`), KL of this
        run's next-token distributions from `logp_exact`'s.
    """
    axis = mesh.axis_names[0]
    specs = (P(None, None, axis), P(), P(None, axis))

    def body(lg, ids, lpe):
        lg = lg[0, :-1]                                                  # [S-1, V/p]
        vl = lg.shape[-1]
        off = lax.axis_index(axis) * vl
        top = lax.pmax(lg.max(-1), axis)                                 # [S-1]
        lse = top + jnp.log(lax.psum(jnp.exp(lg - top[:, None]).sum(-1), axis))
        logp = lg - lse[:, None]                                         # [S-1, V/p]
        tgt = ids[0, 1:] - off
        ok = (tgt >= 0) & (tgt < vl)
        hit = jnp.take_along_axis(logp, jnp.clip(tgt, 0, vl - 1)[:, None], axis=1)[:, 0]
        nll = -lax.psum(jnp.where(ok, hit, 0.0), axis)
        cand = jnp.where(lg.max(-1) == top, jnp.argmax(lg, -1) + off, jnp.iinfo(jnp.int32).max)
        top1 = lax.pmin(cand, axis)                                      # first global argmax
        if with_kl:
            kl = lax.psum(jnp.sum(jnp.exp(lpe) * (lpe - logp), axis=-1), axis)
            return nll, top1, kl
        return nll, top1, logp

    out = (P(), P(), P() if with_kl else P(None, axis))
    if not with_kl:
        logp_exact = jnp.zeros((1, mesh.shape[axis]), jnp.float32)      # unused placeholder
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out,
                         check_vma=True)(logits, ids, logp_exact)


@partial(jax.jit, static_argnames=("mesh", "all_reduce", "kind"))
def site_errors(parts, mesh, all_reduce, kind=0):
    """Relative error `||AR(parts) - sum(parts)|| / ||sum(parts)||` per layer, for the partial
    sums `[p, L, batch, seq, D]` that `forward_with_partials` recorded. Returns `[L]` (f32).

    `kind`: which sites the parts come from, 0 ("attn") or 1 ("mlp"): layer `l`'s is site
    `2 * l + kind`, which a per-site collective (`parallel.reduce_at`) is told."""
    axis = mesh.axis_names[0]

    def body(local):                                                     # [1, L, B, S, D]
        def one(_, args):
            x, layer = args
            exact = lax.psum(x, axis)
            got = reduce_at(all_reduce, x, SITES_PER_LAYER * layer + kind, axis_name=axis)
            err = jnp.linalg.norm((got - exact).ravel())
            return None, err / jnp.linalg.norm(exact.ravel())
        layers = jnp.arange(local.shape[1], dtype=jnp.int32)
        return lax.scan(one, None, (local[0], layers))[1]                # [L]
    return jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(), check_vma=True)(parts)
