"""A cache for what is slow to derive from a GGUF file: one directory per entry, atomic, checked.

Dequantizing the 270M and rebuilding its tokenizer each take many seconds; both are pure
functions of the file, so they are stored once under the file's sha256:

    <cache_dir()>/<kind>-<sha256 of the GGUF>-v<CACHE_VERSION>/
        <the entry's files>
        manifest.json       {"files": {name: {"size": bytes, "sha256": hex or null}}}, written last

An entry is trusted only if its manifest parses and every file it lists has the recorded size
and, for files up to `HASHED_BYTES`, the recorded sha256 (the JSON files; the large weight arrays
are checked by size, by numpy's header check and by their shapes, since hashing a gigabyte would
double every load). Anything else -- a missing, truncated or edited file, an older version -- is a
miss: the caller rebuilds the entry and `store` replaces the bad one. So a damaged cache costs
one rebuild, never a load that fails until someone deletes it by hand.

`store` writes into a fresh, uniquely named temporary directory beside the entry and renames it
into place (atomic on one file system): a reader never sees half an entry, and two processes
filling the cache at once each write their own directory. A cache that cannot be written (a
read-only home) is not an error: the result is simply not kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["CACHE_VERSION", "HASHED_BYTES", "cache_dir", "entry_path", "lookup", "store"]

#: Bump when what an entry holds changes; older entries are then ignored.
CACHE_VERSION = "3"
#: Files up to this size are checked by sha256 when an entry is read, larger ones by size.
HASHED_BYTES = 64 << 20
_MANIFEST = "manifest.json"


def cache_dir() -> Path:
    """The user cache directory: $EQUARX_REF_CACHE, else $XDG_CACHE_HOME/equarx-ref, else
    ~/.cache/equarx-ref."""
    if os.environ.get("EQUARX_REF_CACHE"):
        return Path(os.environ["EQUARX_REF_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "equarx-ref"


def entry_path(kind: str, digest: str) -> Path:
    """Where the entry `kind` ("weights", "tokenizer") of the file with sha256 `digest` lives."""
    return cache_dir() / f"{kind}-{digest}-v{CACHE_VERSION}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _describe(path: Path) -> dict:
    size = path.stat().st_size
    return {"size": size, "sha256": _sha256(path) if size <= HASHED_BYTES else None}


def lookup(kind: str, digest: str) -> Path | None:
    """The entry's directory if it is complete and intact, else None (rebuild it)."""
    entry = entry_path(kind, digest)
    try:
        files = json.loads((entry / _MANIFEST).read_text())["files"]
        for name, want in files.items():
            path = entry / name
            if path.parent != entry:                        # names are plain file names
                return None
            size = path.stat().st_size
            if size != want["size"] or (want["sha256"] is not None and
                                        _sha256(path) != want["sha256"]):
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return entry


def store(kind: str, digest: str, write: Callable[[Path], None]) -> None:
    """Fill a new entry: `write(directory)` puts the files in, then the entry replaces any old one.

    Errors raised by `write` propagate; an unwritable cache (OSError) only means nothing is kept.
    """
    entry = entry_path(kind, digest)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}.tmp-"))
    except OSError:
        return
    try:
        write(tmp)
        manifest = {"files": {p.name: _describe(p) for p in sorted(tmp.iterdir())}}
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=0))
        if entry.exists():                                  # a bad or outdated entry
            trash = entry.parent / f".{entry.name}.trash-{uuid.uuid4().hex}"
            os.replace(entry, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, entry)                              # atomic
    except OSError:
        pass                                                # read-only, or another writer won
    finally:
        shutil.rmtree(tmp, ignore_errors=True)              # gone already if it was renamed
