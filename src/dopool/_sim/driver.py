"""Run a scenario on the real engine in virtual time, and measure it.

Nothing here models the pool: :func:`run` opens a real :class:`~dopool.Runtime`
on a :class:`~dopool.SimulatedClock` (in a temporary store unless one is
given), defines a pool whose handler sleeps for its service time with
``ctx.sleep`` and fails as the scenario says, injects the scenario's
:class:`~dopool.chaos.FaultPlan`, and schedules every arrival, pause and kill on
the same clock with ``SimulatedClock.call_at``. Then it drives the clock and
reads the outcome from the pool's events and its store. The arrivals and the
handler come from :mod:`dopool._sim.workload`, the reading of the outcome from
:mod:`dopool._sim.measure`.

Clock callbacks never wait on an instance (one may be asleep in its handler
until the clock moves): arrivals are sent to their instance without waiting
for the answer, and so are pauses to their instance. Each callback sends to one
instance only, so the instances still act one at a time, in a fixed order, and
the same scenario and seed give the same run, event for event.
"""

from __future__ import annotations

import difflib
import gc
import inspect
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from dopool._clock.clocks import SimulatedClock
from dopool._engine import logs
from dopool._errors import (
    ConfigurationError,
    EventTooLargeError,
    EventValidationError,
    ScenarioError,
)
from dopool._handles.pool import WorkerPool
from dopool._handles.tools import ScratchRuntime, ToolRuntime
from dopool._machine.types import Pause, Resume
from dopool._ops.app import App, AppError, load_app, raised
from dopool._retry import RetryPolicy
from dopool._sim.draws import Draws
from dopool._sim.interrupt import Interrupt, interruptible
from dopool._sim.measure import Answers, measure
from dopool._sim.metrics import Collector, Residency, Result
from dopool._sim.pools import pool_named
from dopool._sim.scenario import Scenario, check_instance
from dopool._sim.sections import Kill as PlannedKill
from dopool._sim.sections import Pause as PlannedPause
from dopool._sim.trace import Trace
from dopool._sim.workload import Arrival, Lineage, arrivals, make_event, make_handler
from dopool._types import PoolEvent
from dopool.chaos import FaultPlan

PROGRESS_EVERY = 500  # clock steps between progress reports

#: ``progress(virtual_now, events_processed, events_expected)``
Progress = Callable[[float, int, int], None]


@dataclass(frozen=True, slots=True)
class Run:
    """A finished run: the (deterministic) result and the wall-clock cost."""

    result: Result
    wall_seconds: float

    @property
    def events_per_wall_second(self) -> float:
        """Events run to an outcome (succeeded or dead-lettered: arrivals, follow-ups and
        an app's own alike) per second of wall time."""
        done = self.result.succeeded + self.result.dead_lettered
        return done / self.wall_seconds if self.wall_seconds > 0 else 0.0


