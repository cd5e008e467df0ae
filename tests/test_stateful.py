"""The real pool on a SimulatedClock beside a model made of plain lists and counters.

Each event says how its handler call ends (``{"id", "fail", "mode", "spawn"}``: fail the
first ``fail`` attempts with a ``ValueError``, a ``RetryAfter`` or a ``PermanentError``;
``spawn`` adds a follow-up on the same partition), and the retry policy has no jitter,
so the model predicts every execution exactly: which event, which attempt, on which
instance, at what virtual time. Rules enqueue, pause, resume, drain, drive the clock,
switch an outage on and off, redrive and purge dead letters, and close and reopen the
runtime on the same clock; invariants compare status, storage keys, dead letters, hooks
and the execution log with the model after every step.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dopool import (
    DeadLetter,
    EmptyInfo,
    EnqueueResult,
    EventContext,
    PermanentError,
    PoolClosedError,
    RetryAfter,
    RetryPolicy,
    Runtime,
    SimulatedClock,
    WorkerPool,
)
from dopool._router import stable_hash
from dopool._storage import PRIORITY_MAX, PRIORITY_MIN, Namespace

POOL = "stateful"
CONCURRENCY = 3
MAX_ATTEMPTS = 3
POLICY = RetryPolicy(
    max_attempts=MAX_ATTEMPTS, initial_delay=1, multiplier=2, max_delay=10, jitter=0
)
RETRY_AFTER = 0.5  # the delay a "retry" event asks for
ERRORS = {"error": "ValueError", "retry": "RetryAfter", "permanent": "PermanentError"}

partition_keys = st.sampled_from([None, None, "alpha", "beta", "gamma", "delta", "epsilon"])
priorities = st.sampled_from([0, 1, -1, PRIORITY_MAX, PRIORITY_MIN])
behaviours = st.fixed_dictionaries(
    {
        "fail": st.sampled_from([0, 0, 0, 1, 2, 3, 4]),  # 3 or more: dead after 3
        "mode": st.sampled_from(["error", "error", "retry", "permanent"]),
        "spawn": st.booleans(),
    }
)
indices = st.none() | st.integers(0, CONCURRENCY - 1)


def policy_delay(attempt: int) -> float:
    """POLICY's delay after failed attempt ``attempt`` (no jitter)."""
    return float(min(2 ** (attempt - 1), 10))


def child_payload(parent_id: int) -> dict[str, Any]:
    """The follow-up a spawning event enqueues on its own partition."""
    return {"id": -parent_id - 1, "fail": 0, "mode": "error", "spawn": False}


class Execution(NamedTuple):
    """One call of the handler, as the handler saw it."""

    id: int
    sequence: int
    attempt: int
    time: float
    priority: int
    partition_key: str | None
    enqueued_at: float


@dataclass
class Event:
    """A stored event in the model."""

    payload: dict[str, Any]
    sequence: int
    priority: int
    partition_key: str | None
    enqueued_at: float

    @property
    def spawns(self) -> bool:
        return bool(self.payload["spawn"]) and self.partition_key is not None


@dataclass
class Dead:
    event: Event
    attempts: int
    failed_at: float
    error: str


