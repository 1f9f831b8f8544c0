"""The prefill:decode split of a fixed number of GPUs, chosen by capacity at SLO, against
co-located serving on the same GPUs.

For ``gpus`` GPUs of one class, every split ``p`` prefill GPUs : ``gpus - p`` decode GPUs
(1:7 .. 7:1 for 8) is planned and replayed (``disaggregated.py``), and so is co-located
serving (every engine both phases) at each TP the model fits. Each role's engines run at the
role's TP (pinned, else the smallest TP that divides the role's GPUs and fits the model: more
engines, more KV in total); a split whose roles fit no TP, or whose TPs NixlConnector cannot
pair, is refused with why. The two roles' KV plans are made compatible before anything is
replayed (``planner/disagg_compat.py``): the rules plan the decode role (with both roles'
pins), the prefill role follows decode's KV dtype, block size and attention backend where it
pins none; a per-role pin the other role's plan cannot match is refused in one line.

Capacity at SLO, as the capacity search measures it (``planner/capacity.py``): the highest
arrival rate of the traffic (one stream, its gaps divided by a scale) at which 95 % of the
steady-state requests meet both the TTFT and the TPOT target and the pools keep up. Here it is
for the whole group of GPUs; it is found by doubling, then a geometric bisection to 2 %.
The best split is chosen when it beats the best co-located serving by more than that 2 %;
else co-located serving is (a tie goes to one pool with no transfer), and the verdict says
co-located wins at this GPU count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvtune.tuner.errors import InvalidInput, NoFeasiblePlan
from kvtune.tuner.facts.kv_links import KVLink
from kvtune.tuner.kv_transfer import Role, kv_transfer_args
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.disagg_compat import RoleKV, check_pair
from kvtune.tuner.planner.planning import plan_pool
from kvtune.tuner.planner.policy import Pins
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_settings import SLO_ATTAINMENT
from kvtune.tuner.planner.validation import tensor_parallel_ok
from kvtune.tuner.simulator.disaggregated import (
    RolePool,
    meets_slo,
    replay_colocated,
    replay_disaggregated,
)
from kvtune.tuner.simulator.engine import simulated_plan
from kvtune.tuner.simulator.goodput_search import slo_targets
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.profile_traffic import traffic_from_profile
from kvtune.tuner.simulator.workload import SimRequest

# Requests replayed per probe, over all engines of the group.
STREAM_REQUESTS = 480
_MIN_SCALE, _MAX_SCALE, _TOLERANCE = 1.0 / 1024, 4096.0, 1.02
# The KV fields the prefill role follows from the decode role when it pins none.
_SHARED = ("kv_cache_dtype", "block_size", "attention_backend")


@dataclass(frozen=True, slots=True)
class RolePlan:
    """One role's plan: the pool's KV plan at its TP, its engines, its serve flags."""

    role: Role
    pool: PoolPlan
    engines: int

    @property
    def tensor_parallel(self) -> int:
        return self.pool.tensor_parallel

    def vllm_args(self) -> list[str]:
        return [*self.pool.vllm_args(), *kv_transfer_args(self.role)]


@dataclass(frozen=True, slots=True)
class SplitOption:
    """One way to serve with the group's GPUs: a P:D split, or co-located (``prefill`` None)."""

    label: str
    prefill_gpus: int
    decode_gpus: int
    prefill: RolePlan | None = None
    decode: RolePlan | None = None
    colocated: RolePlan | None = None
    capacity_requests_per_second: float = 0.0
    ttft_p95_seconds: float = float("nan")  # at the capacity, after the warm-up
    tpot_p95_seconds: float = float("nan")
    refused: str | None = None
    chosen: bool = False

    @property
    def disaggregated(self) -> bool:
        return self.colocated is None


@dataclass(frozen=True, slots=True)
class DisaggChoice:
    """The split chosen for ``gpus`` GPUs, every option weighed, and the verdict."""

    gpus: int
    gpu_class: str
    link: KVLink
    options: tuple[SplitOption, ...]
    chosen: SplitOption
    best_colocated: SplitOption | None
    message: str

    @property
    def colocated_wins(self) -> bool:
        return not self.chosen.disaggregated


