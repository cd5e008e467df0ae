"""The storage side of guarantee 4 ("Counters", docs/guarantees.md), checked in one place.

An instance's meta record keeps counters that its keys must bear out. Every
committed transaction leaves them balanced, so any snapshot of the store must:

- ``enqueued = succeeded + dead_lettered + drained + cancelled + pending``, and
  ``expired <= dead_lettered`` (an expired event is dead-lettered);
- every pending event has an event index entry, and every entry names a pending
  event; the meta's ``remembered`` is the number of remembered finished events;
- the meta's ``pending``, ``held_dead_letters`` and ``outbox`` equal the number of
  queue and scheduled, dead-letter and outbox keys, and its ``scheduled`` the number
  of scheduled keys;
- its per-priority counts equal those of the queue keys;
- its ``next_due`` is the first scheduled key's due time, and no queue key is due
  later than its ``last_due``;
- every sequence (of a queue or dead-letter key) is below the ``tail``;
- the started event (``started_event(meta.current)``) has a record, and an attempt is
  running only if an event is started;
- pending events that may start (not paused, no attempt running) have an alarm
  set, unless the instance gave its alarm up and is marked stalled
  (``dopool._machine.alarm.stalled``); a stalled instance has events pending (or a
  schedule to fire) and no attempt running; and where the alarm may be set anew (no
  failed delivery backs it off), it is not later than the next scheduled event's due
  time, nor than the next fire of a schedule (instance 0's ``next_fire``), which an
  instance free to fire always has an alarm for.

And between instances, of this pool or another, the follow-up links
(:class:`LinkTally`, :func:`broken_links`): for each source and target, the links
the source handed out (its meta's ``links``) that the target has not accepted (its
delivery mark for that source) are all in the source's outbox, so none is lost;
the target accepted none the source did not hand out; and the outbox holds none
twice, and none the source did not hand out.

And a pool's dedup index against its events (:class:`DedupTally`,
:func:`broken_dedup`): at most one pending event holds a key, the one its entry
names, and every entry of an unfinished event names one that is stored.

And the store-wide indexes against the metas (:func:`index_violations`): an instance
whose alarm slot is set has one alarm index entry, at its due time, and none
otherwise; one with work (pending events, or follow-ups in its outbox) has one work
index entry, and none otherwise; no entry names anything else.

:func:`read_instance` reads one instance's state in a read transaction into an
:class:`InstanceState`; :func:`violations` lists what it breaks. ``dopool check``
(which walks every record itself and counts keys with :class:`KeyTally`), the
simulate report's "counters" invariant, the chaos checker and the stateful
tests all take these checks from here, and keep only what is theirs: damaged
records and stray keys, the event stream, the replayed history, the model.

And guarantee 6 ("An instance's own storage") as a checking handler sees it
(:func:`counter_violations`): a handler that adds one, in its instance's storage, to the
counter under :data:`SUCCESS_COUNTER` at every attempt has a counter equal to the meta's
``succeeded`` in every snapshot, since its writes commit with its successes and with
nothing else. The chaos harness's handlers count so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dopool._errors import DamagedRecordError
from dopool._machine.alarm import stalled
from dopool._store.layout import (
    MIGRATED_DUE,
    DedupIndex,
    DedupRecord,
    Meta,
    Namespace,
    OutboxRecord,
    RecordKind,
    StoredValues,
    alarm_index,
    dead_letter_sequence,
    delayed_key_due,
    parse_alarm_entry,
    parse_work_entry,
    queue_key_due,
    queue_key_priority,
    queue_key_sequence,
    read_dedup,
    started_event,
    unpack,
    used_instances,
    work_index,
)
from dopool._store.txn import Txn


@dataclass(frozen=True, slots=True)
class InstanceState:
    """One instance's meta, and what its keys add up to, read in one transaction."""

    pool: str
    index: int
    meta: Meta
    pending_keys: int  # queue and scheduled keys
    delayed_keys: int
    first_due: float | None  # the first scheduled key's due time
    last_queue_due: float  # the latest due time of a queue key (MIGRATED_DUE if none)
    dead_letter_keys: int
    outbox_keys: int
    priorities: dict[int, int]  # queue keys per priority, in key order
    last_sequence: int  # the highest sequence of a queue or dead-letter key; -1 if none
    started_has_record: bool  # the started event's queue key exists (True if none started)
    unindexed: int = 0  # pending events without an index entry
    stray_entries: int = 0  # index entries that name no pending event
    remembered_keys: int = 0  # remembered finished events
    stored_keys: int = 0  # values of the instance's own storage

    @property
    def name(self) -> str:
        """The instance as reports name it: ``pool:index``."""
        return f"{self.pool}:{self.index}"


