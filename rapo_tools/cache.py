"""rapo's cache folder, the one place that decides where generated artefacts live.

Models converted from the embedded GGUF, corpus indexes, knowledge bases and default
Step-Trace Buffers are all kept below it: ``$RAPO_CACHE_DIR`` when that is set and not
empty, else the user cache folder of the platform (``platformdirs``: ``~/.cache/rapo``
on Linux, or ``$XDG_CACHE_HOME/rapo``).

Example:
    >>> import os
    >>> os.environ["RAPO_CACHE_DIR"] = "/tmp/rapo-cache"
    >>> str(rapo_cache_dir()), str(rapo_cache_dir("models", "smollm2"))
    ('/tmp/rapo-cache', '/tmp/rapo-cache/models/smollm2')
    >>> del os.environ["RAPO_CACHE_DIR"]
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

CACHE_ENV_VAR = "RAPO_CACHE_DIR"
"""The environment variable that moves the whole cache (tests point it at a temporary folder)."""


def rapo_cache_dir(*parts: str) -> Path:
    """rapo's cache folder, or the path ``parts`` below it; read at call time and never created here."""
    root = os.environ.get(CACHE_ENV_VAR) or platformdirs.user_cache_dir("rapo", appauthor=False)
    return Path(root).expanduser().joinpath(*parts)
