"""The runtime: one store, one clock, the pools' actors, and the event stream."""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, ClassVar, Self, Unpack

import pykka

from dopool._clock.clocks import Clock, RealClock, SimulatedClock
from dopool._cluster.leases import DEFAULT_LEASE_TTL, check_lease_ttl
from dopool._cluster.remote import Away
from dopool._cluster.routing import Router, RoutingTable
from dopool._engine.actor import InstanceActor
from dopool._engine.call_store import CallStore, Served
from dopool._engine.cells import Cell, Cells
from dopool._engine.closing import Closing, Stops, deadline_after, stopped, wait_until
from dopool._engine.directory import Directory, PoolAddress
from dopool._engine.evicted import EvictedAlarms
from dopool._engine.keeper import check_shared, keep_leases, serve_pool
from dopool._engine.middleware import Middleware, check_middleware
from dopool._engine.options import PoolOptions, PoolOptionsDict
from dopool._engine.owner_calls import serve_calls
from dopool._engine.pool_context import PoolContext
from dopool._engine.pool_instances import Instances
from dopool._engine.router import Placement
from dopool._engine.shell import InstanceEnv, PoolSpec
from dopool._engine.slots import DEFAULT_MAX_ACTIVE, Slots, check_max_active
from dopool._engine.stored import StoredCalls
from dopool._engine.supervisor import KillFlag
from dopool._engine.wait_graph import WaitGraph
from dopool._engine.wakeups import DEFAULT_POLL_INTERVAL, check_poll_interval, watch_store
from dopool._errors import ConfigurationError, PoolClosedError, SimulationStalledError, shown
from dopool._handles.pool import WorkerPool
from dopool._machine.types import Item
from dopool._machine.validation import check_keyed, check_path, check_pool_name, prepare
from dopool._store.environment import Store
from dopool._store.layout import Namespace, follow_ups_to, used_instances
from dopool._store.txn import Txn
from dopool._types import PoolEvent
from dopool._usercode import check_synchronous, ran
from dopool.chaos import FaultPlan

logger = logging.getLogger("dopool")

DURABILITY_MODES = ("sync", "async")

#: Wall-clock seconds that handlers still running when the interpreter exits get to
#: finish. One still running then is abandoned: its attempt counts as interrupted, as
#: after a crash, when the store is next opened.
EXIT_GRACE = 5.0