# -- running --------------------------------------------------------------------------
def run(
    scenario: Scenario,
    *,
    store: str | os.PathLike[str] | None = None,
    trace: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> Run:
    """Run ``scenario`` on a real pool in virtual time and return what it measured.

    Args:
        store: the store directory (must be empty or absent); None = a temporary one.
        trace: write every pool event to this file as JSON lines.
        progress: called now and then while the clock is driven.

    Raises:
        ConfigurationError: ``store`` holds something already.
        DopoolError: the store cannot be opened (locked, unwritable).
    """
    temporary: Path | None = None
    if store is None:
        temporary = Path(tempfile.mkdtemp(prefix="dopool-sim-"))
        path = temporary
    else:
        path = Path(store)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ConfigurationError(
                f"--store {str(path)!r} is not an empty directory; a simulation needs a fresh store"
            )
    wall = time.perf_counter()
    try:
        # The report, the trace and the dead letters tell the failures and crashes a run
        # has (its scenario's or its app's): none is logged.
        with fewer_collections(), interruptible() as interrupt, logs.modelled():
            result = _run(scenario, path, trace, progress, interrupt, temporary is not None)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    return Run(result, time.perf_counter() - wall)


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Run the cyclic garbage collector less often for a while: during a run.

    A run allocates a few objects per event that live until it ends (its
    measurements), and hardly any cycles; the collector's default pace (the
    youngest generation every 700 net allocations, the middle one every tenth
    time, the oldest every tenth of those) spent ~8% of a 40,000-event run
    scanning them. What exists before the run is frozen (never scanned again
    until it ends); the youngest generation, where a cycle that is garbage
    usually dies, is collected every 100,000 allocations, the middle one every
    50th time and the oldest every 1,000th of those: ~1% of a 100,000-event run.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], 100_000), max(thresholds[1], 50), max(thresholds[2], 1000))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _run(
    scenario: Scenario,
    path: Path,
    trace: str | os.PathLike[str] | None,
    progress: Progress | None,
    interrupt: Interrupt,
    scratch: bool,
) -> Result:
    # First: a bad replay file, app or parameter fails before a store is made (an app's
    # pools come later).
    schedule = arrivals(scenario) if scenario.app is None else None
    app = None if scenario.app is None else _with_params(load_app(scenario.app), scenario)
    clock = SimulatedClock()
    faults = None
    if scenario.faults.any:
        faults = FaultPlan(seed=scenario.seed, **asdict(scenario.faults))
    opening = ScratchRuntime if scratch else ToolRuntime
    runtime = opening(path, clock=clock, seed=scenario.seed, durability="async", faults=faults)
    stopped = False
    tracer: Trace | None = None
    try:
        if trace is not None:
            tracer = Trace(trace)
            unsubscribe = runtime.subscribe(tracer)
        lineage = Lineage()
        if app is None:
            collectors = _define_pools(scenario, runtime, lineage)
        else:
            collectors = _define_app_pools(scenario, runtime, app)
        pools = dict(runtime.pools)
        if schedule is None:
            schedule = arrivals(scenario, list(pools))
        answers = Answers(pools)
        padding = b"\0" * scenario.payload_bytes if app else b""
        paddings = {design.name: b"\0" * design.payload_bytes for design in scenario.resolved_pools}
        upcoming = iter(schedule)
        # Each sends one event to its instance without waiting, and returns the instance's
        # index and its reply, which ``answers`` reads once it has come: at the end of a
        # run cut short by ``duration`` an instance may still be inside a handler with
        # the enqueue queued behind it, and the reply lets it look without waiting.
        submitters = {name: runtime.submitter(pool) for name, pool in pools.items()}

        def arrive(arrival: Arrival) -> None:
            # One arrival per callback, and it schedules the next: the heap stays small.
            if stopped:
                return
            if app is not None and arrival.payload is not None:
                event = _app_event(app, scenario.seed, arrival)
            else:
                event = make_event(arrival, paddings.get(arrival.pool, padding))
            place = None if tracer is None else tracer.arriving(arrival)
            try:
                due = None if arrival.delay is None else arrival.time + arrival.delay
                index, reply = submitters[arrival.pool](
                    event, arrival.partition_key, arrival.dedup_key, due
                )
            except (EventValidationError, EventTooLargeError) as exc:
                if app is None:
                    raise
                # The app's payload function made it, or its pool's schema refused it.
                raise AppError(
                    app.spec, f"pool {arrival.pool!r} refused an arriving event: {exc}"
                ) from exc
            if place is not None:
                place.sent(index, reply)
            answers.expect(arrival, reply)
            following = next(upcoming, None)
            if following is not None:
                clock.call_at(following.time, lambda: arrive(following))

        first = next(upcoming, None)
        if first is not None:
            clock.call_at(first.time, lambda: arrive(first))
        _schedule_controls(scenario, runtime, pools, clock, lambda: stopped)

        limit = math.inf if scenario.duration is None else scenario.duration
        expected = len(schedule)
        if tracer is None and progress is None:  # nothing to do between steps: one call
            clock.run_until_idle(limit, until=interrupt.asked)
        steps = 0
        while not interrupt.asked() and clock.step(limit, idle=True):  # a schedule never ends
            steps += 1
            if tracer is not None:
                tracer.flush()
            if progress is not None and steps % PROGRESS_EVERY == 0:
                progress(clock.now(), _processed(collectors), expected)
        interrupt.check()  # Ctrl-C: from here, where closing the runtime follows
        if scenario.duration is not None:
            clock.run_until(scenario.duration)
        if progress is not None:
            progress(clock.now(), _processed(collectors), expected)
        result = measure(
            scenario, runtime, pools, collectors, lineage, answers, expected, clock.now()
        )
        if tracer is not None:  # the run as measured: not what closing the runtime does
            unsubscribe()
            tracer.finish()
        return result
    finally:
        stopped = True  # callbacks still scheduled must do nothing while close() drives the clock
        if tracer is not None:
            tracer.abandon()
        runtime.close()


def _define_pools(
    scenario: Scenario, runtime: ToolRuntime, lineage: Lineage
) -> dict[str, Collector]:
    """Define the scenario's pools, each with the simulated handler; their collectors."""
    designs = {pool.name: pool for pool in scenario.resolved_pools}
    collectors: dict[str, Collector] = {}
    run = Residency(steps=True)  # the instances running, over every pool
    for name, design in designs.items():
        collectors[name] = Collector(name, delays=design.delayed_share > 0, residency=run)
        runtime.subscribe(collectors[name])
        spec = design.retry
        runtime.define(
            name,
            execute=make_handler(scenario.seed, design, designs, lineage),
            concurrency=design.instances,  # an int, or "per-key"
            retry=RetryPolicy(
                max_attempts=spec.max_attempts,
                initial_delay=spec.initial_delay,
                multiplier=spec.multiplier,
                max_delay=spec.max_delay,
                jitter=spec.jitter,
            ),
            max_queue_depth=design.max_queue_depth,
            alarm_retries=design.alarm_retries,
            dedup_window=design.dedup_window,
            idle_timeout=design.idle_timeout,
            rate_limit=design.limit,
        )
    return collectors


