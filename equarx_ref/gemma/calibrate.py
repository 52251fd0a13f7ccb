"""Static int4 AllReduce on Gemma 3: calibrate on `CALIB_TEXT`, then score it like the others.

`equarx_ref.outliers` holds the method and the collective; this module feeds it the model:

    capture(params, ids, config, mesh)   [p, sites, tokens, D]: every device's partial sum at
                                         every AllReduce site (site = 2 * layer + kind), from
                                         an exact tensor-parallel run (`forward_with_partials`)
    calibrate(...)                       one `update_calibration` per sequence of the text
    static_collective(state, config, p)  the checked `StaticAllReduce` for this model and TP
    evaluate_static(...)                 the quality table (`quality.evaluate`) with the
                                         dynamic formats and the static ones side by side, bits
                                         per value and the bytes of one AllReduce (counted and
                                         read back from the compiled HLO), and per-feature
                                         ranges of a few sites (the outliers, for plotting)

Calibration and evaluation texts differ (`calibtext.CALIB_TEXT`, `evaltext.EVAL_TEXT`): ranges
fitted on the scored text would flatter the static format. Calibration cuts its text into
sequences of `seq` tokens (BOS first), one batch each, so the moving average sees the ranges of
`seq`-token stretches; the model is compiled once for that length.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .._checks import count
from ..formats import BYTE_LADDER, Format
from ..models.hlo import hlo_wire_bytes
from ..models.predict import wire_bytes
from ..outliers import (
    StaticAllReduce,
    check_calibration,
    init_calibration,
    static_wire_bytes,
    update_calibration,
)
from .model import SITES_PER_LAYER
from .parallel import forward_with_partials, shard_params

__all__ = ["PLOT_SITES", "SWEEP_OUTLIERS", "calibrate", "calibrate_text", "capture",
           "evaluate_static", "feature_ranges", "outlier_sweep", "sequences", "static_collective",
           "summary"]

#: Sites whose per-feature ranges `evaluate_static` stores: (layer, kind) pairs.
PLOT_SITES = ((0, "attn"), (0, "mlp"), (8, "mlp"), (17, "attn"), (17, "mlp"))
#: Outlier counts `outlier_sweep` tries (10 = 640 / 64, the paper's choice for Gemma 3 270M).
SWEEP_OUTLIERS = (0, 5, 10, 20, 40, 80, 160)
_KINDS = ("attn", "mlp")


def capture(params, ids, config, mesh) -> np.ndarray:
    """Every device's partial sum at every site for `ids` `[batch, seq]`, from an exact run.

    Returns `[p, 2 L, batch * seq, D]` float32, site `2 * layer + kind` (kind 0 attention)."""
    _, parts = forward_with_partials(params, np.asarray(ids, np.int32), config, mesh=mesh)
    both = np.stack([np.asarray(parts[k]) for k in _KINDS], axis=2)     # [p, L, 2, B, S, D]
    p, L, two, B, S, D = both.shape
    return both.reshape(p, L * two, B * S, D)


def sequences(ids, seq: int, bos: int | None = None) -> np.ndarray:
    """Cut token ids (BOS first) into `[n, seq]` sequences of equal length, each starting with
    `bos` (default: `ids[0]`); a shorter remainder is dropped."""
    ids = [int(i) for i in ids]
    seq = count(seq, "seq", minimum=2)
    bos = ids[0] if bos is None else bos
    body = ids[1:] if ids and ids[0] == bos else ids
    n = len(body) // (seq - 1)
    if n == 0:
        raise ValueError(f"{len(ids)} tokens do not make one sequence of {seq}")
    return np.asarray([[bos, *body[i * (seq - 1):(i + 1) * (seq - 1)]] for i in range(n)],
                      np.int32)


def calibrate(params, config, mesh, batches, *, momentum: float = 0.9,
              progress: bool = True) -> dict:
    """A calibration state from `batches` (`[n, seq]` ids: one moving-average step each)."""
    p = mesh.shape[mesh.axis_names[0]]
    placed = shard_params(params, config, mesh)
    state = init_calibration(SITES_PER_LAYER * config.num_layers, p, config.embed_dim,
                             momentum=momentum)
    from tqdm.auto import tqdm

    for row in tqdm(np.asarray(batches), desc="calibrating", unit="seq", leave=False,
                    disable=not progress):
        state = update_calibration(state, capture(placed, row[None], config, mesh))
    return state


def _setup(tp: int, progress: bool):
    from ..devices import make_mesh, setup_devices
    from .tokenizer import Tokenizer
    from .weights import load_gguf

    tp = count(tp, "tp")
    devices = setup_devices(max(tp, 8))
    config, params = load_gguf(progress=progress)
    return config, params, Tokenizer.from_gguf(), make_mesh(devices[:tp], ("tp",))


def calibrate_text(text: str | None = None, *, tp: int = 4, seq: int = 256,
                   momentum: float = 0.9, progress: bool = True) -> dict:
    """`calibrate` Gemma 3 270M's real weights on `text` (default `CALIB_TEXT`) at TP=`tp`."""
    from .calibtext import CALIB_TEXT

    config, params, tok, mesh = _setup(tp, progress)
    batches = sequences(tok.encode(CALIB_TEXT if text is None else text), seq)
    return calibrate(params, config, mesh, batches, momentum=momentum, progress=progress)


