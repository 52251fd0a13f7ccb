"""The training step of the data-parallel experiment (`train.py` drives it): the model, Adam,
the gradient AllReduce, and one compiled chunk of steps.

`TrainConfig` holds the experiment's sizes. The model is a character-level MLP language model:
an embedding of the last `context` characters, one tanh layer, a softmax over the characters
(`init_params`, `loss_fn`). Adam is written out here (a dozen lines): the package needs nothing
else from an optimizer library, so it takes no dependency for it. The gradients of a step are
summed by `reduce_gradients`, one `all_reduce` of the whole pytree with a variant's keywords
(never size-gated: the gradients are small here). `make_chunk` compiles `eval_every` steps as
one `lax.scan` inside `shard_map(check_vma=True)`, over replicated parameters made varying
before `jax.grad` (else grad returns the psum already), and measures each step's gradient error
and flushed share against the exact f32 sum; `step_bytes` counts the bytes a step sends, modelled
and compiled.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from .. import all_reduce, hlo_wire_bytes, wire_bytes

__all__ = ["AXIS", "TrainConfig", "adam_init", "adam_update", "char_windows", "flatten",
           "gradient_tell", "init_params", "loss_fn", "make_chunk", "reduce_gradients",
           "step_bytes", "variant_keywords"]

AXIS = "dp"


class TrainConfig:
    """The experiment's sizes (defaults: the stored run)."""

    def __init__(self, steps=300, seeds=3, batch=256, context=8, embed=10, hidden=64, lr=3e-3,
                 eval_every=25):
        self.steps, self.seeds, self.batch = steps, seeds, batch
        self.context, self.embed, self.hidden, self.lr = context, embed, hidden, lr
        self.eval_every = eval_every

    def as_dict(self) -> dict:
        return dict(vars(self))


# ---- data and model --------------------------------------------------------------------------


def char_windows(text: str, vocab: str, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Every position's previous `context` characters [n, context] (id 0 pads the start) and
    the character itself [n], as ids into `vocab` (id = 1 + index)."""
    ids = np.array([1 + vocab.index(c) for c in text], np.int32)
    padded = np.concatenate([np.zeros(context, np.int32), ids])
    idx = np.arange(len(ids))[:, None] + np.arange(context)[None, :]
    return padded[idx], ids


def init_params(key, vocab_size: int, context: int, embed: int, hidden: int) -> dict:
    """Embedding [V, E], tanh layer [C E, H], output [H, V]; ids include the pad (V = len + 1)."""
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "embed": jax.random.normal(k1, (vocab_size, embed)) * 0.5,
        "w1": jax.random.normal(k2, (context * embed, hidden)) / math.sqrt(context * embed),
        "b1": jnp.zeros(hidden),
        "w2": jax.random.normal(k3, (hidden, vocab_size)) / math.sqrt(hidden),
        "b2": jnp.zeros(vocab_size),
    }


def loss_fn(params: dict, ctx: jax.Array, target: jax.Array) -> jax.Array:
    """Mean cross-entropy (nats per character) of predicting `target` [B] from `ctx` [B, C]."""
    h = params["embed"][ctx].reshape(ctx.shape[0], -1)  # [B, C E]
    h = jnp.tanh(h @ params["w1"] + params["b1"])  # [B, H]
    logits = h @ params["w2"] + params["b2"]  # [B, V]
    picked = jnp.take_along_axis(logits, target[:, None], axis=1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked)


def adam_init(params) -> tuple:
    zeros = jax.tree.map(jnp.zeros_like, params)
    return zeros, zeros, jnp.zeros((), jnp.int32)


def adam_update(params, grads, state, lr: float, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam step (Kingma and Ba): bias-corrected moment estimates, per coordinate."""
    m, v, t = state
    t = t + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    c1, c2 = 1 - b1 ** t.astype(jnp.float32), 1 - b2 ** t.astype(jnp.float32)
    params = jax.tree.map(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps),
                          params, m, v)
    return params, (m, v, t)


