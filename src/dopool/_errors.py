"""The exceptions dopool raises, and the two a handler may raise.

Every exception derives from :class:`DopoolError`::

    DopoolError
    ├── ConfigurationError     bad options, names, retry values, concurrency changes
    │   ├── DeadlockError      a call between instances that would wait in a cycle
    │   ├── FilterError        a bad dead-letter filter, or a ``where`` predicate that raised
    │   ├── StoreNotFoundError ``dopool.connect`` (or a CLI command): the path holds no store
    │   ├── PoolNotFoundError  ``connection.pool``: the store has no such pool
    │   ├── EventIdError       ``event``/``cancel``: not an event id of this pool
    │   ├── ScheduleDefinitionError a recurring schedule's bad name, ``every`` or ``cron``
    │   └── DeploymentError    dopool.ray: no such deployment, or its hosts could not start
    ├── EventValidationError   not msgpack-encodable, or rejected by the pool's schema
    │   └── ScheduleError      a ``delay`` or ``not_before`` that names no due time, a bad ``ttl``
    ├── EventTooLargeError     encoded event over 128 KiB, partition key over 2 KiB
    ├── StorageItemError       a ``ctx.storage`` key or value refused: nothing buffered
    ├── QueueFullError         an instance already holds ``max_queue_depth`` events
    ├── StoreLockedError       another runtime holds the store directory
    ├── StoreBusyError         a producer waited its bound for the writer lock: nothing written
    ├── PoolClosedError        the runtime (or the connection) was closed
    ├── StorageError           LMDB failed (mapped at the storage boundary)
    │   ├── StoreFormatError   the store's format version is not this version's
    │   ├── StoreDamagedError  the store's data file is missing, empty or truncated
    │   ├── DamagedRecordError a stored record failed its checksum or its layout
    │   └── StoreClosedError   a write after the store closed (an abandoned handler's)
    ├── InstanceCrashedError   the instance died while the call was waiting on it
    ├── InstanceStartError     no thread could be started for an instance (a process limit)
    ├── NotLeasedError         a shared worker's runtime.kill of another's instance
    ├── HostUnavailableError   dopool.ray: an instance's shard host did not answer in time
    ├── SimulationStalledError a wait under virtual time that nothing can end
    ├── PermanentError         raised by a handler: dead-letter this event now
    └── RetryAfter             raised by a handler: retry after exactly ``seconds``

Exceptions carry their data as attributes and build their own message.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from dopool._types import DeadLetter, EnqueueResult


class DopoolError(Exception):
    """Root of every exception dopool raises.

    ``stored`` is set by ``enqueue_many`` when some instances had already
    committed their part of the batch before another one refused.
    """

    stored: Sequence[EnqueueResult] = ()


class ConfigurationError(DopoolError):
    """An option, name or stored configuration is invalid."""


class DeadlockError(ConfigurationError):
    """A call from an instance's thread that would wait in a cycle of instances; not made.

    Attributes:
        cycle: instance ids (``"pool:index"``), the caller's first: each waits
            for the next, and the last for the first.
    """

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = tuple(cycle)
        chain = ", which waits for ".join((*self.cycle[1:], self.cycle[0]))
        super().__init__(
            f"{self.cycle[0]} would wait for {chain}: a deadlock, so the call was not made"
        )


class FilterError(ConfigurationError):
    """A dead-letter filter refused: nothing was listed, redriven or purged.

    Either a value no filter takes (a negative ``older_than``, a ``where`` that
    is not callable), or a ``where`` predicate that raised an ``Exception`` on
    a dead letter (that exception is the ``__cause__``).

    Attributes:
        argument: the filter: ``"error"``, ``"older_than"``, ``"partition_key"``
            or ``"where"``.
        value: the value given.
        reason: what is wrong with it.
        dead_letter: the :class:`DeadLetter` the predicate raised on, else None.
    """

    def __init__(
        self, argument: str, value: Any, reason: str, *, dead_letter: DeadLetter | None = None
    ) -> None:
        self.argument = argument
        self.value = value
        self.reason = reason
        self.dead_letter = dead_letter
        if dead_letter is None:
            message = f"{argument}={shown(value)} refused: {reason}"
        else:
            where = f"instance {dead_letter.instance_index}, sequence {dead_letter.sequence}"
            message = f"the {argument} predicate raised on the dead letter of {where}: {reason}"
        super().__init__(message + "; nothing was selected")


#: The most characters of a handler's failure that are recorded (docs/api.md, "Handler
#: outcomes"): an exception carrying a whole response body would otherwise be stored in the
#: meta record at each retry, in the dead letter, and in every event and trace line.
MAX_ERROR_TEXT = 4096
MAX_TRACEBACK_TEXT = 8192  # characters of a failure's traceback kept, its end


def failed(failure: BaseException) -> str:
    """What a failed attempt records: ``"Type: text"``, cut to ``MAX_ERROR_TEXT`` characters,
    a lone surrogate (a byte ``surrogateescape`` kept) written as its escape: UTF-8, which
    the store and the trace take, has no such character."""
    text = f"{type(failure).__name__}: {failure}"
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= MAX_ERROR_TEXT:
        return text
    return f"{text[:MAX_ERROR_TEXT]}... ({len(text) - MAX_ERROR_TEXT} more characters)"


def failure_traceback(failure: BaseException) -> str:
    """The traceback a failed attempt keeps (a dead letter's, ``pool.event``'s): as Python
    prints it, its last ``MAX_TRACEBACK_TEXT`` characters (the innermost frames and the
    exception) when it is longer, and UTF-8 as :func:`failed`'s text is."""
    text = "".join(traceback.format_exception(failure)).rstrip("\n")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= MAX_TRACEBACK_TEXT:
        return text
    cut = len(text) - MAX_TRACEBACK_TEXT
    return f"({cut} characters of the traceback left out)\n{text[cut:]}"


