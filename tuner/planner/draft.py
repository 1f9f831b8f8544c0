"""The plan while it is being decided: one frozen ``Draft`` that every decision step takes and
returns (``Step``), holding the knobs decided so far with their reasons and warnings.

``planning.PIPELINE`` lists the steps in order; each ``decide_<knob>.py`` reads the knobs the
steps before it decided (``need`` says which, and fails loudly if the order ever breaks) and
returns a new draft with its own knob, reason and warnings added. Nothing is changed in place,
so a step is a function of the run's facts (``planrun.PlanRun``, read-only) and the draft.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from kvtune.tuner.plan import CandidateScore, KVPlan, Reason
from kvtune.tuner.planner.checks import PINNED

if TYPE_CHECKING:
    from kvtune.tuner.planner.planrun import Memory, PlanRun

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Length:
    """``--max-model-len`` with its reason's code and message (they change together when
    pre-flight shrinks the length or the final max-num-seqs lets it grow back)."""

    tokens: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Target:
    """The TPOT target max-num-seqs (and the dtype's concurrency target) are sized for."""

    seconds: float
    why: str


@dataclass(frozen=True, slots=True)
class Draft:
    """The knobs decided so far (None: not decided yet), in the order ``planning.PIPELINE``
    decides them, then the assembled plan, and the reasons and warnings in the order given."""

    # max-num-batched-tokens: vLLM's default first (every memory figure depends on it), then
    # tuned for the TTFT SLO once the rest is known.
    batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    max_model_len: Length | None = None
    # The length before pre-flight shrank it, and the target it started from: the final
    # max-num-seqs may free enough memory to give the length back.
    max_model_len_target_tokens: int | None = None
    max_model_len_unshrunk: Length | None = None
    tpot: Target | None = None
    kv_cache_dtype: str | None = None
    # Memory is figured at the probe block size (the pin, else the dtype's smallest) until
    # the block size is decided, last.
    probe_block_size: int | None = None
    probe_memory: Memory | None = None
    fit_p50_sessions: int | None = None
    max_num_seqs: int | None = None
    # None also when decided off; only the assembly (``planning.assemble``) reads it.
    kv_offloading_size_gib: float | None = None
    # The knobs as one KVPlan (block size at the probe size until the block-size step).
    plan: KVPlan | None = None
    # The scorer's figures for the chosen candidate (block size scored on the workload).
    score: CandidateScore | None = None
    reasons: tuple[Reason, ...] = ()
    warnings: tuple[str, ...] = ()

    def reason(self, reason: Reason) -> Draft:
        return replace(self, reasons=(*self.reasons, reason))

    def warn(self, *warnings: str) -> Draft:
        return replace(self, warnings=(*self.warnings, *warnings))

    def pinned(self, knob: str, value: str) -> Draft:
        """With the reason a pinned knob gets."""
        return self.reason(Reason(
            knob=knob, choice=value, code=PINNED, message=f"pinned by the policy to {value}"
        ))


# One decision step: the run's facts and the draft so far in, the draft with its knob out.
Step = Callable[["PlanRun", Draft], Draft]


def need(value: T | None, knob: str) -> T:
    """A knob an earlier step decided; an error names it when the pipeline's order is
    broken (a programming error, never a user's)."""
    if value is None:
        raise AssertionError(f"{knob} was read before planning.PIPELINE decided it")
    return value
