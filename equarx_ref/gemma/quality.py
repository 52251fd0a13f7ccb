"""Quality of quantized tensor-parallel communication, measured on Gemma 3's real weights.

Run the same text through the model twice under tensor parallelism: once with exact AllReduces
(`lax.psum` in float32) and once with a lossy `all_reduce` at the two reduction sites of every
layer. Everything else is identical, so any change in the output is the communication's fault.
Over the `T` scored tokens, with `d_t = NLL_t(run) - NLL_t(exact)` (see `scoring.py`):

    dNLL = mean_t d_t          SE(dNLL) = std_t(d_t) / sqrt(T)      (paired: same tokens)
    KL   = mean_t KL_t         top-1 = % of tokens whose argmax is the exact run's

A run whose |dNLL| is under 2 SE is *within noise*: on this text its effect on the loss cannot be
told from zero. The SE treats tokens as independent; neighbouring tokens are correlated, so the
true uncertainty is somewhat larger, never smaller. KL and top-1 are judged beside the bf16 rows
(partial sums rounded to bfloat16 and reduced unquantized, the baseline EQuARX compares with):
top-1 flips wherever the two best tokens are nearly tied, so full agreement is not the bar.

Both runs pin every matmul to `precision` (HIGHEST by default, `model.py`), and the report
records it: on a GPU or TPU the backend's own default would make the "exact" run another model.

To see the error where it is made, each row also gives the relative error of every AllReduce site
on the *same* inputs, the partial sums the exact run produced (`scoring.site_errors`).
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .._checks import count
from ..collectives import AllReduce, all_reduce
from ..formats import COMPARED_FORMATS, Format, format_label, parse_format
from ..schedule import ALGORITHMS
from .model import HIGHEST, check_precision
from .parallel import forward, forward_with_partials, shard_params
from .scoring import sharded_scores, site_errors

__all__ = ["DEFAULT_FORMATS", "Bf16AllReduce", "collective", "evaluate", "evaluate_text"]

_KIND = {"attn": 0, "mlp": 1}  # site = 2 * layer + kind (model.py)

#: What `evaluate` compares by default: the bf16 baseline and three wire formats.
DEFAULT_FORMATS = COMPARED_FORMATS


@dataclasses.dataclass(frozen=True)
class Bf16AllReduce:
    """The baseline: partial sums rounded to bfloat16, reduced by `algorithm` unquantized.

    `eq.AllReduce(fmt=None)` sends x in its own dtype, float32 here; a bf16 deployment sends
    bfloat16, so this casts first and casts the sum back. Frozen and hashable like `AllReduce`.
    """

    algorithm: str = "ring"

    def __post_init__(self):
        AllReduce(fmt=None, algorithm=self.algorithm)           # the same checks

    @property
    def fmt(self) -> None:
        """Nothing is quantized (tables name it "bf16")."""
        return None

    def __call__(self, x: jax.Array, axis_name) -> jax.Array:
        y = all_reduce(x.astype(jnp.bfloat16), axis_name, fmt=None, algorithm=self.algorithm)
        return y.astype(x.dtype)

    def __str__(self) -> str:
        return f"{self.algorithm} {format_label(None)}"


def collective(algorithm: str, fmt: Format | str | None) -> AllReduce | Bf16AllReduce:
    """The collective of one report row: `eq.AllReduce`, or the bf16 baseline for "bf16"/None."""
    fmt = parse_format(fmt) if isinstance(fmt, str) else fmt
    return Bf16AllReduce(algorithm) if fmt is None else AllReduce(fmt=fmt, algorithm=algorithm)


def _label(ar, mesh) -> str:
    """The row's name; a psum on CPU devices (the mesh's, whatever the default backend) is
    labelled "CPU: f32": XLA:CPU sums bf16 in f32."""
    cpu = ar.algorithm == "psum" and mesh.devices.flat[0].platform == "cpu"
    return f"{ar}{' (CPU: f32)' if cpu else ''}"


def _row(ar, mesh, nll, top1, kl, nll_e, top1_e, err) -> dict:
    d = nll.astype(np.float64) - nll_e                          # paired, per token
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    dnll = float(d.mean())
    fmt = format_label(ar.fmt) if ar.fmt is None or isinstance(ar.fmt, Format) else str(ar.fmt)
    return {
        "algorithm": ar.algorithm, "format": fmt,
        "label": _label(ar, mesh),
        "mean_nll": float(nll.mean()), "ppl": float(math.exp(nll.mean())),
        "dnll": dnll, "dnll_se": se, "within_noise": bool(abs(dnll) < 2 * se),
        "kl_mean": float(kl.mean()), "kl_se": float(kl.std(ddof=1) / math.sqrt(kl.size)),
        "kl_max": float(kl.max()),
        "top1": float((top1 == top1_e).mean() * 100),
        "site_err_attn": err["attn"].tolist(), "site_err_mlp": err["mlp"].tolist(),
        "site_err_attn_mean": float(err["attn"].mean()),
        "site_err_mlp_mean": float(err["mlp"].mean()),
    }


class _Quiet:
    """A progress bar that shows nothing (what `evaluate` uses with progress=False)."""

    def set_description(self, _text):
        pass

    def update(self):
        pass

    def close(self):
        pass


def evaluate(params, config, ids, mesh, *, algorithms=ALGORITHMS, formats=DEFAULT_FORMATS,
             extra=(), progress=True, precision=HIGHEST) -> dict:
    """Score every algorithm x format against the exact tensor-parallel run.

    Args:
        params: Gemma weights (`load_gguf`'s second value, or `shard_params`'s placed copy).
        config: their `Gemma3Config`.
        ids: token ids (BOS first), a list or a `[seq]` array, at least 3 (2 scored).
        mesh: a 1-D mesh (the tensor-parallel axis).
        algorithms: names from `eq.ALGORITHMS`; "psum" runs with "bf16" only.
        formats: names `eq.parse_format` reads ("bf16", "int8", "int4/b16", ...) or `Format`s.
        extra: more collectives to score after those, each hashable with `algorithm` and `fmt`
            attributes (its row's format is `str(fmt)` when fmt is not a `Format`), e.g.
            `equarx_ref.outliers.StaticAllReduce`.
        progress: show a progress bar (tqdm) on stderr.
        precision: of every matmul of every run (`forward`'s; default HIGHEST).

    Returns:
        A JSON-ready dict. `meta`: model, tokens, scored (= tokens - 1), tp, precision (the
        matmuls', e.g. "highest"), exact_mean_nll, exact_ppl, seconds. `rows`, one per run,
        each with: algorithm, format (its `eq.format_label`), label (row name, e.g. "ring
        int8"), mean_nll, ppl, dnll (nats per token, against the exact run), dnll_se (paired
        standard error), within_noise (|dnll| < 2 dnll_se), kl_mean, kl_se, kl_max, top1 (%
        agreement with the exact run), site_err_attn / site_err_mlp (relative error per
        layer) and their means.
    """
    t0 = time.time()
    ids = np.asarray(ids, dtype=np.int32).reshape(1, -1)
    if ids.shape[1] < 3:
        raise ValueError(f"need at least 3 tokens (2 scored) for a standard error, got "
                         f"{ids.shape[1]}")
    precision = check_precision(precision)
    fmts = [parse_format(f) if isinstance(f, str) else f for f in formats]
    runs = [collective(a, f) for a in algorithms for f in fmts
            if not (a == "psum" and f is not None)] + list(extra)
    if not runs:
        raise ValueError(f"nothing to run for algorithms={algorithms}, formats={formats}")
    placed = shard_params(params, config, mesh)
    if progress:  # tqdm comes with the gemma extra; a quiet run needs none
        from tqdm.auto import tqdm

        bar = tqdm(total=len(runs) + 1, unit="run", leave=False)
    else:
        bar = _Quiet()
    bar.set_description("exact (psum f32)")
    ids_dev = jax.device_put(ids, NamedSharding(mesh, P()))
    logits, parts = forward_with_partials(placed, ids, config, mesh=mesh, precision=precision)
    nll_e, top1_e, logp_e = sharded_scores(logits, ids_dev, None, mesh, False)
    del logits
    nll_e, top1_e = np.asarray(nll_e, np.float64), np.asarray(top1_e)
    bar.update()
    rows = []
    for ar in runs:
        bar.set_description(_label(ar, mesh))
        logits = forward(placed, ids, config, mesh=mesh, all_reduce=ar, precision=precision)
        nll, top1, kl = (np.asarray(a) for a in sharded_scores(logits, ids_dev, logp_e, mesh,
                                                                True))
        del logits
        err = {k: np.asarray(site_errors(v, mesh, ar, _KIND[k])) for k, v in parts.items()}
        rows.append(_row(ar, mesh, nll, top1, kl, nll_e, top1_e, err))
        bar.update()
    bar.close()
    return {"meta": {"model": f"Gemma 3 {config.name}", "tokens": int(ids.shape[1]),
                     "scored": int(ids.shape[1] - 1), "tp": int(mesh.shape[mesh.axis_names[0]]),
                     "precision": precision.name.lower(),
                     "exact_mean_nll": float(nll_e.mean()),
                     "exact_ppl": float(math.exp(nll_e.mean())),
                     "seconds": round(time.time() - t0, 1)},
            "rows": rows}


def evaluate_text(text: str | None = None, *, tp: int = 4, max_tokens: int | None = None,
                  algorithms=ALGORITHMS, formats=DEFAULT_FORMATS, progress=True,
                  precision=HIGHEST) -> dict:
    """`evaluate` on Gemma 3 270M's real weights over `text` (default: `EVAL_TEXT`), TP=`tp`.

    Sets up `max(tp, 8)` devices (simulated CPU devices when there are no accelerators), loads
    the packaged GGUF and its tokenizer, and keeps the first `max_tokens` tokens if given.
    `meta` also says which `text` was scored.
    """
    from ..devices import make_mesh, setup_devices
    from .evaltext import EVAL_TEXT
    from .tokenizer import Tokenizer
    from .weights import load_gguf

    tp = count(tp, "tp")
    if max_tokens is not None:
        max_tokens = count(max_tokens, "max_tokens", minimum=3)
    devices = setup_devices(max(tp, 8))
    config, params = load_gguf(progress=progress)
    ids = Tokenizer.from_gguf().encode(EVAL_TEXT if text is None else text)[:max_tokens]
    report = evaluate(params, config, ids, make_mesh(devices[:tp], ("tp",)),
                      algorithms=algorithms, formats=formats, progress=progress,
                      precision=precision)
    report["meta"]["text"] = "equarx_ref.gemma.evaltext.EVAL_TEXT" if text is None else "custom"
    return report
