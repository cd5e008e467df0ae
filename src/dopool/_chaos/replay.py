"""The replay of a history: each instance's and entry's state, and what the event stream breaks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dopool._chaos.history import (
    Ack,
    Call,
    Cancelled,
    Dup,
    Entry,
    Ev,
    Exec,
    Fired,
    History,
    Phase,
    PoolPaused,
    Purged,
    Redriven,
    Resumed,
)
from dopool._engine.supervisor import RESTARTS_AT_ONCE, restart_delay
from dopool._machine.lifecycle import EXPIRED

EPSILON = 1e-9
# What an instance that is not running says as it starts again.
_STARTING = ("activated", "crashed", "restart_delayed", "recovered")
# What a caller's call on an instance waiting for a slot says, made in the store.
_STORED = ("enqueued", "paused", "resumed", "drained", "cancelled")


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
    cancelled: int = 0
    expired: int = 0
    crashed: int = 0
    restarted: int = 0  # crashes the supervisor restarted, as recoveries counted them
    unrecorded: int = 0  # crashes outside close() that no recovery has counted yet
    recovered: int = 0
    restart_due: float | None = None  # when a restart waiting out its backoff may come
    stalled: bool = False  # its alarm was given up, and no write has set one since
    evicted: bool = False  # since its last ``evicted``, no ``activated`` (or recovery)
    # Said something that stores its meta (all but ``activated``, ``evicted``), or storage
    # held its meta at a checkpoint (a call that changed nothing said nothing, nor a batch
    # whose events were all duplicates): until then it is paused as its pool is as a
    # whole (``PoolPaused``).
    used: bool = False


@dataclass
class _EntryState:
    enqueued_at: float
    started: list[int] = field(default_factory=list)
    terminal: str | None = None
    retry_due: float | None = None
    due: float | None = None  # scheduled for this time, later than its enqueue
    ttl: float | None = None  # its enqueue's ttl

    @property
    def due_at(self) -> float:
        """When it is due: the time its queue key holds (a simulated clock never goes back)."""
        return self.enqueued_at if self.due is None else self.due


class Replay:
    """Replays a :class:`History` record by record and collects violations."""

    def __init__(self, history: History) -> None:
        self.history = history
        # By flat number, each made when the history first names it: a pool may have
        # 2**32 instances, or one per key, of which a run touches a few dozen.
        self.instances: dict[int, _Instance] = {}
        # The last whole-pool pause or resume of each pool, (first, end) -> paused: an
        # instance the history names later, never used, is paused as its pool is.
        self._whole: dict[tuple[int, int], bool] = {}
        self.entries: dict[Entry, _EntryState] = {}
        self.expected: Counter[str] = Counter()  # id -> times it must end
        self.duplicates: list[Dup] = []  # enqueues answered with an existing event
        self.violations: list[str] = []
        self._successes: list[tuple[int, tuple[str, ...]]] = []  # (instance, kids), in order
        self.executions = 0
        self._position = 0
        self._step = -1
        self._closing = False
        self._seen: set[str] = set()
        self._unanswered: set[Entry] = set()  # cancelled, the cancel's answer not seen yet

    def instance(self, number: int) -> _Instance:
        """The replay of instance ``number`` (flat), made on first use."""
        inst = self.instances.get(number)
        if inst is None:
            paused = any(first <= number < end and p for (first, end), p in self._whole.items())
            inst = self.instances[number] = _Instance(paused=paused)
        return inst

    def successes_in_order(self) -> list[tuple[int, tuple[str, ...]]]:
        """Each committed success so far, in commit order: its instance and its follow-ups."""
        return list(self._successes)

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
            elif isinstance(record, Dup):
                self.duplicates.append(record)
            elif isinstance(record, Phase):
                self._closing = record.name == "closing"
                if record.name == "opening":
                    # A restart still waiting when the runtime closed never happens, nor
                    # counts; the new runtime's instances start with none.
                    for inst in self.instances.values():
                        inst.unrecorded = 0
                        inst.restart_due = None
            elif isinstance(record, Redriven):
                self._redriven(record)
            elif isinstance(record, Resumed):
                for inst in self._between(record.first, record.end):
                    inst.stalled = False  # (one not named yet is not stalled)
            elif isinstance(record, PoolPaused):
                self._whole[record.first, record.end] = record.paused
                for inst in self._between(record.first, record.end):
                    if not inst.used:
                        inst.paused = record.paused
            elif isinstance(record, Cancelled):
                self._answered(record)
            elif isinstance(record, Fired):
                self.expected[record.id] += record.occurrences
            else:
                self._purged(record)

    def _between(self, first: int, end: int) -> list[_Instance]:
        """The instances numbered ``first`` to ``end - 1`` that the history named so far."""
        if end - first == 1:  # (one instance: named now)
            return [self.instance(first)]
        return [inst for number, inst in self.instances.items() if first <= number < end]

    def _bad(self, text: str) -> None:
        message = f"step {self._step}: {text}"
        if message not in self._seen:
            self._seen.add(message)
            self.violations.append(message)

    def _event(self, ev: Ev) -> None:
        inst = self.instance(ev.inst)
        kind = ev.kind
        if inst.restart_due is not None:  # the instance acts again: its restart came
            if ev.time < inst.restart_due - EPSILON:
                self._bad(
                    f"instance {ev.inst} restarted at t={ev.time}, before its backoff ended "
                    f"at t={inst.restart_due}"
                )
            inst.restart_due = None
        stored = self.history.bounded and kind in _STORED  # a caller's, in line for a slot
        if inst.evicted and kind not in _STARTING and not stored:
            self._bad(f"instance {ev.inst} said {kind!r} while evicted, not started again")
        if kind not in ("activated", "evicted"):
            inst.used = True
        if kind in ("enqueued", "resumed", "drained"):
            inst.stalled = False  # a write that sets an alarm, or nothing left to stall
        if kind == "enqueued":
            self._enqueued(ev, inst)
        elif kind == "alarm_given_up":
            self._given_up(ev, inst)
        elif kind == "started":
            self._started(ev, inst)
        elif kind == "dead_lettered" and (ev.error or "").startswith(EXPIRED):
            self._expired(ev, inst)
        elif kind in ("succeeded", "retry_scheduled", "dead_lettered"):
            self._settled(ev, inst)
        elif kind == "cancelled":
            self._cancelled(ev, inst)
        elif kind == "crashed":
            inst.crashed += 1
            if not self._closing:  # a closed mailbox starts no successor
                inst.unrecorded += 1
            if inst.attempt is not None:
                inst.attempt.crashed = True
        elif kind == "restart_delayed":
            self._restart_delayed(ev, inst)
        elif kind == "evicted":
            if inst.attempt is not None:
                self._bad(f"instance {ev.inst} was evicted with an attempt not settled")
            inst.evicted = True
        elif kind == "activated":
            inst.evicted = False
        elif kind == "recovered":
            inst.evicted = False  # a crash of its start: restarted, running again
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

    def _given_up(self, ev: Ev, inst: _Instance) -> None:
        """The instance's alarm failed once more than ``alarm_retries`` allows: it stalls."""
        # Instance 0 of the first pool may give up an alarm set for a schedule's fire only.
        fires = ev.inst == 0 and any(name.startswith("sched-") for name in self.history.contents)
        if (not inst.pending and not fires) or inst.attempt is not None:
            self._bad(
                f"instance {ev.inst} gave its alarm up with {len(inst.pending)} pending and "
                f"an attempt {'running' if inst.attempt is not None else 'not running'}"
            )
        inst.stalled = True

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
        self.entries[entry] = _EntryState(ev.time)
        inst.pending[ev.seq] = None
        inst.enqueued += 1

    def _rank(self, entry: Entry) -> tuple[int, float, int] | None:
        """Its place among the due events of its instance: (-priority, due time, sequence)."""
        ident = self.history.names.get(entry)
        content = self.history.contents.get(ident) if ident is not None else None
        state = self.entries.get(entry)
        if content is None or state is None:
            return None
        return (-int(content["prio"]), state.due_at, entry[1])

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
        if inst.stalled:
            self._bad(f"instance {ev.inst} started {entry} while stalled (no write woke it)")
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
        ttl = state.ttl
        if ev.attempt == 1 and ttl is not None and ev.time >= state.enqueued_at + ttl:
            self._bad(f"entry {entry} started at {ev.time!r}, past its ttl of {ttl}")
        if state.due is not None and ev.time < state.due:
            self._bad(f"entry {entry} started at {ev.time!r}, before it was due at {state.due!r}")
        if ev.attempt == 1 and inst.current is None:
            self._check_first_in_line(entry, inst, ev.time)
        if state.retry_due is not None and ev.time < state.retry_due - EPSILON:
            self._bad(
                f"entry {entry} attempt {ev.attempt} started at {ev.time:.6f}, before its "
                f"backoff ended at {state.retry_due:.6f}"
            )
        state.started.append(ev.attempt)
        state.retry_due = None
        inst.current = ev.seq
        inst.attempt = _Attempt(ev.seq, ev.attempt, ev.time)

    def _check_first_in_line(self, entry: Entry, inst: _Instance, now: float) -> None:
        """No event due by ``now`` goes before it: of higher priority, or of its priority and
        due earlier, or due at the same time and enqueued earlier."""
        rank = self._rank(entry)
        if rank is None:
            self._bad(f"entry {entry} started, but the harness never learnt its event")
            return
        for seq in inst.pending:
            other = (entry[0], seq)
            other_rank = self._rank(other)
            if seq == entry[1] or other_rank is None or other_rank[1] > now:
                continue
            if other_rank < rank:
                self._bad(
                    f"instance {entry[0]} started sequence {entry[1]} (priority {-rank[0]}, "
                    f"due {rank[1]}) while sequence {seq} (priority {-other_rank[0]}, due "
                    f"{other_rank[1]}) was pending ahead of it"
                )
                return

    def _exec(self, ex: Exec) -> None:
        self.executions += 1
        attempt = self.instance(ex.inst).attempt
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
            self._successes.append((ev.inst, attempt.kids))

    def _content(self, entry: Entry) -> dict[str, Any]:
        ident = self.history.names.get(entry)
        return self.history.contents.get(ident, {}) if ident is not None else {}

    def _retry_after(self, entry: Entry) -> float:
        return float(self._content(entry).get("after", 0.0))

    def _expired(self, ev: Ev, inst: _Instance) -> None:
        """Dead-lettered unstarted, as expired: never started, and its ttl had passed."""
        assert ev.seq is not None
        entry = (ev.inst, ev.seq)
        state = self.entries.get(entry)
        ttl = None if state is None else state.ttl
        if state is None or ttl is None:
            self._bad(f"entry {entry} expired, but its enqueue gave it no ttl")
        if state is not None and state.started:
            self._bad(f"entry {entry} expired after {len(state.started)} attempt(s) started")
        if state is not None and ttl is not None and ev.time < state.enqueued_at + ttl:
            self._bad(f"entry {entry} expired at {ev.time!r}, within its ttl of {ttl}")
        if inst.attempt is not None or ev.attempt != 0:
            self._bad(f"entry {entry} expired with an attempt running or counted")
        self._terminal(entry, inst, "expired")
        inst.dead_lettered += 1
        inst.expired += 1
        inst.dead[ev.seq] = 0

    def _cancelled(self, ev: Ev, inst: _Instance) -> None:
        """Cancelled: waiting (scheduled, due, or its retry in backoff), not running."""
        assert ev.seq is not None
        if inst.attempt is not None and inst.attempt.seq == ev.seq:
            self._bad(f"entry {(ev.inst, ev.seq)} cancelled while its attempt was running")
        self._terminal((ev.inst, ev.seq), inst, "cancelled")
        inst.cancelled += 1
        self._unanswered.add((ev.inst, ev.seq))

    def _answered(self, record: Cancelled) -> None:
        """A cancel's answer agrees with the events: True exactly when it was cancelled."""
        entry = (record.inst, record.seq)
        cancelled = entry in self._unanswered
        self._unanswered.discard(entry)
        if record.answer != cancelled:
            what = "was not" if record.answer else "was"
            self._bad(f"cancel of {entry} answered {record.answer}, but it {what} cancelled")

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
        state = self.entries.get(entry)
        if state is None:
            self._bad(f"enqueue of {ack.id} returned {entry}, which was never enqueued")
        else:
            state.ttl = ack.ttl
            if ack.due is not None and ack.due > state.enqueued_at:
                state.due = ack.due  # scheduled: not to start before it

    def _redriven(self, record: Redriven) -> None:
        for index, seq, ident in record.entries:
            if self.instance(index).dead.pop(seq, None) is None:
                self._bad(f"redrove ({index}, {seq}), which was not a dead letter")
            self.expected[ident] += 1

    def _purged(self, record: Purged) -> None:
        for index, seq in record.entries:
            if self.instance(index).dead.pop(seq, None) is None:
                self._bad(f"purged ({index}, {seq}), which was not a dead letter")