@dataclass(slots=True)
class KeyTally:
    """What the keys of one instance's namespace add up to, counted one key at a time."""

    queue: set[bytes] = field(default_factory=set)
    priorities: dict[int, int] = field(default_factory=dict)
    scheduled: int = 0
    first_due: float | None = None
    last_queue_due: float = MIGRATED_DUE
    dead_letters: int = 0
    outbox: int = 0
    last_sequence: int = -1
    sequences: set[int] = field(default_factory=set)  # of the pending events
    entries: set[int] = field(default_factory=set)  # of the index entries
    remembered: int = 0
    stored: int = 0

    def add(self, kind: RecordKind, key: bytes) -> None:
        """Count ``key``, a key of ``kind`` (the meta and delivery marks count for nothing)."""
        if kind is RecordKind.EVENT:
            self.queue.add(key)
            priority = queue_key_priority(key)
            self.priorities[priority] = self.priorities.get(priority, 0) + 1
            self.last_sequence = max(self.last_sequence, queue_key_sequence(key))
            self.last_queue_due = max(self.last_queue_due, queue_key_due(key))
            self.sequences.add(queue_key_sequence(key))
        elif kind is RecordKind.DELAYED:
            self.scheduled += 1
            self.sequences.add(queue_key_sequence(key))
            due = delayed_key_due(key)
            self.first_due = due if self.first_due is None else min(self.first_due, due)
            self.last_sequence = max(self.last_sequence, queue_key_sequence(key))
        elif kind is RecordKind.DEAD_LETTER:
            self.dead_letters += 1
            self.last_sequence = max(self.last_sequence, dead_letter_sequence(key))
        elif kind is RecordKind.OUTBOX:
            self.outbox += 1
        elif kind is RecordKind.INDEX:
            self.entries.add(queue_key_sequence(key))  # its key ends with the sequence
        elif kind is RecordKind.FINISHED:
            self.remembered += 1
        elif kind is RecordKind.STORED:
            self.stored += 1

    @property
    def empty(self) -> bool:
        """No queue, dead-letter or outbox key was counted."""
        return not (self.queue or self.scheduled or self.dead_letters or self.outbox)

    def state(self, pool: str, index: int, meta: Meta) -> InstanceState:
        """The counted keys beside the instance's ``meta``."""
        return InstanceState(
            pool=pool,
            index=index,
            meta=meta,
            pending_keys=len(self.queue) + self.scheduled,
            delayed_keys=self.scheduled,
            first_due=self.first_due,
            last_queue_due=self.last_queue_due,
            dead_letter_keys=self.dead_letters,
            outbox_keys=self.outbox,
            priorities=dict(self.priorities),
            last_sequence=self.last_sequence,
            started_has_record=meta.current is None or meta.current in self.queue,
            unindexed=len(self.sequences - self.entries),
            stray_entries=len(self.entries - self.sequences),
            remembered_keys=self.remembered,
            stored_keys=self.stored,
        )


