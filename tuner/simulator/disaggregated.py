"""Disaggregated serving replayed: a prefill pool, the KV transfer, a decode pool.

vLLM 0.33 with NixlConnector (``kv_transfer.py``) runs a request twice: the prefill engine
computes its prompt with ``max_tokens=1`` (the proxy or router sends it with
``do_remote_decode``), keeps the blocks, and the decode engine pulls them
(``do_remote_prefill``: the request waits in ``WAITING_FOR_REMOTE_KVS`` holding its blocks,
taking no token budget) and then decodes. This module replays that on the simulator's own
engine (``scheduler.simulate``, used as is, once per engine):

1. prefill: each prefill engine replays its round-robin share of the requests with one output
   token; the request's KV is ready when that token is (its first-token time);
2. transfer: the request's KV crosses the link (``facts/kv_links.py``) to its decode engine
   (round robin): each decode TP rank pulls its own share at once over its own link, so the
   transfer takes ``prompt tokens x KV bytes per token per decode rank / link rate``; one
   engine's transfers queue one after another (FIFO) on its links;
3. decode: each decode engine replays its share, each request arriving when its transfer is
   done, with the whole prompt as its prompt. Its KV arrived by transfer, so the engine
   computes one token for it, not the prompt: the decode engine's token budget is raised so a
   loaded prompt fits in one step (a load takes no budget in vLLM) and its step cost
   (``LoadedPromptCost``) charges one query token per sequence (the last prompt token vLLM
   recomputes after a full load, ``_update_waiting_for_remote_kv``) while still reading the
   whole context's KV. Its blocks are held from admission, as vLLM's full-sequence check does.

TTFT = the decode engine's first token - arrival: prefill queue + prefill compute + transfer
(+ its queue on the link) + the decode engine's admission wait and first step. TPOT is the
decode engine's. A request the prefill engine refuses never reaches decode (a miss).

Not modeled: the router's choice (round robin, not load- or cache-aware), the prefill's first
token streamed to the user before decode (llm-d and vLLM's proxy return decode's), transfer
overlap with the prefill's last chunks, and NIXL's per-transfer latency (line rate only).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtune.tuner.facts.kv_links import KVLink
from kvtune.tuner.facts.kvmemory import kv_bytes_per_token
from kvtune.tuner.facts.weights import weights_load
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.simulator.engine import SimulatedPlan
from kvtune.tuner.simulator.metrics import SimResult, SLOTargets, TimeSeries
from kvtune.tuner.simulator.scheduler import EngineConfig, simulate
from kvtune.tuner.simulator.timing import StepCostModel
from kvtune.tuner.simulator.workload import SimRequest

# A decode engine's token budget in the replay: this many max-model-len prompts per step
# (loaded prompts take no budget in vLLM; the cap only keeps a step's work finite).
LOADED_PROMPTS_PER_STEP = 8


@dataclass(frozen=True, slots=True)
class LoadedPromptCost(StepCostModel):
    """A decode engine's step: every scheduled sequence computes one token (its KV arrived by
    transfer), attending to its whole context."""

    def step_seconds(
        self, num_tokens: int, kv_tokens_read: int, attention_token_pairs: float,
        overlapped: bool = False, num_seqs: int = 0,
    ) -> float:
        seqs = num_seqs or num_tokens
        # One query per sequence over its context: pairs = the context tokens read.
        return StepCostModel.step_seconds(self, min(num_tokens, seqs), kv_tokens_read,
                                          min(attention_token_pairs, float(kv_tokens_read)),
                                          overlapped, seqs)


@dataclass(frozen=True, slots=True)
class RolePool:
    """One role's engines: the request at its TP (model, GPU, layout) and its replay numbers."""

    request: PlanRequest
    sim: SimulatedPlan
    engines: int

    @property
    def gpus(self) -> int:
        return self.engines * self.request.tensor_parallel


def transfer_bytes_per_token(decode: RolePool) -> int:
    """KV bytes one decode TP rank pulls per prompt token (its heads' share; MLA's whole
    latent on every rank), at the decode plan's KV dtype."""
    req = decode.request
    served = weights_load(req.model, req.weights_dtype).served_dtype
    return kv_bytes_per_token(req.model, decode.sim.plan.kv_cache_dtype, req.tensor_parallel,
                              model_dtype=served)


def _shares(requests: Sequence[SimRequest], engines: int) -> list[list[SimRequest]]:
    """Round robin by arrival order: request i goes to engine i mod ``engines``."""
    return [list(requests[e::engines]) for e in range(engines)]


def _prefill_done(requests: Sequence[SimRequest], prefill: RolePool) -> np.ndarray:
    """When each request's prompt KV is ready on its prefill engine (NaN: refused)."""
    done = np.full(len(requests), np.nan)
    for e, share in enumerate(_shares(requests, prefill.engines)):
        if not share:
            continue
        one_token = [dataclasses.replace(r, output_tokens=1) for r in share]
        res = simulate(one_token, prefill.sim.engine, prefill.sim.cost, name=f"prefill-{e}")
        done[e::prefill.engines] = res.first_token_seconds
    return done


