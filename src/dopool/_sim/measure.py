"""The end of a run: what the pools answered each arrival, the figures and the invariants."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from math import isnan, nan

from dopool._engine.messages import Reply
from dopool._errors import DopoolError, QueueFullError
from dopool._handles.pool import WorkerPool
from dopool._handles.tools import ToolRuntime
from dopool._machine.invariants import index_violations, read_instance, violations
from dopool._sim.columns import Key, Numbers, Steps, Times, differences, put
from dopool._sim.cost import Bill, Usage
from dopool._sim.latency import Latency
from dopool._sim.metrics import (
    Collector,
    InstanceResult,
    InstanceTrack,
    Invariant,
    PoolResult,
    Requests,
    Residency,
    Result,
)
from dopool._sim.order import check_delayed_order
from dopool._sim.scenario import Scenario
from dopool._sim.workload import Arrival, Lineage
from dopool._store.layout import Namespace, StoredValues, used_instances
from dopool._types import EnqueueResult, PoolStatus

MAX_DEAD_LETTERS_LISTED = 20


def answer(reply: Reply) -> EnqueueResult | DopoolError | None:
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


class Answers:
    """What the pools answered the arrivals: the stored ones by pool, and the others.

    The driver folds each arrival in once its reply has come (:meth:`settle`), so a
    run keeps a few bytes per arrival (:mod:`dopool._sim.columns`), not its reply.
    """

    def __init__(self, pools: Iterable[str]) -> None:
        self.arrived_at = {name: Times() for name in pools}
        self.request_of = {name: Numbers() for name in self.arrived_at}
        self.stored: dict[str, int] = dict.fromkeys(self.arrived_at, 0)
        self.offered: dict[str, int] = {}
        self.rejected: dict[str, int] = {}
        self.duplicates: dict[str, int] = {}  # answered with the event holding their key
        self.delayed: dict[str, int] = {}  # stored with a delay
        self._due_at: dict[str, Times] = {}  # when each delayed one became due
        self.failed = 0
        self.waiting: dict[str, int] = {}
        self.sent = 0  # arrivals handed to their pool
        self.last_arrival = 0.0  # the virtual time of the latest arrival (they come in order)
        self._unanswered: list[tuple[Arrival, Reply]] = []

    def expect(self, arrival: Arrival, reply: Reply) -> None:
        """Note an arrival sent to its pool; its reply is read later."""
        self.sent += 1
        unanswered = self._unanswered
        unanswered.append((arrival, reply))
        if len(unanswered) >= _FOLD_EVERY:
            self.settle(final=False)

    def settle(self, *, final: bool) -> None:
        """Fold in every arrival whose reply has come; with ``final``, the rest too
        (as waiting: the run has stopped)."""
        kept: list[tuple[Arrival, Reply]] = []
        for arrival, reply in self._unanswered:
            answered = answer(reply)
            if answered is None and not final:
                kept.append((arrival, reply))
            else:
                self._add(arrival, answered)
        self._unanswered = kept

    def _add(self, arrival: Arrival, answered: EnqueueResult | DopoolError | None) -> None:
        pool = arrival.pool
        self.offered[pool] = self.offered.get(pool, 0) + 1
        self.last_arrival = max(self.last_arrival, arrival.time)
        if answered is None:
            self.waiting[pool] = self.waiting.get(pool, 0) + 1
        elif isinstance(answered, QueueFullError):
            self.rejected[pool] = self.rejected.get(pool, 0) + 1
        elif isinstance(answered, DopoolError):
            self.failed += 1  # the instance crashed during the enqueue: nothing was stored
        elif answered.duplicate:  # its dedup key was held: nothing was stored
            self.duplicates[pool] = self.duplicates.get(pool, 0) + 1
        else:
            index, sequence = answered.instance_index, answered.sequence
            self.stored[pool] += 1
            put(self.arrived_at[pool].columns[index], sequence, arrival.time, nan)
            put(self.request_of[pool].columns[index], sequence, arrival.event_id, -1)
            if arrival.delay is not None:
                self.delayed[pool] = self.delayed.get(pool, 0) + 1
                due_at = self._due_at.get(pool)
                if due_at is None:
                    due_at = self._due_at[pool] = Times()
                due_at.put((index, sequence), arrival.time + arrival.delay)

    def due_times(self, pool: str) -> Times:
        """When each delayed arrival stored into ``pool`` became due (none: empty)."""
        due_at = self._due_at.get(pool)
        return Times() if due_at is None else due_at

    def starts(self, pool: str) -> Times:
        """When each stored arrival into ``pool`` was due: its arrival, or for a delayed
        one the end of its delay. Latencies run from there, so that a delay the scenario
        asked for does not count as time spent waiting for an instance."""
        due_at = self._due_at.get(pool)
        arrived = self.arrived_at[pool]
        return arrived if due_at is None else arrived.overlaid(due_at)


# Replies waiting to be read, at most: an enqueue's reply comes within a step or,
# behind a running handler, with that handler's outcome; the few still waiting at a
# fold are kept for the next.
_FOLD_EVERY = 4096
#: A pool of up to this many instances has every one in its result; a larger one, the
#: instances its run used.
EVERY_INSTANCE_LISTED = 1024


def measure(
    scenario: Scenario,
    runtime: ToolRuntime,
    pools: Mapping[str, WorkerPool],
    collectors: Mapping[str, Collector],
    lineage: Lineage,
    answers: Answers,
    expected: int,
    now: float,
) -> Result:
    """The run's :class:`Result`, read at virtual time ``now`` once the clock has stopped."""
    answers.settle(final=True)
    elapsed = max(now, 0.0)
    results: list[PoolResult] = []
    latencies: list[float] = []
    waits: list[float] = []
    missing: list[str] = []
    outbox = 0
    problems: list[str] = []
    depth_series: list[Steps] = []
    stored_bytes = 0
    statuses = {name: pool.status() for name, pool in pools.items()}
    for name, pool in pools.items():
        collector, status = collectors[name], statuses[name]
        arrived, due = answers.arrived_at[name], answers.starts(name)
        if len(collector.due_at):  # any event stored not yet due counts from its due time
            due = due.overlaid(collector.due_at)
        handed = partial(_handed, name, arrived=due, collectors=collectors, lineage=lineage)
        mine = _since_handed(collector, due, handed)
        latencies.extend(mine)
        waits.extend(differences(collector.enqueued_at, arrived))
        missing.extend(f"{name}:{i}#{s}" for i, s in _unaccounted(arrived, collector))
        held, found, kept = _store_checks(runtime, pool, collector)
        outbox += held
        problems.extend(found)
        stored_bytes += kept
        waiting = answers.waiting.get(name, 0)
        shown = _listed(status, collector)
        tracks = [collector.tracks.get(index) or InstanceTrack() for index in shown]
        depth_series.extend(Steps(track.changed_at, track.depths) for track in tracks)
        instances = [
            InstanceResult(
                pool=name,
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
                key=s.key,
            )
            for s, track in zip(map(status.instance, shown), tracks, strict=True)
        ]
        results.append(
            PoolResult(
                name=name,
                offered=answers.offered.get(name, 0),
                acknowledged=len(arrived),
                rejected=answers.rejected.get(name, 0),
                duplicates=answers.duplicates.get(name, 0),
                delayed=answers.delayed.get(name, 0),
                enqueued=status.enqueued,
                succeeded=status.succeeded,
                dead_lettered=status.dead_lettered,
                pending=status.pending,
                retries=collector.counts.get("retry_scheduled", 0),
                crashes=collector.counts.get("crashed", 0),
                latency=Latency.of(mine, unfinished=status.pending + waiting + held),
                instances=instances,
                waiting=waiting,
                concurrency=status.concurrency,
                latencies=mine,
            )
        )
    acknowledged = sum(answers.stored.values())
    seeded = sum(collector.seeded for collector in collectors.values())
    settled = sum(s.succeeded + s.dead_lettered + s.pending + s.drained for s in statuses.values())
    if scenario.app is None:  # the simulated handlers say what they enqueued
        spawned = _spawned(collectors, lineage)
    else:  # an app's handlers do not: take the store's word, less what the app stored
        stored = sum(s.enqueued for s in statuses.values()) + outbox
        spawned = stored - acknowledged - seeded
    lost = acknowledged + spawned + seeded - settled - outbox
    follow_ups = scenario.app is None and any(p.follow_ups for p in scenario.resolved_pools)
    for name, collector in collectors.items():
        if collector.delays:
            check_delayed_order(collector, answers.due_times(name).overlaid(collector.due_at))
    invariants = [
        _no_loss(acknowledged, spawned, seeded, statuses.values(), outbox, lost, missing),
        Invariant(
            "at-least-once",
            not any(c.repeat_violations for c in collectors.values()),
            "; ".join(v for c in collectors.values() for v in c.repeat_violations)
            or "no event started or succeeded again after its success",
        ),
        Invariant(
            "order",
            not any(c.order_violations for c in collectors.values()),
            "; ".join(v for c in collectors.values() for v in c.order_violations)
            or (
                "every instance started its events in sequence, one at a time"
                if not any(c.delays for c in collectors.values())
                else "every instance started its events by due time, then sequence, one at "
                "a time, and none before it was due"
            ),
        ),
        Invariant(
            "counters",
            not problems,
            "; ".join(problems[:5])
            or (
                "enqueued = succeeded + dead-lettered + drained + pending on every instance; "
                "queue keys match; the event stream agrees with the store"
            ),
        ),
    ]
    letters = {name: pool.dead_letters() for name, pool in pools.items()}
    for name, listed in letters.items():  # an event may die before its handler ever ran
        for letter in listed:
            if isinstance(letter.event, dict):
                request = letter.event.get("req", letter.event.get("id"))
                if isinstance(request, int):
                    key = (name, letter.instance_index, letter.sequence)
                    lineage.requests.setdefault(key, request)
    dead_letters = [
        {
            "pool": name,
            "instance": letter.instance_index,
            "sequence": letter.sequence,
            "event_id": letter.event.get("id") if isinstance(letter.event, dict) else None,
            "attempts": letter.attempts,
            "enqueued_at": round(letter.enqueued_at, 6),
            "failed_at": round(letter.failed_at, 6),
            "error": letter.error,
        }
        for name, listed in letters.items()
        for letter in listed
    ][:MAX_DEAD_LETTERS_LISTED]
    counts = {
        kind: sum(c.counts.get(kind, 0) for c in collectors.values())
        for kind in ("retry_scheduled", "crashed", "paused")
    }
    every = list(statuses.values())
    pending = sum(s.pending for s in every)
    waiting = sum(answers.waiting.values())
    runs = [collector.run for collector in collectors.values()]
    run = runs[0] if runs else Residency()
    activations = run.summary(now)
    usage = Usage(
        # The load is what arrived, from the start to the last arrival, and all the work
        # it caused, the run's tail (timers, a queue draining) included.
        seconds=answers.last_arrival or elapsed,
        enqueues=sum(c.counts.get("enqueued", 0) for c in collectors.values()),
        alarms=sum(c.alarms for c in collectors.values()),
        busy=sum(
            _busy(track.busy, track.busy_since, now)
            for c in collectors.values()
            for track in c.tracks.values()
        ),
        resident=activations.mean * elapsed,
        rows_read=sum(c.rows_read for c in collectors.values()),
        storage_rows_written=sum(c.rows_written for c in collectors.values()),
        stored_bytes=stored_bytes,
    )
    return Result(
        scenario=scenario.to_dict(),
        finished=pending == 0 and outbox == 0 and answers.sent == expected,
        virtual_time=now,
        offered=answers.sent,
        acknowledged=acknowledged,
        rejected=sum(answers.rejected.values()),
        duplicates=sum(answers.duplicates.values()),
        delayed=sum(answers.delayed.values()),
        failed=answers.failed,
        waiting=waiting,
        succeeded=sum(s.succeeded for s in every),
        dead_lettered=sum(s.dead_lettered for s in every),
        pending=pending,
        drained=sum(s.drained for s in every),
        lost=lost,
        retries=counts["retry_scheduled"],
        crashes=counts["crashed"],
        restarts=sum(i.restarts for s in every for i in s.instances),
        pauses=counts["paused"],
        latency=Latency.of(latencies, unfinished=pending + waiting + outbox),
        enqueue_wait=Latency.of(waits, unfinished=waiting),
        instances=[instance for result in results for instance in result.instances],
        invariants=invariants,
        dead_letters=dead_letters,
        pool_events=sum(sum(c.counts.values()) for c in collectors.values()),
        activations=activations,
        cost=Bill(scenario.cost, usage),
        follow_ups=spawned,
        seeded=seeded,
        pools=results,
        requests=_requests(answers, collectors, lineage) if follow_ups else None,
        stalls=sorted(
            (stall for c in collectors.values() for stall in (*c.stalls, *c.open_stalls())),
            key=lambda stall: (stall.since, stall.pool, stall.instance),
        ),
        alarm_policy=_alarm_policy(scenario),
        depth_series=depth_series,
        running_series=run.series(),
        latencies=latencies,
        in_progress=sum(
            track.busy_since is not None for c in collectors.values() for track in c.tracks.values()
        ),
        outbox=outbox,
        not_arrived=expected - answers.sent,
    )


