"""The Gemma 3 tokenizer, rebuilt from the GGUF vocabulary with Hugging Face `tokenizers`.

Gemma's tokenizer is byte-fallback BPE over text in which spaces are spelled "▁" (U+2581). A GGUF
stores its 262144 tokens in merge order but *no merge list*, and BPE is defined by its merges,
so we rebuild them: every way of cutting a token `t` into two tokens `(l, r)` is a merge
producing `t`, ranked first by `t`'s position in the file (earlier = merged earlier), then by
longer `l` first. A Unigram model over the stored scores, or a sentencepiece BPE proto, gives
different ids (see REFERENCES.md); this construction matches the reference ids exactly,
including runs of spaces, newlines, digits and non-ASCII text.

Two details of the file: tokens made only of spaces are stored with real spaces, so they are
respelled "▁▁..." to match the normalized text; control tokens (`<bos>`, `<start_of_turn>`, ...)
are added as special tokens and user-defined ones (runs of newlines, tabs, ...) as whole-match
added tokens, as llama.cpp does. The built tokenizer is cached as JSON next to the weights.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["Tokenizer"]

_CONTROL, _USER_DEFINED = 3, 4
_CACHE_VERSION = "1"


def _build(tokens: list[str], token_types: list[int], unk: str):
    try:
        from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError as e:
        raise ImportError("the Gemma tokenizer needs the optional package 'tokenizers': "
                          "pip install 'equarx-ref[gemma]'") from e
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}           # later duplicates win, like a dict
    ranked = []                                              # (rank of t, -len(l), l, r)
    for t, i in vocab.items():
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in vocab and right in vocab:
                ranked.append((i, -cut, left, right))
    ranked.sort()
    merges = [(left, right) for _, _, left, right in ranked]
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                     byte_fallback=True, dropout=None)
    tok = HFTokenizer(bpe)
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
            ValueError: the file's tokenizer is not Gemma's ("llama"-type BPE vocabulary).
        """
        import json

        from .weights import _need, cache_dir, default_gguf_path, sha256_file

        path = default_gguf_path() if path is None else Path(path)
        if not Path(path).is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        entry = cache_dir() / f"tokenizer-{sha256_file(path)}-v{_CACHE_VERSION}.json" \
            if cache else None
        if entry is not None and entry.is_file():
            from tokenizers import Tokenizer as HFTokenizer

            meta = json.loads(entry.read_text())
            return cls(HFTokenizer.from_str(meta["tokenizer"]), meta["bos"], meta["eos"])
        gguf = _need("gguf")
        reader = gguf.GGUFReader(path)

        def field(key, default=None):
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        model = field("tokenizer.ggml.model")
        if model != "llama" or field("general.architecture") != "gemma3":
            raise ValueError(f"{path}: not a Gemma 3 tokenizer (architecture "
                             f"{field('general.architecture')!r}, tokenizer model {model!r})")
        tokens = field("tokenizer.ggml.tokens")
        types = field("tokenizer.ggml.token_type") or [1] * len(tokens)
        unk = tokens[field("tokenizer.ggml.unknown_token_id", 3)]
        backend = _build(tokens, types, unk)
        tok = cls(backend, field("tokenizer.ggml.bos_token_id", 2),
                  field("tokenizer.ggml.eos_token_id", 1))
        if entry is not None:
            try:
                entry.parent.mkdir(parents=True, exist_ok=True)
                tmp = entry.with_suffix(".tmp")
                tmp.write_text(json.dumps({"tokenizer": backend.to_str(), "bos": tok.bos_id,
                                           "eos": tok.eos_id}))
                tmp.replace(entry)
            except OSError:
                pass
        return tok

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`, with the BOS id (2) first unless `add_bos=False`."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text of `ids` (special tokens such as BOS dropped unless `skip_special=False`)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def id_to_token(self, i: int) -> str:
        """The vocabulary entry of id `i`."""
        return self._tok.id_to_token(int(i))
