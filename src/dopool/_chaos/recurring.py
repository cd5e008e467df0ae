"""The chaos harness's recurring schedules: defined by steps, removed and settled at the end.

About one seed in four (:data:`~dopool._chaos.scenario.SCHEDULE_SHARE`) defines one or
two schedules on the first pool, at random steps, some defined a second time (the same
definition: it must change nothing). Each occurrence
is a well-behaved event whose id is its schedule's (``sched-<name>``), so the replay
knows its priority and counts its ends like any event's.

At the end, before the last join, each schedule is read and removed (a fault may crash
the removal: it is read again and retried); its occurrences must all have ended
(:class:`~dopool._chaos.history.Fired` tells the replay how many there were), and
every fire time from its first to the one before its next was fired or coalesced,
once: ``fired + coalesced`` is how many fire times passed.
"""

from __future__ import annotations

from typing import Any

from dopool._chaos.history import Fired, History, Resumed
from dopool._chaos.scenario import make_event
from dopool._errors import InstanceCrashedError
from dopool._handles.pool import WorkerPool
from dopool._types import ScheduleInfo

REMOVE_TRIES = 50  # a fault may crash a removal; each try draws again


def ident(name: str) -> str:
    """The event id every occurrence of schedule ``name`` carries."""
    return f"sched-{name}"


def define(
    pool: WorkerPool, args: dict[str, Any], history: History, firsts: dict[str, ScheduleInfo]
) -> None:
    """A ``schedule`` step: define it (a crash raises ``InstanceCrashedError``: nothing
    stored). Defined again, its books must still add up from its first fire."""
    name = args["name"]
    key = args["pk"] if args["pk"] is not None else name
    content = make_event(ident(name), pk=key, prio=args["prio"])
    history.contents.setdefault(ident(name), content)
    info = pool.schedule(
        name, content, every=args["every"], partition_key=args["pk"], priority=args["prio"]
    )
    first = firsts.setdefault(name, info)
    if first is info:  # a new definition is a write: it wakes a stalled instance 0
        history.add(Resumed(0, 1))
    else:  # the same again changes nothing
        _check(info, first, history)


def settle(
    pool: WorkerPool, history: History, firsts: dict[str, ScheduleInfo], after_crash: Any
) -> None:
    """Remove every schedule, each read just before its removal; check its books."""
    for _ in range(REMOVE_TRIES):
        infos = pool.schedules()
        if not infos:
            return
        for info in infos:
            try:
                pool.unschedule(info.name)
            except InstanceCrashedError:
                after_crash()
                break
            _books(info, firsts.get(info.name), history)
    history.problem(f"schedules still defined after {REMOVE_TRIES} removals")


def _books(info: ScheduleInfo, first: ScheduleInfo | None, history: History) -> None:
    history.add(Fired(ident(info.name), info.fired))
    _check(info, first, history)


def _check(info: ScheduleInfo, first: ScheduleInfo | None, history: History) -> None:
    """Every fire time from the first to the one before ``info.next_at`` fired or
    coalesced, once (``every`` is drift-free: fire times are first + k * every)."""
    if first is None or first.next_at is None or info.next_at is None or info.every is None:
        history.problem(f"schedule {info.name!r} was never defined as the harness saw: {info}")
        return
    passed = round((info.next_at - first.next_at) / info.every)
    if info.fired + info.coalesced != passed:
        history.problem(
            f"schedule {info.name!r}: {info.fired} fired and {info.coalesced} coalesced, but "
            f"{passed} fire times passed from t={first.next_at} to its next at t={info.next_at}"
        )
