"""What a simulation measures, from the pool's own event stream.

:class:`Collector` subscribes to a runtime and follows every
:class:`~dopool.PoolEvent`: queue depth and busy time per instance, each
event's enqueue and success times (latency), retries, crashes and restarts.
Alongside, it checks the at-least-once and order guarantees (2 and 3 in
docs/guarantees.md) event by event: an instance must start its events in
sequence, one at a time, and never start or succeed an event again after its
success.

Under a simulated clock the instances run one at a time, so the collector's
callbacks never overlap and need no lock.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from math import isnan, nan
from typing import Any, ClassVar

from dopool._sim.columns import Key, Marks, Numbers, Steps, Times, put
from dopool._sim.cost import Bill, Prices, Usage
from dopool._sim.latency import Latency
from dopool._store.layout.limits import PER_KEY
from dopool._types import PoolEvent

MAX_VIOLATIONS = 20  # kept per check: the first few say enough


@dataclass(slots=True)
class InstanceTrack:
    """One instance's running figures."""

    depth: int = 0
    max_depth: int = 0
    busy: float = 0.0
    busy_since: float | None = None
    started: int = 0
    crashes: int = 0
    queue: deque[int] = field(default_factory=deque)  # pending sequences, FIFO
    current: int | None = None  # the sequence whose attempts have started
    # The depth as a step series, from (0, 0): when it changed, and to what.
    changed_at: array[float] = field(default_factory=lambda: array("d", (0.0,)))
    depths: array[int] = field(default_factory=lambda: array("q", (0,)))
    stalled: tuple[float, int] | None = None  # since when, and the events it held then
    # Each event's sequence as its first attempt started, in that order; kept only for a
    # pool with delayed arrivals, whose order is checked at the end (``delayed_order``).
    first_starts: array[int] = field(default_factory=lambda: array("q"))
    first_started_at: array[float] = field(default_factory=lambda: array("d"))


class Tracks(dict[int, InstanceTrack]):
    """Each instance's :class:`InstanceTrack`, by index, made as its first event is
    followed (looking it up makes it; ``get`` makes nothing)."""

    __slots__ = ()

    def __missing__(self, index: int) -> InstanceTrack:
        made = self[index] = InstanceTrack()
        return made

    def by_index(self) -> list[tuple[int, InstanceTrack]]:
        """``(index, track)`` by instance index."""
        return sorted(self.items(), key=lambda item: item[0])


@dataclass(frozen=True, slots=True)
class Stall:
    """An instance whose alarm was given up (``alarm_retries``): it held ``held``
    events from ``since`` until a write set its alarm again (``until``; None: never,
    in this run)."""

    pool: str
    instance: int
    since: float
    until: float | None
    held: int

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "instance": self.instance,
            "since": round(self.since, 6),
            "until": None if self.until is None else round(self.until, 6),
            "held": self.held,
        }


@dataclass(frozen=True, slots=True)
class Activations:
    """Instances started on demand and evicted when idle, as a run's pool events tell it
    (``activated``, ``evicted``; docs/guarantees.md, "Instances started when first used")."""

    started: int
    evicted: int
    peak: int  # the most running at once
    mean: float  # running, on average over the run's virtual time
    per_second: float  # starts per virtual second

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "evicted": self.evicted,
            "peak": self.peak,
            "mean": round(self.mean, 6),
            "per_second": round(self.per_second, 6),
        }


