"""Where XBench keeps what it derives once and reuses: generated phantoms, text embeddings, decoded images."""

from __future__ import annotations

import os
from pathlib import Path

from xbench.files import check_writable_folder


def cache_root() -> Path:
    """``$XBENCH_CACHE``, or ``~/.cache/xbench``."""
    return Path(os.environ.get("XBENCH_CACHE", "~/.cache/xbench")).expanduser()


def check_cache_writable() -> None:
    """Before anything is derived into `cache_root`: a file in its place or a read-only folder is an
    error naming ``XBENCH_CACHE`` and the fix, not the system's ``[Errno 20]`` about a path below
    it. (Reading what is there needs no write: a shared read-only cache is read as it is.)"""
    named = "XBENCH_CACHE" if "XBENCH_CACHE" in os.environ else "the cache folder (XBENCH_CACHE unset)"
    check_writable_folder(cache_root(), named, "set XBENCH_CACHE to a folder you can write in")
