"""Time, behind one interface: the real clock and the simulated (virtual) clock.

Both deliver alarms into instances' single alarm slots. The simulated clock
fires nothing until it is driven, and then only when the whole system is
quiescent, which is what makes runs reproducible: at most one actor works at
a time, and ties are broken by a stable order rather than by thread timing.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Hashable, Sized
from functools import partial
from typing import Any, Protocol

from dopool._clock.greenlets import GreenletBackend
from dopool._clock.latch import Latch
from dopool._clock.loops import LoopThread, Settled, run_virtual
from dopool._clock.quiescence import activity_for
from dopool._clock.threads import Backend
from dopool._errors import ConfigurationError, SimulationStalledError

#: The environment variable that picks a simulated clock's backend when none is
#: given: ``greenlet`` (the default) or ``threads``. Read here only.
BACKEND_VARIABLE = "DOPOOL_SIM_BACKEND"
BACKENDS = ("greenlet", "threads")


class AlarmTarget(Protocol):
    """Something with an alarm slot: an instance's stable address."""

    @property
    def order(self) -> tuple[str, int]:
        """A stable tie break between equal times: ``(pool, index)``."""
        ...

    def fire_alarm(self) -> object:
        """Deliver an ``alarm`` message to the instance (what it returns is not used)."""
        ...


class Clock(ABC):
    """Where instances get the time, set their alarm slot, sleep and send to each other."""

    @property
    def starts_due_work_at_once(self) -> bool:
        """Whether work that is due may start in the message that made it due (an
        enqueue to an idle instance starts the event in the same transaction)."""
        return False

    def __init__(self, backend: Backend | None = None) -> None:
        #: How the actors run and wait: OS threads, or greenlets on one thread.
        self.backend = Backend() if backend is None else backend
        self.activity = activity_for(self.backend)

    @abstractmethod
    def now(self) -> float:
        """The current time in seconds."""

    @abstractmethod
    def set_alarm(
        self,
        target: AlarmTarget,
        at: float | None,
        *,
        recurring: bool = False,
        here: bool = True,
    ) -> None:
        """Replace ``target``'s alarm with one at ``at`` (absolute), or clear it (None).

        ``recurring``: the alarm is only for a recurring schedule's next fire; such alarms
        never keep a simulated clock from being idle (:meth:`SimulatedClock.run_until_idle`).
        ``here=False``: an alarm already due is never fired in the calling thread (a real
        clock's would be), for a caller that holds a lock its target's firing takes.
        """

    @abstractmethod
    def deliver(self, order: tuple[str, int], send: Callable[[], object]) -> None:
        """Run ``send`` (a message between actors) now, or when the clock is next driven."""

    @abstractmethod
    def sleep(self, seconds: float, key: Hashable) -> None:
        """Block a handler for ``seconds`` of this clock's time."""

    @abstractmethod
    def run_coroutine(self, make: Callable[[], Coroutine[Any, Any, Any]], key: Hashable) -> Settled:
        """Run an async handler's coroutine (``make()``) in this clock's time, blocking the
        calling actor (``key``) until it ends; its value, or what it raised
        (:mod:`dopool._clock.loops`)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the clock's resources, if any."""

    # What callers of the engine do differently under each clock: the pool and the
    # runtime ask the clock, so neither needs to know which clock it has.

    #: Whether ``now()`` reads wall time, seconds since the Unix epoch: then a
    #: timezone-aware ``datetime`` names one of its times (an enqueue's ``not_before``).
    wall = False

    #: Whether a runtime on this clock watches its store for what producers in other
    #: processes commit (``dopool.connect``): a wake-up socket and a poll
    #: (:mod:`dopool._engine.wakeups`). Real time only: virtual time moves only when driven.
    watches_store = False

    #: Whether callers must act in a reproducible order: message several instances
    #: one after another, and wait for a crashed instance's recovery before going
    #: on. A simulated run repeats exactly only if they do.
    orders_calls = False

    def settle(self) -> None:
        """Wait for the system to be quiescent, where calls are ordered (see ``orders_calls``)."""
        if self.orders_calls:
            self.activity.wait_quiet()

    def progress(self, generation: int, deadline: float | None) -> bool:
        """Let the system move on, for a caller waiting for it (``join``).

        Under the real clock, wait until an actor goes idle after ``generation``
        was read, or until ``deadline`` (``time.monotonic()``). Returns False if
        nothing scheduled can ever make progress.

        Raises:
            TimeoutError: ``deadline`` passed (a simulated clock's wait for quiescence).
        """
        remaining = None if deadline is None else deadline - time.monotonic()
        self.activity.wait_change(generation, remaining)
        return True

    def drive_while(self, busy: Callable[[], bool], deadline: float | None) -> None:  # noqa: B027
        """Drive the clock while ``busy()`` (a closing runtime's handlers asleep in it).

        The real clock moves by itself: nothing to do.
        """


