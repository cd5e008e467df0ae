"""Verifying a store offline: every record's checksum and layout, and every instance's counters.

:func:`check_store` reads one snapshot and lists what is wrong; ``dopool
check`` prints it. Every committed transaction leaves the counters balanced,
so a snapshot taken beside a live runtime must balance too.

The walk over the records is this module's own (it reports damaged records and
stray keys too); the counter checks are :mod:`dopool._machine.invariants`', fed with the
keys it counts on the way, and so are the checks of the follow-up links between
instances, of one pool or two (:class:`~dopool._machine.invariants.LinkTally`). It also
checks that every follow-up in an outbox, and every source a delivery mark names,
is an instance of a stored pool. A producer's call record (``C``) names no pool: it is
read, and a damaged one reported, with nothing to check it against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dopool._cluster.units import units
from dopool._errors import DamagedRecordError
from dopool._machine.invariants import (
    DedupTally,
    KeyTally,
    LinkTally,
    broken_dedup,
    broken_invariants,
    broken_links,
    index_violations,
)
from dopool._machine.recurring import cron_problem
from dopool._machine.validation import check_pool_name
from dopool._store.layout import (
    FORMAT_VERSION,
    DedupIndex,
    Meta,
    OutboxRecord,
    RecordKind,
    bucket_expiry_at,
    dedup_name,
    delayed_key_due,
    expiry_key,
    fire_time,
    is_format_key,
    mark_source,
    open_sealed,
    parse_alarm_entry,
    parse_call_key,
    parse_dedup_key,
    parse_instance_key,
    parse_lease_key,
    parse_work_entry,
    pool_name_of,
    presence_owner,
    queue_key_sequence,
    rate_pool_of,
    read_bucket,
    read_bucket_expiry,
    read_call,
    read_dead,
    read_dedup,
    read_event,
    read_expiry,
    read_fire,
    read_format,
    read_lease,
    read_lifecycle,
    read_link,
    read_meta,
    read_outbox,
    read_pool,
    read_presence,
    read_rate,
    read_schedule,
    read_stored,
    unpack,
    valid_owner,
)
from dopool._store.txn import Txn


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a store: where (``instance`` ``"pool:index"``, or None) and what."""

    instance: str | None
    key: bytes | None
    what: str


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What :func:`check_store` found."""

    format_version: int | None
    records: int
    pools: dict[str, int]
    instances: int
    problems: list[Problem]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(slots=True)
class _Instance:
    """One instance's meta record, and what the keys of its namespace add up to."""

    meta: Meta | None = None
    meta_key: bytes | None = None
    keys: KeyTally = field(default_factory=KeyTally)
    follow_ups: list[tuple[bytes, OutboxRecord]] = field(default_factory=list)
    sources: list[tuple[bytes, tuple[str, int]]] = field(default_factory=list)  # its marks'
    schedules: dict[bytes, tuple[bytes, float | None]] = field(default_factory=dict)  # by name
    fires: list[tuple[float, bytes, bytes]] = field(default_factory=list)  # at, name, key
    # By sequence: each pending event's rank and due time (its keys' but the sequence),
    # and each index entry's key and the rank and due time it holds.
    events: dict[int, bytes] = field(default_factory=dict)
    entries: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    # Its partition keys' rate limit buckets: each one's key and time (None: damaged), by
    # name; and each expiry's time, the name it holds, and its key.
    buckets: dict[bytes, tuple[bytes, float | None]] = field(default_factory=dict)
    bucket_expiries: list[tuple[float, bytes, bytes]] = field(default_factory=list)


