"""Figures for the Gemma chapter: the tensor-parallel layout, the size of its AllReduces, and
the quality report.

`draw_tp_layout` draws one decoder block as `p` device columns: what slice of each weight a
device holds, and the two places where the columns must meet (the AllReduces after `o_proj` and
after `down_proj`, before the post-norms). `plot_allreduce_sizes` shows how big those messages
are for the published models: `tokens * D` values each, `2 L` of them per forward.
`plot_report` draws what `quality.evaluate` measured: dNLL with its noise, top-1 agreement, and
the AllReduce error layer by layer.
"""

from __future__ import annotations

from ..formats import UNQUANTIZED
from .config import PRESETS, Gemma3Config
from .parallel import tp_size_error

__all__ = ["draw_tp_layout", "plot_allreduce_sizes", "plot_report"]


def _ranges(n: int, p: int, d: int) -> str:
    k = n // p
    return f"{d * k}" if k == 1 else f"{d * k}-{(d + 1) * k - 1}"


def draw_tp_layout(config: Gemma3Config, p: int = 4, ax=None):
    """Draw one block of `config` split over `p` devices; returns the matplotlib Axes.

    Raises:
        ValueError: `config` cannot be split over `p` devices.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    if (why := tp_size_error(config, p)) is not None:
        raise ValueError(why)
    c = config
    if ax is None:
        _, ax = plt.subplots(figsize=(2.6 * p + 2.5, 7.2))
    N, K, F, V = c.num_heads, c.num_kv_heads, c.hidden_dim, c.vocab_size
    kv = [f"kv heads {_ranges(K, p, d)}" if K % p == 0 else
          f"kv head {(d * (N // p)) // (N // K)} (copy)" for d in range(p)]
    rows = [  # (label, per-device text, colour)
        ("embedding\n(vocab-parallel)", lambda d: f"rows {_ranges(V, p, d)}", "#dde5f0"),
        ("pre-attn norm", lambda d: "replicated", "#eeeeee"),
        ("q, k, v\n(column-parallel)", lambda d: f"q heads {_ranges(N, p, d)}\n{kv[d]}",
         "#cfe3cf"),
        ("attention", lambda d: f"{N // p} head(s), local", "#cfe3cf"),
        ("o_proj\n(row-parallel)", lambda d: f"rows of heads {_ranges(N, p, d)}\n-> partial sum",
         "#cfe3cf"),
        ("AR", None, "#f4b183"),
        ("post-attn norm, +x,\npre-ffw norm", lambda d: "replicated", "#eeeeee"),
        ("gate, up\n(column-parallel)", lambda d: f"columns {_ranges(F, p, d)}", "#d9d2e9"),
        ("down_proj\n(row-parallel)", lambda d: f"rows {_ranges(F, p, d)}\n-> partial sum",
         "#d9d2e9"),
        ("AR", None, "#f4b183"),
        ("post-ffw norm, +x", lambda d: "replicated", "#eeeeee"),
        ("logits (tied)", lambda d: f"vocab {_ranges(V, p, d)}", "#dde5f0"),
    ]
    n_ar = 0
    for i, (label, text, colour) in enumerate(rows):
        y = len(rows) - 1 - i
        if text is None:
            n_ar += 1
            ax.add_patch(FancyBboxPatch((0.05, y + 0.2), p - 0.1, 0.6, boxstyle="round,pad=0.02",
                                        fc=colour, ec="k"))
            site = "o_proj" if n_ar == 1 else "down_proj"
            ax.text(p / 2, y + 0.5, f"AllReduce {n_ar} of 2 per block ({2 * c.num_layers} per "
                    f"forward): sum of {p} partials after {site}, [tokens, {c.embed_dim}]",
                    ha="center", va="center", fontsize=9, weight="bold")
        else:
            for d in range(p):
                ax.add_patch(FancyBboxPatch((d + 0.08, y + 0.12), 0.84, 0.76,
                                            boxstyle="round,pad=0.02", fc=colour, ec="0.4"))
                ax.text(d + 0.5, y + 0.5, text(d), ha="center", va="center", fontsize=8)
        ax.text(-0.1, y + 0.5, label if text is not None else "", ha="right", va="center",
                fontsize=9)
    for d in range(p):
        ax.text(d + 0.5, len(rows) + 0.15, f"device {d}", ha="center", fontsize=10, weight="bold")
    ax.set_xlim(-2.2, p + 0.1)
    ax.set_ylim(-0.2, len(rows) + 0.6)
    ax.axis("off")
    ax.set_title(f"Gemma 3 {c.name}: one block, tensor-parallel over {p} devices")
    return ax


def plot_allreduce_sizes(tokens: int = 2048, bits=(16, 8.5, 4.5), ax=None):
    """Bytes of one AllReduce message and of all of them in a forward, per preset; returns Axes.

    Args:
        tokens: prefill length (batch x sequence).
        bits: bits per element on the wire to compare (bf16 16; int8 + bf16 scale per 32 = 8.5;
            int4 = 4.5).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    names = list(PRESETS)
    width = 0.8 / len(bits)
    for j, b in enumerate(bits):
        sizes = [PRESETS[n].allreduce_sites(tokens, b / 8)["total_bytes"] / 2**20 for n in names]
        ax.bar(np.arange(len(names)) + (j - (len(bits) - 1) / 2) * width, sizes, width,
               label=f"{b:g} bits/element")
    ax.set_xticks(range(len(names)), [f"{n}\n{2 * PRESETS[n].num_layers} ARs" for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("MiB per forward (all AllReduces)")
    ax.set_title(f"AllReduce traffic of one prefill of {tokens} tokens")
    ax.legend()
    return ax


def plot_report(report: dict, path=None):
    """dNLL (+- 2 SE) and top-1 agreement per run, and site error per layer (matplotlib).

    Returns the figure; saves it to `path` if given.
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = report["rows"]
    labels = [r["label"].replace(" (CPU: f32)", "*") for r in rows]
    colors = {}
    for r in rows:                                  # bf16 grey, formats in order of appearance
        colors.setdefault(r["format"], "0.55" if r["format"] == UNQUANTIZED else
                          f"C{len(colors)}")
    c = [colors[r["format"]] for r in rows]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    ax[0].barh(labels, [r["dnll"] for r in rows], xerr=[2 * r["dnll_se"] for r in rows],
               color=c, error_kw={"lw": 1, "capsize": 2})
    ax[0].axvline(0, color="k", lw=0.8)
    ax[0].set_xscale("symlog", linthresh=1e-3)
    ax[0].set_xlabel("dNLL +- 2 SE (nats per token)")
    ax[0].invert_yaxis()
    ax[1].barh(labels, [r["top1"] for r in rows], color=c)
    ax[1].set_xlim(min(50, min(r["top1"] for r in rows)), 100)
    ax[1].set_xlabel("top-1 agreement with exact run (%)")
    ax[1].invert_yaxis()
    ax[1].set_yticklabels([])
    shown = set()
    for r, col in zip(rows, c, strict=True):
        first = r["format"] not in shown
        shown.add(r["format"])
        ax[2].semilogy(r["site_err_mlp"], color=col, alpha=0.6,
                       label=r["format"] if first else None)
    ax[2].set_xlabel("layer")
    ax[2].set_ylabel("relative error after down_proj")
    ax[2].legend()
    m = report["meta"]
    fig.suptitle(f"{m['model']}, TP={m['tp']}, {m['scored']} tokens: quantized AllReduce quality")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
