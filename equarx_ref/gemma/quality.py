"""Quality of quantized tensor-parallel communication, measured on Gemma 3 270M's real weights.

Run the same text through the model twice under tensor parallelism: once with exact AllReduces
(`lax.psum` in float32) and once with a lossy `all_reduce` at the two reduction sites of every
layer. Everything else is identical, so any change in the output is the communication's fault.
Per token `t`, with `p` the exact and `q` the quantized next-token distribution:

    NLL_t     = -log q(x_{t+1})                 dNLL = mean_t NLL_t(q) - mean_t NLL_t(p)
    KL_t      = sum_v p_v (log p_v - log q_v)   (how far the whole distribution moved)
    top-1     = [argmax p == argmax q]          (agreement, in %)

and, to see the error where it is made, the relative error of each AllReduce site on the *same*
inputs (the partial sums the exact run produced): `||AR_q(parts) - sum(parts)|| / ||sum(parts)||`.

The bf16 rows (`fmt=None` on partial sums cast to bfloat16, the baseline EQuARX is compared with)
are the noise floor: top-1 already flips wherever the two best tokens are nearly tied, so int8
should be judged beside them, not against 100 %.
"""

from __future__ import annotations

import dataclasses
import math
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from .parallel import forward, forward_with_partials, shard_params

__all__ = [
    "ALGORITHMS",
    "FORMATS",
    "LossyAllReduce",
    "evaluate",
    "evaluate_text",
    "format_table",
    "plot_report",
    "token_scores",
]

ALGORITHMS = ("psum", "ring", "bidir_ring", "two_shot", "one_shot")
FORMATS = ("bf16", "int8", "int4", "fp8_e4m3")


