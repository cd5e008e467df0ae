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
"""

from __future__ import annotations

import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from dopool import (
    DeadLetter,
    DopoolError,
    EventContext,
    InstanceCrashedError,
    PermanentError,
    PoolEvent,
    QueueFullError,
    RetryAfter,
    Runtime,
    SimulatedClock,
    WorkerPool,
    _ports,
)
from dopool._chaos.checker import Model
from dopool._chaos.clockdriver import ClockDriver, _Stop
from dopool._chaos.history import (
    Ack,
    Call,
    Ev,
    Exec,
    History,
    Phase,
    Purged,
    Redriven,
    Resumed,
)
from dopool._chaos.result import Result
from dopool._chaos.scenario import POOL, Scenario, Step, generate
from dopool._chaos.snapshot import InstanceSnapshot, read_store

JOIN_TIMEOUT = 60.0  # wall seconds; virtual time is free
FINAL_ROUNDS = 5  # resume-and-join rounds at the end
# Under alarm_retries each round's alarm faults may give an instance's alarm up again:
# rounds go on while they make progress, and stop after this many in a row that make none.
STALL_ROUNDS = 50
RESUME_TRIES = 50  # a fault may crash a resume; each try draws again


def run_seed(seed: int, *, keep_log: bool = False) -> Result:
    """Generate the scenario for ``seed`` and run it."""
    return Runner(generate(seed), keep_log=keep_log).run()


def run_seed_quietly(seed: int) -> Result:
    """:func:`run_seed` for a worker process: the trace (large) stays behind."""
    result = run_seed(seed)
    result.trace = b""
    return result


class Runner:
    """Runs one :class:`Scenario` on a fresh temporary store."""

    def __init__(self, scenario: Scenario, *, keep_log: bool = False) -> None:
        self.scenario = scenario
        self.keep_log = keep_log
        self.history = History(scenario.concurrency, scenario.retry)
        self.model = Model(self.history)
        self.clock = SimulatedClock()
        self.driver = ClockDriver(self.clock)
        self.runtime: Runtime | None = None
        self.pool: WorkerPool | None = None
        self._directory = Path(tempfile.mkdtemp(prefix="dopool-chaos-"))
        self._traces: list[Path] = []
        self._unsubscribe: Any = None

    # -- the run ---------------------------------------------------------------------
    def run(self) -> Result:
        started = time.perf_counter()
        history = self.history
        idle = False
        try:
            history.add(Call(-1, "open"))
            self._open()
            for number, step in enumerate(self.scenario.steps):
                history.add(Call(number, step.describe()))
                self._do(step)
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
        violations = self.model.finish(idle=idle)
        result = self._result(violations, idle)
        result.wall_time = time.perf_counter() - started
        shutil.rmtree(self._directory, ignore_errors=True)
        return result

    def _result(self, violations: list[str], idle: bool) -> Result:
        model = self.model
        instances = model.instances
        result = Result(
            seed=self.scenario.seed,
            violations=violations,
            steps=len(self.scenario.steps),
            enqueued=sum(i.enqueued for i in instances),
            acknowledged=sum(isinstance(r, Ack) for r in self.history.records),
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
    def _open(self) -> None:
        scenario = self.scenario
        trace = self._directory / f"trace-{len(self._traces)}.jsonl"
        self._traces.append(trace)
        self.history.add(Phase("opening"))
        runtime = Runtime(
            self._directory / "store",
            clock=self.clock,
            seed=scenario.seed,
            durability="async",  # actor crashes only: the OS page cache is durable enough
            faults=scenario.faults,
            trace=trace,
        )
        self.runtime = runtime
        self._unsubscribe = runtime.subscribe(self._on_event)
        try:
            self.pool = runtime.define(
                POOL,
                execute=self._execute,
                concurrency=scenario.concurrency,
                retry=scenario.retry,
                max_queue_depth=scenario.max_queue_depth,
                alarm_retries=scenario.alarm_retries,
            )
        except InstanceCrashedError as exc:
            raise _Stop(
                f"define() raised InstanceCrashedError ({exc}): a fault crashed an instance "
                "during its start-up recovery, and the crash reached the caller"
            ) from exc

    def _close(self) -> None:
        runtime, self.runtime, self.pool = self.runtime, None, None
        if runtime is not None:
            self.history.add(Phase("closing"))
            runtime.close()
            if self._unsubscribe is not None:
                self._unsubscribe()

    def _reopen(self) -> None:
        self._close()
        self._open()

    # -- what the engine calls -------------------------------------------------------------
    def _on_event(self, event: PoolEvent) -> None:
        self.history.add(
            Ev(
                event.kind,
                event.instance_index,
                event.sequence,
                event.attempt,
                event.time,
                event.error,
            )
        )

    def _execute(self, ctx: EventContext) -> None:
        """The handler: does what the event's fields say (see ``dopool._chaos.scenario``)."""
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
        history = self.history
        history.name((ctx.instance_index, ctx.sequence), ident, "its handler")
        history.add(
            Exec(ident, ctx.instance_index, ctx.sequence, attempt, ctx.started_at, outcome, kids)
        )
        for kid_id, spec in zip(kids, event["kids"], strict=True):
            kid = {"id": kid_id, **spec}
            history.contents.setdefault(kid_id, kid)
            ctx.enqueue(kid, partition_key=kid["pk"], priority=kid["prio"])
        if outcome == "kill":
            runtime = self.runtime
            assert runtime is not None
            runtime.kill(ctx.pool_name, ctx.instance_index)
        if event["sleep"]:
            with self.driver.asleep():
                ctx.sleep(event["sleep"])
        if outcome == "error":
            raise RuntimeError(f"planned failure of {ident} attempt {attempt}")
        if outcome == "retry":
            raise RetryAfter(event["after"])
        if outcome == "perm":
            raise PermanentError(f"planned permanent failure of {ident}")

    # -- steps ------------------------------------------------------------------------------
    def _do(self, step: Step) -> None:
        pool = self.pool
        assert pool is not None
        kind, args = step.kind, step.args
        if kind == "advance":
            self.driver.advance(args["seconds"])
            return
        if kind == "kill":
            assert self.runtime is not None
            self.runtime.kill(POOL, args["index"])
            return
        if kind == "join":
            pool.join(timeout=JOIN_TIMEOUT)
            return
        if kind == "reopen":
            self._reopen()
            return
        self.driver.settle()
        try:
            if kind == "enqueue":
                for event in args["events"]:
                    self._enqueue([event], event["pk"], event["prio"], many=False)
            elif kind == "enqueue_many":
                self._enqueue(args["events"], args["pk"], args["prio"], many=True)
            elif kind == "pause":
                pool.pause(args["index"])
            elif kind == "resume":
                self._resume(args["index"])
            elif kind == "drain":
                self._drain(args["index"])
            elif kind == "redrive":
                self._redrive(args["which"])
            elif kind == "purge":
                self._purge()
            else:
                raise ValueError(f"unknown step kind {kind!r}")
        except InstanceCrashedError:
            # A fault crashed an instance during the call; its part was rolled back.
            self.driver.after_crash()

    def _enqueue(self, events: list[dict[str, Any]], pk: str | None, prio: int, many: bool) -> None:
        pool = self.pool
        assert pool is not None
        history = self.history
        for event in events:
            history.contents[event["id"]] = event
        try:
            if many:
                results = pool.enqueue_many(events, partition_key=pk, priority=prio)
            else:
                results = [pool.enqueue(events[0], partition_key=pk, priority=prio)]
        except (InstanceCrashedError, QueueFullError) as exc:
            if isinstance(exc, InstanceCrashedError):
                self.driver.after_crash()
            self._acknowledge_stored(list(exc.stored))
            return
        for event, result in zip(events, results, strict=True):
            entry = (result.instance_index, result.sequence)
            history.name(entry, event["id"], "enqueue's result")
            history.add(Ack(event["id"], *entry))

    def _acknowledge_stored(self, stored: list[Any]) -> None:
        """A batch failed part-way: acknowledge the parts its error says were stored."""
        if not stored:
            return
        snapshots = self._read_store()
        for result in stored:
            queued = snapshots[result.instance_index].queue.get(result.sequence)
            if queued is None or queued[1] is None:
                self.history.problem(f"enqueue_many reported {result} stored, but it is not")
                continue
            entry = (result.instance_index, result.sequence)
            self.history.name(entry, queued[1], "storage")
            self.history.add(Ack(queued[1], *entry))

    def _drain(self, index: int | None) -> None:
        pool = self.pool
        assert pool is not None
        before = self._snapshot()
        indices = range(self.scenario.concurrency) if index is None else [index]
        expected = sum(len(before[i].queue) for i in indices)
        removed = pool.drain(index)
        if removed != expected:
            self.history.problem(f"drain({index}) returned {removed}, {expected} were pending")

    def _redrive(self, which: str) -> None:
        pool = self.pool
        assert pool is not None
        letters = pool.dead_letters()
        chosen = letters if which == "all" else [d for d in letters if d.sequence % 2]
        by_entry = {(d.instance_index, d.sequence): d for d in letters}
        for dead in letters:
            self.history.name((dead.instance_index, dead.sequence), _id(dead), "dead_letters()")
        try:
            count = pool.redrive(None if which == "all" else chosen)
        except InstanceCrashedError:
            self.driver.after_crash()
            count = None
        finally:
            after = {(d.instance_index, d.sequence) for d in pool.dead_letters()}
            gone = [entry for entry in by_entry if entry not in after]
            self.history.add(Redriven(tuple((i, s, _id(by_entry[(i, s)])) for i, s in gone)))
        if count is not None and count != len(chosen):
            self.history.problem(f"redrive returned {count}, {len(chosen)} were chosen")
        if count is not None and count != len(gone):
            self.history.problem(f"redrive returned {count}, {len(gone)} left the dead letters")

    def _purge(self) -> None:
        pool = self.pool
        assert pool is not None
        letters = pool.dead_letters()
        for dead in letters:
            self.history.name((dead.instance_index, dead.sequence), _id(dead), "dead_letters()")
        try:
            pool.purge_dead_letters()
        except InstanceCrashedError:
            self.driver.after_crash()
            raise
        finally:
            after = {(d.instance_index, d.sequence) for d in pool.dead_letters()}
            gone = tuple(
                (d.instance_index, d.sequence)
                for d in letters
                if (d.instance_index, d.sequence) not in after
            )
            self.history.add(Purged(gone))

    def _resume(self, index: int | None) -> None:
        """``pool.resume(index)``, which also wakes a stalled instance; the history says so."""
        pool = self.pool
        assert pool is not None
        try:
            pool.resume(index)
        finally:
            self.history.add(Resumed(index))

    def _finish(self) -> bool:
        """Resume everything and run until idle; True if the pool ended with nothing to do.

        A resume also wakes an instance whose alarm was given up (``alarm_retries``):
        the write that a stalled instance waits for.
        """
        rounds = still = processed = 0
        while rounds < FINAL_ROUNDS:
            pool = self.pool
            assert pool is not None
            self.driver.settle()
            self._resume_stopped()
            if pool.join(timeout=JOIN_TIMEOUT):
                return True
            status = pool.status()
            seen = {i.state for i in status.instances}
            if "stalled" in seen:
                still = 0 if status.processed > processed else still + 1
                processed = status.processed
                if still < STALL_ROUNDS:
                    continue
            if "paused" not in seen:
                break
            rounds += 1
        pool = self.pool
        assert pool is not None
        snapshots = self._read_store()
        states = [
            f"{i.index}:{i.state} pending={i.pending} outbox={snap.meta.outbox} "
            f"alarm={i.next_alarm_at}"
            for i, snap in zip(pool.status().instances, snapshots, strict=True)
        ]
        self.history.problem(f"the pool never became idle ({'; '.join(states)})")
        return False

    def _resume_stopped(self) -> None:
        """Resume each paused or stalled instance, trying again while faults crash the resume."""
        pool = self.pool
        assert pool is not None
        for _ in range(RESUME_TRIES):
            states = pool.status().instances
            stopped = [i.index for i in states if i.state in ("paused", "stalled")]
            if not stopped:
                return
            for index in stopped:
                try:
                    self._resume(index)
                except InstanceCrashedError:
                    self.driver.after_crash()

    # -- checking -------------------------------------------------------------------------
    def _read_store(self) -> list[InstanceSnapshot]:
        """Every instance's committed state, and the events it holds, in one snapshot."""
        assert self.runtime is not None
        with _ports.committed(self.runtime) as txn:
            return read_store(txn, POOL, self.scenario.concurrency)

    def _snapshot(self) -> list[Any]:
        """Read storage, learning which event every queued and dead entry holds."""
        snapshots = self._read_store()
        for index, snap in enumerate(snapshots):
            for seq, (_, ident) in snap.queue.items():
                if ident is not None:
                    self.history.name((index, seq), ident, "storage")
            for seq, (ident, _) in snap.dead.items():
                if ident is not None:
                    self.history.name((index, seq), ident, "storage")
        return snapshots

    def _checkpoint(self, *, final: bool = False) -> None:
        """Compare storage and status with the replay; the system is quiescent here."""
        pool = self.pool
        assert pool is not None
        snapshots = self._snapshot()
        self.model.catch_up()
        self.model.compare(snapshots, final=final)
        status = pool.status()
        for inst, snap in zip(status.instances, snapshots, strict=True):
            meta = snap.meta
            seen = (inst.enqueued, inst.succeeded, inst.dead_lettered, inst.drained, inst.pending)
            stored = (meta.enqueued, meta.succeeded, meta.dead_lettered, meta.drained, meta.pending)
            if seen != stored:
                self.history.problem(
                    f"status() of instance {inst.index} {seen} != storage {stored}"
                )


def _id(dead: DeadLetter) -> str:
    event = dead.event
    return str(event.get("id")) if isinstance(event, dict) else repr(event)


def _describe(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    place = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    kind = "engine error" if isinstance(exc, DopoolError) else "error"
    return f"{kind} {type(exc).__name__}: {exc}{place}"