def _listed(status: PoolStatus, collector: Collector) -> list[int]:
    """The instances a pool's result lists, by index: every one of a pool of up to
    :data:`EVERY_INSTANCE_LISTED` (an idle one says something of the routing), else those
    the run used (an event followed, or a record in the store)."""
    if status.concurrency <= EVERY_INSTANCE_LISTED:
        return list(range(status.concurrency))
    return sorted({s.index for s in status.instances}.union(collector.tracks))


# These two run once per event of the run: column by column, not key by key.
def _since_handed(collector: Collector, due: Times, handed: Callable[[Key], float]) -> list[float]:
    """Each success's latency, in their order: from its due time, else from its handing."""
    starts, empty = due.columns, array("d")
    samples = []
    for (index, sequence), end in collector.successes():
        column = starts.get(index, empty)
        start = column[sequence] if sequence < len(column) else nan
        samples.append(end - (handed((index, sequence)) if isnan(start) else start))
    return samples


def _unaccounted(arrived: Times, collector: Collector) -> Iterator[Key]:
    """The stored arrivals the collector saw neither succeed, nor die, nor still queued."""
    queued, successes = collector.pending_keys(), collector.succeeded_at.columns
    empty: array[float] = array("d")
    for index, column in arrived.columns.by_index():
        ends = successes.get(index, empty)
        for sequence, time in enumerate(column):
            if isnan(time) or (sequence < len(ends) and not isnan(ends[sequence])):
                continue
            key = (index, sequence)
            if key not in collector.dead and key not in queued:
                yield key