def check_store(txn: Txn) -> CheckReport:
    """Read every record of the store in ``txn`` and check it; see the module docstring."""
    problems: list[Problem] = []
    instances: dict[tuple[str, int], _Instance] = {}
    links = LinkTally()
    dedup = DedupTally()
    pools: dict[str, int] = {}
    version: int | None = None
    has_format = False
    records = 0
    leases: dict[tuple[str, int], bytes] = {}
    expiries: set[bytes] = set()  # the dedup expiry keys
    index_pools: dict[str, bytes] = {}  # each pool the indexes name: an entry's key
    rates: list[tuple[str, bytes]] = []  # each rate bucket's pool, and its key
    for key, value in txn.cursor():
        records += 1
        parsed = parse_instance_key(key)
        where = None if parsed is None else f"{parsed.pool}:{parsed.instance}"
        try:
            if parsed is not None:
                instance = instances.setdefault((parsed.pool, parsed.instance), _Instance())
                _check_instance_record(
                    where or "", instance, parsed.kind, key, value, links, dedup, problems
                )
            elif is_format_key(key):
                has_format = True
                version = read_format(key, value)
                if version != FORMAT_VERSION:
                    problems.append(Problem(None, key, f"format version {version} is not mine"))
            elif (indexed := parse_dedup_key(key)) is not None:
                if indexed.expiry:
                    expiries.add(key)
                _check_dedup_record(indexed.pool, indexed.expiry, key, value, dedup, problems)
            elif (leased := parse_lease_key(key)) is not None:
                leases[leased] = key
                _check_owner(read_lease(key, value).owner, key, problems)
            elif presence_owner(key) is not None:
                read_presence(key, value)
            elif (rated := rate_pool_of(key)) is not None:
                read_rate(key, value)
                rates.append((rated, key))
            elif parse_call_key(key) is not None:  # a producer's call: it names no pool
                read_call(key, value)
            elif (named := _index_entry_pool(key)) is not None:
                index_pools.setdefault(named, key)
                if value:  # an index entry's key is all of it
                    problems.append(Problem(None, key, "an index entry holds a value"))
            elif (name := pool_name_of(key)) is not None:
                _check_pool_name(name, key, problems)
                pools[name] = 0  # until read: a damaged record is reported as that alone
                pools[name] = read_pool(key, value).concurrency
            else:
                problems.append(Problem(None, key, "a key of no known kind"))
        except DamagedRecordError as exc:
            problems.append(Problem(where, key, f"damaged: {exc.reason}"))
            if where is not None:  # its links cannot be judged
                links.uncertain.add(where)
    if not has_format and records:
        problems.append(Problem(None, None, "no format record, though the store holds records"))
    problems.extend(
        Problem(None, key, f"a rate limit bucket of pool {pool!r}, which the store does not know")
        for pool, key in rates
        if pool not in pools
    )
    for (pool, index), instance in sorted(instances.items()):
        problems.extend(_check_instance(pool, index, instance, pools.get(pool)))
        problems.extend(_check_buckets(f"{pool}:{index}", instance))
        problems.extend(_check_addresses(f"{pool}:{index}", instance, pools))
    problems.extend(Problem(where, None, what) for where, what in broken_links(links))
    problems.extend(Problem(None, key, what) for _, key, what in broken_dedup(dedup))
    problems.extend(_unswept(dedup, expiries))
    problems.extend(
        Problem(None, None, f"dedup keys of pool {pool!r}, which has no pool record")
        for pool in sorted(dedup.entries.keys() - pools.keys())
    )
    problems.extend(
        Problem(None, key, f"lease unit {unit} of pool {pool!r}, which no pool record has")
        for (pool, unit), key in sorted(leases.items())
        # (a pool record found damaged, concurrency 0 here, is reported as that alone)
        if pool not in pools or 0 < units(pools[pool]) <= unit
    )
    known = {name: count for name, count in sorted(pools.items()) if count}
    problems.extend(Problem(None, None, what) for what in index_violations(txn, known))
    problems.extend(
        Problem(None, key, f"an index entry of pool {pool!r}, which has no pool record")
        for pool, key in sorted(index_pools.items())
        if pool not in pools
    )
    return CheckReport(version, records, known, len(instances), problems)


def _index_entry_pool(key: bytes) -> str | None:
    """The pool an alarm or work index entry names; None if ``key`` is neither."""
    alarm = parse_alarm_entry(key)
    if alarm is not None:
        return alarm[1]
    work = parse_work_entry(key)
    return None if work is None else work[0]


def _check_owner(owner: str, key: bytes, problems: list[Problem]) -> None:
    if not valid_owner(owner):
        problems.append(Problem(None, key, f"a lease naming no worker ({owner!r})"))


def _check_buckets(where: str, instance: _Instance) -> list[Problem]:
    """Each partition key's bucket has its expiry at its time, and each expiry a bucket
    at its (one left by a damaged bucket, rewritten since, is swept in time)."""
    problems = []
    expiries = {(name, tat) for tat, name, _ in instance.bucket_expiries}
    for name, (key, tat) in sorted(instance.buckets.items()):
        if tat is not None and (name, tat) not in expiries:
            problems.append(Problem(where, key, f"a rate limit bucket with no expiry at t={tat:g}"))
    for tat, name, key in instance.bucket_expiries:
        held = instance.buckets.get(name)
        if held is None or held[1] not in (tat, None):
            problems.append(Problem(where, key, f"a bucket expiry at t={tat:g} of no bucket then"))
    return problems


