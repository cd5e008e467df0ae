"""Which shard host serves which instances of which pool: the placement, and its record.

A deployment runs one shard host per node (:mod:`dopool._ray.host`), each serving the
store on its node's disk. Each pool's instances are split over the hosts in contiguous
ranges, as equal as they come (:func:`split`); pool ``k``'s first range goes to host
``k mod hosts``, so that small pools do not all land on the first host. A
:class:`Placement` is an immutable snapshot of that, with a version; producers route
with it (:mod:`dopool._ray.producer`) and hosts answer nil for an instance outside their
ranges, which sends the producer back to the record for a newer one.

**The record** is :class:`PlacementBook`, kept in a detached, named Ray actor (made in
:mod:`dopool._ray.deploy`). A detached actor outlives the driver that deployed, so
producers started later find it by name; it has one writer (``deploy``), so a version
never forks; and it is small (a few ranges a pool), so every producer reads it whole
when it connects and again only when a host answers nil or stops answering. Ray's GCS
keeps the actor's name, and restarts the actor (``max_restarts=-1``) if its process
dies: the placement is then made again from what deploy handed its constructor (one
version a deployment, in this first increment: no instance moves). A replicated record
would survive losing the GCS too, but the cluster does not run without its GCS anyway.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

#: A range of one pool's instances and the host serving it: ``(start, stop, host)``.
Range = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class HostPlace:
    """One shard host: its index in the deployment, the node it is pinned to, and the name
    of its Ray actor."""

    index: int
    node_id: str
    actor: str


@dataclass(frozen=True, slots=True)
class PoolPlace:
    """One pool's placement: its concurrency and its ranges, ascending and contiguous
    from instance 0 to ``concurrency``."""

    concurrency: int
    ranges: tuple[Range, ...]

    def host_of(self, index: int) -> int:
        """The host serving instance ``index`` (``0 <= index < concurrency``)."""
        starts = [start for start, _, _ in self.ranges]
        start, stop, host = self.ranges[bisect.bisect_right(starts, index) - 1]
        assert start <= index < stop, (index, self.ranges)
        return host


@dataclass(frozen=True, slots=True)
class Placement:
    """A deployment's placement at one version (see the module docstring)."""

    name: str
    version: int
    hosts: tuple[HostPlace, ...]
    pools: dict[str, PoolPlace]

    def host_of(self, pool: str, index: int) -> HostPlace:
        """The host serving instance ``index`` of ``pool``."""
        return self.hosts[self.pools[pool].host_of(index)]

    def served_by(self, host: int) -> dict[str, tuple[tuple[int, int], ...]]:
        """The ranges host ``host`` serves, by pool (every pool named, maybe with none)."""
        return {
            name: tuple((start, stop) for start, stop, owner in place.ranges if owner == host)
            for name, place in self.pools.items()
        }


def split(concurrency: int, hosts: int, first: int = 0) -> tuple[Range, ...]:
    """``0..concurrency-1`` in contiguous ranges over ``hosts`` hosts, the sizes differing
    by one at most; the first range to host ``first``, the next to the host after it. A
    pool of fewer instances than hosts leaves the last hosts none."""
    if concurrency < 1 or hosts < 1:
        raise ValueError(f"cannot split {concurrency} instances over {hosts} hosts")
    parts = min(concurrency, hosts)
    size, extra = divmod(concurrency, parts)
    ranges: list[Range] = []
    start = 0
    for part in range(parts):
        stop = start + size + (1 if part < extra else 0)
        ranges.append((start, stop, (first + part) % hosts))
        start = stop
    return tuple(ranges)


def place(
    name: str, version: int, hosts: tuple[HostPlace, ...], pools: dict[str, int]
) -> Placement:
    """Each pool of ``pools`` (name: concurrency, in the app's order) split over ``hosts``."""
    count = len(hosts)
    return Placement(
        name,
        version,
        hosts,
        {
            pool: PoolPlace(concurrency, split(concurrency, count, order % count))
            for order, (pool, concurrency) in enumerate(pools.items())
        },
    )


class PlacementBook:
    """The placement record's actor (see the module docstring): deploy makes it, hosts
    and producers read it. Made a Ray actor by :mod:`dopool._ray.deploy`."""

    def __init__(self, placement: Placement) -> None:
        self._placement = placement

    def read(self) -> Placement:
        return self._placement

    def served_by(self, host: int) -> dict[str, tuple[tuple[int, int], ...]]:
        """What host ``host`` serves at the current version."""
        return self._placement.served_by(host)
