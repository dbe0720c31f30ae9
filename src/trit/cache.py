"""Where trit keeps what it makes once and reuses: ``$TRIT_CACHE``, else ``~/.cache/trit``.

The default model's bf16 checkpoint (:mod:`trit.smollm2`), the demo's ternary
checkpoints and the kernel configs tuned on this machine
(:mod:`trit.kernels.tuning`) live there.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("TRIT_CACHE", Path.home() / ".cache" / "trit"))
