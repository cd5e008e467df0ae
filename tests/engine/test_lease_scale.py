"""Shared workers on a pool of thousands of instances, at the default lease ttl.

Real ``dopool worker`` processes (``_worker_app:app`` with 4,096 instances). A renewal
used to start each instance it took, and wait for its recovery, before the next renewal
could run: with thousands of instances the renewals came after the ttl, and two workers
took each other's leases over, back and forth, for minutes. Here a second worker joins,
then a third, then the first leaves: each time the instances settle into a fair split
within three of the joining worker's renewals (counted from its debug log), every
instance's event runs, and no lease is ever taken over or lost.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dopool
from dopool._store.layout import LeaseRecord, Namespace, all_leases
from worker_support import Evidence, Worker, until, workers

INSTANCES = 4096
RENEWED = re.compile(r"renewed (\d+) leases: (\d+) taken, (\d+) lost, (\d+) to release")

pytestmark = [pytest.mark.slow]


@pytest.fixture
def worker() -> Iterator[Callable[..., Worker]]:
    yield from workers()


def _leases(store: Path) -> dict[int, LeaseRecord]:
    with dopool.connect(store) as connection, connection.reading("jobs") as txn:
        return {index: record for _, index, record in all_leases(txn)}


def _split(store: Path) -> Counter[int]:
    """How many instances each worker pid holds."""
    return Counter(record.pid for record in _leases(store).values())


def _renewals(log: Path) -> list[tuple[int, int, int, int]]:
    """A worker's renewals, from its debug log: (held, taken, lost, to release) each."""
    return [(int(m[1]), int(m[2]), int(m[3]), int(m[4])) for m in RENEWED.finditer(log.read_text())]


def _settled(store: Path, pids: list[int]) -> bool:
    shares = sorted(_split(store).values())
    base, extra = divmod(INSTANCES, len(pids))
    return set(_split(store)) == set(pids) and shares == sorted(
        [base + 1] * extra + [base] * (len(pids) - extra)
    )


def _run_one_event_per_instance(store: Path, evidence: Evidence, expected: int) -> None:
    """Enqueue one event into every instance (round-robin) and wait for them all to end."""
    with dopool.connect(store, durability="async") as connection:
        pool = connection.pool("jobs")
        results = pool.enqueue_many([{"p": expected, "k": n} for n in range(INSTANCES)])
        assert {result.instance_index for result in results} == set(range(INSTANCES))
    evidence.wait(
        lambda lines: (
            sum(1 for line in lines if line["e"] == "end" and line["p"] == expected) == INSTANCES
        ),
        f"the {INSTANCES} events of round {expected}",
    )


def test_workers_on_thousands_of_instances_settle_fairly_and_run_every_event(
    store_path: Path, tmp_path: Path, worker: Callable[..., Worker]
) -> None:
    evidence = Evidence()
    logs = [tmp_path / f"worker-{n}.log" for n in range(3)]

    def start(n: int) -> Worker:
        return worker(
            store_path, evidence, "--log-level", "debug", concurrency=INSTANCES, log=logs[n]
        ).ready()

    try:
        first = start(0)
        second = start(1)
        until(lambda: _settled(store_path, [first.proc.pid, second.proc.pid]), "a 2,048 split")
        half = INSTANCES // 2
        assert half in [held for held, *_ in _renewals(logs[1])[:3]]
        _run_one_event_per_instance(store_path, evidence, 0)

        third = start(2)
        pids = [first.proc.pid, second.proc.pid, third.proc.pid]
        until(lambda: _settled(store_path, pids), "a three-way split")
        share = _split(store_path)[third.proc.pid]  # 1,365 or 1,366: the pool's hash says
        assert share in [held for held, *_ in _renewals(logs[2])[:3]]
        _run_one_event_per_instance(store_path, evidence, 1)

        assert first.stop() == 0  # hands its instances over as it leaves
        until(lambda: _settled(store_path, pids[1:]), "a 2,048 split again")
        _run_one_event_per_instance(store_path, evidence, 2)

        # Nothing was ever taken over after an expiry, nor lost: every lease is of epoch
        # 1 (a lease released or left is deleted, and taken anew), and no restart counted.
        assert {record.epoch for record in _leases(store_path).values()} == {1}
        with dopool.connect(store_path) as connection, connection.reading("jobs") as txn:
            restarts = {Namespace("jobs", i).load_meta(txn).restarts for i in range(INSTANCES)}
        assert restarts == {0}
        for log in logs:
            text = log.read_text()
            assert "taken over" not in text
            assert "renewing the leases failed" not in text
            assert all(lost == 0 for _, _, lost, _ in _renewals(log))
    finally:
        evidence.close()
