"""Run a scenario on the real engine in virtual time, and measure it.

Nothing here models the pool: :func:`run` opens a real :class:`~dopool.Runtime`
on a :class:`~dopool.SimulatedClock` (in a temporary store unless one is
given), defines a pool whose handler sleeps for its service time with
``ctx.sleep`` and fails as the scenario says, injects the scenario's
:class:`~dopool.chaos.FaultPlan`, and schedules every arrival, pause and kill on
the same clock with ``SimulatedClock.call_at``. Then it drives the clock and
reads the outcome from the pool's events and its store.

Clock callbacks never wait on an instance (one may be asleep in its handler
until the clock moves): arrivals are sent to their instance without waiting
for the answer, and so are pauses to their instance. Each callback sends to one
instance only, so the instances still act one at a time, in a fixed order, and
the same scenario and seed give the same run, event for event.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dopool import _ports
from dopool._clock import SimulatedClock
from dopool._context import EventContext
from dopool._errors import ConfigurationError, DopoolError, QueueFullError
from dopool._invariants import read_instance, violations
from dopool._messages import Pause, Reply, Resume
from dopool._pool import WorkerPool
from dopool._retry import RetryPolicy
from dopool._runtime import Runtime
from dopool._sim.metrics import Collector, InstanceResult, Invariant, Latency, Result
from dopool._sim.scenario import Scenario, with_overrides
from dopool._types import EnqueueResult
from dopool._validation import prepare
from dopool.chaos import FaultPlan

POOL = "sim"
PROGRESS_EVERY = 500  # clock steps between progress reports
MAX_DEAD_LETTERS_LISTED = 20

#: ``progress(virtual_now, events_processed, events_expected)``
Progress = Callable[[float, int, int], None]


class SimulatedFailure(Exception):
    """A transient failure the scenario injects (``failure_probability``)."""


class PoisonEventError(Exception):
    """A poison event fails on every attempt."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One event to enqueue at virtual time ``time``."""

    time: float
    event_id: int
    partition_key: str | None
    poison: bool


@dataclass(frozen=True, slots=True)
class Run:
    """A finished run: the (deterministic) result and the wall-clock cost."""

    result: Result
    wall_seconds: float

    @property
    def events_per_wall_second(self) -> float:
        """Arrivals simulated per second of wall time."""
        return self.result.offered / self.wall_seconds if self.wall_seconds > 0 else 0.0


# -- the workload ---------------------------------------------------------------------
def arrivals(scenario: Scenario) -> list[Arrival]:
    """Every arrival of the scenario, in time order, from its seed alone.

    Times, keys and poison draws come from separate seeded streams, so changing
    one knob (say the key skew) does not reshuffle the others.
    """
    seed = scenario.seed
    keys = _key_picker(scenario, random.Random(f"{seed}/keys"))
    poison = random.Random(f"{seed}/poison")
    share = scenario.poison_share
    return [
        Arrival(at, number, keys(), share > 0 and poison.random() < share)
        for number, at in enumerate(_times(scenario, random.Random(f"{seed}/times")))
    ]


