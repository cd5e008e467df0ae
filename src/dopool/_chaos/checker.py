"""The invariant checker: replays what a run observed and compares it with storage.

A run leaves a :class:`History`: one time-ordered list of records — the pool
events the runtime emitted (:class:`Ev`), each handler call (:class:`Exec`),
each acknowledged enqueue (:class:`Ack`), the runner's calls (:class:`Call`),
runtime opens and closes (:class:`Phase`), redrives and purges — plus a map
from stored entries ``(instance, sequence)`` to the event ids they carry.
Under a simulated clock only one actor works at a time, so this order is the
order in which things were committed.

:class:`Model` replays the history (incrementally, so it can be compared with
storage after every step) and reports a violation of the contract in
docs/guarantees.md wherever one shows (items 1-4 are its guarantees 1-4):

1. no loss — every acknowledged event, every follow-up of a succeeded attempt and
   every redriven dead letter ends succeeded, dead-lettered or drained, exactly once;
2. at-least-once without spurious re-execution — an attempt is settled as failed
   only if its handler raised or the instance crashed during it; a success needs
   a handler that returned and no crash; nothing runs after it settled for good;
   attempts count 1, 2, 3... and a retry never starts before its backoff;
3. order — one unsettled event per instance, and an event's first attempt never
   starts while an event of higher priority (or of equal priority and lower
   sequence) is pending on that instance; sequences are consecutive from 0;
4. counters — the storage invariants of :mod:`dopool._invariants` (``enqueued =
   succeeded + dead_lettered + drained + pending``, the meta's counts equal to its
   keys, every sequence below ``tail``, the started event stored), every
   counter equal to the replay's tally, ``tail`` equal to the sequences handed out,
   and ``restarts`` equal to the crashes outside ``close()`` whose restart a
   recovery committed (:meth:`Model.compare`): every one, except while a restart
   waits out its backoff, and those whose restart was still waiting at a close;
   a delayed restart never comes before its backoff;
5. storage structure — exactly the pending keys of the replay exist, each holding
   the event and priority its key says; no alarm without pending work; nothing
   left over at the end;
6. dead letters — an event is dead-lettered after ``max_attempts`` attempts
   (crashes included), or at once for a ``PermanentError``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from dopool import RetryPolicy
from dopool._invariants import InstanceState, read_instance, violations
from dopool._layout import (
    Meta,
    Namespace,
    queue_key_priority,
    queue_key_sequence,
    started_event,
    unpack,
)
from dopool._supervisor import RESTARTS_AT_ONCE, restart_delay

if TYPE_CHECKING:
    from dopool._storage import Txn

Entry = tuple[int, int]  # (instance index, sequence)

EPSILON = 1e-9


class Ev(NamedTuple):
    """A :class:`dopool.PoolEvent`, as the subscriber saw it."""

    kind: str
    inst: int
    seq: int | None
    attempt: int | None
    time: float
    error: str | None


class Exec(NamedTuple):
    """One handler call and what the handler will make of it.

    ``outcome`` is ``"ok"`` (returns), ``"error"``, ``"retry"``, ``"perm"`` (raises
    RuntimeError, RetryAfter, PermanentError) or ``"kill"`` (kills its instance).
    ``kids`` are the ids of the follow-ups it enqueues.
    """

    id: str
    inst: int
    seq: int
    attempt: int
    time: float
    outcome: str
    kids: tuple[str, ...]


class Ack(NamedTuple):
    """An enqueue that returned: event ``id`` is stored as ``(inst, seq)``."""

    id: str
    inst: int
    seq: int


class Call(NamedTuple):
    """The runner starts step ``step`` (``-1``: opening; the last: the final join)."""

    step: int
    text: str


class Phase(NamedTuple):
    """The runner is ``"closing"`` the runtime, or ``"opening"`` one."""

    name: str


class Redriven(NamedTuple):
    """Dead letters that left the dead-letter store to be enqueued again."""

    entries: tuple[tuple[int, int, str], ...]  # (instance, old sequence, id)


class Purged(NamedTuple):
    """Dead letters deleted by ``purge_dead_letters``."""

    entries: tuple[tuple[int, int], ...]


Record = Ev | Exec | Ack | Call | Phase | Redriven | Purged


@dataclass
class History:
    """What one run observed, for :class:`Model` to replay."""

    concurrency: int
    retry: RetryPolicy | None
    records: list[Record] = field(default_factory=list)
    names: dict[Entry, str] = field(default_factory=dict)  # entry -> event id
    contents: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> event
    problems: list[str] = field(default_factory=list)  # found by the runner itself
    step: int = -1

    @property
    def max_attempts(self) -> int:
        return 1 if self.retry is None else self.retry.max_attempts

    def add(self, record: Record) -> None:
        if isinstance(record, Call):
            self.step = record.step
        self.records.append(record)

    def name(self, entry: Entry, ident: str, source: str) -> None:
        """Learn that ``entry`` holds event ``ident`` (from an ack, a call or storage)."""
        known = self.names.setdefault(entry, ident)
        if known != ident:
            self.problem(
                f"entry {entry} held event {known!r}, but {source} says it holds {ident!r}"
            )

    def problem(self, text: str) -> None:
        self.problems.append(f"step {self.step}: {text}")

    def min_backoff(self, attempt: int) -> float:
        """The shortest delay the policy can draw after failed attempt ``attempt``."""
        return 0.0 if self.retry is None else self.retry.delay(attempt, 0.0)


@dataclass
class _Attempt:
    seq: int
    attempt: int
    time: float
    outcome: str | None = None  # set when the handler runs
    kids: tuple[str, ...] = ()
    crashed: bool = False


@dataclass
class _Instance:
    next_seq: int = 0
    pending: dict[int, None] = field(default_factory=dict)  # insertion-ordered set
    current: int | None = None
    attempt: _Attempt | None = None
    dead: dict[int, int] = field(default_factory=dict)  # sequence -> attempts
    paused: bool = False
    enqueued: int = 0
    succeeded: int = 0
    dead_lettered: int = 0
    drained: int = 0
    crashed: int = 0
    restarted: int = 0  # crashes the supervisor restarted, as recoveries counted them
    unrecorded: int = 0  # crashes outside close() that no recovery has counted yet
    recovered: int = 0
    restart_due: float | None = None  # when a restart waiting out its backoff may come


@dataclass
class _EntryState:
    started: list[int] = field(default_factory=list)
    terminal: str | None = None
    retry_due: float | None = None


@dataclass
class InstanceSnapshot:
    """One instance's committed state, read in one transaction.

    ``state`` is what the storage invariants read (:mod:`dopool._invariants`); the
    rest is the checker's own: which event each pending entry and dead letter holds.
    """

    state: InstanceState
    queue: dict[int, tuple[int, str | None]]  # sequence -> (priority, id)
    dead: dict[int, tuple[str | None, int]]  # sequence -> (id, attempts)
    bad_keys: list[str]

    @property
    def meta(self) -> Meta:
        return self.state.meta


def read_store(txn: Txn, pool: str, concurrency: int) -> list[InstanceSnapshot]:
    """Read every instance's state, and the events it holds, in one read transaction."""
    snapshots = []
    for index in range(concurrency):
        ns = Namespace(pool, index)
        queue: dict[int, tuple[int, str | None]] = {}
        bad: list[str] = []
        for key in ns.iter_event_keys(txn):
            record = ns.get_event(txn, key)
            sequence = queue_key_sequence(key)
            if record is None:
                bad.append(f"queue key for sequence {sequence} has no record")
                continue
            if queue_key_priority(key) != record.priority:
                bad.append(f"queue key for sequence {sequence} has the wrong priority")
            queue[sequence] = (record.priority, _event_id(unpack(record.event)))
        dead = {
            sequence: (_event_id(unpack(record.event)), record.attempts)
            for sequence, record in ns.iter_dead_letters(txn)
        }
        state = read_instance(txn, pool, index)
        snapshots.append(InstanceSnapshot(state=state, queue=queue, dead=dead, bad_keys=bad))
    return snapshots


