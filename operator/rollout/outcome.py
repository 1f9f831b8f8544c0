"""What a pool's rollout ends with, and the Events the stages post."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kvtune.operator.api import InferenceDeploymentSpec, PoolSpec, PoolStatus
from kvtune.operator.api import conditions as cond
from kvtune.operator.kube import apply as kapply


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class PoolOutcome:
    status: PoolStatus
    failure: tuple[str, str] | None = None  # (reason, message)
    rolling: str | None = None  # what a rollout still waits for
    no_nodes: bool = False
    retry_after: float | None = None  # seconds until this pool should be reconciled again
    # its capacity search runs as a Job (operator/search/search_jobs.py)
    searching: str | None = None


@dataclass
class PoolContext:
    """What every stage of one pool reads: the spec, which pool, the object it belongs to,
    the API, the pool's previous status (``base``: what it runs now) and the Event sink."""

    spec: InferenceDeploymentSpec
    index: int
    pool: PoolSpec
    body: Any  # the InferenceDeployment (metadata: name, namespace, uid)
    kube: kapply.Kube
    now: str
    base: PoolStatus
    events: list[Event]

    @property
    def field(self) -> str:
        return f"spec.pools[{self.index}]"

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    def apply_failed(self, exc: kapply.ApplyError, message: str) -> PoolOutcome:
        """An apply the API server refused, or a name taken by an object not kvtune's."""
        reason = cond.NAME_COLLISION if isinstance(exc, kapply.NameCollision) \
            else cond.APPLY_FAILED
        return self.failed(reason, message)

    def failed(self, reason: str, message: str, status: PoolStatus | None = None) -> PoolOutcome:
        """The pool ends failed; it keeps showing what it runs now."""
        shown = status if status is not None else self.base
        return PoolOutcome(shown.model_copy(update={"phase": "Failed", "message": message}),
                           failure=(reason, message))