@dataclasses.dataclass(frozen=True)
class LossyAllReduce:
    """`(x, axis_name) -> x`: `eq.all_reduce` with `algorithm` and wire format `fmt`.

    `fmt="bf16"` casts the float32 partial sums to bfloat16 and reduces them unquantized
    (`fmt=None`), the baseline; other names are `eq.Format` constructors ("int8", "int4",
    "fp8_e4m3"). Hashable by value, so equal instances share one compiled forward.
    """

    algorithm: str = "ring"
    fmt: str = "int8"

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; known: {ALGORITHMS}")
        if self.fmt not in FORMATS:
            raise ValueError(f"unknown format {self.fmt!r}; known: {FORMATS}")
        if self.algorithm == "psum" and self.fmt != "bf16":
            raise ValueError("psum is lax.psum: it only runs unquantized (fmt='bf16')")

    @property
    def label(self) -> str:
        """Row label, e.g. 'ring int8'; a bf16 psum is marked as running in f32 on XLA:CPU."""
        note = " (CPU: f32)" if self.algorithm == "psum" and jax.default_backend() == "cpu" \
            else ""
        return f"{self.algorithm} {self.fmt}{note}"

    def __call__(self, x, axis_name):
        from .. import collectives, formats

        if self.fmt == "bf16":
            y = collectives.all_reduce(x.astype(jnp.bfloat16), axis_name, fmt=None,
                                       algorithm=self.algorithm)
            return y.astype(x.dtype)
        fmt = getattr(formats.Format, self.fmt)()
        return collectives.all_reduce(x, axis_name, fmt=fmt, algorithm=self.algorithm)


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
def _sharded_scores(logits, ids, logp_exact, mesh, with_kl):
    """NLL, top-1 and (optionally) KL from vocabulary-sharded logits, without gathering them.

    Each device holds `[1, S, V/p]`; only per-token numbers cross devices (a max, a sum, the
    target's logit, the argmax candidate), so the 1 GB of logits never moves.
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


@partial(jax.jit, static_argnames=("mesh", "all_reduce"))
def site_errors(parts, mesh, all_reduce):
    """Relative error `||AR(parts) - sum(parts)|| / ||sum(parts)||` per layer, for the partial
    sums `[p, L, batch, seq, D]` that `forward_with_partials` recorded. Returns `[L]` (f32)."""
    axis = mesh.axis_names[0]

    def body(local):                                                     # [1, L, B, S, D]
        def one(_, x):
            exact = lax.psum(x, axis)
            err = jnp.linalg.norm((all_reduce(x, axis) - exact).ravel())
            return None, err / jnp.linalg.norm(exact.ravel())
        return lax.scan(one, None, local[0])[1]                          # [L]
    return jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(), check_vma=True)(parts)


def evaluate(params, config, ids, mesh, *, algorithms=ALGORITHMS, formats=FORMATS,
             progress=True) -> dict:
    """Score every algorithm x format against the exact tensor-parallel run.

    Args:
        params: Gemma weights (`load_gguf`'s second value, or `shard_params`'s placed copy).
        config: their `Gemma3Config`.
        ids: token ids (BOS first), a list or a `[seq]` array.
        mesh: a 1-D mesh (the tensor-parallel axis).
        algorithms, formats: what to run; "psum" runs with "bf16" only.
        progress: show a progress bar (tqdm) on stderr.

    Returns:
        A JSON-ready dict: `meta` (tokens, tp size, exact mean NLL and perplexity, seconds) and
        `rows`, one per run: algorithm, format, label, mean_nll, ppl, dnll, kl_mean, kl_max,
        top1 (% agreement with the exact run), site_err_attn / site_err_mlp (per layer) and their
        means.
    """
    t0 = time.time()
    ids = np.asarray(ids, dtype=np.int32).reshape(1, -1)
    if ids.shape[1] < 2:
        raise ValueError("need at least 2 tokens to score next-token predictions")
    runs = [LossyAllReduce(a, f) for a in algorithms for f in formats
            if not (a == "psum" and f != "bf16")]
    if not runs:
        raise ValueError(f"nothing to run for algorithms={algorithms}, formats={formats}")
    placed = shard_params(params, config, mesh)
    bar = _bar(len(runs) + 1, progress)
    bar.set_description("exact (psum f32)")
    ids_dev = jax.device_put(ids, jax.sharding.NamedSharding(mesh, P()))
    logits, parts = forward_with_partials(placed, ids, config, mesh=mesh)
    nll_e, top1_e, logp_e = _sharded_scores(logits, ids_dev, None, mesh, False)
    del logits
    nll_e, top1_e = np.asarray(nll_e), np.asarray(top1_e)
    bar.update()
    rows = []
    for ar in runs:
        bar.set_description(ar.label)
        logits = forward(placed, ids, config, mesh=mesh, all_reduce=ar)
        nll, top1, kl = (np.asarray(a) for a in _sharded_scores(logits, ids_dev, logp_e, mesh,
                                                                 True))
        del logits
        err = {k: np.asarray(site_errors(v, mesh, ar)) for k, v in parts.items()}
        rows.append({
            "algorithm": ar.algorithm, "format": ar.fmt, "label": ar.label,
            "mean_nll": float(nll.mean()), "ppl": float(math.exp(nll.mean())),
            "dnll": float(nll.mean() - nll_e.mean()),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1": float((top1 == top1_e).mean() * 100),
            "site_err_attn": err["attn"].tolist(), "site_err_mlp": err["mlp"].tolist(),
            "site_err_attn_mean": float(err["attn"].mean()),
            "site_err_mlp_mean": float(err["mlp"].mean()),
        })
        bar.update()
    bar.close()
    p = mesh.shape[mesh.axis_names[0]]
    return {"meta": {"model": f"Gemma 3 {config.name}", "tokens": int(ids.shape[1]),
                     "scored": int(ids.shape[1] - 1), "tp": int(p),
                     "exact_mean_nll": float(nll_e.mean()),
                     "exact_ppl": float(math.exp(nll_e.mean())),
                     "seconds": round(time.time() - t0, 1)},
            "rows": rows}


def evaluate_text(text: str | None = None, *, tp: int = 4, max_tokens: int | None = None,
                  algorithms=ALGORITHMS, formats=FORMATS, progress=True) -> dict:
    """`evaluate` on Gemma 3 270M's real weights over `text` (default: `EVAL_TEXT`), TP=`tp`.

    Sets up `max(tp, 8)` devices (simulated CPU devices when there are no accelerators), loads
    the packaged GGUF and its tokenizer, and keeps the first `max_tokens` tokens if given.
    """
    from ..devices import make_mesh, setup_devices
    from .evaltext import EVAL_TEXT
    from .tokenizer import Tokenizer
    from .weights import load_gguf

    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    devices = setup_devices(max(tp, 8))
    config, params = load_gguf(progress=progress)
    ids = Tokenizer.from_gguf().encode(EVAL_TEXT if text is None else text)
    if max_tokens is not None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
        ids = ids[:max_tokens]
    report = evaluate(params, config, ids, make_mesh(devices[:tp], ("tp",)),
                      algorithms=algorithms, formats=formats, progress=progress)
    report["meta"]["text"] = "equarx_ref.gemma.evaltext.EVAL_TEXT" if text is None else "custom"
    return report


def format_table(report: dict) -> str:
    """The report as a fixed-width text table."""
    m = report["meta"]
    head = (f"{m['model']}, TP={m['tp']}, {m['scored']} scored tokens; exact run (psum f32): "
            f"mean NLL {m['exact_mean_nll']:.4f}, perplexity {m['exact_ppl']:.3f}")
    cols = f"{'run':<26}{'NLL':>8}{'ppl':>9}{'dNLL':>10}{'KL mean':>10}{'top-1 %':>9}" \
           f"{'err attn':>10}{'err mlp':>10}"
    lines = [head, "", cols, "-" * len(cols)]
    for r in report["rows"]:
        lines.append(f"{r['label']:<26}{r['mean_nll']:>8.4f}{r['ppl']:>9.3f}{r['dnll']:>+10.4f}"
                     f"{r['kl_mean']:>10.2e}{r['top1']:>9.2f}{r['site_err_attn_mean']:>10.2e}"
                     f"{r['site_err_mlp_mean']:>10.2e}")
    lines.append("")
    lines.append("dNLL, KL, top-1: against the exact run; err: ||AR(parts) - sum|| / ||sum|| per "
                 "site on the exact run's partial sums, mean over layers.")
    return "\n".join(lines)


def plot_report(report: dict, path=None):
    """Bar charts of dNLL and top-1 agreement per run, and site error per layer (matplotlib).

    Returns the figure; saves it to `path` if given.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = report["rows"]
    labels = [r["label"].replace(" (CPU: f32)", "*") for r in rows]
    colors = {"bf16": "tab:gray", "int8": "tab:blue", "int4": "tab:red", "fp8_e4m3": "tab:green"}
    c = [colors.get(r["format"], "k") for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    ax[0].barh(labels, [abs(r["dnll"]) for r in rows], color=c)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("|dNLL| (nats per token)")
    ax[0].invert_yaxis()
    ax[1].barh(labels, [r["top1"] for r in rows], color=c)
    ax[1].set_xlim(min(50, min(r["top1"] for r in rows)), 100)
    ax[1].set_xlabel("top-1 agreement with exact run (%)")
    ax[1].invert_yaxis()
    ax[1].set_yticklabels([])
    for r, col in zip(rows, c, strict=True):
        ax[2].semilogy(r["site_err_mlp"], color=col, alpha=0.6,
                       label=r["format"] if r["algorithm"] == "ring" else None)
    ax[2].set_xlabel("layer")
    ax[2].set_ylabel("relative error after down_proj")
    ax[2].legend()
    m = report["meta"]
    fig.suptitle(f"{m['model']}, TP={m['tp']}, {m['scored']} tokens: quantized AllReduce quality")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _bar(total, enabled):
    if enabled:
        try:
            from tqdm.auto import tqdm
            return tqdm(total=total, unit="run", leave=False)
        except ImportError:
            pass

    class _Null:
        def update(self, *a):
            pass

        def set_description(self, *a):
            pass

        def close(self):
            pass
    return _Null()
