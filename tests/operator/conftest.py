"""Fixtures of the operator's tests (builders live in op_samples.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_samples import SAMPLE_SPEC, make_pool_plan

from kvtune.tuner.plan import PoolPlan


@pytest.fixture
def pool_plan() -> PoolPlan:
    return make_pool_plan()


@pytest.fixture
def sample_spec() -> dict[str, Any]:
    return copy.deepcopy(SAMPLE_SPEC)
