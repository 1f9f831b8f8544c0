"""vLLM V1's scheduler at the level that decides memory and latency, replayed over requests.

Each engine step (``vllm/v1/core/sched/scheduler.py``, FCFS policy, chunked prefill on):

1. RUNNING requests in admission order each get ``num_tokens - num_computed_tokens`` new
   tokens (a prefill chunk, or 1 when decoding), capped by the step's token budget
   (``max_num_batched_tokens``). When a request's new slots do not fit in the free blocks,
   the *newest* running request is preempted (its blocks freed, tail first; its computed
   tokens reset to 0 so it is recomputed later; put back at the *front* of the waiting
   queue), repeatedly, until the slots fit or the request preempted itself.
2. Only if nothing was preempted, WAITING requests are admitted in arrival order while the
   budget lasts and fewer than ``max_num_seqs`` run: a prefix-cache lookup (full blocks
   only, capped so that at least the last token is computed), then vLLM 0.33's
   ``scheduler_reserve_full_isl`` check: the *whole* sequence's blocks must be free now
   (counting hit blocks that sit in the free queue), else admission stops (FIFO: the head
   blocks the queue). The first chunk's blocks are allocated and its full blocks cached.
3. The step's time comes from ``timing.StepCostModel``; every request whose computed tokens
   caught up samples one token; those done free their blocks in reverse order.

Speed (``decode_runs=True``, the default; ``False`` steps every request of every step
exactly, the reference the differential tests hold against vLLM):

- a running request that decodes steadily joins the *decoding cohort* (``cohort.py``),
  whose members advance together by one clock: a step costs O(1) for all of them, plus
  the work of the requests that do something else (a prefill chunk, an admission, a finish);
- a step that could preempt (the new blocks do not all fit) or that the token budget cuts
  before a member is taken exactly (the cohort's members are written back first);
- decode-only stretches are not stepped one by one. When every running request is
  decoding and no waiting request can be admitted, the next ``k`` steps are identical in
  shape (every sequence one token longer), so they are taken at once: ``k`` is the number
  of steps until the first request finishes, the next arrival could be admitted, or the
  free blocks would run out (then the exact step handles the preemption); their time is a
  closed form (``decode_run_seconds``), the new blocks are taken from the free queue in one
  call (the same blocks, in a different per-request order, as step by step: nothing is
  freed or touched in between). The cost is per event and per block, not per token.

``contiguous`` allocation is the pre-PagedAttention baseline: a request reserves
``max_model_len`` token slots when admitted and holds them to the end (no prefix caching,
never preempted). All reservations are the same size, so there is no external
fragmentation: capacity is ``floor(KV tokens / max_model_len)`` requests. It is simulated
as a paged pool whose one block is a whole reservation (block size = max_model_len, no
caching): every request needs exactly one such block, which is that allocator exactly.

Async scheduling (``EngineConfig.async_scheduling``, vLLM 0.33's default): the engine core
keeps two batches in flight (``step_with_batch_queue``): it schedules batch N+1 before it
processes batch N's output. So a request that samples its last token in step N is still
running while step N+1 is scheduled: vLLM's ``AsyncScheduler`` skips it (it knows the
in-flight step reaches max_tokens) but it keeps its blocks and its running slot through that
schedule, and is freed right after it. Everything else (chunks, decode tokens, admissions,
preemptions) is scheduled as in the synchronous loop. The step time overlaps the overhead
with the GPU work (``timing``).

KV offload to CPU (``EngineConfig.cpu_offload_blocks`` > 0, ``offload.py``): a request's
prompt blocks are stored in the CPU tier when its prompt is done; an admission that finds
blocks there past its GPU prefix hit allocates them, waits out of the queue for their load
over the host link (taking no token budget), and is then scheduled first with those tokens
computed. With offload off none of this runs: one empty-list check per loop iteration.

The core is pure: no clock, no I/O, no randomness; the caller passes the requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.blocks import BlockPool
from kvtune.tuner.simulator.cohort import DecodeCohort
from kvtune.tuner.simulator.metrics import SimResult, TimeSeries
from kvtune.tuner.simulator.offload import CPUTier, RequestOffload
from kvtune.tuner.simulator.prefix import KeySpace
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import SimRequest

Allocation = Literal["paged", "contiguous"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The vLLM knobs the simulator honours, plus the KV-cache size they lead to."""

    num_gpu_blocks: int  # including vLLM's null block 0
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool = True
    allocation: Allocation = "paged"
    # vLLM 0.33's default engine loop: batch N+1 is scheduled before batch N's output is
    # processed (see the module doc); False is the synchronous loop.
    async_scheduling: bool = False
    # ``--kv-offloading-size`` (``offload.py``): the CPU tier's chunks (one GPU block each;
    # 0: off) and the seconds one chunk takes to load over the host link.
    cpu_offload_blocks: int = 0
    offload_load_seconds_per_block: float = 0.0

    def __post_init__(self) -> None:
        for name in ("num_gpu_blocks", "block_size", "max_num_seqs",
                     "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if value <= 0:
                raise InvalidInput(name, value, "must be > 0")
        if self.cpu_offload_blocks < 0 or self.offload_load_seconds_per_block < 0:
            raise InvalidInput("cpu_offload_blocks", self.cpu_offload_blocks,
                               "the CPU tier and its load time must be >= 0")
        if self.num_gpu_blocks < 2:
            raise InvalidInput("num_gpu_blocks", self.num_gpu_blocks,
                               "needs the null block plus one usable block; give the KV "
                               "cache more memory")
        if self.allocation == "contiguous" and self.kv_cache_tokens < self.max_model_len:
            raise InvalidInput(
                "max_model_len", self.max_model_len,
                f"one contiguous reservation needs {self.max_model_len} token slots but the "
                f"KV cache has {self.kv_cache_tokens}; lower max-model-len or give the KV "
                "cache more memory",
            )

    @property
    def kv_cache_tokens(self) -> int:
        return (self.num_gpu_blocks - 1) * self.block_size


# An empty block table / key list (shared: arrays are replaced, never changed in place).
_NO_BLOCKS = np.zeros(0, dtype=np.int64)
_NO_BLOCKS.flags.writeable = False
# What an admission found in the CPU tier (``Scheduler._load_from_cpu``).
_LOAD_NONE, _LOAD_STARTED, _LOAD_BLOCKED, _LOAD_DEFER = "none", "started", "blocked", "defer"


class RequestState:
    """A request inside the engine (vLLM's ``Request``: num_tokens, num_computed_tokens)."""

    __slots__ = (
        "admitted",
        "block_buffer",
        "blocks",
        "cached_tokens",
        "cohort_generated",
        "cohort_tick",
        "cohort_tokens",
        "finish_seconds",
        "first_token_seconds",
        "generated",
        "hashes",
        "last_sample_step",
        "load_ready_seconds",
        "max_blocks",
        "num_cached_blocks",
        "num_computed",
        "num_tokens",
        "output_tokens",
        "preemptions",
        "prefilling",
        "req",
        "sched_step",
        "scheduled_seconds",
        "tail_unprocessed",
    )

    def __init__(self, req: SimRequest, output_tokens: int, hashes: np.ndarray,
                 max_blocks: int = 0) -> None:
        self.req = req
        self.output_tokens = output_tokens
        # The most blocks its table can hold (prompt and outputs): ``add_blocks`` sizes the
        # table's buffer to it once.
        self.max_blocks = max_blocks
        self.num_tokens = req.prompt_tokens  # prompt + generated so far
        self.num_computed = 0
        self.generated = 0
        self.blocks = _NO_BLOCKS  # block ids: the request's block table
        # What ``blocks`` is a prefix view of, with room to grow (``add_blocks``).
        self.block_buffer = _NO_BLOCKS
        self.num_cached_blocks = 0
        # Keys (prefix.KeySpace) of the full blocks other requests may share.
        self.hashes = hashes
        self.first_token_seconds = float("nan")
        self.finish_seconds = float("nan")
        self.preemptions = 0
        self.admitted = False
        # Async scheduling: the last step that sampled a token for it, and whether the last
        # token it computed was sampled in the step just before (vLLM had not processed
        # that sample when it scheduled the step, so it could not hash that token's block).
        self.last_sample_step = -2
        self.tail_unprocessed = False
        # At first admission: when (step start) and how many prompt tokens were prefix hits.
        self.scheduled_seconds = float("nan")
        self.cached_tokens = 0
        # Membership of the decoding cohort (cohort.py): the tick it joined at (-1: not a
        # member), and its tokens and generated tokens then.
        self.cohort_tick = -1
        self.cohort_tokens = 0
        self.cohort_generated = 0
        # Offload: when the KV it is loading from the CPU tier has arrived (NaN: none).
        self.load_ready_seconds = float("nan")
        # Whether its last scheduled chunk left part of its prompt (or, resumed, of its
        # tokens) to compute: vLLM reserves blocks for such requests (``offload.py``).
        self.prefilling = False
        # The last step that scheduled it (with the CPU tier, async: see ``_step``).
        self.sched_step = -1


    def add_blocks(self, new: np.ndarray) -> None:
        """Append ``new`` to the block table. The table is a prefix view of a buffer with
        room to spare, so a prompt prefilled in many chunks is not copied once per chunk.
        Writing past the view's end is safe: no view of the table reaches there, and a
        table replaced (freed, or set to prefix hits) is never a view of the buffer again."""
        cur = self.blocks
        n, k = len(cur), len(new)
        buf = self.block_buffer
        if cur.base is not buf or n + k > len(buf):
            # Room for the whole sequence with its outputs (doubling, should it outgrow that).
            cap = self.max_blocks if n + k <= self.max_blocks else max(2 * (n + k), 16)
            grown = np.empty(cap, dtype=np.int64)
            grown[:n] = cur
            self.block_buffer = buf = grown
        buf[n:n + k] = new
        self.blocks = buf[:n + k]


StepHook = Callable[["Scheduler"], None]
# Progress of a replay: (requests finished, requests in all). The caller shows it; the
# scheduler only counts (no clock, no I/O).
ProgressHook = Callable[[int, int], None]
# A replay reports progress about this many times (every 5% of its requests) and once at the
# end: often enough to show movement, rarely enough to cost nothing.
PROGRESS_REPORTS = 20


class Scheduler:
    """Replays ``requests`` (sorted by arrival) under ``config``; ``run()`` returns the result.

    ``on_step`` (tests) is called after every simulated step or decode run, with every
    request's fields up to date; ``on_progress`` with (finished, all) requests every
    ``PROGRESS_REPORTS``-th of them and at the end. ``last_scheduled``, ``last_preempted``
    and ``last_blocks_in_use`` describe the last step only when stepping exactly
    (``decode_runs=False``).
    """

    def __init__(
        self, requests: Sequence[SimRequest], config: EngineConfig, cost: StepCostModel,
        name: str = "", on_step: StepHook | None = None, decode_runs: bool = True,
        on_progress: ProgressHook | None = None,
    ) -> None:
        self.config = config
        # False: step every decode step exactly (the reference the decode runs must match).
        self.decode_runs = decode_runs
        self.cost = cost
        self.name = name
        self.on_step = on_step
        self.on_progress = on_progress
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
        self.keyspace = KeySpace(self.block_size)
        self.requests = list(requests)
        self.states: list[RequestState] = []
        self.rejected = 0
        self._usable_blocks = num_blocks - 1
        for r in self.requests:
            self.states.append(self._new_state(r))
        self.pool.reserve_keys(self.keyspace.num_keys)
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
                  if self.pool.enable_caching and r.shareable_tokens >= bs else _NO_BLOCKS)
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
        st.blocks = _NO_BLOCKS
        st.num_cached_blocks = 0

    def _preempt(self, st: RequestState) -> None:
        self.last_preempted.append(st)
        if st.generated >= st.output_tokens:
            # Async: it finished in the step before, whose output is still in flight. vLLM
            # preempts it like any other (counted), frees its blocks, and the output then
            # finishes it instead of requeueing it.
            st.preemptions += 1
            self.preemptions += 1
            self._retire(st)
            return
        if (self.config.async_scheduling and st.tail_unprocessed
                and st.last_sample_step == self.steps):
            # Its last step's output is in flight, and that step computed a token sampled
            # in the step before: vLLM hashes that token's block only when it processes the
            # step's output, after this schedule; preempted now, the block is freed unhashed
            # (front of the free queue, and not found when the request resumes).
            st.num_cached_blocks = min(st.num_cached_blocks,
                                       (st.num_computed - 1) // self.block_size)
        if self.pool.enable_caching and len(st.hashes) < st.num_cached_blocks:
            # The request itself will look its blocks up when it resumes (vLLM keeps them
            # cached), so its own full blocks need real keys, not UNSHARED_HASH.
            known = len(st.hashes)
            st.hashes = np.asarray(self.keyspace.keys(st.req.segments, st.num_tokens),
                                   np.int64)
            self.pool.reserve_keys(self.keyspace.num_keys)
            self.pool.cache_full_blocks(st.blocks, st.hashes, known, st.num_cached_blocks)
        self._free(st)
        st.num_computed = 0
        st.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(st)

    def _lookup(self, st: RequestState) -> np.ndarray:
        if not self.pool.enable_caching or not len(st.hashes):
            return _NO_BLOCKS
        hits: np.ndarray = self.pool.find_longest_cache_hit(
            st.hashes, (st.num_tokens - 1) // self.block_size
        )
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

    # -- the CPU tier (offload.py) ---------------------------------------------------------

    def _cpu_req(self, st: RequestState) -> RequestOffload:
        rid = st.req.request_id
        req = self._cpu.get(rid)
        if req is None:
            # Its prompt's full blocks' keys: a prefix of its own keys where those reach
            # that far (the same keys: a key space numbers a prefix once).
            num_full = st.req.prompt_tokens // self.block_size
            keys = (st.hashes[:num_full] if len(st.hashes) >= num_full
                    else self.keyspace.key_array(st.req.segments, st.req.prompt_tokens))
            req = self._cpu[rid] = RequestOffload(keys)
        return req

    def _reserved_blocks(self, scheduled: list[tuple[RequestState, int]]) -> int:
        """Blocks vLLM keeps free for in-flight prefills when it admits a load
        (``_inflight_prefill_reserved_blocks``): what the loading requests, the loaded ones
        not yet scheduled and the running ones still prefilling need to hold their whole
        sequence."""
        bs = self.block_size
        now = {id(st): n for st, n in scheduled}
        busy = [*self.loading, *self.loaded]
        for st in self.running:
            n = now.get(id(st))
            if st.num_computed + n < st.num_tokens if n is not None else st.prefilling:
                busy.append(st)
        return sum(max(0, -(-st.num_tokens // bs) - len(st.blocks)) for st in busy)

    def _load_from_cpu(self, st: RequestState, hits: np.ndarray,
                       scheduled: list[tuple[RequestState, int]]) -> str:
        """Where the CPU tier holds the blocks after the GPU hit ``hits``: allocate them,
        queue their load and move ``st`` to ``loading`` (``_LOAD_STARTED``). No CPU hit:
        ``_LOAD_NONE`` (admitted as without offload). A chunk still being written or
        loaded, or a transfer of its own in flight: ``_LOAD_DEFER`` (vLLM skips it this
        step). The sequence does not fit, or its loaded blocks do not fit beside the other
        in-flight prefills' reservations: ``_LOAD_BLOCKED`` (admission stops, as vLLM's
        ``allocate_slots`` with ``reserved_blocks``)."""
        tier = self.offload
        assert tier is not None
        req = self._cpu_req(st)
        req.next_chunk = 0  # a fresh admission offers its blocks from the first
        if req.jobs:
            return _LOAD_DEFER
        bs = self.block_size
        start = len(hits)
        end = min(len(st.hashes), st.num_tokens // bs)
        cpu = tier.lookup(st.hashes, start, end)
        if cpu is None:
            return _LOAD_DEFER
        if not cpu:
            return _LOAD_NONE
        free = self.pool.get_num_free_blocks()
        if (self._admission_blocks(st, hits) > free
                or cpu + self.pool.num_free_among(hits) + self._reserved_blocks(scheduled)
                > free):
            return _LOAD_BLOCKED
        computed = (start + cpu) * bs
        self._count_admission(st, computed, start * bs)
        self.cpu_hit_tokens += cpu * bs
        self.pool.touch(hits)
        st.blocks = np.concatenate((hits, self.pool.get_new_blocks(cpu)))
        st.num_cached_blocks = start  # the loaded blocks are cached once they arrive
        st.num_computed = computed
        keys = st.hashes[start:start + cpu]
        st.load_ready_seconds = tier.load(req, keys, start, bs, self.now)
        req.next_chunk = start + cpu  # a load's blocks are not offered for storing
        self.cpu_loads.append((st.req.request_id, cpu))
        self.loading.append(st)
        return _LOAD_STARTED

    def _loads_arrived(self, seen_seconds: float) -> None:
        """Requests whose load was done by ``seen_seconds`` go to the front of the waiting
        queue, in the order they were admitted, with their loaded blocks cached (vLLM's
        ``_update_waiting_for_remote_kv``; a full hit recomputes its last token)."""
        loading = self.loading
        done = 0
        while done < len(loading) and loading[done].load_ready_seconds <= seen_seconds:
            done += 1
        if not done:
            return
        arrived = loading[:done]
        del loading[:done]
        for st in arrived:
            self._cache(st, st.num_computed)
            if st.num_computed >= st.num_tokens:
                st.num_computed = st.num_tokens - 1
            st.load_ready_seconds = float("nan")
        self.loaded.extend(arrived)

    def _cpu_store_step(self, scheduled: list[tuple[RequestState, int]]) -> None:
        """The schedule's stores (vLLM's ``_build_store_jobs``): each scheduled request's
        prompt blocks its tokens complete, then those left of the requests retired since the
        last schedule, whose chunks then become the most recent (``on_request_finished``)."""
        tier = self.offload
        assert tier is not None
        bs = self.block_size
        for st, num_new in scheduled:
            self._cpu_offer(tier, self._cpu_req(st),
                            min(st.num_computed + num_new, st.req.prompt_tokens) // bs, bs)
        retired = self._cpu_retired
        if retired:
            self._cpu_retired = []
            reqs = [self._cpu_req(st) for st in retired]
            for st, req in zip(retired, reqs, strict=True):
                self._cpu_offer(tier, req, st.req.prompt_tokens // bs, bs)
            for st, req in zip(retired, reqs, strict=True):
                tier.finish(req)
                del self._cpu[st.req.request_id]  # its transfers hold what they need

    @staticmethod
    def _cpu_offer(tier: CPUTier, req: RequestOffload, num_chunks: int, bs: int) -> None:
        num_chunks = min(num_chunks, len(req.keys))
        first = req.next_chunk
        if num_chunks > first:
            tier.store(req, req.keys[first:num_chunks], first, bs)

    def _head_admissible(self) -> bool:
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return False
        st = self.waiting[0]
        hits = self._lookup(st) if st.num_computed == 0 else _NO_BLOCKS
        free: int = self.pool.get_num_free_blocks()
        return self._admission_blocks(st, hits) <= free

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> SimResult:
        states = self.states
        n = len(states)
        idx = 0
        stride = max(1, n // PROGRESS_REPORTS)
        next_report = stride
        loading = self.loading
        while True:
            while idx < n and states[idx].req.arrival_seconds <= self.now:
                if states[idx].output_tokens > 0:
                    self.waiting.append(states[idx])
                idx += 1
            if not self.running and not self.waiting and not loading and not (
                    self.loaded or self._cpu_retired):
                if idx >= n:
                    break
                self.now = states[idx].req.arrival_seconds
                continue
            next_arrival = states[idx].req.arrival_seconds if idx < n else None
            if self.offload is not None:
                # vLLM learns of a finished transfer from a step's output. Synchronous: the
                # step just taken, so one done by now. Async: this schedule runs before the
                # last step's output is processed, so one done by the last step's start.
                seen = self._load_seen_seconds if self.config.async_scheduling else self.now
                self.offload.complete(seen)
                if loading:
                    self._loads_arrived(seen)
                # The worker starts the last schedule's stores with this step.
                self.offload.begin_step(self.now)
                ready = loading[0].load_ready_seconds if loading else None
                if ready is not None and (next_arrival is None or ready < next_arrival):
                    next_arrival = ready
            self.events += 1
            self._advance(next_arrival)
            if self.on_step is not None:
                self.cohort.sync_all()
                self.on_step(self)
            if self.on_progress is not None and self.finished >= next_report:
                self.on_progress(min(self.finished, n), n)
                next_report = (self.finished // stride + 1) * stride
        if self.on_progress is not None:
            self.on_progress(n, n)  # requests with no output tokens never run
        return self._result()

    def _advance(self, next_arrival: float | None) -> None:
        """One loop iteration: a decode run, a cohort step, or an exact step."""
        if not self.decode_runs:
            self._step(next_arrival)
            return
        if self.offload is not None:
            # With the CPU tier, decode runs only where they store, look up and admit
            # nothing; a cohort step stores and loads as the exact step (its members have
            # nothing to store: ``_joins``); no prefill runs (each chunk stores).
            if (not (self.waiting or self.loading or self.loaded)
                    and self._cohort_run(next_arrival)) or self._cohort_step(next_arrival):
                return
        elif (self._cohort_run(next_arrival) or self._prefill_run(next_arrival)
                or self._cohort_step(next_arrival)):
            return
        # The exact step, with every request in its fields; then the cohort re-forms.
        self.cohort.leave_all()
        self._step(next_arrival)
        self._regroup()

    def _joins(self, st: RequestState) -> bool:
        """Whether ``st`` decodes steadily from the next step on (cohort.py): it sampled in
        the step just taken, is not done, and has no shareable block left to cache."""
        return (st.last_sample_step == self.steps and st.generated < st.output_tokens
                and st.num_computed == st.num_tokens - 1
                and st.num_cached_blocks >= len(st.hashes)
                and (self.offload is None or self._cpu_stored(st)))

    def _cpu_stored(self, st: RequestState) -> bool:
        """Whether the CPU tier took every prompt chunk ``st`` offers (a store dropped for
        want of room is offered again at every schedule: not a steady decoder)."""
        req = self._cpu.get(st.req.request_id)
        return req is not None and req.next_chunk >= min(
            st.req.prompt_tokens // self.block_size, len(req.keys))

    def _regroup(self) -> None:
        cohort = self.cohort
        active: list[RequestState] = []
        for st in self.running:
            if self._joins(st):
                cohort.join(st)
            else:
                active.append(st)
        self._active = active

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

    def _admit(self, budget: int, scheduled: list[tuple[RequestState, int]]) -> int:
        """Admit waiting requests in order while the budget, max-num-seqs and the
        full-sequence block check allow (appended to ``running`` and ``scheduled``);
        returns the budget left."""
        waiting = self.waiting
        running = self.running
        pool = self.pool
        bs = self.block_size
        max_num_seqs = self.config.max_num_seqs
        offload = self.offload
        skipped: list[RequestState] = []  # deferred by the CPU tier: tried next step
        loaded = self.loaded
        while budget > 0 and (waiting or loaded) and len(running) < max_num_seqs:
            queue = loaded or waiting
            st = queue[0]
            if queue is loaded:
                # Its KV arrived from the CPU tier: it holds the blocks, nothing to look up.
                if self._admission_blocks(st, _NO_BLOCKS) > pool.get_num_free_blocks():
                    break
                num_new = min(st.num_tokens - st.num_computed, budget)
            else:
                hits = self._lookup(st)
                if offload is not None:
                    # vLLM asks the connector before it checks the blocks.
                    load = self._load_from_cpu(st, hits, scheduled)
                    if load == _LOAD_DEFER:
                        skipped.append(waiting.popleft())
                        continue
                    if load == _LOAD_BLOCKED:
                        break
                    if load == _LOAD_STARTED:
                        waiting.popleft()  # it waits for its KV (WAITING_FOR_REMOTE_KVS)
                        continue
                if self._admission_blocks(st, hits) > pool.get_num_free_blocks():
                    break
                computed = len(hits) * bs
                num_new = min(st.num_tokens - computed, budget)
                self._count_admission(st, computed, computed)
                pool.touch(hits)
                st.blocks = hits
                st.num_cached_blocks = len(hits)
                st.num_computed = computed
            ok = self._allocate(st, num_new)
            assert ok, "the full-sequence check admitted a request whose chunk does not fit"
            queue.popleft()
            running.append(st)
            scheduled.append((st, num_new))
            budget -= num_new
        if skipped:
            waiting.extendleft(reversed(skipped))
        return budget

    def _step(self, next_arrival: float | None) -> None:
        """One exact engine step."""
        self._load_seen_seconds = self.now  # this step starts now
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[RequestState, int]] = []
        self.last_preempted = []
        preempted = False
        in_flight = False  # a victim could not be preempted (``_defer_frees``)
        running = self.running
        i = 0
        bs = self.block_size
        pool = self.pool
        while i < len(running) and budget > 0:
            st = running[i]
            if st.generated >= st.output_tokens:
                # Async: it finished in the step before; freed once this step is scheduled.
                i += 1
                continue
            num_new = st.num_tokens - st.num_computed
            if num_new == 1 and (st.num_tokens - 1) % bs and st.num_tokens % bs:
                # A decode token inside its last block that does not fill it: no new block,
                # nothing to cache. (A token that fills the block must go through _allocate:
                # vLLM caches the block now, which matters if the request is preempted or
                # finishes before its next block.)
                scheduled.append((st, 1))
                budget -= 1
                i += 1
                continue
            if num_new > budget:
                num_new = budget
            self_preempted = False
            while not self._allocate(st, num_new):
                if (self._defer_frees and running[-1].sched_step == self.steps
                        and not self._last_step_empty):
                    # The victim's blocks may still be written by the step in flight
                    # (its output is not processed yet): vLLM does not preempt it, and
                    # schedules no more running requests.
                    self_preempted = in_flight = True
                    break
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is st:
                    self_preempted = True
                    break
            if self_preempted:
                break
            scheduled.append((st, num_new))
            budget -= num_new
            i += 1

        if not preempted:
            budget = self._admit(budget, scheduled)
        if self.offload is not None:
            self._cpu_store_step(scheduled)

        self.last_scheduled = scheduled
        self.last_blocks_in_use = self._usable_blocks - pool.get_num_free_blocks()
        finishing = cfg.async_scheduling and any(
            st.generated >= st.output_tokens for st in running)
        if finishing:
            # Async: the previous step's output is processed now; its finished requests
            # leave (finish time: the end of that step, which is ``now``).
            self._finish_done()
            running = self.running  # _finish_done made a new list
        self._last_step_empty = not scheduled
        if not scheduled:
            if finishing or in_flight:
                # An empty batch: the finished requests left, or the step in flight is
                # processed now (its blocks can be freed): schedule again.
                return
            # Nothing fits and nothing runs: wait for the next arrival or load (cannot happen
            # otherwise with the rejections in __init__, but never spin).
            self._idle(next_arrival)
            return

        dt = self._charge(scheduled)
        any_done = self._compute(scheduled, self.steps)
        alloc = 0
        used = 0
        for st in running:
            alloc += len(st.blocks)
            used += st.num_computed
        self._sample(dt, alloc * bs - used, alloc * bs)
        if any_done and not cfg.async_scheduling:
            self._finish_done()

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

    def _cohort_run(self, next_arrival: float | None) -> bool:
        """Take k identical decode steps at once, if every running request is a member of
        the cohort and the state allows; False if not (nothing changed).

        Async scheduling: requests that sampled their last token in the step before
        (``_active``, nothing else) are freed once the next step is scheduled. With nobody
        waiting, that step is a decode step of the members like the rest of the run, so
        the run takes it too: its blocks are taken before the frees, as that step's, and
        the other steps' blocks after them. The frees change nothing else the run reads
        (arrivals are cut by time; the block bound is checked on the blocks after them)."""
        cohort = self.cohort
        n = cohort.size
        if not n or n > self.config.max_num_batched_tokens:
            return False  # nobody is decoding, or not every member gets its token
        retiring = self._active
        if retiring and (self.waiting or self.loading or self.horizon_seconds is not None
                         or not self.config.async_scheduling
                         or any(st.generated < st.output_tokens for st in retiring)):
            return False  # someone is not decoding, or the frees could admit someone
        k = cohort.steps_to_next_finish()
        if k <= 1 or (self.waiting and self._head_admissible()):
            return False
        overlapped = self.config.async_scheduling
        cost = self.cost
        pool = self.pool
        # The run's time lines, shared by every length this run considers.
        lines = cost.run_lines(n, cohort.context_tokens())
        if next_arrival is not None and not self.waiting and n < self.config.max_num_seqs:
            k = min(k, cost.steps_to_reach(lines, next_arrival - self.now, k, overlapped))
        if self.loading:
            # A load that arrives is scheduled in the next step: stop there.
            k = min(k, cost.steps_to_reach(
                lines, self.loading[0].load_ready_seconds - self.now, k, overlapped))
        if self.horizon_seconds is not None:
            k = min(k, cost.steps_to_reach(lines, self.horizon_seconds - self.now, k,
                                           overlapped))
        first = _NO_BLOCKS  # the first step's blocks, taken before the frees
        if retiring:
            need_first = cohort.blocks_needed_now()
            if need_first > pool.get_num_free_blocks():
                return False  # the exact step decides (and any preemption)
            if need_first:
                first = pool.get_new_blocks(need_first)
            self._finish_done(retiring)
            self._active = []
            floor = 1  # that step is taken: the run is at least it
        else:
            floor = 2
        free = pool.get_num_free_blocks() + len(first)
        # Cheap bound first: k steps add at most ceil(k / bs) blocks to each sequence.
        if n * -(-k // self.block_size) > free and cohort.new_blocks_for(k) > free:
            lo, hi = floor - 1, k  # fits(lo), not fits(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if cohort.new_blocks_for(mid) <= free:
                    lo = mid
                else:
                    hi = mid
            k = lo
        if k < floor:
            return False  # the exact step handles it (and any preemption)
        dt = cost.run_seconds(lines, k, overlapped)
        if self.offload is not None:
            # Async: the transfers done by the start of the run's last step are seen next.
            self._load_seen_seconds = self.now + (
                cost.run_seconds(lines, k - 1, overlapped) if k > 1 else 0.0)
        need = cohort.new_blocks_for(k) - len(first)
        if need:
            rest = pool.get_new_blocks(need)
            fresh = np.concatenate((first, rest)) if len(first) else rest
        else:
            fresh = first
        self.now += dt
        self.steps += k
        if self._defer_frees:
            for st in self.running:
                st.sched_step = self.steps
        done = cohort.advance(k, fresh, self.steps)
        bs = self.block_size
        self._sample(dt, cohort.blocks_held * bs - cohort.computed_tokens(),
                     cohort.blocks_held * bs)
        if done:
            self._leave_done(done)
        return True

    def _prefill_run(self, next_arrival: float | None) -> bool:
        """Take at once the next steps that are all alike: the cohort's members decode and
        one request, running after all of them, prefills a chunk of the budget that leaves
        part of its prompt, so nothing samples, finishes, is admitted (the chunk takes the
        rest of the budget) or freed. Each step is ``_cohort_step``'s, figured in scalars
        (time, blocks, the sample); then the blocks of every step are taken in one call, in
        the order the steps would take them (each step's members' blocks, then the
        chunk's), and the chunks' full blocks are cached in one call: with nothing freed
        or looked up in between, the same blocks hold the same keys (an older copy of a key
        that a step evicts is evicted before the new copy is cached, either way). Stops
        before a step the next arrival (it would join the waiting queue the step samples),
        a member's last token or the free blocks would change. False if fewer than two
        such steps (nothing changed)."""
        active = self._active
        if len(active) != 1 or self.horizon_seconds is not None or self.loading:
            # (Step-wise replay reports every step's tokens, and a load in flight is seen
            # by the step after the one it is done in: steps one at a time there.)
            return False
        st = active[0]
        cohort = self.cohort
        members = cohort.size
        chunk = self.config.max_num_batched_tokens - members
        rem = st.num_tokens - st.num_computed
        if chunk <= 0 or rem <= 2 * chunk or st.generated >= st.output_tokens:
            return False
        if members and self.running[-1] is not st:
            return False  # members after it would be cut off: the exact step decides
        k = (rem - 1) // chunk  # the steps whose chunk leaves part of the prompt
        if members:
            k = min(k, cohort.steps_to_next_finish() - 1)
        if k < 2:
            return False
        bs = self.block_size
        pool = self.pool
        free = pool.get_num_free_blocks()
        usable = pool.num_gpu_blocks - 1
        overlapped = self.config.async_scheduling
        cost = self.cost
        tick, context = cohort.tick, cohort.context_tokens()
        held = cohort.blocks_held
        computed = st.num_computed
        num_blocks = len(st.blocks)
        now = self.now
        taken = 0
        # Per step: (members' new blocks, the chunk's new blocks, seconds, end time,
        # fragmented slots, allocated slots, KV usage).
        steps: list[tuple[int, int, float, float, int, int, float]] = []
        for j in range(k):
            if j and next_arrival is not None and now >= next_arrival:
                break
            m = cohort.blocks_needed_at(tick + j)
            b = -(-(computed + chunk) // bs) - num_blocks
            if b < 0:
                b = 0
            if taken + m + b > free:
                break  # someone may be preempted: the exact step decides
            # ``_charge`` with the members' terms, then the chunk's.
            num_tokens = members
            kv_read = context
            pairs = float(context)
            num_tokens += chunk
            kv_read += computed + chunk
            pairs += chunk * computed + chunk * (chunk + 1) / 2.0
            dt = cost.step_seconds(num_tokens, kv_read, pairs, overlapped, members + 1)
            now += dt
            taken += m + b
            held += m
            num_blocks += b
            computed += chunk
            context += members
            alloc = held + num_blocks
            used = context - members + computed
            steps.append((m, b, dt, now, alloc * bs - used, alloc * bs,
                          1.0 - (free - taken) / usable))
        if len(steps) < 2:
            return False
        got = pool.get_new_blocks(taken) if taken else _NO_BLOCKS
        theirs: list[np.ndarray] = []
        mine: list[np.ndarray] = []
        at = 0
        for m, b, *_ in steps:
            if m:
                theirs.append(got[at:at + m])
                at += m
            if b:
                mine.append(got[at:at + b])
                at += b
        if mine:
            st.add_blocks(np.concatenate(mine) if len(mine) > 1 else mine[0])
        for _, _, dt, end, fragmented, allocated, usage in steps:
            self.now = end
            self.steps += 1
            self._sample(dt, fragmented, allocated, usage)
        if members:
            fresh = (np.concatenate(theirs) if len(theirs) > 1 else theirs[0]) if theirs \
                else _NO_BLOCKS
            done = cohort.advance(len(steps), fresh, self.steps)
            assert not done, "a member finished inside a prefill run"
        self._cache(st, computed)
        st.num_computed = computed
        return True

    def _leave_done(self, done: list[RequestState]) -> None:
        """Members that sampled their last token leave the cohort; synchronous scheduling
        frees them now, async once the next step is scheduled (``_step``'s doc)."""
        for st in done:
            self.cohort.leave(st)
        active = self._active
        # Running order without a pass over all of running: positions of the few.
        order = self.running.index
        if not self.config.async_scheduling:
            # Every request done in the step (members and others), in running order.
            self._finish_done(sorted(
                [*done, *(st for st in active if st.generated >= st.output_tokens)],
                key=order))
            self._active = [st for st in active if st.generated < st.output_tokens]
        else:
            self._active = sorted([*active, *done], key=order)

    def _cohort_step(self, next_arrival: float | None) -> bool:
        """One engine step with the cohort's members decoding and the other running
        requests (``_active``) scheduled as ``_step`` does; False (nothing changed) when the
        step could preempt or the token budget would cut a member off."""
        cfg = self.config
        cohort = self.cohort
        running = self.running
        active = self._active
        budget = cfg.max_num_batched_tokens
        members = cohort.size
        bs = self.block_size
        plan: list[tuple[RequestState, int]] = []
        more_blocks: list[int] = []  # per planned request, the new blocks it needs
        member_blocks = cohort.blocks_needed_now()
        need = member_blocks
        taken = 0  # tokens of active requests
        cut = False
        for i, st in enumerate(active):
            if st.generated >= st.output_tokens:
                continue  # async: it finished in the step before
            rem = st.num_tokens - st.num_computed
            # Members before it; only looked up when they could cut its chunk (otherwise
            # it gets all it asks for, whatever they take).
            ahead = running.index(st) - i if members and budget - members - taken < rem else 0
            left = budget - ahead - taken
            if left <= 0:
                if left < 0 or members > ahead:
                    return False  # a member would get no token
                cut = True
                break
            num_new = rem if rem <= left else left
            more = -(-(st.num_computed + num_new) // bs) - len(st.blocks)
            if more > 0:
                need += more
            else:
                more = 0
            plan.append((st, num_new))
            more_blocks.append(more)
            taken += num_new
            if num_new < rem:
                if members > ahead:
                    return False
                cut = True
                break
        if not cut and taken + members > budget:
            return False
        pool = self.pool
        if need > pool.get_num_free_blocks():
            return False  # someone may be preempted: the exact step decides

        # Allocation (``_allocate`` for each): the same blocks from the front of the free
        # queue as request by request, in one call (nothing is freed or touched before the
        # admissions); members' first.
        if need:
            got = pool.get_new_blocks(need)
            fresh = got[:member_blocks]
            at = member_blocks
            for (st, num_new), more in zip(plan, more_blocks, strict=True):
                if more:
                    st.add_blocks(got[at:at + more])
                    at += more
                self._cache(st, st.num_computed + num_new)
        else:
            fresh = _NO_BLOCKS
            for st, num_new in plan:
                self._cache(st, st.num_computed + num_new)
        budget -= taken + members
        num_planned = len(plan)
        if self.offload is not None:
            self._load_seen_seconds = self.now  # this step starts now
        if budget > 0:
            budget = self._admit(budget, plan)
            for st, _ in plan[num_planned:]:
                active.append(st)
        if self.offload is not None:
            # Members store nothing (``_joins``): the schedule's stores are the plan's.
            self._cpu_store_step(plan)
            self._last_step_empty = not plan and not members
        # Async: the previous step's output finishes requests now. Members never are done
        # (they leave at their last token), so the done ones are all in ``active``.
        finished = ([st for st in active if st.generated >= st.output_tokens]
                    if cfg.async_scheduling else None)
        finishing = bool(finished)
        if finished:
            self._finish_done(finished)
            active = self._active = [st for st in active if st.generated < st.output_tokens]
        if not plan and not members:
            if finishing:
                return True  # an empty batch: the finished requests left, schedule again
            self._idle(next_arrival)
            return True

        context = cohort.context_tokens()
        # A member decodes one token over its context: num_computed + 1 pairs, its token count.
        dt = self._charge(plan, num_tokens=members, kv_read=context, pairs=float(context))
        step = self.steps
        done = cohort.advance(1, fresh, step) if members else []
        any_done = self._compute(plan, step)
        alloc = cohort.blocks_held
        used = cohort.computed_tokens()
        for st in active:
            alloc += len(st.blocks)
            used += st.num_computed
        self._sample(dt, alloc * bs - used, alloc * bs)
        if done:
            self._leave_done(done)  # with the others done in this step, in running order
            active = self._active
        elif any_done and not cfg.async_scheduling:
            self._finish_done([st for st in active if st.generated >= st.output_tokens])
            active = self._active = [st for st in active if st.generated < st.output_tokens]
        joined = False
        for st, _ in plan:
            if st.last_sample_step == step and self._joins(st):
                cohort.join(st)
                joined = True
        if joined:
            self._active = [st for st in active if st.cohort_tick < 0]
        return True

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


def simulate(
    requests: Sequence[SimRequest], config: EngineConfig, cost: StepCostModel, name: str = "",
    on_step: StepHook | None = None, on_progress: ProgressHook | None = None,
) -> SimResult:
    """Replay ``requests`` under ``config``; pure (same inputs, same result)."""
    return Scheduler(requests, config, cost, name=name, on_step=on_step,
                     on_progress=on_progress).run()