def _check_instance_record(
    where: str,
    instance: _Instance,
    kind: RecordKind,
    key: bytes,
    value: bytes,
    links: LinkTally,
    dedup: DedupTally,
    problems: list[Problem],
) -> None:
    """Count a record of an instance by its key, then read it (which may raise)."""
    instance.keys.add(kind, key)
    if kind is RecordKind.META:
        instance.meta_key = key
        instance.meta = read_meta(key, value)
        links.add_meta(where, instance.meta)
    elif kind is RecordKind.EVENT or kind is RecordKind.DELAYED:
        dedup.stored.add(key)  # damaged or not: an entry naming it names a stored event
        found = key[-20:-8] if kind is RecordKind.EVENT else key[-12:-8] + key[-20:-12]
        instance.events[queue_key_sequence(key)] = found
        if kind is RecordKind.DELAYED and not math.isfinite(due := delayed_key_due(key)):
            problems.append(Problem(where, key, f"a scheduled event due at {due!r}"))
        event = read_event(key, value)
        _payload(where, key, event.event, problems)
        pool, _, index = where.rpartition(":")
        dedup.add_event(pool, int(index), key, event.dedup_key)
    elif kind is RecordKind.DEAD_LETTER:
        read_dead(key, value)
    elif kind is RecordKind.OUTBOX:
        record = read_outbox(key, value)
        _payload(where, key, record.event, problems)
        instance.follow_ups.append((key, record))
        links.add_outbox(where, record)
    elif kind in _LIFECYCLE:
        read_lifecycle(kind, key, value)
        if kind is RecordKind.INDEX:  # it reads: one field, the 12 bytes
            instance.entries[queue_key_sequence(key)] = (key, unpack(open_sealed(key, value))[0])
    elif kind is RecordKind.SCHEDULE:
        name = key[key.index(b"\0") + 2 :]
        instance.schedules[name] = (key, None)  # counted even if damaged: reported so
        schedule = read_schedule(key, value)
        _payload(where, key, schedule.event, problems)
        instance.schedules[name] = (key, schedule.next_at)
        if schedule.cron is not None and (why := cron_problem(schedule.cron)) is not None:
            problems.append(Problem(where, key, f"a cron expression no definition takes: {why}"))
    elif kind is RecordKind.FIRE:
        at, name = fire_time(key[key.index(b"\0") + 2 :])
        instance.fires.append((at, name, key))
        read_fire(key, value)
    elif kind is RecordKind.BUCKET:
        name = key[key.index(b"\0") + 2 :]
        instance.buckets[name] = (key, None)  # counted even if damaged: reported so
        instance.buckets[name] = (key, read_bucket(key, value)[1])
    elif kind is RecordKind.BUCKET_EXPIRY:
        name = key[key.index(b"\0") + 2 + 8 :]
        instance.bucket_expiries.append((bucket_expiry_at(key), name, key))  # damaged too
        read_bucket_expiry(key, value)
    elif kind is RecordKind.STORED:
        stored = read_stored(key, value, key.index(b"\0") + 2)
        try:
            unpack(stored.value)
        except Exception as exc:
            problems.append(
                Problem(where, key, f"its value does not decode ({type(exc).__name__})")
            )
    else:
        source = mark_source(key)  # (a damaged event raised before it was counted)
        links.add_mark(where, source, read_link(key, value))
        instance.sources.append((key, source))


_LIFECYCLE = (RecordKind.INDEX, RecordKind.FINISHED, RecordKind.FORGET)


def _check_dedup_record(
    pool: str, expiry: bool, key: bytes, value: bytes, dedup: DedupTally, problems: list[Problem]
) -> None:
    """Read a dedup index entry or expiry key (which may raise); an entry under another
    key's name is a problem."""
    if expiry:
        read_expiry(key, value)
        return
    try:
        record = read_dedup(key, value)
    except DamagedRecordError:
        dedup.uncertain.add(pool)  # its events cannot be judged
        raise
    if key != DedupIndex(pool).entry_key(record.dedup_key):
        problems.append(Problem(None, key, f"dedup key {record.dedup_key!r} under another name"))
        return
    dedup.add_entry(pool, record)


def _unswept(dedup: DedupTally, expiries: set[bytes]) -> list[Problem]:
    """The finished entries without the expiry key of their finish: never swept, their
    key would be held until their time (a crafted one's may be far off) or for good."""
    unswept = []
    for pool, entries in sorted(dedup.entries.items()):
        for dedup_key, entry in sorted(entries.items()):
            finished = entry.finished_at
            name = dedup_name(dedup_key)
            if finished is not None and expiry_key(pool, finished, name) not in expiries:
                what = f"dedup key {dedup_key!r} finished at {finished!r} has no expiry key"
                unswept.append(Problem(None, DedupIndex(pool).entry_key(dedup_key), what))
    return unswept


