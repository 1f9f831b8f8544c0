"""What one engine step did, recorded the same way from kvtune's simulator and from vLLM.

A run is the list of its non-empty steps (a step that schedules no token takes no GPU time
and is not counted: vLLM takes one such step after the last finish, and after an idle gap,
to flush finished ids). Per step:

- ``scheduled``: (request id, tokens scheduled), in the scheduler's order (running requests
  first, in admission order, then the requests admitted this step);
- ``admitted``: (request id, tokens already computed when admitted): the prefix-cache hit
  of a new or resumed request;
- ``preempted``: request ids preempted in this step, in order;
- ``finished``: request ids whose last token this step sampled, in scheduling order;
- ``blocks_in_use``: blocks not free once the step was scheduled (its peak);
- ``end_seconds``: the model time at the end of the step (kvtune's step-time model);
- with a CPU tier (``--kv-offloading-size``): ``cpu_loads``, the loads from it that started
  (request id, chunks), ``cpu_stored`` and ``cpu_evicted``, the chunks it wrote and evicted,
  since the step before (a load may start in a schedule that runs no token: it is counted
  with the next step that does).

Pure: ``kvtune_steps`` drives kvtune's own simulator; ``kvtune.oracle.vllm_engine`` records
vLLM's scheduler into the same shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from kvtune.tuner.simulator.scheduler import EngineConfig, RequestState, Scheduler
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import SimRequest


@dataclass(frozen=True, slots=True)
class StepRecord:
    scheduled: tuple[tuple[int, int], ...]
    admitted: tuple[tuple[int, int], ...]
    preempted: tuple[int, ...]
    finished: tuple[int, ...]
    blocks_in_use: int
    end_seconds: float
    cpu_loads: tuple[tuple[int, int], ...] = ()
    cpu_stored: int = 0
    cpu_evicted: int = 0


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A whole run: its steps, and per request the index of the step that finished it."""

    steps: tuple[StepRecord, ...]
    finish_step: dict[int, int]  # request id -> step index (0-based)
    rejected: tuple[int, ...]  # never admitted: larger than the cache or max-model-len

    @property
    def finish_order(self) -> list[int]:
        return [rid for s in self.steps for rid in s.finished]

    @property
    def prefix_hit_tokens(self) -> int:
        return sum(hit for s in self.steps for _, hit in s.admitted)

    @property
    def preemptions(self) -> int:
        return sum(len(s.preempted) for s in self.steps)

    @property
    def cpu_loads(self) -> list[tuple[int, int]]:
        return [load for s in self.steps for load in s.cpu_loads]

    @property
    def cpu_stored(self) -> int:
        return sum(s.cpu_stored for s in self.steps)

    @property
    def cpu_evicted(self) -> int:
        return sum(s.cpu_evicted for s in self.steps)


class OffloadEvents(NamedTuple):
    """What the CPU tier did since the last record (``StepRecord``'s ``cpu_`` fields)."""

    cpu_loads: tuple[tuple[int, int], ...] = ()
    cpu_stored: int = 0
    cpu_evicted: int = 0


def attach_offload(step: StepRecord, events: OffloadEvents) -> StepRecord:
    """``step`` with more CPU-tier events counted in it."""
    return replace(step, cpu_loads=step.cpu_loads + events.cpu_loads,
                   cpu_stored=step.cpu_stored + events.cpu_stored,
                   cpu_evicted=step.cpu_evicted + events.cpu_evicted)


def step_cost(
    cost: StepCostModel, config: EngineConfig,
    scheduled: Sequence[tuple[int, int]], computed_before: Sequence[int],
) -> float:
    """Seconds of one step, as kvtune's scheduler charges it: ``scheduled`` (id, tokens)
    with the tokens each request had computed before the step."""
    num_tokens = 0
    kv_read = 0
    pairs = 0.0
    for (_, num_new), computed in zip(scheduled, computed_before, strict=True):
        num_tokens += num_new
        kv_read += computed + num_new
        pairs += num_new * computed + num_new * (num_new + 1) / 2.0
    return cost.step_seconds(num_tokens, kv_read, pairs, config.async_scheduling,
                             len(scheduled))


class _Recording:
    """kvtune's scheduler, stepped exactly (no decode runs), recording every step. It holds
    the scheduler rather than subclassing it: the scheduler may be compiled by mypyc
    (``scripts/compile_simulator.py``), and an interpreted class cannot subclass a compiled one."""

    def __init__(self, requests: Sequence[SimRequest], config: EngineConfig,
                 cost: StepCostModel) -> None:
        self.sim = Scheduler(requests, config, cost, name="kvtune", decode_runs=False,
                             on_step=lambda _scheduler: self._record())
        self.records: list[StepRecord] = []
        self.finish_step: dict[int, int] = {}
        self._before: set[int] = set()
        self._cpu_seen = (0, 0, 0)  # loads, stored, evicted counted so far

    def offload_events(self) -> OffloadEvents:
        sim = self.sim
        tier = sim.offload
        if tier is None:
            return OffloadEvents()
        loads, stored, evicted = self._cpu_seen
        self._cpu_seen = (len(sim.cpu_loads), tier.stored_blocks, tier.evicted_blocks)
        return OffloadEvents(tuple(sim.cpu_loads[loads:]), tier.stored_blocks - stored,
                             tier.evicted_blocks - evicted)

    def _record(self) -> None:
        sim = self.sim
        scheduled = sim.last_scheduled
        steps_before = len(self.records)
        if scheduled and sim.steps > steps_before:
            finished: list[int] = []
            admitted: list[tuple[int, int]] = []
            for st, num_new in scheduled:
                rid = st.req.request_id
                if rid not in self._before:
                    admitted.append((rid, st.num_computed - num_new))
                if st.generated >= st.output_tokens:
                    finished.append(rid)
                    self.finish_step[rid] = steps_before
            self.records.append(attach_offload(StepRecord(
                scheduled=tuple((st.req.request_id, n) for st, n in scheduled),
                admitted=tuple(admitted),
                preempted=tuple(st.req.request_id for st in sim.last_preempted),
                finished=tuple(finished), blocks_in_use=sim.last_blocks_in_use,
                end_seconds=sim.now,
            ), self.offload_events()))
        self._before = {st.req.request_id for st in sim.running}
        sim.last_scheduled = []


def kvtune_steps(
    requests: Sequence[SimRequest], config: EngineConfig, cost: StepCostModel,
) -> RunRecord:
    """kvtune's simulator over ``requests``, one record per engine step."""
    rec = _Recording(requests, config, cost)
    rec.sim.run()
    if rec.records:
        # Offload events after the last step (none expected) go with it.
        rec.records[-1] = attach_offload(rec.records[-1], rec.offload_events())
    rejected = tuple(st.req.request_id for st in rec.sim.states if st.output_tokens == 0)
    return RunRecord(steps=tuple(rec.records), finish_step=rec.finish_step, rejected=rejected)


def computed_before(states: Sequence[RequestState], scheduled: Sequence[int]) -> list[int]:
    return [st.num_computed - n for st, n in zip(states, scheduled, strict=True)]