def _event_id(event: Any) -> str | None:
    return event.get("id") if isinstance(event, dict) else None


class Model:
    """Replays a :class:`History` record by record and collects violations."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.instances = [_Instance() for _ in range(history.concurrency)]
        self.entries: dict[Entry, _EntryState] = {}
        self.expected: Counter[str] = Counter()  # id -> times it must end
        self.violations: list[str] = []
        self.executions = 0
        self._position = 0
        self._step = -1
        self._closing = False
        self._seen: set[str] = set()

    # -- replay ----------------------------------------------------------------------
    def catch_up(self) -> None:
        """Replay the records added since the last call."""
        records = self.history.records
        while self._position < len(records):
            record = records[self._position]
            self._position += 1
            if isinstance(record, Call):
                self._step = record.step
            elif isinstance(record, Ev):
                self._event(record)
            elif isinstance(record, Exec):
                self._exec(record)
            elif isinstance(record, Ack):
                self._ack(record)
            elif isinstance(record, Phase):
                self._closing = record.name == "closing"
                if record.name == "opening":
                    # A restart still waiting when the runtime closed never happens, nor
                    # counts; the new runtime's instances start with none.
                    for inst in self.instances:
                        inst.unrecorded = 0
                        inst.restart_due = None
            elif isinstance(record, Redriven):
                self._redriven(record)
            else:
                self._purged(record)

    def _bad(self, text: str) -> None:
        message = f"step {self._step}: {text}"
        if message not in self._seen:
            self._seen.add(message)
            self.violations.append(message)

    def _event(self, ev: Ev) -> None:
        inst = self.instances[ev.inst]
        kind = ev.kind
        if inst.restart_due is not None:  # the instance acts again: its restart came
            if ev.time < inst.restart_due - EPSILON:
                self._bad(
                    f"instance {ev.inst} restarted at t={ev.time}, before its backoff ended "
                    f"at t={inst.restart_due}"
                )
            inst.restart_due = None
        if kind == "enqueued":
            self._enqueued(ev, inst)
        elif kind == "started":
            self._started(ev, inst)
        elif kind in ("succeeded", "retry_scheduled", "dead_lettered"):
            self._settled(ev, inst)
        elif kind == "crashed":
            inst.crashed += 1
            if not self._closing:  # a closed mailbox starts no successor
                inst.unrecorded += 1
            if inst.attempt is not None:
                inst.attempt.crashed = True
        elif kind == "restart_delayed":
            self._restart_delayed(ev, inst)
        elif kind == "recovered":
            inst.recovered += 1
            inst.restarted += inst.unrecorded
            inst.unrecorded = 0
        elif kind == "drained":
            self._drained(ev, inst)
        elif kind in ("paused", "resumed"):
            inst.paused = kind == "paused"
        elif kind == "empty" and inst.pending:
            self._bad(f"instance {ev.inst} said 'empty' with {len(inst.pending)} pending")

    def _restart_delayed(self, ev: Ev, inst: _Instance) -> None:
        """The restart after the ``ev.attempt``-th crash in a row waits out a backoff."""
        streak = ev.attempt or 0
        if streak <= RESTARTS_AT_ONCE:
            self._bad(f"instance {ev.inst} delayed its restart after {streak} crash(es) in a row")
        if not inst.unrecorded:
            self._bad(f"instance {ev.inst} delayed a restart with no crash to restart from")
        inst.restart_due = ev.time + restart_delay(streak)

    def _enqueued(self, ev: Ev, inst: _Instance) -> None:
        assert ev.seq is not None
        if ev.seq != inst.next_seq:
            self._bad(
                f"instance {ev.inst} enqueued sequence {ev.seq}, expected {inst.next_seq} "
                "(sequences are consecutive from 0)"
            )
        inst.next_seq = max(inst.next_seq, ev.seq + 1)
        entry = (ev.inst, ev.seq)
        if entry in self.entries:
            self._bad(f"entry {entry} enqueued twice")
            return
        self.entries[entry] = _EntryState()
        inst.pending[ev.seq] = None
        inst.enqueued += 1

    def _rank(self, entry: Entry) -> tuple[int, int] | None:
        ident = self.history.names.get(entry)
        content = self.history.contents.get(ident) if ident is not None else None
        if content is None:
            return None
        return (-int(content["prio"]), entry[1])

    def _started(self, ev: Ev, inst: _Instance) -> None:
        assert ev.seq is not None
        assert ev.attempt is not None
        entry = (ev.inst, ev.seq)
        state = self.entries.get(entry)
        if state is None:
            self._bad(f"started entry {entry}, which was never enqueued")
            return
        if state.terminal is not None:
            self._bad(f"started entry {entry} (attempt {ev.attempt}) after it was {state.terminal}")
        if inst.attempt is not None:
            self._bad(
                f"instance {ev.inst} started {entry} while attempt {inst.attempt.attempt} of "
                f"sequence {inst.attempt.seq} was unsettled"
            )
        if inst.current is not None and inst.current != ev.seq:
            self._bad(
                f"instance {ev.inst} started sequence {ev.seq} while sequence {inst.current} "
                "was neither succeeded nor dead-lettered (order)"
            )
        if ev.attempt != len(state.started) + 1:
            self._bad(f"entry {entry} started attempt {ev.attempt} after {state.started}")
        if ev.attempt == 1 and inst.current is None:
            self._check_first_in_line(entry, inst)
        if state.retry_due is not None and ev.time < state.retry_due - EPSILON:
            self._bad(
                f"entry {entry} attempt {ev.attempt} started at {ev.time:.6f}, before its "
                f"backoff ended at {state.retry_due:.6f}"
            )
        state.started.append(ev.attempt)
        state.retry_due = None
        inst.current = ev.seq
        inst.attempt = _Attempt(ev.seq, ev.attempt, ev.time)

    def _check_first_in_line(self, entry: Entry, inst: _Instance) -> None:
        rank = self._rank(entry)
        if rank is None:
            self._bad(f"entry {entry} started, but the harness never learnt its event")
            return
        for seq in inst.pending:
            other = (entry[0], seq)
            other_rank = self._rank(other)
            if seq != entry[1] and other_rank is not None and other_rank < rank:
                self._bad(
                    f"instance {entry[0]} started sequence {entry[1]} (priority {-rank[0]}) "
                    f"while sequence {seq} (priority {-other_rank[0]}) was pending ahead of it"
                )
                return

    def _exec(self, ex: Exec) -> None:
        self.executions += 1
        attempt = self.instances[ex.inst].attempt
        if attempt is None or (attempt.seq, attempt.attempt) != (ex.seq, ex.attempt):
            self._bad(
                f"handler ran {ex.id} as ({ex.inst}, {ex.seq}) attempt {ex.attempt}, "
                "which is not the started attempt"
            )
            return
        if attempt.outcome is not None:
            self._bad(f"handler ran ({ex.inst}, {ex.seq}) attempt {ex.attempt} twice")
        if attempt.crashed:
            self._bad(f"handler ran ({ex.inst}, {ex.seq}) attempt {ex.attempt} after a crash")
        attempt.outcome = ex.outcome
        attempt.kids = ex.kids

    def _settled(self, ev: Ev, inst: _Instance) -> None:
        assert ev.seq is not None
        assert ev.attempt is not None
        entry = (ev.inst, ev.seq)
        attempt = inst.attempt
        if attempt is None or (attempt.seq, attempt.attempt) != (ev.seq, ev.attempt):
            self._bad(f"{ev.kind} for {entry} attempt {ev.attempt}, which was not running")
            if ev.kind == "retry_scheduled":
                return
            attempt = _Attempt(ev.seq, ev.attempt, ev.time)
        inst.attempt = None
        outcome, crashed = attempt.outcome, attempt.crashed
        what = f"{entry} attempt {ev.attempt} ({'crashed' if crashed else outcome})"
        max_attempts = self.history.max_attempts
        if ev.kind == "succeeded":
            if crashed or outcome != "ok":
                self._bad(f"succeeded {what}: only a handler that returned may succeed")
        elif not crashed and outcome in (None, "ok", "kill"):
            self._bad(f"{ev.kind} {what}: nothing failed (spurious retry)")
        if ev.kind == "retry_scheduled":
            if ev.attempt >= max_attempts:
                self._bad(f"retry scheduled after {what}, the last of {max_attempts}")
            if not crashed and outcome == "perm":
                self._bad(f"retry scheduled after a PermanentError: {what}")
            state = self.entries.get(entry)
            if state is not None:
                delay = self.history.min_backoff(ev.attempt)
                if not crashed and outcome == "retry":
                    delay = self._retry_after(entry)
                state.retry_due = ev.time + delay
            return
        permanent = not crashed and outcome == "perm"
        if ev.kind == "dead_lettered" and ev.attempt != max_attempts and not permanent:
            self._bad(f"dead-lettered {what} with {ev.attempt} of {max_attempts} attempts")
        self._terminal(entry, inst, ev.kind)
        if ev.kind == "dead_lettered":
            inst.dead_lettered += 1
            inst.dead[ev.seq] = ev.attempt
        else:
            inst.succeeded += 1
            self.expected.update(attempt.kids)

    def _retry_after(self, entry: Entry) -> float:
        ident = self.history.names.get(entry)
        content = self.history.contents.get(ident, {}) if ident is not None else {}
        return float(content.get("after", 0.0))

    def _terminal(self, entry: Entry, inst: _Instance, kind: str) -> None:
        state = self.entries.get(entry)
        if state is None:
            self._bad(f"{kind} entry {entry}, which was never enqueued")
            return
        if state.terminal is not None:
            self._bad(f"entry {entry} {kind} after it was already {state.terminal}")
        state.terminal = kind
        inst.pending.pop(entry[1], None)
        if inst.current == entry[1]:
            inst.current = None

    def _drained(self, ev: Ev, inst: _Instance) -> None:
        if inst.attempt is not None:
            self._bad(f"instance {ev.inst} drained while an attempt was running")
            inst.attempt = None
        for seq in list(inst.pending):
            self._terminal((ev.inst, seq), inst, "drained")
            inst.drained += 1
        inst.current = None

    def _ack(self, ack: Ack) -> None:
        entry = (ack.inst, ack.seq)
        self.expected[ack.id] += 1
        if entry not in self.entries:
            self._bad(f"enqueue of {ack.id} returned {entry}, which was never enqueued")

    def _redriven(self, record: Redriven) -> None:
        for index, seq, ident in record.entries:
            if self.instances[index].dead.pop(seq, None) is None:
                self._bad(f"redrove ({index}, {seq}), which was not a dead letter")
            self.expected[ident] += 1

    def _purged(self, record: Purged) -> None:
        for index, seq in record.entries:
            if self.instances[index].dead.pop(seq, None) is None:
                self._bad(f"purged ({index}, {seq}), which was not a dead letter")

    # -- comparisons -------------------------------------------------------------------
    def compare(self, snapshots: list[InstanceSnapshot], *, final: bool = False) -> None:
        """Check committed storage against itself and against the replay so far."""
        for index, (snap, inst) in enumerate(zip(snapshots, self.instances, strict=True)):
            self._compare_instance(index, snap, inst, final)

    def _compare_instance(
        self, index: int, snap: InstanceSnapshot, inst: _Instance, final: bool
    ) -> None:
        meta = snap.meta
        where = f"instance {index}"
        for text in snap.bad_keys:
            self._bad(f"{where}: {text}")
        # Storage structure, from storage alone (docs/guarantees.md, "Counters").
        for text in violations(snap.state):
            self._bad(text)
        if len(snap.queue) != snap.state.pending_keys:
            self._bad(f"{where}: {snap.state.pending_keys} queue keys, {len(snap.queue)} events")
        place = started_event(meta)  # (priority, sequence)
        current = None if place is None else place[1]
        if meta.pending == 0 and meta.alarm is not None:
            self._bad(f"{where}: nothing pending but the alarm is set at {meta.alarm}")
        if inst.unrecorded and inst.restart_due is None:
            self._bad(f"{where}: {inst.unrecorded} crash(es) and no recovery after them")
        if final and (meta.pending or meta.outbox or meta.running or meta.alarm is not None):
            self._bad(
                f"{where} at the end: pending={meta.pending} outbox={meta.outbox} "
                f"running={meta.running} alarm={meta.alarm}"
            )
        # Storage against the replay.
        tallies = {
            "enqueued": (meta.enqueued, inst.enqueued),
            "tail": (meta.tail, inst.next_seq),
            "succeeded": (meta.succeeded, inst.succeeded),
            "dead_lettered": (meta.dead_lettered, inst.dead_lettered),
            "drained": (meta.drained, inst.drained),
            "restarts": (meta.restarts, inst.restarted),
            "paused": (meta.paused, inst.paused),
        }
        for label, (stored, replayed) in tallies.items():
            if stored != replayed:
                self._bad(f"{where}: stored {label}={stored}, the event stream says {replayed}")
        if set(snap.queue) != set(inst.pending):
            lost = sorted(set(inst.pending) - set(snap.queue))
            extra = sorted(set(snap.queue) - set(inst.pending))
            self._bad(f"{where}: pending keys missing {lost[:10]}, unexpected {extra[:10]}")
        if current != inst.current:
            self._bad(f"{where}: stored current={current}, the event stream says {inst.current}")
        elif current is not None:
            started = len(self.entries[(index, current)].started)
            if meta.attempt != started:
                self._bad(
                    f"{where}: stored attempt={meta.attempt} for {current}, {started} started"
                )
        stored_dead = {seq: attempts for seq, (_, attempts) in snap.dead.items()}
        if stored_dead != inst.dead:
            self._bad(f"{where}: dead letters {stored_dead} != the event stream's {inst.dead}")

    # -- the end -------------------------------------------------------------------------
    def finish(self, *, idle: bool) -> list[str]:
        """Replay the rest and settle the books; ``idle``: the run ended with nothing to do."""
        self.catch_up()
        names = self.history.names
        ended: Counter[str] = Counter()
        for entry, state in self.entries.items():
            if state.terminal is None:
                if idle:
                    self._bad(f"entry {entry} ({names.get(entry)}) never finished (lost)")
                continue
            ident = names.get(entry)
            if ident is None:
                self._bad(f"entry {entry} was {state.terminal}, but its event is unknown")
                continue
            ended[ident] += 1
        for ident in sorted(set(self.expected) | set(ended)):
            want, got = self.expected[ident], ended[ident]
            if got > want:
                self._bad(f"event {ident!r} ended {got} times but was enqueued {want} times")
            elif got < want and idle:
                self._bad(f"event {ident!r} was enqueued {want} times but ended {got} times")
        return [*self.history.problems, *self.violations]


def check_history(history: History, *, idle: bool = True) -> list[str]:
    """Replay a whole history at once; the violations it shows."""
    return Model(history).finish(idle=idle)
