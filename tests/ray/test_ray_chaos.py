"""Chaos seeds on a simulated three-node cluster: producers on random nodes, host actors
and producers killed at points of the run's progress, every choice from the seed.

Each seed deploys ``ray_app.py`` afresh (a store a host), starts 2-4 producer actors,
each pinned to a node drawn from the seed and enqueuing its own partitions' events one
call at a time, and records each acknowledgement in a file as it comes (so a producer
killed later leaves what it was told). While they run, the seed's faults land once so
many acknowledgements have come: a host killed (Ray restarts it on its node) or a
producer killed for good. Then, from what the handlers recorded:

- every acknowledged event ran (none lost);
- no event was stored twice (each producer's event ``n`` has one event id, however
  often it ran);
- each partition's events first ran in the order they were enqueued.

A failing seed names itself and the command that runs it again:
``DOPOOL_RAY_CHAOS_SEEDS=S pytest tests/ray/test_ray_chaos.py``. The seeds are
:data:`SEEDS` unless that variable lists others (``1,5,9``, or ``0-40``).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ray_support import APP, WAIT, ran, three_nodes, wait_for_runs

import dopool.ray

# Ray's processes and real time: run on CI's first Python only (.ci/run).
pytestmark = [pytest.mark.ray, pytest.mark.slow]

SEEDS = range(4)


def _seeds() -> list[int]:
    asked = os.environ.get("DOPOOL_RAY_CHAOS_SEEDS")
    if not asked:
        return list(SEEDS)
    found: list[int] = []
    for part in asked.split(","):
        first, _, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from three_nodes()


class Producer:
    """A producer actor: its events ``{"producer": label, "n": n}``, its partition keys in
    turn, one call at a time; each acknowledgement appended to ``acks`` as it comes."""

    def run(self, deployment: str, label: str, keys: list[str], count: int, acks: str) -> int:
        pool = dopool.ray.connect(deployment).pool("jobs")
        for n in range(count):
            pool.enqueue({"producer": label, "n": n}, partition_key=keys[n % len(keys)])
            descriptor = os.open(acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(descriptor, f"{label} {n}\n".encode())
            finally:
                os.close(descriptor)
        return count


@dataclass(frozen=True)
class Plan:
    """One seed's run: each producer's node, keys and count; the faults, each at a count
    of acknowledgements: ``("host", index)`` or ``("producer", index)``."""

    producers: list[tuple[int, list[str], int]]
    faults: list[tuple[int, str, int]]

    @classmethod
    def draw(cls, seed: int, nodes: int) -> Plan:
        draws = random.Random(seed)
        producers = []
        for p in range(draws.randint(2, 4)):
            keys = [f"s{seed}p{p}k{k}" for k in range(draws.randint(1, 3))]
            producers.append((draws.randrange(nodes), keys, draws.randint(15, 35)))
        total = sum(count for _, _, count in producers)
        faults = []
        for _ in range(draws.randint(1, 3)):
            target = "host" if draws.random() < 0.7 else "producer"
            index = draws.randrange(nodes if target == "host" else len(producers))
            faults.append((draws.randint(1, total // 2), target, index))
        return cls(producers, sorted(faults))


def acknowledged(acks: Path) -> set[tuple[str, int]]:
    if not acks.exists():
        return set()
    lines = acks.read_text().splitlines()
    return {(label, int(n)) for label, n in (line.split() for line in lines)}


def _pinned(node: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node, soft=False)


@pytest.mark.parametrize("seed", _seeds())
def test_a_seed_loses_nothing_stores_nothing_twice_and_keeps_each_partitions_order(
    cluster: Any, tmp_path: Path, seed: int
) -> None:
    ray: Any = pytest.importorskip("ray")

    replay = f"DOPOOL_RAY_CHAOS_SEEDS={seed} pytest tests/ray/test_ray_chaos.py"
    nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])
    plan = Plan.draw(seed, len(nodes))
    acks = tmp_path / "acks"
    name = f"chaos{seed}"
    with dopool.ray.deploy(APP, str(tmp_path / "stores" / "{host}"), name=name) as deployed:
        made: Any = ray.remote(num_cpus=0)(Producer)
        actors = [
            made.options(scheduling_strategy=_pinned(nodes[node])).remote()
            for node, *_ in plan.producers
        ]
        running = [
            actor.run.remote(name, f"p{p}", keys, count, str(acks))
            for p, (actor, (_, keys, count)) in enumerate(zip(actors, plan.producers, strict=True))
        ]
        deadline = time.monotonic() + WAIT * 2
        for at, target, index in plan.faults:
            # the acknowledgements file polled until the fault's point, within the deadline
            while len(acknowledged(acks)) < at and time.monotonic() < deadline:
                _, unfinished = ray.wait(running, num_returns=len(running), timeout=0)
                if not unfinished:
                    break
                time.sleep(0.01)
            if target == "host":
                ray.kill(deployed.host(index), no_restart=False)
            else:
                ray.kill(actors[index], no_restart=True)
        for p, ref in enumerate(running):
            try:
                ray.get(ref, timeout=WAIT * 2)
            except ray.exceptions.RayActorError:
                assert any(t == "producer" and i == p for _, t, i in plan.faults), replay
        told = acknowledged(acks)
        runs = wait_for_runs(tmp_path, told)
    lines = [line for partition in runs.values() for line in partition]
    ids: dict[tuple[str, int], set[str]] = {}
    for event_id, producer, n in lines:
        ids.setdefault((producer, n), set()).add(event_id)
    twice = {key: found for key, found in ids.items() if len(found) > 1}
    assert twice == {}, f"seed {seed}: stored twice {twice}; again: {replay}"
    for key, partition in ran(tmp_path).items():
        order = [n for _, _, n in partition]
        first = [n for i, n in enumerate(order) if n not in order[:i]]
        assert first == sorted(first), f"seed {seed}: partition {key} ran {first}; {replay}"
