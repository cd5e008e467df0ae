"""Run one scenario against the real engine on a SimulatedClock, and check it.

The runner owns a temporary store and one :class:`SimulatedClock` that lives
across close-and-reopen, so virtual time goes on. It subscribes to every pool
event, records each handler call, each acknowledged enqueue and each of its own
calls into one :class:`~dopool._chaos.history.History`, and after every step compares
committed storage with a replay of that history (:class:`~dopool._chaos.checker.Model`).

Before any call that talks to an instance it settles the clock, so that no call
waits on a sleeping handler (:class:`~dopool._chaos.clockdriver.ClockDriver`).
Three calls are made without settling, on purpose, because the engine must
cope with a sleeping handler there: ``runtime.kill`` (returns at once; the
attempt is interrupted when the handler returns), ``runtime.close`` (steps the
clock itself until running handlers finish) and ``pool.join`` (drives the clock).

A scenario with a second pool defines both in each runtime (the first one
first); the history numbers their instances in one row (``Scenario.flat``), so
the checker follows events, follow-ups included, across the two. A reopen may
leave the second pool undefined until a later step needs it: meanwhile the
follow-ups for it wait in the first pool's outboxes, and a handler that sends
one fails its attempt (``ConfigurationError``).

A scenario whose ``handler`` is ``"async"`` defines the pools with an ``async def``
handler (:meth:`Runner._execute_async`): the same steps as the plain one
(:meth:`Runner._begin` before the sleep, :func:`_end` after it), but it sleeps with
``await ctx.sleep_async``, in the loop the engine runs it on in virtual time.

A pool the scenario rate limits (``Scenario.rate_limits``) is defined with its limit in
every runtime, a ``burst`` of 1 as text (``"2/s"``, ``"30/60s"``), any other as a
:class:`~dopool.RateLimit`; the history names the pool's instances and its limit
(``History.limits``), against which the checker holds the starts the pool's events say.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import traceback
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NamedTuple

from dopool._chaos import recurring
from dopool._chaos.calls import Calls
from dopool._chaos.checker import Model
from dopool._chaos.clockdriver import ClockDriver, _Stop
from dopool._chaos.history import Ack, Call, Ev, Exec, History, Phase
from dopool._chaos.result import Result
from dopool._chaos.scenario import POOL, SECOND_POOL, Scenario, Step, generate
from dopool._chaos.snapshot import InstanceSnapshot, read_store, stored_id
from dopool._clock.clocks import SimulatedClock
from dopool._engine import logs
from dopool._engine.context import EventContext
from dopool._errors import (
    ConfigurationError,
    DopoolError,
    InstanceCrashedError,
    PermanentError,
    RetryAfter,
)
from dopool._handles.pool import WorkerPool
from dopool._handles.tools import ToolRuntime
from dopool._machine.invariants import (
    SUCCESS_COUNTER,
    dedup_violations,
    index_violations,
    link_violations,
    read_dedup_tally,
    read_links,
)
from dopool._rates import RateLimit
from dopool._store.layout import used_instances
from dopool._store.txn import Txn
from dopool._types import PoolEvent, ScheduleInfo

JOIN_TIMEOUT = 60.0  # wall seconds; virtual time is free
# Under alarm_retries each round's alarm faults may give an instance's alarm up again:
# rounds go on while they make progress, and stop after this many in a row that make none.
STALL_ROUNDS = 50
FINAL_ROUNDS = 5  # resume-and-join rounds at the end
RESUME_TRIES = 50  # a fault may crash a resume; each try draws again
JOIN_ROUNDS = 20  # rounds of joining every pool, until one round changes nothing
HELD = "wait in the outbox until it is defined"  # the engine's warning, on purpose here


def _not_held(record: logging.LogRecord) -> bool:
    """A reopen without the second pool holds follow-ups for it: that is the plan."""
    return HELD not in record.getMessage()


def run_seed(seed: int, *, keep_log: bool = False) -> Result:
    """Generate the scenario for ``seed`` and run it."""
    return Runner(generate(seed), keep_log=keep_log).run()


def run_seed_quietly(seed: int) -> Result:
    """:func:`run_seed` for a worker process: the trace (large) stays behind."""
    result = run_seed(seed)
    result.trace = b""
    return result


class Runner(Calls):
    """Runs one :class:`Scenario` on a fresh temporary store."""

    def __init__(self, scenario: Scenario, *, keep_log: bool = False) -> None:
        self.scenario = scenario
        self.keep_log = keep_log
        self.history = History(
            scenario.retry,
            bounded=scenario.max_active is not None,
            limits=tuple(
                (pool, *scenario.span(pool), limit) for pool, limit in scenario.rate_limits
            ),
        )
        self.enqueued: list[tuple[str, int, int]] = []  # for cancel steps (Calls._cancel)
        self.model = Model(self.history)
        self.clock = SimulatedClock()
        self.driver = ClockDriver(self.clock)
        self.runtime: ToolRuntime | None = None
        self.pools: dict[str, WorkerPool] = {}
        self._missing: str | None = None  # a pool the last reopen left undefined
        self._directory = Path(tempfile.mkdtemp(prefix="dopool-chaos-"))
        self._traces: list[Path] = []
        self._unsubscribe: Any = None
        self._firsts: dict[str, ScheduleInfo] = {}  # each schedule as first defined

    @property
    def pool(self) -> WorkerPool | None:
        """The first pool, once defined."""
        return self.pools.get(POOL)

    # -- the run ---------------------------------------------------------------------
    def run(self) -> Result:
        """Run the scenario; its store goes, whatever happens (Ctrl-C too). Its planned
        failures and crashes are not logged: the result tells them."""
        try:
            with logs.modelled():
                return self._run()
        finally:
            shutil.rmtree(self._directory, ignore_errors=True)

    def _run(self) -> Result:
        started = time.perf_counter()
        history = self.history
        idle = False
        logging.getLogger("dopool").addFilter(_not_held)
        try:
            history.add(Call(-1, "open"))
            self._open()
            for number, step in enumerate(self.scenario.steps):
                history.add(Call(number, step.describe()))
                self._do(step)
                # A call returns once its instances answered; one it set moving in passing
                # (an instance given the slot another yielded, which crashes as it starts)
                # may still be mid-message: the store is compared once all are done.
                self.clock.settle()
                self._checkpoint()
            history.add(Call(len(self.scenario.steps), "final resume and join"))
            idle = self._finish()
            self._checkpoint(final=idle)
        except _Stop as stop:
            history.problem(f"harness stopped: {stop}")
        except Exception as exc:
            history.problem(f"harness stopped: {_describe(exc)}")
        finally:
            self._close()
            logging.getLogger("dopool").removeFilter(_not_held)
        violations = self.model.finish(idle=idle)
        result = self._result(violations, idle)
        result.wall_time = time.perf_counter() - started
        return result

    def _result(self, violations: list[str], idle: bool) -> Result:
        model = self.model
        instances = list(model.instances.values())
        result = Result(
            seed=self.scenario.seed,
            violations=violations,
            steps=len(self.scenario.steps),
            enqueued=sum(i.enqueued for i in instances),
            acknowledged=sum(isinstance(r, Ack) for r in self.history.records),
            scheduled=sum(state.due is not None for state in model.entries.values()),
            duplicates=len(model.duplicates),
            executions=model.executions,
            crashes=sum(i.crashed for i in instances),
            restarts=sum(i.recovered for i in instances),
            succeeded=sum(i.succeeded for i in instances),
            dead_lettered=sum(i.dead_lettered for i in instances),
            drained=sum(i.drained for i in instances),
            reopens=len(self._traces) - 1,
            virtual_time=self.clock.now(),
            idle=idle,
        )
        result.trace = b"".join(path.read_bytes() for path in self._traces if path.exists())
        if self.keep_log:
            result.log = [repr(record) for record in self.history.records]
        return result

    # -- opening and closing ------------------------------------------------------------
    def _open(self, without: str | None = None) -> None:
        scenario = self.scenario
        trace = self._directory / f"trace-{len(self._traces)}.jsonl"
        self._traces.append(trace)
        self.history.add(Phase("opening"))
        runtime = ToolRuntime(
            self._directory / "store",
            clock=self.clock,
            seed=scenario.seed,
            durability="async",  # actor crashes only: the OS page cache is durable enough
            faults=scenario.faults,
            trace=trace,
            max_active=scenario.max_active,
        )
        self.runtime = runtime
        self._unsubscribe = runtime.subscribe(self._on_event)
        for name in scenario.pools:
            if name == without:
                self._missing = name
            else:
                self._define(name)

    def _define(self, name: str) -> None:
        assert self.runtime is not None
        scenario = self.scenario
        try:
            execute = self._execute_async if scenario.handler == "async" else self._execute
            self.pools[name] = self.runtime.define(
                name,
                execute=execute,
                concurrency=scenario.defined(name),
                retry=scenario.retry,
                max_queue_depth=scenario.max_queue_depth,
                alarm_retries=scenario.alarm_retries,
                dedup_window=scenario.dedup_window,
                idle_timeout=scenario.idle_timeout,
                rate_limit=_as_defined(scenario.rate_limit(name)),
            )
        except InstanceCrashedError as exc:
            raise _Stop(
                f"define() raised InstanceCrashedError ({exc}): a fault crashed an instance "
                "during its start-up recovery, and the crash reached the caller"
            ) from exc
        if name == self._missing:
            self._missing = None

    def _define_missing(self, step: Step | None = None) -> None:
        """Define the pool a reopen left out, before a step that needs it (or at the end)."""
        missing = self._missing
        if missing is None:
            return
        needs = step is None or step.kind not in ("advance", "join")
        if not needs and step is not None and step.args.get("pool", POOL) != missing:
            return  # time passes without it: its follow-ups wait in the outboxes
        self.history.add(Phase("defining"))
        self._define(missing)

    def _close(self) -> None:
        runtime, self.runtime, self.pools = self.runtime, None, {}
        self._missing = None
        if runtime is not None:
            self.history.add(Phase("closing"))
            runtime.close()
            if self._unsubscribe is not None:
                self._unsubscribe()

    def _reopen(self, without: str | None) -> None:
        self._close()
        self._open(without)

    def _flat(self, pool: str, index: int) -> int:
        return self.scenario.flat(pool, index)

    def _span(self, pool: str) -> tuple[int, int]:
        return self.scenario.span(pool)

    # -- what the engine calls -------------------------------------------------------------
    def _on_event(self, event: PoolEvent) -> None:
        inst = self._flat(event.pool, event.instance_index)
        if self.draining and event.kind == "enqueued" and event.sequence is not None:
            with self._committed() as txn:  # (committed before its event is emitted)
                ident = stored_id(txn, event.pool, event.instance_index, event.sequence)
            if ident is not None:
                self.history.name((inst, event.sequence), ident, "storage, during a drain")
        self.history.add(
            Ev(
                event.kind,
                inst,
                event.sequence,
                event.attempt,
                event.time,
                event.error,
            )
        )

    def _execute(self, ctx: EventContext) -> None:
        """The handler: does what the event's fields say (see ``dopool._chaos.scenario``)."""
        planned = self._begin(ctx)
        sleep = ctx.event["sleep"]
        if sleep:
            with self.driver.asleep():
                ctx.sleep(sleep)
        _end(planned)

    async def _execute_async(self, ctx: EventContext) -> None:
        """The handler of an ``async`` scenario: :meth:`_execute`, awaiting its sleep."""
        planned = self._begin(ctx)
        sleep = ctx.event["sleep"]
        if sleep:
            with self.driver.asleep():
                await ctx.sleep_async(sleep)
        _end(planned)

    def _begin(self, ctx: EventContext) -> _Planned:
        """A handler's work before its sleep: decide the attempt's outcome, count it in the
        storage counter, enqueue the follow-ups, record the call, and kill the instance
        if the event is poison. What the handler raises after its sleep, if anything."""
        event = ctx.event
        ident = event["id"]
        attempt = ctx.attempt
        if event["poison"]:
            outcome = "kill"
        elif attempt <= event["fail"]:
            outcome = event["mode"]
        else:
            outcome = "ok"
        kids = tuple(f"{ident}.{attempt}.{n}" for n in range(len(event["kids"])))
        storage = ctx.storage  # committed with a success only (guarantee 6)
        storage.put(SUCCESS_COUNTER, storage.get(SUCCESS_COUNTER, 0) + 1)
        history = self.history
        inst = self._flat(ctx.pool_name, ctx.instance_index)
        history.name((inst, ctx.sequence), ident, "its handler")
        refused: ConfigurationError | None = None
        for kid_id, spec in zip(kids, event["kids"], strict=True):
            kid = {"id": kid_id, **spec}
            history.contents.setdefault(kid_id, kid)
            pool = None
            if kid.get("to") == "other":
                pool = SECOND_POOL if ctx.pool_name == POOL else POOL
            try:
                ctx.enqueue(kid, partition_key=kid["pk"], priority=kid["prio"], pool=pool)
            except ConfigurationError as exc:  # its pool is not defined in this runtime
                refused, outcome = exc, "error"
                break
        history.add(Exec(ident, inst, ctx.sequence, attempt, ctx.started_at, outcome, kids))
        if outcome == "kill":
            runtime = self.runtime
            assert runtime is not None
            runtime.kill(ctx.pool_name, ctx.instance_index)
        return _Planned(ident, attempt, outcome, event["after"], refused)

    # -- steps ------------------------------------------------------------------------------
    def _do(self, step: Step) -> None:
        self._define_missing(step)
        kind, args = step.kind, step.args
        name = args.get("pool", POOL)
        if kind == "advance":
            self.driver.advance(args["seconds"])
            return
        if kind == "reopen":
            self._reopen(args.get("without"))
            return
        pool = self.pools[name]
        if kind == "kill":
            assert self.runtime is not None
            self.runtime.kill(name, args["index"])
            return
        if kind == "join":
            pool.join(timeout=JOIN_TIMEOUT)
            return
        self.driver.settle()
        try:
            if kind == "enqueue":
                whens = args.get("when") or [None] * len(args["events"])
                for number, (event, when) in enumerate(zip(args["events"], whens, strict=True)):
                    if number:
                        self.driver.between_calls()
                    self._enqueue(pool, [event], event["pk"], event["prio"], False, when)
            elif kind == "enqueue_many":
                events, when = args["events"], args.get("when")
                self._enqueue(pool, events, args["pk"], args["prio"], True, when, args.get("ttl"))
            elif kind == "cancel":
                self._cancel(pool, args["back"])
            elif kind == "pause":
                self._pause(pool, args["index"])
            elif kind == "resume":
                self._resume(pool, args["index"])
            elif kind == "drain":
                self._drain(pool, args["index"])
            elif kind == "redrive":
                self._redrive(pool, args["which"])
            elif kind == "purge":
                self._purge(pool)
            elif kind == "schedule":
                recurring.define(pool, args, self.history, self._firsts)
            else:
                raise ValueError(f"unknown step kind {kind!r}")
        except InstanceCrashedError:
            # A fault crashed an instance during the call; its part was rolled back.
            self.driver.after_crash()

    def _finish(self) -> bool:
        """Resume everything and run until idle; True if the pools ended with nothing to do.

        A resume also wakes an instance whose alarm was given up (``alarm_retries``):
        the write that a stalled instance waits for. Under alarm faults a round may
        stall an instance again: rounds go on while they make progress.
        """
        self._define_missing()
        self.driver.settle()  # no handler asleep: the removals message instance 0
        recurring.settle(self.pools[POOL], self.history, self._firsts, self._unstick)
        rounds = still = processed = 0
        while rounds < FINAL_ROUNDS:
            self.driver.settle()
            for pool in self.pools.values():
                self._resume_stopped(pool)
            if self._join_all():
                return True
            statuses = [i for pool in self.pools.values() for i in pool.status().instances]
            seen = {i.state for i in statuses}
            if "stalled" in seen:
                done = sum(i.processed for i in statuses)
                still = 0 if done > processed else still + 1
                processed = done
                if still < STALL_ROUNDS:
                    continue
            if "paused" not in seen:
                break
            rounds += 1
        snapshots = self._read_store()
        states = [
            f"{i.instance_id}:{i.state} pending={i.pending} "
            f"outbox={snapshots[self._flat(pool.name, i.index)].meta.outbox} "
            f"alarm={i.next_alarm_at}"
            for pool in self.pools.values()
            for i in pool.status().instances
        ]
        self.history.problem(f"the pools never became idle ({'; '.join(states)})")
        return False

    def _unstick(self) -> None:
        """After a crashed call: its recovery, a clock step (a restart's backoff), and no
        handler left asleep."""
        self.driver.after_crash()
        self.driver.clock.step()
        self.driver.settle()

    def _join_all(self) -> bool:
        """Join every pool, round after round, until a round in which nothing happened.

        One pool's join may leave work for another (a follow-up into it), and with
        follow-ups both ways, back for the first.
        """
        for _ in range(JOIN_ROUNDS):
            seen = len(self.history.records)
            if not all(pool.join(timeout=JOIN_TIMEOUT) for pool in self.pools.values()):
                return False
            if len(self.history.records) == seen:
                return True
        return False

    def _resume_stopped(self, pool: WorkerPool) -> None:
        """Resume each paused or stalled instance, trying again while faults crash the resume."""
        for _ in range(RESUME_TRIES):
            states = pool.status().instances
            stopped = [i.index for i in states if i.state in ("paused", "stalled")]
            if not stopped:
                return
            for index in stopped:
                try:
                    self._resume(pool, index)
                except InstanceCrashedError:
                    self.driver.after_crash()

    # -- checking -------------------------------------------------------------------------
    def _committed(self) -> AbstractContextManager[Txn]:
        assert self.runtime is not None
        return self.runtime.committed()

    def _dedup_window(self) -> float:
        return self.scenario.dedup_window

    def _read_store(self) -> dict[int, InstanceSnapshot]:
        """The committed state of every instance ever used and of every one the history
        names, and the events each holds, in one snapshot, by the history's numbers; a pool
        not defined in this runtime is read as stored."""
        assert self.runtime is not None
        scenario = self.scenario
        named: dict[str, set[int]] = {name: set() for name in scenario.pools}
        for number in self.model.instances:
            pool, index = scenario.where(number)
            named[pool].add(index)
        snapshots: dict[int, InstanceSnapshot] = {}
        with self.runtime.committed() as txn:
            for name, indices in named.items():
                read = read_store(txn, name, sorted(indices.union(used_instances(txn, name))))
                snapshots.update((self._flat(name, i), snap) for i, snap in read.items())
        return snapshots

    def _snapshot(self) -> dict[int, InstanceSnapshot]:
        """Read storage, learning which event every queued and dead entry holds."""
        snapshots = self._read_store()
        for index, snap in snapshots.items():
            for seq, (_, ident) in snap.queue.items():
                if ident is not None:
                    self.history.name((index, seq), ident, "storage")
            for seq, (ident, _) in snap.dead.items():
                if ident is not None:
                    self.history.name((index, seq), ident, "storage")
        return snapshots

    def _checkpoint(self, *, final: bool = False) -> None:
        """Compare storage and status with the replay; the system is quiescent here."""
        assert self.runtime is not None
        snapshots = self._snapshot()  # (naming entries: before the replay needs the names)
        self.model.catch_up()
        if not set(self.model.instances) <= set(snapshots):
            snapshots = self._snapshot()  # and the instances the replay has named since
        with self.runtime.committed() as txn:
            links = link_violations(read_links(txn, self.scenario.pools))
            dedup = dedup_violations(read_dedup_tally(txn, self.scenario.pools))
            indexes = index_violations(txn, self.scenario.pools)
        self.model.compare(snapshots, links=links, dedup=dedup, indexes=indexes, final=final)
        for pool in self.pools.values():
            for inst in pool.status().instances:
                meta = snapshots[self._flat(pool.name, inst.index)].meta
                seen = (
                    inst.enqueued,
                    inst.succeeded,
                    inst.dead_lettered,
                    inst.drained,
                    inst.pending,
                )
                stored = (
                    meta.enqueued,
                    meta.succeeded,
                    meta.dead_lettered,
                    meta.drained,
                    meta.pending,
                )
                if seen != stored:
                    self.history.problem(
                        f"status() of instance {inst.instance_id} {seen} != storage {stored}"
                    )


