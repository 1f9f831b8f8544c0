"""One pool's goodput search as a document: what a search Job runs and what it answers.

The operator runs a pool's search in its own process, or (the chart's ``search.mode``) as a
Kubernetes Job from its own image (``operator/search/search_jobs.py``). Both run the same function,
``plan_by_goodput``, on the same inputs; here are those inputs as one pure, versioned
document (``SearchInput``: the ``PlanRequest``, whose profile the traffic is made from with
``seed``, the running plan ties go to, the replicas that share the rate, and the budget),
its digest, which keys the Job, its ConfigMap and its result, and the answer
(``SearchOutcome``: the plan, or the error the search ended with) in the compact form the
Job's container leaves in its termination message.

Why the termination message: the Job's pod then needs no API access at all (no token is
mounted); only the kubelet writes it, from the container's own file. The kubelet keeps at
most 4096 bytes of it, so the plan travels zlib-compressed and base64-encoded (a searched
plan: ~7 kB of JSON, ~2.8 kB encoded); a larger answer is refused with a one-line error
(``ResultTooLarge``) rather than cut off.

Pure: no I/O (the CLI reads and writes the files); ``run`` takes the stop switch.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvtune.tuner.errors import KVTuneError, NoFeasiblePlan
from kvtune.tuner.plan import KVPlan, PoolPlan
from kvtune.tuner.planner.request import PlanRequest
from kvtune.tuner.planner.search_budget import (
    MAX_STREAM_REQUESTS,
    SearchBudget,
    SearchBudgetSpent,
)

SEARCH_INPUT_VERSION: Literal[1] = 1
# The kubelet keeps at most this many bytes of a container's termination message.
TERMINATION_MESSAGE_MAX_BYTES = 4096
# How the answer is marked, so a message that is something else (a crash's log tail, with
# terminationMessagePolicy FallbackToLogsOnError) is never read as one.
RESULT_FORMAT = "kvtune.search-result/v1"

ErrorKind = Literal["SearchBudgetSpent", "NoFeasiblePlan", "InvalidSpec", "ResultTooLarge",
                    "BadInput"]


class SearchInput(BaseModel):
    """Everything one pool's goodput search depends on (module doc). Frozen, compared by
    value; ``digest`` is the sha256 of its canonical JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = SEARCH_INPUT_VERSION
    request: PlanRequest
    # The plan the pool runs now: ties go to the fewer changed knobs.
    running: KVPlan | None = None
    # Replicas sharing the profile's arrival rate (each is planned on its share).
    replicas: int = Field(default=1, ge=1)
    # The traffic made from the profile is seeded: the same document, the same stream.
    seed: int = 0
    # The budget (``planner/search_budget``); None: that limit is off.
    cpu_seconds: float | None = Field(default=None, gt=0)
    memory_bytes: int | None = Field(default=None, gt=0)
    stream_requests: int = Field(default=MAX_STREAM_REQUESTS, ge=1)

    def canonical_json(self) -> str:
        """Sorted keys, no spaces: one text per document, whatever the field order."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """sha256 (hex) of ``canonical_json``: keys the Job, its ConfigMap and its result."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def budget(self, cancelled: Callable[[], bool] | None = None) -> SearchBudget:
        if cancelled is None:
            return SearchBudget(cpu_seconds=self.cpu_seconds, memory_bytes=self.memory_bytes,
                                stream_requests=self.stream_requests)
        return SearchBudget(cpu_seconds=self.cpu_seconds, memory_bytes=self.memory_bytes,
                            stream_requests=self.stream_requests, cancelled=cancelled)


def parse_input(text: str) -> SearchInput:
    """The document from its JSON; ``InvalidSearchInput`` (one line) when it is not one."""
    try:
        return SearchInput.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise InvalidSearchInput(
            f"the search input is not a kvtune search document v{SEARCH_INPUT_VERSION}: "
            f"{where}: {first['msg']} ({exc.error_count()} problem(s)); the operator and the "
            "Job must run the same kvtune image") from None


class InvalidSearchInput(KVTuneError):
    """The input file is not a search document this kvtune reads."""