def role_request(request: PlanRequest, tp: int, pins: Pins) -> PlanRequest:
    """The request at one role's TP (one engine: no DP) with the role's pins."""
    return request.model_copy(update={
        "tensor_parallel": tp, "data_parallel": 1, "expert_parallel": False,
        "policy": request.policy.model_copy(update={"pins": pins})})


def _merged(base: Pins, role: Pins | None) -> Pins:
    """``base`` (both roles' pins) with ``role``'s set fields on top."""
    if role is None:
        return base
    return base.model_copy(update=role.model_dump(exclude_none=True))


def plan_roles(request: PlanRequest, prefill_tp: int, decode_tp: int,
               prefill_pins: Pins | None = None, decode_pins: Pins | None = None,
               prefill_request: PlanRequest | None = None) -> tuple[PoolPlan, PoolPlan]:
    """Both roles' KV plans, compatible (module doc), or ``InvalidInput`` naming the field.
    ``prefill_request``: the prefill role's own request when it runs on another GPU class
    (the operator's pools); else ``request`` serves both."""
    base = request.policy.pins
    p_pins, d_pins = _merged(base, prefill_pins), _merged(base, decode_pins)
    # Decode takes the prefill role's pins on the shared fields it leaves open, so a pin on
    # one role holds on both where vLLM needs them equal.
    d_pins = d_pins.model_copy(update={f: getattr(p_pins, f) for f in _SHARED
                                       if getattr(d_pins, f) is None
                                       and getattr(p_pins, f) is not None})
    decode = plan_pool(role_request(request, decode_tp, d_pins))
    p_pins = p_pins.model_copy(update={f: getattr(decode.plan, f) for f in _SHARED
                                       if getattr(p_pins, f) is None})
    prefill = plan_pool(role_request(prefill_request or request, prefill_tp, p_pins))
    check_pair(request.model, role_kv("prefill", prefill), role_kv("decode", decode))
    return prefill, decode


def role_kv(role: Role, pool: PoolPlan) -> RoleKV:
    return RoleKV(role=role, plan=pool.plan, tensor_parallel=pool.tensor_parallel,
                  vllm_version=pool.vllm_version)


def fitting_tps(request: PlanRequest, gpus: int) -> list[int]:
    """TPs that divide ``gpus``, that vLLM splits the model by, and where it fits."""
    out = []
    for tp in range(1, gpus + 1):
        if gpus % tp or not tensor_parallel_ok(request.model, tp):
            continue
        try:
            plan_pool(role_request(request, tp, request.policy.pins))
        except NoFeasiblePlan:
            continue
        out.append(tp)
    return out


Probe = Callable[[float], SimResult]


def capacity(probe: Probe, base_rate: float, request: PlanRequest
             ) -> tuple[float, SimResult | None]:
    """The highest rate (``base_rate`` x scale) ``probe`` meets the SLO at (module doc), and
    the replay there; (0, None) when not even a trickle meets it."""
    slo = slo_targets(request)

    def ok(scale: float) -> SimResult | None:
        res = probe(scale)
        return res if meets_slo(res, slo, SLO_ATTAINMENT) else None

    lo, hi = 1.0, 1.0
    best = ok(1.0)
    if best is not None:
        while hi < _MAX_SCALE and (res := ok(hi * 2)) is not None:
            hi, best = hi * 2, res
        lo, hi = hi, hi * 2
    else:
        while lo > _MIN_SCALE and best is None:
            lo /= 2
            best = ok(lo)
        if best is None:
            return 0.0, None
        hi = lo * 2
    while hi / lo > _TOLERANCE:
        mid = (lo * hi) ** 0.5
        res = ok(mid)
        if res is not None:
            lo, best = mid, res
        else:
            hi = mid
    return base_rate * lo, best


def _scaled(requests: Sequence[SimRequest], scale: float) -> list[SimRequest]:
    return [dataclasses.replace(r, arrival_seconds=r.arrival_seconds / scale) for r in requests]


