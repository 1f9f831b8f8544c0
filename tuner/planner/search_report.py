"""What the capacity search reports (``search.py``, step 4): its summary, the plan's reasons
and warnings written from the final plan, and the one-line messages the CLI and the operator
quote. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from kvtune.tuner import knobs, kv_quality
from kvtune.tuner.plan import (
    ExpectedFigures,
    PoolPlan,
    Reason,
    SearchAlternative,
    SearchSummary,
)
from kvtune.tuner.planner import decide_dtype, expected
from kvtune.tuner.planner.capacity import replicas_needed
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_front import pareto_front
from kvtune.tuner.planner.search_order import Scored, slack
from kvtune.tuner.planner.search_reasons import told_for_final
from kvtune.tuner.planner.search_settings import SLO_ATTAINMENT, SearchSettings
from kvtune.tuner.planner.search_space import changed_knobs, littles_law_sequences


def summary(request: PlanRequest, best: Scored, ranked: Sequence[Scored],
            settings: SearchSettings, rate: float, replicas: int, simulated_requests: int,
            final_n: int, considered: int, reference: str, stopped: str | None,
            capacity_measured_requests: int = 0) -> SearchSummary:
    """The search's summary: the chosen plan's figures (its capacity from ``best``'s
    standing), the alternatives and the Pareto front over ``ranked``.

    The simulator replays one engine: ``rate`` is one engine's share and ``replicas`` the
    engines sharing the traffic. Under data parallel a replica runs ``data_parallel``
    engines (TP x DP GPUs), so the summary's replica figures are ``data_parallel`` engines'
    (their rate, capacity and output) and its replicas count replicas, not engines (a pool
    of 1 replica of DP2 whose engine sustains 21 req/s has a capacity of 42 req/s and needs
    1 replica for 35 req/s, not 2)."""
    slo = request.policy.slo
    dp = request.data_parallel
    replica_rate = rate * dp
    replica_count = max(1, replicas // dp)
    return SearchSummary(
        observed_rate_per_second=rate * replicas,
        replicas=replica_count,
        rate_per_replica_per_second=replica_rate,
        littles_law_sequences=littles_law_sequences(request, rate),
        capacity_requests_per_second=replica_rate * best.standing.lower_scale,
        slo_attainment=best.score.slo_attainment,
        ttft_p95_seconds=best.score.ttft_p95_seconds,
        tpot_p95_seconds=best.score.tpot_p95_seconds,
        slo_met=best.standing.meets_observed(settings.slo_attainment),
        slo_set=slo.ttft_p95_seconds is not None or slo.tpot_p95_seconds is not None,
        replicas_needed=replicas_needed(replica_count, best.standing.lower_scale),
        candidates=considered,
        simulated_requests=simulated_requests,
        requests_per_candidate=final_n,
        capacity_measured_requests=capacity_measured_requests,
        changed_from=reference,
        changed_knobs=best.changed,
        alternatives=tuple(
            SearchAlternative(
                vllm_args=tuple(x.plan.vllm_args()),
                capacity_requests_per_second=replica_rate * x.standing.lower_scale,
                slo_attainment=x.score.slo_attainment,
                ttft_p95_seconds=x.score.ttft_p95_seconds,
                tpot_p95_seconds=x.score.tpot_p95_seconds,
                why_lost=x.lost,
            )
            for x in ranked[1:1 + settings.alternatives]
        ),
        output_tokens_per_second=best.score.output_tokens_per_second * dp,
        front=tuple(p.model_copy(update={
            "output_tokens_per_second": p.output_tokens_per_second * dp})
            for p in pareto_front([(x.plan, x.standing, x is best) for x in ranked],
                                  replica_rate, lambda score: -slack(score, request))),
        stopped_by=stopped,
    )


def pool_plan(run: PlanRun, base_pool: PoolPlan, best: Scored, summary: SearchSummary,
              offload_reason: Reason | None = None) -> PoolPlan:
    """The rules' pool plan with the search's choice, figures, reasons and warnings."""
    plan = best.plan
    base = base_pool.plan
    changed = set(changed_knobs(plan, base))
    if offload_reason is not None:
        # Its reason comes from the search (below), whether or not the rules chose alike.
        changed.add("kv-offloading-size")
    s = best.score
    figures = (f"capacity at SLO {summary.capacity_requests_per_second:.2f} req/s per "
               f"replica; at the observed {summary.rate_per_replica_per_second:.2f} req/s "
               f"{s.slo_attainment:.1%} of requests meet the SLO, TTFT p95 "
               f"{s.ttft_p95_seconds:.3f} s, TPOT p95 {s.tpot_p95_seconds * 1000:.1f} ms "
               f"(over {s.requests} requests)")
    reasons = told_for_final(run.req, plan, base_pool.reasons, changed, summary.candidates)
    for knob in sorted(changed):
        if offload_reason is not None and knob == "kv-offloading-size":
            reasons.append(offload_reason)
            continue
        value = getattr(plan, knobs.FLAG_TO_NAME[knob])
        was = getattr(base, knobs.FLAG_TO_NAME[knob])
        reasons.append(Reason(
            knob=knob, choice=knobs.choice_text(value),
            code="BestCapacity",
            message=(f"the capacity search chose {value} over the rules' {was} among "
                     f"{summary.candidates} candidates: {figures}"
                     + (_quality_quote(run, str(value)) if knob == "kv-cache-dtype" else "")),
        ))
    exp = expected.figures(run, plan, None)
    exp = ExpectedFigures.model_validate({
        **exp.model_dump(),
        "prefix_hit_rate": s.prefix_hit_rate,
        "cpu_prefix_hit_rate": s.cpu_hit_rate,
        "capacity_requests_per_second": summary.capacity_requests_per_second,
        "replicas_needed": summary.replicas_needed,
        "slo_attainment": s.slo_attainment,
        "ttft_p95_seconds": s.ttft_p95_seconds,
        "tpot_p95_seconds": s.tpot_p95_seconds,
    })
    return base_pool.model_copy(update={
        "plan": plan, "expected": exp, "reasons": tuple(reasons),
        "warnings": _warnings(base_pool, plan.kv_cache_dtype, summary), "search": summary,
    })


def _warnings(base_pool: PoolPlan, dtype: str, summary: SearchSummary) -> tuple[str, ...]:
    """The rules' warnings that still describe the plan, then the search's own."""
    base = base_pool.plan
    # The rules' warnings about their own concurrency target or about a dtype the search
    # replaced no longer describe the plan.
    gone = f"kv-cache-dtype {base.kv_cache_dtype} " if dtype != base.kv_cache_dtype else None
    warnings = [w for w in base_pool.warnings
                if not w.startswith("KV capacity limits concurrency")
                and (gone is None or gone not in w)]
    if not summary.slo_met and summary.slo_set:
        warnings.append(slo_at_risk_message(summary))
    if summary.stopped_by is not None:
        warnings.append(budget_stop_message(summary))
    return tuple(warnings)


def _quality_quote(run: PlanRun, dtype: str) -> str:
    """The KV-quality evidence on a dtype the search chose (its candidates came through the
    same gate, ``kv_dtype_options.allowed``)."""
    verdict = decide_dtype.quality_gate(run, dtype)
    return "" if verdict.code == kv_quality.REFERENCE else f"; quality: {verdict.detail}"


def slo_at_risk_message(summary: SearchSummary) -> str:
    """One line with the numbers: the SLO cannot be met at the observed rate."""
    over = (f" over {summary.replicas} replicas ({summary.rate_per_replica_per_second:.2f} "
            f"req/s each)" if summary.replicas > 1 else "")
    msg = (f"SLO at risk: the best configuration meets the SLO for "
           f"{summary.slo_attainment:.1%} of requests at the observed "
           f"{summary.observed_rate_per_second:.2f} req/s{over} (needs "
           f"{SLO_ATTAINMENT:.0%})")
    rate = summary.capacity_requests_per_second
    if rate > 0:
        msg += f"; one replica's capacity at SLO is {rate:.2f} req/s"
        if summary.replicas_needed is not None:
            msg += f", so the traffic needs {summary.replicas_needed} replicas"
    else:
        msg += ("; no request rate meets the SLO on this GPU class: the requests' own service "
                "time (prefill, then decode at the batch size) exceeds the targets; loosen "
                "them or plan a faster GPU class or more tensor parallelism")
    return msg


def budget_stop_message(summary: SearchSummary) -> str:
    """One line: the search's budget ended it early, and what the plan is then: its
    capacity measured on the full stream, or (no time left even for that) on a short one."""
    measured = summary.capacity_measured_requests or summary.requests_per_candidate
    if measured > summary.requests_per_candidate:
        on = (f"the candidates compared on the first {summary.requests_per_candidate:,} "
              f"requests of the stream; its capacity ({summary.capacity_requests_per_second:.3g}"
              f" req/s) measured on the full stream of {measured:,}")
    else:
        on = (f"its capacity ({summary.capacity_requests_per_second:.3g} req/s) measured on "
              f"the first {measured:,} requests of the stream (a short stream can overstate "
              "it)")
    return (f"search stopped by its budget: {summary.stopped_by}; the plan is the best of "
            f"{summary.candidates} candidates as far as they were scored, {on}; "
            f"{summary.simulated_requests:,} requests simulated; raise the search budget "
            "for a full search: kvtune plan --search-cpu-seconds/--search-memory-mib, the "
            "chart's search.cpuSeconds/search.memoryMiB")


__all__ = ["budget_stop_message", "pool_plan", "slo_at_risk_message", "summary"]
