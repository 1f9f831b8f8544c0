"""A small model of one vLLM instance, enough to produce metrics that behave like vLLM's.

Pure: no clock, no I/O. The caller feeds requests (``submit``) and advances model time
(``advance_to``); the instance keeps vLLM's counters, gauges and histograms as plain data
(``InstanceMetrics``), which the exporter (``replay_exporter.py``) serves under vLLM's names.

What it models, and how coarsely:
- A paged KV cache of ``num_gpu_blocks`` blocks of ``block_size`` tokens. Blocks are
  ref-counted; full prompt blocks carry a prefix key, and when freed they stay cached in an
  LRU list until a new allocation evicts them (vLLM's free queue). Usage is
  ``1 - free/total`` with cached-but-free blocks counted as free, as ``BlockPool.get_usage``.
- FIFO admission, at most ``max_num_seqs`` running; a request is admitted when its prompt's
  blocks (minus prefix hits) fit. Prompts longer than ``max_model_len`` are rejected, as the
  API server does (they never reach the metrics).
- Prefill at ``prefill_tokens_per_second`` shared by the requests in prefill (FIFO); decode
  one token per step per request, the step time growing with the tokens in the batch (a
  memory-bandwidth model). When a decoding request needs a block and none is free, the
  newest running request is preempted (recompute) and goes back to the head of the queue.
- Time advances in fixed steps of ``step_seconds``; latencies are quantised to that step.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.tuner.traces import TraceRequest


@dataclass(frozen=True)
class InstanceConfig:
    """The configuration the modelled instance runs with. Names follow vLLM's flags."""

    model_name: str = "replay-model"
    block_size: int = 16
    num_gpu_blocks: int = 60_000
    max_model_len: int = 131_072
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.92
    # vLLM's --kv-cache-memory-bytes (0: unset, the KV cache is sized from the utilization).
    kv_cache_memory_bytes: int = 0
    prefill_tokens_per_second: float = 40_000.0
    decode_step_base_seconds: float = 0.015
    # Reading the KV of every token in the batch once per step (bandwidth-bound decode).
    decode_step_seconds_per_kv_token: float = 2e-8
    step_seconds: float = 0.05
    # vLLM's --custom-histogram-buckets: (family, bounds) pairs replacing a family's defaults
    # (kvtune renders its SLO targets as bounds: operator/prometheus/slo_buckets.py).
    custom_histogram_buckets: tuple[tuple[str, tuple[float, ...]], ...] = ()

    def __post_init__(self) -> None:
        for name, (low, low_open, high) in _BOUNDS.items():
            value = getattr(self, name)
            # Written so that NaN, which fails every comparison, is refused too.
            if not ((value > low if low_open else value >= low) and value <= high):
                raise ValueError(f"{name}={value!r}: must be {'>' if low_open else '>='} "
                                 f"{_number(low)} and <= {_number(high)}")


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


# Each number's range (lowest, lowest excluded, highest): vLLM's lower bounds, and upper
# bounds beyond any real instance, so a typo fails at once instead of allocating a block
# table for it (num_gpu_blocks=1e12) or stepping a clock that never moves
# (step_seconds=nan). Tokens: 2**24, as kvtune's pins (tuner/planner/policy.py).
_TOKENS = float(1 << 24)
_BOUNDS: dict[str, tuple[float, bool, float]] = {
    "block_size": (0, True, 4096), "num_gpu_blocks": (0, True, _TOKENS),
    "max_model_len": (0, True, _TOKENS), "max_num_seqs": (0, True, 100_000),
    "max_num_batched_tokens": (0, True, _TOKENS), "gpu_memory_utilization": (0, True, 1.0),
    "kv_cache_memory_bytes": (0, False, float(1 << 50)),
    "prefill_tokens_per_second": (0, True, 1e9), "decode_step_base_seconds": (0, False, 60.0),
    "decode_step_seconds_per_kv_token": (0, False, 1.0), "step_seconds": (0, True, 60.0),
}


