"""What the processes of a multi-process chaos run record, and reading it back.

Each process appends whole lines to files of its own with one ``os.write`` on an
``O_APPEND`` descriptor: a line is in the kernel's page cache when the call returns,
so it survives a SIGKILL of its writer (the run does not crash the OS). A line a
kill cut short has no newline, and is ignored.

``producer-<p>.log``, by producer process ``p``::

    T <id>                                   about to send the event (tried)
    A <id> <instance> <sequence> <0|1>       its enqueue returned: stored, or a duplicate
    R <id> <called> <raised> <error>         its enqueue raised (nothing stored): when
                                             the call began and raised (ns, the
                                             system's monotonic clock), the exception

``worker-<g>.log``, by the ``g``-th worker process (the handler), and the runner::

    S <id> <instance> <sequence> <attempt> <ns> <at>  the handler started (``ns``: the
                                                      system's monotonic clock; ``at``:
                                                      its ``ctx.started_at``)
    E <id> <instance> <sequence> <attempt> <outcome>  it is about to return (ok) or raise
    M <pause|resume|paused>                           the runner's marks: a pause returned,
                                                      a resume about to start, a worker
                                                      started while paused

``faults.log``, by the runner, a line per frozen-writer fault (:mod:`.freeze`)::

    F <producer|worker> <n> <stopped> <continued> <misses>   it landed: producer ``n`` or
                                                      worker generation ``n`` held the
                                                      writer lock, stopped, from
                                                      ``stopped`` to ``continued`` (ns)
    X <producer|worker> <n> <misses> <why>            it did not land: ``why`` as words
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path


class Record:
    """An append-only file of lines, each written whole."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, *fields: object) -> None:
        os.write(self._fd, (" ".join(str(f) for f in fields) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def producer_log(root: Path, producer: int) -> Path:
    return root / f"producer-{producer}.log"


def worker_log(root: Path, generation: int) -> Path:
    return root / f"worker-{generation}.log"


def faults_log(root: Path) -> Path:
    return root / "faults.log"


@dataclass(frozen=True, slots=True)
class Answer:
    """What one enqueue answered: the event it stored, or the one holding its key."""

    producer: int
    instance: int
    sequence: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    """An enqueue that raised: when the call began and when it raised (the system's
    monotonic clock, ns), and the exception as ``Name: message``."""

    called: int
    raised: int
    error: str


@dataclass(frozen=True, slots=True)
class Freeze:
    """A frozen-writer fault: ``kind`` ``"producer"`` or ``"worker"``, ``number`` the
    producer or the worker generation; ``landed`` if it was stopped while it held the
    writer lock, from ``stopped`` to ``continued`` (ns); ``misses`` the stops that found
    the lock released (each continued at once); ``why`` one that did not land."""

    kind: str
    number: int
    landed: bool
    stopped: int = 0
    continued: int = 0
    misses: int = 0
    why: str = ""

    def line(self) -> tuple[object, ...]:
        if self.landed:
            return ("F", self.kind, self.number, self.stopped, self.continued, self.misses)
        return ("X", self.kind, self.number, self.misses, self.why)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One handler call, as the worker's lines tell it: ``outcome`` None if it never
    reached its end line (its process was killed first)."""

    generation: int
    ident: str
    instance: int
    sequence: int
    number: int
    outcome: str | None
    at: int = 0  # when it started: the system's monotonic clock, in ns (0: not known)
    # Its ``ctx.started_at``: the clock reading its start took a token at (None: not known).
    started_at: float | None = None


@dataclass
class Records:
    """Everything a run's files say."""

    tried: set[str] = field(default_factory=set)
    answers: dict[str, Answer] = field(default_factory=dict)
    refused: dict[str, Refusal] = field(default_factory=dict)
    # In the order they started (their stamps; among equal ones, generation then line).
    attempts: list[Attempt] = field(default_factory=list)
    # Per generation, the lines in order, as (kind, fields): what the pause check reads.
    timelines: dict[int, list[tuple[str, list[str]]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # lines that make no sense
    freezes: list[Freeze] = field(default_factory=list)  # the runner's, in order

    @property
    def landed(self) -> list[Freeze]:
        return [f for f in self.freezes if f.landed]


def _lines(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    text = path.read_text()
    return [line.split() for line in text.split("\n")[:-1] if line]


def read(root: Path, producers: int, generations: int) -> Records:
    found = Records()
    for p in range(producers):
        for fields in _lines(producer_log(root, p)):
            kind, ident, *rest = fields
            if kind == "T":
                found.tried.add(ident)
            elif kind == "A":
                if ident in found.answers:
                    found.problems.append(f"producer {p}: {ident} answered twice")
                instance, sequence, dup = (int(x) for x in rest)
                found.answers[ident] = Answer(p, instance, sequence, bool(dup))
            elif kind == "R":
                found.refused[ident] = Refusal(int(rest[0]), int(rest[1]), " ".join(rest[2:]))
            else:
                found.problems.append(f"producer {p}: a line of no known kind: {fields}")
    for g in range(generations):
        timeline = found.timelines[g] = []
        open_attempts: dict[tuple[int, int, int], int] = {}  # -> index in attempts
        for fields in _lines(worker_log(root, g)):
            kind, *rest = fields
            timeline.append((kind, rest))
            if kind == "S":
                ident, instance, sequence, number = rest[0], *(int(x) for x in rest[1:4])
                stamp = int(rest[4]) if len(rest) > 4 else 0
                started_at = float(rest[5]) if len(rest) > 5 else None
                open_attempts[(instance, sequence, number)] = len(found.attempts)
                found.attempts.append(
                    Attempt(g, ident, instance, sequence, number, None, stamp, started_at)
                )
            elif kind == "E":
                key = (int(rest[1]), int(rest[2]), int(rest[3]))
                at = open_attempts.pop(key, None)
                if at is None:
                    found.problems.append(f"worker {g}: an end with no start: {fields}")
                    continue
                found.attempts[at] = replace(found.attempts[at], outcome=rest[4])
            elif kind != "M":
                found.problems.append(f"worker {g}: a line of no known kind: {fields}")
    found.attempts.sort(key=lambda attempt: attempt.at)  # stable: one worker, line order
    for fields in _lines(faults_log(root)):
        kind, target, which, *rest = fields
        if kind == "F":
            stopped, continued, misses = (int(x) for x in rest[:3])
            found.freezes.append(Freeze(target, int(which), True, stopped, continued, misses))
        elif kind == "X":
            freeze = Freeze(target, int(which), False, misses=int(rest[0]), why=" ".join(rest[1:]))
            found.freezes.append(freeze)
        else:
            found.problems.append(f"faults: a line of no known kind: {fields}")
    return found
