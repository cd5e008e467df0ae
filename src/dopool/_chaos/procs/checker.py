"""The multi-process mode's checker: a run's records and its store against the guarantees.

It runs once a last worker has finished every event, over what the processes
recorded (:mod:`.records`), what the runner saw of them (:class:`Ending`), and the
store as committed: the pool's status, its dead letters and ``dopool check``'s
problems. Each check names the guarantee of docs/guarantees.md it stands for.

A frozen writer (:mod:`.freeze`) excuses nothing but a refused enqueue: a producer may
give up waiting for the writer lock while a stopped process holds it
(``StoreBusyError``), and must then have stored nothing. Its leases, and those of the
workers that waited, must not expire for it: an event that runs again after a freeze,
with no SIGKILL in between, breaks at-least-once here as anywhere, and a lease taken
over from a live worker shows in the workers' warnings and the instance's
``restarts`` (:func:`_takeovers`).

A seed whose pool is rate limited (the plan's ``rate_limit``) holds the starts of all
its workers together to the limit (:func:`_rates`): each process takes its tokens from
the one bucket the store keeps, or the bound breaks.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from dopool._chaos.checker import rate_violation
from dopool._chaos.procs.plan import MAX_ATTEMPTS, POOL, Behaviour, Plan, Send
from dopool._chaos.procs.records import Attempt, Records, Refusal
from dopool._types import DeadLetter, PoolStatus

BUSY = "StoreBusyError:"  # a refusal's error: gave up waiting for the writer lock


@dataclass
class Ending:
    """What the runner saw of the processes, and the store at the end."""

    status: PoolStatus
    dead_letters: list[DeadLetter]
    problems: list[str]  # dopool check's
    killed: set[int]  # worker generations SIGKILLed
    worker_codes: dict[int, int]  # exit statuses, by generation
    producer_codes: dict[int, int]
    errors: dict[str, str] = field(default_factory=dict)  # stderr with a traceback, by file
    # The lines each worker logged at WARNING or above, by file: none is planned.
    warnings: dict[str, list[str]] = field(default_factory=dict)
    # When each SIGKILL was sent (the system's monotonic clock, ns), by generation: with
    # two workers, generations do not follow each other, times do.
    kill_times: dict[int, int] = field(default_factory=dict)
    # Each instance's stored success counter, by index (None: not read).
    counted: dict[int, Any] | None = None


def check(plan: Plan, records: Records, ending: Ending) -> list[str]:
    """Every violation found, as lines."""
    sends = {ident: send for stream in plan.streams for send in stream for ident in send.ids}
    keys = {
        ident: key
        for stream in plan.streams
        for send in stream
        for ident, key in zip(send.ids, send.dedup_keys, strict=True)
    }
    out: list[str] = list(records.problems)
    out += _processes(ending)
    stored = _stored(plan, records, keys, out)
    _ends(plan, records, ending, stored, out)
    _attempts(plan, records, ending, stored, out)
    _order(records, sends, stored, out)
    _pauses(records, out)
    _counters(plan, records, ending, stored, out)
    _takeovers(ending, out)
    _rates(plan, records, out)
    out += [f"dopool check: {problem}" for problem in ending.problems]
    return out


def _processes(ending: Ending) -> list[str]:
    """Exits as planned, no traceback, and no worker logged a warning: none is planned,
    and a live worker that loses a lease logs one (docs/deployment.md)."""
    out = [f"producer {p} exited {code}" for p, code in ending.producer_codes.items() if code != 0]
    for g, code in ending.worker_codes.items():
        if g in ending.killed and code != -signal.SIGKILL:
            out.append(f"worker {g} exited {code} before its SIGKILL")
        elif g not in ending.killed and code != 0:
            out.append(f"worker {g} exited {code} after SIGTERM (0: every handler finished)")
    out += [f"{name}: {text}" for name, text in ending.errors.items()]
    out += [
        f"{name}: {len(lines)} line(s) logged at WARNING or above, the first: {lines[0]}"
        for name, lines in ending.warnings.items()
    ]
    return out


def _stored(
    plan: Plan, records: Records, keys: dict[str, str | None], out: list[str]
) -> dict[tuple[int, int], str]:
    """The events stored, by (instance, sequence); duplicates checked against them."""
    planned = set(keys)
    unanswered = planned - set(records.answers) - set(records.refused)
    out += [f"{i} was enqueued but never answered" for i in sorted(unanswered)]
    out += [
        f"{i}: its enqueue raised {r.error}"
        + ("" if r.error.startswith(BUSY) else ", which no freeze explains")
        + ("" if _frozen_during(records, r) else ", with no frozen writer holding the lock")
        for i, r in sorted(records.refused.items())
        if not (r.error.startswith(BUSY) and _frozen_during(records, r))
    ]
    stored: dict[tuple[int, int], str] = {}
    for ident, answer in records.answers.items():
        where = (answer.instance, answer.sequence)
        if ident not in planned:
            out.append(f"{ident} was answered but is not in the plan")
        elif not 0 <= answer.instance < plan.concurrency:
            out.append(f"{ident} went to instance {answer.instance} of {plan.concurrency}")
        elif not answer.duplicate:
            if where in stored:
                out.append(f"{ident} and {stored[where]} were both stored at {where}")
            stored[where] = ident
    by_key: dict[str, set[str]] = defaultdict(set)
    for ident, answer in records.answers.items():
        key = keys.get(ident)
        if key is not None and not answer.duplicate:
            by_key[key].add(ident)
        if not answer.duplicate:
            continue
        held = stored.get((answer.instance, answer.sequence))
        if key is None:
            out.append(f"{ident} has no dedup key but was answered as a duplicate")
        elif held is None or keys.get(held) != key:
            out.append(
                f"{ident} (key {key}) was answered as a duplicate of {held or 'nothing stored'} "
                f"at {(answer.instance, answer.sequence)}"
            )
    if plan.dedup_window > 60:  # no key is free again within the run: one event per key
        out += [f"key {k} stored {sorted(ids)}" for k, ids in by_key.items() if len(ids) > 1]
    return stored


def _frozen_during(records: Records, refusal: Refusal) -> bool:
    """Whether a frozen-writer fault that landed overlapped the refused call."""
    return any(
        f.stopped <= refusal.raised and refusal.called <= f.continued for f in records.landed
    )


def _ends(
    plan: Plan,
    records: Records,
    ending: Ending,
    stored: dict[tuple[int, int], str],
    out: list[str],
) -> None:
    """No loss (guarantee 1): each stored event ended as its behaviour says."""
    dead: dict[tuple[int, int], DeadLetter] = {}
    for letter in ending.dead_letters:
        where = (letter.instance_index, letter.sequence)
        ident = letter.event.get("id") if isinstance(letter.event, dict) else None
        if stored.get(where) != ident:
            out.append(f"dead letter {ident!r} at {where} is not the event stored there")
        dead[where] = letter
    succeeded = {(a.instance, a.sequence) for a in records.attempts if a.outcome == "ok"}
    for where, ident in sorted(stored.items()):
        behaviour = plan.behaviours.get(ident, Behaviour())
        if behaviour.dead and where not in dead:
            out.append(f"{ident} at {where} should be dead-lettered ({behaviour.mode}), is not")
        elif not behaviour.dead and where in dead:
            out.append(f"{ident} at {where} was dead-lettered: {dead[where].error}")
        elif not behaviour.dead and where not in succeeded:
            out.append(f"{ident} at {where} was acknowledged and never succeeded (lost)")


def _attempts(
    plan: Plan,
    records: Records,
    ending: Ending,
    stored: dict[tuple[int, int], str],
    out: list[str],
) -> None:
    """At-least-once (guarantee 2): an event runs again only after a failed attempt or
    one its worker's SIGKILL interrupted; nothing runs that was not stored."""
    killed, times = ending.killed, sorted(ending.kill_times.values())

    def cut(a: Attempt | None, b: Attempt) -> bool:
        """Whether a SIGKILL came between ``a`` (None: the start) and ``b``: by time where
        the starts and the kills are stamped (two workers' generations do not follow each
        other), else by generation (one worker at a time)."""
        if b.at and times:
            start = -1 if a is None else a.at
            return any(start <= t < b.at for t in times)
        if a is None:
            return any(g <= b.generation for g in killed)
        return any(a.generation <= g < b.generation for g in killed)

    runs: dict[tuple[int, int], list[Attempt]] = defaultdict(list)
    for attempt in records.attempts:
        where = (attempt.instance, attempt.sequence)
        refusal = records.refused.get(attempt.ident)
        if refusal is not None:
            out.append(f"{attempt.ident} ran at {where}, though its enqueue raised {refusal.error}")
        elif stored.get(where) != attempt.ident:
            out.append(f"{attempt.ident} ran at {where}, where {stored.get(where)} was stored")
        runs[where].append(attempt)
        if attempt.outcome is None and attempt.generation not in killed:
            out.append(f"{attempt.ident} attempt {attempt.number} never ended, unkilled")
    for where, attempts in runs.items():
        first = attempts[0]
        if first.number > 1 and not cut(None, first):
            out.append(f"{first.ident} at {where}: its first attempt is {first.number}")
        for a, b in pairwise(attempts):
            killed_between = cut(a, b)
            if b.number <= a.number:
                out.append(f"{a.ident}: attempt {b.number} after attempt {a.number}")
            elif a.outcome in ("ok", "perm") and not killed_between:
                out.append(f"{a.ident} ran again (attempt {b.number}) after its {a.outcome}")
            elif b.number > a.number + 1 and not killed_between:
                out.append(f"{a.ident}: attempt {b.number} after {a.number}, none killed")
        behaviour = plan.behaviours.get(first.ident, Behaviour())
        most = MAX_ATTEMPTS if behaviour.mode == "always" else behaviour.fails + len(killed) + 1
        if len(attempts) > most:
            out.append(f"{first.ident} ran {len(attempts)} times, at most {most} expected")