def _with_params(app: App, scenario: Scenario) -> App:
    """``app`` whose function is called with the scenario's parameters as keyword
    arguments, after the runtime: ``build(runtime, **params)``.

    Raises:
        ScenarioError: the function takes no such parameter (``app.NAME``), or needs
            one the scenario does not give; found from its signature, before it runs.
    """
    params = scenario.app_params
    try:
        signature = inspect.signature(app.build)
    except (TypeError, ValueError):  # none to read: the call itself will say
        signature = None
    if signature is not None:
        taken = list(signature.parameters.values())[1:]  # the first is the runtime's
        named = [p.name for p in taken if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        shown = f"{app.spec!r} (it takes {', '.join(named) or 'only the runtime'})"
        if not any(p.kind is p.VAR_KEYWORD for p in taken):
            for name in params:
                if name not in named:
                    hint = difflib.get_close_matches(name, named, n=1)
                    problem = f"is not a parameter of {shown}"
                    problem += f"; did you mean '{hint[0]}'?" if hint else ""
                    raise ScenarioError(f"app.{name}", problem)
        for p in taken:
            if p.name in named and p.default is p.empty and p.name not in params:
                raise ScenarioError(f"app.{p.name}", f"is required by {shown}")
    return replace(app, build=partial(app.build, **params)) if params else app


def _define_app_pools(scenario: Scenario, runtime: ToolRuntime, app: App) -> dict[str, Collector]:
    """Have the app define its pools; their collectors see every event from the start."""
    early: list[PoolEvent] = []
    unsubscribe = runtime.subscribe(early.append)
    try:
        app.define_pools(runtime)
    finally:
        unsubscribe()
    pools = runtime.pools
    if not pools:
        raise AppError(app.spec, "defined no pool on the runtime it was given")
    names = list(pools)
    for position, stream in enumerate(scenario.arrivals):
        where = "arrivals" if len(scenario.arrivals) == 1 else f"arrivals[{position}]"
        pool_named(stream.pool, names, f"{where}.pool")
        if stream.payload is not None:
            app.payload(stream.payload)
    placed: list[tuple[str, Sequence[PlannedPause | PlannedKill]]] = [
        ("pauses", scenario.pauses),
        ("kills", scenario.kills),
    ]
    for kind, items in placed:
        for position, item in enumerate(items):
            name = pool_named(item.pool, names, f"{kind}[{position}].pool")
            check_instance(f"{kind}[{position}]", item, name, pools[name].concurrency)
    run = Residency(steps=True)  # the instances running, over every pool
    collectors = {name: Collector(name, residency=run) for name in pools}
    for collector in collectors.values():
        for event in early:
            collector(event)
        collector.seeded = collector.counts.get("enqueued", 0)
        runtime.subscribe(collector)
    return collectors


def _app_event(app: App, seed: int, arrival: Arrival) -> Any:
    """An arriving event made by the app's payload function, from a seeded generator."""
    assert arrival.payload is not None
    make = app.payload(arrival.payload)
    try:
        return make(arrival.event_id, Draws(f"{seed}/payload/{arrival.event_id}"))
    except BaseException as exc:
        raise AppError(app.spec, f"payload {arrival.payload!r} {raised(exc)}") from exc


def _processed(collectors: dict[str, Collector]) -> int:
    return sum(
        c.counts.get("succeeded", 0) + c.counts.get("dead_lettered", 0) for c in collectors.values()
    )


def _schedule_controls(
    scenario: Scenario,
    runtime: ToolRuntime,
    pools: dict[str, WorkerPool],
    clock: SimulatedClock,
    stopped: Callable[[], bool],
) -> None:
    """Pauses, resumes and kills, one instance per callback, none of them waiting."""

    def send(pool: WorkerPool, message: type[Pause] | type[Resume], index: int) -> None:
        if not stopped():
            runtime.send(pool, index, message())  # the answer is not awaited

    def kill(name: str, index: int) -> None:
        if not stopped():
            runtime.kill(name, index)

    first = next(iter(pools))
    for pause in scenario.pauses:
        pool = pools[pause.pool or first]
        targets = range(pool.concurrency) if pause.instance is None else [pause.instance]
        for index in targets:
            clock.call_at(pause.at, partial(send, pool, Pause, index))
            clock.call_at(pause.at + pause.duration, partial(send, pool, Resume, index))
    for planned in scenario.kills:
        clock.call_at(planned.at, partial(kill, planned.pool or first, planned.instance))