class _Planned(NamedTuple):
    """How a handler call ends, decided before its sleep (:meth:`Runner._begin`)."""

    ident: str
    attempt: int
    outcome: str  # "ok", "kill", "error", "retry" or "perm"
    after: float  # a "retry"'s RetryAfter delay
    refused: ConfigurationError | None  # a follow-up's pool is not defined


def _end(planned: _Planned) -> None:
    """End a handler call as planned: return, or raise its failure."""
    if planned.refused is not None:
        raise planned.refused
    if planned.outcome == "error":
        raise RuntimeError(f"planned failure of {planned.ident} attempt {planned.attempt}")
    if planned.outcome == "retry":
        raise RetryAfter(planned.after)
    if planned.outcome == "perm":
        raise PermanentError(f"planned permanent failure of {planned.ident}")


def _as_defined(limit: RateLimit | None) -> RateLimit | str | None:
    """``limit`` as ``define`` is given it: as text if text can say it (no burst)."""
    if limit is None or limit.burst > 1:
        return limit
    per = "" if limit.per == 1 else f"{limit.per:g}"
    return f"{limit.rate:g}/{per}s"


def _describe(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    place = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    kind = "engine error" if isinstance(exc, DopoolError) else "error"
    return f"{kind} {type(exc).__name__}: {exc}{place}"