@dataclass(slots=True)
class Residency:
    """Instances running (started, not evicted yet) over virtual time: a pool's, or a run's."""

    started: int = 0
    evicted: int = 0
    running: int = 0
    peak: int = 0
    area: float = 0.0  # instance-seconds run until ``since``
    since: float = 0.0
    # With ``steps`` (the run's, not each pool's): the instances running after each
    # change, and when (for ``--plot``).
    steps: bool = False
    times: array[float] = field(default_factory=lambda: array("d"))
    counts: array[int] = field(default_factory=lambda: array("q"))

    def change(self, delta: int, time: float) -> None:
        """One instance started (``delta`` 1) or evicted (-1) at ``time``."""
        self.area += self.running * (time - self.since)
        self.since = time
        if delta > 0:
            self.started += 1
            self.running += 1
            self.peak = max(self.peak, self.running)
        else:
            self.evicted += 1
            self.running = max(0, self.running - 1)
        if self.steps:
            self.times.append(time)
            self.counts.append(self.running)

    def series(self) -> Steps:
        """The instances running over virtual time, from ``(0, 0)``, as steps (kept with
        ``steps`` only)."""
        return Steps(array("d", [0.0]) + self.times, array("q", [0]) + self.counts)

    def summary(self, end: float) -> Activations:
        """The figures of a run that ended at ``end`` (virtual seconds)."""
        if end <= 0:
            return Activations(self.started, self.evicted, self.peak, float(self.running), 0.0)
        area = self.area + self.running * (end - self.since)
        return Activations(self.started, self.evicted, self.peak, area / end, self.started / end)


