"""The parallel layout as a planned decision: for a replica of N GPUs, which TP x DP (+EP)
(``tuner/layout.py``) to serve with, by the same objective as the rest of the plan.

Every layout whose TP vLLM accepts for the model (``validation.tensor_parallel_ok``) and that
the pins allow is planned in full (one engine's plan, ``plan_fn``: the rules, or the capacity
search on each DP rank's share of the traffic); the replica's figure is the engine's times
its DP ranks:

- with a capacity search: capacity at SLO of the replica (the highest arrival rate at which
  95 % of requests meet the SLO);
- by the rules: sequences the replica runs at once within the TPOT target, at the p95 session
  (per engine the smaller of max-num-seqs and what the KV cache holds, times DP).

Ties go to more KV tokens per replica, then fewer KV copies. MoE models are offered expert
parallel whenever DP > 1 (memory is the same either way: experts are split over all ranks;
EP trades the all-reduce of TP-flattened experts for all-to-alls, ``decode.py``); TP alone is
offered without EP, as vLLM serves it by default. A layout that does not fit says why; when
none fits, ``NoFeasiblePlan`` names the layouts, and the smallest GPU count where the weights
leave room for KV.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtune.tuner.errors import InvalidInput, NoFeasiblePlan
from kvtune.tuner.facts.layouts import kv_copies, pipeline_stages
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.facts.weights import weights_bytes_per_gpu
from kvtune.tuner.layout import ParallelLayout
from kvtune.tuner.plan import LayoutOption, PoolPlan, Reason
from kvtune.tuner.planner.checks import CHOSEN, PINNED
from kvtune.tuner.planner.layout_replica import per_replica
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.validation import tensor_parallel_ok
from kvtune.tuner.units import GiB

PlanFn = Callable[[PlanRequest], PoolPlan]
# The largest replica kvtune lays out (two nodes of 8 fit; vLLM's own limits are wider).
MAX_GPUS_PER_REPLICA = 64
LAYOUT = "layout"


def candidate_layouts(
    model: ModelArchitecture, gpus: int, *, tp: int | None = None, dp: int | None = None,
    ep: bool | None = None, dcp: int = 1, nodes: int = 1, pp: int = 1,
) -> list[ParallelLayout]:
    """The layouts of ``gpus`` GPUs the pins allow, TP largest first. Decode context parallel
    and pipeline parallel are never chosen, only pinned (``dcp``, ``pp``): each layout whose
    TP DCP divides gets it; PP stages split the GPUs first (TP x DP = GPUs / PP). A replica
    over ``nodes`` nodes spans them by its data-parallel engines (vLLM's multi-node data
    parallel, the same number on each node), so its DP must be a multiple of ``nodes``; under
    PP it spans them by whole stages (vLLM's rank order puts TP fastest, then PP), so ``pp``
    must be a multiple of ``nodes``. Each layout carries ``nodes``: the link between stages."""
    if not 1 <= gpus <= MAX_GPUS_PER_REPLICA:
        raise InvalidInput("gpus_per_replica", gpus, f"must be 1 to {MAX_GPUS_PER_REPLICA}")
    if gpus % pp:
        raise InvalidInput("pipeline_parallel", pp, f"must divide the {gpus} GPUs per replica "
                           "(TP x DP x PP = GPUs per replica)")
    if pp > 1:
        if pp % nodes:
            raise InvalidInput("nodes_per_replica", nodes, f"must divide the {pp} pipeline "
                               "stages: each node holds whole stages (vLLM's rank order, TP "
                               "fastest, then PP)")
        # The stages take their share first (and the nodes, whole stages each); the rest is
        # laid out as without PP.
        try:
            layouts = candidate_layouts(model, gpus // pp, tp=tp, dp=dp, ep=ep, dcp=dcp)
        except InvalidInput as exc:
            why = str(exc).split(": ", 1)[-1]
            raise InvalidInput(exc.field, exc.value, f"{why} (under PP {pp} a stage has "
                               f"{gpus // pp} of the {gpus} GPUs)") from None
        return [x.model_copy(update={"pipeline_parallel": pp, "nodes_per_replica": nodes})
                for x in layouts]
    for name, value in (("tensor_parallel", tp), ("data_parallel", dp)):
        if value is not None and gpus % value:
            raise InvalidInput(name, value, f"must divide the {gpus} GPUs per replica "
                               "(TP x DP = GPUs per replica)")
    if tp is not None and dp is not None and tp * dp != gpus:
        raise InvalidInput("data_parallel", dp, f"TP {tp} x DP {dp} = {tp * dp} GPUs, not the "
                           f"{gpus} per replica; pin one of them, or --gpus-per-replica "
                           f"{tp * dp}")
    if ep and model.moe is None:
        raise InvalidInput("expert_parallel", True, f"{model.hf_id} is dense (no experts to "
                           "split); drop expert parallel (--ep)")
    out: list[ParallelLayout] = []
    for t in sorted((d for d in range(1, gpus + 1) if gpus % d == 0), reverse=True):
        d = gpus // t
        if (tp is not None and t != tp) or (dp is not None and d != dp) or d % nodes:
            continue
        if not tensor_parallel_ok(model, t) or t % dcp:
            continue
        use_ep = ep if ep is not None else (model.moe is not None and d > 1)
        out.append(ParallelLayout(tensor_parallel=t, data_parallel=d, expert_parallel=use_ep,
                                  decode_context_parallel=dcp, nodes_per_replica=nodes))
    if not out and dcp > 1 and candidate_layouts(model, gpus, tp=tp, dp=dp, ep=ep):
        raise InvalidInput(
            "decode_context_parallel", dcp,
            f"divides the TP of no layout of {gpus} GPUs"
            + (f" (TP {tp})" if tp is not None else "")
            + " (vLLM: tp % dcp == 0); pick a DCP that divides the TP")
    if not out:
        raise InvalidInput(
            "tensor_parallel", tp,
            f"no layout of {gpus} GPUs has a TP {model.hf_id} can be split by"
            + (f" with DP {dp}" if dp is not None else "")
            + (f" and DP a multiple of its {nodes} nodes" if nodes > 1 else "")
            + "; pin another --tp or change --gpus-per-replica")
    return out


def _option(request: PlanRequest, layout: ParallelLayout, pool: PoolPlan | None,
            refused: str | None, objective: float) -> LayoutOption:
    model = request.model
    # The heaviest pipeline stage's (the whole model's at PP 1).
    weights = max(s.weights_bytes for s in pipeline_stages(model, request.weights_dtype, layout))
    if pool is None:
        return LayoutOption(layout=layout, kv_copies=kv_copies(model, layout),
                            weights_bytes_per_gpu=weights, refused=refused)
    e = pool.expected
    return LayoutOption(
        layout=layout, kv_copies=kv_copies(model, layout), weights_bytes_per_gpu=weights,
        kv_cache_tokens_per_engine=e.kv_cache_tokens,
        # The engine's tokens as vLLM logs them (blocks x block size x DCP for one attention
        # kind; fewer for sliding-window groups), once per DP rank.
        kv_cache_tokens_per_replica=e.kv_cache_tokens * layout.data_parallel,
        concurrent_sequences_per_replica=e.concurrent_sequences * layout.data_parallel,
        decode_step_seconds=e.decode_step_seconds, score=round(objective, 4),
        vllm_args=tuple(pool.vllm_args()))


def objective(pool: PoolPlan, layout: ParallelLayout) -> float:
    """The replica's figure the choice ranks by (module docstring)."""
    if pool.search is not None:
        return pool.search.capacity_requests_per_second * layout.data_parallel
    e = pool.expected
    return float(min(pool.plan.max_num_seqs, e.concurrent_sequences) * layout.data_parallel)


def choose_layout(
    request: PlanRequest, gpus: int, plan_fn: PlanFn, *, tp: int | None = None,
    dp: int | None = None, ep: bool | None = None, dcp: int = 1, nodes: int = 1, pp: int = 1,
) -> PoolPlan:
    """Plan every candidate layout of ``gpus`` GPUs (over ``nodes`` nodes) and return the
    best one's plan, with the layout, a reason and every layout considered
    (``PoolPlan.layouts_considered``)."""
    layouts = candidate_layouts(request.model, gpus, tp=tp, dp=dp, ep=ep, dcp=dcp,
                                nodes=nodes, pp=pp)
    planned: list[tuple[ParallelLayout, PoolPlan | None, str | None, float]] = []
    for layout in layouts:
        try:
            pool = plan_fn(request.with_layout(layout))
        except NoFeasiblePlan as exc:
            why = (f"needs {exc.needed_bytes / GiB:.1f} GiB per GPU, "
                   f"{exc.available_bytes / GiB:.1f} GiB available")
            planned.append((layout, None, why, 0.0))
            continue
        planned.append((layout, pool, None, objective(pool, layout)))
    options = [_option(request, *row) for row in planned]
    fitting = [i for i, row in enumerate(planned) if row[1] is not None]
    if not fitting:
        raise _nothing_fits(request, gpus, options)
    best = max(fitting, key=lambda i: (options[i].score, options[i].kv_cache_tokens_per_replica,
                                       -options[i].kv_copies))
    layout, chosen, _, _ = planned[best]
    assert chosen is not None
    pool = chosen
    options[best] = options[best].model_copy(update={"chosen": True})
    # The search planned one engine; the pool scales by replicas of DP engines.
    return per_replica(pool.model_copy(update={
        "layout": layout, "layouts_considered": tuple(options),
        "reasons": (_reason(layout, options, best, gpus, pinned=len(layouts) == 1,
                            by_goodput=pool.search is not None),
                    *pool.reasons)}))


def _reason(layout: ParallelLayout, options: list[LayoutOption], best: int, gpus: int,
            *, pinned: bool, by_goodput: bool) -> Reason:
    o = options[best]
    what = "req/s capacity at SLO" if by_goodput else "sequences at once within the TPOT target"

    def figure(x: LayoutOption) -> str:
        return f"{x.score:.2f} {what}" if by_goodput else f"{x.score:g} {what}"

    others = "; ".join(
        f"{x.layout.label}: " + (x.refused[:80] if x.refused else
                                 f"{figure(x)}, {x.kv_cache_tokens_per_replica:,} KV tokens")
        for i, x in enumerate(options) if i != best)
    copies = f", each token's KV on {o.kv_copies} ranks" if o.kv_copies > 1 else ""
    return Reason(
        knob=LAYOUT, choice=layout.label, code=PINNED if pinned else CHOSEN,
        message=(f"{layout.label} of {gpus} GPUs: {figure(o)} per replica, "
                 f"{o.kv_cache_tokens_per_replica:,} KV tokens per replica "
                 f"({layout.data_parallel} engine(s) x {o.kv_cache_tokens_per_engine:,}{copies})"
                 + (f"; also weighed {others}" if others else "")))


def _nothing_fits(request: PlanRequest, gpus: int, options: list[LayoutOption]
                  ) -> NoFeasiblePlan:
    model, gpu = request.model, request.gpu
    least = min(options, key=lambda o: o.weights_bytes_per_gpu)
    suggestions = []
    for more in (gpus * 2, gpus * 4):
        if more > MAX_GPUS_PER_REPLICA:
            break
        # The weights of the lightest layout at that size leave room (a quarter of the GPU).
        light = min(weights_bytes_per_gpu(model, request.weights_dtype, t,
                                          data_parallel=more // t)
                    for t in range(1, more + 1) if more % t == 0 and tensor_parallel_ok(model, t))
        if light < 0.75 * gpu.cuda_total_bytes:
            nodes = f" (e.g. {more // 8} nodes of 8)" if more > 8 and more % 8 == 0 else ""
            suggestions.append(f"--gpus-per-replica {more}{nodes}")
            break
    refused = "; ".join(f"{o.layout.label}: {o.refused}" for o in options)
    return NoFeasiblePlan(
        f"{model.hf_id} fits no layout of {gpus} {gpu.name} GPUs "
        f"(lightest: {least.layout.label}, {least.weights_bytes_per_gpu / GiB:.1f} GiB of "
        f"weights per GPU). {refused}.",
        least.weights_bytes_per_gpu, gpu.cuda_total_bytes, suggestions)