@dataclass
class Instance:
    """One instance: its queue in run order, the started event, counters, dead letters."""

    index: int
    queue: list[Event] = field(default_factory=list)  # waiting, by (-priority, sequence)
    current: Event | None = None  # started, stays current until settled (head-of-line)
    attempt: int = 0
    retry_at: float | None = None
    paused: bool = False
    enqueued: int = 0
    succeeded: int = 0
    dead_lettered: int = 0
    drained: int = 0
    dead: dict[int, Dead] = field(default_factory=dict)
    executions: list[Execution] = field(default_factory=list)
    dead_order: list[int] = field(default_factory=list)  # sequences, as dead-lettered
    empties: list[int] = field(default_factory=list)  # ``processed`` at each on_empty

    @property
    def pending(self) -> int:
        return len(self.queue) + (self.current is not None)

    def add(self, payload: dict[str, Any], key: str | None, priority: int, now: float) -> int:
        """Queue a new event; returns its expected position (events that run before it)."""
        event = Event(payload, self.enqueued, priority, key, now)
        ahead = sum(e.priority >= priority for e in self.queue) + (self.current is not None)
        self.queue.append(event)
        self.queue.sort(key=lambda e: (-e.priority, e.sequence))
        self.enqueued += 1
        return ahead

    def drain(self) -> int:
        count = self.pending
        self.drained += count
        self.queue.clear()
        self.current = None
        self.attempt = 0
        self.retry_at = None
        return count

    def run(self, now: float, until: float, outage: bool) -> float | None:
        """Execute what the engine must execute up to ``until``; returns the last start."""
        t, last = now, None
        while not self.paused and self.pending:
            if self.current is not None and self.retry_at is not None:
                t = max(t, self.retry_at)  # a retry never runs early
            if t > until:
                break
            if self.current is None:
                self.current = self.queue.pop(0)
            event = self.current
            self.attempt += 1
            self.retry_at = None
            self.executions.append(
                Execution(
                    event.payload["id"],
                    event.sequence,
                    self.attempt,
                    t,
                    event.priority,
                    event.partition_key,
                    event.enqueued_at,
                )
            )
            last = t
            if outage:
                error, delay = "ValueError", policy_delay(self.attempt)
            elif self.attempt > event.payload["fail"]:
                self.succeeded += 1
                self._settle(event, t)
                continue
            else:
                error = ERRORS[event.payload["mode"]]
                retry = event.payload["mode"] == "retry"
                delay = RETRY_AFTER if retry else policy_delay(self.attempt)
            if error == "PermanentError" or self.attempt >= MAX_ATTEMPTS:
                self.dead_lettered += 1
                self.dead[event.sequence] = Dead(event, self.attempt, t, error)
                self.dead_order.append(event.sequence)
                self._settle(None, t)
            else:
                self.retry_at = t + delay
        return last

    def _settle(self, succeeded: Event | None, now: float) -> None:
        self.current = None
        self.attempt = 0
        self.retry_at = None
        if succeeded is not None and succeeded.spawns:
            # The follow-up commits with its parent's success, on the same instance.
            payload = child_payload(succeeded.payload["id"])
            self.add(payload, succeeded.partition_key, succeeded.priority, now)
        if not self.pending:
            self.empties.append(self.succeeded + self.dead_lettered)