def _check_pool_name(name: str, key: bytes, problems: list[Problem]) -> None:
    try:
        check_pool_name(name)
    except Exception:
        problems.append(Problem(None, key, f"pool record of an invalid name {name!r}"))


def _payload(where: str, key: bytes, event: bytes, problems: list[Problem]) -> None:
    """An event's payload that does not decode would be dead-lettered when it runs."""
    try:
        unpack(event)
    except Exception as exc:
        problems.append(Problem(where, key, f"its event does not decode ({type(exc).__name__})"))


def _check_instance(
    pool: str, index: int, found: _Instance, concurrency: int | None
) -> list[Problem]:
    where = f"{pool}:{index}"
    problems: list[Problem] = []

    def problem(what: str, key: bytes | None = None) -> None:
        problems.append(Problem(where, key, what))

    if concurrency is None:
        problem(f"pool {pool!r} has no pool record")
    elif concurrency and index >= concurrency and _holds_anything(found):
        # One that holds nothing is what a shrink leaves (define() refuses one that would
        # strand events): its lifetime counters, kept for the record.
        problem(f"instance beyond the pool's stored concurrency {concurrency}")
    meta = found.meta
    if meta is None:
        if found.meta_key is None and not found.keys.empty:
            problem("keys of an instance without a meta record")
        return problems  # or a damaged one, reported already
    for what in broken_invariants(found.keys.state(pool, index, meta)):
        problem(what, found.meta_key)
    for what, key in _broken_schedules(index, meta, found):
        problem(what, key)
    for sequence, (key, held) in sorted(found.entries.items()):
        if found.events.get(sequence, held) != held:  # (one with no event is counted stray)
            problem(f"the event index entry of event {sequence} names neither of its keys", key)
    return problems


def _broken_schedules(index: int, meta: Meta, found: _Instance) -> list[tuple[str, bytes | None]]:
    """The schedules' records and fire keys against each other and the meta: each fire key
    names a record with that next fire time, each record that fires has its fire key,
    ``schedules`` counts the records and ``next_fire`` is the first fire key's time."""
    broken: list[tuple[str, bytes | None]] = []
    if index and (found.schedules or found.fires):
        broken.append(("schedules outside instance 0", None))
    if meta.schedules != len(found.schedules):
        broken.append((f"{meta.schedules} schedules, {len(found.schedules)} records", None))
    first = min((at for at, _, _ in found.fires), default=None)
    if meta.next_fire != first:
        broken.append((f"next fire {meta.next_fire!r}, first fire key at {first!r}", None))
    fired = {(name, at) for at, name, _ in found.fires}
    for at, name, key in found.fires:
        stored = found.schedules.get(name)
        if stored is None or (stored[1] is not None and stored[1] != at):
            broken.append((f"a fire key at {at!r} of no schedule that fires then", key))
    for name, (key, next_at) in found.schedules.items():
        if next_at is not None and (name, next_at) not in fired:
            broken.append((f"a schedule without its fire key at {next_at!r}", key))
    return broken


def _holds_anything(found: _Instance) -> bool:
    """Whether an instance holds events, dead letters or follow-ups (or, its meta
    unreadable, may)."""
    meta = found.meta
    if meta is None or not found.keys.empty:
        return True
    return bool(meta.pending or meta.held_dead_letters or meta.outbox)


def _check_addresses(where: str, found: _Instance, pools: dict[str, int]) -> list[Problem]:
    """Each follow-up in the outbox goes to, and each mark names, an instance of a stored pool."""
    problems: list[Problem] = []
    named = [(key, (r.pool, r.target), "a follow-up for") for key, r in found.follow_ups]
    # A mark's source may be beyond its pool's concurrency: the pool shrank since.
    named += [(key, (source[0], -1), "a delivery mark of") for key, source in found.sources]
    for key, (pool, index), what in named:
        concurrency = pools.get(pool)
        if concurrency is None:
            problems.append(Problem(where, key, f"{what} pool {pool!r}, which has no pool record"))
        elif concurrency and index >= concurrency:  # 0: a damaged pool record, reported
            problems.append(
                Problem(where, key, f"{what} {pool}:{index}, beyond its concurrency {concurrency}")
            )
    return problems


def report_json(report: CheckReport) -> dict[str, Any]:
    """The report as plain JSON values (keys as their ``repr``)."""
    return {
        "ok": report.ok,
        "format_version": report.format_version,
        "records": report.records,
        "pools": report.pools,
        "instances": report.instances,
        "problems": [
            {
                "instance": problem.instance,
                "key": None if problem.key is None else repr(problem.key),
                "what": problem.what,
            }
            for problem in report.problems
        ],
    }