def static_collective(state: dict, config, tp: int, *, outliers: int | None = None,
                      algorithm: str = "one_shot") -> StaticAllReduce:
    """The `StaticAllReduce` of `state`, checked against `config` and `tp` (clear ValueError)."""
    check_calibration(state, sites=SITES_PER_LAYER * config.num_layers,
                      features=config.embed_dim, devices=tp)
    return StaticAllReduce.from_calibration(state, outliers=outliers, algorithm=algorithm)


def feature_ranges(state: dict, fmt=None, sites=PLOT_SITES) -> list[dict]:
    """Per-feature calibrated ranges of `sites` ((layer, kind) pairs), JSON-ready: each with
    `range` (sum over devices of hi - lo, per feature, 4 significant digits), its median and
    maximum, and the outlier features `fmt` (a `StaticFormat`) chose there. (Per-device
    ranges: `state["lo"][site, 0]`, `state["hi"][site, 0]`.)"""
    out = []
    for layer, kind in sites:
        s = SITES_PER_LAYER * layer + _KINDS.index(kind)
        lo, hi = state["lo"][s, 0], state["hi"][s, 0]                   # [p, D]
        spread = (hi - lo).sum(axis=0)
        r = lambda a: [float(f"{v:.4g}") for v in np.ravel(a)]  # noqa: E731
        out.append({"layer": layer, "kind": kind, "site": s, "range": r(spread),
                    "median_range": float(np.median(spread)), "max_range": float(spread.max()),
                    "outliers": [] if fmt is None else fmt.outliers[s].tolist()})
    return out


def _hlo_bytes(ar, tokens: int, d: int, mesh) -> float:
    """Bytes one device sends for one AllReduce of `[tokens, d]` f32, read from compiled HLO."""
    axis = mesh.axis_names[0]
    p = mesh.shape[axis]
    kw = {"site": 0} if getattr(ar, "takes_site", False) else {}
    f = jax.jit(jax.shard_map(lambda v: ar(v[0], axis, **kw)[None], mesh=mesh,
                              in_specs=P(axis), out_specs=P(axis), check_vma=True))
    x = jax.device_put(np.zeros((p, tokens, d), np.float32), NamedSharding(mesh, P(axis)))
    return sum(hlo_wire_bytes(f.lower(x).compile().as_text(), p).values())


def _wire(row: dict, ar, tokens: int, d: int, mesh) -> dict:
    p = mesh.shape[mesh.axis_names[0]]
    if isinstance(ar, StaticAllReduce):
        bits, sent = ar.fmt.bits_per_value, static_wire_bytes(tokens, p, ar.fmt, ar.algorithm)
    else:
        fmt = ar.fmt if isinstance(ar.fmt, Format) else None
        bits = 16.0 if fmt is None else fmt.bits_per_element
        sent = wire_bytes(tokens * d, p, fmt=fmt, algorithm=ar.algorithm, dtype="bfloat16")
    return {**row, "bits_per_value": bits, "bytes_per_device": int(sent),
            "hlo_bytes_per_device": _hlo_bytes(ar, tokens, d, mesh)}


