"""Fairness between tenants for the template sandbox (``operator/render/template_sandbox.py``).

The sandbox bounds one render (CPU, memory, output, wall clock) and runs at most
``template_sandbox.CONCURRENT`` at once, but a tenant with many slow templates could still
hold every render slot and handler thread while another tenant's object waited (issue 11).
So each tenant (a namespace) gets, per render the cache cannot answer:

- at most ``IN_FLIGHT_PER_TENANT`` render in flight (waiting for a slot or running);
- at most ``CPU_SECONDS_PER_WINDOW`` seconds of renderer CPU in any ``WINDOW_SECONDS``
  (a render is admitted while the tenant's sum is below it; what it used is charged after).

Otherwise the render is deferred, not queued: no thread waits for it. The object is
Degraded with the reason and tried again after ``retry_after_seconds``. Deferrals of one
tenant are spread ``SPREAD_SECONDS`` apart, so many objects of one tenant come back one
after another instead of all at once. Other tenants are not affected.

Pure: the caller passes the clock (``now``, seconds) and the CPU each render used.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

# The defaults; the operator takes them from the chart's `templates` values
# (`kvtune operator --template-*`, cli/operator_cmd.py), set with ``TenantBudget.configure``.
IN_FLIGHT_PER_TENANT = 1
CPU_SECONDS_PER_WINDOW = 6.0  # three renders at the sandbox's 2 s CPU limit a minute
WINDOW_SECONDS = 60.0
SPREAD_SECONDS = 2.0


@dataclass(frozen=True)
class Limits:
    """One tenant's render budget (the module docstring says what each limit does)."""

    in_flight: int = IN_FLIGHT_PER_TENANT
    cpu_seconds: float = CPU_SECONDS_PER_WINDOW
    window_seconds: float = WINDOW_SECONDS
    spread_seconds: float = SPREAD_SECONDS

    def __post_init__(self) -> None:
        for name, value, low in (("in_flight", self.in_flight, 1),
                                 ("window_seconds", self.window_seconds, 1.0)):
            if value < low:
                raise ValueError(f"render budget {name}={value}: must be at least {low}")
        if self.cpu_seconds <= 0:
            raise ValueError(f"render budget cpu_seconds={self.cpu_seconds}: must be above 0 "
                             f"(no render could ever start)")
        if self.spread_seconds < 0:
            raise ValueError(f"render budget spread_seconds={self.spread_seconds}: must not "
                             f"be negative")


@dataclass(frozen=True)
class Deferred:
    """Why a tenant's render waits, and when to try again."""

    reason: str
    retry_after_seconds: float


@dataclass
class _Tenant:
    in_flight: int = 0
    charges: deque[tuple[float, float]] = field(default_factory=deque)  # (at, CPU seconds)
    next_retry_at: float = 0.0  # the last retry time handed out (deferrals are spread)


class TenantBudget:
    """The admission decisions for renders, per tenant. Thread-safe."""

    def __init__(self, *, in_flight: int = IN_FLIGHT_PER_TENANT,
                 cpu_seconds: float = CPU_SECONDS_PER_WINDOW,
                 window_seconds: float = WINDOW_SECONDS,
                 spread_seconds: float = SPREAD_SECONDS) -> None:
        self.in_flight = in_flight
        self.cpu_seconds = cpu_seconds
        self.window_seconds = window_seconds
        self.spread_seconds = spread_seconds
        self._tenants: dict[str, _Tenant] = {}
        self._lock = threading.Lock()

    @property
    def limits(self) -> Limits:
        return Limits(self.in_flight, self.cpu_seconds, self.window_seconds,
                      self.spread_seconds)

    def configure(self, limits: Limits) -> None:
        """Take the operator's settings (what was charged so far stays charged)."""
        with self._lock:
            self.in_flight = limits.in_flight
            self.cpu_seconds = limits.cpu_seconds
            self.window_seconds = limits.window_seconds
            self.spread_seconds = limits.spread_seconds

    def admit(self, tenant: str, now: float) -> Deferred | None:
        """None: the render may start (call ``finish`` when it ends); else why not yet."""
        with self._lock:
            state = self._tenants.setdefault(tenant, _Tenant())
            used = self._used(state, now)
            if state.in_flight >= self.in_flight:
                return self._defer(state, now, now, (
                    f"another template of namespace {tenant} is rendering (at most "
                    f"{self.in_flight} at a time per namespace)"))
            if used >= self.cpu_seconds:
                return self._defer(state, now, self._free_at(state), (
                    f"namespace {tenant}'s templates used {used:.1f} s of CPU in the last "
                    f"{self.window_seconds:.0f} s (budget {self.cpu_seconds:g} s); simplify "
                    f"the templates or share one among objects"))
            state.in_flight += 1
            return None

    def finish(self, tenant: str, now: float, cpu_seconds: float) -> None:
        """A render admitted by ``admit`` ended, having used ``cpu_seconds``."""
        with self._lock:
            state = self._tenants.setdefault(tenant, _Tenant())
            state.in_flight = max(0, state.in_flight - 1)
            state.charges.append((now, max(0.0, cpu_seconds)))

    def used(self, tenant: str, now: float) -> float:
        """The tenant's renderer CPU seconds within the window ending at ``now``."""
        with self._lock:
            state = self._tenants.get(tenant)
            return self._used(state, now) if state is not None else 0.0

    def _used(self, state: _Tenant, now: float) -> float:
        while state.charges and state.charges[0][0] <= now - self.window_seconds:
            state.charges.popleft()
        return sum(cpu for _, cpu in state.charges)

    def _free_at(self, state: _Tenant) -> float:
        """When enough charges leave the window for the sum to be below the budget."""
        left = sum(cpu for _, cpu in state.charges)
        for at, cpu in state.charges:
            left -= cpu
            if left < self.cpu_seconds:
                return at + self.window_seconds
        return 0.0

    def _defer(self, state: _Tenant, now: float, free_at: float, reason: str) -> Deferred:
        retry_at = max(free_at, state.next_retry_at, now) + self.spread_seconds
        state.next_retry_at = retry_at
        return Deferred(reason, retry_at - now)