def wall_time() -> float:
    """The wall clock, epoch seconds: what a :class:`RealClock` reads, and what the host's
    lease clock starts from at each boot (:mod:`dopool._store.leaseclock`)."""
    return time.time()


class RealClock(Clock):
    """Wall-clock time; future alarms fire from one scheduler thread.

    An alarm that is already due is delivered at once from the calling thread,
    so an immediate alarm reaches its instance without a thread hop.
    """

    @property
    def starts_due_work_at_once(self) -> bool:
        return True

    wall = True
    watches_store = True

    #: The longest the scheduler thread waits at once, in seconds: any alarm time,
    #: however far, is waited for in slices (``Condition.wait`` refuses a timeout
    #: past ``threading.TIMEOUT_MAX``).
    _WAIT_SLICE = 3600.0

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, AlarmTarget]] = []
        self._slots: dict[int, int] = {}  # id(target) -> ticket of its live alarm
        self._tickets = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._loop: LoopThread | None = None  # started by the first coroutine
        self._loop_lock = threading.Lock()

    def now(self) -> float:
        return time.time()

    def set_alarm(
        self,
        target: AlarmTarget,
        at: float | None,
        *,
        recurring: bool = False,
        here: bool = True,
    ) -> None:
        with self._cond:
            self._slots.pop(id(target), None)
            if at is not None and (at > time.time() or not here):
                ticket = next(self._tickets)
                self._slots[id(target)] = ticket
                heapq.heappush(self._heap, (at, ticket, target))
                self._ensure_thread()
                self._cond.notify()
                return
        if at is not None:
            target.fire_alarm()

    def deliver(self, order: tuple[str, int], send: Callable[[], object]) -> None:
        send()

    def sleep(self, seconds: float, key: Hashable) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def run_coroutine(self, make: Callable[[], Coroutine[Any, Any, Any]], key: Hashable) -> Settled:
        """On the clock's one event loop (:class:`~dopool._clock.loops.LoopThread`)."""
        loop = self._loop
        if loop is None:
            with self._loop_lock:
                if self._loop is None:
                    self._loop = LoopThread()
                loop = self._loop
        return loop.run(make)

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()

    def _ensure_thread(self) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._run, name="dopool-clock", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap:
                        delay = self._heap[0][0] - time.time()
                        if delay <= 0:
                            break
                        self._cond.wait(min(delay, self._WAIT_SLICE))
                    else:
                        self._cond.wait()
                if self._stopped:
                    return
                _, ticket, target = heapq.heappop(self._heap)
                if self._slots.get(id(target)) != ticket:
                    continue  # replaced or cleared since
                del self._slots[id(target)]
            target.fire_alarm()


_ALARM, _DELIVERY, _WAKE, _CALL = 0, 1, 2, 3


