"""One measurement run, shared by ``kvtune quality`` and the calibration Job
(``python3 -m kvtune.quality``, which needs only what a vLLM image has: torch, transformers,
numpy, pydantic)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvtune.quality import layouts
from kvtune.quality.report import RANDOM_INIT_NOTE, KVQualityReport
from kvtune.tuner.kv_quality import DEFAULT_MAX_KV_QUANTIZATION_KL

# A container's termination message is cut at 4096 bytes by the kubelet.
TERMINATION_MESSAGE_BYTES = 4096


class RunError(Exception):
    """A bad input, named with its value and the fix; printed as one line."""


@dataclass(frozen=True)
class RunOptions:
    model: Path
    dtypes: tuple[str, ...] = layouts.DEFAULT_DTYPES
    device: str = "auto"
    max_prompt_tokens: int = 2048
    prompts: Path | None = None
    revision: str | None = None
    output: Path | None = None
    termination_log: Path | None = None
    report_annotation: str | None = None  # in a pod: patch the compact report onto it
    max_kl: float = DEFAULT_MAX_KV_QUANTIZATION_KL
    seed: int = 0


def parse_dtypes(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise RunError(f"--dtypes {text!r}: empty; use e.g. fp8,int8_per_token_head")
    for name in names:
        if name not in layouts.LAYOUTS:
            raise RunError(f"--dtypes: {name!r} is not a KV dtype kvtune can measure; use "
                           f"any of {','.join(layouts.LAYOUTS)}")
    return names


def progress(message: str) -> None:
    """The calibration Job's progress: every line to stderr, its log (``kvtune quality``
    passes the cli's progress helper instead)."""
    print(f"[kvtune quality] {message}", file=sys.stderr, flush=True)


def run(options: RunOptions, progress: Callable[[str], None] = progress) -> KVQualityReport:
    from kvtune.quality import measure

    if not options.model.exists() and not measure.looks_like_hub_id(str(options.model)):
        raise RunError(f"--model {options.model}: no such file or directory; pass a model "
                       "directory (config.json + weights), a config.json or a Hugging Face "
                       "id (org/name)")
    if options.max_prompt_tokens < 2:
        raise RunError(f"--max-prompt-tokens {options.max_prompt_tokens}: needs at least 2")
    if options.prompts is not None and not options.prompts.is_file():
        raise RunError(f"--prompts {options.prompts}: no such file; pass a JSONL file of "
                       '{"id", "kind", "text"} objects or leave it out for kvtune\'s set')
    progress(f"loading {options.model} on {options.device} ...")
    try:
        source = measure.resolve_source(str(options.model), options.revision)
        loaded = measure.load_model(source, device=options.device, seed=options.seed)
    except (ValueError, OSError, KeyError) as exc:
        raise RunError(f"--model {options.model}: {exc}") from exc
    if loaded.weights == "random-init":
        progress("WARNING: " + RANDOM_INIT_NOTE)
    progress(f"checkpoint: {loaded.evidence.summary()}")
    prompts = measure.calibration_prompts(options.prompts)
    report = measure.measure(loaded, options.dtypes, prompts=prompts,
                             max_prompt_tokens=options.max_prompt_tokens,
                             revision=options.revision, progress=progress)
    if options.output is not None:
        options.output.write_text(report.model_dump_json(by_alias=True, indent=2) + "\n")
        progress(f"report written to {options.output}")
    if options.termination_log is not None:
        options.termination_log.write_text(termination_message(report))
    if options.report_annotation is not None:
        progress(f"report published: {publish(report, options.report_annotation)}")
    return report


def publish(report: KVQualityReport, annotation: str) -> str:
    """Through the runtime entrypoint's report channel (``kvtune.runtime.report``), as the
    pool's pods report: into the namespace's ConfigMap ``kvtune-runtime-reports`` under this
    pod's name (the pod runs as ``kvtune-runtime``, which may write only that ConfigMap: no
    pod annotation, so ``annotation`` is not used), else the status file."""
    from kvtune.runtime import report as channel

    del annotation  # the report is keyed by the pod's name, not an annotation
    data = json.loads(termination_message(report))
    return str(channel.publish(data))


def termination_message(report: KVQualityReport) -> str:
    """The compact report as JSON within the kubelet's 4096 bytes (flagged layers dropped
    first, then the checkpoint's details, if ever needed)."""
    data = report.compact()
    text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > TERMINATION_MESSAGE_BYTES:
        for m in data["measurements"]:
            m["flagged_layers"] = []
        text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > TERMINATION_MESSAGE_BYTES:
        raise RunError(f"the report needs {len(text.encode())} bytes, more than a termination "
                       f"message holds ({TERMINATION_MESSAGE_BYTES}); measure fewer dtypes")
    return text


def verdict_lines(report: KVQualityReport, max_kl: float) -> list[str]:
    lines = [f"{report.model} ({report.weights}, {report.device}, {report.activation_dtype}): "
             f"{report.prompt_set.prompts} prompts, {report.prompt_set.tokens} tokens, "
             f"{report.seconds:.1f} s"]
    if report.note:
        lines.append(f"NOTE: {report.note}")
    lines.append(f"checkpoint: {report.checkpoint.summary()}")
    for m in report.measurements:
        verdict = "passes" if m.kl_mean <= max_kl else "EXCEEDS"
        lines.append(f"  {m.summary()} -> {verdict} max KL {max_kl:g}"
                     + (f"; flagged layers {m.flagged_layers}" if m.flagged_layers else ""))
    return lines


def main_args(argv: Sequence[str] | None = None) -> int:
    """``python3 -m kvtune.quality``: the calibration Job's command (argparse only)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m kvtune.quality", description=(
        "Measure what quantized KV dtypes do to a model (vLLM 0.33.0's cache layouts)."))
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--dtypes", default=",".join(layouts.DEFAULT_DTYPES))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-prompt-tokens", type=int, default=2048)
    parser.add_argument("--prompts", type=Path, default=None)
    parser.add_argument("--revision", default=None)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--termination-log", type=Path, default=None)
    parser.add_argument("--report-annotation", default=None,
                        help="patch the compact report onto this pod's annotation (in a pod)")
    parser.add_argument("--max-kl", type=float, default=DEFAULT_MAX_KV_QUANTIZATION_KL)
    args = parser.parse_args(argv)
    try:
        report = run(RunOptions(
            model=args.model, dtypes=parse_dtypes(args.dtypes), device=args.device,
            max_prompt_tokens=args.max_prompt_tokens, prompts=args.prompts,
            revision=args.revision, output=args.output, termination_log=args.termination_log,
            report_annotation=args.report_annotation, max_kl=args.max_kl))
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(verdict_lines(report, args.max_kl)))
    return 0
