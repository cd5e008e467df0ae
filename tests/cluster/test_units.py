"""Lease units: a pool's instances split into at most 4,096 contiguous ranges, each one
lease's (``dopool._cluster.units``), and a routing table kept per unit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dopool._cluster.routing import RoutingTable
from dopool._cluster.units import LEASE_UNITS, first, named, span, unit_of, units


def test_a_pool_up_to_the_limit_has_one_unit_per_instance() -> None:
    for concurrency in (1, 3, LEASE_UNITS):
        assert units(concurrency) == concurrency
        assert [span(u, concurrency) for u in range(concurrency)] == [
            range(u, u + 1) for u in range(concurrency)
        ]
        assert [unit_of(i, concurrency) for i in range(concurrency)] == list(range(concurrency))


@given(st.integers(1, 2**32))
def test_the_units_cover_the_pool_in_order_without_gaps_and_as_even_as_they_go(
    concurrency: int,
) -> None:
    count = units(concurrency)
    assert count == min(concurrency, LEASE_UNITS)
    assert first(0, concurrency) == 0
    assert first(count, concurrency) == concurrency
    sizes = {len(span(u, concurrency)) for u in (0, count // 2, count - 1)}
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1


@given(st.integers(1, 2**32).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_an_instance_is_in_its_units_span(case: tuple[int, int]) -> None:
    concurrency, index = case
    unit = unit_of(index, concurrency)
    assert 0 <= unit < units(concurrency)
    assert index in span(unit, concurrency)


def test_a_routing_table_is_as_large_as_the_units_whatever_the_pool() -> None:
    table = RoutingTable.local(10**6)
    assert len(table.here) == len(table.owners) == LEASE_UNITS
    assert table.serves(0)
    assert table.serves(10**6 - 1)
    unit = unit_of(500_000, 10**6)
    owners = tuple("w2" if u == unit else None for u in range(LEASE_UNITS))
    served = RoutingTable(10**6, frozenset(range(LEASE_UNITS)) - {unit}, owners)
    covered = span(unit, 10**6)
    assert len(covered) in (244, 245)  # 10**6 / 4,096, rounded down or up
    assert not served.serves(covered.start)
    assert not served.serves(covered.stop - 1)
    assert served.serves(covered.start - 1)
    assert served.serves(covered.stop)
    assert served.owner(covered.stop - 1) == "w2"
    assert served.owner(covered.stop) is None
    assert RoutingTable.elsewhere(10**6).serves(0) is False


def test_a_unit_is_named_by_the_instances_it_covers() -> None:
    assert [named(u, 3) for u in range(3)] == ["0", "1", "2"]
    assert named(0, 10**6) == "0-243"
    assert named(LEASE_UNITS - 1, 10**6) == "999755-999999"