def evaluate_static(text: str | None = None, *, tp: int = 4, max_tokens: int | None = None,
                    calibration: dict | None = None, seq: int = 256, momentum: float = 0.9,
                    outliers: int | None = None, progress: bool = True) -> dict:
    """The quality table of static int4 beside the dynamic formats, on Gemma 3 270M.

    Calibrates on `CALIB_TEXT` (unless `calibration` is given), then scores `text` (default
    `EVAL_TEXT`) with `quality.evaluate`: bf16, int8 and int4 (dynamic) through the ring and
    one-shot, and static int4 without and with `outliers` bf16 features (default E/64) through
    one-shot and the ring. Each row also gets `bits_per_value`, `bytes_per_device` (one
    AllReduce of the scored text's `[tokens, D]`, counted) and `hlo_bytes_per_device` (the
    same, read from the compiled program). `calibration` (the meta) and `ranges`
    (`feature_ranges`) are added to the report.
    """
    from .evaltext import EVAL_TEXT
    from .quality import collective, evaluate

    t0 = time.time()
    config, params, tok, mesh = _setup(tp, progress)
    if calibration is None:
        from .calibtext import CALIB_TEXT

        batches = sequences(tok.encode(CALIB_TEXT), seq)
        calibration = calibrate(params, config, mesh, batches, momentum=momentum,
                                progress=progress)
    statics = [static_collective(calibration, config, tp, outliers=k, algorithm=a)
               for k in (0, outliers) for a in ("one_shot", "ring")]
    if max_tokens is not None:
        max_tokens = count(max_tokens, "max_tokens", minimum=3)
    ids = tok.encode(EVAL_TEXT if text is None else text)[:max_tokens]
    algorithms, formats = ("ring", "one_shot"), BYTE_LADDER
    report = evaluate(params, config, ids, mesh, algorithms=algorithms, formats=formats,
                      extra=statics, progress=progress)
    runs = [collective(a, f) for a in algorithms for f in formats] + statics
    report["rows"] = [_wire(r, ar, len(ids), config.embed_dim, mesh)
                      for r, ar in zip(report["rows"], runs, strict=True)]
    fmt = statics[-1].fmt
    report["meta"]["text"] = "equarx_ref.gemma.evaltext.EVAL_TEXT" if text is None else "custom"
    report["calibration"] = {
        "text": "equarx_ref.gemma.calibtext.CALIB_TEXT", "seq": seq,
        "batches": int(calibration["batches"]), "tokens": int(calibration["tokens"]),
        "momentum": float(calibration["momentum"]), "sites": fmt.sites, "devices": fmt.devices,
        "features": fmt.features, "outliers": fmt.k,
        "outlier_features": fmt.outliers.tolist(),
        "range_ratio": [float(v) for v in _range_ratio(calibration)],
    }
    report["ranges"] = feature_ranges(calibration, fmt)
    report["outlier_sweep"] = outlier_sweep(params, config, mesh, ids, calibration)
    report["meta"]["seconds"] = round(time.time() - t0, 1)
    return report


def outlier_sweep(params, config, mesh, ids, state: dict, ks=SWEEP_OUTLIERS) -> list[dict]:
    """Bits per value against the AllReduce error, for `k` bf16 outlier features per site
    (one-shot): the relative error of every site on the exact run's partial sums of `ids`
    (`scoring.site_errors`), mean and max over the sites. No model rerun per k."""
    from .scoring import site_errors

    tp = mesh.shape[mesh.axis_names[0]]
    _, parts = forward_with_partials(shard_params(params, config, mesh),
                                     np.asarray([ids], np.int32), config, mesh=mesh)
    rows = []
    for k in ks:
        ar = static_collective(state, config, tp, outliers=k)
        err = np.concatenate([np.asarray(site_errors(parts[kind], mesh, ar, i))
                              for i, kind in enumerate(_KINDS)])
        rows.append({"outliers": int(k), "bits_per_value": ar.fmt.bits_per_value,
                     "site_err_mean": float(err.mean()), "site_err_max": float(err.max())})
    return rows


def summary(report: dict) -> str:
    """What `equarx-ref outliers` prints below the quality table: bits and bytes per row, the
    calibration, and the outlier sweep."""
    c = report["calibration"]
    w = max([26, *(len(r["label"]) + 2 for r in report["rows"])])
    lines = [f"calibration: {c['batches']} sequences of {c['seq']} tokens of {c['text']} "
             f"(moving average m = {c['momentum']:g}); {c['outliers']} bf16 outlier features "
             f"per site of {c['features']}; widest / median feature range per site: "
             f"{min(c['range_ratio']):.1f} to {max(c['range_ratio']):.1f}", "",
             f"{'run':<{w}}{'bits/value':>11}{'bytes/device':>14}{'HLO bytes':>12}"]
    for r in report["rows"]:
        lines.append(f"{r['label']:<{w}}{r['bits_per_value']:>11.4g}{r['bytes_per_device']:>14,}"
                     f"{r['hlo_bytes_per_device']:>12,.0f}")
    lines += ["", "bytes/device: one AllReduce of the scored text's [tokens, D] partial sums, "
              "counted; HLO bytes: read back from the compiled collective.", "",
              f"{'outliers k':>10}{'bits/value':>11}{'site err mean':>15}{'max':>9}"]
    lines += [f"{r['outliers']:>10}{r['bits_per_value']:>11.4g}{r['site_err_mean']:>15.2%}"
              f"{r['site_err_max']:>9.2%}" for r in report["outlier_sweep"]]
    return "\n".join(lines)


def _range_ratio(state: dict) -> np.ndarray:
    """Per site: the widest feature's range over the median feature's (how strong outliers are)."""
    spread = (state["hi"][:, 0] - state["lo"][:, 0]).sum(axis=1)           # [sites, D]
    return spread.max(axis=1) / np.median(spread, axis=1)
