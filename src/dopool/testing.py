"""What your own tests of code that uses dopool need: virtual time, planned faults, one
handler run alone, checks of a pool's state, and pytest fixtures.

``SimulatedClock`` runs a runtime in virtual time (``Runtime.simulated`` makes one with
it), ``FaultPlan`` crashes its instances at seeded places, and a simulation that can
no longer move raises ``SimulationStalledError``. The same names stay importable where
they were (``dopool.SimulatedClock``, ``dopool.chaos.FaultPlan``,
``dopool.SimulationStalledError``): these are the same objects.

:func:`run_handler` runs one handler against one event without a runtime, through the
engine's own context (:class:`~dopool.EventContext`), validation and storage, and
returns a :class:`HandlerRun`; the ``assert_*`` functions check a pool's committed
state and say what they found when it is not what was expected.

This module is also a pytest plugin: installing dopool registers it (the ``pytest11``
entry point ``dopool.testing``), so a project's tests get the ``dopool_*`` fixtures
without a ``conftest.py``, and ``pytest -p dopool.testing`` names it explicitly. It
imports without pytest: the fixtures are defined only where pytest imports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from dopool._clock.clocks import SimulatedClock
from dopool._clock.loops import run_virtual
from dopool._engine.context import EventContext
from dopool._engine.storage import Storage
from dopool._errors import (
    ConfigurationError,
    PermanentError,
    SimulationStalledError,
    shown,
)
from dopool._handles.pool import WorkerPool
from dopool._handles.runtime import Runtime
from dopool._machine.types import Item
from dopool._machine.validation import check_pool_name, prepare
from dopool._pools import Pool
from dopool._store.layout import Namespace, StoredRecord, StoredValues, unpack
from dopool._store.txn import Txn
from dopool._types import PoolStatus
from dopool._usercode import check_handler, ran
from dopool.chaos import FaultPlan

__all__ = [
    "FaultPlan",
    "FollowUp",
    "HandlerRun",
    "SimulatedClock",
    "SimulationStalledError",
    "assert_dead_letters",
    "assert_paused",
    "assert_pending",
    "assert_succeeded",
    "run_handler",
]

Handler = Callable[[EventContext], Any]


# -- one handler, one event, no runtime ---------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowUp:
    """A follow-up a handler sent with ``ctx.enqueue``, as it would commit.

    Attributes:
        event: the event as its handler will see it (validated, encoded and decoded:
            tuples come back as lists).
        pool: the pool it goes to (the handler's own pool's name if ``pool`` was not given).
        partition_key, priority: as given.
        delay: seconds after the parent's success commits, or None.
        not_before: the clock time it is due at, or None.
    """

    event: Any
    pool: str
    partition_key: str | None = None
    priority: int = 0
    delay: float | None = None
    not_before: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerRun:
    """What one :func:`run_handler` call saw the handler do.

    Attributes:
        returned: what the handler returned (None if it raised).
        error: the exception it raised, or None.
        follow_ups: the follow-ups its success commits; none if it raised (the engine
            discards a failed attempt's follow-ups).
        storage: the instance's stored values after the attempt, decoded: the values
            given with the handler's writes over them, or, if it raised, the values given
            (the engine discards a failed attempt's writes).
        slept: the virtual seconds it waited in ``ctx.sleep`` (an async handler: on its
            loop's timers), in all.
    """

    returned: Any
    error: BaseException | None
    follow_ups: list[FollowUp] = field(default_factory=list)
    storage: dict[str, Any] = field(default_factory=dict)
    slept: float = 0.0

    @property
    def succeeded(self) -> bool:
        """Whether the handler returned without raising."""
        return self.error is None

    def raise_error(self) -> None:
        """Raise the handler's exception, if it raised one (its traceback from the
        handler's frame on), so a test that expected success fails with it."""
        if self.error is not None:
            raise self.error


def run_handler(
    handler: Handler,
    event: Any,
    *,
    pool: str = "test",
    partition_key: str | None = None,
    priority: int = 0,
    attempt: int = 1,
    instance_index: int = 0,
    storage: Mapping[str, Any] | None = None,
    schema: Callable[[Any], Any] | None = None,
) -> HandlerRun:
    """Run ``handler`` once against ``event``, without a runtime, as an instance would.

    The event is validated as ``enqueue`` validates it (with ``schema``, if given) and
    goes through msgpack as the store keeps it, so the handler sees lists for tuples.
    Its context is the engine's: ``sequence`` 0, ``instance_id`` ``"<pool>:<index>"``,
    times of a virtual clock that starts at 0.0 and that ``ctx.sleep`` moves. An
    ``async def`` handler runs to its end on an event loop in that virtual time, as under
    a simulated runtime: ``await asyncio.sleep`` and ``ctx.sleep_async`` move it. Its
    follow-ups are validated as ``ctx.enqueue`` validates them (one for another pool
    without that pool's schema or concurrency, which no runtime here knows). Its storage
    holds ``storage``'s values (a copy: the mapping given is not changed).

    Any exception the handler raises, ``SystemExit`` included, is caught, as the
    engine catches it, and returned in ``HandlerRun.error``; ``KeyboardInterrupt`` is
    raised again, so Ctrl-C still stops the test run.

    Raises:
        ConfigurationError: ``handler`` is neither a plain callable nor an ``async def``
            (a generator function, say),
            a bad ``pool`` name, ``attempt`` or ``instance_index``, or a ``storage``
            that is not a mapping.
        EventValidationError, EventTooLargeError: the event, its partition key or
            priority, as ``enqueue`` raises them.
        StorageItemError: a key or value of ``storage`` that ``ctx.storage.put`` refuses.
    """
    is_async = check_handler(handler, "handler")
    check_pool_name(pool)
    if type(attempt) is not int or attempt < 1:
        raise ConfigurationError(f"attempt must be an int >= 1, got {shown(attempt)}")
    if type(instance_index) is not int or instance_index < 0:
        raise ConfigurationError(f"instance_index must be an int >= 0, got {shown(instance_index)}")
    held = _held(storage, pool, instance_index)

    def prepare_own(event: Any, partition_key: str | None, priority: int) -> Item:
        return prepare(event, partition_key=partition_key, priority=priority, schema=schema)

    item = prepare_own(event, partition_key, priority)
    clock = _VirtualClock()
    ctx = EventContext(
        event=unpack(item.event),
        sequence=0,
        attempt=attempt,
        enqueued_at=clock.now,
        started_at=clock.now,
        instance_index=instance_index,
        instance_id=f"{pool}:{instance_index}",
        pool_name=pool,
        partition_key=item.partition_key,
        priority=item.priority,
        _prepare=prepare_own,
        _sleep=clock.sleep,
        _target=_targets(pool),
        _now=clock.read,
        _open_storage=lambda: _HeldStorage(held, pool, instance_index),
        _async=is_async,
    )
    returned: Any = None
    error: BaseException | None = None
    try:
        if is_async:  # on a loop in the virtual time of ``clock``, as a simulated runtime's
            returned, error = run_virtual(partial(handler, ctx), clock.read, clock.sleep)
            if isinstance(error, KeyboardInterrupt):
                raise error
        else:
            returned = handler(ctx)
        if returned is not None:  # a coroutine returned without running: the engine's error
            ran(returned, "the handler", PermanentError)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too, as the engine catches it
        returned, error = None, exc
        if exc.__traceback__ is not None:  # from the handler's frame on, not ours
            exc.__traceback__ = exc.__traceback__.tb_next
    sent, writes, _rows = ctx._end()
    if error is not None:  # (an async handler's traceback starts in the handler already)
        return HandlerRun(returned=None, error=error, storage=_decoded(held), slept=clock.slept)
    for key, raw in writes.items():
        if raw is None:
            held.pop(key, None)
        else:
            held[key] = raw
    follow_ups = [
        FollowUp(
            event=unpack(follow_up.event),
            pool=pool if target is None else target.name,
            partition_key=follow_up.partition_key,
            priority=follow_up.priority,
            delay=follow_up.delay,  # from the commit: set on the Item, due only then
            not_before=follow_up.due,
        )
        for follow_up, target in sent
    ]
    return HandlerRun(
        returned=returned,
        error=None,
        follow_ups=follow_ups,
        storage=_decoded(held),
        slept=clock.slept,
    )


class _VirtualClock:
    """The time a handler run alone sees: 0.0 at its start, moved only by ``ctx.sleep``."""

    __slots__ = ("now", "slept")

    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def read(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        at = self.now + seconds
        if not math.isfinite(at):  # as a SimulatedClock refuses it
            raise ConfigurationError(f"ctx.sleep({seconds:g}) would wake past any clock time")
        self.now = at
        self.slept += seconds


@dataclass(frozen=True, slots=True)
class _OtherPool:
    """Another pool a follow-up names (a ``Target``): checked as a pool without a schema."""

    name: str

    @property
    def prepare(self) -> Callable[[Any, str | None, int], Item]:
        def checked(event: Any, partition_key: str | None, priority: int) -> Item:
            return prepare(event, partition_key=partition_key, priority=priority, schema=None)

        return checked

    @property
    def route(self) -> Callable[[str | None], int]:
        return _first


def _first(_partition_key: str | None) -> int:
    return 0


def _targets(own: str) -> Callable[[object], _OtherPool | None]:
    """``ctx.enqueue(pool=...)``'s lookup for a handler of pool ``own``: None for its own
    pool, any valid name (or a WorkerPool's) for another, as the engine's refuses the rest."""

    def target(pool: object) -> _OtherPool | None:
        if isinstance(pool, WorkerPool):
            name = pool.name
        elif isinstance(pool, str):
            name = check_pool_name(pool)
        else:
            raise ConfigurationError(
                f"ctx.enqueue: pool must be None, a pool name or a WorkerPool, got {shown(pool)}"
            )
        return None if name == own else _OtherPool(name)

    return target


class _HeldValues(StoredValues):
    """An instance's stored values held in a dict (key -> msgpack), not in a store: what
    :class:`Storage` reads under ``ctx.storage`` in :func:`run_handler`."""

    __slots__ = ("_held",)

    def __init__(self, held: dict[str, bytes], pool: str, index: int) -> None:
        super().__init__(Namespace(pool, index))
        self._held = held

    def get(self, txn: Txn, key: str) -> bytes | None:
        return self._held.get(key)

    def items(
        self, txn: Txn, prefix: str = "", start: str | None = None, end: str | None = None
    ) -> Iterator[StoredRecord]:
        # A str's order is its code points', which is its UTF-8 bytes' (the store's).
        low = prefix if start is None or start < prefix else start
        for key in sorted(self._held):
            if end is not None and key >= end:
                return
            if key >= low and key.startswith(prefix):
                yield StoredRecord(key, self._held[key])


class _HeldStorage(Storage):
    """The engine's ``ctx.storage`` (buffered writes, checks, listing) over held values."""

    __slots__ = ()

    def __init__(self, held: dict[str, bytes], pool: str, index: int) -> None:
        super().__init__(_no_transaction, pool, index)
        self._values = _HeldValues(held, pool, index)


def _no_transaction() -> AbstractContextManager[None]:
    return nullcontext()


def _held(values: Mapping[str, Any] | None, pool: str, index: int) -> dict[str, bytes]:
    """``values`` encoded as ``ctx.storage.put`` encodes them, checked as it checks them."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ConfigurationError(
            f"storage must be a mapping of keys to values or None, got {shown(values)}"
        )
    writer = _HeldStorage({}, pool, index)
    writer.put_many(values)
    return {key: raw for key, raw in writer._end().items() if raw is not None}


def _decoded(held: dict[str, bytes]) -> dict[str, Any]:
    return {key: unpack(held[key]) for key in sorted(held)}


# -- a pool's state ------------------------------------------------------------------------


def assert_pending(pool: Pool, expected: int, *, index: int | None = None) -> None:
    """Assert that the pool (or instance ``index``) holds ``expected`` pending events.

    Raises:
        AssertionError: another count; the message shows each instance's state and counts.
    """
    _check_count(pool, "pending", expected, index)


def assert_succeeded(pool: Pool, expected: int, *, index: int | None = None) -> None:
    """Assert that ``expected`` events of the pool (or of instance ``index``) succeeded.

    Raises:
        AssertionError: another count; the message shows each instance's state and counts.
    """
    _check_count(pool, "succeeded", expected, index)


def assert_dead_letters(
    pool: Pool,
    expected: int,
    *,
    error: str | re.Pattern[str] | None = None,
    index: int | None = None,
) -> None:
    """Assert that the pool (or instance ``index``) holds ``expected`` dead letters, or
    that many whose error ``error`` matches (the ``error`` filter of ``dead_letters``: a
    substring, or a compiled pattern's ``search``).

    Raises:
        AssertionError: another count; the message lists every dead letter held.
    """
    if error is None:
        chosen = held = pool.dead_letters(index=index)
    else:
        chosen, held = pool.dead_letters(index=index, error=error), pool.dead_letters(index=index)
    if len(chosen) == expected:
        return
    matching = "" if error is None else f" whose error matches {_pattern(error)}"
    listed = "; ".join(
        f"instance {dead.instance_index} sequence {dead.sequence}: {dead.error!r}"
        for dead in held[:_SHOWN]
    )
    more = f"; and {len(held) - _SHOWN} more" if len(held) > _SHOWN else ""
    raise AssertionError(
        f"{_where(pool, index)}: expected {expected} dead letter(s){matching}, found "
        f"{len(chosen)}; held: {listed or 'none'}{more}"
    )


def assert_paused(pool: Pool, index: int | None = None) -> None:
    """Assert that the pool is paused as a whole (``pause()``), or that instance ``index``
    is (its state is ``"paused"``).

    Raises:
        AssertionError: it is not; the message shows each instance's state.
    """
    if index is None:
        status = pool.status()
        if not status.paused:
            raise AssertionError(
                f"pool {pool.name!r} is not paused as a whole; {_instances(status)}"
            )
        return
    status = pool.status(instances=[index])
    state = status.instance(index).state
    if state != "paused":
        raise AssertionError(f"{_where(pool, index)} is not paused: it is {state!r}")


#: The instances or dead letters a failed assertion lists at most.
_SHOWN = 10


def _check_count(pool: Pool, counter: str, expected: int, index: int | None) -> None:
    status = pool.status() if index is None else pool.status(instances=[index])
    counted = status if index is None else status.instance(index)
    found: int = getattr(counted, counter)
    if found != expected:
        raise AssertionError(
            f"{_where(pool, index)}: expected {expected} {counter}, found {found}; "
            f"{_instances(status)}"
        )


def _where(pool: Pool, index: int | None) -> str:
    return f"pool {pool.name!r}" if index is None else f"instance {pool.name}:{index}"


def _instances(status: PoolStatus) -> str:
    """Each instance listed, as a failed assertion shows it."""
    shown_ = [
        f"{one.index} {one.state} (pending {one.pending}, succeeded {one.succeeded}, "
        f"dead-lettered {one.dead_lettered})"
        for one in status.instances[:_SHOWN]
    ]
    more = len(status.instances) - _SHOWN
    if more > 0:
        shown_.append(f"and {more} more")
    return "instances: " + ("; ".join(shown_) if shown_ else "none used")


def _pattern(error: str | re.Pattern[str]) -> str:
    return repr(error) if isinstance(error, str) else f"re.compile({error.pattern!r})"


# -- the pytest plugin ---------------------------------------------------------------------

#: Wall-clock seconds a fixture's runtime waits for handlers still running when the test
#: ends; one still running then is abandoned (``runtime.close(timeout=...)``).
CLOSE_TIMEOUT = 10.0


try:
    import pytest
except ImportError:  # no pytest: the helpers above, without fixtures
    pass
else:

    @pytest.fixture
    def dopool_seed() -> int | str:
        """The seed of ``dopool_sim``'s runtime: 0. Override it (a fixture of the same
        name in your ``conftest.py`` or test module) to run your tests with another."""
        return 0

    @pytest.fixture
    def dopool_store(tmp_path: Path) -> Path:
        """A path for a store in the test's temporary directory, not created yet."""
        return tmp_path / "dopool-store"

    @pytest.fixture
    def dopool_sim(dopool_store: Path, dopool_seed: int | str) -> Iterator[Runtime]:
        """A runtime on a ``SimulatedClock`` at 0.0 over ``dopool_store``, seeded with
        ``dopool_seed``; closed after the test (waiting at most ``CLOSE_TIMEOUT`` for
        handlers still running)."""
        runtime = Runtime.simulated(dopool_store, seed=dopool_seed)
        yield runtime
        runtime.close(timeout=CLOSE_TIMEOUT)

    @pytest.fixture
    def dopool_runtime(dopool_store: Path) -> Iterator[Runtime]:
        """A runtime on the real clock over ``dopool_store``, with ``durability="async"``
        (a test's store need not survive a power cut); closed after the test (waiting
        at most ``CLOSE_TIMEOUT`` for handlers still running)."""
        runtime = Runtime(dopool_store, durability="async")
        yield runtime
        runtime.close(timeout=CLOSE_TIMEOUT)
