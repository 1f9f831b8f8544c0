"""Named configurations to compare on one workload: vLLM's defaults, kvtune's plan, and the
two baselines the issue asks for (contiguous allocation at equal memory, paging without
prefix caching), plus a custom one from ``K=V`` overrides. Pure: plans in, results out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from kvtune.tuner import knobs
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.plan import KVPlan, offload_backend
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.planrun import PlanRun
from kvtune.tuner.planner.policy import Pins
from kvtune.tuner.simulator.engine import SimulatedPlan, simulated_plan, vllm_default_plan
from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.scheduler import simulate
from kvtune.tuner.simulator.scoring import SimulatorScorer
from kvtune.tuner.simulator.workload import SimRequest

CONFIGURATION_NAMES = ("defaults", "planned", "contiguous", "no-prefix-cache", "custom")

# The knobs the simulator models, typed from the knob table (kvtune.tuner.knobs).
SIMULATED_KNOBS = ("block_size", "kv_cache_dtype", "gpu_memory_utilization",
                   "kv_cache_memory_bytes", "max_model_len", "max_num_seqs",
                   "max_num_batched_tokens", "enable_prefix_caching", "kv_offloading_size_gib")
_SCHEDULER_PAIR = frozenset({"max_num_seqs", "max_num_batched_tokens"})
_KNOB_TYPES: dict[str, type] = {name: knobs.BY_NAME[name].type for name in SIMULATED_KNOBS}


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``["block-size=32", "enable_prefix_caching=false"]`` -> typed KVPlan fields."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        field = key.strip().lstrip("-").replace("-", "_")
        if not sep or field not in _KNOB_TYPES:
            raise InvalidInput(
                "--config", pair,
                f"expected K=V with K one of {', '.join(sorted(_KNOB_TYPES))}",
            )
        kind = _KNOB_TYPES[field]
        try:
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0", "on", "off"):
                    raise ValueError(value)
                out[field] = value.lower() in ("true", "1", "on")
            else:
                out[field] = kind(value)
        except ValueError as exc:
            raise InvalidInput("--config", pair, f"{field} takes a {kind.__name__}") from exc
        _check_bounds(pair, field, out[field])
    return out


def _check_bounds(pair: str, field: str, value: Any) -> None:
    """The pin's bounds (``Pins``: vLLM's own lower bounds, kvtune's sanity caps, finite):
    a zero, negative, NaN or absurd value is refused here, naming the pair."""
    try:
        Pins.model_validate({field: value})
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"]
        raise InvalidInput("--config", pair, f"{field}: {problem}") from None


def check_overrides(request: PlanRequest, overrides: Mapping[str, Any]) -> None:
    """Refuse what ``kvtune plan`` refuses as a pin (a block size or KV dtype no backend of the
    pinned vLLM runs here, a max-model-len beyond the model, ...): the same checks, with the
    ``--config`` key named."""
    pins = Pins(**{k: v for k, v in overrides.items() if k in Pins.model_fields})
    try:
        PlanRun(request.model_copy(update={
            "policy": request.policy.model_copy(update={"pins": pins})}))
    except InvalidInput as exc:
        if not exc.field.startswith("pins."):
            raise
        key = exc.field.removeprefix("pins.")
        raise InvalidInput("--config", f"{key}={exc.value}",
                           str(exc).split(": ", 1)[1]) from exc


def configurations(
    request: PlanRequest, names: Sequence[str], overrides: Mapping[str, Any] | None = None,
    scorer: SimulatorScorer | None = None, planned_plan: KVPlan | None = None,
) -> list[SimulatedPlan]:
    """The named configurations, in the order asked. ``planned`` is ``planned_plan`` when
    given (``kvtune simulate`` passes ``kvtune plan``'s own), else ``plan_pool`` (with
    ``scorer`` when given); the baselines take the planned plan (or the defaults when
    ``planned`` is not asked for) and change only allocation or prefix caching."""
    unknown = [n for n in names if n not in CONFIGURATION_NAMES]
    if unknown:
        raise InvalidInput("--compare", ",".join(unknown),
                           f"unknown configuration; choose from {', '.join(CONFIGURATION_NAMES)}")
    defaults = vllm_default_plan(request)
    planned: KVPlan | None = None
    if "planned" in names:
        planned = planned_plan if planned_plan is not None \
            else plan_pool(request, scorer=scorer).plan
    base = planned or defaults
    out: list[SimulatedPlan] = []
    for name in names:
        if name == "defaults":
            out.append(simulated_plan(request, defaults, name))
        elif name == "planned":
            assert planned is not None
            out.append(simulated_plan(request, planned, name))
        elif name == "contiguous":
            out.append(simulated_plan(
                request, base.model_copy(update={"enable_prefix_caching": False}), name,
                allocation="contiguous"))
        elif name == "no-prefix-cache":
            out.append(simulated_plan(
                request, base.model_copy(update={"enable_prefix_caching": False}), name))
        else:
            fields = {**defaults.model_dump(), **(overrides or {})}
            # vLLM's checks of the pins see the scheduler's pair as custom runs it: an
            # override of one against the default of the other (batched tokens 1 against
            # 1,024 default sequences does not start).
            pins = dict(overrides or {})
            if _SCHEDULER_PAIR & pins.keys():
                pins.update({k: fields[k] for k in _SCHEDULER_PAIR})
            check_overrides(request, pins)
            # 0 turns CPU offload off (the field itself takes only a positive size).
            size = fields.get("kv_offloading_size_gib") or None
            plan = KVPlan.model_validate({**fields, "kv_offloading_size_gib": size,
                                          "kv_offloading_backend": offload_backend(size)})
            out.append(simulated_plan(request, plan, name))
    return out


def run(requests: Sequence[SimRequest], configs: Sequence[SimulatedPlan]) -> list[SimResult]:
    """Replay the same requests under each configuration that vLLM would start."""
    return [simulate(requests, c.engine, c.cost, name=c.name) for c in configs if c.starts]