def shown(value: Any) -> str:
    """``repr(value)``, or its type's name if that raises (the value is the caller's)."""
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"


class StoreNotFoundError(ConfigurationError):
    """The path holds no dopool store (nothing was created there).

    Attributes:
        path: the path given.
        reason: what was found instead.
        waited: the seconds ``dopool.connect(wait=...)`` waited for one (0: none).
    """

    def __init__(self, path: str, reason: str, waited: float = 0.0) -> None:
        self.path = path
        self.reason = reason
        self.waited = waited
        after = f", after waiting {waited:g} s for one" if waited else ""
        super().__init__(
            f"no dopool store at {path!r}: {reason}{after} (a store is created by the first "
            "`dopool worker APP --store PATH`, or `Runtime(PATH)`, opened on it)"
        )


class PoolNotFoundError(ConfigurationError):
    """The store holds no record of a pool: no runtime ever defined it there.

    Attributes:
        path: the store's path.
        pool: the pool's name.
        known: the pools the store does hold, sorted.
    """

    def __init__(self, *, path: str, pool: str, known: Sequence[str]) -> None:
        self.path = path
        self.pool = pool
        self.known = tuple(known)
        listed = ", ".join(repr(name) for name in self.known) or "none"
        super().__init__(
            f"store {path!r} has no pool {pool!r} (pools: {listed}); a runtime that owns the "
            "store defines it"
        )


class EventIdError(ConfigurationError):
    """An event id that is malformed, or names another pool or an instance it does not have.

    Attributes:
        event_id: the id given.
        pool: the pool asked.
        reason: what is wrong with it.
    """

    def __init__(self, *, event_id: object, pool: str, reason: str) -> None:
        self.event_id = event_id
        self.pool = pool
        self.reason = reason
        super().__init__(f"{shown(event_id)} is not an event id of pool {pool!r}: {reason}")


class ScheduleDefinitionError(ConfigurationError):
    """A recurring schedule that cannot be defined (``pool.schedule``); nothing was stored.

    Attributes:
        schedule: the schedule's name as given.
        argument: the argument at fault (``name``, ``every``, ``cron``).
        value: its value.
        reason: what is wrong with it.
    """

    def __init__(self, *, schedule: object, argument: str, value: object, reason: str) -> None:
        self.schedule = schedule
        self.argument = argument
        self.value = value
        self.reason = reason
        super().__init__(f"schedule {shown(schedule)}: {argument}={shown(value)}: {reason}")


