"""A pool's instances, each made when it is first used.

An instance exists from ``define`` on: its namespace reads as new until something is
written to it. What runs it (its address, supervisor, memory and fault injector, and
its actor) costs nothing until something needs the instance: a caller's message, a
follow-up or its acknowledgement, a wake-up from another process, a kill, or a
``define`` that finds work or an alarm the instance left in the store (found from the
store's work and alarm indexes, not by reading every instance). Then :class:`Cells`
makes its :class:`Cell` and, in a runtime that serves the instance, starts its actor,
whose first message is its recovery (docs/guarantees.md, "Crashes and recovery").
An instance idle for its pool's ``idle_timeout`` is evicted: its actor stops and its
cell is dropped, and the next message starts it again from its namespace.

A shared worker serves only the instances of the lease units it holds
(:mod:`dopool._cluster.units`), told by its lease keeper (:meth:`Cells.serve`,
:meth:`Cells.unserve`): an instance of another unit gets a *vacant* cell, made for the call
and never listed, whose mailbox refuses callers (they store what they send, as a
producer does); one of a unit it serves starts on demand as in an exclusive runtime.

Each actor started here holds one of the runtime's slots (:mod:`dopool._engine.slots`).
An instance that needs an actor while none is free waits in line: with no cell at all if
what it has to do is in the store (:meth:`Cells.ready`), or with a *held* cell, whose
mailbox keeps the messages sent to it until the slot comes and its actor starts, its
recovery first (:meth:`Cells.open`).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Set
from contextlib import contextmanager
from functools import partial
from typing import Any, Protocol

import pykka

from dopool._clock.clocks import Clock
from dopool._cluster.units import unit_of
from dopool._engine.mailbox import Mailbox
from dopool._engine.memory import InstanceMemory
from dopool._engine.messages import Evict, Reply
from dopool._engine.slots import Slots
from dopool._engine.supervisor import KillFlag, Supervisor
from dopool._machine.types import Item
from dopool._types import EnqueueResult
from dopool.chaos import FaultInjector, FaultPlan


class DirectPath(Protocol):
    """An instance's enqueue from a caller's own thread (``DirectEnqueue``): None when the
    instance must be sent a message instead."""

    def enqueue(self, items: tuple[Item, ...]) -> list[EnqueueResult] | None: ...

    def dismantle(self) -> None:
        """Break its reference cycles, once its instance is evicted (nothing calls it after)."""


class IdleTimer:
    """An instance's idle timer: the clock fires it like an alarm, and it asks the actor to
    see whether it has been idle long enough to be evicted (an :class:`Evict` message)."""

    __slots__ = ("mailbox", "order")

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self.order = mailbox.order

    def fire_alarm(self) -> None:
        if not self.mailbox.retired:  # (a retired address would start the next incarnation)
            self.mailbox.send(Evict())


class Cell:
    """What runs one instance in this runtime, made when it is first used and dropped when
    the instance is evicted."""

    __slots__ = ("direct", "faults", "idle_timer", "index", "mailbox", "memory", "supervisor")

    def __init__(
        self,
        mailbox: Mailbox,
        memory: InstanceMemory,
        faults: FaultInjector,
        clock: Clock,
        start: Callable[[Cell, KillFlag], pykka.ActorRef[Any]],
    ) -> None:
        """``start(cell, kill_flag)`` starts an incarnation of the instance's actor."""
        self.index = mailbox.order[1]
        self.mailbox = mailbox
        self.memory = memory
        self.faults = faults
        self.supervisor = Supervisor(mailbox, clock, partial(start, self))
        self.idle_timer = IdleTimer(mailbox)
        self.direct: DirectPath | None = None  # made by the pool with its first direct call


