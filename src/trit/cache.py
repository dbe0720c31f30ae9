"""Where trit keeps what it makes once and reuses: ``$TRIT_CACHE``, else ``~/.cache/trit``.

The default model's bf16 checkpoint (:mod:`trit.smollm2`), the demo's ternary
checkpoints and the kernel configs tuned on this machine
(:mod:`trit.kernels.tuning`) live there.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("TRIT_CACHE", Path.home() / ".cache" / "trit"))


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``path`` whole or not at all: into a file beside it, then renamed into place, so that a reader
    never sees half a file; a write that fails (a full disk) leaves nothing behind and raises. The temporary
    name holds the process and the thread, so that writers of the same path never share it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
