"""Recurring schedules on a SimulatedClock beside a model: a dict of schedules by name.

Rules define (the same definition again, or another), remove, drive the clock, pause and
resume the pool, kill instance 0 between messages, and close and reopen the runtime at
the same virtual time. The model predicts every fire exactly: on time while the pool
runs (a kill takes no virtual time), none while it is paused, and one occurrence for all
the fire times that passed at the first drive after a resume. After every step the
pool's schedules (next fire, fired, coalesced), its occurrences run, its status and the
store's checks agree with it. (tests/handles/test_stateful.py models the queue itself; this one
adds only what schedules change, so that neither model grows past reading.)

The first step draws whether the pool's handler is a plain ``def`` or an ``async def``
(which awaits a zero sleep, then counts the occurrence as the plain one does).
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dopool import EventContext, Runtime, SimulatedClock, WorkerPool
from dopool._ops.check import check_store

NAMES = ("a", "b", "c")
EVERY = (0.5, 1.0, 1.5, 2.5)  # exact in binary, as are the clock's steps
CONCURRENCY = 3


@dataclass
class Schedule:
    name: str
    every: float
    event: int
    next_at: float
    fired: int = 0
    coalesced: int = 0


class ScheduleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="dopool-sched-"))
        self.now = 0.0
        self.model: dict[str, Schedule] = {}
        self.paused = False
        # Occurrences by their event, (name, event): what the handler saw, what the model says.
        self.occurrences: dict[tuple[Any, ...], int] = {}
        self.expected: dict[tuple[Any, ...], int] = {}
        self.asynchronous = False  # the handler is an async def (drawn by start)
        self.runtime: Runtime  # both set by the first rule, start
        self.pool: WorkerPool

    def teardown(self) -> None:
        runtime: Runtime | None = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    @initialize(asynchronous=st.booleans())
    def start(self, asynchronous: bool) -> None:
        self.asynchronous = asynchronous
        self.runtime, self.pool = self._open()

    def _open(self) -> tuple[Runtime, WorkerPool]:
        runtime = Runtime(self.directory / "store", clock=SimulatedClock(self.now), seed=0)
        execute = self._execute_async if self.asynchronous else self._execute
        pool = runtime.define("p", execute=execute, concurrency=CONCURRENCY)
        return runtime, pool

    async def _execute_async(self, ctx: EventContext) -> None:
        await asyncio.sleep(0)
        self._execute(ctx)

    def _execute(self, ctx: EventContext) -> None:
        key = tuple(ctx.event)
        self.occurrences[key] = self.occurrences.get(key, 0) + 1

    def _fire(self, schedule: Schedule, passed: int) -> None:
        schedule.fired += 1
        schedule.coalesced += passed - 1
        key = (schedule.name, schedule.event)
        self.expected[key] = self.expected.get(key, 0) + 1

    def _drive_model(self, until: float) -> None:
        if not self.paused:
            for schedule in self.model.values():  # late (after a resume): one for all
                if schedule.next_at <= self.now:
                    passed = math.floor((self.now - schedule.next_at) / schedule.every) + 1
                    schedule.next_at += passed * schedule.every
                    self._fire(schedule, passed)
            for schedule in self.model.values():  # on time
                while schedule.next_at <= until:
                    schedule.next_at += schedule.every
                    self._fire(schedule, 1)
        self.now = until

    @rule(name=st.sampled_from(NAMES), every=st.sampled_from(EVERY), event=st.integers(0, 2))
    def schedule(self, name: str, every: float, event: int) -> None:
        info = self.pool.schedule(name, [name, event], every=every)
        known = self.model.get(name)
        if known is None or (known.every, known.event) != (every, event):
            self.model[name] = Schedule(name, every, event, self.now + every)
        assert info.next_at == self.model[name].next_at

    @rule(name=st.sampled_from(NAMES))
    def unschedule(self, name: str) -> None:
        assert self.pool.unschedule(name) is (self.model.pop(name, None) is not None)

    @rule(seconds=st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.75]))
    def advance(self, seconds: float) -> None:
        clock = self.runtime.clock
        assert isinstance(clock, SimulatedClock)
        clock.run_until(self.now + seconds)
        self._drive_model(self.now + seconds)

    @rule()
    def run_until_idle(self) -> None:
        """Nothing but fires is left at any step: it returns where it stands."""
        clock = self.runtime.clock
        assert isinstance(clock, SimulatedClock)
        clock.run_until_idle()
        self._drive_model(self.now)  # it fires what is due now, if anything
        assert clock.now() == self.now

    @rule()
    def pause(self) -> None:
        self.pool.pause()
        self.paused = True

    @rule()
    def resume(self) -> None:
        self.pool.resume()
        self.paused = False

    @rule()
    def kill(self) -> None:
        self.runtime.kill("p", 0)  # returns once recovered; no virtual time passes

    @rule()
    def reopen(self) -> None:
        self.runtime.close()
        self.runtime, self.pool = self._open()

    @invariant()
    def schedules_agree(self) -> None:
        found = {
            info.name: (info.next_at, info.fired, info.coalesced, info.every, info.event)
            for info in self.pool.schedules()
        }
        expected = {
            name: (s.next_at, s.fired, s.coalesced, s.every, [name, s.event])
            for name, s in self.model.items()
        }
        assert found == expected
        assert self.pool.status().schedules == len(self.model)

    @invariant()
    def each_fire_ran_once(self) -> None:
        assert self.occurrences == self.expected

    @invariant()
    def the_store_checks_out(self) -> None:
        with self.runtime._store.read() as txn:
            report = check_store(txn)
        assert report.ok, report.problems


TestSchedules = ScheduleMachine.TestCase
TestSchedules.settings = settings(TestSchedules.settings, max_examples=200, stateful_step_count=30)
