"""Fault injection: where and how often the engine crashes on purpose.

``Runtime(path, faults=FaultPlan(...))`` makes every instance draw, at each
fault point, whether to fail there. Draws come from the plan's seed and stable
identifiers, so a simulated run with the same plan fails at the same places.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from dopool._errors import ConfigurationError
from dopool._retry import uniform_draw

__all__ = ["FaultPlan"]


@dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """Probabilities, each in [0, 1] (``storage_error`` below 1), of failing at each point.

    Attributes:
        seed: seeds every draw; independent of the runtime's seed.
        crash_before_execute: crash after an attempt's start commits, before ``execute``.
        crash_after_execute: crash after ``execute`` returns, before its outcome commits.
        crash_during_enqueue: crash while an enqueue is written, before it commits
            (the caller gets ``InstanceCrashedError``; nothing is stored).
        alarm_error: an alarm delivery fails before doing anything; it is retried
            after a backoff (2 s, doubling, capped at 60 s) and never dropped, unless
            the pool sets ``alarm_retries`` (then it is given up after that many).
        storage_error: a write transaction fails and is rolled back; the instance crashes.
        crash_during_cancel: crash while a cancel is written, before it commits (the
            caller gets ``InstanceCrashedError``; nothing is cancelled).
        crash_during_fire: crash while instance 0 writes a schedule's fire, before it
            commits (neither the occurrence nor the next fire time is stored: the
            restarted instance fires it again).
    """

    seed: int | str = 0
    crash_before_execute: float = 0.0
    crash_after_execute: float = 0.0
    crash_during_enqueue: float = 0.0
    alarm_error: float = 0.0
    storage_error: float = 0.0
    crash_during_cancel: float = 0.0
    crash_during_fire: float = 0.0

    def __post_init__(self) -> None:
        for spec in fields(self):
            if spec.name == "seed":
                continue
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{spec.name} must be a probability, got {value!r}")
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ConfigurationError(f"{spec.name} must be within [0, 1], got {value!r}")
            object.__setattr__(self, spec.name, float(value))
        if self.storage_error >= 1.0:
            # Recovery writes too: every restart would crash again, for ever.
            raise ConfigurationError("storage_error must be below 1: no write could ever commit")


class FaultInjector:
    """One instance's view of a plan: decides, point by point, whether to fail.

    It outlives the instance's incarnations, so the sequence of draws goes on
    across restarts instead of repeating the draw that just crashed it.
    """

    __slots__ = ("_index", "_plan", "_pool", "_visits", "active")

    def __init__(self, plan: FaultPlan | None, pool: str, index: int) -> None:
        self.active = plan is not None  # False: nothing ever fires, so callers may skip asking
        self._plan = plan
        self._pool = pool
        self._index = index
        self._visits = 0

    def fires(self, point: str) -> bool:
        plan = self._plan
        if plan is None:
            return False
        probability: float = getattr(plan, point)
        if probability <= 0.0:
            return False
        self._visits += 1
        draw = uniform_draw(plan.seed, self._pool, self._index, point, self._visits)
        return draw < probability