def read_instance(txn: Txn, pool: str, index: int) -> InstanceState:
    """Read instance ``pool:index``'s meta and count its keys, in ``txn``.

    An instance with no meta record reads as a fresh one (every counter 0).

    Raises:
        DamagedRecordError: the meta record is damaged.
    """
    namespace = Namespace(pool, index)
    tally = KeyTally()
    for kind, key in namespace.iter_keys(txn):
        tally.add(kind, key)
    return tally.state(pool, index, namespace.load_meta(txn))


def broken_invariants(state: InstanceState) -> list[str]:
    """Every invariant ``state`` breaks, in words, without the instance's name.

    For a report that names the instance apart (``dopool check``); :func:`violations`
    names it in each line.
    """
    meta = state.meta
    broken: list[str] = []
    counts = (
        ("pending events", meta.pending, state.pending_keys),
        ("scheduled events", meta.scheduled, state.delayed_keys),
        ("dead letters", meta.held_dead_letters, state.dead_letter_keys),
        ("outbox entries", meta.outbox, state.outbox_keys),
        ("remembered events", meta.remembered, state.remembered_keys),
        ("stored values", meta.stored, state.stored_keys),
    )
    for what, recorded, keys in counts:
        if recorded != keys:
            broken.append(f"meta counts {recorded} {what}, the store holds {keys}")
    total = meta.succeeded + meta.dead_lettered + meta.drained + meta.cancelled + meta.pending
    if meta.enqueued != total:
        broken.append(
            f"enqueued {meta.enqueued} != succeeded + dead_lettered + drained + cancelled "
            f"+ pending = {total}"
        )
    if meta.expired > meta.dead_lettered:
        broken.append(f"expired {meta.expired} > dead_lettered {meta.dead_lettered}")
    if state.unindexed or state.stray_entries:
        broken.append(
            f"{state.unindexed} pending events without an index entry, "
            f"{state.stray_entries} entries of no pending event"
        )
    if meta.priorities != state.priorities:
        broken.append(f"meta counts {meta.priorities} per priority, the keys {state.priorities}")
    if meta.next_due != state.first_due:
        broken.append(f"meta's next due time {meta.next_due}, the keys' {state.first_due}")
    last_due = MIGRATED_DUE if meta.last_due is None else meta.last_due
    if state.last_queue_due > last_due:
        broken.append(f"a queue key due at {state.last_queue_due}, past last_due {last_due}")
    if state.last_sequence >= meta.tail:
        broken.append(f"sequence {state.last_sequence} at or past the tail {meta.tail}")
    started = started_event(meta.current)  # (priority, sequence)
    if started is not None and not state.started_has_record:
        broken.append(f"the started event {started[1]} has no record")
    if meta.running and started is None:
        broken.append("an attempt is running, but no event is started")
    if stalled(meta):
        if (meta.pending == 0 and meta.next_fire is None) or meta.running:
            broken.append(
                f"stalled ({meta.alarm_failures} alarm failures, no alarm) with "
                f"{meta.pending} pending and running={meta.running}"
            )
    elif meta.pending and meta.alarm is None and not (meta.paused or meta.running):
        broken.append(f"{meta.pending} pending events, no alarm set, and not stalled")
    elif (
        meta.next_due is not None
        and meta.alarm is not None
        and meta.alarm > meta.next_due
        and not (meta.paused or meta.running or meta.alarm_failures)
    ):
        broken.append(f"the alarm at {meta.alarm} is past the next due time {meta.next_due}")
    if meta.next_fire is not None and not (meta.paused or meta.running or stalled(meta)):
        if meta.alarm is None:
            broken.append(f"a schedule fires at {meta.next_fire}, and no alarm is set")
        elif meta.alarm > meta.next_fire and not meta.alarm_failures:
            broken.append(f"the alarm at {meta.alarm} is past the next fire {meta.next_fire}")
    return broken


