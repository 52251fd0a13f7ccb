"""Gemma 3 in pure JAX, tensor parallel, on real weights.

    config, params = load_gguf()                 # Gemma 3 270M, offline, float32
    tok = Tokenizer.from_gguf()
    logits = forward(params, [tok.encode(text)], config, mesh=mesh,
                     all_reduce=eq.AllReduce(fmt=eq.Format.int8(), algorithm="ring"))

The model: `config` (shapes, presets), `model` (one shard's decoder), `parallel` (sharding and
`forward`). The files: `gguf_file` (open and read a GGUF), `weights`, `tokenizer`, `cache` (what
is derived from a file, stored under its sha256). The measurement: `scoring` (per-token NLL, KL,
top-1; AllReduce site error), `quality` (every algorithm x format against the exact run),
`report` (text table), `figures`, `crosscheck` (against Hugging Face transformers). Static int4
AllReduce (`equarx_ref.outliers`): `calibrate` (ranges from `calibtext`, the quality table).

`gguf` and `tokenizers` (extra `gemma`) are imported only when weights or the tokenizer load.
"""

from .._lazy import submodules
from .config import PRESETS, Gemma3Config
from .parallel import ShardedParams, forward, shard_params
from .tokenizer import Tokenizer
from .weights import load_gguf

__all__ = [
           "PRESETS",
           "Gemma3Config",
           "ShardedParams",
           "Tokenizer",
           "forward",
           "load_gguf",
           "shard_params",
]

__getattr__ = submodules(__name__)  # eq.gemma.MODULE loads MODULE on first read
