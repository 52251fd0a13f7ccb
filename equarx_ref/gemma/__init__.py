"""Gemma 3 in pure JAX, tensor parallel, on real weights.

    config, params = load_gguf()                 # Gemma 3 270M, offline, float32
    tok = Tokenizer.from_gguf()
    logits = forward(params, [tok.encode(text)], config, mesh=mesh, all_reduce=my_all_reduce)

`gguf` and `tokenizers` (extra `gemma`) are imported only when weights or the tokenizer load.
"""

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
