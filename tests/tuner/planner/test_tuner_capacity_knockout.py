"""The capacity search's knockout (tuner/planner/capacity.py): one candidate at a time, the
others probed at the edge of the best's band. It finds the best capacity a group ladder
finds, in fewer probes when the hints overstate it (a short stream's bracket), and never
replays a result that attainment's fall with the rate already implies."""

from __future__ import annotations

import math

import pytest

from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import get_gpu_class
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.capacity import GoodputScore, climb, knockout, meets, standing
from kvtune.tuner.planner.planning import PlanRequest, plan_pool
from kvtune.tuner.planner.policy import SLO, PlanPolicy
from kvtune.tuner.planner.presets import preset_profile

TARGET = 0.95


def _plans(k: int) -> list[KVPlan]:
    profile = preset_profile("chat").model_copy(update={"request_rate_per_second": 5.0})
    base = plan_pool(PlanRequest(
        model=get_model("meta-llama/Llama-3.1-8B-Instruct"), gpu=get_gpu_class("H100"),
        profile=profile, policy=PlanPolicy(slo=SLO(ttft_p95_seconds=2.0)))).plan
    return [base.model_copy(update={"max_num_seqs": 8 * (i + 1)}) for i in range(k)]


class Fake:
    """A plan meets the target up to its capacity (a rate scale), and counts every replay."""

    def __init__(self, capacity: dict[KVPlan, float]) -> None:
        self.capacity = capacity
        self.calls: list[tuple[KVPlan, float]] = []  # the replays, in order
        self.book: dict[tuple[KVPlan, float], GoodputScore] = {}

    def __call__(self, plan: KVPlan, n: int, scale: float) -> GoodputScore:
        """Cached, as the search's book is: a replay happens once per plan and scale."""
        if (plan, scale) not in self.book:
            self.calls.append((plan, scale))
            self.book[(plan, scale)] = self._replay(plan, n, scale)
        return self.book[(plan, scale)]

    def _replay(self, plan: KVPlan, n: int, scale: float) -> GoodputScore:
        cap = self.capacity[plan]
        # Attainment falls smoothly past the capacity (closer: higher), as a replay's does.
        att = 1.0 if scale <= cap else max(0.0, 0.95 - (scale - cap) / cap)
        return GoodputScore(slo_attainment=att, keeps_up=True,
                            throughput_requests_per_second=1.0, ttft_p95_seconds=0.1,
                            tpot_p95_seconds=0.01, requests=n)


CASES = [
    [3.0, 7.5, 7.4, 2.0, 6.0, 7.6, 1.5, 5.0, 7.0, 4.0],
    [9.0, 1.2, 1.1, 1.3],
    [0.4, 0.3, 0.6, 0.5],  # overload: none meets the observed rate
    [12.0] * 5,
]


@pytest.mark.parametrize("caps", CASES)
def test_the_knockout_finds_the_groups_best_capacity_within_the_tolerance(
        caps: list[float]) -> None:
    plans = _plans(len(caps))
    fake = Fake(dict(zip(plans, caps, strict=True)))
    b = knockout(fake, plans, 100, TARGET, 0.02, 0.02, hints=(max(caps) * 1.4,))
    best = max(caps)
    assert b.lower <= best * (1 + 1e-9) and b.upper / b.lower <= 1.02 + 1e-9
    assert b.lower >= best / 1.02 - 1e-9


def test_from_an_overstated_bracket_it_takes_fewer_replays_than_a_group_ladder() -> None:
    caps = [3.0, 7.5, 7.4, 2.0, 6.0, 7.6, 1.5, 5.0, 7.0, 4.0]
    plans = _plans(len(caps))
    # A short stream's bracket: 30 % above what the full one sustains.
    hints = (10.0, 15.0, 9.0, 8.0, 6.5, 5.0)
    group, alone = Fake(dict(zip(plans, caps, strict=True))), Fake(dict(zip(plans, caps,
                                                                            strict=True)))
    g = climb(lambda p, n, s: group(p, n, s), plans, 100, TARGET, 0.02, hints)
    k = knockout(alone, plans, 100, TARGET, 0.02, 0.02, hints)
    assert math.isclose(g.lower, k.lower, rel_tol=0.021)
    assert len(alone.calls) < 0.7 * len(group.calls)


def test_no_result_is_replayed_that_a_miss_below_or_a_pass_above_implies() -> None:
    caps = [3.0, 7.5, 7.4, 2.0, 6.0, 7.6]
    plans = _plans(len(caps))
    fake = Fake(dict(zip(plans, caps, strict=True)))
    knockout(fake, plans, 100, TARGET, 0.02, 0.02, hints=(9.0, 6.0))
    for plan in plans:
        mine = [(s, meets(fake.book[(plan, s)], TARGET)) for p, s in fake.calls if p == plan]
        for i, (s, _) in enumerate(mine):
            if s == 1.0:
                continue  # the observed rate is taken for its figures, implied or not
            earlier = mine[:i]
            assert not any(t <= s and not ok for t, ok in earlier), (plan.max_num_seqs, mine)
            assert not any(t >= s and ok for t, ok in earlier), (plan.max_num_seqs, mine)


def test_a_standing_without_the_observed_rate_takes_the_lowest_rate_met_above_it() -> None:
    plan = _plans(1)[0]
    fake = Fake({plan: 5.0})
    scores = {2.0: fake(plan, 100, 2.0), 6.0: fake(plan, 100, 6.0), 4.0: fake(plan, 100, 4.0)}
    st = standing(scores, TARGET)
    assert st.at_observed is scores[2.0] and st.meets_observed(TARGET)
    assert (st.lower_scale, st.upper_scale) == (4.0, 6.0)
    # Missed at the only rate taken (a short rung's loser): it counts as missing the SLO.
    lost = standing({6.0: scores[6.0]}, TARGET)
    assert not lost.observed and not lost.meets_observed(TARGET)
    assert (lost.lower_scale, lost.upper_scale) == (0.0, 6.0)


def test_off_the_last_rung_each_candidate_below_the_first_costs_one_replay() -> None:
    caps = [7.6, 3.0, 7.0, 2.0, 6.0, 5.0]
    plans = _plans(len(caps))
    fake = Fake(dict(zip(plans, caps, strict=True)))
    b = knockout(fake, plans, 100, TARGET, 0.08, 0.0, hints=(9.0, 6.0), final=False)
    first = [s for p, s in fake.calls if p == plans[0]]
    assert len(fake.calls) == len(first) + len(plans) - 1
    assert 7.6 / 1.08 <= b.lower <= 7.6
    # A later one above the first's bracket takes it over (its own ladder from there).
    fake = Fake(dict(zip(plans, [3.0, 7.6, 2.0], strict=False)))
    b = knockout(fake, plans[:3], 100, TARGET, 0.08, 0.0, hints=(9.0, 6.0), final=False)
    assert 7.6 / 1.08 <= b.lower <= 7.6