def _transferred(requests: Sequence[SimRequest], ready: np.ndarray, decode: RolePool,
                 link: KVLink) -> np.ndarray:
    """When each request's KV has reached its decode engine: FIFO per engine's links."""
    per_token = transfer_bytes_per_token(decode)
    arrive = np.full(len(requests), np.nan)
    free_at = [0.0] * decode.engines
    order = sorted((i for i in range(len(requests)) if not math.isnan(ready[i])),
                   key=lambda i: (ready[i], i))
    for i in order:
        e = i % decode.engines
        start = max(float(ready[i]), free_at[e])
        free_at[e] = start + requests[i].prompt_tokens * per_token / link.bytes_per_second
        arrive[i] = free_at[e]
    return arrive


def _decode_engine(decode: RolePool) -> tuple[StepCostModel, EngineConfig]:
    """The decode engine as replayed: loaded prompts cost one token, fit one step."""
    sim = decode.sim
    cfg = sim.engine
    budget = max(cfg.max_num_batched_tokens,
                 LOADED_PROMPTS_PER_STEP * cfg.max_model_len + cfg.max_num_seqs)
    fields = {f.name: getattr(sim.cost, f.name) for f in dataclasses.fields(StepCostModel)
              if f.init}
    return LoadedPromptCost(**fields), dataclasses.replace(cfg, max_num_batched_tokens=budget)


def _decode(requests: Sequence[SimRequest], arrive: np.ndarray, decode: RolePool
            ) -> tuple[np.ndarray, np.ndarray]:
    """Each request's first-token and finish time on its decode engine (NaN: never ran)."""
    first = np.full(len(requests), np.nan)
    finish = np.full(len(requests), np.nan)
    cost, config = _decode_engine(decode)
    for e in range(decode.engines):
        idx = [i for i in range(e, len(requests), decode.engines) if not math.isnan(arrive[i])]
        if not idx:
            continue
        idx.sort(key=lambda i: (arrive[i], i))
        moved = [dataclasses.replace(requests[i], arrival_seconds=float(arrive[i]))
                 for i in idx]
        res = simulate(moved, config, cost, name=f"decode-{e}")
        first[idx] = res.first_token_seconds
        finish[idx] = res.finish_seconds
    return first, finish


def replay_disaggregated(requests: Sequence[SimRequest], prefill: RolePool, decode: RolePool,
                         link: KVLink, name: str = "disaggregated") -> SimResult:
    """The requests through both pools (module doc), as one ``SimResult`` whose times are the
    user's: arrival, the decode engine's first token and finish."""
    ready = _prefill_done(requests, prefill)
    arrive = _transferred(requests, ready, decode, link)
    first, finish = _decode(requests, arrive, decode)
    return _result(requests, first, finish, name)


def replay_colocated(requests: Sequence[SimRequest], pool: RolePool,
                     name: str = "co-located") -> SimResult:
    """The requests on ``pool.engines`` engines each serving both phases (round robin)."""
    first = np.full(len(requests), np.nan)
    finish = np.full(len(requests), np.nan)
    for e, share in enumerate(_shares(requests, pool.engines)):
        if share:
            res = simulate(share, pool.sim.engine, pool.sim.cost, name=f"{name}-{e}")
            first[e::pool.engines] = res.first_token_seconds
            finish[e::pool.engines] = res.finish_seconds
    return _result(requests, first, finish, name)


def _result(requests: Sequence[SimRequest], first: np.ndarray, finish: np.ndarray,
            name: str) -> SimResult:
    """The user's view of every request; the engine-level figures are not summed here."""
    return SimResult(
        name=name, num_requests=len(requests),
        arrival_seconds=[r.arrival_seconds for r in requests],
        first_token_seconds=[float(x) for x in first],
        finish_seconds=[float(x) for x in finish],
        prompt_tokens=[r.prompt_tokens for r in requests],
        output_tokens=[r.output_tokens for r in requests],
        rejected=int(np.isnan(first).sum()), preemptions=0, resume_hit_tokens=0,
        prefix_query_tokens=0, prefix_hit_tokens=0, peak_running=0, mean_running=0.0,
        mean_kv_usage=0.0, mean_fragmented_tokens=0.0, fragmentation_fraction=0.0,
        kv_cache_tokens=0, series=TimeSeries())


def meets_slo(result: SimResult, slo: SLOTargets, target: float) -> bool:
    """The capacity search's test (``planner/capacity.py``'s): ``target`` of the steady-state
    requests meet both targets, and the pools keep up with the arrivals."""
    return result.attainment(slo) >= target and result.keeps_up()
