"""The Gemma 3 tokenizer, rebuilt from the GGUF vocabulary with Hugging Face `tokenizers`.

Gemma's tokenizer is byte-fallback BPE over text in which spaces are spelled "▁" (U+2581). A GGUF
stores its 262144 tokens in merge order but *no merge list*, and BPE is defined by its merges,
so we rebuild them: every way of cutting a token `t` into two tokens `(l, r)` is a merge
producing `t`, ranked first by `t`'s position in the file (earlier = merged earlier), then by
longer `l` first. (A Unigram model over the stored scores gives different ids.) This construction
matches the ids of Hugging Face transformers' own GGUF tokenizer exactly on the evaluation text
and the probes of `crosscheck.py`, including runs of spaces, newlines, digits and non-ASCII text.

Two details of the file: tokens made only of spaces are stored with real spaces, so they are
respelled "▁▁..." to match the normalized text; control tokens (`<bos>`, `<start_of_turn>`, ...)
are added as special tokens and user-defined ones (runs of newlines, tabs, ...) as whole-match
added tokens, as llama.cpp does. Plain text is encoded as text: a string that merely contains
"<bos>" or "<start_of_turn>" yields the pieces of those characters, never the control ids, unless
the caller asks for `parse_special=True` (how a chat template is written). Building is slow, so
the result is cached (`cache.py`) under the GGUF's sha256.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from .._checks import flag
from .cache import lookup, store
from .gguf_file import GGUFFile, need

__all__ = ["Tokenizer"]

_CONTROL, _USER_DEFINED = 3, 4


def _build(tokens: list[str], token_types: list[int], unk: str):
    tk = need("tokenizers")
    AddedToken, decoders, models = tk.AddedToken, tk.decoders, tk.models
    normalizers, pre_tokenizers = tk.normalizers, tk.pre_tokenizers
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}           # later duplicates win, like a dict
    control_ids = {i for i, k in enumerate(token_types) if k == _CONTROL}
    ranked = []                                              # (rank of t, -len(l), l, r)
    for t, i in vocab.items():
        if i in control_ids:                                 # text never merges into "<bos>"
            continue
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in vocab and right in vocab:
                ranked.append((i, -cut, left, right))
    ranked.sort()
    merges = [(left, right) for _, _, left, right in ranked]
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                     byte_fallback=True, dropout=None)
    tok = tk.Tokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    control = [AddedToken(t, normalized=False, special=True)
               for t, k in zip(spelled, token_types, strict=True) if k == _CONTROL]
    tok.add_special_tokens(control)
    user = [AddedToken(t, normalized=False, special=False)
            for t, k in zip(spelled, token_types, strict=True)
            if k == _USER_DEFINED and t in vocab]
    tok.add_tokens(user)
    return tok


class Tokenizer:
    """Gemma 3 tokenizer: `encode(text) -> ids`, `decode(ids) -> text`.

    Build it with `Tokenizer.from_gguf(path)`.
    """

    def __init__(self, backend, bos_id: int, eos_id: int):
        self._tok = backend
        self._lock = threading.Lock()               # encode_special_tokens is backend state
        self.bos_id = int(bos_id)
        self.eos_id = int(eos_id)

    @property
    def vocab_size(self) -> int:
        """Number of tokens in the vocabulary."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_gguf(cls, path: str | Path | None = None, *, cache: bool = True) -> Tokenizer:
        """Build the tokenizer from a Gemma 3 GGUF's vocabulary (default: the packaged 270M).

        Raises:
            ImportError: `gguf` or `tokenizers` (extra `gemma`) is missing.
            FileNotFoundError: no such file.
            ValueError: not a GGUF file, a truncated or corrupt one, or its tokenizer is not
                Gemma's ("llama"-type vocabulary of a "gemma3" model).
        """
        cache = flag(cache, "cache")
        file = GGUFFile(path)
        if cache and (entry := lookup("tokenizer", file.sha256)) is not None:
            try:
                meta = json.loads((entry / "tokenizer.json").read_text())
                backend = need("tokenizers").Tokenizer.from_str(meta["tokenizer"])
                return cls(backend, meta["bos"], meta["eos"])
            except Exception:                       # tokenizers raises plain Exception on bad JSON
                pass                                # damaged beyond the manifest: rebuild
        model, arch = file.field("tokenizer.ggml.model"), file.field("general.architecture")
        if model != "llama" or arch != "gemma3":
            raise ValueError(f"{file.path}: not a Gemma 3 tokenizer (architecture {arch!r}, "
                             f"tokenizer model {model!r})")
        tokens = file.field("tokenizer.ggml.tokens")
        types = file.field("tokenizer.ggml.token_type") or [1] * len(tokens)
        unk = tokens[file.field("tokenizer.ggml.unknown_token_id", 3)]
        tok = cls(_build(tokens, types, unk), file.field("tokenizer.ggml.bos_token_id", 2),
                  file.field("tokenizer.ggml.eos_token_id", 1))
        if cache:
            meta = {"tokenizer": tok._tok.to_str(), "bos": tok.bos_id, "eos": tok.eos_id}
            store("tokenizer", file.sha256,
                  lambda d: (d / "tokenizer.json").write_text(json.dumps(meta)))
        return tok

    def encode(self, text: str, add_bos: bool = True, *, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, with the BOS id (2) first unless `add_bos=False`.

        Control tokens spelled out in `text` ("<bos>", "<start_of_turn>", ...) are encoded as
        the text they are, unless `parse_special=True` makes them the control ids (for text
        written in the chat template).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        with self._lock:
            self._tok.encode_special_tokens = not parse_special
            ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text of `ids` (special tokens such as BOS dropped unless `skip_special=False`).

        Raises:
            ValueError: an id outside `[0, vocab_size)`.
        """
        ids = [int(i) for i in ids]
        if bad := [i for i in ids if not 0 <= i < self.vocab_size]:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got {bad[:5]}")
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def id_to_token(self, i: int) -> str:
        """The vocabulary entry of id `i`; ValueError outside `[0, vocab_size)`."""
        if not 0 <= int(i) < self.vocab_size:
            raise ValueError(f"token id {i} is not in [0, {self.vocab_size})")
        return self._tok.id_to_token(int(i))
