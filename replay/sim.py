"""The replayed vLLM instance run by kvtune's simulator (``tuner/simulator/stepwise.py``)
instead of the small model in ``replay_instance.py``: the same block pool, scheduler and
roofline step times the planner scores candidates with, so the replayed series are
consistent with a configuration (issue 5).

``SimInstance`` has the surface ``Replay`` uses (``advance_to``, ``metrics``,
``cache_config_labels``, ...) and turns the scheduler's events into vLLM 0.33.0's counters,
gauges and histograms (``InstanceMetrics``, the same containers the simple engine fills).

The KV-cache size: given a model and a GPU class (``Hardware``), ``num_gpu_blocks`` comes
from the planner's memory arithmetic (``engine.simulated_plan`` -> ``planning.preflight``,
``kvmemory.page_size_bytes``) for the configuration's block size, KV dtype,
gpu-memory-utilization and max-model-len, unless the configuration pins it
(``num_gpu_blocks_override``, vLLM's ``--num-gpu-blocks-override``). Without a model the
configured ``num_gpu_blocks`` is used and step times are Llama-3.1-8B's on an H100.
``kv_cache_memory_bytes`` (``--kv-cache-memory-bytes``) sizes the cache as vLLM does: that
many bytes, no profiling.

Pure like the simulator: model time is the caller's argument.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvtune.operator.prometheus import vllm_metrics as vm
from kvtune.replay.instance import InstanceConfig, InstanceMetrics, cache_config_labels
from kvtune.tuner.errors import KVTuneError
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.planning import PlanRequest
from kvtune.tuner.simulator.engine import simulated_plan, step_cost_for
from kvtune.tuner.simulator.prefix import SegmentInterner
from kvtune.tuner.simulator.scheduler import EngineConfig, RequestState
from kvtune.tuner.simulator.stepwise import (
    StepwiseScheduler,
    sim_request_from_trace,
)
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.traces import TraceRequest
from kvtune.tuner.workload import TokenQuantiles, WorkloadProfile

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_GPU = "H100"


@dataclass(frozen=True)
class Hardware:
    """What the simulated instance runs on: a catalog model, a GPU class, TP."""

    model: str = DEFAULT_MODEL
    gpu: str = DEFAULT_GPU
    tensor_parallel: int = 1
    # True: num_gpu_blocks from the planner's KV math; False: the configured number.
    size_kv_cache: bool = True
    # A deliberately different "true" engine (the closed loop's test, docs/calibration-loop.md):
    # every step takes this many times the simulator's time, and vLLM finds this share of the
    # KV blocks the planner's math gives. 1.0: the planner's own model.
    step_time_scale: float = 1.0
    kv_blocks_scale: float = 1.0


def _plan_request(hw: Hardware) -> PlanRequest:
    # The profile does not enter the memory arithmetic or the step costs; any valid one.
    q = TokenQuantiles(p50=1000, p95=4000, p99=8000, max=8000)
    return PlanRequest(model=get_model(hw.model), gpu=get_gpu_class(hw.gpu),
                       tensor_parallel=hw.tensor_parallel,
                       profile=WorkloadProfile(source="declared", context_tokens=q,
                                               output_tokens=q))


def engine_for(config: InstanceConfig, hw: Hardware, num_gpu_blocks_override: int | None = None
               ) -> tuple[InstanceConfig, EngineConfig, StepCostModel]:
    """The engine numbers of ``config`` on ``hw``; the returned config carries the
    ``num_gpu_blocks`` actually used (what ``vllm:cache_config_info`` reports). Raises
    ValueError when vLLM would not start with it (one max-model-len request must fit)."""
    try:
        return _engine_for(config, hw, num_gpu_blocks_override)
    except KVTuneError as exc:  # an unknown model or GPU, no KV memory, a bad setting
        raise ValueError(str(exc)) from exc


def _engine_for(config: InstanceConfig, hw: Hardware, num_gpu_blocks_override: int | None
                ) -> tuple[InstanceConfig, EngineConfig, StepCostModel]:
    request = _plan_request(hw)
    cost = slowed(step_cost_for(request, config.cache_dtype), hw.step_time_scale)
    if num_gpu_blocks_override is not None:
        config = dataclasses.replace(config, num_gpu_blocks=num_gpu_blocks_override)
    elif hw.size_kv_cache:
        plan = KVPlan(
            block_size=config.block_size, kv_cache_dtype=config.cache_dtype,
            gpu_memory_utilization=config.gpu_memory_utilization,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes or None,
            max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        sim = simulated_plan(request, plan, "replay")
        if not sim.starts:
            raise ValueError(sim.start_error)
        config = dataclasses.replace(
            config, num_gpu_blocks=int(sim.engine.num_gpu_blocks * hw.kv_blocks_scale))
    engine = EngineConfig(
        num_gpu_blocks=config.num_gpu_blocks, block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len,
        enable_prefix_caching=config.enable_prefix_caching,
    )
    return config, engine, cost


def slowed(cost: StepCostModel, factor: float) -> StepCostModel:
    """``cost`` with every step ``factor`` times as long: each kernel's seconds times it,
    each rate over it, the overhead times it (so ``max(overhead, GPU)`` scales too)."""
    if factor == 1.0:
        return cost
    eff = dataclasses.replace(
        cost.efficiency,
        bandwidth_efficiency=cost.efficiency.bandwidth_efficiency / factor,
        compute_efficiency=cost.efficiency.compute_efficiency / factor,
        step_overhead_seconds=cost.efficiency.step_overhead_seconds * factor)
    k = cost.kernels
    kernels = None if k is None else dataclasses.replace(
        k, body_seconds=tuple(x * factor for x in k.body_seconds),
        head_seconds=tuple(x * factor for x in k.head_seconds),
        weight_read_seconds=k.weight_read_seconds * factor,
        attention_fixed_seconds=k.attention_fixed_seconds * factor,
        attention_seconds_per_seq=k.attention_seconds_per_seq * factor,
        kv_bytes_per_second=k.kv_bytes_per_second / factor,
        prefill_flops_per_second=tuple(x / factor for x in k.prefill_flops_per_second),
        all_reduce_seconds=tuple(x * factor for x in k.all_reduce_seconds))
    return dataclasses.replace(cost, efficiency=eff, kernels=kernels)


class SimInstance:
    """A replayed vLLM instance on the simulator. ``advance_to(t, arrivals)`` as
    ``replay_instance.Instance``."""

    def __init__(self, config: InstanceConfig, engine: EngineConfig, cost: StepCostModel,
                 start_seconds: float = 0.0) -> None:
        self.config = config
        self.engine = engine
        self.cost = cost
        self.metrics = InstanceMetrics(config)
        self.scheduler = StepwiseScheduler(engine, cost, start_seconds=start_seconds)
        self._interner = SegmentInterner()
        self._serial = 0
        self.rejected_too_long = 0

    @property
    def now_seconds(self) -> float:
        return self.scheduler.now

    @property
    def running(self) -> list[RequestState]:
        return self.scheduler.running

    @property
    def waiting(self) -> list[RequestState]:
        return list(self.scheduler.waiting)

    def usage(self) -> float:
        return self.scheduler.pool.get_usage()

    def submit(self, req: TraceRequest, arrival_seconds: float) -> bool:
        self._serial += 1
        ok = self.scheduler.submit(
            sim_request_from_trace(req, self._serial, arrival_seconds, self._interner))
        if not ok:
            self.rejected_too_long += 1
        return ok

    def advance_to(self, t_seconds: float, arrivals: list[tuple[float, TraceRequest]]) -> None:
        """Submit ``arrivals`` (sorted, all at or before ``t_seconds``) and run to
        ``t_seconds``. Arrivals go in as they come: the scheduler admits each at the first
        step that starts after its arrival time."""
        for at, req in arrivals:
            self.submit(req, max(at, 0.0))
        self.scheduler.advance_to(t_seconds)
        self._publish()

    def _publish(self) -> None:
        m = self.metrics
        h = m.histograms
        ev = self.scheduler.drain()
        for ttft in ev.first_token_seconds:
            h[vm.TIME_TO_FIRST_TOKEN].observe(ttft)
        itl = h[vm.INTER_TOKEN_LATENCY]
        for gap, n in ev.token_gaps:
            itl.observe(gap, n)
        for f in ev.finished:
            m.finished[f.finished_reason] += 1
            end, first, sched = f.finish_seconds, f.first_token_seconds, f.scheduled_seconds
            h[vm.REQUEST_PROMPT_TOKENS].observe(f.prompt_tokens)
            h[vm.REQUEST_GENERATION_TOKENS].observe(f.output_tokens)
            h[vm.REQUEST_PREFILL_KV_COMPUTED_TOKENS].observe(
                f.prompt_tokens - f.cached_prompt_tokens)
            h[vm.E2E_REQUEST_LATENCY].observe(end - f.arrival_seconds)
            h[vm.REQUEST_QUEUE_TIME].observe(sched - f.arrival_seconds)
            h[vm.REQUEST_INFERENCE_TIME].observe(end - sched)
            h[vm.REQUEST_PREFILL_TIME].observe(first - sched)
            h[vm.REQUEST_DECODE_TIME].observe(end - first)
            h[vm.REQUEST_NUM_PREEMPTIONS].observe(f.preemptions)
            h[vm.TIME_PER_OUTPUT_TOKEN].observe((end - first) / max(f.output_tokens - 1, 1))
        st = self.scheduler.state()
        c = m.counters
        c[vm.PREFIX_CACHE_QUERIES] = float(st.prefix_query_tokens)
        c[vm.PREFIX_CACHE_HITS] = float(st.prefix_hit_tokens)
        c[vm.PROMPT_TOKENS_CACHED] = float(st.prefix_hit_tokens)
        # Every hit here is the GPU's own (the simulator's CPU tier is not replayed), so the
        # by-source counters split the prompt into computed and device-cached tokens.
        m.by_source[vm.PROMPT_TOKENS_BY_SOURCE].update(
            local_compute=float(st.prefix_query_tokens - st.prefix_hit_tokens),
            local_cache_hit=float(st.prefix_hit_tokens))
        m.by_source[vm.PROMPT_TOKENS_CACHED_BY_SOURCE]["device"] = float(st.prefix_hit_tokens)
        c[vm.NUM_PREEMPTIONS] = float(st.preemptions)
        c[vm.PROMPT_TOKENS] = float(st.prompt_tokens)
        c[vm.GENERATION_TOKENS] = float(st.generation_tokens)
        m.gauges[vm.NUM_REQUESTS_RUNNING] = st.running
        m.gauges[vm.NUM_REQUESTS_WAITING] = st.waiting
        m.gauges[vm.KV_CACHE_USAGE_PERC] = st.kv_cache_usage

    def cache_config_labels(self) -> dict[str, str]:
        return cache_config_labels(self.config)
