"""The per-namespace render budget of the template sandbox (issue 11 item 4, fairness): its
decisions on a given clock, and the sandbox deferring a tenant's render with it."""

from __future__ import annotations

import pytest

from kvtune.operator.render import template_sandbox
from kvtune.operator.render.render_fairness import Deferred, TenantBudget

HEAD = "spec:\n  containers:\n    - name: vllm\n      image: {{ image | tojson }}\n"


def test_one_render_in_flight_per_namespace_others_proceed() -> None:
    budget = TenantBudget(in_flight=1, cpu_seconds=6.0, window_seconds=60.0,
                          spread_seconds=2.0)
    assert budget.admit("tenant-a", now=0.0) is None
    second = budget.admit("tenant-a", now=0.0)
    assert isinstance(second, Deferred)
    assert "another template of namespace tenant-a is rendering" in second.reason
    # Another namespace is not affected by tenant-a's render in flight.
    assert budget.admit("tenant-b", now=0.0) is None
    budget.finish("tenant-a", now=1.0, cpu_seconds=0.2)
    assert budget.admit("tenant-a", now=1.0) is None  # its turn again


def test_deferrals_of_one_namespace_are_spread_not_all_at_once() -> None:
    budget = TenantBudget(in_flight=1, spread_seconds=2.0)
    assert budget.admit("a", now=10.0) is None
    retries = []
    for _ in range(5):
        deferred = budget.admit("a", now=10.0)
        assert deferred is not None
        retries.append(deferred.retry_after_seconds)
    assert retries == [2.0, 4.0, 6.0, 8.0, 10.0]
    # A namespace's spread is its own.
    assert budget.admit("b", now=10.0) is None
    deferred = budget.admit("b", now=10.0)
    assert deferred is not None and deferred.retry_after_seconds == 2.0


def test_cpu_budget_per_window_defers_until_charges_leave_the_window() -> None:
    budget = TenantBudget(in_flight=1, cpu_seconds=6.0, window_seconds=60.0,
                          spread_seconds=2.0)
    for at in (0.0, 10.0, 20.0):  # three renders at the 2 s CPU limit
        assert budget.admit("a", now=at) is None
        budget.finish("a", now=at + 1.0, cpu_seconds=2.0)
    assert budget.used("a", now=30.0) == 6.0
    deferred = budget.admit("a", now=30.0)
    assert deferred is not None
    assert "used 6.0 s of CPU in the last 60 s (budget 6 s)" in deferred.reason
    # The first charge (at 1 s) leaves the window at 61 s: the sum is then below the budget.
    assert deferred.retry_after_seconds == pytest.approx(61.0 + 2.0 - 30.0)
    assert budget.admit("b", now=30.0) is None  # another namespace renders meanwhile
    assert budget.admit("a", now=61.5) is None
    assert budget.used("a", now=61.5) == 4.0


def test_a_render_under_the_budget_is_admitted_and_charged_what_it_used() -> None:
    budget = TenantBudget(in_flight=1, cpu_seconds=6.0, window_seconds=60.0)
    assert budget.admit("a", now=0.0) is None
    budget.finish("a", now=0.5, cpu_seconds=5.9)
    assert budget.admit("a", now=1.0) is None  # 5.9 < 6: admitted, may overrun once
    budget.finish("a", now=3.0, cpu_seconds=2.0)
    assert budget.admit("a", now=4.0) is not None


def test_many_slow_templates_of_one_namespace_never_delay_another() -> None:
    """A decision trace: tenant A submits 12 slow renders (2 s CPU each) in turns; tenant B
    submits one in the middle. B is admitted at once; A gets at most one render at a time
    and at most its budget (plus one admitted just under it) per window."""
    budget = TenantBudget(in_flight=1, cpu_seconds=6.0, window_seconds=60.0,
                          spread_seconds=2.0)
    admitted_a: list[float] = []
    now = 0.0
    pending = 12
    b_admitted_at = None
    while pending and now < 600.0:
        if budget.admit("a", now) is None:
            admitted_a.append(now)
            pending -= 1
            budget.finish("a", now + 1.0, cpu_seconds=2.0)
        if now == 5.0:
            assert budget.admit("b", now) is None
            b_admitted_at = now
            budget.finish("b", now + 0.3, cpu_seconds=0.3)
        now += 1.0
    assert b_admitted_at == 5.0
    assert pending == 0
    for start in admitted_a:  # never more than 3 renders of A started in any minute
        assert len([t for t in admitted_a if start <= t < start + 60.0]) <= 3
    assert admitted_a[3] >= 60.0


def test_the_sandbox_defers_a_namespace_whose_render_is_in_flight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    budget = TenantBudget(in_flight=1)
    monkeypatch.setattr(template_sandbox, "BUDGET", budget)
    assert budget.admit("busy", now=0.0) is None  # a render of "busy" is in flight
    with pytest.raises(template_sandbox.RenderDeferred) as deferred:
        template_sandbox.render_yaml(HEAD + "# busy\n", {"image": "i"}, tenant="busy")
    assert "another template of namespace busy is rendering" in str(deferred.value)
    assert deferred.value.retry_after_seconds > 0
    # Not remembered as the template's failure; another namespace renders meanwhile.
    pod = template_sandbox.render_yaml(HEAD + "# busy\n", {"image": "i"}, tenant="idle")
    assert pod["spec"]["containers"][0]["image"] == "i"


def test_the_sandbox_charges_the_childs_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    budget = TenantBudget()
    monkeypatch.setattr(template_sandbox, "BUDGET", budget)
    template_sandbox.render_yaml(HEAD + "# charged\n", {"image": "j"}, tenant="t")
    # What the child used (start-up included): more than nothing, under the 2 s limit.
    used = budget.used("t", now=time.monotonic())
    assert 0.0 < used < template_sandbox.CPU_SECONDS
    # A template that loops is charged the CPU limit it broke.
    with pytest.raises(template_sandbox.SandboxError, match=r"CPU|wall clock"):
        template_sandbox.render_yaml("{% for i in range(99996) %}{% for j in range(99999) %}"
                                     "{% endfor %}{% endfor %}" + HEAD, {"image": "j"},
                                     tenant="t")
    assert budget.used("t", now=time.monotonic()) == pytest.approx(
        used + template_sandbox.CPU_SECONDS)
