"""The Prometheus metrics vLLM 0.33.0 exports, as data: names, kinds, label names, buckets.

Read from the pinned wheel's ``vllm/v1/metrics/loggers.py`` and ``buckets.py``; a test
(``tests/operator/profiling/test_op_vllm_metric_names.py``) re-reads those files and fails when a
name, kind or bucket here differs. The profiler, the alert rules, the dashboard and the
replay exporter all take their names from this one table, so they cannot drift apart.

Names are the metric family names; counters carry ``_total`` on the wire (prometheus_client
appends it), histograms ``_bucket``/``_sum``/``_count``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

VLLM_VERSION = "0.33.0"

# Every engine metric carries these; request_success adds finished_reason.
ENGINE_LABELS: tuple[str, ...] = ("model_name", "engine")

MetricKind = Literal["gauge", "counter", "histogram"]

# vllm/v1/metrics/buckets.py, verbatim.
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
TIME_TO_FIRST_TOKEN_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)
REQUEST_NUM_PREEMPTIONS_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 10, 20)
# The ``--kv-cache-metrics`` residency histograms (block lifetime, idle before eviction,
# reuse gap), seconds.
KV_CACHE_RESIDENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300,
    600, 1200, 1800,
)

BucketFamily = Literal[
    "request_latency", "time_to_first_token", "inter_token_latency", "request_tokens",
    "request_num_preemptions", "kv_cache_residency",
]
_STATIC_BUCKETS: dict[str, tuple[float, ...]] = {
    "request_latency": REQUEST_LATENCY_BUCKETS,
    "time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS,
    "inter_token_latency": INTER_TOKEN_LATENCY_BUCKETS,
    "request_num_preemptions": REQUEST_NUM_PREEMPTIONS_BUCKETS,
    "kv_cache_residency": KV_CACHE_RESIDENCY_BUCKETS,
}


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``max_value`` (its
    max_model_len). The largest bound is the last 1-2-5 value <= max_model_len, so a
    quantile above it is only known to lie between that bound and max_model_len."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


def buckets_for(family: BucketFamily, max_model_len: int) -> tuple[float, ...]:
    if family == "request_tokens":
        return build_1_2_5_buckets(max_model_len)
    return _STATIC_BUCKETS[family]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: MetricKind
    documentation: str
    extra_labels: tuple[str, ...] = ()
    bucket_family: BucketFamily | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        return (*ENGINE_LABELS, *self.extra_labels)


NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
NUM_PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached"
REQUEST_SUCCESS = "vllm:request_success"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
REQUEST_PREFILL_KV_COMPUTED_TOKENS = "vllm:request_prefill_kv_computed_tokens"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"
REQUEST_INFERENCE_TIME = "vllm:request_inference_time_seconds"
REQUEST_PREFILL_TIME = "vllm:request_prefill_time_seconds"
REQUEST_DECODE_TIME = "vllm:request_decode_time_seconds"
REQUEST_NUM_PREEMPTIONS = "vllm:request_num_preemptions"
# Prompt tokens by where their KV came from (``source`` label): PromptTokenStats.ALL_SOURCES.
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"
# Cached prompt tokens by the tier that supplied them (``source``: CacheHitSource's values).
PROMPT_TOKENS_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source"
# ``--kv-cache-metrics`` only (sampled blocks of the GPU's block pool, observed at eviction).
KV_BLOCK_LIFETIME = "vllm:kv_block_lifetime_seconds"
KV_BLOCK_IDLE_BEFORE_EVICT = "vllm:kv_block_idle_before_evict_seconds"
KV_BLOCK_REUSE_GAP = "vllm:kv_block_reuse_gap_seconds"
RESIDENCY_METRICS: tuple[str, ...] = (KV_BLOCK_LIFETIME, KV_BLOCK_IDLE_BEFORE_EVICT,
                                      KV_BLOCK_REUSE_GAP)

# vllm/v1/metrics/stats.py ``PromptTokenStats.ALL_SOURCES``.
PROMPT_TOKEN_SOURCES: tuple[str, ...] = ("local_compute", "local_cache_hit",
                                         "external_kv_transfer")
# vllm/v1/metrics/cache_hit_source.py ``CacheHitSource``: device (the GPU's prefix cache),
# host (the CPU tier), p2p, disk, external_unspecified (a connector that does not say).
CACHE_HIT_SOURCES: tuple[str, ...] = ("device", "host", "p2p", "disk", "external_unspecified")

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(NUM_REQUESTS_RUNNING, "gauge", "Number of requests in model execution batches."),
    MetricSpec(NUM_REQUESTS_WAITING, "gauge", "Number of requests waiting to be processed."),
    MetricSpec(KV_CACHE_USAGE_PERC, "gauge", "KV-cache usage. 1 means 100 percent usage."),
    MetricSpec(NUM_PREEMPTIONS, "counter", "Cumulative number of preemption from the engine."),
    MetricSpec(PROMPT_TOKENS, "counter", "Number of prefill tokens processed."),
    MetricSpec(GENERATION_TOKENS, "counter", "Number of generation tokens processed."),
    MetricSpec(PROMPT_TOKENS_CACHED, "counter", "Number of cached prompt tokens."),
    MetricSpec(REQUEST_SUCCESS, "counter", "Count of successfully processed requests.",
               extra_labels=("finished_reason",)),
    MetricSpec(PREFIX_CACHE_QUERIES, "counter",
               "Prefix cache queries, in terms of number of queried tokens."),
    MetricSpec(PREFIX_CACHE_HITS, "counter",
               "Prefix cache hits, in terms of number of cached tokens."),
    MetricSpec(REQUEST_PROMPT_TOKENS, "histogram", "Number of prefill tokens processed.",
               bucket_family="request_tokens"),
    MetricSpec(REQUEST_GENERATION_TOKENS, "histogram",
               "Number of generation tokens processed.", bucket_family="request_tokens"),
    MetricSpec(REQUEST_PREFILL_KV_COMPUTED_TOKENS, "histogram",
               "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
               bucket_family="request_tokens"),
    MetricSpec(TIME_TO_FIRST_TOKEN, "histogram", "Histogram of time to first token in seconds.",
               bucket_family="time_to_first_token"),
    MetricSpec(INTER_TOKEN_LATENCY, "histogram", "Histogram of inter-token latency in seconds.",
               bucket_family="inter_token_latency"),
    MetricSpec(TIME_PER_OUTPUT_TOKEN, "histogram",
               "Histogram of time_per_output_token_seconds per request.",
               bucket_family="inter_token_latency"),
    MetricSpec(E2E_REQUEST_LATENCY, "histogram", "Histogram of e2e request latency in seconds.",
               bucket_family="request_latency"),
    MetricSpec(REQUEST_QUEUE_TIME, "histogram",
               "Histogram of time spent in WAITING phase for request.",
               bucket_family="request_latency"),
    MetricSpec(REQUEST_INFERENCE_TIME, "histogram",
               "Histogram of time spent in RUNNING phase for request.",
               bucket_family="request_latency"),
    MetricSpec(REQUEST_PREFILL_TIME, "histogram",
               "Histogram of time spent in PREFILL phase for request.",
               bucket_family="request_latency"),
    MetricSpec(REQUEST_DECODE_TIME, "histogram",
               "Histogram of time spent in DECODE phase for request.",
               bucket_family="request_latency"),
    MetricSpec(REQUEST_NUM_PREEMPTIONS, "histogram",
               "Number of preemptions per finished request.",
               bucket_family="request_num_preemptions"),
    MetricSpec(PROMPT_TOKENS_BY_SOURCE, "counter", "Number of prompt tokens by source.",
               extra_labels=("source",)),
    MetricSpec(PROMPT_TOKENS_CACHED_BY_SOURCE, "counter",
               "Prefix-cache hit tokens by the cache tier that supplied them.",
               extra_labels=("source",)),
    MetricSpec(KV_BLOCK_LIFETIME, "histogram",
               "Histogram of KV cache block lifetime from allocation to eviction.",
               bucket_family="kv_cache_residency"),
    MetricSpec(KV_BLOCK_IDLE_BEFORE_EVICT, "histogram",
               "Histogram of idle time before KV cache block eviction.",
               bucket_family="kv_cache_residency"),
    MetricSpec(KV_BLOCK_REUSE_GAP, "histogram",
               "Histogram of time gaps between consecutive KV cache block accesses.",
               bucket_family="kv_cache_residency"),
)
# The label values of each labelled counter (besides request_success's finished_reason).
SOURCE_LABELS: dict[str, tuple[str, ...]] = {
    PROMPT_TOKENS_BY_SOURCE: PROMPT_TOKEN_SOURCES,
    PROMPT_TOKENS_CACHED_BY_SOURCE: CACHE_HIT_SOURCES,
}
METRICS_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}

# vllm:cache_config_info is a gauge fixed at 1 whose labels are CacheConfig's fields
# (str() of each value, so None -> "None", True -> "True") plus "engine". kvtune reads these.
CACHE_CONFIG_INFO_LABELS: tuple[str, ...] = (
    "block_size", "cache_dtype", "gpu_memory_utilization", "enable_prefix_caching",
    "prefix_caching_hash_algo", "num_gpu_blocks", "num_cpu_blocks", "kv_cache_memory_bytes",
    "kv_offloading_size", "kv_offloading_backend", "kv_cache_size_tokens", "engine",
)

# FinishReason's strings (vllm/v1/engine/__init__.py).
FINISHED_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")


def wire_name(name: str, kind: MetricKind) -> str:
    """The sample name a counter has on the wire (``vllm:prompt_tokens_total``)."""
    return f"{name}_total" if kind == "counter" else name


def counter(name: str) -> str:
    """The wire name of a counter from this table (fails loudly on a typo)."""
    spec = METRICS_BY_NAME[name]
    assert spec.kind == "counter", name
    return wire_name(name, "counter")


def window_buckets(histogram: str, series: str, window: str) -> str:
    """PromQL for a histogram's cumulative buckets over a window, summed across pods.

    ``increase()`` extrapolates each bucket on its own, so the reply may dent
    (``prom_replies.buckets`` mends what extrapolation can explain)."""
    spec = METRICS_BY_NAME[histogram]
    assert spec.kind == "histogram", histogram
    return f"sum by (le) (increase({histogram}_bucket{series}[{window}]))"
