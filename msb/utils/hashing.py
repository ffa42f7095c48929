"""SHA-256 helpers for files and canonical JSON objects."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Return the hex SHA-256 digest of a file's bytes, read in ``chunk_size`` chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk_size)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def canonical_json(obj: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace, UTF-8 characters kept. Used for config hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_json(obj: Any) -> str:
    """Hex SHA-256 of :func:`canonical_json` of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()