class Collector:
    """Follows a pool's events; see the module docstring. ``residency``: the run's count of
    running instances, which every pool's collector keeps too."""

    def __init__(
        self,
        pool: str,
        *,
        delays: bool = False,
        residency: Residency | None = None,
    ) -> None:
        self.pool = pool
        self.residency = Residency()  # this pool's
        self.run = self.residency if residency is None else residency  # the run's
        # With delayed arrivals an instance starts its events by due time, not by
        # sequence: the order is checked at the end, once the due times are known.
        self.delays = delays
        # Each instance's, made with its first event: a run keeps nothing for the
        # instances it never used.
        self.tracks = Tracks()
        # Per event, as columns (dopool._sim.columns): a run keeps them to its end.
        self.enqueued_at = Times()
        # When each event stored not yet due (a delayed arrival, follow-up or app event)
        # fell due; the first one turns on the order check by due time (``delays``).
        self.due_at = Times()
        self.succeeded_at = Times()  # its keys: the events that succeeded
        self.succeeded_attempt = Numbers()  # the attempt whose success committed
        self.dead = Marks()
        self._success_index = array("Q")  # the successes in the order they were told:
        self._success_sequence = array("q")  # (instance, sequence) by position
        self._enqueued = self.enqueued_at.columns  # the arrays, written without a lookup
        self._succeeded = self.succeeded_at.columns
        self._attempts = self.succeeded_attempt.columns
        self.counts: dict[str, int] = {}
        # Events stored before the run: those an app enqueued as it defined its pools (its
        # timers, say), which are neither arrivals nor follow-ups.
        self.seeded = 0
        # What the cost model reads (dopool._sim.cost): the handlers' storage rows, and
        # the attempts run from an alarm (a due time, or a retry's backoff).
        self.rows_read = 0
        self.rows_written = 0
        self.alarms = 0
        self.order_violations: list[str] = []
        self.stalls: list[Stall] = []  # ended ones; see ``open_stalls`` for the others
        self.repeat_violations: list[str] = []

    def __call__(self, event: PoolEvent) -> None:
        # ~4 pool events per arrival: each kind is followed by its own function (_FOLLOW).
        if event.pool != self.pool:
            return
        kind = event.kind
        counts = self.counts
        counts[kind] = counts.get(kind, 0) + 1
        follow = self._FOLLOW.get(kind)
        if follow is not None:
            follow(self, event, self.tracks[event.instance_index], event.time)

    def open_stalls(self) -> list[Stall]:
        """The stalls no write has ended (yet)."""
        return [
            Stall(self.pool, index, track.stalled[0], None, track.stalled[1])
            for index, track in self.tracks.by_index()
            if track.stalled is not None
        ]

    def _enqueue(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        sequence = event.sequence
        assert sequence is not None
        column = self._enqueued[event.instance_index]
        if sequence == len(column):  # put(column, sequence, time, nan), inline: hot
            column.append(time)
        else:
            put(column, sequence, time, nan)
        if event.due is not None:  # stored not yet due: its start is checked by due time
            self.due_at.put((event.instance_index, sequence), event.due)
            self.delays = True
        track.queue.append(sequence)
        depth = track.depth = track.depth + 1
        track.max_depth = max(track.max_depth, depth)
        track.changed_at.append(time)
        track.depths.append(depth)
        if track.stalled is not None:
            self._woken(event, track, time)

    def _woken(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        """A write (an enqueue, a resume, a drain) set the alarm again: a stall ends."""
        if track.stalled is not None:
            since, held = track.stalled
            self.stalls.append(Stall(self.pool, event.instance_index, since, time, held))
            track.stalled = None

    def _drain(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        track.queue.clear()
        track.current = None
        track.depth = 0
        track.changed_at.append(time)
        track.depths.append(0)
        self._woken(event, track, time)

    def _give_up(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        if track.stalled is None:
            track.stalled = (time, track.depth)

    def _activated(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        self.residency.change(1, time)
        if self.run is not self.residency:
            self.run.change(1, time)

    def _evicted(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        self.residency.change(-1, time)
        if self.run is not self.residency:
            self.run.change(-1, time)

    def _idle(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        """An attempt ended without a success: retried later, or its instance crashed."""
        if event.rows_read is not None:
            self.rows_read += event.rows_read
        if track.busy_since is not None:
            track.busy += time - track.busy_since
            track.busy_since = None
        if event.kind == "crashed":
            track.crashes += 1

    def _start(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        sequence = event.sequence
        assert sequence is not None
        index = event.instance_index
        track.busy_since = time
        track.started += 1
        attempt = event.attempt
        retried = attempt is not None and attempt > 1  # after its backoff
        if retried or (self.delays and (index, sequence) in self.due_at):  # or at its due time
            self.alarms += 1
        succeeded = self._succeeded[index]
        if sequence < len(succeeded) and not isnan(succeeded[sequence]):
            note(
                self.repeat_violations,
                f"{self.pool}:{index} started #{sequence} again after its success",
            )
        current = track.current
        if current is not None and current != sequence:
            note(
                self.order_violations,
                f"{self.pool}:{index} started #{sequence} while #{current} was unfinished",
            )
        elif current is None and self.delays:
            track.first_starts.append(sequence)
            track.first_started_at.append(time)
        elif current is None and track.queue and track.queue[0] != sequence:
            note(
                self.order_violations,
                f"{self.pool}:{index} started #{sequence} before #{track.queue[0]}",
            )
        track.current = sequence

    def _finish(self, event: PoolEvent, track: InstanceTrack, time: float) -> None:
        """An event succeeded, or was dead-lettered."""
        sequence = event.sequence
        assert sequence is not None
        index = event.instance_index
        if track.busy_since is not None:  # _idle(), inline: hot
            track.busy += time - track.busy_since
            track.busy_since = None
        if event.rows_read is not None:
            self.rows_read += event.rows_read
            self.rows_written += event.rows_written or 0
        if event.kind == "succeeded":
            succeeded = self._succeeded[index]
            size = len(succeeded)
            if sequence < size and not isnan(succeeded[sequence]):
                note(self.repeat_violations, f"{self.pool}:{index} succeeded #{sequence} twice")
            else:  # the first success is the one kept
                if sequence == size:  # put(succeeded, sequence, time, nan), inline: hot
                    succeeded.append(time)
                else:
                    put(succeeded, sequence, time, nan)
                self._success_index.append(index)
                self._success_sequence.append(sequence)
                if event.attempt is not None:
                    put(self._attempts[index], sequence, event.attempt, -1)
        else:
            self.dead.add((index, sequence))
        queue = track.queue
        if queue and queue[0] == sequence:
            queue.popleft()
        elif sequence in queue:
            queue.remove(sequence)
        track.current = None
        depth = track.depth = track.depth - 1  # (one less: not a new maximum)
        track.changed_at.append(time)
        track.depths.append(depth)

    # How each kind of event is followed (called with the collector); others are counted.
    _FOLLOW: ClassVar[dict[str, Callable[[Collector, PoolEvent, InstanceTrack, float], None]]] = {
        "enqueued": _enqueue,
        "started": _start,
        "succeeded": _finish,
        "dead_lettered": _finish,
        "retry_scheduled": _idle,
        "crashed": _idle,
        "drained": _drain,
        "alarm_given_up": _give_up,
        "resumed": _woken,
        "activated": _activated,
        "evicted": _evicted,
    }

    def successes(self) -> Iterator[tuple[Key, float]]:
        """Each event that succeeded and when, in the order the successes were told
        (their time order): a sample's order matters to batch means."""
        times = self._succeeded
        for index, sequence in zip(self._success_index, self._success_sequence, strict=True):
            yield (index, sequence), times[index][sequence]

    def pending_keys(self) -> set[Key]:
        """The (instance, sequence) of every event still queued, as the events tell it."""
        return {(i, s) for i, track in self.tracks.items() for s in track.queue}


def note(violations: list[str], text: str) -> None:
    if len(violations) < MAX_VIOLATIONS:
        violations.append(text)


# -- the result of a run ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class InstanceResult:
    pool: str
    index: int
    enqueued: int
    succeeded: int
    dead_lettered: int
    pending: int
    started: int
    crashes: int
    restarts: int
    max_depth: int
    utilisation: float
    key: str | None = None  # a per-key pool's instance: its partition key

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "index": self.index,
            **({} if self.key is None else {"key": self.key}),
            "enqueued": self.enqueued,
            "succeeded": self.succeeded,
            "dead_lettered": self.dead_lettered,
            "pending": self.pending,
            "attempts_started": self.started,
            "crashes": self.crashes,
            "restarts": self.restarts,
            "max_queue_depth": self.max_depth,
            "utilisation": round(self.utilisation, 6),
        }


@dataclass(frozen=True, slots=True)
class Invariant:
    """One guarantee checked at the end of a run."""

    name: str
    passed: bool
    detail: str

    def to_json_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class PoolResult:
    """One pool's figures. ``offered`` counts the arrivals into it (follow-ups are
    not offered: they are stored with their parent's outcome); ``enqueued`` every
    event stored into it, follow-ups included. ``latency`` runs from an arrival, or
    a follow-up's being stored, to its success; ``waiting`` arrivals were still
    unanswered when a ``duration`` stopped the run."""

    name: str
    offered: int
    acknowledged: int
    rejected: int
    duplicates: int
    enqueued: int
    succeeded: int
    dead_lettered: int
    pending: int
    retries: int
    crashes: int
    latency: Latency
    # Every instance of a pool of up to 1,024 by index; of a larger one, those its run
    # used (dopool._sim.measure.EVERY_INSTANCE_LISTED).
    instances: list[InstanceResult]
    waiting: int = 0
    delayed: int = 0  # arrivals stored with a delay (delayed_share)
    concurrency: int = 0  # the pool's instances (PER_KEY: one per key)
    # For plots only; not part of the JSON document.
    latencies: list[float] = field(default_factory=list, repr=False, compare=False)

    @property
    def utilisation(self) -> float:
        """The mean over the instances listed (a large pool's: those used)."""
        shares = [instance.utilisation for instance in self.instances]
        return math.fsum(shares) / len(shares) if shares else 0.0

    @property
    def every_instance(self) -> bool:
        """Whether :attr:`instances` lists every instance of the pool, used or not."""
        return len(self.instances) == self.concurrency

    def instance(self, index: int) -> InstanceResult | None:
        """Instance ``index``'s figures, if listed."""
        at = bisect.bisect_left(self.instances, index, key=_index_of)
        found = self.instances[at] if at < len(self.instances) else None
        return found if found is not None and found.index == index else None

    @property
    def max_depth(self) -> int:
        return max((i.max_depth for i in self.instances), default=0)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "instances": "per-key" if self.concurrency == PER_KEY else self.concurrency,
            "instances_listed": len(self.instances),
            "offered": self.offered,
            "arrivals_enqueued": self.acknowledged,
            "rejected_queue_full": self.rejected,
            "duplicates": self.duplicates,
            **({"delayed": self.delayed} if self.delayed else {}),
            "waiting_enqueue": self.waiting,
            "enqueued": self.enqueued,
            "succeeded": self.succeeded,
            "dead_lettered": self.dead_lettered,
            "pending": self.pending,
            "retries": self.retries,
            "crashes": self.crashes,
            "utilisation": round(self.utilisation, 6),
            "max_queue_depth": self.max_depth,
            "latency": self.latency.to_json_dict(),
        }


def _index_of(instance: InstanceResult) -> int:
    return instance.index


@dataclass(frozen=True, slots=True)
class Requests:
    """End to end: each arrival and every event it caused, follow-ups of follow-ups
    included. ``latency`` runs from the arrival to the success of the last of them,
    over the ``completed`` requests (every event succeeded); ``failed`` ones had an
    event dead-lettered; ``unfinished`` ones still had events pending or in flight."""

    completed: int
    failed: int
    unfinished: int
    latency: Latency
    # For plots only; not part of the JSON document.
    latencies: list[float] = field(default_factory=list, repr=False, compare=False)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "completed": self.completed,
            "failed": self.failed,
            "unfinished": self.unfinished,
            "latency": self.latency.to_json_dict(),
        }


@dataclass(frozen=True, slots=True)
class Result:
    """Everything a run measured. Only virtual-time figures: two runs of the same
    scenario and seed give equal results (and byte-identical JSON).

    ``offered`` arrivals happened; each was ``acknowledged`` (stored), a
    ``duplicate`` (its dedup key was held: nothing stored), ``rejected`` (queue
    full), ``failed`` (the instance crashed during the enqueue, nothing stored)
    or is still ``waiting`` when a ``duration`` ends the run (its instance is inside a
    handler, and an instance takes no enqueue while its handler runs).

    ``latency`` runs from an event's arrival (the caller's ``enqueue``), or a
    follow-up's being stored, to its success; ``enqueue_wait`` from an arrival to its
    being stored. ``follow_ups`` counts the follow-ups committed (``acknowledged``
    counts arrivals only), and ``seeded`` the events an app stored as it defined its
    pools, before the run (its timers, say). ``pools`` has each pool's figures,
    ``requests`` the end-to-end figures of a design with follow-ups (None without).

    A run a ``duration`` stops may leave events unfinished (:attr:`unfinished`): still
    ``pending`` (``in_progress`` of them inside a handler), ``waiting`` to be stored, or
    follow-ups in an ``outbox``. The latencies cover finished events only, so they are
    then censored (:attr:`Latency.censored`). ``not_arrived`` counts the arrivals due
    after the stop, which never happened.
    """

    scenario: dict[str, Any]
    finished: bool
    virtual_time: float
    offered: int
    acknowledged: int
    rejected: int
    duplicates: int
    failed: int
    waiting: int
    succeeded: int
    dead_lettered: int
    pending: int
    drained: int
    lost: int
    retries: int
    crashes: int
    restarts: int
    pauses: int
    latency: Latency
    enqueue_wait: Latency
    instances: list[InstanceResult]
    invariants: list[Invariant]
    dead_letters: list[dict[str, Any]]
    pool_events: int
    follow_ups: int
    pools: list[PoolResult]
    requests: Requests | None
    stalls: list[Stall]
    alarm_policy: str
    in_progress: int
    outbox: int
    not_arrived: int
    seeded: int = field(default=0, kw_only=True)  # events an app stored before the run
    activations: Activations = field(
        default=Activations(0, 0, 0, 0.0, 0.0), kw_only=True
    )  # instances started and evicted
    cost: Bill = field(default=Bill(Prices(), Usage()), kw_only=True)  # on Cloudflare
    # For plots only; not part of the JSON document.
    delayed: int = field(default=0, kw_only=True)  # arrivals stored with a delay
    depth_series: list[Steps] = field(repr=False, compare=False)  # per instance
    latencies: list[float] = field(repr=False, compare=False)
    # The instances running over virtual time (every pool's), from (0, 0).
    running_series: Steps | None = field(default=None, repr=False, compare=False, kw_only=True)

    @property
    def throughput(self) -> float:
        """Successes per virtual second."""
        return self.succeeded / self.virtual_time if self.virtual_time > 0 else 0.0

    @property
    def max_depth(self) -> int:
        return max((i.max_depth for i in self.instances), default=0)

    def busiest(self, count: int) -> list[int]:
        """The positions in :attr:`instances` (and :attr:`depth_series`) of the ``count``
        busiest instances, busiest first (by utilisation, then events enqueued); all of
        them, as listed, when there are no more than ``count``."""
        listed = self.instances
        if len(listed) <= count:
            return list(range(len(listed)))

        def rank(position: int) -> tuple[float, int, str, int]:
            item = listed[position]
            return -item.utilisation, -item.enqueued, item.pool, item.index

        return sorted(range(len(listed)), key=rank)[:count]

    def hottest(self, count: int) -> list[int]:
        """The positions in :attr:`instances` of the ``count`` busiest instances (by
        utilisation), then of the ``count`` deepest queues among the others (by the
        deepest each got, then events enqueued); all of them, as listed, when there are
        no more than twice ``count``."""
        listed = self.instances
        if len(listed) <= 2 * count:
            return list(range(len(listed)))
        busiest = self.busiest(count)
        taken = set(busiest)

        def rank(position: int) -> tuple[int, int, str, int]:
            item = listed[position]
            return -item.max_depth, -item.enqueued, item.pool, item.index

        others = (position for position in range(len(listed)) if position not in taken)
        return busiest + sorted(others, key=rank)[:count]

    @property
    def unfinished(self) -> int:
        """Events not finished when the run stopped: pending, waiting, in an outbox."""
        return self.pending + self.waiting + self.outbox

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.invariants)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "finished": self.finished,
            "virtual_time": round(self.virtual_time, 6),
            "events": {
                "offered": self.offered,
                "enqueued": self.acknowledged,
                **({"follow_ups": self.follow_ups} if self.follow_ups else {}),
                **({"seeded": self.seeded} if self.seeded else {}),
                "rejected_queue_full": self.rejected,
                "duplicates": self.duplicates,
                **({"delayed": self.delayed} if self.delayed else {}),
                "failed_enqueue": self.failed,
                "waiting_enqueue": self.waiting,
                "succeeded": self.succeeded,
                "dead_lettered": self.dead_lettered,
                "pending": self.pending,
                "drained": self.drained,
                "lost": self.lost,
            },
            "unfinished": {
                "events": self.unfinished,
                "pending": self.pending,
                "in_progress": self.in_progress,
                "waiting_enqueue": self.waiting,
                "follow_ups_in_flight": self.outbox,
                "not_arrived": self.not_arrived,
            },
            "throughput": round(self.throughput, 6),
            "latency": self.latency.to_json_dict(),
            "enqueue_wait": self.enqueue_wait.to_json_dict(),
            "retries": self.retries,
            "crashes": self.crashes,
            "restarts": self.restarts,
            "pauses": self.pauses,
            "max_queue_depth": self.max_depth,
            "activations": self.activations.to_json_dict(),
            "cost": self.cost.to_json_dict(),
            **({"pools": [p.to_json_dict() for p in self.pools]} if len(self.pools) > 1 else {}),
            **({"end_to_end": self.requests.to_json_dict()} if self.requests else {}),
            "alarm_policy": self.alarm_policy,
            **({"stalls": [stall.to_json_dict() for stall in self.stalls]} if self.stalls else {}),
            "instances": [i.to_json_dict() for i in self.instances],
            "invariants": [check.to_json_dict() for check in self.invariants],
            "invariants_passed": self.passed,
            "dead_letters": self.dead_letters,
            "pool_events": self.pool_events,
        }
