"""Several ``dopool worker`` processes on one store, with leases, and producers beside them.

Real processes: two workers (``_worker_app:app``, 4 instances, a short ``--lease-ttl``)
and four producers (``_connect_child.py produce``). The workers' handlers and
subscribers write what they did, with their pid, to a pipe (``worker_support.Evidence``);
the tests wait on it and on the store, with timeouts, never on time. What they check is
docs/deployment.md's "Several workers": a fair split, a takeover after a SIGKILL once
the lease expired (recovered as after a crash), a hung worker (SIGSTOP) fenced off, a
graceful handover with no expiry waited for, and ``dopool status``'s lease column.
"""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dopool
from cli_support import invoke
from dopool._cluster.routing import Router
from dopool._store.layout import LeaseRecord, Namespace, all_leases
from worker_support import Evidence, Worker, acknowledged, produce, until

# Real processes and real time: run on CI's first Python only (.ci/run).
pytestmark = pytest.mark.slow

TTL = 1.5  # seconds; renewed every 0.5 s
RERUN = 2.0  # seconds a rerun of the hung worker's attempt takes, in the other worker
WORKER_ARGS = ("--lease-ttl", str(TTL), "--poll-interval", "0.1", "--grace", "10")


def leases(store: Path) -> dict[int, LeaseRecord]:
    with dopool.connect(store) as connection, connection.reading("jobs") as txn:
        return {index: record for _, index, record in all_leases(txn)}


def served_by(store: Path) -> dict[int, int]:
    """Each leased instance's worker pid."""
    return {index: record.pid for index, record in leases(store).items()}


def status(store: Path) -> dopool.PoolStatus:
    with dopool.connect(store) as connection:
        return connection.pool("jobs").status()


def restarts(store: Path) -> list[int]:
    with dopool.connect(store) as connection, connection.reading("jobs") as txn:
        return [Namespace("jobs", index).load_meta(txn).restarts for index in range(4)]


def two_workers(store: Path, evidence: Evidence, worker: Callable[..., Worker]) -> list[Worker]:
    """Two shared workers, started one after the other, once they have split the instances."""
    first = worker(store, evidence, *WORKER_ARGS, concurrency=4, work=0.004).ready()
    second = worker(store, evidence, *WORKER_ARGS, concurrency=4, work=0.004).ready()
    pids = {first.proc.pid, second.proc.pid}
    until(
        lambda: sorted(served_by(store).values()) == sorted([*pids, *pids]),
        "the two workers holding two instances each",
    )
    return [first, second]


def _ends(lines: list[dict[str, Any]]) -> dict[tuple[int, int], list[int]]:
    """(producer, k) -> the pids whose handler returned for that event, in order."""
    ended: dict[tuple[int, int], list[int]] = defaultdict(list)
    for line in lines:
        if line["e"] == "end" and line.get("p") is not None:
            ended[(line["p"], line["k"])].append(line["pid"])
    return ended


