"""``kvtune search-worker``: one pool's goodput search in a Kubernetes Job (the operator's
``search.mode: job``, operator/search/search_jobs.py; docs/search-jobs.md).

Reads the search document (``kvtune.tuner.simulator.search_job.SearchInput``) from the file
the Job's ConfigMap is mounted as, runs the same search the operator runs in-process, and
writes the answer, compact and compressed, to the container's termination message, where the
operator reads it from the pod's status: the pod needs no API access. The answer is printed
too (the pod's log). Exit 0 whenever an answer was written, an error outcome included (a
budget spent, nothing fits: retrying cannot change it); 1 when the input cannot be read (the
Job retries, then fails with the message); 143 when stopped by SIGTERM (the Job's deadline).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import click

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
EXIT_STOPPED = 143
# The kubelet's cap (kvtune.tuner.simulator.search_job, not imported at start: fast --help).
TERMINATION_MESSAGE_MAX_BYTES = 4096


@click.command("search-worker")
@click.option("--input", "input_path", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="The search document (the Job mounts its ConfigMap here).")
@click.option("--termination-log", type=click.Path(dir_okay=False, path_type=Path),
              default=DEFAULT_TERMINATION_LOG, show_default=True,
              help="Where the answer goes (the container's terminationMessagePath).")
def search_worker(input_path: Path, termination_log: Path) -> None:
    """Run one pool's goodput search from a search document (a search Job's command)."""
    from kvtune.tuner.planner.search_budget import SearchCancelled
    from kvtune.tuner.simulator import search_job

    stopping = threading.Event()

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        stopping.set()  # the search stops at its next check (between candidates, in a replay)

    signal.signal(signal.SIGTERM, on_term)
    try:
        doc = search_job.parse_input(input_path.read_text(encoding="utf-8"))
    except (OSError, search_job.InvalidSearchInput) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        line = f"--input={str(input_path)!r}: {why}"
        _leave(termination_log, line)
        raise click.ClickException(line) from None  # exit 1: the Job retries, then fails
    click.echo(f"kvtune search-worker: input {doc.digest()[:16]}: {doc.request.gpu.name} "
               f"x{doc.request.tensor_parallel}, {doc.replicas} replica(s)", err=True)
    try:
        outcome = search_job.run(doc, cancelled=stopping.is_set)
    except SearchCancelled:
        line = ("stopped (SIGTERM: the Job's activeDeadlineSeconds, or the pod was evicted) "
                "before the search ended")
        _leave(termination_log, line)
        click.echo(f"Error: {line}", err=True)
        sys.exit(EXIT_STOPPED)
    message = search_job.encode(outcome)
    click.echo(message)
    try:
        termination_log.write_text(message, encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"--termination-log={str(termination_log)!r}: cannot write "
                                   f"the answer ({exc.strerror}); pass a writable file") from None
    shown = outcome.error.kind if outcome.error is not None else "a plan"
    click.echo(f"kvtune search-worker: {shown} ({len(message)} bytes)", err=True)


def _leave(termination_log: Path, line: str) -> None:
    """A one-line reason where the operator reads it (not a result: no format marker)."""
    with contextlib.suppress(OSError):  # the reason goes to the log as well
        termination_log.write_text(line[:TERMINATION_MESSAGE_MAX_BYTES], encoding="utf-8")