def violations(state: InstanceState) -> list[str]:
    """Every invariant ``state`` breaks, each a line naming the instance.

    For example ``"p:0: enqueued 5 != succeeded + dead_lettered + drained + cancelled +
    pending = 4"``; an empty list if the instance balances.
    """
    return [f"{state.name}: {what}" for what in broken_invariants(state)]


# -- follow-up links between instances ---------------------------------------------------

Pair = tuple[str, str]  # (source instance id, target instance id)


@dataclass(slots=True)
class LinkTally:
    """The follow-up links between instances, as a store holds them.

    ``handed``: the next link per pair (the source's meta); ``accepted``: the last
    link the target took (its delivery mark); ``parked``: the links in the source's
    outbox. ``known``: the sources whose meta was read. ``uncertain``: instances
    with a damaged meta, mark or outbox entry, whose pairs cannot be judged.
    """

    known: set[str] = field(default_factory=set)
    handed: dict[Pair, int] = field(default_factory=dict)
    accepted: dict[Pair, int] = field(default_factory=dict)
    parked: dict[Pair, list[int]] = field(default_factory=dict)
    uncertain: set[str] = field(default_factory=set)

    def add_meta(self, source: str, meta: Meta) -> None:
        self.known.add(source)
        for target, link in meta.links.items():
            self.handed[source, target] = link

    def add_mark(self, target: str, source: tuple[str, int], link: int) -> None:
        self.accepted[f"{source[0]}:{source[1]}", target] = link

    def add_outbox(self, source: str, record: OutboxRecord) -> None:
        pair = (source, f"{record.pool}:{record.target}")
        self.parked.setdefault(pair, []).append(record.link)


def broken_links(tally: LinkTally) -> list[tuple[str, str]]:
    """Every pair of instances whose links do not add up: ``(instance id, what)``."""
    broken: list[tuple[str, str]] = []
    pairs = tally.handed.keys() | tally.accepted.keys() | tally.parked.keys()
    for source, target in sorted(pairs):
        if source in tally.uncertain or target in tally.uncertain:
            continue
        if source not in tally.known:
            if (source, target) in tally.accepted:
                broken.append((target, f"accepted follow-ups from {source}, which has no meta"))
            continue
        handed = tally.handed.get((source, target), 0)
        accepted = tally.accepted.get((source, target), -1)
        parked = tally.parked.get((source, target), [])
        if accepted >= handed:
            broken.append(
                (
                    target,
                    f"accepted follow-up link {accepted} from {source}, which handed out "
                    f"links below {handed} only",
                )
            )
        if len(set(parked)) != len(parked):
            broken.append((source, f"its outbox holds a link for {target} twice"))
        beyond = sorted(link for link in parked if link >= handed)
        if beyond:
            broken.append(
                (
                    source,
                    f"its outbox holds link {beyond[0]} for {target}, at or past its next "
                    f"link {handed}",
                )
            )
        waiting = {link for link in parked if accepted < link < handed}
        lost = handed - accepted - 1 - len(waiting)
        if lost > 0:
            broken.append(
                (
                    source,
                    f"{lost} follow-up link(s) for {target} between {accepted + 1} and "
                    f"{handed - 1} are neither accepted nor in its outbox (lost)",
                )
            )
    return broken


def read_links(txn: Txn, pools: dict[str, int]) -> LinkTally:
    """The links between the instances of ``pools`` (name -> concurrency), in ``txn``.

    Raises:
        DamagedRecordError: a meta or a delivery mark is damaged.
    """
    tally = LinkTally()
    for pool in pools:
        for index in used_instances(txn, pool):  # (one never used has no link)
            namespace = Namespace(pool, index)
            ident = f"{pool}:{index}"
            tally.add_meta(ident, namespace.load_meta(txn))
            for source, link in namespace.iter_marks(txn):
                tally.add_mark(ident, source, link)
            for _, record in namespace.iter_outbox(txn):
                if isinstance(record, OutboxRecord):
                    tally.add_outbox(ident, record)
                else:
                    tally.uncertain.add(ident)
    return tally


