"""The public handle on a pool: enqueue, control, status, join, dead letters."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Unpack

from dopool import tracing
from dopool._cluster.remote import Verb
from dopool._cluster.routing import Positions, pick, place
from dopool._engine.calls import Calls
from dopool._engine.direct import DirectBody, DirectEnqueue
from dopool._engine.messages import CallMark, Control, Enqueue
from dopool._engine.options import PoolOptionsDict
from dopool._engine.pool_context import PoolContext
from dopool._engine.pool_instances import Instances
from dopool._engine.shell import InstanceEnv, PoolSpec
from dopool._engine.storage import ReadOnlyStorage
from dopool._engine.wait_graph import acting
from dopool._errors import (
    ConfigurationError,
    DamagedRecordError,
    DopoolError,
    InstanceCrashedError,
    NotLeasedError,
    PoolClosedError,
)
from dopool._handles.filters import Filters, by_instance, chosen, listed
from dopool._handles.schedules import definition, read_schedules, schedule_info
from dopool._machine.lifecycle import lookup, parse_event_id
from dopool._machine.status import Listing, read_pool_status
from dopool._machine.types import (
    Cancel,
    DefineSchedule,
    Drain,
    Item,
    Pause,
    Purge,
    Redrive,
    Request,
    Resume,
    Unschedule,
)
from dopool._machine.validation import check_keyed, due_time, prepare, prepare_many, with_ttl
from dopool._pools import FilterOptions, Pool, ScheduleOptions, StorageView
from dopool._store.layout import (
    Namespace,
    follow_ups_to,
    set_pool_paused,
    used_instances,
    work_index,
)
from dopool._types import DeadLetter, EnqueueResult, EventInfo, PoolStatus, ScheduleInfo

if TYPE_CHECKING:
    from dopool._handles.runtime import Runtime


#: The control messages a shared worker makes in the store for instances others serve.
_VERBS: dict[Any, Verb] = {Pause: "pause", Resume: "resume", Drain: "drain"}


class WorkerPool(Pool):
    """A named pool of ``concurrency`` instances sharing one handler; create one with
    :meth:`WorkerPool.define` or :meth:`Runtime.define`.

    The methods it shares with :class:`~dopool.ProducerPool` are :class:`~dopool.Pool`'s,
    documented there.
    """

    def __init__(
        self,
        context: PoolContext,
        spec: PoolSpec,
        instances: Instances,
        env: InstanceEnv,
    ) -> None:
        self._context = context
        self._spec = spec
        self._schema = spec.options.schema
        self._instances = instances
        self._keys = instances.cells.keys()  # what join asks (computed, not stored)
        self._router = instances.router
        self._calls = Calls(context, instances)
        self._read = partial(context.read_open, spec.name)  # PoolClosedError once closed
        self._env = env

    @classmethod
    def define(
        cls, name: str, *, runtime: Runtime | None = None, **options: Unpack[PoolOptionsDict]
    ) -> WorkerPool:
        """Define a pool and start its instances, resuming whatever the store holds for it.

        Args:
            name: 1-64 characters of ``[A-Za-z0-9_.-]``, unique within the runtime.
            runtime: the runtime to use; None means the process default runtime.
            **options: the pool's options (see :class:`PoolOptionsDict`):
                ``execute`` (the handler, called with an :class:`EventContext` per
                attempt; required), ``concurrency`` (the number of instances),
                ``retry`` (a :class:`RetryPolicy`; None dead-letters an event at its
                first failure), ``schema`` (``event -> event``; raise to reject),
                ``on_dead_letter``, ``on_empty``, ``max_queue_depth``.

        Raises:
            ConfigurationError: a bad or unknown option, a name defined twice, or a
                changed concurrency while the store still holds work for this pool.
        """
        if runtime is None:
            # The one import of the module above: a Runtime's define makes WorkerPools,
            # and this one opens the process default Runtime.
            from dopool._handles.runtime import default_runtime  # noqa: PLC0415 - see above

            runtime = default_runtime()
        return runtime.define(name, **options)

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def concurrency(self) -> int:
        return self._spec.options.concurrency

    def __repr__(self) -> str:
        return f"<WorkerPool {self.name!r} concurrency={self.concurrency}>"

    def _calls_on_loop_thread(self) -> bool:
        return self._context.clock.orders_calls  # a simulated clock's calls are ordered

    # -- enqueue ---------------------------------------------------------------
    def enqueue(
        self,
        event: Any,
        *,
        partition_key: str | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        not_before: float | datetime | None = None,
        dedup_key: str | None = None,
        ttl: float | timedelta | None = None,
    ) -> EnqueueResult:
        self._check_open()
        self._refuse_own_instance(None)
        due = None if delay is None and not_before is None else self._due(delay, not_before)
        item = prepare(
            event,
            partition_key=partition_key,
            priority=priority,
            schema=self._schema,
            due=due,
            dedup_key=dedup_key,
        )
        clock = self._context.clock
        items = (item,) if ttl is None else with_ttl((item,), ttl, due, clock.now())
        with tracing.sending(self.name, items, clock.now) as items:
            return self._route(items, partition_key)[0]

    def enqueue_many(
        self,
        events: Iterable[Any],
        *,
        partition_key: str | None = None,
        priority: int = 0,
        delay: float | timedelta | None = None,
        not_before: float | datetime | None = None,
        dedup_keys: Iterable[str | None] | None = None,
        ttl: float | timedelta | None = None,
    ) -> list[EnqueueResult]:
        self._check_open()
        self._refuse_own_instance(None)
        due = None if delay is None and not_before is None else self._due(delay, not_before)
        items = prepare_many(
            events, partition_key, priority, self._schema, due=due, dedup_keys=dedup_keys
        )
        if not items:
            return []
        clock = self._context.clock
        if ttl is not None:
            items = with_ttl(items, ttl, due, clock.now())
        with tracing.sending(self.name, items, clock.now) as items:
            return self._route(items, partition_key)

    def take_call(
        self, index: int, items: tuple[Item, ...], call: CallMark
    ) -> tuple[DirectEnqueue, DirectBody] | None:
        """A producer's call its owner takes (``_engine/call_store.py``), made by instance
        ``index``'s own enqueue transaction if the instance runs here and is free: its turn
        taken, and the body that stores the call and starts its first due event in the
        same commit, as an enqueue made in this process does (see
        :meth:`DirectEnqueue.take`). None if it cannot be (not running here, busy,
        crashed): the caller stores the call another way."""
        cell = self._instances.cells.get(index)
        if cell is None:
            return None
        direct = cell.direct
        if not isinstance(direct, DirectEnqueue):
            direct = cell.direct = DirectEnqueue(self._spec, cell, self._env)
        body = direct.take(items, call)
        return None if body is None else (direct, body)

    def _direct_to(self, index: int) -> DirectEnqueue | None:
        """Instance ``index``'s direct path (the instance started if it was not); None if
        it waits for a slot (its enqueues are stored from here: :meth:`_store_waiting`)."""
        started = self._instances.cells.start(index)
        if started is None:
            return None
        cell, recovery = started
        direct = cell.direct
        if not isinstance(direct, DirectEnqueue):
            direct = cell.direct = DirectEnqueue(self._spec, cell, self._env)
            if recovery is not None and not acting(self._context.in_handler):
                # Started by this call: its recovery first, then this enqueue is stored
                # from here, as every later one is. A recovery that crashed leaves the
                # enqueue to be sent, behind the next; a damaged meta is named at once.
                with suppress(InstanceCrashedError):
                    self._calls.wait(recovery)
        return direct

    def _store_waiting(
        self, groups: dict[int, Positions], items: tuple[Item, ...], results: list[Any]
    ) -> DopoolError | None:
        """Store the shares of instances waiting for a slot from this thread; the first
        refused."""
        return self._instances.stored.enqueue(items, groups, results)

    def _due(
        self, delay: float | timedelta | None, not_before: float | datetime | None
    ) -> float | None:
        clock = self._context.clock
        return due_time(delay, not_before, now=clock.now, wall=clock.wall)

    def _route(self, items: tuple[Item, ...], partition_key: str | None) -> list[EnqueueResult]:
        """Send each instance its share from this thread, then gather the answers. In a
        shared worker, the shares of instances others serve are stored as a producer's."""
        check_keyed(self.name, self.concurrency, partition_key)
        table = self._router.table  # the router actor's, published: read once, no lock
        if len(items) == 1:  # the common case: stored from this thread, no hop at all
            index = self._router.choose(partition_key, table)
            if not table.serves(index):  # another worker serves it
                return self._away_one(index, items, None)
            direct = self._direct_to(index)
            if direct is None:  # waiting for a slot: stored from here all the same
                return self._one(self._store_waiting, index, items)
            try:
                stored = direct.enqueue(items)
            except InstanceCrashedError:
                self._calls.settle_crash()
                raise
            if stored is None:  # busy, killed or recovering: a message waits its turn
                try:
                    stored = self._calls.call(index, partial(Enqueue, items))
                except NotLeasedError as exc:  # vacant since the table was published
                    return self._away_one(index, items, exc)
            return stored
        results: list[Any] = [None] * len(items)
        keys = [item.dedup_key for item in items]
        groups = self._router.split(len(items), partition_key, keys if any(keys) else None, table)
        away = {i: p for i, p in groups.items() if not table.serves(i)}
        failure = self._instances.store_away(away, items, results) if away else None
        # Parts sent at once would commit in thread order; under a simulated
        # clock each part goes in turn instead, so the run is reproducible, and
        # so they do from an instance's thread (see ``Calls.one_at_a_time``). The part of
        # an instance that waits for a slot is stored from here instead, decided as its
        # turn comes (the part before may have taken the last slot).
        cells, send = self._instances.cells, self._instances.send
        here = [(index, p) for index, p in groups.items() if index not in away]
        at_once = not self._calls.one_at_a_time()
        futures = {
            index: send(index, partial(Enqueue, pick(items, p)))
            for index, p in here
            if at_once and cells.start(index) is not None
        }
        for index, positions in here:
            try:
                waiting = (index not in futures) if at_once else cells.waits(index)
                if waiting:
                    refused = self._store_waiting({index: positions}, items, results)
                    failure = failure or refused
                    continue
                if at_once:
                    stored = self._calls.wait(futures[index])
                else:
                    stored = self._calls.call(index, partial(Enqueue, pick(items, positions)))
            except NotLeasedError as exc:  # released since the table was published
                mine = {index: groups[index]}
                failure = failure or self._instances.store_away(mine, items, results, exc)
                continue
            except DopoolError as exc:
                failure = failure or exc
                continue
            place(results, groups[index], stored)
        if failure is not None:
            failure.stored = [result for result in results if result is not None]
            raise failure
        return results

    def _away_one(self, index: int, items: tuple[Item, ...], refused: Any) -> list[EnqueueResult]:
        return self._one(partial(self._instances.store_away, refused=refused), index, items)

    @staticmethod
    def _one(
        store: Callable[[dict[int, Positions], tuple[Item, ...], list[Any]], DopoolError | None],
        index: int,
        items: tuple[Item, ...],
    ) -> list[EnqueueResult]:
        """One event stored from this thread on instance ``index`` by ``store``; its result."""
        results: list[Any] = [None]
        failure = store({index: range(1)}, items, results)
        if failure is not None:
            raise failure
        return results

    # -- control -----------------------------------------------------------------
    def pause(self, index: int | None = None) -> None:
        self._each(index, Pause())

    def resume(self, index: int | None = None) -> None:
        self._each(index, Resume())

    def drain(self, index: int | None = None) -> int:
        return sum(self._each(index, Drain()))

    def cancel(self, event_id: str) -> bool:
        self._check_open()
        index, sequence = parse_event_id(event_id, self.name, self.concurrency)
        self._refuse_own_instance(index)
        return bool(self._act(index, Cancel(sequence)))

    # -- recurring schedules ----------------------------------------------------------
    def schedule(self, name: str, event: Any, **options: Unpack[ScheduleOptions]) -> ScheduleInfo:
        self._check_open()
        self._refuse_own_instance(0)
        spec = definition(name, event, options, self._schema, self.concurrency)
        return schedule_info(self._act(0, DefineSchedule(spec)))

    def unschedule(self, name: str) -> bool:
        self._check_open()
        self._refuse_own_instance(0)
        return bool(self._act(0, Unschedule(name)))

    def _act(self, index: int, request: Request) -> Any:
        """Instance ``index``'s answer to ``request``: from its actor, or, in a shared worker
        while another worker serves it, the same transition made in the store."""
        return self._instances.either(
            index,
            lambda i: self._control([(i, request)])[0],
            lambda away: away.apply(index, request),
        )

    def _control(self, requests: list[tuple[int, Request]]) -> list[Any]:
        """Each instance's answer to its request: from its actor, or, for one waiting for a
        slot, the same transition made in the store from this thread (no caller waits for
        a slot: docs/guarantees.md, "At most max_active at once"). One instance after
        another where calls are ordered (see :meth:`Calls.send_each`), each decided as its
        turn comes; else all sent at once, those not waiting started first."""
        stored, cells = self._instances.stored, self._instances.cells
        if self._calls.one_at_a_time():
            return [
                stored.apply(i, r) if cells.waits(i) else self._calls.call(i, partial(Control, r))
                for i, r in requests
            ]
        futures = [
            None if cells.start(i) is None else self._instances.send(i, partial(Control, r))
            for i, r in requests
        ]
        return [
            stored.apply(i, r) if future is None else future.get()
            for (i, r), future in zip(requests, futures, strict=True)
        ]

    def schedules(self) -> list[ScheduleInfo]:
        self._check_open()
        with self._read() as txn:
            return read_schedules(txn, self.name)

    def redrive(
        self,
        dead_letters: Iterable[DeadLetter] | None = None,
        *,
        index: int | None = None,
        **filters: Unpack[FilterOptions],
    ) -> int:
        """Re-enqueue dead letters on their own instance, as new events; returns how many.

        All, or those that match everything given: the records in ``dead_letters``,
        instance ``index``, the filters of :meth:`dead_letters`. One transaction each.

        Raises:
            FilterError: a bad filter, or ``where`` raised; nothing was redriven.
            ConfigurationError: not DeadLetter records, or an index of no instance.
        """
        return self._act_on_dead_letters(Redrive, dead_letters, index, Filters.of(filters))

    def purge_dead_letters(
        self,
        dead_letters: Iterable[DeadLetter] | None = None,
        *,
        index: int | None = None,
        **filters: Unpack[FilterOptions],
    ) -> int:
        """Delete dead letters chosen as :meth:`redrive` chooses; how many. Counters stay."""
        return self._act_on_dead_letters(Purge, dead_letters, index, Filters.of(filters))

    def _act_on_dead_letters(
        self,
        verb: type[Redrive | Purge],
        dead_letters: Iterable[DeadLetter] | None,
        index: int | None,
        filters: Filters,
    ) -> int:
        """Choose (outside every instance), then send each instance its sequences."""
        self._check_open()
        indices = self._indices(index)
        among = None
        if dead_letters is not None:
            name = "redrive" if verb is Redrive else "purge_dead_letters"
            among = by_instance(dead_letters, self._instances.check, name)
        for addressed in [index] if among is None or index is not None else among:
            self._refuse_own_instance(addressed)
        if among is None and not filters.given:
            requests = {i: verb(None) for i in self._holding(indices)}
        else:
            now = self._context.clock.now()
            picked = chosen(self._read, self.name, indices, filters, now, among)
            requests = {i: verb(picked[i]) for i in sorted(picked)}
        if self._instances.away is not None:
            return sum(self._act(i, request) for i, request in requests.items())
        return sum(self._control(list(requests.items())))

    def _indices(self, index: int | None) -> list[int]:
        """``index`` checked, or (None) every instance ever used: the others hold nothing."""
        if index is not None:
            return [self._instances.check(index)]
        with self._read() as txn:
            return used_instances(txn, self.name)

    def _holding(self, indices: list[int]) -> list[int]:
        """Those of ``indices`` whose meta says they hold dead letters (or is damaged: the
        instance answers for itself), so that no other instance is started for nothing."""
        held = []
        with self._read() as txn:
            for index in indices:
                try:
                    meta = Namespace(self.name, index).load_meta(txn)
                except DamagedRecordError:
                    held.append(index)
                    continue
                if meta.held_dead_letters:
                    held.append(index)
        return held

    def _each(self, index: int | None, request: Pause | Resume | Drain) -> list[Any]:
        """Send a request to one instance or to all those ever used at once, then gather
        the answers. A pause or resume of the whole pool is stored for it first, in the
        transaction that reads which instances were used: one first used after it starts
        paused, or not, as it says (docs/api.md, "pause")."""
        self._check_open()
        self._refuse_own_instance(index)
        if index is not None or isinstance(request, Drain):
            indices = self._indices(index)
        else:
            with self._env.store.write() as txn:
                set_pool_paused(txn, self.name, isinstance(request, Pause))
                indices = used_instances(txn, self.name)
        verb = _VERBS.get(type(request))
        if verb is None or self._instances.away is None:  # all here (but a shared worker's)
            return self._control([(i, request) for i in indices])
        message = partial(Control, request)
        return self._instances.control(verb, indices, lambda i: self._calls.call(i, message))

    # -- reading committed state -------------------------------------------------
    def status(
        self, *, instances: Iterable[int] | None = None, limit: int | None = None
    ) -> PoolStatus:
        self._check_open()
        listing = Listing(instances, limit).check(self.concurrency)
        # The restart state is in memory (of the instances started), read without waiting.
        cells = self._instances.cells
        made = cells.made()
        restarts = {
            cell.index: (cell.supervisor.crash_streak, cell.supervisor.restart_at) for cell in made
        }
        with self._read() as txn:
            return read_pool_status(
                txn,
                self.name,
                self.concurrency,
                listing,
                restarts,
                active=sum(not cell.mailbox.held for cell in made),
                waiting=cells.waiting,
            )

    def event(self, event_id: str) -> EventInfo | None:
        self._check_open()
        index, sequence = parse_event_id(event_id, self.name, self.concurrency)
        keep, now = self._spec.options.keep_finished, self._context.clock.now()
        with self._read() as txn:
            ns = Namespace(self.name, index)
            return lookup(txn, ns, ns.load_meta(txn), self.name, index, sequence, keep, now)

    def storage(
        self, *, partition_key: str | None = None, instance: int | None = None
    ) -> StorageView:
        self._check_open()
        return ReadOnlyStorage.of(self._read, self.name, self.concurrency, partition_key, instance)

    def dead_letters(
        self, index: int | None = None, **filters: Unpack[FilterOptions]
    ) -> list[DeadLetter]:
        self._check_open()
        matching, indices = Filters.of(filters), self._indices(index)
        now = self._context.clock.now()
        return listed(self._read, self.name, indices, matching, now)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or in flight on any instance, follow-ups included:
        those in this pool's outboxes (into any pool) until their target has them, and
        those into this pool still in any pool's outbox.

        Under a :class:`SimulatedClock` this drives virtual time until then, and
        returns False at once if nothing scheduled can make progress (e.g. the
        pool is paused). ``timeout`` is in wall-clock seconds; False on timeout.
        """
        self._check_open()
        running = self._context.handler_running()
        if running is not None:
            raise ConfigurationError(
                f"join() called from the handler of {running[0]}:{running[1]}, which it would "
                "wait for forever"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        clock = self._context.clock
        activity = clock.activity
        while True:
            generation = activity.generation
            if self._finished():
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            try:
                if not clock.progress(generation, deadline):
                    return self._finished()
            except TimeoutError:
                return False

    def _finished(self) -> bool:
        with self._read() as txn:
            # An instance with pending events or an outbox has a work index entry.
            if next(work_index(txn, self.name), None) is not None:
                return False
            if follow_ups_to(txn, self.name):  # into this pool, from another's outbox
                return False
        return not self._context.clock.activity.busy(self._keys)

    def _refuse_own_instance(self, index: int | None) -> None:
        """Refuse a call from a handler that would wait on that handler's own instance.

        ``index=None`` means any instance of this pool may be involved.
        """
        running = self._context.handler_running()
        if running is None or running[0] != self.name:
            return
        if index is None or index == running[1]:
            raise ConfigurationError(
                f"called from the handler of {self.name}:{running[1]}, which would wait on "
                "itself forever; use ctx.enqueue for follow-ups, or address another instance"
            )

    def _check_open(self) -> None:
        if self._context.closed():
            raise PoolClosedError(self.name)
