"""The plans of a prefill/decode pair (``spec.pools[].role``, docs/disaggregation.md).

The two pools of a pair are planned together by the tuner's disaggregated plan
(``tuner/simulator/disagg_search.py: plan_roles``): the rules plan the decode pool, on its GPU
class and TP, with ``spec.tuning.pin`` and its own ``pools[].pin``; the prefill pool follows
decode's KV dtype, block size and attention backend where it pins none; then the pair is
checked as vLLM 0.33's NixlConnector handshake checks it (``planner/disagg_compat.py``). A pair
the handshake would refuse is refused here, before either pool rolls out, in one line with the
spec's field, the two values and the fix.

Each pool of the pair plans the pair on the same inputs (the deployment's traffic: every
request passes through both pools), so both see the same pair; the plans are the rules' plans
(not the capacity search's: each role's knobs are not searched yet), cached by their inputs.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from kvtune.operator.api import InferenceDeploymentSpec, PoolSpec, pair_of
from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.knobs import KNOBS, camel_name
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.planner.policy import Pins
from kvtune.tuner.planner.request import PlanRequest

# How the compatibility rules name a field (planner/disagg_compat.py) -> the spec's spelling.
_FIELDS = {**{k.name: camel_name(k) for k in KNOBS}, "tensor_parallel": "tensorParallel",
           "decode_context_parallel": "decodeContextParallel"}
_OPTIONS = {k.option: f"pools[].pin.{camel_name(k)}" for k in KNOBS}
_OPTION = re.compile(r"(--[a-z][a-z-]+)")


class PairRefused(InvalidInput):
    """The pair's plans would be refused by the NixlConnector handshake (one line)."""


def role_pins(pool: PoolSpec) -> Pins | None:
    return pool.pin.to_pins() if pool.pin is not None else None


def plan_pair(spec: InferenceDeploymentSpec, pool: PoolSpec, requests: tuple[PlanRequest,
              PlanRequest]) -> PoolPlan:
    """``pool``'s plan, as one role of its pair; ``requests``: the (prefill, decode) pools'
    plan requests. Raises ``PairRefused`` when the pair cannot hand over its KV cache."""
    pair = pair_of(spec.pools, pool)
    assert pair is not None, "plan_pair is for a pool with a role"
    prefill, decode = pair
    plans = _plan_roles(requests[1], _tp(decode), _tp(prefill), role_pins(prefill),
                        role_pins(decode), requests[0])
    return plans[0] if pool.role == "prefill" else plans[1]


def _tp(pool: PoolSpec) -> int:
    # tensorParallel auto is refused with a role (pool_spec._ROLE_RULES).
    return pool.tensor_parallel if isinstance(pool.tensor_parallel, int) else 1


@functools.lru_cache(maxsize=64)
def _plan_roles(decode_request: PlanRequest, decode_tp: int, prefill_tp: int,
                prefill_pins: Pins | None, decode_pins: Pins | None,
                prefill_request: PlanRequest) -> tuple[PoolPlan, PoolPlan]:
    """``plan_roles`` once per pair of inputs (both pools of a pair ask; a reconcile of an
    unchanged spec asks again): pure and frozen, so shared safely."""
    from kvtune.tuner.simulator.disagg_search import plan_roles

    try:
        return plan_roles(decode_request, prefill_tp, decode_tp, prefill_pins, decode_pins,
                          prefill_request=prefill_request)
    except PairRefused:
        raise
    except InvalidInput as exc:
        if exc.field not in _FIELDS or "NixlConnector" not in str(exc):
            raise
        raise PairRefused(_FIELDS[exc.field], exc.value, spec_message(exc)) from exc


def spec_message(exc: InvalidInput) -> str:
    """The rule's fix in the spec's words: ``--block-size`` is ``pools[].pin.blockSize``."""
    text = str(exc).split(": ", 1)[1] if ": " in str(exc) else str(exc)
    return _OPTION.sub(lambda m: _OPTIONS.get(m.group(1), m.group(1)), text)


def pair_inputs(spec: InferenceDeploymentSpec, pool: PoolSpec) -> dict[str, Any] | None:
    """What a role pool's plan depends on beyond its own pool: the pair's pools (their GPU
    classes, TPs and pins), for the planning-inputs digest; None without a role."""
    pair = pair_of(spec.pools, pool)
    if pair is None:
        return None
    return {"role": pool.role, "pair": [p.model_dump(mode="json", exclude_none=True,
                                                     include={"name", "gpu_class", "custom_gpu",
                                                              "tensor_parallel", "pin"})
                                        for p in pair]}
