"""Whether a plan may be rolled out: checks between the planner's answer and the runtime.

The planner honours pins and SLOs as far as it can; a plan it could only make by giving up
on the workload is not rolled out (``Degraded`` with the field, the value and the fix):

- every pin is in the plan as pinned (a pin is honoured or refused, never replaced);
- a pinned ``maxModelLen`` covers the profile's p99 context (else vLLM refuses most
  requests the pool was planned for);
- a plan that serves one sequence at a time (``max-num-seqs=1``) only when the user pinned
  it: otherwise the SLO or a pin left nothing else, and saying so beats rolling it out.
"""

from __future__ import annotations

import math

from kvtune.operator.api import PIN_PATH, InferenceDeploymentSpec, PinSpec, pin_path
from kvtune.operator.api import conditions as cond
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.workload import WorkloadProfile


def _pins(spec: InferenceDeploymentSpec, role_pin: PinSpec | None
          ) -> tuple[PinSpec, set[str]]:
    """The pins the pool's plan must honour: ``spec.tuning.pin`` with a role's own
    ``pools[].pin`` over it (prefill/decode pools), and which of them are the role's."""
    pin = spec.tuning.pin or PinSpec()
    if role_pin is None:
        return pin, set()
    own = role_pin.model_dump(exclude_none=True)
    return pin.model_copy(update=own), set(own)


def check(spec: InferenceDeploymentSpec, pool_plan: PoolPlan,
          profile: WorkloadProfile, role_pin: PinSpec | None = None
          ) -> tuple[str, str] | None:
    """None when the plan may roll out; else (condition reason, message)."""
    pin, own = _pins(spec, role_pin)
    plan = pool_plan.plan
    for name in PinSpec.model_fields:
        wanted = getattr(pin, name)
        got = getattr(plan, name, None)
        if wanted is None:
            continue
        same = math.isclose(float(got), float(wanted), rel_tol=1e-6) \
            if isinstance(wanted, float) and got is not None else got == wanted
        if not same:
            return cond.INVALID_SPEC, (
                f"{pin_path(name, 'spec.pools[].pin' if name in own else PIN_PATH)}"
                f"={wanted}: the planner could not honour it (it planned "
                f"{got}); change or remove the pin")
    p99 = profile.context_tokens.p99
    if pin.max_model_len is not None and pin.max_model_len < p99:
        return cond.INVALID_SPEC, (
            f"{pin_path('max_model_len')}={pin.max_model_len} is below the workload's p99 "
            f"context ({p99} tokens, {profile.source}): vLLM would refuse most requests; raise "
            f"it to at least {p99} or remove the pin")
    if plan.max_num_seqs == 1 and pin.max_num_seqs != 1:
        why = "; ".join(pool_plan.warnings) or "nothing else fits"
        if pin.max_num_batched_tokens is not None and pin.max_num_batched_tokens < 16:
            return cond.INVALID_SPEC, (
                f"{pin_path('max_num_batched_tokens')}={pin.max_num_batched_tokens}: vLLM "
                f"needs max-num-batched-tokens >= max-num-seqs, so the pool would serve one "
                f"sequence at a time; pin at least {max(256, p99 // 8)} or remove the pin")
        if spec.slo is not None:
            return cond.NO_FEASIBLE_PLAN, (
                f"spec.slo (ttftP95={spec.slo.ttft_p95}, tpotP95={spec.slo.tpot_p95}): only "
                f"one sequence at a time could meet it ({why[:300]}); relax the SLO, raise "
                f"tensorParallel or use a faster GPU class")
        return cond.NO_FEASIBLE_PLAN, (
            f"the plan serves one sequence at a time ({why[:300]}); pin maxNumSeqs: 1 if that "
            f"is meant")
    return None
