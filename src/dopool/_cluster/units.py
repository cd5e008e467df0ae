"""Lease units: the ranges of a pool's instances that one lease covers.

A worker serves instances by holding their leases (:mod:`dopool._cluster.leases`), and
a lease per instance would make every renewal, routing table and reopen cost as much as
the pool is large. So a pool's instances ``0 .. concurrency-1`` are split into
``units(concurrency)`` contiguous ranges, at most :data:`LEASE_UNITS`, as even as they
go; lease ``u`` of the pool (``L <pool> \\0 <u:4>``, docs/store-format.md) names the
worker serving every instance of :func:`span` ``(u, concurrency)``. A pool of up to
:data:`LEASE_UNITS` instances has one unit per instance, unit ``i`` being instance
``i``: the layout every store had before pools could grow larger.
"""

from __future__ import annotations

#: The most lease units of a pool: its renewals, routing tables and reopen cost are
#: bounded by it, whatever the number of instances (docs/deployment.md, "Leases").
LEASE_UNITS = 4096


def units(concurrency: int) -> int:
    """How many lease units a pool of ``concurrency`` instances has."""
    return min(concurrency, LEASE_UNITS)


def first(unit: int, concurrency: int) -> int:
    """The first instance of ``unit``."""
    return unit * concurrency // units(concurrency)


def span(unit: int, concurrency: int) -> range:
    """The instances ``unit`` covers (``units(concurrency)`` ranges, without gaps)."""
    return range(first(unit, concurrency), first(unit + 1, concurrency))


def named(unit: int, concurrency: int) -> str:
    """The instances ``unit`` covers, as logs and ``dopool status`` name its lease: ``"7"``,
    or ``"0-243"`` (unit 0 of a pool of a million)."""
    covered = span(unit, concurrency)
    return str(covered.start) if len(covered) == 1 else f"{covered.start}-{covered.stop - 1}"


def unit_of(index: int, concurrency: int) -> int:
    """The unit whose span holds instance ``index``: the last whose first instance is at
    or before it (``first(u) <= index`` exactly when ``u * concurrency < (index + 1) *
    units``)."""
    return ((index + 1) * units(concurrency) - 1) // concurrency
