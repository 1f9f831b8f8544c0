"""The scheduler's state and the bookkeeping every run mode shares: allocation (vLLM's
``KVCacheManager.allocate_slots``), prefix lookups, a step's time and tokens, retiring
requests, the sampled series and the result. The run modes build on it: ``sched_offload``
(the CPU tier), ``sched_exact`` (the exact step), ``sched_cohort`` (the cohort step),
``sched_runs`` (decode and prefill runs), joined in ``scheduler.Scheduler``."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from kvtune.tuner.simulator.blocks import BlockPool
from kvtune.tuner.simulator.cohort import DecodeCohort
from kvtune.tuner.simulator.metrics import SimResult, TimeSeries
from kvtune.tuner.simulator.offload import CPUTier, RequestOffload
from kvtune.tuner.simulator.prefix import KeySpace
from kvtune.tuner.simulator.sched_state import NO_BLOCKS, EngineConfig, RequestState
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import SimRequest


class SchedulerCore:
    """The state of a replay of ``requests`` (sorted by arrival) under ``config``."""

    def __init__(self, requests: Sequence[SimRequest], config: EngineConfig,
                 cost: StepCostModel, name: str = "") -> None:
        self.config = config
        self.cost = cost
        self.name = name
        self.finished = 0  # requests retired so far
        if config.allocation == "contiguous":
            # One block = one max_model_len reservation, over the same KV memory.
            self.block_size = config.max_model_len
            num_blocks = config.kv_cache_tokens // config.max_model_len + 1
            caching = False
        else:
            self.block_size = config.block_size
            num_blocks = config.num_gpu_blocks
            caching = config.enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=caching)
        self._init_offload(caching)
        self.keyspace = KeySpace(self.block_size)
        self.requests = list(requests)
        self.states: list[RequestState] = []
        self.rejected = 0
        self._usable_blocks = num_blocks - 1
        for r in self.requests:
            self.states.append(self._new_state(r))
        self.pool.reserve_keys(self.keyspace.num_keys)
        self._init_counters()

    def _init_offload(self, caching: bool) -> None:
        config = self.config
        # The CPU tier (offload.py) where offload is on; requests loading from it, in the
        # order they were admitted.
        self.offload = (CPUTier(config.cpu_offload_blocks,
                                config.offload_load_seconds_per_block)
                        if config.cpu_offload_blocks > 0 and caching else None)
        self.loading: list[RequestState] = []
        # vLLM's ``defer_block_free``: with a KV connector (the CPU tier) and two batches in
        # flight, a request scheduled in the step before is never preempted.
        self._defer_frees = self.offload is not None and config.async_scheduling
        self._last_step_empty = False
        # Requests whose load has arrived, holding their blocks (vLLM's
        # ``kv_holding_waiting``: admitted before the waiting queue, in load order).
        self.loaded: deque[RequestState] = deque()
        # When the last step started (async: the transfers done by then are seen at the
        # next schedule).
        self._load_seen_seconds = 0.0
        # Each request's side of the CPU tier, and the requests retired since the last
        # schedule (vLLM refreshes their chunks at the next one).
        self._cpu: dict[int, RequestOffload] = {}
        self._cpu_retired: list[RequestState] = []

    def _init_counters(self) -> None:
        self.now = 0.0
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.preemptions = 0
        # Tokens a resumed (preempted) request found still cached: recompute it was spared.
        self.resume_hit_tokens = 0
        # Prompt tokens loaded from the CPU tier instead of computed (offload.py).
        self.cpu_hit_tokens = 0
        # The loads from the CPU tier, in the order they started: (request id, blocks).
        self.cpu_loads: list[tuple[int, int]] = []
        self.query_tokens = 0
        self.hit_tokens = 0
        self.series = TimeSeries()
        # Time-weighted integrals over the busy period.
        self._busy_seconds = 0.0
        self._running_integral = 0.0
        self._usage_integral = 0.0
        self._frag_integral = 0.0
        self._alloc_integral = 0.0
        self.peak_running = 0
        self.steps = 0  # engine steps simulated (a decode run counts its k steps)
        self.events = 0  # loop iterations (exact steps + decode runs)
        # Step-wise use (``stepwise.py``): a decode run stops within one step of this time.
        self.horizon_seconds: float | None = None
        # The last exact step, for step-by-step comparisons (kvtune.oracle): what it
        # scheduled, whom it preempted (in order), blocks in use once it was scheduled.
        self.last_scheduled: list[tuple[RequestState, int]] = []
        self.last_preempted: list[RequestState] = []
        self.last_blocks_in_use = 0
        # The fast path: the decoding cohort, and the running requests outside it (running
        # order).
        self.cohort = DecodeCohort(self.block_size)
        self._active: list[RequestState] = []

    def _new_state(self, r: SimRequest) -> RequestState:
        # vLLM rejects a prompt that leaves no room for one output token and stops a
        # request at max_model_len; a request larger than the whole cache never runs
        # (output_tokens 0 marks it rejected).
        bs = self.block_size
        out = min(r.output_tokens, self.config.max_model_len - r.prompt_tokens)
        ok = out >= 1 and -(-(r.prompt_tokens + out - 1) // bs) <= self._usable_blocks
        hashes = (np.asarray(self.keyspace.keys(r.segments, r.shareable_tokens), np.int64)
                  if self.pool.enable_caching and r.shareable_tokens >= bs else NO_BLOCKS)
        st = RequestState(r, out if ok else 0, hashes, -(-(r.prompt_tokens + out) // bs))
        if not ok:
            self.rejected += 1
        return st

    # -- allocation (vLLM's KVCacheManager.allocate_slots) ---------------------------------

    def _blocks_needed(self, st: RequestState, num_slots: int) -> int:
        return max(0, -(-num_slots // self.block_size) - len(st.blocks))

    def _allocate(self, st: RequestState, num_new: int) -> bool:
        need = self._blocks_needed(st, st.num_computed + num_new)
        if need > self.pool.get_num_free_blocks():
            return False
        if need:
            st.add_blocks(self.pool.get_new_blocks(need))
        self._cache(st, st.num_computed + num_new)
        return True

    def _cache(self, st: RequestState, computed_after: int) -> None:
        num_full = min(computed_after, st.num_tokens) // self.block_size
        if num_full > st.num_cached_blocks:
            if st.num_cached_blocks < len(st.hashes):
                self.pool.cache_full_blocks(st.blocks, st.hashes, st.num_cached_blocks, num_full)
            st.num_cached_blocks = num_full

    def _free(self, st: RequestState) -> None:
        # Reverse: the chain's tail goes first in the eviction order. Its full blocks up to
        # its shareable keys hold them (cached as computed, or prefix hits); those past them
        # were never cached (their keys would be unshared), so they hold none.
        self.pool.free_request_blocks(st.blocks, st.num_cached_blocks,
                                      min(len(st.hashes), st.num_cached_blocks))
        st.blocks = NO_BLOCKS
        st.num_cached_blocks = 0

    def _lookup(self, st: RequestState) -> np.ndarray:
        if not self.pool.enable_caching or not len(st.hashes):
            return NO_BLOCKS
        hits: np.ndarray = self.pool.find_longest_cache_hit(
            st.hashes, (st.num_tokens - 1) // self.block_size
        )
        return hits

    def _hit_need(self, st: RequestState) -> tuple[int, int]:
        """``_lookup``'s length and ``_admission_blocks`` of its hits, without making the
        hits (``_hits`` does, once the check passes)."""
        new = -(-st.num_tokens // self.block_size) - len(st.blocks)
        if not self.pool.enable_caching or not len(st.hashes):
            return 0, max(0, new)
        n, evictable = self.pool.cache_hit_need(st.hashes, (st.num_tokens - 1) // self.block_size)
        return n, max(0, new - n) + evictable

    def _hits(self, st: RequestState, num_hits: int) -> np.ndarray:
        """The first ``num_hits`` blocks ``_lookup`` finds (``_hit_need``'s count)."""
        if not num_hits:
            return NO_BLOCKS
        hits: np.ndarray = self.pool.key_block[st.hashes[:num_hits]]
        return hits

    def _admission_blocks(self, st: RequestState, hits: np.ndarray) -> int:
        """Free blocks the full-sequence check needs (new blocks + hits in the free queue)."""
        new: int = -(-st.num_tokens // self.block_size) - len(hits) - len(st.blocks)
        evictable: int = self.pool.num_free_among(hits)
        return max(0, new) + evictable

    def _count_admission(self, st: RequestState, computed: int, gpu_hit_tokens: int) -> None:
        """An admission's counts: on its first, when it was scheduled, the tokens it found
        computed (``cached_tokens``) and the prefix cache's query and GPU hit tokens; on a
        resume after preemption, the recompute it was spared."""
        if not st.admitted:
            st.admitted = True
            st.scheduled_seconds = self.now
            st.cached_tokens = computed
            self.query_tokens += st.num_tokens
            self.hit_tokens += gpu_hit_tokens
        else:
            self.resume_hit_tokens += computed

    def _sample(self, dt: float, fragmented_slots: int, allocated_slots: int,
                usage: float | None = None) -> None:
        if usage is None:
            usage = self.pool.get_usage()
        n_run = len(self.running)
        if n_run > self.peak_running:
            self.peak_running = n_run
        s = self.series
        s.time_seconds.append(self.now)
        s.kv_usage.append(usage)
        s.running.append(n_run)
        s.waiting.append(len(self.waiting))
        s.prefix_hit_rate.append(self.hit_tokens / self.query_tokens if self.query_tokens else 0.0)
        self._busy_seconds += dt
        self._running_integral += n_run * dt
        self._usage_integral += usage * dt
        self._frag_integral += fragmented_slots * dt
        self._alloc_integral += allocated_slots * dt

    def _retire(self, st: RequestState) -> None:
        """A finished request leaves (already out of ``running`` or about to be)."""
        st.finish_seconds = self.now
        self.finished += 1
        self._free(st)
        if self.offload is not None:
            self._cpu_retired.append(st)

    def _finish_done(self, done: list[RequestState] | None = None) -> None:
        """Retire every running request that is done, in running order (``done``: the
        caller knows them already, in that order)."""
        running = self.running
        if done is None:
            done = [st for st in running if st.generated >= st.output_tokens]
        if not done:
            return
        for st in done:
            self._retire(st)
        if len(done) == 1:
            # A copy: callers may still iterate the list they read before.
            running = running.copy()
            running.remove(done[0])
            self.running = running
        else:
            self.running = [st for st in running if st.generated < st.output_tokens]

    def _idle(self, next_arrival: float | None) -> None:
        """Nothing was scheduled: the clock moves to the next arrival, or to the next load
        from the CPU tier if that comes first (one may have started in this very step)."""
        if self.offload is not None:
            # Any transfer: a load brings a request, a finished write a deferred one.
            ready = self.offload.next_done_seconds()
            if ready is not None:
                next_arrival = ready if next_arrival is None else min(next_arrival, ready)
        if next_arrival is None:
            # Only the CPU tier's bookkeeping of the last finished requests was left.
            assert not (self.waiting or self.loading or self.loaded or self.running), (
                "simulator deadlock: nothing scheduled, no arrivals")
            return
        self.now = max(self.now, next_arrival)

    def _charge(self, scheduled: list[tuple[RequestState, int]], num_tokens: int = 0,
                kv_read: int = 0, pairs: float = 0.0) -> float:
        """One step's time for ``scheduled`` (each request's new tokens over what it had
        computed) on top of the given terms (a decoding cohort's); the clock and the step
        count move on. Returns the step's seconds."""
        # The given terms are a cohort's: one token per sequence.
        num_seqs = num_tokens + len(scheduled)
        for st, num_new in scheduled:
            num_tokens += num_new
            kv_read += st.num_computed + num_new
            pairs += num_new * st.num_computed + num_new * (num_new + 1) / 2.0
        dt = self.cost.step_seconds(num_tokens, kv_read, pairs, self.config.async_scheduling,
                                    num_seqs)
        self.now += dt
        self.steps += 1
        return dt

    def _compute(self, scheduled: list[tuple[RequestState, int]], step: int) -> bool:
        """The step's tokens computed: a request past its prompt samples a token (its first
        sets the TTFT). Whether any request reached its output length."""
        any_done = False
        for st, num_new in scheduled:
            st.sched_step = step
            st.num_computed += num_new
            if st.num_computed >= st.num_tokens:
                st.tail_unprocessed = st.generated > 0 and st.last_sample_step == step - 1
                st.last_sample_step = step
                st.generated += 1
                st.num_tokens += 1
                if st.generated == 1 and st.first_token_seconds != st.first_token_seconds:
                    st.first_token_seconds = self.now
                if st.generated >= st.output_tokens:
                    any_done = True
                st.prefilling = False
            else:
                st.prefilling = True
        return any_done

    def _result(self) -> SimResult:
        busy = self._busy_seconds or 1.0
        nan = float("nan")
        return SimResult(
            name=self.name,
            num_requests=len(self.states),
            arrival_seconds=[st.req.arrival_seconds for st in self.states],
            first_token_seconds=[st.first_token_seconds for st in self.states],
            finish_seconds=[st.finish_seconds if st.output_tokens else nan for st in self.states],
            prompt_tokens=[st.req.prompt_tokens for st in self.states],
            output_tokens=[st.output_tokens for st in self.states],
            rejected=self.rejected,
            preemptions=self.preemptions,
            resume_hit_tokens=self.resume_hit_tokens,
            cpu_hit_tokens=self.cpu_hit_tokens,
            prefix_query_tokens=self.query_tokens,
            prefix_hit_tokens=self.hit_tokens,
            peak_running=self.peak_running,
            mean_running=self._running_integral / busy,
            mean_kv_usage=self._usage_integral / busy,
            mean_fragmented_tokens=self._frag_integral / busy,
            fragmentation_fraction=(self._frag_integral / self._alloc_integral
                                    if self._alloc_integral else 0.0),
            kv_cache_tokens=self.config.kv_cache_tokens,
            series=self.series,
            config=asdict(self.config),
        )