def link_violations(tally: LinkTally) -> list[str]:
    """:func:`broken_links` as lines naming the instance, like :func:`violations`."""
    return [f"{where}: {what}" for where, what in broken_links(tally)]


# -- dedup keys --------------------------------------------------------------------------


@dataclass(slots=True)
class DedupTally:
    """A store's dedup index beside the keyed events it holds.

    ``entries``: each pool's index entries by dedup key; ``keyed``: each pending event
    that holds a key, ``(pool, index, sequence, dedup key, its key)``; ``stored``: the
    keys of every pending event read; ``holds``: the dedup key (or None) of each that
    reads, by its key; ``uncertain``: pools with a damaged entry.
    """

    entries: dict[str, dict[str, DedupRecord]] = field(default_factory=dict)
    keyed: list[tuple[str, int, int, str, bytes]] = field(default_factory=list)
    stored: set[bytes] = field(default_factory=set)
    holds: dict[bytes, str | None] = field(default_factory=dict)
    uncertain: set[str] = field(default_factory=set)

    def add_entry(self, pool: str, record: DedupRecord) -> None:
        self.entries.setdefault(pool, {})[record.dedup_key] = record

    def add_event(self, pool: str, index: int, key: bytes, dedup_key: str | None) -> None:
        self.stored.add(key)
        self.holds[key] = dedup_key
        if dedup_key is not None:
            self.keyed.append((pool, index, queue_key_sequence(key), dedup_key, key))


def broken_dedup(tally: DedupTally) -> list[tuple[str, bytes | None, str]]:
    """What the index and the events break: ``(pool, key, what)``.

    Every unfinished entry names a stored event that holds its key, every keyed pending
    event is the one its key's entry names (so no two pending events hold one key), and
    no pool's key is held twice.
    """
    broken: list[tuple[str, bytes | None, str]] = []
    for pool, entries in sorted(tally.entries.items()):
        for dedup_key, entry in entries.items():
            if entry.finished_at is not None:
                continue
            ns = Namespace(pool, entry.instance)
            keys = (
                ns.queue_key(entry.priority, entry.sequence, entry.due),
                ns.delayed_key(entry.priority, entry.sequence, entry.due),
            )
            found = next((key for key in keys if key in tally.stored), None)
            named = (
                f"dedup key {dedup_key!r} names event {entry.sequence} of {pool}:{entry.instance}"
            )
            if found is None:
                broken.append((pool, None, f"{named}, unfinished, which is not stored"))
            elif found in tally.holds and tally.holds[found] != dedup_key:  # (it reads)
                other = tally.holds[found]
                broken.append((pool, found, f"{named}, which holds dedup key {other!r}"))
    held: dict[tuple[str, str], int] = {}
    for pool, index, sequence, dedup_key, key in tally.keyed:
        held[pool, dedup_key] = held.get((pool, dedup_key), 0) + 1
        if pool in tally.uncertain:
            continue
        holder = tally.entries.get(pool, {}).get(dedup_key)
        if (
            holder is None
            or holder.finished_at is not None
            or (holder.instance, holder.sequence) != (index, sequence)
        ):
            broken.append(
                (
                    pool,
                    key,
                    f"event {sequence} of {pool}:{index} holds dedup key {dedup_key!r}, "
                    "whose index entry does not name it",
                )
            )
    for (pool, dedup_key), count in sorted(held.items()):
        if count > 1:
            broken.append((pool, None, f"{count} pending events hold dedup key {dedup_key!r}"))
    return broken