class _Asleep:
    """What a handler asleep in virtual time waits for; formatted only for a report."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at

    def __str__(self) -> str:
        return f"virtual time to reach t={self.at:g} (asleep in its handler)"


class SimulatedClock(Clock):
    """Virtual seconds that move only when driven.

    ``advance``, ``run_until`` and ``run_until_idle`` fire due alarms, sleep
    wake-ups and deliveries one at a time in order of (time, pool, index,
    insertion), and wait for the system to be quiescent after each, like
    trio's autojump clock. Calls such as ``enqueue`` complete at once without
    driving it.
    """

    orders_calls = True

    def __init__(self, start: float = 0.0, *, backend: str | None = None) -> None:
        """``backend``: ``"greenlet"`` (every actor a greenlet on the driving thread,
        the default: docs/design.md, "Actors as greenlets") or ``"threads"`` (an OS
        thread per actor, for a runtime called from several threads, or handlers
        that block on something real); None reads ``$DOPOOL_SIM_BACKEND``, and
        ``"greenlet"`` if that is unset or empty."""
        name = backend or os.environ.get(BACKEND_VARIABLE) or "greenlet"
        if name not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
        green = GreenletBackend() if name == "greenlet" else None
        super().__init__(green)
        if not math.isfinite(start):
            raise ValueError(f"start must be finite, got {start!r}")
        self._now = float(start)
        self._lock = threading.Lock()
        self._heap: list[tuple[float, str, int, int, int, object]] = []
        self._slots: dict[int, int] = {}
        # The targets whose live alarm is only a schedule's next fire, and how many items
        # but alarms (deliveries, callbacks, wake-ups) the heap holds: idle is when every
        # live item is one of those alarms.
        self._recurring: set[int] = set()
        self._others = 0
        self._tickets = itertools.count()
        self._driver = threading.Lock()
        self._driver_thread: int | None = None  # the thread driving it (its ident), if any
        self._run_tasks: (
            Callable[[Callable[[], bool] | None, object, float | None], bool] | None
        ) = None
        self._runnable: Sized = ()
        self._check_thread: Callable[[], None] | None = None
        if green is not None:
            green.scheduler.describe = self._describe
            self._check_thread = green.scheduler.check_thread
            self._run_tasks = green.scheduler.drive
            self._runnable = green.scheduler.runnable

    def _describe(self) -> list[str]:
        """What the clock adds to a stall's report: who sleeps, and when it could move."""
        notes = []
        asleep = self.activity.asleep()
        if asleep:
            names = ", ".join(str(key) for key in asleep)
            notes.append(f"asleep in virtual time or waiting to restart: {names}")
        at = self.next_time()
        if at is not None:
            notes.append(
                f"the clock stands at t={self._now:g} and next has work at t={at:g}: it moves "
                "only when driven (advance, run_until, run_until_idle, step, join)"
            )
        return notes

    def _take_driver(self, deadline: float | None = None) -> None:
        """Take the right to drive the clock, waiting for another thread's drive until
        ``deadline`` (then TimeoutError). Refused (RuntimeError) to a handler, hook, subscriber
        or ``call_at`` callback: the drive would wait for quiescence, which waits for it."""
        check_thread = self._check_thread
        if check_thread is not None:
            check_thread()
        if self.backend.acting() or self._driver_thread == threading.get_ident():
            raise RuntimeError(
                "the simulated clock cannot be driven from a handler, hook, subscriber "
                "or call_at callback: the drive would wait for it to finish"
            )
        # Under greenlets, always free here: one thread drives.
        timeout = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._driver.acquire(timeout=timeout):  # a driver that never ends, at exit
            raise TimeoutError("another thread drove the simulated clock until the deadline")
        self._driver_thread = threading.get_ident()

    def _release_driver(self) -> None:
        self._driver_thread = None
        self._driver.release()

    @property
    def starts_due_work_at_once(self) -> bool:
        """While the clock is driven, as under the real clock: the work would start at
        this same virtual time anyway, one step later, through the alarm slot. Not
        otherwise: nothing runs until the clock is driven."""
        return self._driver_thread is not None

    def now(self) -> float:
        return self._now

    def set_alarm(
        self,
        target: AlarmTarget,
        at: float | None,
        *,
        recurring: bool = False,
        here: bool = True,
    ) -> None:
        with self._lock:  # (nothing fires in the caller's thread here: ``here`` is moot)
            self._slots.pop(id(target), None)
            self._recurring.discard(id(target))
            if at is None:
                return
            ticket = next(self._tickets)
            self._slots[id(target)] = ticket
            if recurring:
                self._recurring.add(id(target))
            pool, index = target.order
            heapq.heappush(self._heap, (max(at, self._now), pool, index, ticket, _ALARM, target))

    def deliver(self, order: tuple[str, int], send: Callable[[], object]) -> None:
        with self._lock:
            ticket = next(self._tickets)
            heapq.heappush(self._heap, (self._now, *order, ticket, _DELIVERY, send))
            self._others += 1

    def call_at(self, time: float, callback: Callable[[], object]) -> None:
        """Run ``callback`` in the driving thread when virtual time reaches ``time``.

        Callbacks due at the same time run in the order they were scheduled,
        before that time's alarms. A callback must not wait for an instance
        (use non-blocking sends): the clock is not driven while it runs.
        """
        with self._lock:
            ticket = next(self._tickets)
            heapq.heappush(
                self._heap, (max(float(time), self._now), "", -1, ticket, _CALL, callback)
            )
            self._others += 1

    def sleep(self, seconds: float, key: Hashable) -> None:
        if seconds <= 0:
            return
        at = self._now + seconds
        if not math.isfinite(at):  # the clock would stand at infinity: no record takes it
            raise ConfigurationError(f"ctx.sleep({seconds:g}) would wake past any clock time")
        wake = self.backend.latch(_Asleep(at))
        with self._lock:
            ticket = next(self._tickets)
            heapq.heappush(self._heap, (at, "", 0, ticket, _WAKE, (key, wake)))
            self._others += 1
        self.activity.sleep_begin(key)
        wake.acquire()

    def run_coroutine(self, make: Callable[[], Coroutine[Any, Any, Any]], key: Hashable) -> Settled:
        """On a loop in virtual time, the caller's own (:func:`.loops.run_virtual`)."""
        return run_virtual(make, self.now, partial(self.sleep, key=key), self.backend)

    def next_time(self) -> float | None:
        """The time of the next live alarm, wake-up or delivery, or None."""
        with self._lock:
            self._drop_stale()
            return self._heap[0][0] if self._heap else None

    def pending(self) -> bool:
        """Whether anything is scheduled at all."""
        return self.next_time() is not None

    def advance(self, seconds: float) -> None:
        """Fire everything due up to ``now + seconds``, then stand at that time."""
        if seconds < 0:
            raise ValueError(f"cannot advance by a negative time ({seconds})")
        self.run_until(self._now + seconds)

    def run_until(self, time: float) -> None:
        """Fire everything due up to the absolute time ``time``, then stand there; ValueError
        if it is not finite (every later write would store it, and no record takes it)."""
        time = float(time)  # an int would reach stored records as one (a float field)
        if not math.isfinite(time):
            raise ValueError(f"cannot run until {time}: a clock time is finite")
        self._take_driver()
        try:
            while self._step(time, None):
                pass
            self._now = max(self._now, time)
        finally:
            self._release_driver()

    def run_until_idle(
        self, max_time: float | None = None, *, until: Callable[[], bool] | None = None
    ) -> None:
        """Jump from scheduled time to the next until nothing is left, ``max_time``, ``until()``.

        Future fires of recurring schedules are not left to do: with nothing else scheduled,
        and nothing in flight, the system is idle (``run_until`` and ``advance`` fire them;
        a fire already due, after a resume say, fires: time does not move for it).
        """
        limit = math.inf if max_time is None else float(max_time)
        if math.isnan(limit):
            raise ValueError("max_time is NaN: give a clock time, or None for no limit")
        self._take_driver()
        try:
            while self._step(limit, None, idle=True) and not (until and until()):
                pass
        finally:
            self._release_driver()

    def step(
        self, limit: float = math.inf, *, deadline: float | None = None, idle: bool = False
    ) -> bool:
        """Fire the next item due by ``limit``; False if none (``idle``: or only recurring fires).

        ``deadline`` is a wall-clock ``time.monotonic()`` bound on waiting for
        quiescence (and on another thread's drive); :class:`TimeoutError` if it passes.
        """
        self._take_driver(deadline)
        try:
            return self._step(limit, deadline, idle=idle)
        finally:
            self._release_driver()

    def progress(self, generation: int, deadline: float | None) -> bool:
        """Fire the next scheduled item; False if nothing is scheduled (nothing can move)
        but recurring schedules' fires, which ``join`` does not wait for."""
        self._take_driver(deadline)
        try:
            return self._step(math.inf, deadline, idle=True)
        finally:
            self._release_driver()

    def drive_while(self, busy: Callable[[], bool], deadline: float | None) -> None:
        """Step while ``busy()``: a handler asleep in virtual time wakes only if time moves.

        Stops quietly when nothing is scheduled or ``deadline`` passes.
        """
        try:
            while busy() and self.step(deadline=deadline):
                pass
        except (TimeoutError, SimulationStalledError):  # the latter: they wait for ever
            pass

    def _step(self, limit: float, deadline: float | None, *, idle: bool = False) -> bool:
        """Fire the next item due by ``limit``; with ``idle``, none when only recurring
        schedules' alarms are left, all in the future."""
        self._wait_quiet(deadline)
        with self._lock:
            self._drop_stale()
            heap = self._heap
            if (
                idle
                and heap
                and heap[0][0] > self._now
                and not self._others
                and len(self._slots) == len(self._recurring)
            ):
                kind = None  # only future fires left: idle (a fire due now still fires)
            elif heap and heap[0][0] <= limit:
                at, _, _, _, kind, payload = heapq.heappop(heap)
                self._now = max(self._now, at)
                if kind == _ALARM:
                    del self._slots[id(payload)]
                    self._recurring.discard(id(payload))
                else:
                    self._others -= 1
            elif heap:
                return False
            else:
                kind = None
        if kind is None:  # nothing scheduled: actors still waiting wait for ever
            self.activity.stalled(None if deadline is None else 0.0)
            return False
        if kind == _ALARM:
            payload.fire_alarm()  # type: ignore[attr-defined]
        elif kind in (_DELIVERY, _CALL):
            payload()  # type: ignore[operator]
        else:
            sleeper: tuple[Hashable, Latch] = payload  # type: ignore[assignment]
            self.activity.sleep_end(sleeper[0])
            sleeper[1].release()
        self._wait_quiet(deadline)
        return True

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and heap[0][4] == _ALARM and self._slots.get(id(heap[0][5])) != heap[0][3]:
            heapq.heappop(heap)

    def _wait_quiet(self, deadline: float | None) -> None:
        run = self._run_tasks
        if run is not None:  # greenlets: run them until none can (Activity.wait_quiet)
            if self._runnable:
                run(None, "quiescence", deadline)  # TimeoutError once it passes
            return
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self.activity.wait_quiet(timeout):
            raise TimeoutError("the system did not become quiescent in time")