class PoolKeys(Set[Hashable]):
    """The mailbox keys of a pool's instances (``<pool>:<index>``), as a set nobody stores:
    a membership test parses the key, so asking whether any is busy costs nothing per
    instance (:meth:`dopool._clock.quiescence.Activity.busy`)."""

    __slots__ = ("_concurrency", "_prefix")

    def __init__(self, pool: str, concurrency: int) -> None:
        self._prefix = f"{pool}:"
        self._concurrency = concurrency

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str) or not key.startswith(self._prefix):
            return False
        digits = key[len(self._prefix) :]
        return digits.isdigit() and str(int(digits)) == digits and int(digits) < self._concurrency

    def __len__(self) -> int:
        # (len() holds at most sys.maxsize: a per-key pool's 2**64 keys count as that
        # many, more than anyone iterates; Activity.busy only compares the sizes.)
        return min(self._concurrency, sys.maxsize)

    def __iter__(self) -> Iterator[str]:
        return (f"{self._prefix}{index}" for index in range(self._concurrency))


class Cells:
    """A pool's instances by index, each made (and, if served here, started) on first use.

    ``serve_all``: whether every instance is served here (an exclusive runtime's); else
    only those of the lease units :meth:`serve` named (a shared worker's, whose lease
    keeper names them, :mod:`dopool._engine.keeper`). Once :meth:`close` has been called a
    new instance starts closed: it refuses every message, and nothing runs it.

    Looking up an instance already made takes no lock; making one takes the pool's.
    """

    __slots__ = (
        "_activity",
        "_clock",
        "_closed",
        "_faults",
        "_latch",
        "_lock",
        "_made",
        "_on_start",
        "_owed",
        "_plan",
        "_slots",
        "_start",
        "_units",
        "_waiter",
        "concurrency",
        "name",
    )

    def __init__(
        self,
        name: str,
        concurrency: int,
        clock: Clock,
        start: Callable[[Cell, KillFlag], pykka.ActorRef[Any]],
        *,
        serve_all: bool,
        slots: Slots,
        faults: FaultPlan | None = None,
        on_start: Callable[[str, int], None] | None = None,
    ) -> None:
        """``start(cell, kill_flag)``: an incarnation of the instance's actor, started;
        ``slots``: the runtime's, which each actor started on demand holds one of;
        ``on_start(pool, index)``: told of each instance started (the runtime's timer of
        evicted instances' alarms forgets it)."""
        self.name = name
        self.concurrency = concurrency
        self._clock = clock
        self._start = start
        # The lease units served here (a shared worker's); None: every instance. Changed
        # under the lock, read without it (a set's ``in`` is atomic).
        self._units: set[int] | None = None if serve_all else set()
        # A restart to count with the next start of an instance (one with work, taken over
        # after its lease expired: :meth:`serve`), whoever starts it.
        self._owed: dict[int, int] = {}
        self._slots = slots
        self._plan = faults
        backend = clock.backend
        self._activity = clock.activity
        self._latch = backend.latch if backend.runner is not None else None
        self._waiter = backend.waiter
        self._lock = threading.Lock()
        self._made: dict[int, Cell] = {}  # written under the lock, read without it
        # Under a fault plan, each instance's injector, kept once it was first made: a
        # plan's draws are a sequence per instance, which an eviction must not restart.
        self._faults: dict[int, FaultInjector] = {}
        self._closed = False
        self._on_start = on_start

    def __getitem__(self, index: int) -> Cell:
        """Instance ``index``'s cell (``0 <= index < len(self)``), made if it was not."""
        cell = self._made.get(index)
        return self.open(index)[0] if cell is None else cell

    def serves(self, index: int) -> bool:
        """Whether instance ``index`` is served here (without the lock, a hint; with it,
        decided: :meth:`serve` and :meth:`unserve` change it under the lock)."""
        units = self._units
        return units is None or unit_of(index, self.concurrency) in units

    def serve(self, unit: int, restarted: Iterable[int] = ()) -> None:
        """Serve the instances of lease ``unit`` from now on: each starts when first needed
        (a shared worker's lease keeper, having taken the lease, calls this). Those of
        ``restarted`` (taken over after the lease expired, with work) count a restart with
        their first recovery here, whatever starts them: the keeper, or a wake-up first."""
        assert self._units is not None, "an exclusive runtime serves every instance"
        with self._lock:
            self._units.add(unit)
            for index in restarted:
                self._owed[index] = 1

    def unserve(self, units: Set[int]) -> dict[int, list[Cell]]:
        """Serve the instances of ``units`` no more: the cells made of them are dropped
        (returned by unit, for the lease keeper to close and stop), and their next use
        makes vacant ones. Restarts owed to those waiting in line are forgotten; their
        turn in it, when it comes, starts nothing (:meth:`grant`)."""
        assert self._units is not None, "an exclusive runtime serves every instance"
        dropped: dict[int, list[Cell]] = {}
        with self._lock:
            self._units -= units
            for index in list(self._made):
                unit = unit_of(index, self.concurrency)
                if unit in units:
                    dropped.setdefault(unit, []).append(self._made.pop(index))
            for index in [i for i in self._owed if unit_of(i, self.concurrency) in units]:
                del self._owed[index]
        for cells in dropped.values():
            for cell in cells:
                self._slots.idle.pop((self.name, cell.index), None)
        return dropped

    def get(self, index: int) -> Cell | None:
        """Instance ``index``'s cell if it has been made, else None (nothing is made)."""
        return self._made.get(index)

    def open(self, index: int) -> tuple[Cell, Reply | None]:
        """Instance ``index``'s cell, and, if this call made and started it, the reply its
        recovery answers (waiting for it is the caller's choice). With no slot free, the
        cell made is held: its mailbox keeps what is sent to it, and the instance waits
        in line for a slot. One not served here gets a vacant cell, which is not kept."""
        cell = self._made.get(index)
        if cell is not None:
            return cell, None
        held = False
        with self._slot_given_back_on_failure() as taken, self._lock:
            cell = self._made.get(index)
            if cell is not None:
                return cell, None
            cell = self._make(index)
            reply = None
            if not self.serves(index):  # for this call alone: nothing is kept of it
                cell.supervisor.vacate()
                return cell, None
            if self._closed:
                cell.mailbox.close()
            elif taken(self._slots.take()):
                reply = cell.mailbox.reply()
                self._activate(cell, reply)
            else:
                cell.mailbox.hold()
                held = True
            # Listed only now: whoever finds it may send at once, after the recovery.
            self._made[index] = cell
        if held:
            self._slots.wait(self.name, index)
        return cell, reply

    def start(self, index: int) -> tuple[Cell, Reply | None] | None:
        """Instance ``index``'s cell, running (started by this call if it was not, with its
        recovery's reply as :meth:`open` gives it); None, making nothing, if it would wait
        for a slot (an enqueue for it is stored from the caller's thread instead). A vacant
        cell if it is not served here."""
        cell = self._made.get(index)
        if cell is None and self._slots.limit is not None:
            with self._slot_given_back_on_failure() as taken, self._lock:
                cell = self._made.get(index)
                if cell is None and not self._closed and self.serves(index):
                    if not taken(self._slots.take()):
                        return None
                    return self._start_new(index, recovery=True)
        if cell is None:
            return self.open(index)
        return None if cell.mailbox.held else (cell, None)

    def waits(self, index: int) -> bool:
        """Whether instance ``index`` would wait for a slot now (a hint, read without the
        lock; nothing is made)."""
        if self._slots.limit is None or not self.serves(index):
            return False
        cell = self._made.get(index)
        return cell.mailbox.held if cell is not None else not self._slots.free

    def ready(self, index: int) -> Cell | None:
        """Instance ``index`` has something to do that the store holds (an enqueue stored
        from a caller's thread, an alarm come due): started if a slot is free, else put in
        line (nothing more is made); a running one is sent an alarm, whose transaction
        reads the store anew, unless one it has not begun on is on its way. The instance's
        cell if it runs here; None for one not served here (nothing done)."""
        with self._slot_given_back_on_failure() as taken, self._lock:
            cell = self._made.get(index)
            if cell is None:
                if self._closed or not self.serves(index):
                    return None
                if taken(self._slots.take()):
                    return self._start_new(index)[0]
        if cell is None:
            self._slots.wait(self.name, index)
            return None
        if cell.mailbox.held:
            return None
        # One alarm not yet begun reads whatever committed before it: no second one (a
        # burst of producers' calls costs the instance one transaction, not one each).
        memory = cell.memory
        if not memory.woken:
            memory.woken = True  # before the send: the actor may begin on it at once
            if not cell.mailbox.fire_alarm():
                memory.woken = False  # no actor took it: it must not hold back the next
        return cell

    def grant(self, index: int) -> bool:
        """Start instance ``index`` in the slot it waited for (:class:`Slots` calls this);
        False if it needs none: it runs already, or the runtime is closing."""
        with self._lock:
            if self._closed:
                return False
            cell = self._made.get(index)
            if cell is None:
                if not self.serves(index):  # its lease was lost or released meanwhile
                    return False
                self._start_new(index)
                return True
            if not cell.mailbox.held:
                return False
            self._activate(cell, None)  # its recovery first, then what its mailbox kept
            return True

    @contextmanager
    def _slot_given_back_on_failure(self) -> Iterator[Callable[[bool], bool]]:
        """Gives back the slot a start took if the start raised (no thread left, say), once
        this pool's lock is released: handing a slot on may start another of its instances."""
        took: list[bool] = []

        def taken(answer: bool) -> bool:
            took.append(answer)
            return answer

        try:
            yield taken
        except BaseException:
            if any(took) and self._slots.limit is not None:
                self._slots.give_back()
            raise

    def _make(self, index: int) -> Cell:
        """A new cell for instance ``index``, neither started nor listed; with the lock."""
        key = f"{self.name}:{index}"
        mailbox = Mailbox(self.name, index, key, self._activity, self._latch)
        memory = InstanceMemory(self._waiter(f"the turn of {key}"))
        faults = self._faults.get(index) or FaultInjector(self._plan, self.name, index)
        if self._plan is not None:  # its draws go on across evictions, as across crashes
            self._faults[index] = faults
        return Cell(mailbox, memory, faults, self._clock, self._start)

    def _start_new(self, index: int, *, recovery: bool = False) -> tuple[Cell, Reply | None]:
        """A new cell for instance ``index``, started in the slot taken for it and listed;
        with the lock. ``recovery``: with the reply its recovery answers."""
        cell = self._make(index)
        reply = cell.mailbox.reply() if recovery else None
        self._activate(cell, reply)
        self._made[index] = cell  # listed only once started: whoever finds it may send
        return cell, reply

    def _activate(self, cell: Cell, reply: Reply | None) -> None:
        """Start ``cell``'s actor, its recovery first (counting a restart it is owed, see
        :meth:`serve`); with the lock."""
        cell.supervisor.activate(reply, self._owed.pop(cell.index, 0) if self._owed else 0)
        # Told once started (a start that raised leaves its evicted alarm noted);
        # no eviction of it can come before: it takes this lock.
        if self._on_start is not None:
            self._on_start(self.name, cell.index)

    def evict(self, cell: Cell) -> bool:
        """Drop ``cell``, its instance evicted (called by its actor, with its turn held):
        the next message for the instance starts a new one. False, changing nothing, if a
        message waits for the actor (:meth:`Mailbox.retire`). The actor gives its slot
        back once it has stopped (``InstanceActor.on_stop``): a thread is never counted
        out of the runtime's ``max_active`` before it ends."""
        with self._lock:
            if self._made.get(cell.index) is not cell:
                return False
            if not cell.mailbox.retire(partial(self._address, cell.index)):
                return False
            del self._made[cell.index]
        self._slots.idle.pop((self.name, cell.index), None)
        return True

    def _address(self, index: int) -> Mailbox:
        return self[index].mailbox

    @property
    def waiting(self) -> int:
        """How many of the pool's instances wait for a slot."""
        return self._slots.waiting(self.name)

    def made(self) -> list[Cell]:
        """The cells made so far, by index."""
        with self._lock:
            return [self._made[index] for index in sorted(self._made)]

    def keys(self) -> PoolKeys:
        """Every instance's mailbox key, made or not."""
        return PoolKeys(self.name, self.concurrency)

    def close(self) -> list[Cell]:
        """Make every later cell closed; the cells made so far, by index, to close."""
        with self._lock:
            self._closed = True
            return [self._made[index] for index in sorted(self._made)]
