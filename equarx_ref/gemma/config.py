"""Gemma 3 configuration: the numbers that fix a model's shapes, and where its AllReduces sit.

A Gemma 3 decoder is a stack of `L` identical blocks over a residual stream of width `D`. Each
block has grouped-query attention (`N` query heads sharing `K` key/value heads of size `H`) and a
gated MLP of width `F`. Five of every six layers attend only to the last `window` tokens (local,
RoPE base 10k); every sixth layer attends to the whole prefix (global, RoPE base 1M, linearly
scaled by 8 from 4B up).

Under tensor parallelism over `p` devices each block ends two partial sums of shape
`[batch, seq, D]` that must be added across devices, so a prefill of `T` tokens moves
`2 L` AllReduces of `T * D` elements each:

    bytes per forward (bf16) = 2 * L * T * D * 2

which is why EQuARX targets exactly these two sites (after `o_proj` and after `down_proj`).
"""

from __future__ import annotations

import dataclasses
import math

from .._checks import count

__all__ = ["PRESETS", "Gemma3Config", "check_params"]


@dataclasses.dataclass(frozen=True)
class Gemma3Config:
    """Shapes and constants of a Gemma 3 text decoder.

    Attributes:
        name: preset name ("270m", "1b", ...) or "custom".
        vocab_size: `V`, rows of the (tied) embedding.
        embed_dim: `D`, width of the residual stream.
        num_layers: `L`.
        num_heads: `N`, query heads.
        num_kv_heads: `K`, key/value heads (`N % K == 0`).
        head_dim: `H`.
        hidden_dim: `F`, MLP width.
        sliding_window: `window`, keys a local layer sees (the query's own position included).
        query_pre_attn_scalar: queries are scaled by `query_pre_attn_scalar ** -0.5`.
        local_rope_base: RoPE base of local layers.
        global_rope_base: RoPE base of global layers.
        global_rope_scale: linear RoPE scaling factor of global layers (positions divided by it).
        global_every: layer `i` is global when `(i + 1) % global_every == 0`.
        norm_eps: RMSNorm epsilon.
        context_length: the longest sequence the model was trained for (a GGUF's
            `gemma3.context_length`); `forward` refuses longer ones.
    """

    name: str = "custom"
    vocab_size: int = 262144
    embed_dim: int = 640
    num_layers: int = 18
    num_heads: int = 4
    num_kv_heads: int = 1
    head_dim: int = 256
    hidden_dim: int = 2048
    sliding_window: int = 512
    query_pre_attn_scalar: float = 256.0
    local_rope_base: float = 10_000.0
    global_rope_base: float = 1_000_000.0
    global_rope_scale: float = 1.0
    global_every: int = 6
    norm_eps: float = 1e-6
    context_length: int = 32768

    def __post_init__(self):
        for f in ("vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads",
                  "head_dim", "hidden_dim", "sliding_window", "global_every", "context_length"):
            object.__setattr__(self, f, count(getattr(self, f), f"Gemma3Config.{f}"))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

    # --- presets -------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> Gemma3Config:
        """The published configuration `name` in {"270m", "1b", "4b", "12b", "27b"}."""
        key = str(name).lower().removeprefix("gemma3-").removeprefix("gemma-3-")
        if key not in PRESETS:
            raise ValueError(f"unknown Gemma 3 preset {name!r}; known: {sorted(PRESETS)}")
        return PRESETS[key]

    # --- derived quantities --------------------------------------------------------------------
    def is_global(self, layer: int) -> bool:
        """True if `layer` attends globally (every `global_every`-th layer, 1-based)."""
        return (layer + 1) % self.global_every == 0

    @property
    def global_layers(self) -> tuple[int, ...]:
        """Indices of the global-attention layers."""
        return tuple(i for i in range(self.num_layers) if self.is_global(i))

    @property
    def query_scale(self) -> float:
        """Factor applied to queries before the dot product."""
        return 1.0 / math.sqrt(self.query_pre_attn_scalar)

    def param_shapes(self) -> dict:
        """Shapes of the parameter pytree that `forward` takes (layers stacked on axis 0)."""
        V, D, L = self.vocab_size, self.embed_dim, self.num_layers
        N, K, H, F = self.num_heads, self.num_kv_heads, self.head_dim, self.hidden_dim
        return {
            "embed": (V, D),
            "final_norm": (D,),
            "layers": {
                "attn_norm": (L, D),
                "q": (L, D, N, H),
                "k": (L, D, K, H),
                "v": (L, D, K, H),
                "q_norm": (L, H),
                "k_norm": (L, H),
                "o": (L, N, H, D),
                "post_attn_norm": (L, D),
                "ffw_norm": (L, D),
                "gate": (L, D, F),
                "up": (L, D, F),
                "down": (L, F, D),
                "post_ffw_norm": (L, D),
            },
        }

    def num_params(self) -> int:
        """Number of parameters (embedding counted once: the output projection is tied)."""
        import numpy as np

        def size(t):
            return sum(size(v) for v in t.values()) if isinstance(t, dict) else int(np.prod(t))
        return size(self.param_shapes())

    def allreduce_sites(self, tokens: int, bytes_per_element: float = 2.0) -> dict:
        """Where the TP AllReduces sit and how big they are for a prefill of `tokens` tokens.

        Returns:
            dict with `count` (AllReduces per forward), `elements` (per AllReduce),
            `bytes` (per AllReduce at `bytes_per_element`), `total_bytes` (per forward).
        """
        sites = 2 * self.num_layers
        elements = tokens * self.embed_dim
        nbytes = elements * bytes_per_element
        return {"count": sites, "elements": elements, "bytes": nbytes,
                "total_bytes": sites * nbytes}


