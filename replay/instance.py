"""A small model of one vLLM instance, enough to produce metrics that behave like vLLM's.

Pure: no clock, no I/O. The caller feeds requests (``submit``) and advances model time
(``advance_to``); the instance keeps vLLM's counters, gauges and histograms as plain data
(``InstanceMetrics``), which the exporter (``replay_exporter.py``) serves under vLLM's names.

What it models, and how coarsely:
- The paged KV cache is the simulator's (``tuner/simulator/blocks.py``: vLLM's block pool,
  free queue and prefix-cache map, block 0 the null block), keyed as the simulator keys a
  trace request's prefix (``simulator/workload.trace_segments``, ``prefix.KeySpace``):
  one KV-cache model for the planner, the simulator and replay. A request's full prompt
  blocks that other requests may share get their keys when it is admitted; freed blocks
  stay cached in the free queue until an allocation evicts them. Usage is vLLM's
  ``kv_cache_usage_perc`` (``BlockPool.get_usage``: cached-but-free blocks count as free).
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
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.tuner.knobs import MAX_PIN_SEQUENCES, MAX_PIN_TOKENS
from kvtune.tuner.simulator.blocks import BlockPool
from kvtune.tuner.simulator.prefix import KeySpace, SegmentInterner
from kvtune.tuner.simulator.sched_state import NO_BLOCKS
from kvtune.tuner.simulator.workload import trace_segments
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
# (step_seconds=nan). Tokens and sequences: the bounds of kvtune's pins (the knob table).
_TOKENS = float(MAX_PIN_TOKENS)
_BOUNDS: dict[str, tuple[float, bool, float]] = {
    "block_size": (0, True, 4096), "num_gpu_blocks": (0, True, _TOKENS),
    "max_model_len": (0, True, _TOKENS), "max_num_seqs": (0, True, MAX_PIN_SEQUENCES),
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


def _no_blocks() -> np.ndarray:
    return NO_BLOCKS


@dataclass
class _Request:
    req: TraceRequest
    arrival_seconds: float
    # Keys (the simulator's ``prefix.KeySpace``) of the full prompt blocks other requests may
    # share: those its prefix ids cover.
    hashes: np.ndarray
    scheduled_seconds: float | None = None
    first_token_seconds: float | None = None
    hit_tokens: int = 0
    prefilled_tokens: float = 0.0
    generated_tokens: float = 0.0
    blocks: np.ndarray = field(default_factory=_no_blocks)  # its block table
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


class Instance:
    """The modelled engine. ``advance_to(t)`` runs steps until model time ``t``."""

    def __init__(self, config: InstanceConfig) -> None:
        self.config = config
        self.metrics = InstanceMetrics(config)
        self.now_seconds = 0.0
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self._interner = SegmentInterner()
        self._keyspace = KeySpace(config.block_size)
        self.rejected_too_long = 0
        # ``--kv-cache-metrics`` per cached block id (vLLM's BlockMetricsState, every block
        # sampled): allocation time, last access, the last 4 prefix-cache hits' times.
        self._residency: dict[int, tuple[float, float, deque[float]]] = {}

    # --- the KV cache (the simulator's block pool) ----------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def used_blocks(self) -> int:
        """Blocks held by requests (block 0, vLLM's null block, is never handed out)."""
        return self.pool.num_gpu_blocks - 1 - self.free_blocks

    def _new_blocks(self, n: int) -> np.ndarray:
        """``n`` blocks from the pool's free queue; a handed-out block that still held cached
        content has that content evicted (vLLM's ``_maybe_evict_cached_block``)."""
        blocks = self.pool.get_new_blocks(n)
        for b in blocks.tolist():
            self._observe_eviction(b)
        return blocks

    def _observe_eviction(self, block: int) -> None:
        """vLLM's ``KVCacheMetricsCollector.on_block_evicted``: lifetime, idle time and the
        gaps between the block's recorded hits (vllm/v1/core/kv_cache_metrics.py)."""
        born = self._residency.pop(block, None)
        if born is None:
            return
        birth, last, hits = born
        h = self.metrics.histograms
        h[vm.KV_BLOCK_LIFETIME].observe(self.now_seconds - birth)
        h[vm.KV_BLOCK_IDLE_BEFORE_EVICT].observe(self.now_seconds - last)
        for a, b in itertools.pairwise(hits):
            h[vm.KV_BLOCK_REUSE_GAP].observe(b - a)

    def _touch(self, blocks: np.ndarray) -> None:
        """Prefix-cache hits on ``blocks`` (``on_block_accessed``)."""
        for b in blocks.tolist():
            state = self._residency.get(b)
            if state is not None:
                state[2].append(self.now_seconds)
                self._residency[b] = (state[0], self.now_seconds, state[2])

    def _release(self, r: _Request) -> None:
        # The simulator's free (vLLM's, tail first): full blocks stay cached, those holding
        # keys findable by later requests; the partial last block goes to the queue's front.
        bs = self.config.block_size
        num_full = min(len(r.blocks), r.tokens() // bs)
        self.pool.free_request_blocks(r.blocks, num_full, min(len(r.hashes), num_full))
        r.blocks = NO_BLOCKS

    def usage(self) -> float:
        return self.pool.get_usage()

    # --- requests ---------------------------------------------------------------------
    def submit(self, req: TraceRequest, arrival_seconds: float) -> bool:
        """Queue a request arriving at model time ``arrival_seconds``; False if rejected."""
        if req.prompt_tokens + 1 > self.config.max_model_len or req.prompt_tokens <= 0:
            self.rejected_too_long += 1
            return False
        r = _Request(req, arrival_seconds, self._keys(req))
        r.output_target = max(1, min(req.output_tokens,
                                     self.config.max_model_len - req.prompt_tokens))
        r.finish_reason = "length" if r.output_target < req.output_tokens else "stop"
        self.waiting.append(r)
        return True

    def _keys(self, req: TraceRequest) -> np.ndarray:
        """The keys of the request's shareable full blocks, as the simulator makes them."""
        segments, covered = trace_segments(req, self._interner)
        if not self.config.enable_prefix_caching or covered < self.config.block_size:
            return NO_BLOCKS
        keys = self._keyspace.key_array(segments, covered)
        self.pool.reserve_keys(self._keyspace.num_keys)
        return keys

    def _try_admit(self, r: _Request) -> bool:
        cfg, pool = self.config, self.pool
        prompt = r.req.prompt_tokens
        hits = NO_BLOCKS
        if len(r.hashes):
            # vLLM always recomputes at least the last prompt token.
            hits = pool.find_longest_cache_hit(r.hashes, (prompt - 1) // cfg.block_size)
        new_blocks = -(-prompt // cfg.block_size) - len(hits)
        # Hits sitting in the free queue leave it: they count against the free blocks too.
        if new_blocks + pool.num_free_among(hits) > pool.get_num_free_blocks():
            return False
        m = self.metrics
        m.counters[vm.PREFIX_CACHE_QUERIES] += prompt
        m.counters[vm.PREFIX_CACHE_HITS] += len(hits) * cfg.block_size
        self._count_sources(prompt, len(hits) * cfg.block_size)
        self._touch(hits)
        pool.touch(hits)
        r.blocks = np.concatenate([hits, self._new_blocks(new_blocks)])
        pool.cache_full_blocks(r.blocks, r.hashes, len(hits), prompt // cfg.block_size)
        for b in r.blocks[len(hits):min(len(r.hashes), prompt // cfg.block_size)].tolist():
            if pool.hash_of(b) is not None:  # cached now, so followed until it is evicted
                self._residency[b] = (self.now_seconds, self.now_seconds, deque(maxlen=4))
        r.hit_tokens = len(hits) * cfg.block_size
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
            if extra_blocks > 0:
                r.blocks = np.concatenate([r.blocks, self._new_blocks(extra_blocks)])
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
