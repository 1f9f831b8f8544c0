"""One pool's rollout: the stages in order; each either hands on its output or ends it."""

from __future__ import annotations

from collections.abc import Mapping

from kvtune.operator import pools as gpu_pools
from kvtune.operator.rollout.apply import apply, apply_access
from kvtune.operator.rollout.canary import canary
from kvtune.operator.rollout.observe import observe
from kvtune.operator.rollout.outcome import PoolContext, PoolOutcome
from kvtune.operator.rollout.plan import PlanInput, plan
from kvtune.operator.rollout.render import render


def rollout_pool(ctx: PoolContext, inp: PlanInput,
                 discovered: Mapping[str, gpu_pools.GPUPool]) -> PoolOutcome:
    planned = plan(ctx, inp)
    if isinstance(planned, PoolOutcome):
        return planned
    rendered = render(ctx, planned, discovered)
    if isinstance(rendered, PoolOutcome):
        return rendered
    refused = apply_access(ctx, rendered)
    if refused is not None:
        return refused
    passed = canary(ctx, planned, rendered)
    if isinstance(passed, PoolOutcome):
        return passed
    applied = apply(ctx, planned, rendered, passed)
    if isinstance(applied, PoolOutcome):
        return applied
    return observe(ctx, planned, applied)
