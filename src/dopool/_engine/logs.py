"""What an instance tells an operator through :mod:`logging` (docs/deployment.md, "Logs").

Three loggers under ``dopool``, each record logged once its transaction has committed:

- ``dopool.attempts``: a failed attempt that will be retried, at WARNING, with its
  traceback; a success at DEBUG.
- ``dopool.dead_letters``: a failed attempt that dead-lettered its event, at ERROR, with
  its traceback (one record per failed attempt in all: the last is this one).
- ``dopool.instances``: a crash, at ERROR; the instance is restarted at once, or after
  a backoff the record names when it crashed several times in a row.

Each record carries its fields in ``record.dopool``, a dict (``event_id``, ``pool``,
``instance``, ``attempt``, ...), for a structured formatter such as ``dopool worker
--log-format json``'s (:mod:`dopool._ops.logs`).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dopool._errors import failed

ATTEMPTS = logging.getLogger("dopool.attempts")
DEAD_LETTERS = logging.getLogger("dopool.dead_letters")
INSTANCES = logging.getLogger("dopool.instances")


def attempt_failed(
    instance_id: str,
    sequence: int,
    attempt: int,
    failure: BaseException,
    retry_at: float | None,
    trace: str,
) -> None:
    """Attempt ``attempt`` of event ``sequence`` failed with ``failure``: retried at
    ``retry_at``, or (None) dead-lettered. ``trace`` is its traceback as kept (UTF-8).

    The record carries the exception (``exc_info``), which formatters and error trackers
    read, unless its traceback holds text UTF-8 cannot (a lone surrogate: a handler given
    ``surrogateescape`` text). That text would make a strict handler drop the line, so
    the message carries ``trace`` instead, its escapes in place."""
    logger = DEAD_LETTERS if retry_at is None else ATTEMPTS
    if not logger.isEnabledFor(logging.ERROR if retry_at is None else logging.WARNING):
        return
    fields = _fields(instance_id, sequence, attempt)
    error = failed(failure)
    exc_info = None
    try:
        "".join(traceback.format_exception(failure)).encode()
        exc_info = (type(failure), failure, failure.__traceback__)
        tail = ""
    except UnicodeEncodeError:
        tail = f"\n{trace}"
    if retry_at is None:
        DEAD_LETTERS.error(
            "event %s dead-lettered after attempt %d: %s%s",
            fields["event_id"],
            attempt,
            error,
            tail,
            exc_info=exc_info,
            extra={"dopool": {**fields, "error": error}},
        )
    else:
        ATTEMPTS.warning(
            "event %s failed attempt %d, retried at %.3f: %s%s",
            fields["event_id"],
            attempt,
            retry_at,
            error,
            tail,
            exc_info=exc_info,
            extra={"dopool": {**fields, "error": error, "retry_at": retry_at}},
        )


def attempt_succeeded(instance_id: str, sequence: int, attempt: int) -> None:
    """Attempt ``attempt`` of event ``sequence`` succeeded (DEBUG: one a success)."""
    if ATTEMPTS.isEnabledFor(logging.DEBUG):
        fields = _fields(instance_id, sequence, attempt)
        ATTEMPTS.debug(
            "event %s succeeded on attempt %d",
            fields["event_id"],
            attempt,
            extra={"dopool": fields},
        )


def instance_crashed(instance_id: str, reason: str, restart_in: float | None) -> None:
    """The instance crashed (``reason``); its restart is held back ``restart_in`` s, if any."""
    fields = {**_where(instance_id), "reason": reason}
    if restart_in is None:
        INSTANCES.error("instance %s crashed: %s", instance_id, reason, extra={"dopool": fields})
    else:
        INSTANCES.error(
            "instance %s crashed: %s; its restart held back %g s (crashes in a row)",
            instance_id,
            reason,
            restart_in,
            extra={"dopool": {**fields, "restart_in": restart_in}},
        )


def _fields(instance_id: str, sequence: int, attempt: int) -> dict[str, Any]:
    return {
        "event_id": f"{instance_id}:{sequence}",
        **_where(instance_id),
        "sequence": sequence,
        "attempt": attempt,
    }


def _where(instance_id: str) -> dict[str, Any]:
    pool, _, index = instance_id.rpartition(":")
    return {"pool": pool, "instance": int(index)}


def leave_out(
    failures: tuple[type[BaseException], ...] | None = None, *, crashes: bool = True
) -> Callable[[], None]:
    """Leave out the records of what a simulation or a chaos run plans, until the function
    returned is called: the failed attempts whose exception is one of ``failures`` (None:
    every one) and, with ``crashes``, every crash (its faults and kills are injected): the
    run's own report, trace and dead letters tell them."""

    def kept(record: logging.LogRecord) -> bool:
        if record.name == INSTANCES.name:
            return not crashes
        if failures is None:
            return False
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, failures)

    loggers = (ATTEMPTS, DEAD_LETTERS, INSTANCES)
    for logger in loggers:
        logger.addFilter(kept)

    def remove() -> None:
        for logger in loggers:
            logger.removeFilter(kept)

    return remove


@contextmanager
def modelled(failures: tuple[type[BaseException], ...] | None = None) -> Iterator[None]:
    """:func:`leave_out` ``failures`` and every crash while it lasts."""
    remove = leave_out(failures)
    try:
        yield
    finally:
        remove()
