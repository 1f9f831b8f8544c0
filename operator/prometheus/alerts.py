"""SLO and KV-cache alert rules per InferenceDeployment. Pure: spec/status in, rules out.

Rendered two ways from one list of rule groups: a ``PrometheusRule`` (Prometheus operator)
and a plain rule file (``rule_files:`` of a stock Prometheus). ``promtool check rules`` and
``promtool test rules`` run on both in the tests.

The alerts, from the article's "how to measure KV cache efficiency" and the spec's SLOs:

- KVCacheSaturated: usage > 90 % for 5 minutes while requests wait (the cache, not compute,
  holds requests back).
- KVCacheUnderused: usage < 40 % over 30 minutes while serving traffic: the cache is
  oversized, or eviction is too aggressive (blocks freed and evicted before they are reused;
  vLLM's ``kv_block_idle_before_evict_seconds`` with ``--kv-cache-metrics`` shows it).
- PrefixCacheHitRateLow: hit rate < 30 % where the workload shares prefixes.
- PrefixCacheTTFTGapSmall: vLLM 0.33 does not split TTFT by cache status, so the rule uses
  the prefill work a cached request is spared: prompt tokens / prefill tokens computed per
  request. Under 1.5x, cached requests cannot be 1.5x faster to first token (the article's
  "prefix caching is not activating" threshold). It is the same signal as a hit rate under
  1/3, measured per request; it is rendered only where prefixes are shared.
- KVCachePreemptionsRising: preemptions sustained (> 1 a minute over 10 minutes) and above
  twice the previous hour's rate.
- TTFT/TPOT SLO burn: multi-window, multi-burn-rate alerts (Google SRE workbook, ch. 5):
  page at 14.4x over 1h and 5m or 6x over 6h and 30m, ticket at 3x over 1d and 2h or 1x
  over 3d and 6h. A "p95 under X" SLO is a 5 % error budget of requests slower than X; X
  is read at ``le`` = X where the pods render kvtune's SLO buckets (``slo_buckets``: X is
  then a bound), else rounded down to vLLM's default bound (stricter, never laxer), said in
  the alert.
- KVCacheCapacityOffPlan: ``vllm:cache_config_info``'s ``num_gpu_blocks`` more than 15 %
  from what the plan expects (the memory model is wrong for this GPU, or someone changed
  the runtime). The label is matched with a numeric-range regex (PromQL cannot read a label
  as a number).
- KVCacheVRAMShareHigh / KVCacheVRAMShareLow: the KV cache holds more than half of the
  GPU's memory (quantize the KV cache or the weights: fp8 halves it) or less than a fifth
  (raise the batch: max-num-seqs, gpu-memory-utilization). vLLM exports no KV bytes; the
  share is ``vllm:cache_config_info``'s ``num_gpu_blocks`` x the plan's KV bytes per block
  (``status.pools[].expected.kvCacheBytes / numGpuBlocks``) over the GPU class's memory,
  read as a numeric range on the label (as KVCacheCapacityOffPlan); rendered once the pool
  has a plan.
- KVTuneProfileStale: kvtune cannot profile this deployment's traffic. The operator's own
  failures that no deployment owns (KVTuneReconcileErrors, KVTuneOperatorDown) are in the
  chart's PrometheusRule once (charts/kvtune/templates/prometheusrule.yaml), not copied into
  every deployment's rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvtune.operator.prometheus import slo_buckets
from kvtune.operator.prometheus import vllm_metrics as vm

RECORD_PREFIX = "kvtune"


class PoolAlertInput(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pool: str
    object_name: str  # the Deployment: its pods are named <object_name>-<hash>-<id>
    expected_num_gpu_blocks: int | None = None
    # For the VRAM share of the KV cache: the plan's KV bytes per block on one GPU, and
    # the GPU's memory (what the CUDA runtime reports).
    kv_bytes_per_block: float | None = Field(default=None, gt=0)
    gpu_memory_bytes: int | None = Field(default=None, gt=0)


class AlertInputs(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    name: str
    model_name: str
    ttft_p95_seconds: float | None = None
    tpot_p95_seconds: float | None = None
    shares_prefixes: bool = False
    pools: tuple[PoolAlertInput, ...] = ()
    # Label matchers every vLLM series of this deployment carries (set by the scrape config).
    target_labels: dict[str, str] = Field(default_factory=dict)
    capacity_tolerance: float = Field(default=0.15, gt=0, lt=1)
    profile_window_seconds: float = Field(default=6 * 3600, gt=0)
    # The pods render the SLO targets as bucket bounds (``slo_buckets.rendered_for``): the
    # burn rules then read le="<target>"; without them, the default bound at or below it.
    slo_buckets_rendered: bool = False


def _sel(labels: Mapping[str, str], extra: str = "") -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"')

    parts = [f'{k}="{esc(v)}"' for k, v in sorted(labels.items())]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}"


def le_string(bound: float) -> str:
    """A bucket bound as prometheus_client writes it in ``le`` (vLLM uses prometheus_client):
    floats in Go's format, 1 -> "1.0", 0.075 -> "0.075"."""
    text = repr(float(bound))
    return text


