"""Reasons told for the plan that ships, after the capacity search's last decision. Pure.

The rules explain each knob in the context of their own other choices: the batched-tokens
reason counts the rules' max-num-seqs, the attention-backend reason names the rules' KV dtype.
When the search changes some knobs and keeps the others, the kept knobs' reasons would still
describe the rules' plan (a bf16 plan whose attention-backend reason names fp8). So the rules
run again with the search's changes pinned: a kept knob they set to the same value takes that
run's reason, told for the final plan; a kept knob they would now set otherwise (its value was
right only beside the rules' other choices) is said to be the search's, with no figure from a
plan that does not ship.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvtune.tuner import knobs
from kvtune.tuner.errors import KVTuneError
from kvtune.tuner.plan import KVPlan, Reason
from kvtune.tuner.planner.planning import plan_pool
from kvtune.tuner.planner.request import PlanRequest

KEPT_BY_SEARCH = "KeptBySearch"


def told_for_final(request: PlanRequest, plan: KVPlan, rules_reasons: Sequence[Reason],
                   changed: Iterable[str], candidates: int) -> list[Reason]:
    """The reasons of the knobs the search did not change (flags in ``changed`` are left
    out: the search writes their reasons), each consistent with ``plan``."""
    changed = set(changed)
    kept = [r for r in rules_reasons if r.knob not in changed]
    if not changed:
        return kept
    # Pinned to the final plan: the search's changes, then every kept knob the rules would
    # set otherwise beside them (so the rest are told beside the final values of all of
    # them); a few rounds settle it (each pins at least one more knob).
    by_search: set[str] = set()
    again = None
    for _ in range(len(knobs.KNOBS)):
        try:
            again = plan_pool(_pinned(request, plan, changed | by_search))
        except KVTuneError:
            # The rules may refuse a mix of pins they would never choose (the search's plan
            # passed its own start check): then every kept knob is the search's.
            again = None
            break
        moved = {r.knob for r in kept if _differs(again.plan, plan, r.knob)}
        if moved <= by_search:
            break
        by_search |= moved
    if again is None:
        return [_kept_by_search(r, plan, changed, candidates) for r in kept]
    told = {r.knob: r for r in again.reasons}
    return [told[r.knob] if r.knob not in by_search and r.knob in told
            else _kept_by_search(r, plan, changed, candidates) for r in kept]


def _differs(a: KVPlan, b: KVPlan, flag: str) -> bool:
    """Whether the two plans set the knob of ``flag`` apart (a reason's knob that is no plan
    field, such as quantization, never differs)."""
    name = knobs.FLAG_TO_NAME.get(flag)
    return name is not None and getattr(a, name) != getattr(b, name)


def _pinned(request: PlanRequest, plan: KVPlan, flags: set[str]) -> PlanRequest:
    """``request`` with the knobs of ``flags`` pinned to ``plan``'s values."""
    names = [knobs.FLAG_TO_NAME[f] for f in flags if f in knobs.FLAG_TO_NAME]
    pins = {n: getattr(plan, n) for n in names if knobs.BY_NAME[n].pinnable}
    policy = request.policy
    return request.model_copy(update={"policy": policy.model_copy(update={
        "pins": policy.pins.model_copy(update=pins)})})


def _kept_by_search(reason: Reason, plan: KVPlan, changed: set[str], candidates: int
                    ) -> Reason:
    name = knobs.FLAG_TO_NAME.get(reason.knob)
    value = getattr(plan, name) if name is not None else reason.choice
    choice = knobs.choice_text(value)
    return Reason(
        knob=reason.knob, choice=choice, code=KEPT_BY_SEARCH,
        message=(f"the capacity search kept {choice} beside its {', '.join(sorted(changed))} "
                 f"among {candidates} candidates: it scored best with them (the rules chose "
                 f"it beside their own choices of those knobs)"))
