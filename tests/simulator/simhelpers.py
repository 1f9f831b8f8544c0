"""Small builders shared by the simulator tests (not a test module)."""

from __future__ import annotations

import math

from kvtune.tuner.simulator.metrics import SimResult
from kvtune.tuner.simulator.prefix import Segment
from kvtune.tuner.simulator.timing import Efficiency, StepCostModel
from kvtune.tuner.simulator.workload import SimRequest

STEP_SECONDS = 0.01


def fixed_step_cost(step_seconds: float = STEP_SECONDS) -> StepCostModel:
    """Every step takes exactly ``step_seconds`` (no bytes, no FLOPs)."""
    return StepCostModel(
        weights_bytes=0, kv_bytes_per_token=0, hbm_bytes_per_second=1.0,
        matrix_flops_per_second=1.0, flops_per_token=0.0, attention_flops_per_token_pair=0.0,
        efficiency=Efficiency(1.0, 1.0, step_seconds),
    )


def request(
    request_id: int, arrival_seconds: float, prompt_tokens: int, output_tokens: int,
    shared: tuple[Segment, ...] = (), unique_uid: int | None = None,
) -> SimRequest:
    """A request whose prompt starts with the ``shared`` segments (uids shared with other
    requests) and whose rest is its own."""
    shared_tokens = sum(n for _, n in shared)
    own_uid = unique_uid if unique_uid is not None else 1_000_000 + request_id
    return SimRequest(
        request_id=request_id, arrival_seconds=arrival_seconds, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        segments=(*shared, (own_uid, prompt_tokens - shared_tokens + output_tokens)),
        shareable_tokens=shared_tokens,
    )



def assert_same_times(fast: SimResult, exact: SimResult) -> None:
    """Every request's first-token and finish time equal in two runs (to 1e-12 relative:
    the fast paths sum a run's steps in closed form), NaN (never reached) in both alike."""
    for a, b in ((fast.first_token_seconds, exact.first_token_seconds),
                 (fast.finish_seconds, exact.finish_seconds)):
        assert all((x != x and y != y) or math.isclose(x, y, rel_tol=1e-12)
                   for x, y in zip(a, b, strict=True))