class PoolMachine(RuleBasedStateMachine):
    """Drives one pool and its model with the same calls, and compares them."""

    def __init__(self) -> None:
        super().__init__()
        self.path = Path(tempfile.mkdtemp(prefix="dopool-stateful-"))
        self.clock = SimulatedClock()  # kept across close and reopen: time goes on
        self.model = [Instance(i) for i in range(CONCURRENCY)]
        self.next_id = 0
        self.outage = False
        self.log: list[list[Execution]] = [[] for _ in range(CONCURRENCY)]
        self.dead_hook: list[list[int]] = [[] for _ in range(CONCURRENCY)]
        self.empty_hook: list[list[int]] = [[] for _ in range(CONCURRENCY)]
        self.seen_letters: dict[tuple[int, int], DeadLetter] = {}
        self.wrong: list[str] = []  # what the handler and hooks saw that they should not
        self.last_keyless: int | None = None
        try:
            self.runtime, self.pool = self._open()
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)  # no teardown without a machine
            raise

    def teardown(self) -> None:
        self.runtime.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def _open(self) -> tuple[Runtime, WorkerPool]:
        runtime = Runtime(self.path, clock=self.clock, seed=0)
        pool = runtime.define(
            POOL,
            execute=self._execute,
            concurrency=CONCURRENCY,
            retry=POLICY,
            on_dead_letter=self._on_dead_letter,
            on_empty=self._on_empty,
        )
        self.last_keyless = None  # the round-robin position lives in the runtime
        return runtime, pool

    # -- the handler and hooks (run in instance threads, while the clock is driven) --
    def _execute(self, ctx: EventContext) -> None:
        event = ctx.event
        self.log[ctx.instance_index].append(
            Execution(
                event["id"],
                ctx.sequence,
                ctx.attempt,
                ctx.started_at,
                ctx.priority,
                ctx.partition_key,
                ctx.enqueued_at,
            )
        )
        # An assert here would only count as a failed attempt: keep what is wrong for later.
        if ctx.started_at != self.clock.now():
            self.wrong.append(f"started_at {ctx.started_at} at {self.clock.now()}")
        if ctx.is_retry != (ctx.attempt > 1):
            self.wrong.append(f"is_retry {ctx.is_retry} on attempt {ctx.attempt}")
        if (ctx.pool_name, ctx.instance_id) != (POOL, f"{POOL}:{ctx.instance_index}"):
            self.wrong.append(f"names {ctx.pool_name!r}, {ctx.instance_id!r}")
        if event["spawn"] and ctx.partition_key is not None:
            # Enqueued before the outcome is known: a failed attempt must discard it.
            child = child_payload(event["id"])
            ctx.enqueue(child, partition_key=ctx.partition_key, priority=ctx.priority)
        if self.outage:
            raise ValueError("outage")
        if ctx.attempt <= event["fail"]:
            if event["mode"] == "permanent":
                raise PermanentError("poison")
            if event["mode"] == "retry":
                raise RetryAfter(RETRY_AFTER)
            raise ValueError(f"attempt {ctx.attempt} of {event['id']}")

    def _on_empty(self, info: EmptyInfo) -> None:
        if (info.pool_name, info.instance_id) != (POOL, f"{POOL}:{info.instance_index}"):
            self.wrong.append(f"on_empty names {info.pool_name!r}, {info.instance_id!r}")
        self.empty_hook[info.instance_index].append(info.processed)

    def _on_dead_letter(self, dead: DeadLetter) -> None:
        self.dead_hook[dead.instance_index].append(dead.sequence)

    # -- helpers -------------------------------------------------------------
    def _new_payload(self, behaviour: dict[str, Any]) -> dict[str, Any]:
        payload = {"id": self.next_id, **behaviour}
        self.next_id += 1
        return payload

    def _accept(
        self,
        payload: dict[str, Any],
        result: EnqueueResult,
        partition_key: str | None,
        priority: int,
    ) -> None:
        """Check one EnqueueResult against the model, then add the event to the model."""
        index = result.instance_index
        if partition_key is not None:
            assert index == stable_hash(partition_key) % CONCURRENCY
        else:
            if self.last_keyless is not None:
                assert index == (self.last_keyless + 1) % CONCURRENCY, "not round-robin"
            self.last_keyless = index
        instance = self.model[index]
        assert result.instance_id == f"{POOL}:{index}"
        assert result.sequence == instance.enqueued, "sequences are consecutive from 0"
        position = instance.add(payload, partition_key, priority, self.clock.now())
        assert result.position == position

    def _drive_model(self, until: float) -> float:
        """Run the model up to ``until``; returns the time of the last execution (or now)."""
        now = self.clock.now()
        last = now
        for instance in self.model:
            started = instance.run(now, until, self.outage)
            if started is not None:
                last = max(last, started)
        return last

    def _chosen(self, index: int | None) -> list[Instance]:
        return self.model if index is None else [self.model[index]]

    def _remember_letters(self) -> list[DeadLetter]:
        letters = self.pool.dead_letters()
        for letter in letters:
            self.seen_letters[letter.instance_index, letter.sequence] = letter
        return letters

    def _redriven(self, letters: list[DeadLetter]) -> int:
        """Redriven letters become new events on their own instance, in sequence order."""
        now = self.clock.now()
        count = 0
        for letter in sorted(letters, key=lambda d: (d.instance_index, d.sequence)):
            instance = self.model[letter.instance_index]
            dead = instance.dead.pop(letter.sequence, None)
            if dead is not None:  # a stale record (already redriven or purged) is skipped
                old = dead.event
                instance.add(old.payload, old.partition_key, old.priority, now)
                count += 1
        return count

    # -- rules -----------------------------------------------------------------
    @rule(behaviour=behaviours, partition_key=partition_keys, priority=priorities)
    def enqueue(self, behaviour: dict[str, Any], partition_key: str | None, priority: int) -> None:
        payload = self._new_payload(behaviour)
        result = self.pool.enqueue(payload, partition_key=partition_key, priority=priority)
        self._accept(payload, result, partition_key, priority)

    @rule(
        batch=st.lists(behaviours, min_size=1, max_size=5),
        partition_key=partition_keys,
        priority=priorities,
    )
    def enqueue_many(
        self, batch: list[dict[str, Any]], partition_key: str | None, priority: int
    ) -> None:
        payloads = [self._new_payload(behaviour) for behaviour in batch]
        results = self.pool.enqueue_many(payloads, partition_key=partition_key, priority=priority)
        assert len(results) == len(payloads)
        for payload, result in zip(payloads, results, strict=True):
            self._accept(payload, result, partition_key, priority)

    @rule(index=indices)
    def pause(self, index: int | None) -> None:
        self.pool.pause(index)
        for instance in self._chosen(index):
            instance.paused = True

    @rule(index=indices)
    def resume(self, index: int | None) -> None:
        self.pool.resume(index)
        for instance in self._chosen(index):
            instance.paused = False

    @rule(index=indices)
    def drain(self, index: int | None) -> None:
        expected = sum(instance.drain() for instance in self._chosen(index))
        assert self.pool.drain(index) == expected
        for instance in self._chosen(index):
            assert self.pool.status().instances[instance.index].next_alarm_at is None

    @rule(on=st.sampled_from([False, False, True]))
    def outage_switch(self, on: bool) -> None:
        """Make every handler call fail (on), or end as its event says (off)."""
        self.outage = on

    @rule(seconds=st.sampled_from([0, 0.25, 0.5, 1, 2, 3, 7]), absolute=st.booleans())
    def advance(self, seconds: float, absolute: bool) -> None:
        until = self.clock.now() + seconds
        self._drive_model(until)
        if absolute:
            self.clock.run_until(until)
        else:
            self.clock.advance(seconds)
        assert self.clock.now() == until

    @rule()
    def run_until_idle(self) -> None:
        expected = self._drive_model(math.inf)
        self.clock.run_until_idle()
        assert self.clock.now() == expected

    @rule()
    def join(self) -> None:
        expected = self._drive_model(math.inf)
        stuck = any(instance.pending for instance in self.model)  # paused with work
        assert self.pool.join(timeout=30) is not stuck
        assert self.clock.now() == expected

    @rule(downtime=st.sampled_from([0, 0.5, 5]))
    def close_and_reopen(self, downtime: float) -> None:
        """Close (pending work stays durable), let virtual time pass, and reopen."""
        old = self.pool
        self.runtime.close()
        with pytest.raises(PoolClosedError):
            old.enqueue(self._new_payload({"fail": 0, "mode": "error", "spawn": False}))
        until = self.clock.now() + downtime
        self.clock.advance(downtime)  # nothing runs: no actor is left to run it
        assert self.clock.now() == until
        self.runtime, self.pool = self._open()

    @precondition(lambda self: any(i.dead for i in self.model) or self.seen_letters)
    @rule(picks=st.sets(st.integers(0, 15), max_size=4))
    def redrive_some(self, picks: set[int]) -> None:
        """Redrive chosen records, current or stale (already redriven or purged)."""
        self._remember_letters()
        candidates = sorted(self.seen_letters.values(), key=lambda d: -d.failed_at)
        chosen = [letter for i, letter in enumerate(candidates) if i in picks]
        expected = self._redriven(chosen)
        assert self.pool.redrive(chosen) == expected

    @precondition(lambda self: any(instance.dead for instance in self.model))
    @rule()
    def redrive_all(self) -> None:
        letters = self._remember_letters()
        expected = self._redriven(letters)
        assert self.pool.redrive() == expected == len(letters)

    @rule()
    def purge_dead_letters(self) -> None:
        self._remember_letters()
        expected = sum(len(instance.dead) for instance in self.model)
        assert self.pool.purge_dead_letters() == expected
        for instance in self.model:
            instance.dead.clear()

    # -- invariants (after every step) ----------------------------------------------
    @invariant()
    def status_matches_model(self) -> None:
        status = self.pool.status()
        now = self.clock.now()
        assert (status.name, status.concurrency) == (POOL, CONCURRENCY)
        for got, want in zip(status.instances, self.model, strict=True):
            assert got.enqueued == got.succeeded + got.dead_lettered + got.drained + got.pending
            assert got.processed == got.succeeded + got.dead_lettered
            assert (got.enqueued, got.pending, got.succeeded, got.dead_lettered, got.drained) == (
                want.enqueued,
                want.pending,
                want.succeeded,
                want.dead_lettered,
                want.drained,
            ), f"instance {want.index}: enqueued, pending, succeeded, dead, drained"
            if want.paused:
                state = "paused"
            elif want.current is not None and want.retry_at is not None:
                state = "backoff"
            else:
                state = "idle"
            assert got.state == state, f"instance {want.index}"
            current = None if want.current is None else want.current.sequence
            assert (got.current_sequence, got.attempt) == (current, want.attempt)
            assert got.restarts == 0, "reopening a store is not a restart"
            if want.pending and not want.paused:
                # Work that may run has its alarm slot set, and a backoff is never shortened.
                if want.retry_at is not None:
                    assert got.next_alarm_at == want.retry_at
                else:
                    assert got.next_alarm_at is not None
                    assert got.next_alarm_at <= now
        for name in ("enqueued", "pending", "processed", "succeeded", "dead_lettered", "drained"):
            assert getattr(status, name) == sum(getattr(i, name) for i in status.instances)

    @invariant()
    def storage_holds_exactly_the_pending_keys(self) -> None:
        with self.runtime._store.read() as txn:
            for instance in self.model:
                namespace = Namespace(POOL, instance.index)
                assert namespace.count_keys(txn, b"q") == instance.pending
                assert namespace.count_keys(txn, b"d") == len(instance.dead)
                assert namespace.count_keys(txn, b"o") == 0

    @invariant()
    def executions_match_model(self) -> None:
        # Order, head-of-line blocking, retry times, nothing after success or while paused.
        for got, want in zip(self.log, self.model, strict=True):
            assert got == want.executions, f"instance {want.index} executions"
        assert not self.wrong
        assert self.empty_hook == [instance.empties for instance in self.model]
        assert self.dead_hook == [instance.dead_order for instance in self.model]

    @invariant()
    def dead_letters_match_model(self) -> None:
        letters = self.pool.dead_letters()
        want = [
            (instance.index, sequence, dead)
            for instance in self.model
            for sequence, dead in sorted(instance.dead.items())
        ]
        assert len(letters) == len(want)
        for letter, (index, sequence, dead) in zip(letters, want, strict=True):
            assert (letter.instance_index, letter.sequence) == (index, sequence)
            assert letter.event == dead.event.payload
            assert (letter.attempts, letter.failed_at) == (dead.attempts, dead.failed_at)
            assert letter.enqueued_at == dead.event.enqueued_at
            assert letter.partition_key == dead.event.partition_key
            assert letter.priority == dead.event.priority
            assert letter.error.startswith(dead.error + ":"), letter.error


TestPool = PoolMachine.TestCase
TestPool.settings = settings(TestPool.settings, max_examples=150, stateful_step_count=50)
