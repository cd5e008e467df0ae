"""The alarm slot: where it points, and what a failed delivery does (retry, or give up).

An alarm delivery can fail before it does anything (the ``alarm_error`` fault of
:class:`dopool.chaos.FaultPlan`). What follows is the pool's ``alarm_retries``
option (docs/api.md, "WorkerPool.define"):

- ``None``, the default: the delivery is retried for ever, after 2 s, doubling,
  at most 60 s apart.
- ``n``: Cloudflare Durable Objects' rule for a failing ``alarm()`` handler
  (https://developers.cloudflare.com/durable-objects/api/alarms/: exponential
  backoff from 2 s, up to 6 retries). A failed delivery is retried after 2 s,
  doubling (2, 4, 8, ... s; no cap below ``MAX_DELAY``), at most ``n`` times.
  When the last retry fails too (``n + 1`` failures in a row), the alarm is
  given up: the slot is cleared and the instance is *stalled*, starting nothing
  although events are pending, until a write sets an alarm again.

The meta record counts the failures in a row (``alarm_failures``). A stalled
instance is one whose count is above zero while its alarm slot is empty. Nothing
else leaves that state: a failure that is retried sets the slot, and whatever
clears the slot otherwise (an attempt's start, a pause, an empty queue) clears
the count too, unless the instance is stalled already. So a stall reads the same
from the record alone, offline, without the pool's options (:func:`stalled`),
and it is as durable as the record: a restart's recovery and a reopened store
keep it (a restart sets no alarm on Cloudflare either). A write ends it
(:func:`wake`): an enqueue, a follow-up delivered, a redrive, a resume.
"""

from __future__ import annotations

import math

from dopool._errors import MAX_DELAY
from dopool._store.layout import Meta

ALARM_RETRY_FIRST = 2.0  # seconds before the first retry of a failed alarm delivery; doubles
ALARM_RETRY_MAX = 60.0  # the cap between retries when they never stop (alarm_retries=None)
MAX_ALARM_RETRIES = 1000  # the largest alarm_retries a pool accepts
# 2 s doubled this often is past both caps: a longer run of failures waits no longer,
# and no float overflows however long it runs.
_MAX_DOUBLINGS = 32


def rearm(meta: Meta, now: float) -> None:
    """Point the alarm slot where the committed state needs it: at the instance's earliest
    due work, its next start, its next scheduled event (:mod:`dopool._machine.delayed`) or
    its next schedule fire (instance 0's: :mod:`dopool._machine.recurring`).

    A paused instance has no alarm: it starts nothing, fires nothing, and moves the
    scheduled events that fell due meanwhile when it next looks for work. A stalled
    instance stays so, paused or not, and through a recovery: only :func:`wake` (a
    write) or an empty queue ends a stall.
    """
    if meta.paused or meta.pending == 0:
        if meta.pending == 0 or not stalled(meta):
            meta.alarm_failures = 0
        meta.alarm = None if meta.paused else meta.next_fire
        return
    if stalled(meta):
        return
    if meta.current is not None and meta.retry_at is not None:
        due = meta.retry_at  # a retry's backoff is never shortened
    elif meta.pending == meta.scheduled:
        due = math.inf  # nothing is due: the next scheduled event is (below)
    elif meta.alarm is not None and meta.alarm <= now:
        due = meta.alarm  # already due: keep it
    else:
        due = now
    throttled = meta.throttled_until
    if throttled is not None and due < throttled:
        due = throttled  # no token of the pool's rate limit until then
    if meta.next_due is not None and meta.next_due < due:
        due = meta.next_due
    if meta.next_fire is not None and meta.next_fire < due:
        due = meta.next_fire
    if meta.alarm_failures and meta.alarm is not None:
        due = max(due, meta.alarm)  # nor is a failing alarm's backoff
    meta.alarm = due


def wake(meta: Meta) -> bool:
    """End a stall, with a fresh retry budget; whether it was stalled.

    For a write that sets an alarm (an enqueue, a follow-up, a redrive, a
    resume): its :func:`rearm` then sets the alarm.
    """
    if stalled(meta):
        meta.alarm_failures = 0
        return True
    return False


def delivery_failed(meta: Meta, now: float, retries: int | None) -> str | None:
    """A due alarm's delivery failed: retry it later, or give it up.

    Returns the ``alarm_given_up`` event's error if this failure was the last
    one ``retries`` allows.
    """
    meta.alarm_failures += 1
    failures = meta.alarm_failures
    if retries is not None and failures > retries:
        meta.alarm = None  # the instance is stalled
        tries = (
            "on its first try, no retry allowed"
            if failures == 1
            else f"{failures} times in a row (the first try and {failures - 1} retries)"
        )
        return f"alarm delivery failed {tries}: given up until a write sets the alarm again"
    meta.alarm = now + retry_delay(failures, retries)
    return None


def retry_delay(failures: int, retries: int | None) -> float:
    """Seconds before the retry after failure number ``failures`` (1-based) in a row."""
    doubled = ALARM_RETRY_FIRST * 2.0 ** min(failures - 1, _MAX_DOUBLINGS)
    if retries is None:
        return min(doubled, ALARM_RETRY_MAX)
    return min(doubled, MAX_DELAY)


def stalled(meta: Meta) -> bool:
    """The instance gave its alarm up: nothing starts until a write sets one."""
    return meta.alarm is None and meta.alarm_failures > 0
