"""Render a tenant's pod template in a child process with bounded CPU, memory and output.

Jinja2's sandbox keeps a template away from Python's objects, but not from the CPU or the
memory: a 60-byte expression held the operator's GIL for 16 s, a 518-byte template used
2 GB, and while a template ran nothing else was reconciled and SIGTERM went unanswered
(issue 11). So a tenant's template (``spec.runtime.podTemplate``) is rendered, and its YAML
parsed (anchors can expand a few bytes into gigabytes), in a separate Python process:

- ``RLIMIT_AS`` (``MEMORY_BYTES``) and ``RLIMIT_CPU`` (``CPU_SECONDS``) set by the child on
  itself before reading the template; a wall-clock limit (``WALL_SECONDS``) in the parent;
- the rendered text and the JSON sent back are cut off at ``OUTPUT_BYTES``;
- at most ``CONCURRENT`` children at a time, so a tenant's looping templates cannot take
  every core from the others; the operator's own threads just wait on a pipe (no GIL held,
  SIGTERM handled at once);
- results, good and bad, are remembered by a digest of template and context, so a template
  that failed is not run again until it or the plan changes (one tenant's bad template costs
  its CPU budget once, not on every resync);
- per tenant (namespace) at most one render in flight and a CPU budget per minute
  (``operator/render/render_fairness.py``): beyond them a render is deferred (``RenderDeferred``,
  nothing waits), so one tenant's many slow templates never hold both slots while another
  tenant's object waits.

The child is this file run as a script (``python -I``: no environment variables, no user
site, not the script's folder on ``sys.path``), importing only the standard library,
jinja2 and PyYAML.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

MEMORY_BYTES = 256 * 1024**2  # the operator container's limit is 512 MiB (chart values)
CPU_SECONDS = 2
WALL_SECONDS = 15.0  # start-up included, on a busy node
OUTPUT_BYTES = 1024**2
CONCURRENT = 2
CACHE_ENTRIES = 256
CACHE_TEXT_BYTES = 64 * 1024  # larger results are not remembered

_SLOTS = threading.BoundedSemaphore(CONCURRENT)
_CACHE: OrderedDict[str, tuple[bool, Any]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
LOG = logging.getLogger("kvtune.operator.template_sandbox")


class SandboxError(Exception):
    """The template failed, or broke a limit; the message says which."""

    def __init__(self, message: str, cpu_seconds: float | None = None) -> None:
        super().__init__(message)
        self.cpu_seconds = cpu_seconds  # what the child reported; None: it broke a limit


class RenderDeferred(Exception):
    """The tenant's render budget says not now (not the template's fault: never cached)."""

    def __init__(self, reason: str, retry_after_seconds: float) -> None:
        super().__init__(f"rendering deferred: {reason}; retried in "
                         f"{retry_after_seconds:.0f} s")
        self.retry_after_seconds = retry_after_seconds


if __name__ != "__main__":  # the child (this file as a script) imports no kvtune module
    from kvtune.operator.render.render_fairness import TenantBudget

    BUDGET = TenantBudget()


def _digest(source: str, context: dict[str, Any]) -> str:
    payload = json.dumps({"source": source, "context": context}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _remember(key: str, ok: bool, value: Any) -> None:
    if ok and len(json.dumps(value)) > CACHE_TEXT_BYTES:
        return
    with _CACHE_LOCK:
        _CACHE[key] = (ok, value)
        _CACHE.move_to_end(key)
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)


def render_yaml(source: str, context: dict[str, Any], *, tenant: str) -> Any:
    """The template rendered with ``context`` and parsed as YAML (plain data); raises
    ``SandboxError`` naming the failure or the limit it broke, ``RenderDeferred`` when
    ``tenant`` (the namespace) must wait for its turn or its CPU budget."""
    key = _digest(source, context)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        ok, value = hit
        if ok:
            return json.loads(json.dumps(value))  # a copy: callers change it in place
        raise SandboxError(str(value))
    deferred = BUDGET.admit(tenant, time.monotonic())
    if deferred is not None:
        LOG.info("render for namespace %s deferred %.0f s: %s", tenant,
                 deferred.retry_after_seconds, deferred.reason)
        raise RenderDeferred(deferred.reason, deferred.retry_after_seconds)
    used = float(CPU_SECONDS)  # a child that reported nothing broke a limit
    try:
        value, used = _run_child(source, context)
    except SandboxError as exc:
        if exc.cpu_seconds is not None:
            used = exc.cpu_seconds
        _remember(key, False, str(exc))
        raise
    finally:
        BUDGET.finish(tenant, time.monotonic(), used)
    _remember(key, True, value)
    return json.loads(json.dumps(value))


def _run_child(source: str, context: dict[str, Any]) -> tuple[Any, float]:
    """The rendered value and the CPU seconds the child used (start-up included)."""
    payload = json.dumps({"source": source, "context": context}).encode()
    argv = [sys.executable, "-I", str(Path(__file__).resolve()), str(MEMORY_BYTES),
            str(CPU_SECONDS), str(OUTPUT_BYTES)]
    with _SLOTS:
        try:
            proc = subprocess.run(argv, input=payload, capture_output=True,
                                  timeout=WALL_SECONDS, check=False, env={})
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"rendering took longer than {WALL_SECONDS:.0f} s (wall "
                               f"clock); simplify the template") from exc
    if proc.returncode < 0:
        signal_number = -proc.returncode
        # SIGXCPU (24) at the soft CPU limit, SIGKILL (9) at the hard one.
        if signal_number in (9, 24):
            raise SandboxError(f"rendering used more than {CPU_SECONDS} s of CPU (a loop or "
                               f"a huge expression); simplify the template")
        raise SandboxError(f"the renderer was stopped by signal {signal_number}")
    try:
        answer = json.loads(proc.stdout[:OUTPUT_BYTES * 2])
    except ValueError:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise SandboxError(f"the renderer failed (exit {proc.returncode}): "
                           f"{tail[0][:300]}") from None
    used = float(answer.get("cpu_seconds", CPU_SECONDS))
    if "error" in answer:
        raise SandboxError(str(answer["error"])[:1000], cpu_seconds=used)
    return answer["value"], used


# --- the child ------------------------------------------------------------------------------

def _child(memory_bytes: int, cpu_seconds: int, output_bytes: int) -> dict[str, Any]:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
    try:
        import jinja2
        import yaml
        from jinja2.sandbox import SandboxedEnvironment

        payload = json.loads(sys.stdin.buffer.read())
        env = SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False,
                                   keep_trailing_newline=True)
        chunks, size = [], 0
        try:
            for chunk in env.from_string(payload["source"]).generate(**payload["context"]):
                size += len(chunk)
                if size > output_bytes:
                    return {"error": f"the rendered text exceeds {output_bytes} bytes"}
                chunks.append(chunk)
        except jinja2.TemplateError as exc:
            return {"error": f"template error: {exc}"}
        try:
            value = yaml.safe_load("".join(chunks))
        except yaml.YAMLError as exc:
            return {"error": f"rendered text is not valid YAML: {exc}"}
        out = json.dumps({"value": value})
        if len(out) > output_bytes:
            return {"error": f"the rendered object exceeds {output_bytes} bytes (YAML "
                             f"anchors expanded?)"}
        return {"value": value}
    except MemoryError:
        return {"error": f"rendering needed more than {memory_bytes // 1024**2} MiB of "
                         f"memory; simplify the template"}
    except RecursionError:
        return {"error": "rendering recursed too deeply; simplify the template"}
    except Exception as exc:  # anything a template can raise: reported, never a traceback
        return {"error": f"template error: {type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    result = _child(*(int(a) for a in sys.argv[1:4]))
    result["cpu_seconds"] = time.process_time()  # charged to the tenant's budget
    try:
        sys.stdout.write(json.dumps(result))
    except MemoryError:
        sys.stdout.write('{"error": "rendering needed more memory than allowed"}')
    sys.stdout.flush()