def slo_bucket(threshold_seconds: float, bounds: tuple[float, ...]) -> float:
    """The largest bucket bound <= the SLO threshold (stricter); the smallest bound when the
    threshold is below all of them."""
    return slo_buckets.lower_bound(threshold_seconds, bounds)


def _fmt_duration(seconds: float) -> str:
    seconds = max(1, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# --- numeric ranges as regular expressions (for num_gpu_blocks) ----------------------------


def _range_pattern(start: int, stop: int) -> str:
    a, b = str(start), str(stop)
    assert len(a) == len(b), (start, stop)
    pattern, any_digits = "", 0
    for da, db in zip(a, b, strict=True):
        if da == db:
            pattern += da
        elif da != "0" or db != "9":
            pattern += f"[{da}-{db}]"
        else:
            any_digits += 1
    if any_digits:
        pattern += "[0-9]" if any_digits == 1 else f"[0-9]{{{any_digits}}}"
    return pattern


def integer_range_regex(lo: int, hi: int) -> str:
    """A RE2 regex matching exactly the decimal integers lo..hi (no leading zeros)."""
    if lo < 0 or hi < lo:
        raise ValueError(f"integer_range_regex({lo}, {hi}): need 0 <= lo <= hi")
    stops = {hi}
    nines = 1
    while True:
        s = str(lo)
        stop = int((s[:-nines] if nines < len(s) else "") + "9" * nines)
        if not lo <= stop < hi:
            break
        stops.add(stop)
        nines += 1
    zeros = 1
    while True:
        stop = (hi + 1) - (hi + 1) % 10**zeros - 1
        if not lo < stop <= hi:  # stops shrink as zeros grow: hi itself is no end
            break
        stops.add(stop)
        zeros += 1
    parts = []
    start = lo
    for stop in sorted(stops):
        # Split where the digit count changes (e.g. 95..105).
        while len(str(start)) < len(str(stop)):
            edge = 10 ** len(str(start)) - 1
            parts.append(_range_pattern(start, edge))
            start = edge + 1
        parts.append(_range_pattern(start, stop))
        start = stop + 1
    return "|".join(parts)


# --- the rules ------------------------------------------------------------------------------

# (name, severity, long window, short window, burn factor) — SRE workbook table 5-8.
BURN_WINDOWS: tuple[tuple[str, str, str, str, float], ...] = (
    ("Fast", "page", "1h", "5m", 14.4),
    ("Medium", "page", "6h", "30m", 6.0),
    ("Slow", "ticket", "1d", "2h", 3.0),
    ("Slowest", "ticket", "3d", "6h", 1.0),
)
SLO_TARGET = 0.95  # "p95 under X": 95 % of requests under X


def _burn_group(inp: AlertInputs, kind: str, histogram: str, threshold: float,
                family: str, labels: dict[str, str]) -> dict[str, Any]:
    s = _sel({**inp.target_labels, "namespace": inp.namespace, "model_name": inp.model_name})
    read = slo_buckets.slo_bound(threshold, family, inp.slo_buckets_rendered)
    bound = read.bound_seconds
    good = f'{histogram}_bucket{_sel({**inp.target_labels, "namespace": inp.namespace, "model_name": inp.model_name, "le": le_string(bound)})}'  # noqa: E501
    total = f"{histogram}_count{s}"
    budget = 1 - SLO_TARGET
    rules: list[dict[str, Any]] = []
    windows = sorted({w for _, _, long_w, short_w, _ in BURN_WINDOWS for w in (long_w, short_w)},
                     key=lambda w: _seconds(w))
    rec = f"{RECORD_PREFIX}:{kind}_slo_errors:ratio_rate"
    for w in windows:
        rules.append({
            "record": f"{rec}{w}",
            "expr": f"1 - (sum(rate({good}[{w}])) / sum(rate({total}[{w}])))",
            "labels": labels,
        })
    pretty = "TTFT" if kind == "ttft" else "TPOT"
    for speed, severity, long_w, short_w, factor in BURN_WINDOWS:
        rules.append({
            "alert": f"{pretty}SLOBurn{speed}",
            "expr": (f"{rec}{long_w}{_sel(labels)} > ({factor} * {budget:.4g}) and "
                     f"{rec}{short_w}{_sel(labels)} > ({factor} * {budget:.4g})"),
            "labels": {**labels, "severity": severity},
            "annotations": {
                "summary": f"{inp.namespace}/{inp.name}: {pretty} SLO budget burning "
                           f"{factor}x over {long_w} and {short_w}",
                "description": (
                    f"{read.describe(pretty + ' p95')}; measured as requests slower than "
                    f"the {bound:g}s bucket bound; error budget {budget:.0%}. Error ratio "
                    f"over {long_w}: "
                    f"{{{{ $value | humanizePercentage }}}}."),
            },
        })
    return {"name": f"kvtune-{inp.namespace}-{inp.name}-{kind}-slo", "rules": rules}


def _seconds(w: str) -> float:
    return float(w[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[w[-1]]


def rule_groups(inp: AlertInputs) -> list[dict[str, Any]]:
    labels = {"namespace": inp.namespace, "kvtune_deployment": inp.name}
    kv_rules = [*_kv_usage_rules(inp, labels), *_prefix_rules(inp, labels),
                _preemption_rule(inp, labels), *_capacity_rules(inp, labels)]
    for pool in inp.pools:
        kv_rules.extend(_vram_share_rules(inp, pool, labels))
    groups = [
        {"name": f"kvtune-{inp.namespace}-{inp.name}-kv-cache", "rules": kv_rules},
        {"name": f"kvtune-{inp.namespace}-{inp.name}-operator",
         "rules": _operator_rules(inp, labels)},
    ]
    if inp.ttft_p95_seconds is not None:
        groups.append(_burn_group(inp, "ttft", vm.TIME_TO_FIRST_TOKEN, inp.ttft_p95_seconds,
                                  slo_buckets.TTFT_FAMILY, labels))
    if inp.tpot_p95_seconds is not None:
        groups.append(_burn_group(inp, "tpot", vm.TIME_PER_OUTPUT_TOKEN, inp.tpot_p95_seconds,
                                  slo_buckets.TPOT_FAMILY, labels))
    return groups


def _kv_usage_rules(inp: AlertInputs, labels: dict[str, str]) -> list[dict[str, Any]]:
    """The KV cache saturated (requests wait) or underused (while serving)."""
    base = {**inp.target_labels, "namespace": inp.namespace, "model_name": inp.model_name}
    s = _sel(base)
    by = "by (namespace, model_name, instance, engine)"
    usage = vm.KV_CACHE_USAGE_PERC
    who = f"{inp.namespace}/{inp.name}"
    return [
        {
            "alert": "KVCacheSaturated",
            "expr": (f"max {by} ({usage}{s}) > 0.9 and "
                     f"max {by} ({vm.NUM_REQUESTS_WAITING}{s}) > 0"),
            "for": "5m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {
                "summary": f"{who}: KV cache over 90 % with requests waiting",
                "description": ("KV cache usage {{ $value | humanizePercentage }} on "
                                "{{ $labels.instance }} for 5m while requests wait: the cache "
                                "is undersized for this traffic (a narrower KV dtype, a "
                                "smaller max-model-len or more replicas)."),
            },
        },
        {
            "alert": "KVCacheUnderused",
            "expr": (f"avg {by} (avg_over_time({usage}{s}[30m])) < 0.4 and "
                     f"sum {by} (rate({vm.counter(vm.REQUEST_SUCCESS)}{s}[30m])) > 0"),
            "for": "30m",
            "labels": {**labels, "severity": "info"},
            "annotations": {
                "summary": f"{who}: KV cache under 40 % used while serving",
                "description": ("Mean KV cache usage {{ $value | humanizePercentage }} over "
                                "30m while serving: the cache is oversized for this traffic "
                                "(raise max-num-seqs, or give memory back), or eviction is "
                                "too aggressive (prefix hit rate low: blocks are freed and "
                                "evicted before they are reused; see vLLM's "
                                "kv_block_idle_before_evict_seconds with --kv-cache-metrics)."),
            },
        },
    ]


def _prefix_rules(inp: AlertInputs, labels: dict[str, str]) -> list[dict[str, Any]]:
    """On a workload that shares prefixes: the prefix cache's hit rate and what it saves."""
    if not inp.shares_prefixes:
        return []
    base = {**inp.target_labels, "namespace": inp.namespace, "model_name": inp.model_name}
    s = _sel(base)
    who = f"{inp.namespace}/{inp.name}"
    kv_rules: list[dict[str, Any]] = []
    hits = f"sum(rate({vm.counter(vm.PREFIX_CACHE_HITS)}{s}[30m]))"
    queries = f"sum(rate({vm.counter(vm.PREFIX_CACHE_QUERIES)}{s}[30m]))"
    kv_rules.append({
        "alert": "PrefixCacheHitRateLow",
        "expr": f"({hits} / {queries}) < 0.3 and {queries} > 0",
        "for": "30m",
        "labels": {**labels, "severity": "warning"},
        "annotations": {
            "summary": f"{who}: prefix cache hit rate under 30 %",
            "description": ("Prefix cache hit rate {{ $value | humanizePercentage }} over "
                            "30m on a workload that shares prefixes: prefix caching is off "
                            "or not working (block size, cache_salt, eviction)."),
        },
    })
    prompt = f"sum(rate({vm.REQUEST_PROMPT_TOKENS}_sum{s}[30m]))"
    computed = f"sum(rate({vm.REQUEST_PREFILL_KV_COMPUTED_TOKENS}_sum{s}[30m]))"
    kv_rules.append({
        "alert": "PrefixCacheTTFTGapSmall",
        "expr": f"({prompt} / {computed}) < 1.5 and {computed} > 0",
        "for": "30m",
        "labels": {**labels, "severity": "warning"},
        "annotations": {
            "summary": f"{who}: cached requests are spared under 1.5x of prefill",
            "description": ("Prompt tokens per prefill token computed: {{ $value }} over "
                            "30m. Cached requests cannot reach first token 1.5x faster "
                            "than uncached ones (vLLM 0.33 does not split TTFT by cache "
                            "status; this is the prefill work the cache saves)."),
        },
    })
    return kv_rules


def _preemption_rule(inp: AlertInputs, labels: dict[str, str]) -> dict[str, Any]:
    """Preemptions over 10m at more than twice the previous hour's rate."""
    base = {**inp.target_labels, "namespace": inp.namespace, "model_name": inp.model_name}
    s = _sel(base)
    who = f"{inp.namespace}/{inp.name}"
    pre = vm.counter(vm.NUM_PREEMPTIONS)
    return {
        "alert": "KVCachePreemptionsRising",
        "expr": (f"sum(rate({pre}{s}[10m])) > (1 / 60) and "
                 f"sum(rate({pre}{s}[10m])) > 2 * (sum(rate({pre}{s}[1h] offset 10m)) "
                 f"or vector(0))"),
        "for": "10m",
        "labels": {**labels, "severity": "warning"},
        "annotations": {
            "summary": f"{who}: KV cache preemptions rising",
            "description": ("{{ $value | humanize }} preemptions/s over 10m, more than twice "
                            "the previous hour: requests are evicted and recomputed for lack "
                            "of KV blocks."),
        },
    }


def _capacity_rules(inp: AlertInputs, labels: dict[str, str]) -> list[dict[str, Any]]:
    """Per pool with an expected block count: the runtime's blocks off the plan."""
    who = f"{inp.namespace}/{inp.name}"
    kv_rules: list[dict[str, Any]] = []
    for pool in inp.pools:
        if pool.expected_num_gpu_blocks is None:
            continue
        lo = math.floor(pool.expected_num_gpu_blocks * (1 - inp.capacity_tolerance))
        hi = math.ceil(pool.expected_num_gpu_blocks * (1 + inp.capacity_tolerance))
        info_sel = _sel({**inp.target_labels, "namespace": inp.namespace},
                        f'pod=~"{pool.object_name}-.*",'
                        f'num_gpu_blocks!~"{integer_range_regex(lo, hi)}"')
        kv_rules.append({
            "alert": "KVCacheCapacityOffPlan",
            "expr": f"count by (namespace, pod, num_gpu_blocks) ({vm.CACHE_CONFIG_INFO}{info_sel})"
                    " > 0",
            "for": "15m",
            "labels": {**labels, "severity": "warning", "pool": pool.pool},
            "annotations": {
                "summary": f"{who} pool {pool.pool}: KV capacity differs from the plan",
                "description": (f"{{{{ $labels.pod }}}} runs num_gpu_blocks="
                                f"{{{{ $labels.num_gpu_blocks }}}}; the plan expects "
                                f"{pool.expected_num_gpu_blocks} (±"
                                f"{inp.capacity_tolerance:.0%}). The memory model is off for "
                                f"this GPU or the runtime was changed by hand."),
            },
        })
    return kv_rules


def _operator_rules(inp: AlertInputs, labels: dict[str, str]) -> list[dict[str, Any]]:
    """kvtune's own: the profile is stale."""
    who = f"{inp.namespace}/{inp.name}"
    op_sel = _sel({"namespace": inp.namespace, "name": inp.name})
    stale_after = 3 * inp.profile_window_seconds
    return [
        {
            "alert": "KVTuneProfileStale",
            "expr": (f"max(kvtune_profile_stale{op_sel}) == 1 or "
                     f"(time() - max(kvtune_profile_last_success_timestamp_seconds{op_sel})) "
                     f"> {stale_after:g}"),
            "for": "15m",
            "labels": {**labels, "severity": "warning"},
            "annotations": {
                "summary": f"{who}: kvtune cannot profile the traffic",
                "description": ("Prometheus queries fail or the last good profile is older "
                                f"than {_fmt_duration(stale_after)}; kvtune keeps the last "
                                "plan and does not re-tune (see the ProfileStale condition)."),
            },
        },
    ]


# The article's bounds on the share of GPU memory the KV cache holds.
VRAM_SHARE_HIGH, VRAM_SHARE_LOW = 0.5, 0.2
# num_gpu_blocks above any GPU's (the upper end of the "more than half" range).
_MAX_BLOCKS = 10**8 - 1


def _vram_share_rules(inp: AlertInputs, pool: PoolAlertInput, labels: dict[str, str]
                      ) -> list[dict[str, Any]]:
    """KVCacheVRAMShareHigh/Low for one pool: the share is num_gpu_blocks x bytes per
    block / GPU memory, so each bound is a block count, matched on the label."""
    if pool.kv_bytes_per_block is None or pool.gpu_memory_bytes is None:
        return []
    blocks_at = {share: share * pool.gpu_memory_bytes / pool.kv_bytes_per_block
                 for share in (VRAM_SHARE_HIGH, VRAM_SHARE_LOW)}
    above = math.floor(blocks_at[VRAM_SHARE_HIGH]) + 1  # share > 1/2
    below = math.ceil(blocks_at[VRAM_SHARE_LOW]) - 1  # share < 1/5
    who = f"{inp.namespace}/{inp.name} pool {pool.pool}"
    share = (f"{{{{ $labels.num_gpu_blocks }}}} blocks x {pool.kv_bytes_per_block / 2**20:.3g}"
             f" MiB of {pool.gpu_memory_bytes / 2**30:.3g} GiB")
    rules = []
    for name, lo, hi, what, advice in (
        ("KVCacheVRAMShareHigh", above, _MAX_BLOCKS, "more than half",
         "quantize: an fp8 KV cache (kv-cache-dtype=fp8) or fp8 weights give memory back "
         "at the same capacity"),
        ("KVCacheVRAMShareLow", 0, below, "less than a fifth",
         "raise the batch: the weights leave little room; a larger max-num-seqs or "
         "gpu-memory-utilization, tensor parallelism or a larger GPU"),
    ):
        if lo > hi:
            continue  # the bound is out of reach on this GPU
        sel = _sel({**inp.target_labels, "namespace": inp.namespace},
                   f'pod=~"{pool.object_name}-.*",'
                   f'num_gpu_blocks=~"{integer_range_regex(lo, hi)}"')
        rules.append({
            "alert": name,
            "expr": f"count by (namespace, pod, num_gpu_blocks) ({vm.CACHE_CONFIG_INFO}{sel})"
                    " > 0",
            "for": "15m",
            "labels": {**labels, "severity": "info", "pool": pool.pool},
            "annotations": {
                "summary": f"{who}: the KV cache holds {what} of GPU memory",
                "description": (f"{{{{ $labels.pod }}}}: {share} (the plan's bytes per "
                                f"block, vllm:cache_config_info's blocks): {advice}."),
            },
        })
    return rules


def rule_file(inp: AlertInputs) -> dict[str, Any]:
    """A plain Prometheus rule file (``rule_files:``)."""
    return {"groups": rule_groups(inp)}


def prometheus_rule(inp: AlertInputs, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ``monitoring.coreos.com/v1`` PrometheusRule with the same groups."""
    meta: dict[str, Any] = {
        "name": f"{inp.name}-kvtune"[:253],
        "namespace": inp.namespace,
        "labels": {"app.kubernetes.io/managed-by": "kvtune",
                   "kvtune.io/deployment": inp.name},
    }
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": meta, "spec": {"groups": rule_groups(inp)}}


def inputs_from_body(body: Mapping[str, Any]) -> AlertInputs:
    """AlertInputs from an InferenceDeployment object (spec and, if present, status)."""
    from kvtune.operator.api import InferenceDeploymentSpec
    from kvtune.operator.api.names import object_name

    meta = body["metadata"]
    spec = InferenceDeploymentSpec.model_validate(body.get("spec") or {})
    status = body.get("status") or {}
    expected = {p.get("name"): (p.get("expected") or {}).get("numGpuBlocks")
                for p in status.get("pools") or []}
    vram = {p.get("name"): _vram_inputs(p) for p in status.get("pools") or []}
    observed_hit = (status.get("profile") or {}).get("prefixHitRate")
    w = spec.workload
    shares = bool((w.shared_prefix_tokens or 0) > 0 or w.multi_turn
                  or w.profile in ("rag", "agent", "multi-tenant")
                  or (observed_hit is not None and observed_hit > 0.1))
    window = 6 * 3600.0
    if spec.tuning.prometheus is not None:
        from kvtune.operator.api.durations import parse_duration
        window = parse_duration(spec.tuning.prometheus.window,
                                field="spec.tuning.prometheus.window")
    return AlertInputs(
        namespace=meta["namespace"], name=meta["name"], model_name=spec.model.name,
        ttft_p95_seconds=spec.slo.ttft_p95_seconds() if spec.slo else None,
        tpot_p95_seconds=spec.slo.tpot_p95_seconds() if spec.slo else None,
        shares_prefixes=shares,
        pools=tuple(PoolAlertInput(pool=p.pool_name, object_name=object_name(meta["name"],
                                                                             p.pool_name),
                                   expected_num_gpu_blocks=expected.get(p.pool_name),
                                   **vram.get(p.pool_name, {}))
                    for p in spec.pools),
        profile_window_seconds=window,
        slo_buckets_rendered=slo_buckets.rendered_for(
            spec.slo is not None and (spec.slo.ttft_p95 or spec.slo.tpot_p95) is not None,
            spec.runtime.pod_template is not None),
    )


def _vram_inputs(pool_status: Mapping[str, Any]) -> dict[str, Any]:
    """The VRAM-share figures of one pool's status: its plan's KV bytes per block and its
    GPU class's memory; none when the pool has no plan yet or the class is unknown here."""
    from kvtune.tuner.errors import KVTuneError
    from kvtune.tuner.facts import gpus

    exp = pool_status.get("expected") or {}
    kv_bytes, blocks = exp.get("kvCacheBytes"), exp.get("numGpuBlocks")
    if not kv_bytes or not blocks or not pool_status.get("gpuClass"):
        return {}
    try:
        gpu = gpus.get_gpu_class(str(pool_status["gpuClass"]))
    except KVTuneError:
        return {}
    return {"kv_bytes_per_block": kv_bytes / blocks, "gpu_memory_bytes": gpu.cuda_total_bytes}