@dataclass
class HistogramState:
    """Cumulative-at-export histogram: per-bucket counts (not cumulative), sum, count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)  # last: +Inf

    def observe(self, value: float, times: int = 1) -> None:
        # Prometheus buckets are "le": a value equal to a bound belongs to that bound.
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.n += times

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        running = 0
        for bound, c in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += c
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), running))
        return out


@dataclass
class InstanceMetrics:
    config: InstanceConfig
    counters: dict[str, float] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)  # by finished_reason
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, HistogramState] = field(default_factory=dict)
    # The labelled counters by their ``source`` label (vm.SOURCE_LABELS).
    by_source: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for spec in vm.METRICS:
            if spec.name in vm.SOURCE_LABELS:
                self.by_source[spec.name] = dict.fromkeys(vm.SOURCE_LABELS[spec.name], 0.0)
            elif spec.kind == "counter" and spec.name != vm.REQUEST_SUCCESS:
                self.counters[spec.name] = 0.0
            elif spec.kind == "gauge":
                self.gauges[spec.name] = 0.0
            elif spec.kind == "histogram":
                assert spec.bucket_family is not None
                custom = dict(self.config.custom_histogram_buckets)
                self.histograms[spec.name] = HistogramState(
                    custom.get(spec.bucket_family)
                    or vm.buckets_for(spec.bucket_family, self.config.max_model_len)
                )
        self.finished = dict.fromkeys(vm.FINISHED_REASONS, 0)


@dataclass
class _Request:
    req: TraceRequest
    arrival_seconds: float
    prefix_keys: tuple[tuple[int, int], ...]
    scheduled_seconds: float | None = None
    first_token_seconds: float | None = None
    hit_tokens: int = 0
    prefilled_tokens: float = 0.0
    generated_tokens: float = 0.0
    held_keys: list[tuple[int, int]] = field(default_factory=list)
    held_plain_blocks: int = 0
    preemptions: int = 0
    output_target: int = 0
    finish_reason: str = "stop"

    @property
    def uncached_prompt_tokens(self) -> int:
        return self.req.prompt_tokens - self.hit_tokens

    @property
    def in_prefill(self) -> bool:
        return self.prefilled_tokens < self.uncached_prompt_tokens

    def tokens(self) -> int:
        return self.req.prompt_tokens + int(self.generated_tokens)


def prefix_keys(req: TraceRequest, block_size: int, serial: int) -> tuple[tuple[int, int], ...]:
    """Keys of the prompt's full blocks. A block's key stands for its whole prefix (vLLM's
    chained hash): Mooncake's ``hash_ids`` already identify prefixes per 512-token block, so
    (id of the trace block holding the block's last token, block index) is enough. Without
    prefix ids every block is unique to its request (``serial``)."""
    full_blocks = req.prompt_tokens // block_size
    if not req.prefix_block_ids:
        return tuple((-serial - 1, j) for j in range(full_blocks))
    keys: list[tuple[int, int]] = []
    ids = req.prefix_block_ids
    for j in range(full_blocks):
        h = ((j + 1) * block_size - 1) // req.hash_block_tokens
        keys.append((ids[min(h, len(ids) - 1)], j))
    return tuple(keys)


class Instance:
    """The modelled engine. ``advance_to(t)`` runs steps until model time ``t``."""

    def __init__(self, config: InstanceConfig) -> None:
        self.config = config
        self.metrics = InstanceMetrics(config)
        self.now_seconds = 0.0
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self._refcount: dict[tuple[int, int], int] = {}
        self._evictable: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._used_blocks = 0
        self._serial = 0
        self.rejected_too_long = 0
        # ``--kv-cache-metrics`` per cached block (vLLM's BlockMetricsState, every block
        # sampled): allocation time, last access, the last 4 prefix-cache hits' times.
        self._residency: dict[tuple[int, int], tuple[float, float, deque[float]]] = {}

    # --- block pool -------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.config.num_gpu_blocks - self._used_blocks

    def _take_blocks(self, n: int) -> None:
        assert n <= self.free_blocks, (n, self.free_blocks)
        # Evict cached-but-free blocks, oldest first, when the uncached free ones run out.
        uncached_free = self.free_blocks - len(self._evictable)
        while uncached_free < n:
            key, _ = self._evictable.popitem(last=False)
            self._observe_eviction(key)
            uncached_free += 1
        self._used_blocks += n

    def _observe_eviction(self, key: tuple[int, int]) -> None:
        """vLLM's ``KVCacheMetricsCollector.on_block_evicted``: lifetime, idle time and the
        gaps between the block's recorded hits (vllm/v1/core/kv_cache_metrics.py)."""
        born = self._residency.pop(key, None)
        if born is None:
            return
        birth, last, hits = born
        h = self.metrics.histograms
        h[vm.KV_BLOCK_LIFETIME].observe(self.now_seconds - birth)
        h[vm.KV_BLOCK_IDLE_BEFORE_EVICT].observe(self.now_seconds - last)
        for a, b in itertools.pairwise(hits):
            h[vm.KV_BLOCK_REUSE_GAP].observe(b - a)

    def _touch(self, key: tuple[int, int]) -> None:
        """A prefix-cache hit on ``key`` (``on_block_accessed``)."""
        state = self._residency.get(key)
        if state is not None:
            state[2].append(self.now_seconds)
            self._residency[key] = (state[0], self.now_seconds, state[2])

    def _release(self, r: _Request) -> None:
        for key in reversed(r.held_keys):  # tail first: the chain's tail is evicted first
            left = self._refcount[key] - 1
            if left == 0:
                del self._refcount[key]
                self._used_blocks -= 1
                if self.config.enable_prefix_caching:
                    self._evictable[key] = None
            else:
                self._refcount[key] = left
        self._used_blocks -= r.held_plain_blocks
        r.held_keys, r.held_plain_blocks = [], 0

    def usage(self) -> float:
        return self._used_blocks / self.config.num_gpu_blocks

    # --- requests ---------------------------------------------------------------------
    def submit(self, req: TraceRequest, arrival_seconds: float) -> bool:
        """Queue a request arriving at model time ``arrival_seconds``; False if rejected."""
        if req.prompt_tokens + 1 > self.config.max_model_len or req.prompt_tokens <= 0:
            self.rejected_too_long += 1
            return False
        self._serial += 1
        r = _Request(req, arrival_seconds,
                     prefix_keys(req, self.config.block_size, self._serial))
        r.output_target = max(1, min(req.output_tokens,
                                     self.config.max_model_len - req.prompt_tokens))
        r.finish_reason = "length" if r.output_target < req.output_tokens else "stop"
        self.waiting.append(r)
        return True

    def _try_admit(self, r: _Request) -> bool:
        cfg = self.config
        hits = 0
        if cfg.enable_prefix_caching:
            for key in r.prefix_keys:
                if key in self._refcount or key in self._evictable:
                    hits += 1
                else:
                    break
            # vLLM always recomputes at least the last prompt token.
            if hits * cfg.block_size >= r.req.prompt_tokens:
                hits -= 1
        needed_blocks = math.ceil(r.req.prompt_tokens / cfg.block_size)
        new_blocks = needed_blocks - hits
        revived = sum(1 for k in r.prefix_keys[:hits] if k in self._evictable)
        if new_blocks + revived > self.free_blocks:
            return False
        m = self.metrics
        m.counters[vm.PREFIX_CACHE_QUERIES] += r.req.prompt_tokens
        m.counters[vm.PREFIX_CACHE_HITS] += hits * cfg.block_size
        self._count_sources(r.req.prompt_tokens, hits * cfg.block_size)
        for key in r.prefix_keys[:hits]:
            self._touch(key)
            if key in self._evictable:
                del self._evictable[key]
                self._used_blocks += 1
                self._refcount[key] = 1
            else:
                self._refcount[key] += 1
        self._take_blocks(new_blocks)
        for key in r.prefix_keys[hits:]:
            # A key another running request registered meanwhile is shared, not duplicated.
            if key in self._refcount:
                self._refcount[key] += 1
                self._used_blocks -= 1
                new_blocks -= 1
            else:
                self._evictable.pop(key, None)
                self._refcount[key] = 1
                self._residency[key] = (self.now_seconds, self.now_seconds, deque(maxlen=4))
        r.held_keys = list(r.prefix_keys)
        r.held_plain_blocks = needed_blocks - len(r.prefix_keys)
        r.hit_tokens = hits * cfg.block_size
        r.prefilled_tokens = 0.0
        r.generated_tokens = 0.0
        if r.scheduled_seconds is None:
            r.scheduled_seconds = self.now_seconds
        return True

    def _count_sources(self, prompt_tokens: int, hit_tokens: int) -> None:
        """``vllm:prompt_tokens_by_source`` and ``..._cached_by_source``: this engine has no
        tier beyond the GPU, so every hit is a local (device) one."""
        m = self.metrics
        m.counters[vm.PROMPT_TOKENS_CACHED] += hit_tokens
        by, cached = m.by_source[vm.PROMPT_TOKENS_BY_SOURCE], \
            m.by_source[vm.PROMPT_TOKENS_CACHED_BY_SOURCE]
        by["local_compute"] += prompt_tokens - hit_tokens
        by["local_cache_hit"] += hit_tokens
        cached["device"] += hit_tokens

    def _preempt_newest(self) -> None:
        victim = self.running.pop()
        self._release(victim)
        victim.preemptions += 1
        victim.hit_tokens = 0
        self.metrics.counters[vm.NUM_PREEMPTIONS] += 1
        self.waiting.appendleft(victim)

    def _finish(self, r: _Request) -> None:
        self._release(r)
        m, h = self.metrics, self.metrics.histograms
        end = self.now_seconds
        first = r.first_token_seconds if r.first_token_seconds is not None else end
        sched = r.scheduled_seconds if r.scheduled_seconds is not None else r.arrival_seconds
        gen = r.output_target
        m.finished[r.finish_reason] += 1
        h[vm.REQUEST_PROMPT_TOKENS].observe(r.req.prompt_tokens)
        h[vm.REQUEST_GENERATION_TOKENS].observe(gen)
        h[vm.REQUEST_PREFILL_KV_COMPUTED_TOKENS].observe(r.uncached_prompt_tokens)
        h[vm.E2E_REQUEST_LATENCY].observe(end - r.arrival_seconds)
        h[vm.REQUEST_QUEUE_TIME].observe(sched - r.arrival_seconds)
        h[vm.REQUEST_INFERENCE_TIME].observe(end - sched)
        h[vm.REQUEST_PREFILL_TIME].observe(first - sched)
        h[vm.REQUEST_DECODE_TIME].observe(end - first)
        h[vm.REQUEST_NUM_PREEMPTIONS].observe(r.preemptions)
        h[vm.TIME_PER_OUTPUT_TOKEN].observe((end - first) / max(gen - 1, 1))

    # --- the engine step --------------------------------------------------------------
    def step(self) -> None:
        cfg, m = self.config, self.metrics
        dt = cfg.step_seconds
        self.now_seconds += dt
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            if not self._try_admit(self.waiting[0]):
                break
            self.running.append(self.waiting.popleft())

        kv_tokens = sum(r.tokens() for r in self.running)
        itl = cfg.decode_step_base_seconds + cfg.decode_step_seconds_per_kv_token * kv_tokens
        tokens_per_step = dt / itl
        prefill_budget = min(cfg.prefill_tokens_per_second * dt,
                             cfg.max_num_batched_tokens * dt / itl)
        finished: list[_Request] = []
        decoded = 0.0
        prefilled = 0.0
        i = 0
        while i < len(self.running):
            r = self.running[i]
            if r.in_prefill:
                take = min(prefill_budget, r.uncached_prompt_tokens - r.prefilled_tokens)
                r.prefilled_tokens += take
                prefill_budget -= take
                prefilled += take
                if not r.in_prefill:
                    r.generated_tokens = 1.0
                    decoded += 1.0
                    if r.first_token_seconds is None:  # vLLM records TTFT once per request
                        r.first_token_seconds = self.now_seconds
                        m.histograms[vm.TIME_TO_FIRST_TOKEN].observe(
                            self.now_seconds - r.arrival_seconds)
                i += 1
                continue
            before = r.tokens()
            grow = min(tokens_per_step, r.output_target - r.generated_tokens)
            after = before + int(r.generated_tokens + grow) - int(r.generated_tokens)
            extra_blocks = (math.ceil(after / cfg.block_size)
                            - math.ceil(before / cfg.block_size))
            while extra_blocks > self.free_blocks and self.running[-1] is not r:
                self._preempt_newest()
            if extra_blocks > self.free_blocks:
                # r itself is the newest: it waits for memory (preempted itself).
                self._preempt_newest()
                continue
            self._take_blocks(extra_blocks)
            r.held_plain_blocks += extra_blocks
            r.generated_tokens += grow
            decoded += grow
            n_tokens = int(r.generated_tokens) - int(r.generated_tokens - grow)
            if n_tokens > 0:
                m.histograms[vm.INTER_TOKEN_LATENCY].observe(itl, n_tokens)
            if r.generated_tokens >= r.output_target - 1e-9:
                finished.append(r)
            i += 1
        for r in finished:
            self.running.remove(r)
            self._finish(r)
        m.counters[vm.PROMPT_TOKENS] += prefilled
        m.counters[vm.GENERATION_TOKENS] += decoded
        m.gauges[vm.NUM_REQUESTS_RUNNING] = len(self.running)
        m.gauges[vm.NUM_REQUESTS_WAITING] = len(self.waiting)
        m.gauges[vm.KV_CACHE_USAGE_PERC] = self.usage()

    def advance_to(self, t_seconds: float, arrivals: list[tuple[float, TraceRequest]]) -> None:
        """Run steps up to model time ``t_seconds``, submitting ``arrivals`` (sorted by time,
        all at or before ``t_seconds``) at the step they fall in."""
        k = 0
        while self.now_seconds + self.config.step_seconds <= t_seconds:
            horizon = self.now_seconds + self.config.step_seconds
            while k < len(arrivals) and arrivals[k][0] <= horizon:
                self.submit(arrivals[k][1], arrivals[k][0])
                k += 1
            self.step()
        for at, req in arrivals[k:]:
            self.submit(req, at)

    def cache_config_labels(self) -> dict[str, str]:
        return cache_config_labels(self.config)


def cache_config_labels(cfg: InstanceConfig) -> dict[str, str]:
    """``vllm:cache_config_info``'s labels for ``cfg`` (vLLM 0.33.0's CacheConfig fields)."""
    return {
        "block_size": str(cfg.block_size),
        "cache_dtype": cfg.cache_dtype,
        "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "prefix_caching_hash_algo": "sha256",
        "num_gpu_blocks": str(cfg.num_gpu_blocks),
        "num_cpu_blocks": "None",
        "kv_cache_memory_bytes": str(cfg.kv_cache_memory_bytes or None),
        "kv_offloading_size": "None",
        "kv_offloading_backend": "native",
        "kv_cache_size_tokens": str(cfg.num_gpu_blocks * cfg.block_size),
        "engine": "0",
    }


class TraceSchedule:
    """Arrivals of a trace in model time: the trace starts at ``start_seconds`` (model time),
    from ``offset_seconds`` into the trace, and repeats when it ends (``loop``), so traffic
    continues for as long as the replay runs."""

    def __init__(self, requests: list[TraceRequest], start_seconds: float,
                 offset_seconds: float = 0.0, loop: bool = True, name: str = "",
                 shuffle_seed: int | None = None) -> None:
        if not requests:
            raise ValueError(f"trace {name!r} has no requests")
        if shuffle_seed is not None:
            # Keep the arrival times, permute what arrives: a stationary sample of the
            # trace's requests (real traces drift within themselves, e.g. Mooncake's median
            # prompt grows from 2k to 16k tokens over its 17 minutes).
            contents = list(requests)
            random.Random(shuffle_seed).shuffle(contents)
            requests = [dataclasses.replace(c, arrival_seconds=r.arrival_seconds)
                        for r, c in zip(requests, contents, strict=True)]
            name = f"{name} (shuffled, seed {shuffle_seed})"
        self.name = name
        self.requests = requests
        self.start_seconds = start_seconds
        self.offset_seconds = offset_seconds
        self.loop = loop
        # One lap lasts the trace's span plus one mean gap, so laps don't bunch up.
        span = requests[-1].arrival_seconds - requests[0].arrival_seconds
        self.lap_seconds = span + span / max(len(requests) - 1, 1)
        self._lap = 0
        self._index = bisect.bisect_left([r.arrival_seconds for r in requests], offset_seconds)
        if self._index >= len(requests):
            raise ValueError(f"offset_seconds={offset_seconds} is past the trace's end "
                             f"({span:.0f}s); pass a smaller offset")

    def _at(self, i: int, lap: int) -> float:
        return (self.start_seconds + self.requests[i].arrival_seconds - self.offset_seconds
                + lap * self.lap_seconds)

    def due(self, until_seconds: float) -> list[tuple[float, TraceRequest]]:
        """Arrivals up to model time ``until_seconds`` not returned before."""
        out: list[tuple[float, TraceRequest]] = []
        while True:
            if self._index >= len(self.requests):
                if not self.loop:
                    return out
                self._lap += 1
                self._index = 0
            t = self._at(self._index, self._lap)
            if t > until_seconds:
                return out
            out.append((t, self.requests[self._index]))
            self._index += 1
