"""What one chaos run observed: its records in commit order, and the events they name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dopool._rates import RateLimit
from dopool._retry import RetryPolicy

Entry = tuple[int, int]  # (instance index, sequence)


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
    """An enqueue that returned: event ``id`` is stored as ``(inst, seq)``.

    ``due``: the clock time the enqueue asked it to be due at (a ``delay`` or a
    ``not_before``), or None: due at once. ``ttl``: the enqueue's ttl, or None.
    """

    id: str
    inst: int
    seq: int
    due: float | None = None
    ttl: float | None = None


class Dup(NamedTuple):
    """An enqueue of event ``id`` that returned ``duplicate=True``, naming ``(inst, seq)``:
    nothing was stored, and that entry holds an event of the same dedup key."""

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


class Resumed(NamedTuple):
    """The runner called ``resume`` on the instances numbered ``first`` to ``end - 1``
    (flat numbers: one instance, or a whole pool), which wakes a stall.

    Added once the call is over, whether or not a crash interrupted it: a resume
    of an instance that is not paused emits no event, and this is how the replay
    learns that the instance may start attempts again.
    """

    first: int
    end: int


class PoolPaused(NamedTuple):
    """The runner is about to pause (or resume) a pool as a whole, whose instances are
    numbered ``first`` to ``end - 1`` (flat numbers): the pool's record says so first,
    and an instance never used reads paused (or not) from it, with no event of its own."""

    first: int
    end: int
    paused: bool


class Cancelled(NamedTuple):
    """``cancel`` of entry ``(inst, seq)`` answered ``answer`` (a crash answers nothing)."""

    inst: int
    seq: int
    answer: bool


class Fired(NamedTuple):
    """A recurring schedule, removed at the end, had enqueued ``occurrences``, each
    carrying event ``id``: each must end once."""

    id: str
    occurrences: int


Record = (
    Ev
    | Exec
    | Ack
    | Dup
    | Call
    | Phase
    | Redriven
    | Purged
    | Resumed
    | PoolPaused
    | Cancelled
    | Fired
)


@dataclass
class History:
    """What one run observed, for :class:`~dopool._chaos.checker.Model` to replay.

    One time-ordered list of records — the pool events the runtime emitted
    (:class:`Ev`), each handler call (:class:`Exec`), each acknowledged enqueue
    (:class:`Ack`), the runner's calls (:class:`Call`), runtime opens and closes
    (:class:`Phase`), redrives, purges and resumes — plus a map from stored entries
    ``(instance, sequence)`` to the event ids they carry. Under a simulated clock
    only one actor works at a time, so this order is the order in which things
    were committed.
    """

    retry: RetryPolicy | None
    # The runtime bounds the instances running (``max_active``): a caller's enqueue or
    # request for one waiting in line is made in the store, its events said by the caller.
    bounded: bool = False
    # The rate limited pools: (pool, first, end, limit), its instances numbered ``first``
    # to ``end - 1`` (flat numbers); their ``started`` events are held to the limit.
    limits: tuple[tuple[str, int, int, RateLimit], ...] = ()
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
