"""Pools across nodes on a local Ray (``dopool.ray``): a deployment of ``ray_app.py``,
producers on the driver and in Ray tasks, host actors killed under load.

One local Ray serves the module (started once, two CPUs, no dashboard); the tests are
marked ``ray`` and skip where Ray cannot be imported. What ran is read from the files
the app's handler writes (``ray_app.py``), polled within a bound.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_support import APP, WAIT, check_partition, produce, wait_for_runs

import dopool.ray
from dopool._cluster.owner_wire import Call, Request, decode_answer, encode_request
from dopool._errors import DeploymentError, HostUnavailableError, PoolNotFoundError, QueueFullError
from dopool._machine.validation import prepare
from dopool._store.layout import PRODUCER_ID_BYTES
from worker_support import until

# Ray's processes and real time: run on CI's first Python only (.ci/run).
pytestmark = [pytest.mark.ray, pytest.mark.slow]


DEPLOYMENT_MD = Path(__file__).parents[2] / "docs" / "deployment.md"


def example(first_line: str) -> str:
    """The ```python block of docs/deployment.md that begins with ``first_line``."""
    text = DEPLOYMENT_MD.read_text(encoding="utf-8")
    (code,) = re.findall(rf"^```python\n({re.escape(first_line)}.*?)^```", text, re.M | re.S)
    return str(code)


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local Ray for the module, its workers importing this module and
    docs/deployment.md's ``myapp``."""
    ray = pytest.importorskip("ray")
    apps = tmp_path_factory.mktemp("apps")
    (apps / "myapp.py").write_text(example("# myapp.py"), encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("RAY_ADDRESS", raising=False)
        ray.init(
            "local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 2**20,
            logging_level="WARNING",
            # the tasks' functions are this module's, found by name
            runtime_env={"env_vars": {"PYTHONPATH": f"{apps}{os.pathsep}{Path(__file__).parent}"}},
        )
        try:
            yield ray
        finally:
            ray.shutdown()


@pytest.fixture
def deployment(local_ray: Any, tmp_path: Path) -> Iterator[dopool.ray.Deployment]:
    with dopool.ray.deploy(
        APP, str(tmp_path / "stores" / "{host}"), name=tmp_path.name, durability="async"
    ) as deployed:
        yield deployed


def test_events_from_the_driver_and_from_tasks_each_run_once(
    local_ray: Any, deployment: dopool.ray.Deployment, tmp_path: Path
) -> None:
    name = deployment.name
    task = local_ray.remote(num_cpus=0)(produce)
    refs = [task.remote(name, f"task{t}", [f"k{t}"], 20) for t in range(3)]
    ids = produce(name, "driver", ["a", "b", "c"], 30)
    for ref in refs:
        ids.extend(local_ray.get(ref, timeout=WAIT))
    expected = {("driver", n) for n in range(30)} | {
        (f"task{t}", n) for t in range(3) for n in range(20)
    }
    runs = wait_for_runs(tmp_path, expected)
    lines = [line for found in runs.values() for line in found]
    assert len(lines) == len(expected) == len(ids) == len(set(ids))  # each ran once
    assert sorted(i for i, _, _ in lines) == sorted(ids)
    for t in range(3):  # one producer's partition: in its order
        assert [n for _, _, n in runs[f"k{t}"]] == list(range(20))


def test_a_dedup_key_held_answers_its_event_and_a_full_queue_its_error(
    deployment: dopool.ray.Deployment,
) -> None:
    connection = dopool.ray.connect(deployment.name)
    jobs = connection.pool("jobs")
    first = jobs.enqueue({"producer": "d", "n": 0}, dedup_key="once", delay=3600)
    again = jobs.enqueue({"producer": "d", "n": 1}, dedup_key="once")
    assert not first.duplicate
    assert again.duplicate
    assert again.event_id == first.event_id
    small = connection.pool("small")
    small.enqueue({"producer": "d", "n": 2}, delay=3600)
    with pytest.raises(QueueFullError) as raised:
        small.enqueue({"producer": "d", "n": 3}, delay=3600)
    assert (raised.value.pool, raised.value.instance_index, raised.value.max_depth) == (
        "small",
        0,
        1,
    )
    with pytest.raises(PoolNotFoundError):
        connection.pool("nothing")
    with pytest.raises(DeploymentError):
        dopool.ray.connect("no-such-deployment")


def test_a_call_sent_twice_is_answered_with_its_first_results_and_stored_once(
    local_ray: Any, deployment: dopool.ray.Deployment, tmp_path: Path
) -> None:
    host = deployment.host(deployment.placement.host_of("jobs", 1).index)
    item = prepare({"producer": "twice", "n": 0}, partition_key="twice", priority=0, schema=None)
    request = Request(b"\x07" * PRODUCER_ID_BYTES, 0, True, [Call(5, "jobs", 1, (item,))])
    frame = encode_request(request)
    answers = [decode_answer(local_ray.get(host.call.remote(frame))[0][4:]) for _ in range(2)]
    assert answers[0] == answers[1]
    assert answers[0][5] is not None
    # A later call into the same instance runs after anything stored before it: had the
    # first been stored twice, its second run would come before this one's.
    after = prepare({"producer": "twice", "n": 1}, partition_key="twice", priority=0, schema=None)
    later = Request(b"\x07" * PRODUCER_ID_BYTES, 0, True, [Call(6, "jobs", 1, (after,))])
    local_ray.get(host.call.remote(encode_request(later)))
    runs = wait_for_runs(tmp_path, {("twice", 0), ("twice", 1)})
    assert [n for _, _, n in runs["twice"]] == [0, 1]


def test_a_killed_host_restarts_on_its_node_and_no_acknowledged_event_is_lost(
    local_ray: Any, deployment: dopool.ray.Deployment, tmp_path: Path
) -> None:
    name = deployment.name
    acked: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def producer(label: str) -> None:
        pool = dopool.ray.connect(name).pool("jobs")
        acked[label] = []
        try:
            for n in range(60):
                pool.enqueue({"producer": label, "n": n}, partition_key=label)
                acked[label].append(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(f"p{i}",)) for i in range(3)]
    task = local_ray.remote(num_cpus=0)(produce)
    remote = task.remote(name, "remote", ["remote"], 60)
    host = deployment.host(0)
    before = local_ray.get(host.pid.remote())
    for thread in threads:
        thread.start()
    until(lambda: sum(len(n) for n in acked.values()) >= 30, "30 calls acknowledged")
    local_ray.kill(host, no_restart=False)
    for thread in threads:
        thread.join(WAIT * 2)
    assert errors == []
    local_ray.get(remote, timeout=WAIT * 2)
    assert local_ray.get(host.pid.remote(), timeout=WAIT) != before  # restarted
    expected = {(label, n) for label, ns in acked.items() for n in ns}
    expected |= {("remote", n) for n in range(60)}
    runs = wait_for_runs(tmp_path, expected)
    for label in [*acked, "remote"]:
        check_partition(runs, label, 60)


def test_a_host_gone_for_good_is_a_named_error_after_the_timeout(
    local_ray: Any, deployment: dopool.ray.Deployment
) -> None:
    pool = dopool.ray.connect(deployment.name, timeout=1.0).pool("jobs")
    pool.enqueue({"producer": "x", "n": 0}, partition_key="x")
    local_ray.kill(deployment.host(0), no_restart=True)
    started = time.monotonic()
    with pytest.raises(HostUnavailableError) as raised:
        pool.enqueue({"producer": "x", "n": 1}, partition_key="x")
    assert 0.5 <= time.monotonic() - started < 10
    error = raised.value
    assert (error.pool, error.node_id) == ("jobs", deployment.placement.hosts[0].node_id)
    assert error.waited >= 0.5


def test_the_deployment_pages_example_runs(
    local_ray: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/deployment.md, "On a Ray cluster": its driver, on this module's Ray (already
    started: its ``ray.init()`` left out) and a store under ``tmp_path``."""
    code = example("# deploy.py")
    assert "ray.init()" in code
    assert '"/var/lib/myapp/queue"' in code
    code = code.replace("ray.init()", "pass").replace(
        '"/var/lib/myapp/queue"', repr(str(tmp_path / "queue"))
    )
    exec(compile(code, "deployment.md", "exec"), {"__name__": "example"})
    ranges, event_id = capsys.readouterr().out.splitlines()
    assert ranges == "((0, 8, 0),)"
    assert event_id.startswith("emails:")
    with pytest.raises(DeploymentError):  # closed: nothing runs by that name any more
        dopool.ray.connect()
