"""Leases, sans I/O: ``LeaseBook`` on a real store with a fake wall clock (the ``now``
each renewal is given), so expiry is a number, never a wait (``dopool._cluster.leases``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dopool._cluster.leases import (
    LeaseBook,
    Renewal,
    Worker,
    check_lease_ttl,
    fair_share,
    lease_owner,
    new_owner_id,
)
from dopool._cluster.units import LEASE_UNITS, span
from dopool._errors import ConfigurationError, DamagedRecordError
from dopool._store.environment import Store
from dopool._store.layout import (
    LeaseRecord,
    PresenceRecord,
    all_leases,
    all_presences,
    get_lease,
    lease_key,
    pack,
    put_lease,
    seal,
)

TTL = 10.0
T0 = 1_800_000_000.0  # a wall-clock time, in epoch seconds


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "store")
    with opened.write() as txn:  # a lease's owner is found through its pool's units
        opened.put_pool(txn, "jobs", 4)
    yield opened
    opened.close()


def _book(name: str, *, exclusive: bool = False, pools: dict[str, int] | None = None) -> LeaseBook:
    book = LeaseBook(Worker(f"host-1-{name}", 100, "host"), TTL, exclusive=exclusive)
    for pool, concurrency in (pools or {"jobs": 4}).items():
        book.add_pool(pool, concurrency)
    return book


def _leases(store: Store) -> dict[tuple[str, int], LeaseRecord]:
    with store.read() as txn:
        return {(pool, index): record for pool, index, record in all_leases(txn)}


def _renew(store: Store, book: LeaseBook, now: float) -> Renewal:
    with store.write() as txn:
        return book.renew(txn, now)


def _release(store: Store, book: LeaseBook, where: list[tuple[str, int]]) -> None:
    with store.write() as txn:
        for pool, index in where:
            book.release(txn, pool, index)


def test_a_worker_alone_takes_every_lease_and_its_renewal_extends_them(store: Store) -> None:
    a = _book("a")
    renewal = _renew(store, a, T0)
    assert [(t.pool, t.unit, t.epoch, t.expired) for t in renewal.taken] == [
        ("jobs", i, 1, False) for i in range(4)
    ]
    leases = _leases(store)
    assert {r.owner for r in leases.values()} == {"host-1-a"}
    assert {r.expires_at for r in leases.values()} == {T0 + TTL}
    again = _renew(store, a, T0 + 3)
    assert again.taken == []
    assert again.lost == again.release == []
    assert {r.expires_at for r in _leases(store).values()} == {T0 + 3 + TTL}
    assert {r.epoch for r in _leases(store).values()} == {1}
    with store.read() as txn:
        assert [(o, p.expires_at) for o, p in all_presences(txn)] == [("host-1-a", T0 + 3 + TTL)]
        assert lease_owner(txn, "jobs", 2) == "host-1-a"
        assert lease_owner(txn, "jobs", 9) is None


def test_a_second_worker_gets_its_fair_share_once_the_first_releases_its_excess(
    store: Store,
) -> None:
    a, b = _book("a"), _book("b")
    _renew(store, a, T0)
    assert _renew(store, b, T0 + 1).taken == []  # every lease live: nothing free yet
    renewal = _renew(store, a, T0 + 2)  # two live workers: a's fair share is 2 of 4
    assert renewal.live == 2
    assert renewal.release == [("jobs", 2), ("jobs", 3)]
    assert _renew(store, a, T0 + 2.5).release == []  # named once, until released
    _release(store, a, renewal.release)
    assert sorted(a.held) == [("jobs", 0), ("jobs", 1)]
    taken = _renew(store, b, T0 + 3).taken
    assert [(t.unit, t.epoch, t.expired) for t in taken] == [(2, 1, False), (3, 1, False)]
    owners = {index: r.owner for (_, index), r in _leases(store).items()}
    assert owners == {0: "host-1-a", 1: "host-1-a", 2: "host-1-b", 3: "host-1-b"}
    # 3 instances, 2 live workers (a's and b's presences expired): shares of 2 and 1.
    c = _book("c", pools={"odd": 3})
    d = _book("d", pools={"odd": 3})
    _renew(store, c, T0 + 100)
    _renew(store, d, T0 + 100)
    share = fair_share("odd", 3, 2, sorted(["host-1-c", "host-1-d"]).index("host-1-c"))
    assert _renew(store, c, T0 + 101).release == [("odd", i) for i in range(share, 3)]


def _settle(store: Store, books: list[LeaseBook], now: float) -> float:
    """Renew each book in turn, releasing what it names, until nothing changes."""
    for _ in range(10):
        changed = False
        for book in books:
            renewal = _renew(store, book, now)
            _release(store, book, renewal.release)
            changed = changed or bool(renewal.taken or renewal.release)
            now += 0.1
        if not changed:
            return now
    raise AssertionError("the leases did not settle in 10 rounds")


def test_three_workers_split_four_instances_two_one_one_and_the_extras_spread_over_pools(
    store: Store,
) -> None:
    pools = {f"p{n}": 4 for n in range(6)}
    books = [_book(name, pools=pools) for name in "abc"]
    _settle(store, books, T0)
    leases = _leases(store)
    for pool in pools:  # every instance served, each worker 1 or 2 of it
        served = [
            sum(1 for (p, _), r in leases.items() if p == pool and r.owner == b.worker.owner)
            for b in books
        ]
        assert sorted(served) == [1, 1, 2], (pool, served)
    # Over six pools, each worker serves 8 instances: the extra one turns with the pool.
    assert [len(book.held) for book in books] == [8, 8, 8]


@pytest.mark.parametrize("concurrency", [1, 2, 3, 4, 5, 7, 16])
@pytest.mark.parametrize("live", [1, 2, 3, 5])
def test_fair_shares_add_up_to_the_pool_and_differ_by_one_at_most(
    concurrency: int, live: int
) -> None:
    for pool in ("jobs", "mail", "x"):
        shares = [fair_share(pool, concurrency, live, rank) for rank in range(live)]
        assert sum(shares) == concurrency
        assert max(shares) - min(shares) <= 1


def test_an_expired_lease_is_taken_over_with_the_next_epoch_and_the_old_holder_loses_it(
    store: Store,
) -> None:
    a, b = _book("a"), _book("b")
    _renew(store, a, T0)
    assert _renew(store, b, T0 + TTL - 0.5).taken == []  # not expired yet
    later = T0 + TTL + 0.5  # a stopped renewing (hung, or dead): its presence expired too
    renewal = _renew(store, b, later)
    assert renewal.live == 1
    assert [(t.unit, t.epoch, t.expired) for t in renewal.taken] == [(i, 2, True) for i in range(4)]
    with store.read() as txn:
        assert not a.holds(txn, "jobs", 0)  # the fencing check refuses a now
        assert b.holds(txn, "jobs", 0)
        assert [owner for owner, _ in all_presences(txn)] == ["host-1-b"]
    lost = _renew(store, a, later + 1)
    assert lost.lost == [("jobs", i) for i in range(4)]
    assert lost.taken == []  # b's leases are live: a's fair share is 2, but none is free
    assert a.held == {}
    assert {r.owner for r in _leases(store).values()} == {"host-1-b"}


def test_an_expired_lease_nobody_took_is_still_its_holders(store: Store) -> None:
    a = _book("a")
    _renew(store, a, T0)
    renewal = _renew(store, a, T0 + 5 * TTL)  # hung a long while, nobody came
    assert renewal.lost == []
    assert renewal.taken == []
    assert {r.epoch for r in _leases(store).values()} == {1}
    assert {r.expires_at for r in _leases(store).values()} == {T0 + 6 * TTL}


def test_leaving_deletes_the_leases_and_the_presence_but_those_kept(store: Store) -> None:
    a, b = _book("a"), _book("b")
    _renew(store, a, T0)
    with store.write() as txn:
        a.leave(txn, keep=[("jobs", 3)])
    assert list(_leases(store)) == [("jobs", 3)]  # left to expire
    with store.read() as txn:
        assert list(all_presences(txn)) == []
    taken = _renew(store, b, T0 + 1).taken  # the free ones at once, no expiry waited
    assert [(t.unit, t.expired) for t in taken] == [(0, False), (1, False), (2, False)]


def test_a_release_deletes_only_a_lease_still_its_own(store: Store) -> None:
    a = _book("a")
    _renew(store, a, T0)
    with store.write() as txn:
        put_lease(txn, "jobs", 1, LeaseRecord("other", 7, "h", 5, T0 + 100))
        a.release(txn, "jobs", 1)
        a.release(txn, "jobs", 0)
        assert get_lease(txn, "jobs", 1) == LeaseRecord("other", 7, "h", 5, T0 + 100)
        assert get_lease(txn, "jobs", 0) is None


def test_an_exclusive_runtime_takes_every_lease_whoever_holds_it(store: Store) -> None:
    a = _book("a")
    _renew(store, a, T0)
    x = _book("x", exclusive=True)
    renewal = _renew(store, x, T0 + 1)  # a's leases live, a's presence too
    assert renewal.live == 2
    assert [(t.unit, t.epoch, t.expired) for t in renewal.taken] == [
        (i, 2, False) for i in range(4)
    ]
    assert {r.owner for r in _leases(store).values()} == {"host-1-x"}


def test_a_worker_counts_only_live_presences(store: Store) -> None:
    a, b, c = _book("a"), _book("b"), _book("c")
    _renew(store, b, T0)
    _renew(store, c, T0)
    assert _renew(store, a, T0 + 1).live == 3
    assert _renew(store, a, T0 + TTL + 1).live == 1  # b's and c's presences expired


def test_lease_ttls_and_owner_ids() -> None:
    assert check_lease_ttl(2) == 2.0
    for bad in (0, -1, True, "10", float("nan"), 1e9):
        with pytest.raises(ConfigurationError, match="lease_ttl"):
            check_lease_ttl(bad)
    first, second = new_owner_id(), new_owner_id()
    assert first != second  # unique per call, so per process
    assert " " not in first


def test_a_damaged_lease_is_reported_and_wakes_nobody(store: Store) -> None:
    with store.write() as txn:
        put_lease(txn, "jobs", 0, LeaseRecord("w", 1, "h", 1, T0))
        txn.put(lease_key("jobs", 1), b"\0\0\0\0junk")
    with store.read() as txn:
        assert lease_owner(txn, "jobs", 0) == "w"
        assert lease_owner(txn, "jobs", 1) is None
        with pytest.raises(DamagedRecordError, match="lease of unit 1 of pool jobs"):
            get_lease(txn, "jobs", 1)
    with store.write() as txn:
        txn.put(lease_key("jobs", 1), seal(lease_key("jobs", 1), pack(["w", -1, "h", 1, T0])))
    with store.read() as txn, pytest.raises(DamagedRecordError, match="pid"):
        get_lease(txn, "jobs", 1)
    assert PresenceRecord(1, "h", T0).expires_at == T0


@pytest.mark.parametrize("exclusive", [False, True], ids=["shared", "exclusive"])
def test_a_damaged_lease_is_taken_as_an_expired_one_not_a_failed_renewal(
    store: Store, exclusive: bool
) -> None:
    """Who holds it is unknown, and its bytes are nobody's any more (the holder's
    fencing check refuses it already): it is taken over at once, named in the renewal,
    and the holder loses it, instead of every worker's renewal failing for good."""
    a, b = _book("a", pools={"jobs": 2}), _book("b", exclusive=exclusive, pools={"jobs": 2})
    _renew(store, a, T0)
    with store.write() as txn:
        txn.put(lease_key("jobs", 1), b"\0\0\0\0junk")
        a.leave(txn, keep=[("jobs", 1)])  # a's presence goes: b alone is live
    renewal = _renew(store, b, T0 + 1)
    assert [(t.unit, t.epoch, t.expired) for t in renewal.taken] == [
        (0, 1, False),
        (1, 1, not exclusive),
    ]
    assert [error.key for error in renewal.damaged] == [lease_key("jobs", 1)]
    assert {index: r.owner for (_, index), r in _leases(store).items()} == {
        0: "host-1-b",
        1: "host-1-b",
    }
    assert _renew(store, a, T0 + 2).lost == [("jobs", 1)]


