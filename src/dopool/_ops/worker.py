"""``dopool worker``: a process that owns a store and runs its handlers until signalled.

The app (``module:function``, or ``file.py:function``, loaded as ``dopool simulate
--app`` loads one: :mod:`dopool._ops.app`) receives a real-clock :class:`Runtime`
opened on the store and defines its pools on it; the worker then serves. SIGTERM
or SIGINT closes it in two steps (:mod:`dopool._engine.closing`):

1. The runtime closes its instances' mailboxes, as ``Runtime.close()`` does: no
   attempt starts after the one an instance is running. Nothing is stored: a
   paused flag would outlive the process, and pending events simply stay.
2. Once the running handlers have finished, the actors stop and the store
   closes. If the grace period runs out first, or a second signal comes, the
   handlers still running are abandoned and the process leaves at once: their
   attempts' starts are committed, so the next runtime's recovery settles them,
   as after a crash.

Signals reach the main thread's handlers, which only write their number into a
pipe; the main thread waits on that pipe, for the first signal and then, up to the
deadline, for the second one or for the handlers' end, which a helper thread
writes there too.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn

from dopool._cluster.leases import DEFAULT_LEASE_TTL
from dopool._engine.closing import Closing
from dopool._errors import ConfigurationError, DopoolError, ScenarioError
from dopool._handles.connection import connect
from dopool._handles.runtime import Runtime, begin_close
from dopool._ops.app import AppError, load_app
from dopool._types import PoolStatus

#: Seconds running handlers get to finish after the first signal.
DEFAULT_GRACE = 30.0
#: Exit statuses (docs/deployment.md, "Stopping a worker").
EXIT_STOPPED = 0  # signalled; every running handler finished
EXIT_INTERRUPTED = 3  # signalled again, or the grace ran out: attempts left to recovery
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: its terminal closed
_QUIET = 0  # the byte the helper thread writes once no handler runs


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """What one pool did while the worker served, and what it left."""

    name: str
    concurrency: int
    succeeded: int
    dead_lettered: int
    pending: int


@dataclass(slots=True)
class Stopped:
    """How the worker stopped.

    Attributes:
        signal: the first signal's name.
        forced: why it stopped at once (``"second signal"``, ``"grace"``), or None.
        interrupted: the instances (``pool:index``) whose running attempt was abandoned.
        pools: each pool's counts for this run.
    """

    signal: str
    forced: str | None = None
    interrupted: list[str] = field(default_factory=list)
    pools: list[PoolCounts] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.forced else EXIT_STOPPED


@dataclass(frozen=True, slots=True)
class Started:
    """What the worker serves: the store, each pool's concurrency, the process."""

    path: Path
    pools: dict[str, int]
    pid: int


def open_worker(
    app: str,
    store: str | os.PathLike[str],
    *,
    durability: str,
    poll_interval: float,
    shared: bool = True,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    max_active: int | None = None,
    loading: Callable[[], AbstractContextManager[object]] = nullcontext,
    opened: Callable[[Runtime], object] | None = None,
) -> Runtime:
    """Load ``app``, open a real-clock runtime on ``store`` and have the app define its pools.

    ``shared``: as one of several workers, each serving the instances it leases.
    ``max_active``: the most instance actors at once (``Runtime``'s option).
    ``loading``: what the app's import runs in (:meth:`Signals.loading`: a signal
    then ends it, and one that came during it opens nothing).
    ``opened``: called with the runtime before the app defines its pools, so that it
    sees their first events (``--metrics-port`` registers the metrics there).

    Nothing is stored if the app cannot be loaded; a store this call created is removed
    again if the app raises or defines no pool.

    Raises:
        AppError: the app cannot be loaded, is not a function, raises, or defines no pool.
        Interrupted: a signal came while the app loaded (with ``loading``).
        StoreLockedError: another runtime holds the store.
        ConfigurationError: a bad option.
    """
    try:
        with loading():
            loaded = load_app(app)
    except ScenarioError as exc:  # the simulator's field error: here, the app's
        raise AppError(app, exc.problem) from None
    except AppError as exc:  # its import was cut short by a signal: not the app's fault
        if isinstance(exc.__cause__, Interrupted):
            raise exc.__cause__ from None
        raise
    path = Path(store)
    created = not path.exists()
    runtime = Runtime(
        path,
        durability=durability,
        poll_interval=poll_interval,
        shared=shared,
        lease_ttl=lease_ttl,
        max_active=max_active,
    )
    loaded.serve_on(runtime, path if created else None, first=opened)
    return runtime


def describe(runtime: Runtime) -> Started:
    return Started(
        runtime.path, {name: p.concurrency for name, p in runtime.pools.items()}, os.getpid()
    )


def check_grace(grace: object) -> float:
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace < 1e9:
        raise ConfigurationError(f"grace must be seconds >= 0, got {grace!r}")
    return float(grace)


