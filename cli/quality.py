"""`kvtune quality`: measure what quantized KV dtypes do to a model, locally (CPU or GPU)."""

from __future__ import annotations

from pathlib import Path

import click

from kvtune.cli.params import POSITIVE
from kvtune.cli.progress import Progress, progress_option
from kvtune.quality import layouts
from kvtune.tuner.kv_quality import DEFAULT_MAX_KV_QUANTIZATION_KL


@click.command()
@click.option("--model", "-m", required=True, type=click.Path(path_type=Path),
              help="A model directory (config.json + safetensors, tokenizer) or a config.json "
                   "(random weights: proves the mechanics, not the model's quality).")
@click.option("--dtypes", default=",".join(layouts.DEFAULT_DTYPES), show_default=True,
              help=f"KV dtypes to measure, comma-separated: any of {','.join(layouts.LAYOUTS)}.")
@click.option("--device", default="auto", show_default=True,
              help="auto (cuda when available), cpu, cuda, cuda:1 ...")
@click.option("--max-prompt-tokens", type=click.IntRange(1, 1 << 24), default=2048,
              show_default=True,
              help="Each calibration prompt is cut to this many tokens.")
@click.option("--prompts", type=click.Path(path_type=Path), default=None,
              help="A JSONL file of {id, kind, text} prompts instead of kvtune's set.")
@click.option("--revision", default=None, help="The model revision, recorded in the report.")
@click.option("--max-kl", type=POSITIVE, default=DEFAULT_MAX_KV_QUANTIZATION_KL,
              show_default=True, help="The verdict's limit on mean next-token KL (nats), "
              "as quality.maxKVQuantizationKL.")
@click.option("--out-file", "output", type=click.Path(path_type=Path), default=None,
              help="Write the full report (JSON) here.")
@progress_option()
def quality(model: Path, dtypes: str, device: str, max_prompt_tokens: int,
            prompts: Path | None, revision: str | None, max_kl: float,
            output: Path | None, progress: bool | None) -> None:
    """Measure KV-quantization error (vLLM 0.33.0's layouts) against 16-bit KV."""
    from kvtune.quality import run as runner

    try:
        with Progress("quality", progress) as shown:
            report = runner.run(runner.RunOptions(
                model=model, dtypes=runner.parse_dtypes(dtypes), device=device,
                max_prompt_tokens=max_prompt_tokens, prompts=prompts, revision=revision,
                output=output, max_kl=max_kl), progress=shown)
    except runner.RunError as exc:
        raise click.ClickException(str(exc)) from None
    except ImportError as exc:
        # torch, transformers and safetensors are the quality extra (a laptop planning
        # install leaves them out): say so instead of a traceback.
        missing = exc.name or str(exc)
        raise click.ClickException(
            f"kvtune quality needs {missing!r}, which is not installed (it runs the model "
            "with torch and transformers); pip install 'kvtune[quality]'") from None
    click.echo("\n".join(runner.verdict_lines(report, max_kl)))
