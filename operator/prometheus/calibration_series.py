"""The closed loop's window from Prometheus: what vLLM measured of one pool, as the model
calibration needs it (``tuner/model_calibration.py``, docs/calibration-loop.md).

Series (vLLM 0.33.0's names, ``vllm_metrics``):

- ``vllm:cache_config_info``: ``num_gpu_blocks`` and ``block_size`` the engine sized at start-up
  (the smallest over the pool's pods: the one that holds least);
- ``vllm:inter_token_latency_seconds``: the mean decode step a running request saw (sum/count),
  with the count (output tokens after the first) as the decode evidence;
- ``vllm:request_prefill_time_seconds``: the mean prefill time of a request, its count
  (finished requests) the prefill evidence; ``vllm:request_prefill_kv_computed_tokens``: the
  mean tokens prefilled (prefix hits excluded);
- ``vllm:num_requests_running``: the mean batch; ``vllm:request_prompt_tokens`` and
  ``vllm:request_generation_tokens``: the mean context a running request holds (its prompt and
  half its output).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvtune.operator.prometheus import prom_http
from kvtune.operator.prometheus import prom_replies as replies
from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.operator.prometheus.prom_http import PrometheusAccess
from kvtune.operator.prometheus.selectors import SeriesSelector


@dataclass(frozen=True, slots=True)
class CalibrationWindow:
    """One pool's window; None where the series had no data."""

    num_gpu_blocks: int | None
    block_size: int | None
    decode_seconds_mean: float | None
    decode_tokens: int
    prefill_seconds_mean: float | None
    prefill_requests: int
    prefill_tokens_mean: float | None
    running_mean: float | None
    context_tokens_mean: float | None


def queries(series: SeriesSelector, window_seconds: float) -> dict[str, str]:
    """The PromQL of one window, by name."""
    s, w = series.promql(), f"{int(window_seconds)}s"
    info_s = series.without("model_name").promql()

    def inc(sample: str) -> str:
        return f"sum(increase({sample}{s}[{w}]))"

    return {
        "blocks": f"min by (num_gpu_blocks, block_size) "
                  f"(last_over_time({vm.CACHE_CONFIG_INFO}{info_s}[{w}]))",
        "itl_sum": inc(f"{vm.INTER_TOKEN_LATENCY}_sum"),
        "itl_count": inc(f"{vm.INTER_TOKEN_LATENCY}_count"),
        "prefill_sum": inc(f"{vm.REQUEST_PREFILL_TIME}_sum"),
        "prefill_count": inc(f"{vm.REQUEST_PREFILL_TIME}_count"),
        "computed_sum": inc(f"{vm.REQUEST_PREFILL_KV_COMPUTED_TOKENS}_sum"),
        "computed_count": inc(f"{vm.REQUEST_PREFILL_KV_COMPUTED_TOKENS}_count"),
        "prompt_sum": inc(f"{vm.REQUEST_PROMPT_TOKENS}_sum"),
        "prompt_count": inc(f"{vm.REQUEST_PROMPT_TOKENS}_count"),
        "output_sum": inc(f"{vm.REQUEST_GENERATION_TOKENS}_sum"),
        "running_mean": f"avg(avg_over_time({vm.NUM_REQUESTS_RUNNING}{s}[{w}]))",
    }


def _mean(total: float | None, count: float | None) -> float | None:
    return None if total is None or not count else total / count


def _blocks(samples: list[replies.Sample]) -> tuple[int | None, int | None]:
    """The fewest blocks of any pod and its block size ("None" before the engine sized)."""
    found: list[tuple[int, int]] = []
    for sample in samples:
        try:
            found.append((int(sample.metric["num_gpu_blocks"]), int(sample.metric["block_size"])))
        except (KeyError, ValueError):
            continue
    if not found:
        return None, None
    return min(found)


def read_window(url: str, series: SeriesSelector, window_seconds: float, *,
                access: PrometheusAccess, at_unix_seconds: float | None = None
                ) -> CalibrationWindow:
    """Run the window's queries (``prom_http``: allow-listed, bounded); raises
    ``PrometheusUnavailable`` (``PrometheusDataInvalid`` for replies kvtune does not trust)."""
    at = time.time() if at_unix_seconds is None else at_unix_seconds
    wanted = queries(series, window_seconds)
    got: dict[str, float | None] = {}
    blocks: tuple[int | None, int | None] = (None, None)
    for name, promql in wanted.items():
        samples = replies.vector(
            prom_http.query(url, promql, at_unix_seconds=at, access=access, name=name), name)
        if name == "blocks":
            blocks = _blocks(samples)
        else:
            got[name] = replies.scalar(samples, name)
    prompt = _mean(got["prompt_sum"], got["prompt_count"])
    output = _mean(got["output_sum"], got["prompt_count"])
    return CalibrationWindow(
        num_gpu_blocks=blocks[0], block_size=blocks[1],
        decode_seconds_mean=_mean(got["itl_sum"], got["itl_count"]),
        decode_tokens=int(got["itl_count"] or 0),
        prefill_seconds_mean=_mean(got["prefill_sum"], got["prefill_count"]),
        prefill_requests=int(got["prefill_count"] or 0),
        prefill_tokens_mean=_mean(got["computed_sum"], got["computed_count"]),
        running_mean=got["running_mean"],
        # A running request holds its prompt and, on average, half its output.
        context_tokens_mean=None if prompt is None else prompt + (output or 0.0) / 2,
    )