def read_dedup_tally(txn: Txn, pools: dict[str, int]) -> DedupTally:
    """The dedup index and the pending events of ``pools`` (name -> concurrency), in ``txn``;
    a damaged event is passed over (it is never run), a damaged entry makes its pool
    uncertain."""
    tally = DedupTally()
    for pool in pools:
        for key, raw in DedupIndex(pool).entries(txn):
            try:
                tally.add_entry(pool, read_dedup(key, raw))
            except DamagedRecordError:
                tally.uncertain.add(pool)
        for index in used_instances(txn, pool):  # (one never used holds no event)
            namespace = Namespace(pool, index)
            for kind, key in namespace.iter_keys(txn):
                if kind is RecordKind.EVENT or kind is RecordKind.DELAYED:
                    tally.stored.add(key)
                    try:
                        event = namespace.get_event(txn, key)
                    except DamagedRecordError:
                        continue  # reported as damaged; it never runs
                    tally.add_event(pool, index, key, None if event is None else event.dedup_key)
    return tally


def index_violations(txn: Txn, pools: dict[str, int]) -> list[str]:
    """The alarm and work indexes against the metas of ``pools`` (name -> concurrency),
    in ``txn``, as lines naming the instance; entries of other pools are not judged. A
    damaged meta is passed over (its instance cannot run: reported as damaged)."""
    broken: list[str] = []
    alarms: dict[tuple[str, int], list[float]] = {}
    for key in alarm_index(txn):
        entry = parse_alarm_entry(key)
        if entry is None:
            broken.append(f"the alarm index holds {key!r}, which names no instance")
        elif entry[1] in pools:
            alarms.setdefault(entry[1:], []).append(entry[0])
    work: set[tuple[str, int]] = set()
    for key in work_index(txn):
        named = parse_work_entry(key)
        if named is None:
            broken.append(f"the work index holds {key!r}, which names no instance")
        elif named[0] in pools:
            work.add(named)
    for pool, concurrency in pools.items():
        # Those ever used, and those an entry names (one never used should have none).
        known = {i for p, i in [*alarms, *work] if p == pool}.union(used_instances(txn, pool))
        for index in sorted(i for i in known if i < concurrency):
            held = alarms.pop((pool, index), [])
            indexed = (pool, index) in work
            work.discard((pool, index))
            try:
                meta = Namespace(pool, index).load_meta(txn)
            except DamagedRecordError:
                continue
            if held != ([] if meta.alarm is None else [meta.alarm]):
                broken.append(
                    f"{pool}:{index}: alarm at {meta.alarm}, the alarm index holds {held}"
                )
            if meta.has_work != indexed:
                broken.append(
                    f"{pool}:{index}: {meta.pending} pending and {meta.outbox} in the outbox, "
                    f"the work index {'holds' if indexed else 'lacks'} it"
                )
    broken.extend(
        f"{p}:{i}: the alarm index holds {d}, for no instance" for (p, i), d in alarms.items()
    )
    broken.extend(f"{p}:{i}: the work index holds it, for no instance" for p, i in sorted(work))
    return broken


def dedup_violations(tally: DedupTally) -> list[str]:
    """:func:`broken_dedup` as lines naming the pool."""
    return [f"pool {pool}: {what}" for pool, _, what in broken_dedup(tally)]


# -- an instance's own storage (guarantee 6) ---------------------------------------------

#: The key under which a checking handler counts its attempts in its instance's storage:
#: only a success's writes commit, so the stored count is the instance's successes.
SUCCESS_COUNTER = "checked.successes"


def counter_violations(txn: Txn, pool: str, index: int, meta: Meta) -> list[str]:
    """Whether instance ``pool:index``'s stored counter (:data:`SUCCESS_COUNTER`, none
    stored: 0) is its meta's ``succeeded``, as a line naming both if not."""
    raw = StoredValues(Namespace(pool, index)).get(txn, SUCCESS_COUNTER)
    counted = 0 if raw is None else unpack(raw)
    if counted == meta.succeeded:
        return []
    return [
        f"{pool}:{index}: its handler's storage counts {counted!r} successes, "
        f"the meta {meta.succeeded}"
    ]
