"""The invariant checker: replays what a run observed and compares it with storage.

A run leaves a :class:`~dopool._chaos.history.History`: the records of what it
observed, in the order in which things were committed (:mod:`.history`).

:class:`Model` replays the history (incrementally, so it can be compared with
storage after every step) and reports a violation of the contract in
docs/guarantees.md wherever one shows (items 1-4 are its guarantees 1-4):

1. no loss — every acknowledged event, every follow-up of a succeeded attempt and
   every redriven dead letter ends succeeded, dead-lettered (expired: unstarted, past
   its ttl, and never started after it), drained or cancelled (never while running; a
   cancel answers True exactly when it cancelled), exactly once;
2. at-least-once without spurious re-execution — an attempt is settled as failed
   only if its handler raised or the instance crashed during it; a success needs
   a handler that returned and no crash; nothing runs after it settled for good;
   attempts count 1, 2, 3... and a retry never starts before its backoff;
3. order — one unsettled event per instance, and an event's first attempt never
   starts while an event due by then is pending ahead of it on that instance: of
   higher priority, or of equal priority and due earlier (or at the same time and of
   lower sequence); a scheduled event never starts before its due time; sequences
   are consecutive from 0;
4. counters — the storage invariants of :mod:`dopool._machine.invariants` (``enqueued =
   succeeded + dead_lettered + drained + cancelled + pending``, the meta's counts equal to its
   keys, every sequence below ``tail``, the started event stored), every
   counter equal to the replay's tally, ``tail`` equal to the sequences handed out,
   and ``restarts`` equal to the crashes outside ``close()`` whose restart a
   recovery committed (:meth:`Model.compare`): every one, except while a restart
   waits out its backoff, and those whose restart was still waiting at a close;
   a delayed restart never comes before its backoff;
5. storage structure — exactly the pending keys of the replay exist, each holding
   the event and priority its key says, a scheduled one under the due time its
   enqueue asked for; no alarm without pending work; nothing left over at the end;
6. dead letters — an event is dead-lettered after ``max_attempts`` attempts
   (crashes included), or at once for a ``PermanentError``;
7. follow-ups between instances, of one pool or two — the links each source
   handed out and its target has not taken are all in the source's outbox
   (:func:`dopool._machine.invariants.link_violations`, after every step), and the
   follow-ups of one source that reach one target take their sequences there in
   the order their parents succeeded (:meth:`Model.finish`);
8. dedup keys — at most one unfinished event of a pool holds a key, the one its
   index entry names, and no entry names an unfinished event that is not stored
   (:func:`dopool._machine.invariants.dedup_violations`, after every step); an enqueue
   answered ``duplicate=True`` stored nothing (it is never acknowledged, so no
   loss is expected of it) and names an event enqueued with the same key;
9. rate limits — over every window, the starts of a rate limited pool (its ``started``
   events, of all its instances, in every runtime of the run: the bucket is stored)
   are at most what its limit allows (:func:`rate_violation`, :meth:`Model.finish`).

A scenario with a second pool numbers both pools' instances in one row
(``Scenario.flat``), so every check above holds across the two.

The replay itself, and what the event stream alone shows, is its base
:class:`~dopool._chaos.replay.Replay`; the comparisons with committed storage
(read by :mod:`.snapshot`) and the books at the end are :class:`Model`'s own.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from dopool._chaos.history import Entry, Ev, History
from dopool._chaos.replay import Replay, _Instance
from dopool._chaos.snapshot import InstanceSnapshot
from dopool._machine.invariants import violations
from dopool._rates import RateLimit
from dopool._store.layout import started_event


class Model(Replay):
    """A :class:`Replay` compared with committed storage, whose books settle at the end."""

    # -- comparisons -------------------------------------------------------------------
    def compare(
        self,
        snapshots: dict[int, InstanceSnapshot],
        *,
        links: Sequence[str] = (),
        dedup: Sequence[str] = (),
        indexes: Sequence[str] = (),
        final: bool = False,
    ) -> None:
        """Check committed storage against itself and against the replay so far.

        ``links``: what the follow-up links between instances break; ``dedup``: what
        the pools' dedup indexes and their events break; ``indexes``: what the store's
        alarm and work indexes break against the metas (all from storage alone).
        """
        unread = sorted(set(self.instances) - set(snapshots))
        if unread:  # (the runner reads every instance used, or that the history names)
            self._bad(f"instances {unread[:10]} were not read from storage")
        for number in sorted(snapshots):
            inst = self.instance(number)
            self._compare_instance(number, snapshots[number], inst, final)
            # A later whole-pool pause or resume reaches it as one of the instances used.
            inst.used = inst.used or snapshots[number].stored
        for text in links:
            self._bad(f"follow-up links: {text}")
        for text in dedup:
            self._bad(f"dedup keys: {text}")
        for text in indexes:
            self._bad(f"alarm and work indexes: {text}")

    def _compare_instance(
        self, index: int, snap: InstanceSnapshot, inst: _Instance, final: bool
    ) -> None:
        meta = snap.meta
        where = f"instance {index}"
        for text in snap.bad_keys:
            self._bad(f"{where}: {text}")
        # Storage structure, from storage alone (docs/guarantees.md, "Counters").
        for text in [*violations(snap.state), *snap.counted]:
            self._bad(text)
        if len(snap.queue) != snap.state.pending_keys:
            self._bad(f"{where}: {snap.state.pending_keys} queue keys, {len(snap.queue)} events")
        place = started_event(meta.current)  # (priority, sequence)
        current = None if place is None else place[1]
        if meta.pending == 0 and meta.alarm is not None and meta.next_fire is None:
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
            "cancelled": (meta.cancelled, inst.cancelled),
            "expired": (meta.expired, inst.expired),
            "restarts": (meta.restarts, inst.restarted),
            "paused": (meta.paused, inst.paused),
        }
        for label, (stored, replayed) in tallies.items():
            if stored != replayed:
                self._bad(f"{where}: stored {label}={stored}, the event stream says {replayed}")
        for seq, due in snap.scheduled.items():
            state = self.entries.get((index, seq))
            if state is not None and state.due != due:
                self._bad(f"{where}: sequence {seq} is scheduled for {due}, asked for {state.due}")
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
        self._check_follow_up_order()
        self._check_duplicates()
        self._check_rates()
        return [*self.history.problems, *self.violations]

    def _check_rates(self) -> None:
        """Each rate limited pool's starts, all its instances' in all the run's runtimes
        together, keep to its limit in every window (docs/guarantees.md, "Rate limits")."""
        limits = self.history.limits
        if not limits:
            return
        starts: list[list[float]] = [[] for _ in limits]
        for record in self.history.records:
            if isinstance(record, Ev) and record.kind == "started":
                for number, (_, first, end, _) in enumerate(limits):
                    if first <= record.inst < end:
                        starts[number].append(record.time)
        for (pool, _, _, limit), times in zip(limits, starts, strict=True):
            found = rate_violation(times, limit)
            if found is not None:
                self._bad(f"pool {pool!r}, rate limit {limit}: {found}")

    def _check_duplicates(self) -> None:
        """Each duplicate answer names an event enqueued with its own dedup key."""
        contents, names = self.history.contents, self.history.names
        for dup in self.duplicates:
            held = names.get((dup.inst, dup.seq))
            want = contents.get(dup.id, {}).get("dedup")
            got = None if held is None else contents.get(held, {}).get("dedup")
            if held is not None and (want is None or want != got):
                self._bad(
                    f"enqueue of {dup.id!r} (dedup key {want!r}) was answered as a duplicate "
                    f"of {held!r} at {(dup.inst, dup.seq)}, whose key is {got!r}"
                )

    def _check_follow_up_order(self) -> None:
        """The follow-ups one source sends one target take sequences in their parents' order.

        A source's successes commit one after another, each with its follow-ups in the
        order its handler made them; the target takes one source's links in order. So
        for each (source, target) their first entries (a redrive makes a later one)
        come in that order. Follow-ups no record names (drained unseen) are skipped.
        """
        first: dict[str, Entry] = {}
        for entry, ident in sorted(self.history.names.items()):
            first.setdefault(ident, entry)
        for source, kids in self.successes_in_order():
            last: dict[int, tuple[int, str]] = {}
            for kid in kids:
                found = first.get(kid)
                if found is None:
                    continue
                target, seq = found
                before = last.get(target)
                if before is not None and seq < before[0]:
                    self._bad(
                        f"follow-ups of instance {source} reached instance {target} out of "
                        f"order: {kid!r} at sequence {seq}, after {before[1]!r} at {before[0]}"
                    )
                last[target] = (seq, kid)


def check_history(history: History, *, idle: bool = True) -> list[str]:
    """Replay a whole history at once; the violations it shows."""
    return Model(history).finish(idle=idle)


def rate_violation(times: Iterable[float], limit: RateLimit) -> str | None:
    """The worst window in which more of ``times`` (the starts of one pool, in any order)
    fall than ``limit`` allows, as a line; None if none does.

    Sorted, the starts ``i < j`` span ``t[j] - t[i]`` seconds and number ``j - i + 1``,
    which must be at most ``limit.allows(t[j] - t[i])``, give or take ``1e-9`` and the
    rounding of the engine's bucket arithmetic: a start's bucket is the one before it
    plus an interval, each sum rounded by up to half a unit in the last place of the
    times, so ``j - i`` sums (and the comparison) may lose that much each (a wall clock's
    times, near 2**31, by 2.4e-7 s: a few 1e-5 of a start at 200 a second; a virtual
    clock's, by far less). With ``a[k] = k (1 - slack) - (t[k] - t[0]) / interval``, a
    pair breaks the bound when ``a[j] - a[i] > burst - 1 + tolerance``: the lowest
    ``a[i]`` so far is the worst start of a window ending at ``j``, so one pass does.
    """
    ordered = sorted(times)
    if not ordered:
        return None
    interval, base = limit.interval, ordered[0]
    resolution = math.ulp(max(abs(ordered[0]), abs(ordered[-1])))
    slack = resolution / interval  # a start's share of the rounding, in starts
    tolerance = 1e-9 + 2 * slack
    worst: tuple[float, int, int] | None = None  # (excess, i, j)
    over = 0  # the starts that end a window over the limit
    low, low_at = math.inf, 0
    for j, t in enumerate(ordered):
        a = j * (1 - slack) - (t - base) / interval
        if a < low:
            low, low_at = a, j
        excess = a - low - (limit.burst - 1)
        if excess > tolerance:
            over += 1
            if worst is None or excess > worst[0]:
                worst = (excess, low_at, j)
    if worst is None:
        return None
    _, i, j = worst
    window = ordered[j] - ordered[i]
    return (
        f"{j - i + 1} of its {len(ordered)} starts fall in the {window:.6g} s from "
        f"t={ordered[i]!r} to t={ordered[j]!r}, where the limit allows "
        f"{limit.allows(window):.6g}; {over} start(s) end a window over the limit"
    )
