"""Units, once: binary byte multiples (as vLLM and NVML count memory) and how kvtune quotes
bytes in messages. Standard library only (the runtime entrypoint imports it too)."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40


def gib_text(n_bytes: float) -> str:
    """Bytes as kvtune's messages quote them: ``"12.34 GiB"``."""
    return f"{n_bytes / GiB:.2f} GiB"