class SearchError(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ErrorKind
    message: str


class SearchOutcome(BaseModel):
    """What a search ended with: a plan or an error, for the inputs of ``digest``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: str
    plan: PoolPlan | None = None
    error: SearchError | None = None


def run(doc: SearchInput, cancelled: Callable[[], bool] | None = None) -> SearchOutcome:
    """The search of ``doc``, exactly as the operator runs it in-process (``plan_by_goodput``
    with the same request, running plan, replicas and budget). Errors a user can fix are an
    outcome; ``SearchCancelled`` (told to stop) propagates."""
    from kvtune.tuner.simulator.goodput_search import plan_by_goodput

    digest = doc.digest()
    try:
        plan = plan_by_goodput(doc.request, running=doc.running, seed=doc.seed,
                               replicas=doc.replicas, budget=doc.budget(cancelled))
    except SearchBudgetSpent as exc:
        return SearchOutcome(digest=digest, error=SearchError(kind="SearchBudgetSpent",
                                                              message=str(exc)))
    except NoFeasiblePlan as exc:
        return SearchOutcome(digest=digest, error=SearchError(kind="NoFeasiblePlan",
                                                              message=str(exc)))
    except KVTuneError as exc:
        return SearchOutcome(digest=digest, error=SearchError(kind="InvalidSpec",
                                                              message=str(exc)))
    return SearchOutcome(digest=digest, plan=plan)


def encode(outcome: SearchOutcome, limit_bytes: int = TERMINATION_MESSAGE_MAX_BYTES) -> str:
    """The outcome as a termination message: compact JSON carrying the zlib-compressed,
    base64-encoded outcome. An outcome too large for ``limit_bytes`` becomes a
    ``ResultTooLarge`` error outcome (which always fits) naming the sizes and the fix."""
    text = _wrap(outcome)
    if len(text.encode()) <= limit_bytes:
        return text
    slim = _without_detail(outcome)
    if slim is not None and len(_wrap(slim).encode()) <= limit_bytes:
        return _wrap(slim)
    raw = len(outcome.model_dump_json(exclude_defaults=True).encode())
    too_large = SearchOutcome(digest=outcome.digest, error=SearchError(
        kind="ResultTooLarge",
        message=(f"the search's result is {len(text.encode())} bytes compressed ({raw} as "
                 f"JSON), over the kubelet's {limit_bytes}-byte termination message; run "
                 "this pool's search in the operator (chart value search.mode: inProcess)")))
    return _wrap(too_large)


def _without_detail(outcome: SearchOutcome) -> SearchOutcome | None:
    """The outcome without what the operator does not act on (the CPU tier sizes weighed, the
    Pareto front, the runners-up), saying so in a warning; None: nothing to leave out."""
    plan = outcome.plan
    s = plan.search if plan is not None else None
    if plan is None or s is None or not (s.front or s.alternatives
                                         or (s.reuse and s.reuse.tier_sizes)):
        return None
    reuse = s.reuse.model_copy(update={"tier_sizes": ()}) if s.reuse is not None else None
    warning = ("the search Job's answer leaves out the CPU tier sizes weighed, the Pareto "
               f"front and the runners-up to fit the kubelet's {TERMINATION_MESSAGE_MAX_BYTES}"
               "-byte termination message (kvtune plan shows them)")
    return outcome.model_copy(update={"plan": plan.model_copy(update={
        "search": s.model_copy(update={"front": (), "alternatives": (), "reuse": reuse}),
        "warnings": (*plan.warnings, warning)})})


def _wrap(outcome: SearchOutcome) -> str:
    packed = zlib.compress(outcome.model_dump_json(exclude_defaults=True).encode(), 9)
    return json.dumps({"format": RESULT_FORMAT, "digest": outcome.digest,
                       "z": base64.b64encode(packed).decode("ascii")},
                      separators=(",", ":"))


def decode(message: str | None) -> SearchOutcome | None:
    """The outcome in a termination message; None when the message is not one (empty, a
    log tail, another format, a corrupt payload)."""
    if not message:
        return None
    try:
        wrapper = json.loads(message)
        if not isinstance(wrapper, dict) or wrapper.get("format") != RESULT_FORMAT:
            return None
        data = zlib.decompress(base64.b64decode(wrapper["z"], validate=True))
        outcome = SearchOutcome.model_validate_json(data)
    except (ValueError, KeyError, TypeError, zlib.error):
        return None
    if outcome.digest != wrapper.get("digest"):
        return None  # the outer digest is what a reader filters on: they must agree
    return outcome


__all__ = [
    "RESULT_FORMAT",
    "SEARCH_INPUT_VERSION",
    "TERMINATION_MESSAGE_MAX_BYTES",
    "InvalidSearchInput",
    "SearchError",
    "SearchInput",
    "SearchOutcome",
    "decode",
    "encode",
    "parse_input",
    "run",
]