class ScenarioError(ConfigurationError):
    """A scenario field is missing, unknown, of the wrong type or out of range.

    Attributes:
        field: the dotted path of the field (``"arrivals.rate"``), or ``""`` for the whole.
        problem: what is wrong with it.
        source: where the scenario came from (a file path, a flag), if known.
    """

    def __init__(self, field: str, problem: str, *, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.source = source
        where = f"{source}: " if source else ""
        name = f"field '{field}'" if field else "scenario"
        super().__init__(f"{where}{name} {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Back from a sweep's worker process: rebuilt from its fields, not its message.
        return (_scenario_error, (self.field, self.problem, self.source))

    def within(self, prefix: str) -> ScenarioError:
        """The same error for a field nested under ``prefix`` (``pauses[0]``)."""
        path = f"{prefix}.{self.field}" if self.field else prefix
        return ScenarioError(path, self.problem, source=self.source)

    def from_source(self, source: str) -> ScenarioError:
        return ScenarioError(self.field, self.problem, source=source)


def _scenario_error(field: str, problem: str, source: str | None) -> ScenarioError:
    return ScenarioError(field, problem, source=source)


class EventValidationError(DopoolError):
    """An event cannot be encoded, or the pool's schema rejected it.

    Attributes:
        reason: what is wrong with the event.
        position: index of the bad event within an ``enqueue_many`` batch, else None.
    """

    def __init__(self, reason: str, *, position: int | None = None) -> None:
        self.reason = reason
        self.position = position
        where = f"event {position} of the batch" if position is not None else "event"
        super().__init__(f"{where} rejected: {reason}")


class ScheduleError(EventValidationError):
    """An enqueue's ``delay`` or ``not_before`` names no due time, or one more than
    ``MAX_DELAY`` ahead; or its ``ttl`` is bad. Nothing was stored.

    Attributes:
        argument: ``"delay"``, ``"not_before"`` or ``"ttl"``.
        value: the value given.
        reason: what is wrong with it.
    """

    def __init__(self, argument: str, value: Any, reason: str) -> None:
        self.argument = argument
        self.value = value
        self.reason = reason
        self.position = None  # one value for the whole call, never one event's
        DopoolError.__init__(self, f"{argument}={shown(value)} refused: {reason}")


class EventTooLargeError(DopoolError):
    """An encoded event or a partition key is over its size limit.

    Attributes:
        what: ``"event"`` or ``"partition_key"``.
        size: its size in bytes.
        limit: the limit in bytes.
        position: index within an ``enqueue_many`` batch, else None.
    """

    def __init__(self, what: str, *, size: int, limit: int, position: int | None = None) -> None:
        self.what = what
        self.size = size
        self.limit = limit
        self.position = position
        where = f" (event {position} of the batch)" if position is not None else ""
        super().__init__(f"{what} is {size} bytes, over the limit of {limit} bytes{where}")


class StorageItemError(DopoolError):
    """A key or value refused by an instance's storage (``ctx.storage``): not a str key,
    a value msgpack cannot encode, or over its size limit. Nothing was buffered.

    Attributes:
        what: ``"key"`` or ``"value"``.
        key: the key it was given for (the value given, if not a str key).
        reason: what is wrong.
        size: the encoded size in bytes, when the limit is the problem, else None.
        limit: that limit in bytes, else None.
    """

    def __init__(
        self,
        what: str,
        key: object,
        reason: str,
        *,
        size: int | None = None,
        limit: int | None = None,
    ) -> None:
        self.what = what
        self.key = key
        self.reason = reason
        self.size = size
        self.limit = limit
        named = shown(key)
        named = named if len(named) <= 80 else f"{named[:77]}..."
        super().__init__(f"storage {what} for key {named} refused: {reason}")


class QueueFullError(DopoolError):
    """The instance an event was routed to already holds ``max_queue_depth`` events."""

    def __init__(
        self, *, pool: str, instance_index: int, depth: int, max_depth: int, incoming: int = 1
    ) -> None:
        self.pool = pool
        self.instance_index = instance_index
        self.depth = depth
        self.max_depth = max_depth
        self.incoming = incoming
        where = f"instance {instance_index} of pool {pool!r}"
        if incoming == 1:
            message = f"{where} is full ({depth}/{max_depth})"
        else:
            message = f"{where} cannot take {incoming} more events ({depth}/{max_depth} pending)"
        super().__init__(message)


class StoreLockedError(DopoolError):
    """Another runtime, in this process or another, holds the store directory."""

    def __init__(self, *, path: str, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(f"store {path!r} is locked by {holder}")


class StoreBusyError(DopoolError):
    """Another process held the store's writer lock for longer than the caller waits
    (``dopool.connect(lock_timeout=)``); nothing of the call was written.

    Attributes:
        path: the store directory.
        waited: the seconds this call waited.
        pid: the process holding the lock, if it is known.
        held_for: how long it has held it, in seconds, if that is known.
    """

    def __init__(
        self, *, path: str, waited: float, pid: int | None, held_for: float | None
    ) -> None:
        self.path = path
        self.waited = waited
        self.pid = pid
        self.held_for = held_for
        who = "another process" if pid is None else f"process {pid}"
        since = f"at least {waited:.1f}" if held_for is None else f"{held_for:.1f}"
        super().__init__(
            f"store {path!r} is busy: {who} has held its writer lock for {since} s (a "
            f"process stopped or frozen while writing, or a very large write); gave up "
            f"after waiting {waited:.1f} s, and nothing was written"
        )


class PoolClosedError(DopoolError):
    """The pool's runtime, or the connection a producer's pool came from, has been closed.

    Attributes:
        pool: the pool's name.
        closed: what was closed: ``"runtime"`` or ``"connection"``.
    """

    def __init__(self, pool: str, *, closed: str = "runtime") -> None:
        self.pool = pool
        self.closed = closed
        super().__init__(f"pool {pool!r} is closed: its {closed} was closed")


class StorageError(DopoolError):
    """The storage engine failed; the write in progress was rolled back."""


class StoreClosedError(StorageError):
    """The store was closed before this write: nothing of it was committed.

    Only an instance abandoned at exit meets it (its handler returned after the
    runtime closed its store); the next open counts that attempt as interrupted.
    """

    def __init__(self) -> None:
        super().__init__("the store is closed")


class StoreFormatError(StorageError):
    """The store records a format version this version of dopool does not read.

    Nothing in the store was changed. ``found`` is None for a store written
    before format versions were recorded. A runtime migrates a store of an older
    format it knows when it opens it; read-only tools refuse one (``migrates``:
    the message says so).
    """

    def __init__(
        self, *, path: str, found: int | None, supported: int, migrates: bool = False
    ) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        version = "no format version" if found is None else f"format version {found}"
        message = (
            f"store {path!r} has {version}; this version of dopool reads format {supported} only"
        )
        if migrates:
            message += " (a Runtime of this version migrates it in place when it opens it)"
        super().__init__(message)


class StoreDamagedError(StorageError):
    """The store's data file is missing, empty or truncated: refused, not recreated."""

    def __init__(self, *, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"store {path!r} is damaged: {reason}")


class DamagedRecordError(StorageError):
    """A stored record failed its checksum or does not have its documented layout.

    Attributes:
        key: the record's key.
        value: the stored bytes, as found.
        reason: what is wrong with them.
        what: which record it is, in words (``"meta record of instance p:0"``).
    """

    def __init__(self, *, key: bytes, value: bytes, reason: str, what: str = "record") -> None:
        self.key = key
        self.value = value
        self.reason = reason
        self.what = what
        super().__init__(f"damaged {what}: {reason} (key {key!r})")


class InstanceCrashedError(DopoolError):
    """The instance died before it answered the call; nothing of the call was committed."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"instance {instance_id} crashed before answering")


class InstanceStartError(DopoolError):
    """The runtime could not start an instance's thread (the process's thread limit, or
    memory for its stack): nothing of the call was stored. ``Runtime(max_active=)``
    bounds the threads instances use.

    Attributes:
        instance_id: the instance, ``"pool:index"``.
        reason: what starting the thread raised.
    """

    def __init__(self, instance_id: str, reason: str) -> None:
        self.instance_id = instance_id
        self.reason = reason
        super().__init__(
            f"could not start a thread for instance {instance_id} ({reason}); lower "
            "Runtime(max_active=), or raise the process's thread limit"
        )


class NotLeasedError(DopoolError):
    """A ``runtime.kill`` of an instance that another worker process serves (a shared
    runtime's); the pool's calls on it (enqueue, pause, cancel, redrive, schedule, ...)
    are made in the store.

    Attributes:
        instance_id: the instance, ``"pool:index"``.
    """

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(
            f"instance {instance_id} is served by another worker process (it holds its "
            "lease): not this process's to crash"
        )


class DeploymentError(ConfigurationError):
    """A Ray deployment (``dopool.ray``) that cannot be used: none of that name is
    running (``connect``), one of that name already runs, or a shard host could not
    start (``deploy``: nothing is left running).

    Attributes:
        name: the deployment's name.
        reason: what is wrong.
    """

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"Ray deployment {name!r}: {reason}")


class HostUnavailableError(DopoolError):
    """A ``dopool.ray`` producer's call whose shard host did not answer within the
    producer's ``timeout``: its actor was dead or restarting, or its node gone, on every
    try. The call may have been stored by a try whose answer never came, or not at all:
    enqueue it again with the same dedup key to be sure.

    Attributes:
        pool: the pool's name.
        instance: the instance the call went to.
        node_id: the Ray node its host is pinned to.
        waited: seconds the producer tried for.
    """

    def __init__(self, *, pool: str, instance: int, node_id: str, waited: float) -> None:
        self.pool = pool
        self.instance = instance
        self.node_id = node_id
        self.waited = waited
        super().__init__(
            f"instance {instance} of pool {pool!r}: its shard host on node {node_id} did not "
            f"answer within {waited:.1f}s"
        )


class SimulationStalledError(DopoolError):
    """Under a simulated clock's greenlet backend: a wait that no actor can end.

    Nothing can run, and what the caller waits for has not happened: either the
    actors wait for each other (a deadlock), or the answer needs virtual time to
    move (an instance asleep in ``ctx.sleep``) while nobody drives the clock.
    Under OS threads the same wait would hang for ever.

    Attributes:
        cause: who waits for what (``"the caller waits for the answer of p:0"``).
        waits: each actor that waits, and what for: ``(actor id, what)``.
        notes: what else the clock knows (sleepers, its next scheduled time).
    """

    def __init__(
        self, cause: str, waits: Sequence[tuple[str, str]] = (), notes: Sequence[str] = ()
    ) -> None:
        self.cause = cause
        self.waits = tuple(waits)
        self.notes = tuple(notes)
        parts = [f"{who} waits for {what}" for who, what in self.waits]
        message = f"nothing can run and {cause}"
        if parts:
            message += "; " + "; ".join(parts)
        if self.notes:
            message += "; " + "; ".join(self.notes)
        super().__init__(message)


class PermanentError(DopoolError):
    """Raise from a handler to dead-letter the current event without retrying it."""


#: The longest delay before a retry, in seconds (365 days): a ``RetryPolicy`` may
#: not ask for more, and ``RetryAfter`` is clamped to it.
MAX_DELAY = 365 * 24 * 3600.0


class RetryAfter(DopoolError):
    """Raise from a handler to retry the current event after exactly ``seconds``.

    ``seconds`` may be a :class:`~datetime.timedelta`. The attempt still counts
    against ``max_attempts``. A delay over ``MAX_DELAY`` (365 days) is clamped to it.

    Attributes:
        seconds: the delay, in seconds, at most ``MAX_DELAY``.
        requested: the delay asked for, in seconds.
    """

    def __init__(self, seconds: float | timedelta) -> None:
        requested = as_seconds(seconds, "RetryAfter seconds")
        if not math.isfinite(requested) or requested < 0:
            raise ConfigurationError(f"RetryAfter needs a finite delay >= 0, got {requested!r}")
        self.requested = requested
        self.seconds = min(requested, MAX_DELAY)
        message = f"retry after {self.seconds:g} s"
        if requested > MAX_DELAY:
            message += f" (the maximum; {requested:g} s asked)"
        super().__init__(message)


def as_seconds(value: Any, name: str) -> float:
    """Accept a number or a ``timedelta`` and return seconds as a float."""
    total = getattr(value, "total_seconds", None)
    if callable(total):
        return float(total())
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be seconds or a timedelta, got {shown(value)}")
    try:
        return float(value)
    except OverflowError:  # an int past a float's range
        raise ConfigurationError(f"{name} is too large to be a number of seconds") from None