def _measured(option: SplitOption, found: tuple[float, SimResult | None], request: PlanRequest
              ) -> SplitOption:
    rate, res = found
    if res is None:
        return dataclasses.replace(option, refused="no rate meets the SLO")
    ttft, tpot = steady_p95(res)
    return dataclasses.replace(option, capacity_requests_per_second=round(rate, 3),
                               ttft_p95_seconds=ttft, tpot_p95_seconds=tpot)


def steady_p95(res: SimResult) -> tuple[float, float]:
    """TTFT and TPOT p95 over the requests the attainment judges (after the warm-up), so the
    figures beside a capacity are those of the requests that set it."""
    per, judged = res.per_request(), res.judged()

    def p95(x: np.ndarray) -> float:
        kept = x[judged & ~np.isnan(x)]
        return float(np.percentile(kept, 95)) if kept.size else float("nan")

    return p95(per.ttft_seconds), p95(per.tpot_seconds)


@dataclass(frozen=True, slots=True)
class SplitPins:
    """What the user fixed: each role's TP and KV pins (None: kvtune chooses)."""

    prefill_tp: int | None = None
    decode_tp: int | None = None
    prefill: Pins | None = None
    decode: Pins | None = None


def _role_tp(request: PlanRequest, gpus: int, pinned: int | None, role: Role,
             fits: Callable[[int], list[int]]) -> int | str:
    """The role's TP on ``gpus`` GPUs, or why there is none."""
    if pinned is not None:
        return pinned if gpus % pinned == 0 else f"{role} TP {pinned} does not divide {gpus} GPUs"
    tps = fits(gpus)
    return tps[0] if tps else f"{request.model.hf_id} fits no TP of {gpus} {role} GPUs"