# ---- the gradient AllReduce --------------------------------------------------------------


def variant_keywords(variant: dict) -> tuple[dict, bool]:
    """A variant's `all_reduce` keywords, and whether it rounds stochastically."""
    kw = dict(variant)
    sr = kw.pop("sr", False)
    if kw.get("fmt") is not None:
        kw.setdefault("min_bytes", 0)  # gradients are small here: never gate them
    return kw, sr


def reduce_gradients(grads, axis: str, variant: dict, key=None):
    """The sum over `axis` of a gradient pytree with one variant's collective: `all_reduce`
    of the whole pytree (one buffer), its derivative psum's."""
    kw, sr = variant_keywords(variant)
    return all_reduce(grads, axis, key=key if sr else None, **kw)


def gradient_tell(grads, axis: str) -> jax.Array:
    """|sum_i g_i| / sqrt(sum_i |g_i|^2) over the devices of `axis` (inside shard_map): about 1
    for independent per-device gradients, exactly sqrt(p) when they are p identical copies
    (the trap: gradients jax.grad already summed)."""
    sq = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads))
    total = lax.psum(grads, axis)
    num = sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(total))
    return jnp.sqrt(num / lax.psum(sq, axis))


def flatten(tree) -> jax.Array:
    return jnp.concatenate([x.reshape(-1).astype(jnp.float32) for x in jax.tree.leaves(tree)])


# ---- a chunk of steps, and its bytes ------------------------------------------------------


def make_chunk(mesh, variant: dict, cfg: TrainConfig, p: int):
    """jit(shard_map(scan of `eval_every` steps)) for one variant."""

    def body(params, state, ctx, tgt, key):
        def step(carry, batch):
            params, state = carry
            c, t, i = batch
            pv = lax.pcast(params, AXIS, to="varying")  # per-device gradients, not their psum
            loss, g = jax.value_and_grad(loss_fn)(pv, c, t)
            exact = flatten(lax.psum(g, AXIS))
            summed = reduce_gradients(g, AXIS, variant, jax.random.fold_in(key, i))
            got = flatten(summed)
            err = jnp.linalg.norm(got - exact) / jnp.linalg.norm(exact)
            live = exact != 0
            flushed = jnp.sum(live & (got == 0)) / jnp.maximum(jnp.sum(live), 1)
            grads = jax.tree.map(lambda s: s.astype(jnp.float32) / p, summed)
            params, state = adam_update(params, grads, state, cfg.lr)
            return (params, state), (lax.psum(loss, AXIS) / p, err, flushed)

        steps = jnp.arange(ctx.shape[0])
        (params, state), out = lax.scan(step, (params, state), (ctx, tgt, steps))
        return params, state, out

    data = P(None, AXIS)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), data, data, P()),
                                 out_specs=(P(), P(), P()), check_vma=True))


def step_bytes(variant: dict, n: int, p: int, mesh, params, check: bool) -> tuple[int, int | None]:
    """Bytes one device sends per step: the model (wire_bytes) and the compiled HLO."""
    kw, _ = variant_keywords(variant)
    fmt, algorithm = kw.get("fmt"), kw.get("algorithm", "ring")
    model = wire_bytes(n, p, fmt=fmt, algorithm=algorithm, dtype=kw.get("dtype", "float32"),
                       hop_bits=kw.get("hop_bits", "uniform"), min_bytes=kw.get("min_bytes", 0))
    if not check:
        return model, None
    stacked = jax.tree.map(lambda x: jax.ShapeDtypeStruct((p, *x.shape), x.dtype), params)
    f = jax.jit(jax.shard_map(
        lambda g: reduce_gradients(jax.tree.map(lambda x: x[0], g), AXIS, variant,
                                   jax.random.key(0)),
        mesh=mesh, in_specs=P(AXIS), out_specs=P(), check_vma=True))
    hlo = f.lower(stacked).compile().as_text()
    return model, int(sum(hlo_wire_bytes(hlo, p).values()))
