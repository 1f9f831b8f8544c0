"""vLLM 0.33.0's own scheduler, driven as vLLM's engine core drives it, under kvtune's
step-time model.

Built the way ``vllm serve`` builds it, minus the GPU (``shared`` recipe, verified on this
machine): a model directory holding only a ``config.json``, ``DeviceConfig("cpu")``, and a
``KVCacheConfig`` of ``num_gpu_blocks`` blocks with one KV-cache group per attention kind
(``kv_groups``: full attention; sliding-window and chunked-local groups for Gemma-3- and
Llama-4-shaped hybrids). Requests get token ids from ``tokens.TokenSpace``, so the prefix
cache sees exactly the sharing kvtune's segments describe.

The loop is the engine core's: ``step`` (synchronous: schedule, execute, update) or
``step_with_batch_queue`` with two batches in flight (``async_scheduling``: batch N+1 is
scheduled before batch N's output is processed, with vLLM's ``AsyncScheduler``). The model
samples one token for each request whose known tokens a batch completes; the token is the
request's next token in its segments (so a later turn that re-sends an answer hits it).
A step's time is kvtune's ``StepCostModel`` over what vLLM scheduled; requests arrive when
the model clock passes their arrival (checked before each schedule).

Imports vLLM (and torch) on first use: about 10-20 s of CPU.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvtune.oracle.offload_probe import OffloadProbe, step_jobs
from kvtune.oracle.offload_worker import HostLinkWorker
from kvtune.oracle.steps import (
    OffloadEvents,
    RunRecord,
    StepRecord,
    attach_offload,
    step_cost,
)
from kvtune.oracle.tokens import TokenSpace
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.simulator.metrics import SimResult, TimeSeries
from kvtune.tuner.simulator.scheduler import EngineConfig
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import SimRequest

VLLM_VERSION = "0.33.0"
GiB = 1 << 30
INSTALL_HINT = "install it with: pip install 'kvtune[vllm]' (vLLM 0.33.0 and torch, ~9 GB)"

GroupKind = Literal["full", "sliding_window", "chunked_local"]


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV-cache group as vLLM makes it for a model's layers of one attention kind.
    ``window_tokens``: the sliding window, or the local-attention chunk."""

    kind: GroupKind = "full"
    window_tokens: int = 0


FULL_ATTENTION: tuple[KVGroup, ...] = (KVGroup(),)