def _times(scenario: Scenario, rng: random.Random) -> Iterator[float]:
    spec = scenario.arrivals
    limit = math.inf if spec.duration is None else spec.duration
    count = itertools.count() if spec.total is None else iter(range(spec.total))
    if spec.process == "bursts":
        for number in count:
            at = (number // spec.burst_size) * spec.burst_interval
            if at >= limit:
                return
            yield at
    elif spec.process == "steady":
        for number in count:
            at = number / spec.rate
            if at >= limit:
                return
            yield at
    else:
        at = 0.0
        for _ in count:
            at += rng.expovariate(spec.rate)
            if at >= limit:
                return
            yield at


def _key_picker(scenario: Scenario, rng: random.Random) -> Callable[[], str | None]:
    if scenario.routing != "partition":
        return lambda: None
    spec = scenario.partitions
    names = [f"k{n}" for n in range(spec.keys)]
    cumulative = list(
        itertools.accumulate(1.0 / (rank + 1) ** spec.zipf for rank in range(spec.keys))
    )
    total = cumulative[-1]
    hot = spec.hot_key_share

    def pick() -> str:
        if hot > 0 and rng.random() < hot:
            return names[0]
        return names[min(bisect.bisect_right(cumulative, rng.random() * total), spec.keys - 1)]

    return pick


def service_time(scenario: Scenario, rng: random.Random) -> float:
    """One attempt's virtual service time, drawn from the scenario's distribution."""
    spec = scenario.service
    if spec.mean <= 0:
        return 0.0
    if spec.distribution == "fixed":
        return spec.mean
    if spec.distribution == "exponential":
        return rng.expovariate(1.0 / spec.mean)
    mu = math.log(spec.mean) - spec.sigma**2 / 2.0  # so that the mean is ``spec.mean``
    return rng.lognormvariate(mu, spec.sigma)


def make_handler(scenario: Scenario) -> Callable[[EventContext], None]:
    """The pool's handler: sleep for the service time, then fail as the scenario says.

    Each attempt draws from its own ``random.Random`` seeded by (scenario seed,
    event id, attempt), so an attempt behaves the same whatever ran before it.
    """
    seed = scenario.seed
    failure = scenario.failure_probability

    def handle(ctx: EventContext) -> None:
        event = ctx.event
        number = event["id"]
        rng = random.Random(f"{seed}/{number}/{ctx.attempt}")
        seconds = service_time(scenario, rng)
        if seconds > 0:
            ctx.sleep(seconds)
        if event.get("poison"):
            raise PoisonEventError(f"poison event {number} can never succeed")
        if failure > 0 and rng.random() < failure:
            raise SimulatedFailure(f"event {number} failed on attempt {ctx.attempt}")

    return handle


def _event(arrival: Arrival, padding: bytes) -> dict[str, Any]:
    event: dict[str, Any] = {"id": arrival.event_id}
    if arrival.poison:
        event["poison"] = True
    if padding:
        event["pad"] = padding
    return event


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
        result = _run(scenario, path, trace, progress)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    return Run(result, time.perf_counter() - wall)


def _run(
    scenario: Scenario,
    path: Path,
    trace: str | os.PathLike[str] | None,
    progress: Progress | None,
) -> Result:
    clock = SimulatedClock()
    faults = None
    if scenario.faults.any:
        faults = FaultPlan(seed=scenario.seed, **asdict(scenario.faults))
    runtime = Runtime(
        path, clock=clock, seed=scenario.seed, durability="async", faults=faults, trace=trace
    )
    stopped = False
    try:
        collector = Collector(POOL, scenario.instances)
        runtime.subscribe(collector)
        spec = scenario.retry
        pool = runtime.define(
            POOL,
            execute=make_handler(scenario),
            concurrency=scenario.instances,
            retry=RetryPolicy(
                max_attempts=spec.max_attempts,
                initial_delay=spec.initial_delay,
                multiplier=spec.multiplier,
                max_delay=spec.max_delay,
                jitter=spec.jitter,
            ),
            max_queue_depth=scenario.max_queue_depth,
        )
        schedule = arrivals(scenario)
        futures: list[tuple[Arrival, Reply]] = []
        padding = b"\0" * scenario.payload_bytes
        upcoming = iter(schedule)

        def arrive(arrival: Arrival) -> None:
            # One arrival per callback, and it schedules the next: the heap stays small.
            if stopped:
                return
            event = _event(arrival, padding)
            futures.append((arrival, _submit(pool, event, arrival.partition_key)))
            following = next(upcoming, None)
            if following is not None:
                clock.call_at(following.time, lambda: arrive(following))

        first = next(upcoming, None)
        if first is not None:
            clock.call_at(first.time, lambda: arrive(first))
        _schedule_controls(scenario, runtime, pool, clock, lambda: stopped)

        limit = math.inf if scenario.duration is None else scenario.duration
        expected = len(schedule)
        steps = 0
        while clock.step(limit):
            steps += 1
            if progress is not None and steps % PROGRESS_EVERY == 0:
                progress(clock.now(), _processed(collector), expected)
        if scenario.duration is not None:
            clock.run_until(scenario.duration)
        if progress is not None:
            progress(clock.now(), _processed(collector), expected)
        return _measure(scenario, runtime, pool, collector, futures, expected, clock.now())
    finally:
        stopped = True  # callbacks still scheduled must do nothing while close() drives the clock
        runtime.close()


def _submit(pool: WorkerPool, event: Any, partition_key: str | None) -> Reply:
    """Send one event to its instance without waiting; returns the instance's reply.

    At the end of a run cut short by ``duration`` an instance may still be inside
    a handler with the enqueue queued behind it, so nothing here waits: the
    reply lets :func:`_answer` look without waiting.
    """
    item = prepare(event, partition_key=partition_key, priority=0, schema=None)
    return _ports.submit(pool, item, partition_key)


def _answer(reply: Reply) -> EnqueueResult | DopoolError | None:
    """What the pool answered an arrival, or None if it has not answered yet.

    The clock has stopped at a quiescent point, so every answer that will come
    before the clock moves again is already there: nothing here waits.
    """
    try:
        stored = reply.get(timeout=0)
    except TimeoutError:
        return None
    except DopoolError as exc:
        return exc
    result: EnqueueResult = stored[0]
    return result


def _processed(collector: Collector) -> int:
    return collector.counts.get("succeeded", 0) + collector.counts.get("dead_lettered", 0)


def _schedule_controls(
    scenario: Scenario,
    runtime: Runtime,
    pool: WorkerPool,
    clock: SimulatedClock,
    stopped: Callable[[], bool],
) -> None:
    """Pauses, resumes and kills, one instance per callback, none of them waiting."""

    def send(message: type[Pause] | type[Resume], index: int) -> None:
        if not stopped():
            _ports.send(pool, index, message)  # the answer is not awaited

    def kill(index: int) -> None:
        if not stopped():
            runtime.kill(POOL, index)

    everyone = range(scenario.instances)
    for pause in scenario.pauses:
        targets = everyone if pause.instance is None else [pause.instance]
        for index in targets:
            clock.call_at(pause.at, lambda i=index: send(Pause, i))  # type: ignore[misc]
            clock.call_at(pause.at + pause.duration, lambda i=index: send(Resume, i))  # type: ignore[misc]
    for planned in scenario.kills:
        clock.call_at(planned.at, lambda i=planned.instance: kill(i))  # type: ignore[misc]


def _measure(
    scenario: Scenario,
    runtime: Runtime,
    pool: WorkerPool,
    collector: Collector,
    futures: list[tuple[Arrival, Reply]],
    expected: int,
    now: float,
) -> Result:
    arrived_at: dict[tuple[int, int], float] = {}
    rejected = failed = waiting = 0
    for arrival, reply in futures:
        answer = _answer(reply)
        if answer is None:
            waiting += 1
        elif isinstance(answer, QueueFullError):
            rejected += 1
        elif isinstance(answer, DopoolError):
            failed += 1  # the instance crashed during the enqueue: nothing was stored
        else:
            arrived_at[(answer.instance_index, answer.sequence)] = arrival.time
    acknowledged = set(arrived_at)
    latencies = [
        collector.succeeded_at[key] - at
        for key, at in arrived_at.items()
        if key in collector.succeeded_at
    ]
    waits = [
        collector.enqueued_at[key] - at
        for key, at in arrived_at.items()
        if key in collector.enqueued_at
    ]
    status = pool.status()
    accounted = collector.succeeded | collector.dead | collector.pending_keys()
    missing = acknowledged - accounted
    lost = len(acknowledged) - (
        status.succeeded + status.dead_lettered + status.pending + status.drained
    )
    invariants = [
        _no_loss(
            len(acknowledged),
            status.succeeded,
            status.dead_lettered,
            status.pending,
            status.drained,
            lost,
            missing,
        ),
        Invariant(
            "at-least-once",
            not collector.repeat_violations,
            "; ".join(collector.repeat_violations)
            or "no event started or succeeded again after its success",
        ),
        Invariant(
            "order",
            not collector.order_violations,
            "; ".join(collector.order_violations)
            or "every instance started its events in sequence, one at a time",
        ),
        _counters(runtime, pool, collector),
    ]
    elapsed = max(now, 0.0)
    instances = [
        InstanceResult(
            index=s.index,
            enqueued=s.enqueued,
            succeeded=s.succeeded,
            dead_lettered=s.dead_lettered,
            pending=s.pending,
            started=track.started,
            crashes=track.crashes,
            restarts=s.restarts,
            max_depth=track.max_depth,
            utilisation=_busy(track.busy, track.busy_since, now) / elapsed if elapsed else 0.0,
        )
        for s, track in zip(status.instances, collector.tracks, strict=True)
    ]
    dead_letters = [
        {
            "instance": letter.instance_index,
            "sequence": letter.sequence,
            "event_id": letter.event.get("id") if isinstance(letter.event, dict) else None,
            "attempts": letter.attempts,
            "enqueued_at": round(letter.enqueued_at, 6),
            "failed_at": round(letter.failed_at, 6),
            "error": letter.error,
        }
        for letter in pool.dead_letters()[:MAX_DEAD_LETTERS_LISTED]
    ]
    counts = collector.counts
    return Result(
        scenario=scenario.to_dict(),
        finished=status.pending == 0 and len(futures) == expected,
        virtual_time=now,
        offered=len(futures),
        acknowledged=len(acknowledged),
        rejected=rejected,
        failed=failed,
        waiting=waiting,
        succeeded=status.succeeded,
        dead_lettered=status.dead_lettered,
        pending=status.pending,
        drained=status.drained,
        lost=lost,
        retries=counts.get("retry_scheduled", 0),
        crashes=counts.get("crashed", 0),
        restarts=sum(s.restarts for s in status.instances),
        pauses=counts.get("paused", 0),
        latency=Latency.of(latencies),
        enqueue_wait=Latency.of(waits),
        instances=instances,
        invariants=invariants,
        dead_letters=dead_letters,
        pool_events=sum(counts.values()),
        depth_series=[track.series for track in collector.tracks],
        latencies=latencies,
    )


def _busy(busy: float, since: float | None, now: float) -> float:
    return busy + (now - since if since is not None else 0.0)


def _no_loss(
    acknowledged: int,
    succeeded: int,
    dead: int,
    pending: int,
    drained: int,
    lost: int,
    missing: set[tuple[int, int]],
) -> Invariant:
    detail = (
        f"{acknowledged} enqueued = {succeeded} succeeded + {dead} dead-lettered + "
        f"{pending} pending + {drained} drained"
    )
    if lost:
        detail = f"{lost} lost: " + detail.replace(" = ", " != ", 1)
    if missing:
        sample = ", ".join(f"{POOL}:{i}#{s}" for i, s in sorted(missing)[:5])
        detail += f"; {len(missing)} acknowledged events never settled ({sample})"
    return Invariant("no loss", lost == 0 and not missing, detail)


def _counters(runtime: Runtime, pool: WorkerPool, collector: Collector) -> Invariant:
    """Guarantee 4 (counters, docs/guarantees.md) from the store, and the event stream agreeing."""
    problems: list[str] = []
    with _ports.committed(runtime) as txn:
        for index in range(pool.concurrency):
            state = read_instance(txn, POOL, index)
            problems.extend(violations(state))
            track = collector.tracks[index]
            if track.depth != state.meta.pending:
                problems.append(
                    f"{state.name}: events say {track.depth} pending, store {state.meta.pending}"
                )
    detail = "; ".join(problems[:5]) or (
        "enqueued = succeeded + dead-lettered + drained + pending on every instance; "
        "queue keys match; the event stream agrees with the store"
    )
    return Invariant("counters", not problems, detail)


# -- sweeps -----------------------------------------------------------------------------
def sweep(
    scenario: Scenario,
    field: str,
    values: list[Any],
    *,
    store: str | os.PathLike[str] | None = None,
    progress: Callable[[int, float, int, int], None] | None = None,
) -> list[tuple[Any, Run]]:
    """Run the scenario once per value of ``field``; each run stands alone.

    With ``store``, run ``k`` uses the subdirectory ``<store>/<field>=<value>``.
    """
    variants = [with_overrides(scenario, {field: value}) for value in values]
    runs = []
    for position, (value, variant) in enumerate(zip(values, variants, strict=True)):
        where = None if store is None else Path(store) / f"{field}={value}"
        report = None
        if progress is not None:
            report = _sweep_progress(progress, position)
        runs.append((value, run(variant, store=where, progress=report)))
    return runs


def _sweep_progress(progress: Callable[[int, float, int, int], None], position: int) -> Progress:
    return lambda now, done, expected: progress(position, now, done, expected)
