"""A pool whose new pods cannot start for a reason that needs a person (a wrong image, a
bad config) is Degraded at once, not after the 30-minute progress deadline."""

from __future__ import annotations

from typing import Any

import pytest

from kvtune.operator.rollout.observe import pod_problem


def _pod(waiting: str | None, *, init: bool = False, message: str = "") -> dict[str, Any]:
    state = {"waiting": {"reason": waiting, "message": message}} if waiting else \
        {"running": {}}
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"metadata": {"name": "bot-h100-6f7d9c8b5-x2x7q"},
            "status": {key: [{"name": "vllm", "state": state}]}}


@pytest.mark.parametrize(("pods", "needle"), [
    ([_pod("ImagePullBackOff", message="Back-off pulling image vllm/vllm-openai:v9")],
     "ImagePullBackOff: Back-off pulling image vllm/vllm-openai:v9"),
    ([_pod(None), _pod("ErrImagePull")], "ErrImagePull"),
    ([_pod("InvalidImageName")], "InvalidImageName"),
    ([_pod("CreateContainerConfigError", init=True)], "CreateContainerConfigError"),
])
def test_pods_that_need_a_person_are_named(pods: list[dict[str, Any]], needle: str) -> None:
    problem = pod_problem(pods)
    assert problem is not None and needle in problem
    assert "bot-h100-6f7d9c8b5-x2x7q" in problem


@pytest.mark.parametrize("pods", [
    [], [_pod(None)], [_pod("ContainerCreating")], [_pod("CrashLoopBackOff")],
    [{"metadata": {"name": "p"}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}],
])
def test_pods_still_on_their_way_are_not_a_problem(pods: list[dict[str, Any]]) -> None:
    assert pod_problem(pods) is None


def test_no_pod_listing_before_the_controller_made_pods_of_the_current_template() -> None:
    """Right after an apply (the controller has not seen the new generation) or before the
    first pod of the new template exists, there is nothing to look at: the pool's pods (a
    list over the namespace's pods) are not listed."""
    from kvtune.operator.rollout.observe import _new_pods_exist

    meta = {"generation": 3}
    assert not _new_pods_exist(meta, {"observedGeneration": 2, "updatedReplicas": 1})
    assert not _new_pods_exist(meta, {"observedGeneration": 3, "updatedReplicas": 0})
    assert not _new_pods_exist(meta, {})
    assert _new_pods_exist(meta, {"observedGeneration": 3, "updatedReplicas": 1})