def import_vllm() -> Any:
    """vLLM's scheduler modules, or a one-line error saying how to install them."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import vllm  # noqa: F401
            from vllm.v1.core.sched import async_scheduler, scheduler  # noqa: F401
    except ImportError as exc:
        raise InvalidInput("--engine", "vllm", f"needs vLLM {VLLM_VERSION}: {INSTALL_HINT}"
                           ) from exc
    import vllm as v

    # The CPU tier's "cannot store chunks" (an eviction it could not make) is a case the
    # oracle compares, not news: one line per step would drown the output.
    logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
                      ).setLevel(logging.ERROR)
    if v.__version__ != VLLM_VERSION:
        raise InvalidInput("--engine", "vllm", f"needs vLLM {VLLM_VERSION}, found "
                           f"{v.__version__}; {INSTALL_HINT}")
    return v


_MODEL_CONFIG = {
    # A Llama-shaped config.json: vLLM reads the architecture and shapes, never weights.
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
    "intermediate_size": 2816, "num_attention_heads": 8, "num_key_value_heads": 8,
    "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "vocab_size": 32000,
    "torch_dtype": "bfloat16",
}


class VllmEngine:
    """vLLM's scheduler over ``requests`` under ``config`` and ``cost``; ``run()`` once."""

    def __init__(
        self, requests: Sequence[SimRequest], config: EngineConfig, cost: StepCostModel,
        kv_groups: Sequence[KVGroup] = FULL_ATTENTION,
    ) -> None:
        if config.allocation != "paged":
            raise InvalidInput("allocation", config.allocation,
                               "vLLM only allocates paged blocks; use the simulator")
        if config.cpu_offload_blocks and tuple(kv_groups) != FULL_ATTENTION:
            raise InvalidInput("cpu_offload_blocks", config.cpu_offload_blocks,
                               "the oracle runs CPU offload on full-attention models only; "
                               "use the simulator for hybrid models with offload")
        if config.cpu_offload_blocks and not config.enable_prefix_caching:
            raise InvalidInput("cpu_offload_blocks", config.cpu_offload_blocks,
                               "kvtune's CPU tier needs prefix caching on (its chunks are "
                               "keyed by block hash); turn prefix caching on or offload off")
        import_vllm()
        self.config = config
        self.cost = cost
        self.requests = list(requests)
        self.space = TokenSpace(self.requests)
        self.kv_groups = tuple(kv_groups)
        self._tmp = tempfile.TemporaryDirectory(prefix="kvtune-oracle-")
        self.offload: OffloadProbe | None = None
        self.depth = 1  # batches in flight: vLLM's max_concurrent_batches (``_build``)
        self.scheduler = self._build()
        self.worker = (HostLinkWorker(config.offload_load_seconds_per_block)
                       if self.offload is not None else None)
        self._cpu_loads: list[tuple[int, int]] = []  # loads started since the last record
        self._gpu_hit: dict[str, int] = {}  # a request that loaded: its GPU prefix hit
        self._by_id = {str(r.request_id): r for r in self.requests}
        nan = float("nan")
        n = len(self.requests)
        self._index = {str(r.request_id): i for i, r in enumerate(self.requests)}
        # Per request (the simulator's SimResult fields), filled by run().
        self.first_token_seconds = [nan] * n
        self.finish_seconds = [nan] * n
        self.output_tokens = [0] * n
        self.query_tokens = 0
        self.hit_tokens = 0
        self.resume_hit_tokens = 0
        self.series = TimeSeries()
        self._integrals = [0.0, 0.0, 0.0, 0.0, 0.0]  # busy, running, usage, frag, alloc
        self.peak_running = 0

    # -- construction -----------------------------------------------------------------------

    def _build(self) -> Any:
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            ModelConfig,
            ParallelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import KVCacheConfig
        from vllm.v1.structured_output import StructuredOutputManager

        cfg = self.config
        model_dir = Path(self._tmp.name)
        layers = max(2, len(self.kv_groups))
        (model_dir / "config.json").write_text(json.dumps({
            **_MODEL_CONFIG, "num_hidden_layers": layers,
            "max_position_embeddings": cfg.max_model_len,
        }))
        model_config = ModelConfig(model=str(model_dir), dtype="bfloat16", seed=42,
                                   skip_tokenizer_init=True, max_model_len=cfg.max_model_len)
        scheduler_config = SchedulerConfig(
            max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=cfg.max_model_len, enable_chunked_prefill=True,
            is_encoder_decoder=False, async_scheduling=cfg.async_scheduling,
        )
        cache_config = CacheConfig(
            block_size=cfg.block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
            enable_prefix_caching=cfg.enable_prefix_caching,
        )
        cache_config.num_gpu_blocks = cfg.num_gpu_blocks
        if cfg.cpu_offload_blocks:
            # ``--kv-offloading-size`` GiB with ``--kv-offloading-backend native``: vLLM
            # turns it into the OffloadingConnector (``_post_init_kv_transfer_config``)
            # whose CPU tier holds size // (page-aligned bytes of one block) chunks.
            cache_config.kv_offloading_size = (cfg.cpu_offload_blocks * self._block_bytes()
                                               / GiB)
            cache_config.kv_offloading_backend = "native"
        # Pipeline parallel: vLLM's own micro-batch cadence (``AsyncScheduler.decode_stagger``)
        # and batch queue depth (``max_concurrent_batches``) follow from its ParallelConfig
        # (at 1, the default ParallelConfig).
        vllm_config = VllmConfig(
            model_config=model_config, cache_config=cache_config,
            scheduler_config=scheduler_config, device_config=DeviceConfig(device="cpu"),
            parallel_config=ParallelConfig(pipeline_parallel_size=cfg.pipeline_parallel),
        )
        self.depth = vllm_config.max_concurrent_batches
        groups = self._kv_cache_groups()
        kv_cache_config = KVCacheConfig(num_blocks=cfg.num_gpu_blocks, kv_cache_tensors=[],
                                        kv_cache_groups=groups)
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self._hasher = get_request_block_hasher(cfg.block_size, hash_fn)
        cls = AsyncScheduler if cfg.async_scheduling else Scheduler
        sched = cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                    structured_output_manager=StructuredOutputManager(vllm_config),
                    block_size=cfg.block_size, log_stats=True)
        if cfg.cpu_offload_blocks:
            self.offload = OffloadProbe(sched, cfg.cpu_offload_blocks)
        return sched

    def _kv_cache_groups(self) -> list[Any]:
        """One ``KVCacheGroupSpec`` per attention kind of ``kv_groups``, one layer each."""
        import torch
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec,
            FullAttentionSpec,
            KVCacheGroupSpec,
            SlidingWindowSpec,
        )

        cfg = self.config
        heads, head_size = 8, 128
        groups: list[Any] = []
        for i, g in enumerate(self.kv_groups):
            spec: Any
            if g.kind == "full":
                spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=heads,
                                         head_size=head_size, dtype=torch.bfloat16)
            elif g.kind == "sliding_window":
                spec = SlidingWindowSpec(block_size=cfg.block_size, num_kv_heads=heads,
                                         head_size=head_size, dtype=torch.bfloat16,
                                         sliding_window=g.window_tokens)
            else:
                spec = ChunkedLocalAttentionSpec(
                    block_size=cfg.block_size, num_kv_heads=heads, head_size=head_size,
                    dtype=torch.bfloat16, attention_chunk_size=g.window_tokens)
            groups.append(KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn"], spec))
        return groups

    def _block_bytes(self) -> int:
        # One block of each group's one layer: K and V, 8 heads of 128 bf16 values a token
        # (4 KiB-aligned already, so no page padding).
        return 2 * self.config.block_size * 8 * 128 * 2 * len(self.kv_groups)

    def _admissible(self, r: SimRequest) -> int:
        """Output tokens vLLM will generate, 0 if the request is refused: as the simulator
        (no room for one output token within max-model-len, or larger than the cache, on
        which a bare scheduler would wait forever)."""
        cfg = self.config
        out = min(r.output_tokens, cfg.max_model_len - r.prompt_tokens)
        blocks = -(-(r.prompt_tokens + out - 1) // cfg.block_size)
        return out if out >= 1 and blocks <= cfg.num_gpu_blocks - 1 else 0

    def _vllm_request(self, r: SimRequest, out: int) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        return Request(
            request_id=str(r.request_id), prompt_token_ids=self.space.prompt(r),
            sampling_params=SamplingParams(max_tokens=out, ignore_eos=True),
            pooling_params=None, block_hasher=self._hasher, arrival_time=r.arrival_seconds,
        )

    # -- the CPU tier (OffloadingConnector) ---------------------------------------------

    def _offload_step(self, out: Any, start_seconds: float) -> None:
        """A step was scheduled at ``start_seconds``: its connector jobs go to the worker
        model, its loads to the step's record."""
        if self.worker is None:
            return
        loads, stores, flush = step_jobs(out)
        self.worker.start_step(start_seconds, loads, stores, flush)
        self._cpu_loads.extend((int(rid), n) for _, rid, n in loads)
        for _, rid, n in loads:
            # Its GPU prefix hit: what it computed once the load is in, less the load.
            self._gpu_hit[rid] = (self.scheduler.requests[rid].num_computed_tokens
                                  - n * self.config.block_size)

    def _take_offload_events(self) -> OffloadEvents:
        if self.offload is None:
            return OffloadEvents()
        stored, evicted = self.offload.take()
        loads = tuple(self._cpu_loads)
        self._cpu_loads = []
        return OffloadEvents(loads, stored, evicted)

    def _transfers_done(self, end_seconds: float) -> Any:
        """The worker's report with a step's output: transfers done by its end."""
        if self.worker is None:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput

        recving, jobs = self.worker.finished(end_seconds)
        if not jobs:
            return None
        return KVConnectorOutput(finished_recving=recving or None,
                                 kv_connector_worker_meta=OffloadingWorkerMetadata(
                                     completed_jobs=jobs))

    def _next_event(self, now: float, next_arrival: float | None) -> float:
        done = self.worker.next_done_seconds() if self.worker is not None else None
        events = [t for t in (done, next_arrival) if t is not None]
        return max(now, min(events)) if events else now

    # -- the loop ---------------------------------------------------------------------------

    def _sample(self, dt: float) -> None:
        """The simulator's per-step sample (``Scheduler._sample``): taken where the
        simulator takes it, once step N is scheduled and, async, step N-1's output is in."""
        sched = self.scheduler
        usable = self.config.num_gpu_blocks - 1
        usage = 1.0 - sched.kv_cache_manager.block_pool.get_num_free_blocks() / usable
        alloc = 0
        used = 0
        for req in sched.running:
            alloc += len(sched.kv_cache_manager.get_block_ids(req.request_id)[0])
            used += req.num_computed_tokens
        alloc *= self.config.block_size
        n_run = len(sched.running)
        self.peak_running = max(self.peak_running, n_run)
        s = self.series
        s.time_seconds.append(self._now)
        s.kv_usage.append(usage)
        s.running.append(n_run)
        s.waiting.append(len(sched.waiting))
        s.prefix_hit_rate.append(self.hit_tokens / self.query_tokens if self.query_tokens
                                 else 0.0)
        for i, v in enumerate((dt, n_run * dt, usage * dt, (alloc - used) * dt, alloc * dt)):
            self._integrals[i] += v

    def result(self, name: str = "vllm") -> SimResult:
        """The run as the simulator reports one (``kvtune simulate --engine vllm``)."""
        busy, run_i, usage_i, frag_i, alloc_i = self._integrals
        busy = busy or 1.0
        nan = float("nan")
        cfg = self.config
        return SimResult(
            name=name, num_requests=len(self.requests),
            arrival_seconds=[r.arrival_seconds for r in self.requests],
            first_token_seconds=list(self.first_token_seconds),
            finish_seconds=[f if o else nan
                            for f, o in zip(self.finish_seconds, self.output_tokens,
                                            strict=True)],
            prompt_tokens=[r.prompt_tokens for r in self.requests],
            output_tokens=list(self.output_tokens), rejected=len(self.record.rejected),
            preemptions=self.record.preemptions, resume_hit_tokens=self.resume_hit_tokens,
            cpu_hit_tokens=sum(n for _, n in self.record.cpu_loads) * cfg.block_size,
            prefix_query_tokens=self.query_tokens, prefix_hit_tokens=self.hit_tokens,
            peak_running=self.peak_running, mean_running=run_i / busy,
            mean_kv_usage=usage_i / busy, mean_fragmented_tokens=frag_i / busy,
            fragmentation_fraction=frag_i / alloc_i if alloc_i else 0.0,
            kv_cache_tokens=cfg.kv_cache_tokens, series=self.series,
            config={"engine": "vllm", "vllm_version": VLLM_VERSION,
                    **{k: getattr(cfg, k) for k in cfg.__dataclass_fields__}},
        )

    def run(self) -> RunRecord:
        sched = self.scheduler
        loop = _Loop(pending=deque(self.requests),
                     depth=(self.depth if self.config.pipeline_parallel > 1
                            else 2 if self.config.async_scheduling else 1))
        self._now = 0.0
        while True:
            if loop.sample_dt is not None:
                self._sample(loop.sample_dt)
                loop.sample_dt = None
            self._arrive(loop)
            if sched.has_requests():
                running_before = {r.request_id: i for i, r in enumerate(sched.running)}
                out = sched.schedule()
                self._offload_step(out, self._now)
                index = -1
                samplers: list[str] = []
                if out.total_num_scheduled_tokens > 0:
                    index, samplers = self._record_step(loop, out, running_before)
                elif not sched.running and all(e[2] < 0 for e in loop.queue):
                    # Idle (nothing runs, nothing could be scheduled): the engine polls
                    # until the next arrival or transfer; the clock moves there.
                    self._now = self._next_event(
                        self._now, loop.pending[0].arrival_seconds if loop.pending else None)
                loop.queue.appendleft((out, samplers, index, self._now))
                if len(loop.queue) < loop.depth and (index >= 0 or sched.has_requests()):
                    continue
            elif not loop.queue:
                if not loop.pending:
                    break
                self._now = max(self._now, loop.pending[0].arrival_seconds)
                continue
            self._update(loop)
        records = loop.records
        if records:
            # Offload events after the last step (none expected) go with it.
            records[-1] = attach_offload(records[-1], self._take_offload_events())
        steps = tuple(
            dataclasses.replace(s, finished=tuple(f))
            for s, f in zip(records, loop.finished_in, strict=True))
        self.record = RunRecord(steps=steps, finish_step=loop.finish_step,
                                rejected=tuple(loop.rejected))
        return self.record

    def _arrive(self, loop: _Loop) -> None:
        """Requests whose arrival the clock has passed go to vLLM (or are rejected)."""
        pending = loop.pending
        while pending and pending[0].arrival_seconds <= self._now:
            r = pending.popleft()
            out = self._admissible(r)
            if out:
                self.output_tokens[self._index[str(r.request_id)]] = out
                self.scheduler.add_request(self._vllm_request(r, out))
            else:
                loop.rejected.append(r.request_id)

    def _record_step(self, loop: _Loop, out: Any, running_before: dict[str, int]
                     ) -> tuple[int, list[str]]:
        """A scheduled batch: its admissions' counts, its time (the clock moves on), first
        tokens, the sample and its record. Returns the record's index and the ids that
        sample."""
        sched = self.scheduler
        scheduled = [(int(rid), n) for rid, n in out.num_scheduled_tokens.items()]
        before: list[int] = []
        admitted: list[tuple[int, int]] = []
        samplers: list[str] = []
        for rid, n in out.num_scheduled_tokens.items():
            req = sched.requests[rid]
            computed = req.num_computed_tokens - n
            before.append(computed)
            if rid not in running_before:
                admitted.append((int(rid), computed))
                if rid in loop.admitted_once:
                    self.resume_hit_tokens += computed
                else:
                    loop.admitted_once.add(rid)
                    self.query_tokens += req.num_prompt_tokens
                    # GPU prefix hits only (the CPU tier's are cpu_hit_tokens).
                    self.hit_tokens += self._gpu_hit.get(rid, computed)
            if req.num_computed_tokens >= req.num_tokens:
                samplers.append(rid)
        preempted = sorted(out.preempted_req_ids or (),
                           key=lambda r: -running_before.get(r, -1))
        dt = step_cost(self.cost, self.config, scheduled, before)
        self._now += dt
        now = self._now
        for rid in samplers:
            i = self._index[rid]
            if self.first_token_seconds[i] != self.first_token_seconds[i]:
                self.first_token_seconds[i] = now
        if self.config.async_scheduling:
            loop.sample_dt = dt
        else:
            self._sample(dt)
        index = len(loop.records)
        usable = self.config.num_gpu_blocks - 1
        pool = sched.kv_cache_manager.block_pool
        loop.records.append(attach_offload(StepRecord(
            scheduled=tuple(scheduled), admitted=tuple(admitted),
            preempted=tuple(int(r) for r in preempted), finished=(),
            blocks_in_use=usable - pool.get_num_free_blocks(), end_seconds=now),
            self._take_offload_events()))
        loop.finished_in.append([])
        return index, samplers

    def _update(self, loop: _Loop) -> None:
        """The oldest batch in flight executed: each request that samples gets its next
        token, vLLM processes the output, and the requests it finished are recorded."""
        # vLLM is imported on first use (module doc), never at this module's import.
        from vllm.v1.outputs import ModelRunnerOutput

        sched = self.scheduler
        out, samplers, index, end_seconds = loop.queue.pop()
        ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in ids:
            req = sched.requests.get(rid)
            if rid in samplers and req is not None and not req.is_finished():
                pos = req.num_tokens
                sampled.append(self.space.ids(self._by_id[rid], pos, pos + 1))
            else:
                sampled.append([])
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
            prompt_token_id_logprobs_dict={}, pooler_output=[],
            kv_connector_output=self._transfers_done(end_seconds)))
        if index < 0:
            return
        for rid in ids:
            req = sched.requests.get(rid)
            if rid in samplers and (req is None or req.is_finished()):
                loop.finished_in[index].append(int(rid))
                loop.finish_step[int(rid)] = index
                self.finish_seconds[self._index[rid]] = loop.records[index].end_seconds