def _alarm_policy(scenario: Scenario) -> str:
    """Which rule the run's failed alarms followed, in words (the report says it)."""
    if scenario.app is not None:
        return "the app's pools' own (alarm_retries as they define it)"
    limits = {pool.name: pool.alarm_retries for pool in scenario.resolved_pools}
    if all(limit is None for limit in limits.values()):
        return (
            "dopool's: a failed alarm is retried until it lands (from 2 s, doubling, at most 60 s)"
        )
    who = "Cloudflare's" if scenario.preset == "cloudflare" else "limited"
    if len(set(limits.values())) == 1:
        (limit,) = set(limits.values())
        return (
            f"{who}: a failed alarm is retried {limit} times (from 2 s, doubling), then "
            "given up until the next write sets one"
        )
    each = ", ".join(
        f"{name} {'until it lands' if limit is None else f'{limit} retries'}"
        for name, limit in limits.items()
    )
    return f"{who}, per pool: {each}"


def _busy(busy: float, since: float | None, now: float) -> float:
    return busy + (now - since if since is not None else 0.0)


def _handed(
    name: str,
    key: Key,
    *,
    arrived: Mapping[Key, float],
    collectors: Mapping[str, Collector],
    lineage: Lineage,
) -> float:
    """When an event was handed to its pool: its arrival, or its parent's success (a
    follow-up waits for its instance's current attempt like an arrival does), else
    its being stored (an app's follow-ups, whose parents are not known)."""
    if key in arrived:
        return arrived[key]
    parent = lineage.parents.get((name, *key))
    if parent is not None:
        succeeded = collectors[parent[0]].succeeded_at.get(parent[1:])
        if succeeded is not None:
            return succeeded
    return collectors[name].enqueued_at.get(key, 0.0)