def _order(
    records: Records,
    sends: dict[str, Send],
    stored: dict[tuple[int, int], str],
    out: list[str],
) -> None:
    """Order (guarantee 3): one event at a time per instance, and events of one priority
    enqueued without a delay start in the order they were stored."""
    current: dict[int, int] = {}
    done: dict[int, set[int]] = defaultdict(set)
    first_starts: dict[tuple[int, int], list[int]] = defaultdict(list)  # (inst, prio) -> seqs
    for attempt in records.attempts:
        inst, seq = attempt.instance, attempt.sequence
        now = current.get(inst)
        if now != seq:
            if seq in done[inst]:
                out.append(f"instance {inst} started {attempt.ident} again after another event")
            if now is not None:
                done[inst].add(now)
            current[inst] = seq
        send = sends.get(stored.get((inst, seq), ""))
        if send is None or send.delay is not None:
            continue
        seqs = first_starts[(inst, send.priority)]
        if seq not in seqs:
            if seqs and seq < seqs[-1]:
                out.append(f"instance {inst} started sequence {seq} after {seqs[-1]}")
            seqs.append(seq)


def _pauses(records: Records, out: list[str]) -> None:
    """Live pause: after ``dopool pause`` returned, an instance may only finish the attempt
    that had started; nothing starts until the resume (docs/deployment.md)."""
    for generation, lines in records.timelines.items():
        paused = born_paused = False
        starts: dict[str, int] = defaultdict(int)
        ended: set[str] = set()
        for kind, fields in lines:
            if kind == "M":
                paused = fields[0] in ("pause", "paused")
                born_paused = fields[0] == "paused"  # its recovery may start nothing
                starts.clear()
                ended.clear()
            elif paused and kind == "S":
                inst = fields[1]
                starts[inst] += 1
                if born_paused or starts[inst] > 1 or inst in ended:
                    out.append(f"worker {generation}: {fields[0]} started while paused")
            elif paused and kind == "E":
                ended.add(fields[1])


