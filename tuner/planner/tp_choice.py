"""``tensorParallel: auto``: the tensor-parallel degree (GPUs per replica) and the replicas of a
pool, chosen for the lowest cost per good request (docs/planner.md, "Tensor parallel: auto").

Each degree of ``TP_DEGREES`` that vLLM 0.33 accepts for the model (``tensor_parallel_ok``:
attention heads divisible by TP, KV heads divisible or a whole number of copies) is planned in
full (``plan_fn``: the capacity search at the pool's whole rate on one replica, or the rules);
a degree whose weights leave no room for KV says so (``NoFeasiblePlan``'s figures).

- **With a rate** (the search ran): one replica of TP ``t`` serves ``c_t`` requests/s within
  the SLO (``capacity_per_replica``); the rate ``R`` needs ``n_t = ceil(R / c_t)`` replicas,
  ``n_t x t`` GPUs. The choice is the fewest GPUs that serve ``R`` (on one GPU class the price
  is a constant, so that is the lowest hourly bill and the lowest cost per request as served),
  then the lowest cost per million good requests at capacity, ``t x price / (c_t x 3600) x
  10^6`` (the cheaper degree as traffic grows), then the smaller TP. With a bound on the
  replicas (the spec's ``replicas``), degrees that serve ``R`` within it come first. The
  chosen degree is planned again on its share (``R / n``), as each replica will serve it.
- **Without a rate** (the rules): nothing says how many replicas; the choice is the fewest
  GPUs per sequence run at once within the TPOT target, then the smaller TP; the replicas
  stay as given.

The choice's reason names every degree with its capacity, replicas, GPUs and cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kvtune.tuner.errors import InvalidInput, NoFeasiblePlan
from kvtune.tuner.facts.prices import GPUPrice
from kvtune.tuner.facts.weights import weights_bytes_per_gpu
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan import FrontPoint, PoolPlan, Reason, SearchSummary, TPChoice, TPOption
from kvtune.tuner.planner.checks import CHOSEN
from kvtune.tuner.planner.cost import per_million, priced
from kvtune.tuner.planner.layout_choice import objective
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.validation import tensor_parallel_ok
from kvtune.tuner.units import GiB

# The degrees a pool may run (the spec's tensorParallel values; one node of 8 at most).
TP_DEGREES = (1, 2, 4, 8)
TENSOR_PARALLEL = "tensor-parallel-size"
BY_CAPACITY, BY_SEQUENCES = "capacity", "sequences"
# Plans one replica of the request's TP, with the replicas sharing the pool's rate.
ReplicaPlanFn = Callable[[PlanRequest, int], PoolPlan]


def capacity_per_replica(summary: SearchSummary) -> float:
    """Requests/s one replica serves within the SLO: the search's capacity at SLO, the one
    figure the choice reads."""
    return summary.capacity_requests_per_second


def degrees(request: PlanRequest, allowed: Sequence[int] = TP_DEGREES) -> list[int]:
    """The degrees vLLM shards the model over (smallest first)."""
    return [t for t in allowed if tensor_parallel_ok(request.model, t)]


def _with_tp(request: PlanRequest, tp: int) -> PlanRequest:
    return request.model_copy(update={"tensor_parallel": tp})


def _refused(request: PlanRequest, tp: int, why: str) -> TPOption:
    weights = weights_bytes_per_gpu(request.model, request.weights_dtype, tp)
    return TPOption(tensor_parallel=tp, weights_bytes_per_gpu=weights, refused=why)



def _option(request: PlanRequest, tp: int, pool: PoolPlan, rate: float | None,
            price: GPUPrice | None) -> TPOption:
    """One planned degree's figures (by capacity when ``rate`` is given)."""
    e = pool.expected
    hourly = price.usd_per_gpu_hour * tp if price is not None else None
    base = TPOption(tensor_parallel=tp, weights_bytes_per_gpu=e.weights_bytes_per_gpu,
                    kv_cache_tokens_per_replica=e.kv_cache_tokens, usd_per_replica_hour=hourly,
                    vllm_args=tuple(pool.vllm_args()))
    if rate is None:
        return base.model_copy(update={
            "capacity_per_replica": objective(pool, ParallelLayout(tensor_parallel=tp))})
    s = pool.search
    if s is None:  # the SLO is out of reach at any rate on this degree (a closed-form bound)
        why = pool.slo_unreachable.message if pool.slo_unreachable is not None else "no search"
        return base.model_copy(update={"refused": why[:200]})
    capacity = capacity_per_replica(s)
    # The rate the search replayed (the stream's own: a generated stream's differs a little
    # from the profile's figure), so that a degree meeting the SLO needs exactly one replica.
    rate = s.observed_rate_per_second
    needed = math.ceil(rate / capacity - 1e-9) if capacity > 0 else None
    return base.model_copy(update={
        "capacity_per_replica": round(capacity, 4), "replicas_needed": needed,
        "gpus_needed": needed * tp if needed is not None else None,
        "cost_per_million_good_requests_usd": (per_million(hourly, capacity)
                                               if hourly is not None else None),
        "cost_per_million_requests_at_rate_usd": (per_million(hourly * needed, rate)
                                                  if hourly is not None and needed else None),
        "slo_met": s.slo_met, "ttft_p95_seconds": s.ttft_p95_seconds,
        "tpot_p95_seconds": s.tpot_p95_seconds})