def check_params(params: dict, config: Gemma3Config) -> None:
    """Raise ValueError unless `params` has exactly the names and shapes `config` implies."""
    want = config.param_shapes()
    layers = params.get("layers") if isinstance(params, dict) else None
    if not isinstance(params, dict) or set(params) != set(want) or \
            not isinstance(layers, dict) or set(layers) != set(want["layers"]):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"Gemma 3 params must have keys {sorted(want)} with layers "
                         f"{sorted(want['layers'])}; got {got}")
    bad = []
    for name, shape in [("embed", want["embed"]), ("final_norm", want["final_norm"])] + \
            [(f"layers.{k}", s) for k, s in want["layers"].items()]:
        arr = params[name] if "." not in name else params["layers"][name.split(".")[1]]
        if tuple(arr.shape) != tuple(shape):
            bad.append(f"{name}: expected {tuple(shape)}, got {tuple(arr.shape)}")
    if bad:
        raise ValueError(f"params do not match Gemma3Config({config.name}): " + "; ".join(bad))


def _c(name, D, L, N, K, H, F, window, qpas, scale, context):
    return Gemma3Config(name=name, embed_dim=D, num_layers=L, num_heads=N, num_kv_heads=K,
                        head_dim=H, hidden_dim=F, sliding_window=window,
                        query_pre_attn_scalar=float(qpas), global_rope_scale=scale,
                        context_length=context)


#: The published Gemma 3 text decoders (google-deepmind/gemma `gm/nn`, HF `models/gemma3`);
#: context: 32K tokens for 270M and 1B, 128K from 4B up (Gemma 3 technical report).
PRESETS: dict[str, Gemma3Config] = {
    "270m": _c("270m", 640, 18, 4, 1, 256, 2048, 512, 256, 1.0, 32768),
    "1b": _c("1b", 1152, 26, 4, 1, 256, 6912, 512, 256, 1.0, 32768),
    "4b": _c("4b", 2560, 34, 8, 4, 256, 10240, 1024, 256, 8.0, 131072),
    "12b": _c("12b", 3840, 48, 16, 8, 256, 15360, 1024, 256, 8.0, 131072),
    "27b": _c("27b", 5376, 62, 32, 16, 128, 21504, 1024, 168, 8.0, 131072),
}