def _split(request: PlanRequest, stream: Sequence[SimRequest], base_rate: float,
           link: KVLink, p_gpus: int, d_gpus: int, pins: SplitPins,
           fits: Callable[[int], list[int]]) -> SplitOption:
    """One P:D split planned and measured; refused when its roles cannot be laid out."""
    option = SplitOption(label=f"{p_gpus}P:{d_gpus}D", prefill_gpus=p_gpus, decode_gpus=d_gpus)
    ptp = _role_tp(request, p_gpus, pins.prefill_tp, "prefill", fits)
    dtp = _role_tp(request, d_gpus, pins.decode_tp, "decode", fits)
    if isinstance(ptp, str) or isinstance(dtp, str):
        return dataclasses.replace(option, refused=ptp if isinstance(ptp, str) else str(dtp))
    try:
        prefill, decode = plan_roles(request, ptp, dtp, pins.prefill, pins.decode)
    except InvalidInput as exc:
        if exc.field != "tensor_parallel":
            raise  # a pin neither split can honour: refused once, by the caller
        return dataclasses.replace(option, refused=str(exc))
    except NoFeasiblePlan as exc:
        return dataclasses.replace(option, refused=str(exc).split(". ")[0])
    roles = (RolePlan("prefill", prefill, p_gpus // ptp), RolePlan("decode", decode, d_gpus // dtp))
    pp, dp = (RolePool(role_request(request, r.tensor_parallel, request.policy.pins),
                       simulated_plan(role_request(request, r.tensor_parallel,
                                                   request.policy.pins), r.pool.plan, r.role),
                       r.engines) for r in roles)
    option = dataclasses.replace(option, label=f"{option.label} (TP{ptp} x{pp.engines} : "
                                 f"TP{dtp} x{dp.engines})", prefill=roles[0], decode=roles[1])
    found = capacity(lambda s: replay_disaggregated(_scaled(stream, s), pp, dp, link),
                     base_rate, request)
    return _measured(option, found, request)


def _colocated(request: PlanRequest, stream: Sequence[SimRequest], base_rate: float,
               gpus: int, tp: int) -> SplitOption:
    req = role_request(request, tp, request.policy.pins)
    pool = plan_pool(req)
    role = RolePlan("decode", pool, gpus // tp)
    option = SplitOption(label=f"co-located TP{tp} x{gpus // tp}", prefill_gpus=0,
                         decode_gpus=gpus, colocated=role)
    engines = RolePool(req, simulated_plan(req, pool.plan, "co-located"), gpus // tp)
    found = capacity(lambda s: replay_colocated(_scaled(stream, s), engines), base_rate,
                     request)
    return _measured(option, found, request)


def choose_split(request: PlanRequest, gpus: int, link: KVLink, pins: SplitPins = SplitPins(),
                 num_requests: int = STREAM_REQUESTS, seed: int = 0) -> DisaggChoice:
    """Every P:D split of ``gpus`` and co-located serving, measured; the best chosen."""
    if gpus < 2:
        raise InvalidInput("gpus", gpus, "disaggregation needs at least 2 GPUs (one per role)")
    base_rate = request.profile.request_rate_per_second or 1.0
    stream = traffic_from_profile(request.profile, num_requests, seed,
                                  rate_per_second=base_rate)
    cache: dict[int, list[int]] = {}

    def fits(n: int) -> list[int]:
        if n not in cache:
            cache[n] = fitting_tps(request, n)
        return cache[n]

    options = [_split(request, stream, base_rate, link, p, gpus - p, pins, fits)
               for p in range(1, gpus)]
    options += [_colocated(request, stream, base_rate, gpus, tp) for tp in fits(gpus)]
    return _choice(request, gpus, link, options)


def _choice(request: PlanRequest, gpus: int, link: KVLink, options: list[SplitOption]
            ) -> DisaggChoice:
    served = [i for i, o in enumerate(options) if o.refused is None]
    if not served:
        why = "; ".join(f"{o.label}: {o.refused}" for o in options)
        raise InvalidInput("gpus", gpus, f"no split of {gpus} {request.gpu.name} GPUs nor "
                           f"co-located serving meets the SLO at any rate ({why[:400]}); "
                           "loosen --ttft-p95/--tpot-p95 or add GPUs")
    def best_of(disaggregated: bool) -> int | None:
        kept = [i for i in served if options[i].disaggregated == disaggregated]
        return max(kept, key=lambda i: options[i].capacity_requests_per_second, default=None)

    d, c = best_of(True), best_of(False)
    # A split must beat co-located by more than the bisection's resolution: within it, the two
    # are a tie and co-located wins (one pool, no transfer).
    best = d if c is None or (d is not None and options[d].capacity_requests_per_second
                              > options[c].capacity_requests_per_second * _TOLERANCE) else c
    assert best is not None
    options[best] = dataclasses.replace(options[best], chosen=True)
    chosen = options[best]
    best_coloc = None if c is None else options[c]
    best_disagg = None if d is None else options[d]
    return DisaggChoice(gpus=gpus, gpu_class=request.gpu.name, link=link,
                        options=tuple(options), chosen=chosen, best_colocated=best_coloc,
                        message=_verdict(gpus, request.gpu.name, best_disagg, best_coloc))


def _verdict(gpus: int, gpu: str, disagg: SplitOption | None, coloc: SplitOption | None
             ) -> str:
    def cap(o: SplitOption) -> str:
        return f"{o.label} {o.capacity_requests_per_second:.2f} req/s"

    if disagg is None:
        return f"co-located wins on {gpus} {gpu}: no P:D split meets the SLO"
    if coloc is None:
        return f"{cap(disagg)}: co-located serving meets the SLO at no rate on {gpus} {gpu}"
    d, c = disagg.capacity_requests_per_second, coloc.capacity_requests_per_second
    if c * _TOLERANCE >= d:
        # Within the bisection's 2 % the two tie, and co-located wins (``_choice``).
        how = "beats" if c > d * _TOLERANCE else "ties (within 2 %) with"
        return (f"co-located wins on {gpus} {gpu}: {cap(coloc)} at SLO {how} the best split "
                f"{cap(disagg)}")
    return (f"disaggregated {cap(disagg)} at SLO on {gpus} {gpu}, {d / c - 1:.1%} over the "
            f"best co-located option, {cap(coloc)}")