class Runtime:
    """Opens a store directory and runs pools in it, under a real or simulated clock.

    Args:
        path: the store directory, created if missing.
        clock: a :class:`RealClock` (the default) or a :class:`SimulatedClock`.
        seed: drives retry jitter; with the same seed and calls, a simulated run repeats.
        durability: ``"sync"`` (fsync each commit) or ``"async"`` (survives a process crash).
        faults: a :class:`~dopool.chaos.FaultPlan` of crashes to inject (chaos testing).
        trace: a file path to write every :class:`PoolEvent` to, as JSON lines.
        poll_interval: under a real clock, seconds between looks at the store for what
            producers (``dopool.connect``) committed and whose wake-up was lost.
        shared: open the store as one of several worker processes (real clock only):
            each serves the instances whose leases it holds.
        lease_ttl: under a real clock, seconds a lease lasts unless renewed.
        max_active: the most instance actors running at once (each its own thread under
            a real clock); an instance with work beyond that waits in line for a slot.
            None: ``DEFAULT_MAX_ACTIVE`` (1024) under a real clock, no bound under a
            simulated one. A shared worker's instances are not counted yet.

    Raises:
        StoreLockedError: another runtime holds ``path`` (any, or an exclusive one if
            ``shared``).
        ConfigurationError: a bad option.
    """

    # A store thrown away after this runtime, opened by nobody else (see Store's
    # ``scratch``): :class:`dopool._handles.tools.ScratchRuntime`'s.
    _scratch_store: ClassVar[bool] = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        seed: int | str | None = None,
        durability: str = "sync",
        faults: FaultPlan | None = None,
        trace: str | os.PathLike[str] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        shared: bool = False,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        max_active: int | None = None,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        check_path(path)
        #: What wraps every attempt of every pool, outside each pool's own middleware.
        self.middleware = check_middleware(middleware, "Runtime(middleware=)")
        check_max_active(max_active)
        check_poll_interval(poll_interval)
        self.lease_ttl = check_lease_ttl(lease_ttl)
        check_seed(seed)
        if durability not in DURABILITY_MODES:
            raise ConfigurationError(f"durability must be 'sync' or 'async', got {durability!r}")
        if clock is not None and not isinstance(clock, Clock):
            raise ConfigurationError(f"clock must be a RealClock or SimulatedClock, got {clock!r}")
        if faults is not None and not isinstance(faults, FaultPlan):
            raise ConfigurationError(f"faults must be a dopool.chaos.FaultPlan, got {faults!r}")
        self.faults = faults
        self._owns_clock = clock is None
        self.clock: Clock = RealClock() if clock is None else clock
        self.shared = check_shared(shared, self.clock)
        # seed=None means "not reproducible": draw one, so jitter still varies run to run.
        self.seed = secrets.randbits(64) if seed is None else seed
        self.durability = durability
        backend = self.clock.backend
        waiter = backend.waiter("the store")  # a writer waiting for another
        one_thread = backend.runner is not None
        self._store = Store(
            path,
            durability=durability,
            latch=waiter,
            one_thread=one_thread,
            shared=shared,
            scratch=self._scratch_store,
        )
        self.path = self._store.path
        self._lock = threading.RLock()
        self._emit_lock = threading.Lock()
        self._closed = False
        self._shut = threading.Event()  # set when a close has finished (another waits for it)
        self._pools: dict[str, Instances] = {}  # by pool name; kill() finds one there
        self._defined: dict[str, WorkerPool] = {}  # the same pools' handles, for ``pools``
        self._cells: list[Cells] = []  # each pool's instances, by index
        # Replaced, never changed in place: emitting reads it without the lock.
        self._subscribers: tuple[Callable[[PoolEvent], Any], ...] = ()
        self._temporary: Path | None = None
        self._in_handler = self.clock.backend.local()
        self._waits = WaitGraph()  # which instance waits for which, to refuse a deadlock
        # The defined pools, for follow-ups into them; a WorkerPool names one too.
        self._directory = Directory(self.clock, WorkerPool)
        # One timer for the alarms of every evicted instance of its pools.
        self._evicted = EvictedAlarms(self.clock, self._cells_of)
        if max_active is None and isinstance(self.clock, RealClock):
            max_active = DEFAULT_MAX_ACTIVE
        self.max_active = max_active
        self._slots = Slots(max_active, self.clock, self._grant)
        # What each pool uses of this runtime, handed to it by _define_pool.
        self._pool_context = PoolContext(
            read=self._store.read,
            clock=self.clock,
            in_handler=self._in_handler,
            waits=self._waits,
            closed=lambda: self._closed,
            handler_running=self.handler_running,
        )
        self._trace: IO[str] | None = None
        if trace is not None:
            try:
                self._trace = open(trace, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            except OSError as exc:
                self._store.close()
                raise ConfigurationError(f"cannot open trace file {str(trace)!r}: {exc}") from exc
        self.poll_interval = float(poll_interval)  # the watcher last: nothing above closes it
        self._keeper = keep_leases(
            self.clock, self._store, self.lease_ttl, self._slots, shared=shared
        )
        owner = None if self._keeper is None or not shared else self._keeper.book.worker.owner
        self._watcher = watch_store(self.clock, self.path, self.poll_interval, self._store, owner)
        self._served: dict[str, Served] = {}  # replaced whole: the call socket reads it
        # Producers' calls stored here: from the call socket, or a Ray shard host's.
        self._call_store = CallStore(self.clock, self._store, self._served_pool)
        self._calls = serve_calls(self.clock, self.path, self._call_store, owner)
        self._pid = os.getpid()
        with _open_lock:
            _open.add(self)  # closed at interpreter exit, if not before

    @classmethod
    def simulated(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        seed: int | str | None = 0,
        start: float = 0.0,
        backend: str | None = None,
        **options: Any,
    ) -> Self:
        """A runtime on a new ``SimulatedClock(start, backend=backend)``; ``path=None`` uses a
        temporary directory."""
        if "clock" in options:
            raise ConfigurationError(
                "Runtime.simulated makes its own SimulatedClock; pass no clock"
            )
        clock = SimulatedClock(start, backend=backend)
        if path is not None:
            return cls(path, clock=clock, seed=seed, **options)
        temporary = Path(tempfile.mkdtemp(prefix="dopool-"))
        try:
            runtime = cls(temporary, clock=clock, seed=seed, **options)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        runtime._temporary = temporary
        return runtime

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Runtime {str(self.path)!r} {type(self.clock).__name__} {state}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def define(self, name: str, **options: Unpack[PoolOptionsDict]) -> WorkerPool:
        """Define a pool in this runtime; the options are ``WorkerPool.define``'s."""
        return self._define_pool(check_pool_name(name), PoolOptions.of(options))

    @property
    def pools(self) -> Mapping[str, WorkerPool]:
        """The pools defined in this runtime, by name, in the order they were defined
        (none once it is closed)."""
        # Not under the lock, which a define holds while its instances recover: their
        # hooks and subscribers may ask (a dict's copy is atomic).
        return MappingProxyType(dict(self._defined))

    def kill(self, pool_name: str, index: int) -> None:
        """Crash one instance as a fault would; it is restarted and recovers from storage.

        Returns at once. From the instance's own handler, the crash happens at
        its next fault point (after the handler returns, before its outcome
        commits); otherwise before the instance handles any message sent after
        this returns. Under a :class:`SimulatedClock` (outside a handler) it
        also waits for the crash and recovery, so runs stay deterministic.
        """
        if self._closed:  # not under the lock either (see ``pools``): a closing mailbox
            raise PoolClosedError(pool_name)  # refuses the kill anyway
        instances = self._pools.get(pool_name)
        if instances is None:
            raise ConfigurationError(f"no pool named {shown(pool_name)} in this runtime")
        instances.supervisor(index).kill()
        if self.handler_running() is None:
            self.clock.settle()

    def handler_running(self) -> tuple[str, int] | None:
        """``(pool, index)`` if the calling thread is that instance's, inside a message.

        True in handlers and in the hooks and subscribers an instance calls.
        """
        running: tuple[str, int] | None = getattr(self._in_handler, "instance", None)
        return running

    def subscribe(self, callback: Callable[[PoolEvent], Any]) -> Callable[[], None]:
        """Call ``callback`` with every :class:`PoolEvent`; returns a function that unsubscribes."""
        check_synchronous(callback, "subscribe's callback")
        with self._emit_lock:
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._emit_lock:
                if callback in self._subscribers:
                    subscribers = list(self._subscribers)
                    subscribers.remove(callback)
                    self._subscribers = tuple(subscribers)

        return unsubscribe

    def _listening(self) -> bool:
        """Whether any subscriber or trace takes events (read without the lock: a hint)."""
        return bool(self._subscribers) or self._trace is not None

    def _emit(self, event: PoolEvent) -> None:
        subscribers = self._subscribers  # no lock: one subscribing now sees the next event
        if self._trace is not None:
            with self._emit_lock:
                trace = self._trace  # read again under the lock: a close may have ended it
                if trace is not None:
                    trace.write(json.dumps(event.to_json_dict(), separators=(",", ":")) + "\n")
        for callback in subscribers:
            try:
                returned = callback(event)
                if returned is not None:  # (the usual subscriber returns None: no call)
                    ran(returned, "a subscriber")
            except BaseException:  # SystemExit too: pykka would stop every actor
                logger.exception("subscriber %r raised; ignored", callback)

    def _define_pool(self, name: str, options: PoolOptions) -> WorkerPool:
        concurrency = options.concurrency
        with self._lock:
            if self._closed:
                raise PoolClosedError(name)
            if name in self._pools:
                raise ConfigurationError(f"pool {name!r} is already defined in this runtime")
            others = self._keeper.others if self.shared and self._keeper else None
            record_concurrency(self._store, name, concurrency, others)
            schema = options.schema

            def prepare_follow_up(event: Any, partition_key: str | None, priority: int) -> Item:
                check_keyed(name, concurrency, partition_key)  # in the handler, at once
                return prepare(event, partition_key=partition_key, priority=priority, schema=schema)

            chain = (*self.middleware, *options.middleware)  # the runtime's wraps the pool's
            spec = PoolSpec(name=name, options=options, prepare=prepare_follow_up, middleware=chain)
            env: InstanceEnv

            def start(cell: Cell, kill: KillFlag) -> pykka.ActorRef[Any]:
                # An incarnation of the cell's instance, which recovers from its namespace.
                return InstanceActor.launch(spec, cell, env, kill)

            # A shared worker serves none of them until its keeper takes their leases.
            cells = Cells(
                name,
                concurrency,
                self.clock,
                start,
                serve_all=not self.shared,
                slots=self._slots,
                faults=self.faults,
                on_start=self._evicted.started,
            )
            first = RoutingTable.elsewhere(concurrency) if self.shared else None
            router = Router(concurrency, table=first)
            wake = self._keeper.wake if self.shared and self._keeper else None
            away = (
                None if wake is None else Away(self._store, self.clock, name, options.rules, wake)
            )
            placement = Placement(name, router, self.clock.backend)
            stored = StoredCalls(
                self._store,
                self.clock,
                cells,
                options.rules,
                self._evicted,
                self._listening,
                self._emit,
                None if wake is None else partial(wake, name),
            )
            instances = Instances(name, cells, placement, stored, away)
            env = InstanceEnv(
                store=self._store,
                clock=self.clock,
                seed=self.seed,
                emit=self._emit,
                listening=self._listening,
                router=router,
                directory=self._directory,
                in_handler=self._in_handler,
                cells=cells,
                evicted=self._evicted,
                slots=self._slots,
                holds=self._keeper.book.holds if self.shared and self._keeper else None,
                wake=wake,
            )
            self._cells.append(cells)
            try:
                serve_pool(self._keeper, self._store, cells, placement)
            except BaseException:  # e.g. a damaged record: stop what was started, raise
                self._cells.remove(cells)
                stopped(placement.stop(), EXIT_GRACE)
                for cell in cells.close():
                    ref = cell.supervisor.close()
                    if ref is not None:
                        ref.stop(block=True)
                    self.clock.set_alarm(cell.mailbox, None)
                raise
            pool = WorkerPool(self._pool_context, spec, instances, env)
            self._pools[name] = instances
            self._defined[name] = pool
            # Now follow-ups may go to it; those other instances held for it are resent.
            address = PoolAddress(
                name, spec.prepare, router.choose, cells, weakref.ref(pool), options
            )
            self._directory.add(address)
            if self._watcher is not None:
                self._watcher.watch(name, cells)
            served = Served(stored, partial(_serves, cells), pool.take_call)
            self._served = {**self._served, name: served}
            return pool

    def _served_pool(self, name: str) -> Served | None:
        """What the call socket stores a producer's calls on pool ``name`` with, if defined."""
        return self._served.get(name)

    def _cells_of(self, name: str) -> Cells | None:
        """The instances of the pool ``name``, if it is defined here."""
        instances = self._pools.get(name)
        return None if instances is None else instances.cells

    def _grant(self, name: str, index: int) -> bool:
        """Start instance ``index`` of pool ``name`` in the slot it waited for."""
        cells = self._cells_of(name)
        return cells is not None and cells.grant(index)

    def close(self, timeout: float | None = None) -> None:
        """Stop every actor gracefully (a running handler finishes), then close the store.

        Pending events stay durable and resume when the store is opened again. A
        runtime left open is closed at interpreter exit, its running handlers given
        ``EXIT_GRACE`` seconds to finish. ``timeout``: wall-clock seconds they get here
        (None: as long as they take); one still running then is abandoned, as at exit.
        A close another thread began is waited for, as long (a second close's own bound).

        Raises:
            ConfigurationError: called from one of this runtime's instance threads
                (a handler, hook or subscriber), which it would wait for forever; a bad
                ``timeout``.
        """
        deadline = deadline_after(timeout)
        running = self.handler_running()
        if running is not None and not self._closed:
            raise ConfigurationError(
                f"close() called from instance {running[0]}:{running[1]} of this runtime, "
                "which it would wait for forever; close the runtime from outside its "
                "handlers, hooks and subscribers"
            )
        closing = self._stop_taking_work()
        if closing is not None:
            closing.finish(deadline)
        elif running is None and self._pid == os.getpid():  # (a forked child: not its own)
            wait_until(self._shut, deadline)  # another thread's close may be under way

    def _stop_taking_work(self) -> Closing | None:
        """Mark the runtime closed and its instances' mailboxes too (the first step of a
        close; ``dopool worker`` takes it apart); None if it was closed already."""
        with self._lock:
            if self._closed or self._pid != os.getpid():  # a forked child's: the parent's
                return None
            self._closed = True
            pools, self._cells = self._cells, []
            self._defined.clear()
        self._evicted.close()  # no evicted instance is started now
        self._slots.close()  # nor one waiting for a slot
        if self._keeper is not None:  # no lease taken starts an instance now (not under
            self._keeper.stop_serving()  # the lock: a recovery it waits for may emit)
        stops = [
            (cell.mailbox, cell.supervisor.close()) for cells in pools for cell in cells.close()
        ]
        self.clock.activity.wake()  # a join waiting for the actors raises PoolClosedError
        return Closing(stops, self.clock.activity, self._shut_down, self._shut)

    def _shut_down(self, closing: Stops, deadline: float | None) -> None:
        """Stop the actors, then close the store, the trace and the clock.

        Running handlers may finish until ``deadline`` (``time.monotonic()``; None
        waits as long as they take). An actor still running then is abandoned on
        its daemon thread: its attempt's start is committed, so the next open's
        recovery settles it, and its outcome can no longer commit (the store
        refuses transactions once closed).
        """
        if self._calls is not None:  # producers store their own calls from now on
            self._calls.close(EXIT_GRACE)
        if self._watcher is not None:  # no more wake-ups: the actors are stopping
            self._watcher.close()
        # Not under the lock: a handler still finishing may call into the runtime.
        # A handler asleep in virtual time finishes only if the clock moves; one still
        # running past the deadline is abandoned below.
        keys = frozenset(mailbox.key for mailbox, _ in closing)
        self.clock.drive_while(lambda: self.clock.activity.busy(keys), deadline)
        stops = [
            (mailbox, None if ref is None else ref.stop(block=False)) for mailbox, ref in closing
        ]
        abandoned = []
        for mailbox, stop in stops:
            if stop is not None:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    stop.get(timeout=timeout)
                except (pykka.Timeout, SimulationStalledError):  # the latter: for ever
                    abandoned.append(mailbox)
            self.clock.set_alarm(mailbox, None)
        runner = self.clock.backend.runner
        if runner is not None:  # an actor it runs that was given up on must never run again
            for mailbox in abandoned:
                runner.abandon(mailbox.key)
        if self._keeper is not None:  # others take the leases now; the abandoned expire
            keep = [mailbox.order for mailbox in abandoned]
            # Those a lost or released lease was stopping get the same grace.
            abandoned += [cell.mailbox for cell in self._keeper.close(keep, deadline)]
        for instances in self._pools.values():  # no keeper tells them anything now
            stopped(instances.placement.stop(), EXIT_GRACE)
        if abandoned:
            logger.warning(
                "closing the runtime of %r: instance(s) %s still running after the grace "
                "period, or waiting for what nothing will bring; abandoned, their attempts "
                "count as interrupted when the store is next opened",
                str(self.path),
                ", ".join(mailbox.key for mailbox in abandoned),
            )
        with self._emit_lock:
            if self._trace is not None:
                self._trace.close()
                self._trace = None
        self._store.close()
        if self._owns_clock:
            self.clock.close()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
        with _open_lock:  # closed: nothing left for the exit to finish (see _close_at_exit)
            _open.discard(self)


_open: weakref.WeakSet[Runtime] = weakref.WeakSet()  # every runtime not closed yet, or closing
_open_lock = threading.Lock()


def begin_close(runtime: Runtime) -> Closing | None:
    """The first step of ``runtime.close()``, for ``dopool worker``: start nothing more."""
    return runtime._stop_taking_work()


def record_concurrency(
    store: Store, name: str, concurrency: int, others: Callable[[Txn], list[str]] | None = None
) -> None:
    """Store the pool's concurrency, refusing a change while old instances hold work,
    while any pool's outbox holds follow-ups routed to its old instances, or, for a shared
    worker, while ``others(txn)`` names other live workers (they route by the old one)."""
    with store.write() as txn:
        previous = store.get_pool(txn, name)
        if previous == concurrency:
            return
        live = [] if previous is None or others is None else others(txn)
        if live:
            raise ConfigurationError(
                f"pool {name!r} is served with concurrency {previous} by other live workers "
                f"({', '.join(live)}), which route by it; stop them before changing it to "
                f"{concurrency} (a dead worker's presence expires within its lease ttl)"
            )
        if previous is not None:
            for index in used_instances(txn, name):  # (one never used holds nothing)
                meta = Namespace(name, index).load_meta(txn)
                held = meta.held_dead_letters
                if meta.pending or meta.outbox or held:
                    raise ConfigurationError(
                        f"pool {name!r} was stored with concurrency {previous}; changing it "
                        f"to {concurrency} would move instance {index}'s {meta.pending} "
                        f"pending events, {meta.outbox} follow-ups and {held} "
                        "dead letters to other partitions. Drain and purge it first, or "
                        f"keep concurrency={previous}"
                    )
            incoming = follow_ups_to(txn, name)
            if incoming:
                where = ", ".join(f"{count} in {ident}'s" for ident, count in incoming.items())
                raise ConfigurationError(
                    f"pool {name!r} was stored with concurrency {previous}; changing it to "
                    f"{concurrency} would deliver follow-ups routed to its old instances "
                    f"({where} outbox) to other partitions, or to none. Define it with "
                    f"concurrency={previous} until they are delivered (join the pools "
                    "that hold them), then change it"
                )
        store.put_pool(txn, name, concurrency)


def check_seed(seed: object) -> None:
    """Refuse a seed a runtime does not take: one not an int, a str or None."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | str)):
        raise ConfigurationError(f"seed must be an int, a str or None, got {shown(seed)}")


def _close_at_exit() -> None:
    """Close every runtime still open; running handlers share ``EXIT_GRACE`` seconds.

    The instances' threads are daemon threads, so the interpreter reaches this
    (atexit handlers run after it has joined the non-daemon threads).
    """
    with _open_lock:
        # A forked child has none of the parent's actors, and must not close its store.
        runtimes = [runtime for runtime in _open if runtime._pid == os.getpid()]
    deadline = time.monotonic() + EXIT_GRACE
    # Every runtime stops taking work first, so none starts more while another closes.
    closing = [(runtime, runtime._stop_taking_work()) for runtime in runtimes]
    for runtime, steps in closing:
        if steps is None:  # another thread is closing it: let that close finish first
            wait_until(runtime._shut, deadline)
            continue
        try:
            steps.finish(deadline)
        except Exception:
            logger.exception("closing %r at exit failed", runtime)


atexit.register(_close_at_exit)

_default: Runtime | None = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    """The process-wide runtime: real clock, directory ``$DOPOOL_PATH`` (if set and not
    empty) or ``./.dopool``."""
    global _default  # noqa: PLW0603 - one lazily created runtime per process
    with _default_lock:
        if _default is None or _default.closed:
            _default = Runtime(os.environ.get("DOPOOL_PATH") or ".dopool")
        return _default


def _serves(cells: Cells, index: int) -> bool:
    """Whether instance ``index`` of ``cells``' pool exists and is served here."""
    return 0 <= index < cells.concurrency and cells.serves(index)