def test_a_damaged_presence_is_deleted_at_a_renewal_and_counts_for_nobody(
    store: Store,
) -> None:
    a = _book("a", pools={"jobs": 2})
    with store.write() as txn:
        txn.put(b"Whost-2-b", b"\0\0\0\0junk")  # a worker's, damaged
        txn.put(b"W two words", seal(b"W two words", pack([1, "h", T0 + 60])))  # nobody's
    renewal = _renew(store, a, T0)
    assert renewal.live == 1
    assert sorted(error.key for error in renewal.damaged) == [b"W two words", b"Whost-2-b"]
    assert len(renewal.taken) == 2
    with store.read() as txn:
        assert [owner for owner, _ in all_presences(txn)] == ["host-1-a"]
    assert _renew(store, a, T0 + 1).damaged == []


def test_an_instance_still_stopping_here_is_not_taken_again(store: Store) -> None:
    a = _book("a")
    with store.write() as txn:
        taken = a.renew(txn, T0, busy=frozenset({("jobs", 1)}))
    assert [t.unit for t in taken.taken] == [0, 2, 3]
    assert [t.unit for t in _renew(store, a, T0 + 1).taken] == [1]  # once it has stopped


def test_a_large_pool_is_leased_by_units_and_fenced_by_its_instances_unit(store: Store) -> None:
    concurrency = 10_000  # 4,096 units of 2 or 3 instances
    with store.write() as txn:
        store.put_pool(txn, "big", concurrency)
    a, b = _book("a", pools={"big": concurrency}), _book("b", pools={"big": concurrency})
    renewal = _renew(store, a, T0)
    assert len(renewal.taken) == LEASE_UNITS == len(_leases(store))
    with store.read() as txn:
        assert a.holds(txn, "big", concurrency - 1)
        assert lease_owner(txn, "big", concurrency - 1) == "host-1-a"
        assert lease_owner(txn, "big", concurrency) is None  # no such instance
    # b takes half the units once a has released its excess; an instance then belongs to
    # whoever holds its unit, and a's transactions for it are refused.
    assert _renew(store, b, T0 + 1).taken == []
    release = _renew(store, a, T0 + 2).release
    assert len(release) == LEASE_UNITS // 2
    _release(store, a, release)
    taken = _renew(store, b, T0 + 3).taken
    assert sorted(t.unit for t in taken) == sorted(unit for _, unit in release)
    moved = span(taken[0].unit, concurrency)
    kept = span(next(u for _, u in a.held if u not in moved), concurrency)
    with store.read() as txn:
        for index in moved:
            assert b.holds(txn, "big", index)
            assert not a.holds(txn, "big", index)
            assert lease_owner(txn, "big", index) == "host-1-b"
        assert a.holds(txn, "big", kept.start)
        assert not b.holds(txn, "big", kept.start)