def _rank_key(o: TPOption, by: str, max_replicas: int | None) -> tuple[float, ...]:
    """Smaller is better (module docstring); ruled-out degrees never reach here."""
    tp = o.tensor_parallel
    per_gpu = tp / o.capacity_per_replica if o.capacity_per_replica > 0 else math.inf
    if by == BY_SEQUENCES:
        return (per_gpu, tp)
    if o.replicas_needed is None:  # not even a trickle meets the SLO
        return (2.0, math.inf, per_gpu, tp)
    if max_replicas is not None and o.replicas_needed > max_replicas:
        # Short of the rate within the bound: the bound's replicas run, and the most
        # capacity per GPU serves the most of it.
        return (1.0, 0.0, per_gpu, tp)
    return (0.0, float(o.replicas_needed * tp), per_gpu, tp)


def _plan_degrees(request: PlanRequest, plan_fn: ReplicaPlanFn, allowed: Sequence[int]
                  ) -> list[tuple[int, PoolPlan | None, str | None]]:
    """Each degree's plan at the pool's whole rate on one replica, or why it has none."""
    out: list[tuple[int, PoolPlan | None, str | None]] = []
    m = request.model
    for tp in allowed:
        if not tensor_parallel_ok(m, tp):
            out.append((tp, None, f"vLLM refuses: {m.num_attention_heads} attention heads / "
                                  f"{m.num_kv_heads} KV heads do not split over {tp} GPUs"))
            continue
        try:
            out.append((tp, plan_fn(_with_tp(request, tp), 1), None))
        except NoFeasiblePlan as exc:
            out.append((tp, None, f"does not fit: needs {exc.needed_bytes / GiB:.1f} GiB per "
                                  f"GPU, {exc.available_bytes / GiB:.1f} GiB available"))
        except InvalidInput as exc:  # a pin this degree cannot honour
            out.append((tp, None, str(exc)[:200]))
    return out


def choose_tensor_parallel(
    request: PlanRequest, plan_fn: ReplicaPlanFn, *, price: GPUPrice | None = None,
    max_replicas: int | None = None, allowed: Sequence[int] = TP_DEGREES,
) -> PoolPlan:
    """Plan every degree and return the chosen one's plan (priced when ``price`` is given),
    planned on its share of the rate, with ``tp_choice`` and a reason naming the others.
    ``NoFeasiblePlan`` when no degree can serve, naming each."""
    if max_replicas is not None and max_replicas < 1:
        raise InvalidInput("max_replicas", max_replicas, "allow at least one replica")
    planned = _plan_degrees(request, plan_fn, allowed)
    searched = any(p is not None and (p.search is not None or p.slo_unreachable is not None)
                   for _, p, _ in planned)
    rate = request.profile.request_rate_per_second if searched else None
    by = BY_CAPACITY if rate else BY_SEQUENCES
    options = [_refused(request, tp, why or "") if pool is None else
               _option(request, tp, pool, rate or None, price) for tp, pool, why in planned]
    usable = [i for i, o in enumerate(options) if o.refused is None]
    if not usable:
        raise _nothing_serves(request, options)
    best = min(usable, key=lambda i: _rank_key(options[i], by, max_replicas))
    options[best] = options[best].model_copy(update={"chosen": True})
    chosen = options[best]
    replicas = _replicas(chosen, max_replicas) if by == BY_CAPACITY else None
    pool = planned[best][1]
    assert pool is not None
    if replicas is not None and replicas > 1:
        # Each replica serves R / n: the knobs are planned for that share, as it will run.
        pool = plan_fn(_with_tp(request, chosen.tensor_parallel), replicas)
    choice = TPChoice(by=by, rate_per_second=rate or None, replicas=replicas,
                      max_replicas=max_replicas,
                      usd_per_gpu_hour=price.usd_per_gpu_hour if price is not None else None,
                      options=tuple(options),
                      front=tp_front(planned, chosen.tensor_parallel,
                                     price.usd_per_gpu_hour if price is not None else None))
    pool = priced(pool, price)
    return pool.model_copy(update={
        "tp_choice": choice, "reasons": (_reason(choice, chosen), *pool.reasons)})


def _replicas(chosen: TPOption, max_replicas: int | None) -> int:
    """The replicas run: those the rate needs, within the bound (the bound when not even a
    trickle meets the SLO: serve what can be served)."""
    needed = chosen.replicas_needed
    if needed is None:
        return max_replicas or 1
    return min(needed, max_replicas) if max_replicas is not None else needed


