"""Quantized gradients in data-parallel training: where DynamiQ's claim lives, measured small.

Data parallelism keeps one copy of the parameters on each of p devices, gives each a slice of
the batch, and sums the p gradients with an AllReduce before every optimizer step:

    g = (1/p) sum_i grad L(params; batch_i)          one AllReduce of all parameters a step

That AllReduce is the one DynamiQ (arXiv 2602.08923) compresses. Here it is `all_reduce` with a
wire format, on a character-level MLP language model of about 10k parameters (an embedding of
the last `context` characters, one tanh layer, a softmax over the characters), trained with Adam
on `gemma.calibtext.CALIB_TEXT` and validated on `gemma.evaltext.EVAL_TEXT`, the two texts the
package ships. Each step samples a batch i.i.d. from the training windows and shards it over the
p devices; every variant and seed runs the same batches from the same initial parameters
(paired seeds), so a difference in loss between two variants is the collective's doing, and
its standard error is that of the paired differences across seeds.

The step, inside `shard_map(check_vma=True)` over replicated parameters:

    pv = lax.pcast(params, axis, to="varying")       # without it, grad returns the psum already
    loss, g = value_and_grad(loss_fn)(pv, batch_i)   # this device's gradient (varying)
    g = all_reduce(g, axis, fmt=...) / p             # the pytree, one buffer, quantized
    params = adam(params, g)

Measured per variant: the change of final train and validation loss against the f32 psum
(paired, with standard errors), the relative error of the summed gradient against the exact f32
sum of the same per-device gradients, the share of coordinates whose exact sum is non-zero but
arrive as exactly 0 ("flushed"), and the bytes one device sends per step (`wire_bytes`, checked
against the compiled HLO of the gradient AllReduce).

This module is the command's driver: the variants, the sizes, the runs over seeds, the summary
and the hop table. The model, Adam and the step itself live in `train_steps.py`.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from .. import Format
from ..devices import make_mesh
from ..gemma.calibtext import CALIB_TEXT  # plain text: the model's own modules import cheaply
from ..gemma.evaltext import EVAL_TEXT
from .hopstats import hop_table
from .train_steps import (
    AXIS,
    TrainConfig,
    adam_init,
    adam_update,
    char_windows,
    flatten,
    gradient_tell,
    init_params,
    loss_fn,
    make_chunk,
    reduce_gradients,
    step_bytes,
    variant_keywords,
)

__all__ = ["BASELINE", "HOP_STEPS", "MAX_BATCH_BYTES", "VARIANTS", "TrainConfig", "adam_init",
           "adam_update", "baseline_gradients", "char_windows", "check_steps",
           "experiment_data", "gradient_tell", "hop_statistics", "hop_steps", "init_params",
           "loss_fn", "max_steps", "reduce_gradients", "seed_inputs", "summarize", "train"]

INT4 = Format.int4()
#: The variants: `all_reduce` keywords ("sr": stochastic rounding with a key per step).
VARIANTS: dict[str, dict] = {
    "f32 psum": {"fmt": None, "algorithm": "psum"},
    "bf16 ring": {"fmt": None, "algorithm": "ring", "dtype": "bfloat16"},
    "int8 ring": {"fmt": Format.int8()},
    "mxfp8 ring": {"fmt": Format.mxfp8()},
    "mxfp4 ring": {"fmt": Format.mxfp4()},
    "int4 ring": {"fmt": INT4},
    "int4 ring +sr": {"fmt": INT4, "sr": True},
    "int4 ring +rotate": {"fmt": INT4, "rotate": True},
    "int4 ring +adaptive": {"fmt": INT4, "hop_bits": "adaptive"},
    "int4 two_shot": {"fmt": INT4, "algorithm": "two_shot"},
    "int4 two_shot +rotate": {"fmt": INT4, "algorithm": "two_shot", "rotate": True},
}
BASELINE = "f32 psum"
#: Every step's batch is drawn up front ([steps, batch, context + 2] int32): a run whose batches
#: exceed this is refused before any work (`max_steps`).
MAX_BATCH_BYTES = 1 << 30
HOP_STEPS = (0, 100, 300)  # what `hop_statistics` tabulates, those within the run, and its last


# ---- the experiment ----------------------------------------------------------------------


def max_steps(cfg: TrainConfig) -> int:
    """The most steps whose batches fit in `MAX_BATCH_BYTES`, a multiple of `eval_every`."""
    per_step = cfg.batch * (cfg.context + 2) * 4
    return MAX_BATCH_BYTES // per_step // cfg.eval_every * cfg.eval_every


def check_steps(cfg: TrainConfig) -> None:
    """Refuse, before any work, a step count the run cannot honour (one line, ValueError)."""
    if cfg.steps < 1 or cfg.steps % cfg.eval_every:
        raise ValueError(f"steps ({cfg.steps}) must be a positive multiple of eval_every "
                         f"({cfg.eval_every})")
    if cfg.steps > max_steps(cfg):
        raise ValueError(f"steps must be at most {max_steps(cfg)} (every step's batch is drawn "
                         f"up front, within {MAX_BATCH_BYTES >> 20} MiB), got {cfg.steps}")


def hop_steps(cfg: TrainConfig, at=None) -> list[int]:
    """The steps the hop table holds: `at` (default `HOP_STEPS` within the run, and its last
    step), each checked to be a multiple of `eval_every` within [0, steps]."""
    if at is None:
        return sorted({s for s in HOP_STEPS if s <= cfg.steps} | {cfg.steps})
    at = sorted(set(at))
    bad = [s for s in at if type(s) is not int or not 0 <= s <= cfg.steps or s % cfg.eval_every]
    if bad or not at:
        raise ValueError(f"at must name steps that are multiples of {cfg.eval_every} within "
                         f"[0, {cfg.steps}] (the run's steps), got {bad or 'none'}")
    return at


def experiment_data(cfg: TrainConfig) -> dict:
    """The windows of both texts, the vocabulary size, the parameter shapes and count."""
    train_text, val_text = CALIB_TEXT, EVAL_TEXT
    vocab = "".join(sorted(set(train_text) | set(val_text)))
    shapes = jax.eval_shape(lambda: init_params(jax.random.key(0), len(vocab) + 1, cfg.context,
                                                cfg.embed, cfg.hidden))
    return {"train": char_windows(train_text, vocab, cfg.context),
            "val": char_windows(val_text, vocab, cfg.context), "vocab_size": len(vocab) + 1,
            "shapes": shapes, "parameters": int(sum(x.size for x in jax.tree.leaves(shapes)))}


def seed_inputs(cfg: TrainConfig, seed: int, data: dict):
    """Seed `seed`'s initial parameters, Adam state and batches [steps, batch, ...]: the same
    for every variant (paired seeds)."""
    key = jax.random.key(seed)
    params = init_params(jax.random.fold_in(key, 1), data["vocab_size"], cfg.context, cfg.embed,
                         cfg.hidden)
    picks = jax.random.randint(jax.random.fold_in(key, 2), (cfg.steps, cfg.batch), 0,
                               len(data["train"][1]))
    ctx, tgt = (jnp.asarray(a)[picks] for a in data["train"])
    return params, adam_init(params), ctx, tgt


def baseline_gradients(config: TrainConfig | None = None, *, at=None, seed: int = 0,
                       devices=None):
    """Yield (step, per-device gradients [p, n] float64) of the f32 baseline's run of seed
    `seed` just before the steps `at` (multiples of `eval_every` within the run, `hop_steps`;
    `steps` is after the last)."""
    cfg = config or TrainConfig()
    check_steps(cfg)
    at = hop_steps(cfg, at)
    devices = list(devices if devices is not None else jax.devices())
    p = len(devices)
    data = experiment_data(cfg)
    params, state, ctx, tgt = seed_inputs(cfg, seed, data)
    chunk = make_chunk(make_mesh(devices, (AXIS,)), VARIANTS[BASELINE], cfg, p)
    per_device = jax.jit(jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0)))
    key = jax.random.key(seed)
    for c in range(cfg.steps // cfg.eval_every + 1):
        step = c * cfg.eval_every
        if step in at:
            i = min(step, cfg.steps - 1)  # after the last step: the last batch again
            g = per_device(params, ctx[i].reshape(p, -1, cfg.context), tgt[i].reshape(p, -1))
            yield step, np.stack([np.asarray(flatten(jax.tree.map(lambda x, d=d: x[d], g)),
                                             np.float64) for d in range(p)])
        if step < cfg.steps:
            sl = slice(step, step + cfg.eval_every)
            params, state, _ = chunk(params, state, ctx[sl], tgt[sl],
                                     jax.random.fold_in(key, 3 + c))


def train(variants: list[str] | None = None, *, config: TrainConfig | None = None,
          devices=None, check_bytes: bool = True, progress=None) -> dict:
    """Run every variant on every seed; return the JSON-able report (see `summarize`).

    `check_bytes`: also compile each variant's gradient AllReduce alone and count the bytes
    its HLO sends (`hlo_wire_bytes`, stored beside `wire_bytes`); a few seconds a variant.
    """
    cfg = config or TrainConfig()
    names = list(VARIANTS) if variants is None else list(dict.fromkeys(variants))
    for name in names:
        if name not in VARIANTS:
            raise ValueError(f"unknown variant {name!r}; choose from {list(VARIANTS)}")
    if BASELINE not in names:
        names.insert(0, BASELINE)
    check_steps(cfg)
    devices = list(devices if devices is not None else jax.devices())
    p = len(devices)
    if cfg.batch % p:
        raise ValueError(f"batch ({cfg.batch}) must be a multiple of the devices ({p})")
    mesh = make_mesh(devices, (AXIS,))
    data = experiment_data(cfg)
    tr, va = data["train"], data["val"]
    full_loss = jax.jit(loss_fn)
    n = data["parameters"]
    rows, t0 = {}, time.perf_counter()
    for name in names:
        chunk = make_chunk(mesh, VARIANTS[name], cfg, p)
        model_bytes, hlo_bytes = step_bytes(VARIANTS[name], n, p, mesh, data["shapes"], check_bytes)
        runs = []
        for seed in range(cfg.seeds):
            key = jax.random.key(seed)
            params, state, ctx, tgt = seed_inputs(cfg, seed, data)
            curve, losses, errs, flushed = [], [], [], []
            for c in range(cfg.steps // cfg.eval_every):
                sl = slice(c * cfg.eval_every, (c + 1) * cfg.eval_every)
                params, state, (lo, er, fl) = chunk(params, state, ctx[sl], tgt[sl],
                                                    jax.random.fold_in(key, 3 + c))
                losses.append(np.asarray(lo))
                errs.append(np.asarray(er))
                flushed.append(np.asarray(fl))
                curve.append(float(full_loss(params, va[0], va[1])))
            runs.append({
                "seed": seed, "val_curve": curve,
                "train_curve": [float(np.mean(x)) for x in losses],
                "train_loss": float(full_loss(params, tr[0], tr[1])), "val_loss": curve[-1],
                "grad_rel_error": float(np.mean(np.concatenate(errs))),
                "flushed_share": float(np.mean(np.concatenate(flushed))),
            })
            if progress:
                progress(f"{name} seed {seed}: val {curve[-1]:.4f} "
                         f"({time.perf_counter() - t0:.0f} s)")
        kw, _ = variant_keywords(VARIANTS[name])
        fmt = kw.get("fmt")
        rows[name] = {"bits": fmt.bits_per_element if fmt is not None else
                      8.0 * jnp.dtype(kw.get("dtype", "float32")).itemsize,
                      "wire_bytes": model_bytes, "hlo_wire_bytes": hlo_bytes, "runs": runs}
    return summarize({"config": {**cfg.as_dict(), "devices": p, "parameters": n,
                                 "vocab": data["vocab_size"], "train_chars": len(tr[1]),
                                 "val_chars": len(va[1])},
                      "variants": rows, "seconds": round(time.perf_counter() - t0, 1)})


def _rank(v: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(v)).astype(float)


def summarize(report: dict) -> dict:
    """Add to each variant the paired differences against the baseline (mean, standard error)
    and means over seeds; and the rank correlations of the validation gap with the flushed
    share and with the gradient error across the quantized variants."""
    base = report["variants"][BASELINE]["runs"]
    for row in report["variants"].values():
        for what in ("train_loss", "val_loss"):
            d = np.array([r[what] - b[what] for r, b in zip(row["runs"], base, strict=True)])
            row[f"delta_{what}"] = float(d.mean())
            row[f"delta_{what}_se"] = float(d.std(ddof=1) / math.sqrt(len(d))) \
                if len(d) > 1 else None  # one seed: no standard error (JSON null, not NaN)
        for what in ("val_loss", "grad_rel_error", "flushed_share"):
            row[what] = float(np.mean([r[what] for r in row["runs"]]))
    quantized = [v for k, v in report["variants"].items() if k != BASELINE]
    if len(quantized) > 2:
        gap = _rank(np.array([v["delta_val_loss"] for v in quantized]))
        report["rank_correlation"] = {
            what: float(np.corrcoef(gap, _rank(np.array([v[what] for v in quantized])))[0, 1])
            for what in ("flushed_share", "grad_rel_error")}
    return report


def hop_statistics(config: TrainConfig | None = None, *, at=None, seed: int = 0,
                   fmt: Format | None = None, devices=None) -> dict:
    """Train the f32 baseline (seed `seed`) and tabulate `hopstats.hop_table` of its per-device
    gradients at the steps `at` (`hop_steps`; a step beyond the run is refused): the partial
    sums a ring quantizes, hop by hop."""
    fmt = fmt or INT4
    cfg = config or TrainConfig()
    at = hop_steps(cfg, at)
    devices = list(devices if devices is not None else jax.devices())
    steps = {str(step): hop_table(grads, fmt)
             for step, grads in baseline_gradients(cfg, at=at, seed=seed, devices=devices)}
    return {"format": str(fmt), "devices": len(devices), "at": list(at), "seed": seed,
            "steps": steps}