@dataclass
class _Loop:
    """The engine loop's state (``VllmEngine.run``): requests not arrived yet, those
    rejected, each step's record and the requests it finished, the batches in flight
    (scheduler output, ids that sample, index of its record or -1, the model time its step
    ends), how many may be, the requests admitted once, and (async) the sample of the last
    scheduled step."""

    pending: deque[SimRequest]
    depth: int
    rejected: list[int] = dataclasses.field(default_factory=list)
    records: list[StepRecord] = dataclasses.field(default_factory=list)
    finished_in: list[list[int]] = dataclasses.field(default_factory=list)
    finish_step: dict[int, int] = dataclasses.field(default_factory=dict)
    queue: deque[tuple[Any, list[str], int, float]] = dataclasses.field(default_factory=deque)
    admitted_once: set[str] = dataclasses.field(default_factory=set)
    sample_dt: float | None = None

def vllm_steps(
    requests: Sequence[SimRequest], config: EngineConfig, cost: StepCostModel,
    kv_groups: Sequence[KVGroup] = FULL_ATTENTION,
) -> RunRecord:
    """vLLM's scheduler over ``requests``, one record per engine step."""
    return VllmEngine(requests, config, cost, kv_groups).run()


def simulate_vllm(
    requests: Sequence[SimRequest], config: EngineConfig, cost: StepCostModel,
    name: str = "vllm", kv_groups: Sequence[KVGroup] = FULL_ATTENTION,
) -> SimResult:
    """``simulate`` with vLLM's own scheduler in place of kvtune's (same result type)."""
    engine = VllmEngine(requests, config, cost, kv_groups)
    engine.run()
    return engine.result(name)