def tp_front(planned: Sequence[tuple[int, PoolPlan | None, str | None]], chosen_tp: int,
             usd_per_gpu_hour: float | None = None) -> tuple[FrontPoint, ...]:
    """Every degree's search front (at one replica carrying the whole rate), with its TP,
    kept where no point of any degree has both fewer GPUs per good request/s and less latency
    against the SLO (the price per GPU is one figure on a class: GPUs order cost)."""
    points: list[FrontPoint] = []
    for tp, pool, _ in planned:
        if pool is None or pool.search is None:
            continue
        hourly = usd_per_gpu_hour * tp if usd_per_gpu_hour is not None else None
        points += [p.model_copy(update={
            "tensor_parallel": tp, "chosen": p.chosen and tp == chosen_tp,
            "cost_per_million_output_tokens_usd": (per_million(hourly,
                                                               p.output_tokens_per_second)
                                                   if hourly is not None else None),
            "cost_per_million_good_requests_usd": (per_million(hourly,
                                                               p.capacity_requests_per_second)
                                                   if hourly is not None else None)})
            for p in pool.search.front]

    def gpus_per_capacity(p: FrontPoint) -> float:
        tp = p.tensor_parallel or 1
        return tp / p.capacity_requests_per_second if p.capacity_requests_per_second else math.inf

    def dominates(a: FrontPoint, b: FrontPoint) -> bool:
        ca, cb = gpus_per_capacity(a), gpus_per_capacity(b)
        return (ca <= cb and a.latency_vs_slo <= b.latency_vs_slo
                and (ca < cb or a.latency_vs_slo < b.latency_vs_slo))

    out = [p.model_copy(update={"on_front": not any(dominates(q, p) for q in points)})
           for p in points]
    out = [p for p in out if p.on_front or p.chosen]
    out.sort(key=lambda p: (gpus_per_capacity(p), p.latency_vs_slo))
    return tuple(out)


def _describe(o: TPOption, by: str) -> str:
    """One degree's figures as the reason quotes them."""
    if o.refused:
        return f"TP{o.tensor_parallel}: {o.refused[:90]}"
    if by == BY_SEQUENCES:
        return (f"TP{o.tensor_parallel}: {o.capacity_per_replica:g} sequences per replica, "
                f"{o.tensor_parallel / max(o.capacity_per_replica, 1e-9):.3f} GPUs per sequence")
    if o.replicas_needed is None:
        return f"TP{o.tensor_parallel}: no rate meets the SLO"
    cost = (f", ${o.cost_per_million_good_requests_usd:,.2f}/M good requests at capacity"
            if o.cost_per_million_good_requests_usd is not None else "")
    return (f"TP{o.tensor_parallel}: {o.capacity_per_replica:.2f} req/s per replica, "
            f"{o.replicas_needed} replica(s) = {o.gpus_needed} GPUs{cost}")


def _reason(choice: TPChoice, chosen: TPOption) -> Reason:
    others = "; ".join(_describe(o, choice.by) for o in choice.options if not o.chosen)
    if choice.by == BY_SEQUENCES:
        what = ("no arrival rate: the fewest GPUs per sequence run at once within the TPOT "
                "target decides; replicas stay as given")
    else:
        bound = (f" within {choice.max_replicas} replica(s)"
                 if choice.max_replicas is not None else "")
        short = (f"; {choice.replicas} replica(s) fall short of the rate (raise the replicas)"
                 if chosen.replicas_needed is not None and choice.replicas is not None
                 and chosen.replicas_needed > choice.replicas else "")
        what = (f"{choice.replicas} replica(s) for {choice.rate_per_second:.4g} req/s: the "
                f"fewest GPUs that serve the rate within the SLO{bound}, then the lowest cost "
                f"per good request at capacity{short}")
    return Reason(knob=TENSOR_PARALLEL, choice=str(chosen.tensor_parallel), code=CHOSEN,
                  message=f"{_describe(chosen, choice.by)}; {what}"
                  + (f"; also weighed {others}" if others else ""))


def _nothing_serves(request: PlanRequest, options: Sequence[TPOption]) -> NoFeasiblePlan:
    least = min(options, key=lambda o: o.weights_bytes_per_gpu)
    why = "; ".join(f"TP{o.tensor_parallel}: {o.refused}" for o in options)
    return NoFeasiblePlan(
        f"{request.model.hf_id} can be served by no tensor-parallel degree of "
        f"{', '.join(str(o.tensor_parallel) for o in options)} on {request.gpu.name} "
        f"({why}).", least.weights_bytes_per_gpu, request.gpu.cuda_total_bytes,
        ["--gpus-per-replica 16 (two nodes of 8)", "a GPU class with more memory",
         "narrower weights (--weights-dtype fp8)"])


__all__ = ["TP_DEGREES", "capacity_per_replica", "choose_tensor_parallel", "degrees",
           "tp_front"]