def _spawned(collectors: Mapping[str, Collector], lineage: Lineage) -> int:
    """Follow-ups committed: those of every attempt that succeeded."""
    spawned = lineage.spawned
    if not spawned:  # no follow-ups anywhere: no pass over every success
        return 0
    return sum(
        spawned.get((name, index, sequence, attempt), 0)
        for name, collector in collectors.items()
        for (index, sequence), attempt in collector.succeeded_attempt.items()
    )


def _requests(
    answers: Answers,
    collectors: Mapping[str, Collector],
    lineage: Lineage,
) -> Requests:
    """Each stored arrival's request: done when every event it caused has succeeded."""
    arrived: dict[int, float] = {}  # each stored arrival's time, by its request (event id)
    for name, requests in answers.request_of.items():
        times = answers.starts(name)
        for key, ident in requests.items():
            arrived[ident] = times[key]
    created = dict.fromkeys(arrived, 1)
    finished = dict.fromkeys(created, 0)
    last = dict.fromkeys(created, 0.0)
    failed: set[int] = set()
    for name, collector in collectors.items():
        for key, attempt in collector.succeeded_attempt.items():
            request = _request(name, key, answers, lineage)
            if request is None or request not in created:
                continue
            created[request] += lineage.spawned.get((name, *key, attempt), 0)
            finished[request] += 1
            last[request] = max(last[request], collector.succeeded_at[key])
        for key in collector.dead:
            request = _request(name, key, answers, lineage)
            if request is not None and request in created:
                finished[request] += 1
                failed.add(request)
    done = [r for r in created if r not in failed and finished[r] == created[r]]
    samples = [last[r] - arrived[r] for r in done]
    unfinished = len(created) - len(done) - len(failed)
    return Requests(
        completed=len(done),
        failed=len(failed),
        unfinished=unfinished,
        latency=Latency.of(samples, unfinished=unfinished),
        latencies=samples,
    )


