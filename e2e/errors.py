"""The one error the local control plane raises: which component, why, and where its log is."""

from __future__ import annotations

from pathlib import Path


class ClusterError(RuntimeError):
    """A component of the local control plane could not be built, started or reached.

    The message always names the component, the reason and the log file to read, because
    "the cluster did not come up" is not something a person can act on.
    """

    def __init__(self, component: str, reason: str, log_path: Path | None = None) -> None:
        self.component, self.reason, self.log_path = component, reason, log_path
        where = f" Log: {log_path}" if log_path is not None else ""
        super().__init__(f"{component}: {reason}.{where}")


def log_tail(path: Path, lines: int = 8) -> str:
    """The last non-empty lines of a log, for quoting in an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log written)"
    # Lines starting with "# " are the supervisor's own (the command line it ran).
    kept = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("# ")][-lines:]
    return " | ".join(kept) if kept else "(log is empty)"