def serve(
    runtime: Runtime, grace: float, wait: Signals, told: Callable[[str, list[str]], None]
) -> Stopped:
    """Run until SIGTERM, SIGINT or SIGHUP, then close ``runtime`` within ``grace`` seconds.

    ``told(signal_name, running)`` is called once the first signal has stopped new
    starts, with the instances still running a handler.
    """
    before = {name: pool.status() for name, pool in runtime.pools.items()}
    first = wait(None)  # only a signal writes before the helper thread starts
    stopped = Stopped(signal.Signals(first or signal.SIGTERM).name)
    closing = begin_close(runtime)
    if closing is None:  # the app closed it itself, from a thread of its own
        return stopped
    told(stopped.signal, closing.running())
    deadline = time.monotonic() + grace
    got: int | None = _QUIET
    if not closing.wait(0):  # some handler runs: wait for it, a second signal, or the end
        _when_quiet(closing, wait.write)
        got = wait(deadline)
        if got is None and closing.wait(0):  # done just as the grace ran out
            got = _QUIET
    if got is None:
        stopped.forced = "grace"
    elif got != _QUIET:
        stopped.forced = "second signal"
    if stopped.forced:
        stopped.interrupted = closing.running()
        deadline = time.monotonic()
    closing.finish(deadline)
    stopped.pools = _counts_since(runtime.path, before)
    return stopped


class Interrupted(BaseException):
    """SIGTERM, SIGINT or SIGHUP came while the app loaded: the worker stops before it serves.

    A ``BaseException``, as ``KeyboardInterrupt`` is: an app's ``except Exception``
    must not take it for one of its own errors.
    """

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        super().__init__(self.signal)


class Signals:
    """The pipe the signal handlers and the helper thread write to, read by the main thread."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.heard: int | None = None  # the first signal, as the Python handler saw it
        self._loading = False

    @contextmanager
    def loading(self) -> Iterator[None]:
        """While the app is imported, a signal raises :class:`Interrupted` (an import may
        take long, or hang); one that came during it raises it at the end."""
        self._loading = True
        try:
            yield
        finally:
            self._loading = False
        if self.heard is not None:
            raise Interrupted(self.heard)

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        """The Python handler: the wake-up fd has told :func:`serve` already; while the
        app loads, end that."""
        if self.heard is None:
            self.heard = signum
        if self._loading:
            raise Interrupted(signum)

    @property
    def write_end(self) -> int:
        return self._write

    def write(self, code: int) -> None:
        with suppress(OSError):  # full (a storm of signals): one in it is enough
            os.write(self._write, bytes([code]))

    def __call__(self, deadline: float | None) -> int | None:
        """The next byte written, or None once ``deadline`` (``time.monotonic()``) passed."""
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._read], [], [], timeout)
            if ready:
                with suppress(BlockingIOError):
                    return os.read(self._read, 1)[0]
            elif deadline is not None:
                return None

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


@contextmanager
def signals() -> Iterator[Signals]:
    """SIGTERM, SIGINT and SIGHUP write their number to a pipe while this lasts: one that comes
    while the app defines its pools is kept for :func:`serve` (one during its import
    ends that, :meth:`Signals.loading`).

    The interpreter's own signal handler writes it (``signal.set_wakeup_fd``), at once,
    whichever thread the signal lands on: a handler written in Python would run only
    when the main thread next runs Python code, and it may be blocked in ``select``
    on this very pipe while an actor's thread took the signal. The Python handlers
    installed here keep the signals from ending the process, but for an import.
    """
    wait = Signals()
    previous = {signum: signal.signal(signum, wait.handle) for signum in SIGNALS}
    old_fd = signal.set_wakeup_fd(wait.write_end, warn_on_full_buffer=False)
    try:
        yield wait
    finally:
        signal.set_wakeup_fd(old_fd)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        wait.close()


def _when_quiet(closing: Closing, write: Callable[[int], None]) -> None:
    """Write ``_QUIET`` once no instance handles a message (a daemon thread: abandoned
    with the handlers it waits for)."""

    def wait() -> None:
        closing.wait()
        write(_QUIET)

    threading.Thread(target=wait, name="dopool-worker-grace", daemon=True).start()


def _counts_since(path: Path, before: dict[str, PoolStatus]) -> list[PoolCounts]:
    """Each pool's counts as stored now, less those the worker started from."""
    try:
        with connect(path, durability="async") as connection:
            after = {name: connection.pool(name).status() for name in before}
    except DopoolError:  # the store removed under the worker, say: nothing more is known
        after = before
    return [
        PoolCounts(
            name,
            now.concurrency,
            now.succeeded - before[name].succeeded,
            now.dead_lettered - before[name].dead_lettered,
            now.pending,
        )
        for name, now in after.items()
    ]


def leave(code: int) -> NoReturn:
    """End the process at once, as a second signal asks: no waiting for abandoned handlers'
    threads, nor for an app's own threads or exit hooks."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