def _request(name: str, key: Key, answers: Answers, lineage: Lineage) -> int | None:
    request = answers.request_of[name].get(key)
    if request is None:
        request = lineage.requests.get((name, *key))
    return request


def _no_loss(
    acknowledged: int,
    spawned: int,
    seeded: int,
    statuses: Iterable[PoolStatus],
    outbox: int,
    lost: int,
    missing: list[str],
) -> Invariant:
    every = list(statuses)
    succeeded = sum(s.succeeded for s in every)
    dead = sum(s.dead_lettered for s in every)
    pending = sum(s.pending for s in every)
    drained = sum(s.drained for s in every)
    stored = f"{acknowledged} enqueued"
    if spawned or seeded:
        stored = f"{acknowledged} arrivals + {spawned} follow-ups"
        stored += f" + {seeded} stored by the app before the run" if seeded else ""
        stored += " enqueued"
    detail = (
        f"{stored} = {succeeded} succeeded + {dead} dead-lettered + "
        f"{pending} pending + {drained} drained"
    )
    if outbox:
        detail += f" + {outbox} follow-ups in flight"
    if lost:
        detail = f"{lost} lost: " + detail.replace(" = ", " != ", 1)
    if missing:
        detail += f"; {len(missing)} acknowledged events never settled ({', '.join(missing[:5])})"
    return Invariant("no loss", lost == 0 and not missing, detail)


def _store_checks(
    runtime: ToolRuntime, pool: WorkerPool, collector: Collector
) -> tuple[int, list[str], int]:
    """Guarantee 4 (counters, docs/guarantees.md) from the store, its alarm and work
    indexes, and the event stream agreeing; returns the follow-ups still in the pool's
    outboxes, the problems, and the bytes of the keys and values the instances store
    (the cost model's stored data). Read for the instances the store or the events name
    (an instance neither names has nothing to check)."""
    problems: list[str] = []
    outbox = stored = 0
    with runtime.committed() as txn:
        named = set(used_instances(txn, pool.name)).union(collector.tracks)
        for index in sorted(named):
            state = read_instance(txn, pool.name, index)
            outbox += state.meta.outbox
            problems.extend(violations(state))
            if state.meta.stored:
                values = StoredValues(Namespace(pool.name, index)).items(txn)
                stored += sum(len(item.key.encode()) + len(item.value) for item in values)
            track = collector.tracks.get(index) or InstanceTrack()
            if track.depth != state.meta.pending:
                problems.append(
                    f"{state.name}: events say {track.depth} pending, store {state.meta.pending}"
                )
        problems.extend(index_violations(txn, {pool.name: pool.concurrency}))
    return outbox, problems, stored
