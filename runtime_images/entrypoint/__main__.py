"""``python -m kvtune.runtime [extra vllm serve args…]``: the vLLM container's entrypoint."""

from __future__ import annotations

import datetime
import os
import shlex
import sys
from typing import Any

from .decisions import DEFAULT_CONTEXT_RESERVE_BYTES, PlanDoesNotFit, build_command, decide
from .gpus import GpuInfo, read_gpus
from .report import publish, write_termination_message
from .runtime_plan import PLAN_ENV, parse_plan

EXIT_REFUSED = 3  # the plan cannot run here; distinct from vLLM's own exit codes
EXIT_BAD_PLAN = 2


def _log(message: str) -> None:
    print(f"kvtune-runtime: {message}", file=sys.stderr, flush=True)


def run(
    argv: list[str],
    env: dict[str, str],
    gpus: list[GpuInfo],
    exec_fn: Any = os.execvp,
) -> int:
    """Everything but the NVML read; returns an exit code unless ``exec_fn`` replaces us."""
    try:
        plan = parse_plan(env.get(PLAN_ENV))
    except ValueError as err:
        _log(str(err))
        write_termination_message(str(err))
        return EXIT_BAD_PLAN
    raw_reserve = env.get("KVTUNE_CONTEXT_RESERVE_BYTES", str(DEFAULT_CONTEXT_RESERVE_BYTES))
    if not raw_reserve.isdigit():
        message = (f"KVTUNE_CONTEXT_RESERVE_BYTES={raw_reserve!r}: expected a whole number of "
                   f"bytes, e.g. {DEFAULT_CONTEXT_RESERVE_BYTES} for 1 GiB")
        _log(message)
        write_termination_message(message)
        return EXIT_BAD_PLAN
    reserve = int(raw_reserve)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    for gpu in gpus:
        _log(f"found {gpu.describe()}")
    try:
        image_class = env.get("KVTUNE_IMAGE_GPU_CLASS")
        if image_class and image_class.upper() != plan.gpu_class.upper():
            raise PlanDoesNotFit(
                "WrongRuntimeImage",
                f"the plan is for {plan.gpu_class.upper()}, this image is built for "
                f"{image_class.upper()} (KVTUNE_IMAGE_GPU_CLASS). Fix: use the "
                f"kvtune-vllm-{plan.gpu_class.lower()} image for this pool.",
            )
        decision = decide(plan, gpus, context_reserve_bytes=reserve)
        command = build_command(plan, decision, argv, vllm_bin=env.get("KVTUNE_VLLM_BIN", "vllm"))
    except PlanDoesNotFit as refusal:
        message = f"refusing to start {plan.model_id} on {plan.gpu_class}: {refusal.message}"
        _log(message)
        where = publish({"time": now, "started": False, "reason": refusal.reason,
                         "message": refusal.message}, env)
        _log(f"reported to {where}")
        write_termination_message(message)
        return EXIT_REFUSED
    for note in decision.notes:
        _log(note)
    report = {"time": now, "started": True, **decision.to_report(), "command": command}
    _log(f"reported to {publish(report, env)}")
    _log(f"exec: {shlex.join(command)}")
    if env.get("KVTUNE_DRY_RUN") == "1":
        return 0
    exec_fn(command[0], command)
    return 0  # only reached when exec_fn is a test double


def nvml_unavailable(err: Exception, env: dict[str, str]) -> int:
    """No NVML to read (no driver library in the container, no device): refuse with one line,
    reported like any refusal, instead of a traceback and an exit code that says nothing."""
    message = (f"cannot read the GPUs through NVML ({type(err).__name__}: {err}). Fix: run the "
               "pod on a GPU node with the NVIDIA container runtime (a nvidia.com/gpu limit; "
               "runtimeClassName: nvidia where that runtime is not the default)")
    _log(message)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    where = publish({"time": now, "started": False, "reason": "NvmlUnavailable",
                     "message": message}, env)
    _log(f"reported to {where}")
    write_termination_message(message)
    return EXIT_REFUSED


def main() -> int:
    env = dict(os.environ)
    try:
        found = read_gpus()
    # pynvml's NVMLError_* (LibraryNotFound without the driver) or an OSError from ctypes.
    except Exception as err:
        return nvml_unavailable(err, env)
    return run(sys.argv[1:], env, found)


if __name__ == "__main__":
    sys.exit(main())