def test_four_producers_two_workers_one_killed_the_other_takes_its_instances_over(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    victim, survivor = two_workers(store_path, evidence, worker)
    killed_on = {i for i, pid in served_by(store_path).items() if pid == victim.proc.pid}
    producers = [produce(store_path, producer, 150) for producer in range(4)]
    evidence.wait(
        lambda lines: (
            sum(line["e"] == "end" and line["pid"] == victim.proc.pid for line in lines) >= 20
        ),
        "the victim at work",
    )
    victim.kill()  # SIGKILL mid-run: its leases are left to expire
    acked = [event for proc in producers for event in acknowledged(proc)]
    assert len(acked) == 600
    until(lambda: status(store_path).succeeded == 600, "every acknowledged event succeeded")
    done = status(store_path)
    assert (done.pending, done.dead_lettered, done.enqueued) == (0, 0, 600)
    assert set(served_by(store_path).values()) == {survivor.proc.pid}  # took them over
    sockets = store_path / "wake"
    assert list(sockets.glob(f"*-{survivor.proc.pid}-*.sock"))
    until(  # the dead worker's wake-up socket removed with its presence
        lambda: not list(sockets.glob(f"*-{victim.proc.pid}-*.sock")), "the victim's socket gone"
    )
    # Each taken over after its lease expired: recovered as after a crash, a restart.
    assert [count for index, count in enumerate(restarts(store_path)) if index in killed_on] == [
        1,
        1,
    ]
    lines = evidence.snapshot()
    ended = _ends(lines)
    assert {(event["p"], event["k"]) for event in acked} <= ended.keys()  # none lost
    # At least once: only an attempt the kill interrupted ran again, by the survivor
    # (at most one per instance the victim served).
    again = {key: pids for key, pids in ended.items() if len(pids) > 1}
    assert len(again) <= len(killed_on)
    for pids in again.values():
        assert pids[-1] == survivor.proc.pid
    # Per-instance (so per-partition) order: sequences first succeed in increasing order.
    first_end: dict[int, list[int]] = defaultdict(list)
    seen: set[tuple[int, int]] = set()
    for line in lines:
        if line["e"] == "end" and (line["index"], line["sequence"]) not in seen:
            seen.add((line["index"], line["sequence"]))
            first_end[line["index"]].append(line["sequence"])
    for index, sequences in first_end.items():
        assert sequences == sorted(sequences), f"instance {index} ran out of order"
    assert survivor.stop() == 0
    assert leases(store_path) == {}  # a graceful stop deletes its leases
    assert invoke("check", str(store_path)).exit_code == 0


def test_a_hung_worker_is_fenced_off_and_commits_nothing_after_it_wakes(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    hung, other = two_workers(store_path, evidence, worker)
    hung_serves = {i for i, pid in served_by(store_path).items() if pid == hung.proc.pid}
    router = Router(4)  # the partition keys that route to each of hung's instances
    keys = {router.choose(f"g{k}"): f"g{k}" for k in reversed(range(100))}
    with dopool.connect(store_path) as connection:  # one gated event on each of hung's
        pool = connection.pool("jobs")
        gated = {index: index for index in hung_serves}  # instance -> k
        for index in hung_serves:
            event = {"gate_first": True, "rerun_seconds": RERUN, "p": 8, "k": index}
            pool.enqueue(event, partition_key=keys[index])
    hung_pid, other_pid = hung.proc.pid, other.proc.pid

    def started_by(pid: int, lines: list[dict[str, Any]]) -> set[int]:
        return {
            line["k"]
            for line in lines
            if line["e"] == "start" and line["pid"] == pid and line["p"] == 8
        }

    hung_gated = set(gated.values())
    evidence.wait(lambda lines: started_by(hung_pid, lines) >= hung_gated, "hung's attempts")
    hung.signal(signal.SIGSTOP)  # hangs inside its handlers: renews nothing
    until(
        lambda: set(served_by(store_path).values()) == {other_pid},
        "the other worker taking the hung one's expired leases over",
    )
    # The other worker's recovery counted the hung attempts as interrupted: it runs them
    # again (each rerun takes RERUN seconds). Meanwhile the hung one wakes, and its
    # handlers return: their outcomes, which the store would take (their events are
    # still current), are fenced off.
    evidence.wait(lambda lines: started_by(other_pid, lines) >= set(gated.values()), "reruns")
    evidence.mark("continued")
    hung.signal(signal.SIGCONT)
    evidence.release(len(hung_gated))
    evidence.wait(
        lambda lines: (
            sum(line["e"] == "end" and line["pid"] == hung_pid and line["p"] == 8 for line in lines)
            == len(hung_gated)
        ),
        "the hung handlers returning",
    )
    assert hung.stop() == 0
    until(lambda: status(store_path).succeeded == len(gated), "the reruns' successes")
    lines = evidence.snapshot()
    after = lines[next(i for i, line in enumerate(lines) if line.get("what") == "continued") :]
    # Nothing it did after it woke committed: no pool event but its fenced instances' crash.
    from_hung = [line for line in after if line["e"] == "pool" and line["pid"] == hung_pid]
    assert [line["kind"] for line in from_hung] == ["crashed"] * len(hung_gated)
    done = status(store_path)
    assert (done.succeeded, done.pending, done.enqueued) == (len(gated), 0, len(gated))
    assert set(served_by(store_path).values()) == {other_pid}
    assert other.stop() == 0
    assert invoke("check", str(store_path)).exit_code == 0


def test_a_graceful_stop_hands_over_at_once_and_status_shows_the_owners(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    leaving, staying = two_workers(store_path, evidence, worker)
    shown = invoke("status", str(store_path), "--json")
    assert shown.exit_code == 0
    (pool,) = json.loads(shown.stdout)["pools"]
    pids = sorted(lease["pid"] for lease in pool["leases"].values())
    assert pids == sorted([leaving.proc.pid, staying.proc.pid] * 2)
    assert all(0 < lease["expires_in"] <= TTL for lease in pool["leases"].values())
    text = invoke("status", str(store_path)).stdout
    assert f"{staying.proc.pid}@" in text
    assert leaving.stop() == 0  # deletes its leases: no expiry to wait for
    until(
        lambda: (
            set(served_by(store_path).values()) == {staying.proc.pid}
            and len(served_by(store_path)) == 4
        ),
        "the staying worker taking every instance",
    )
    assert {record.epoch for record in leases(store_path).values()} == {1}
    assert restarts(store_path) == [0, 0, 0, 0]  # released, not expired: no restart
    assert staying.stop() == 0


def test_a_second_worker_whose_app_defines_schedules_starts_beside_the_first(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    """The second worker's app defines the schedule while the first serves instance 0: the
    definition is made in the store (the same one: nothing changes), not refused."""
    first = worker(store_path, evidence, *WORKER_ARGS, app="scheduled", concurrency=4).ready()
    second = worker(store_path, evidence, *WORKER_ARGS, app="scheduled", concurrency=4).ready()
    until(lambda: len(set(served_by(store_path).values())) == 2, "a split between the two")
    with dopool.connect(store_path) as connection:
        assert [info.name for info in connection.pool("jobs").schedules()] == ["tick"]
    assert first.stop() == 0
    assert second.stop() == 0