def _counters(
    plan: Plan,
    records: Records,
    ending: Ending,
    stored: dict[tuple[int, int], str],
    out: list[str],
) -> None:
    """Counters (guarantee 4) against what the producers were told."""
    status = ending.status
    dead = sum(1 for ident in stored.values() if plan.behaviours.get(ident, Behaviour()).dead)
    duplicates = sum(1 for answer in records.answers.values() if answer.duplicate)
    books = (
        status.succeeded + status.dead_lettered + status.drained + status.cancelled + status.pending
    )
    expected = {
        "enqueued": (status.enqueued, len(stored)),
        "succeeded + dead_lettered + drained + cancelled + pending": (books, status.enqueued),
        "pending": (status.pending, 0),
        "drained": (status.drained, 0),  # the plan drains, cancels and expires nothing
        "cancelled": (status.cancelled, 0),
        "expired": (status.expired, 0),
        "dead_lettered": (status.dead_lettered, dead),
        "dead letters stored": (len(ending.dead_letters), dead),
        "succeeded": (status.succeeded, len(stored) - dead),
        "duplicates": (status.duplicates, duplicates),
    }
    out += [
        f"{name} is {got}, expected {want}" for name, (got, want) in expected.items() if got != want
    ]
    counted = ending.counted
    out += [  # guarantee 6: only a success's storage writes commit
        f"instance {i.index}: its handler's storage counts {counted.get(i.index)!r} "
        f"successes, the meta {i.succeeded}"
        for i in status.instances
        if counted is not None and counted.get(i.index) != i.succeeded
    ]


def _takeovers(ending: Ending, out: list[str]) -> None:
    """Leases (docs/deployment.md, several workers): a lease is taken over after it expired
    only when its worker died or hung, and each such takeover counts a restart of the
    instance. In these runs a worker dies only of a SIGKILL, and none hangs: a frozen
    writer must not let a lease expire, its own or those of the workers that waited
    for it. So an instance restarts at most once per SIGKILL; more is a lease taken
    from a live worker (renewals late: leases swapped back and forth)."""
    kills = len(ending.killed)
    over = [i for i in ending.status.instances if i.restarts > kills]
    if over:
        worst = max(over, key=lambda i: i.restarts)
        out.append(
            f"{len(over)} instance(s) restarted more often than the {kills} SIGKILL(s) "
            f"explain (leases taken over from live workers), instance {worst.index} "
            f"{worst.restarts} times"
        )


def _rates(plan: Plan, records: Records, out: list[str]) -> None:
    """Rate limits (docs/guarantees.md): the attempts every worker started, each at the
    ``ctx.started_at`` its start took a token at, keep to the pool's limit in every
    window. A start a SIGKILL cut off before its line is not seen: the bound is checked
    on fewer starts, never more."""
    limit = plan.rate_limit
    if limit is None:
        return
    times = [a.started_at for a in records.attempts if a.started_at is not None]
    found = rate_violation(times, limit)
    if found is not None:
        workers = len({a.generation for a in records.attempts if a.started_at is not None})
        out.append(f"pool {POOL!r}, rate limit {limit}, started by {workers} worker(s): {found}")
