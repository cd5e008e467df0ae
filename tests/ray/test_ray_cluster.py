"""A deployment on a ``ray.cluster_utils.Cluster`` of three simulated nodes, a store each:
producers on every node while a host is killed; a node removed, and its events run once
it is back.

One cluster serves the module (``conftest.py``'s ``cluster``); the tests are marked
``ray`` and skip where Ray cannot be imported.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_support import (
    APP,
    NODE,
    WAIT,
    check_partition,
    node_resource,
    produce,
    three_nodes,
    wait_for_runs,
)

import dopool.ray
from dopool._cluster.routing import stable_hash
from dopool._errors import HostUnavailableError

# Ray's processes and real time: run on CI's first Python only (.ci/run).
pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from three_nodes()


def nodes(ray: Any) -> list[str]:
    return sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])


def partitions(placement: dopool.ray.Placement, each: int) -> list[str]:
    """Partition keys, ``each`` routed to each host's instances of ``jobs``, in turn."""
    found: dict[int, list[str]] = {host.index: [] for host in placement.hosts}
    concurrency = placement.pools["jobs"].concurrency
    for i in itertools.count():
        key = f"n{i}"
        keys = found[placement.host_of("jobs", stable_hash(key) % concurrency).index]
        if len(keys) < each:
            keys.append(key)
        if all(len(keys) == each for keys in found.values()):
            return [key for group in zip(*found.values(), strict=True) for key in group]
    raise AssertionError("unreachable")


def on_node(ray: Any, node: str) -> Any:
    """``produce`` as a task pinned to ``node``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    pinned = NodeAffinitySchedulingStrategy(node, soft=False)
    return ray.remote(num_cpus=0, scheduling_strategy=pinned)(produce)


def test_producers_on_every_node_lose_nothing_while_a_host_is_killed(
    cluster: Any, tmp_path: Path
) -> None:
    import ray

    everywhere = nodes(ray)
    assert len(everywhere) == 3
    with dopool.ray.deploy(APP, str(tmp_path / "stores" / "{host}"), name="killed") as deployed:
        assert {host.node_id for host in deployed.placement.hosts} == set(everywhere)
        # one partition per producer, four on each host's instances
        keys = partitions(deployed.placement, 4)
        refs = [
            on_node(ray, node).remote("killed", key, [key], 40)
            for node, key in zip(everywhere * 4, keys, strict=True)
        ]
        victim = deployed.host(1)
        # under way (some events ran): the kill lands among the calls
        wait_for_runs(tmp_path, {(key, 0) for key in keys})
        ray.kill(victim, no_restart=False)
        for ref in refs:
            ray.get(ref, timeout=WAIT * 2)  # every call acknowledged
        runs = wait_for_runs(tmp_path, {(key, n) for key in keys for n in range(40)})
        for key in keys:
            check_partition(runs, key, 40)


def test_a_node_removed_is_a_named_error_and_its_host_comes_back_with_a_node_like_it(
    cluster: Any, tmp_path: Path
) -> None:
    """Hosts run by resource (``deploy(resources=...)``): the node of one removed, its
    instances' calls get the named error after the bounded wait; a node with the same
    resource joining again has Ray restart the same host there, on the same store, and
    the events acknowledged before the removal run, in order, with no new deploy."""
    import ray

    store = str(tmp_path / "stores" / "{host}")
    resources = [node_resource(index) for index in range(3)]
    with dopool.ray.deploy(APP, store, name="removed", resources=resources) as deployed:
        pool = dopool.ray.connect("removed", timeout=2.0).pool("jobs")
        # instance 3 of 4 is the last host's: the one whose node is removed below
        key = next(
            f"k{i}"
            for i in range(100)
            if pool.enqueue(
                {"producer": "probe", "n": i}, partition_key=f"k{i}", delay=3600
            ).instance_index
            == 3
        )
        gone = deployed.placement.host_of("jobs", 3)
        assert gone.index == 2
        for n in range(20):
            pool.enqueue({"producer": key, "n": n}, partition_key=key, delay=2.0)
        (raylet,) = [node for node in cluster.worker_nodes if node.node_id == gone.node_id]
        cluster.remove_node(raylet)
        started = time.monotonic()
        last = {"producer": key, "n": 20}
        with pytest.raises(HostUnavailableError) as raised:  # (the same dedup key again below)
            pool.enqueue(last, partition_key=key, dedup_key=f"{key}-last")
        assert (raised.value.instance, raised.value.node_id) == (3, gone.node_id)
        assert 1.5 <= time.monotonic() - started < 20
        cluster.add_node(**NODE, resources={resources[2]: 1})
        cluster.wait_for_nodes()
        patient = dopool.ray.connect("removed", timeout=WAIT).pool("jobs")
        patient.enqueue(last, partition_key=key, dedup_key=f"{key}-last")  # the host is back
        runs = wait_for_runs(tmp_path, {(key, n) for n in range(21)})
        check_partition(runs, key, 21)
        assert ray.get(deployed.host(2).node_id.remote(), timeout=WAIT) != gone.node_id
