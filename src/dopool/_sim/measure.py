"""The end of a run: what the pool answered each arrival, the figures and the invariants."""

from __future__ import annotations

from dopool import _ports
from dopool._errors import DopoolError, QueueFullError
from dopool._invariants import read_instance, violations
from dopool._messages import Reply
from dopool._pool import WorkerPool
from dopool._runtime import Runtime
from dopool._sim.metrics import Collector, InstanceResult, Invariant, Latency, Result
from dopool._sim.scenario import Scenario
from dopool._sim.workload import POOL, Arrival
from dopool._types import EnqueueResult

MAX_DEAD_LETTERS_LISTED = 20


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


def measure(
    scenario: Scenario,
    runtime: Runtime,
    pool: WorkerPool,
    collector: Collector,
    futures: list[tuple[Arrival, Reply]],
    expected: int,
    now: float,
) -> Result:
    """The run's :class:`Result`, read at virtual time ``now`` once the clock has stopped."""
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
