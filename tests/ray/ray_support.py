"""What the Ray tests share: the app they deploy, reading what ran, a producer task.

Importable by name in the tests and in their Ray workers (each module's Ray puts this
folder on its workers' ``PYTHONPATH``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dopool.ray

APP = f"{Path(__file__).with_name('ray_app.py')}:build"
#: Seconds a test waits for what it expects to have run.
WAIT = 30.0
#: What each node of a simulated cluster has (``conftest.py``'s ``cluster``).
NODE: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 * 2**20}


def ran(tmp_path: Path) -> dict[str, list[tuple[str, str, int]]]:
    """Each partition's runs, in order: (event id, producer, n)."""
    found: dict[str, list[tuple[str, str, int]]] = {}
    directory = tmp_path / "stores" / "ran"
    for log in sorted(directory.glob("*.log")) if directory.exists() else []:
        lines = log.read_text().splitlines()
        found[log.stem] = [
            (f"{a}:{b}", producer, int(n)) for a, b, producer, n in (x.split() for x in lines)
        ]
    return found


def wait_for_runs(tmp_path: Path, expected: set[tuple[str, int]]) -> dict[str, list[Any]]:
    """The runs, once every (producer, n) of ``expected`` ran (within :data:`WAIT`)."""
    deadline = time.monotonic() + WAIT
    while True:
        runs = ran(tmp_path)
        seen = {(p, n) for lines in runs.values() for _, p, n in lines}
        if expected <= seen or time.monotonic() > deadline:
            assert sorted(expected - seen) == []
            return runs
        time.sleep(0.05)


def produce(deployment: str, producer: str, keys: list[str], count: int) -> list[str]:
    """``count`` events, ``n`` counting up, their partition keys taken in turn; their ids."""
    pool = dopool.ray.connect(deployment).pool("jobs")
    ids = []
    for n in range(count):
        key = keys[n % len(keys)]
        ids.append(pool.enqueue({"producer": producer, "n": n}, partition_key=key).event_id)
    return ids


def check_partition(runs: dict[str, list[Any]], key: str, count: int) -> None:
    """Partition ``key`` (one producer's ``n`` 0 to ``count - 1``) ran each event, in
    order, and none was stored twice (a run again after a kill is the same event)."""
    order = [n for _, _, n in runs[key]]
    first_runs = [n for i, n in enumerate(order) if n not in order[:i]]
    assert first_runs == list(range(count)), key
    assert len({(event_id, n) for event_id, _, n in runs[key]}) == count, key


def node_resource(index: int) -> str:
    """The custom resource node ``index`` of :func:`three_nodes` has (and a node added in
    its place may have again)."""
    return f"dopool-test-node-{index}"


def three_nodes() -> Iterator[Any]:
    """A simulated cluster of three nodes (the head and two more, each with its
    :func:`node_resource`), this process its driver, for a module's ``cluster`` fixture
    (``yield from three_nodes()``)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("RAY_ADDRESS", raising=False)
        head = {**NODE, "include_dashboard": False, "resources": {node_resource(0): 1}}
        made: Any = Cluster(initialize_head=True, head_node_args=head)
        try:
            for index in (1, 2):
                made.add_node(**NODE, resources={node_resource(index): 1})
            made.wait_for_nodes()
            ray.init(
                address=made.address,
                logging_level="WARNING",
                runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}},
            )
            try:
                yield made
            finally:
                ray.shutdown()
        finally:
            made.shutdown()
