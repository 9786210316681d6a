"""Where XBench keeps what it derives once and reuses: generated phantoms, text embeddings, decoded images."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$XBENCH_CACHE``, or ``~/.cache/xbench``."""
    return Path(os.environ.get("XBENCH_CACHE", "~/.cache/xbench")).expanduser()
