"""The simulator on large and per-key pools (docs/simulate.md, "Instances and routing").

A scenario's pool may have up to 2**32 instances, or ``instances = "per-key"``: an
instance per partition key. What a run keeps, checks and lists grows with the
instances it used, not with the pool's size.
"""

from __future__ import annotations

import json

import pytest

from cli_support import invoke
from dopool._errors import ScenarioError
from dopool._sim import loading as sc
from dopool._sim.driver import run
from dopool._sim.scenario import Arrivals, Partitions, Pause, Scenario, Service
from dopool._store.layout.limits import PER_KEY


def rooms(keys: int = 300, events: int = 1500, **fields: object) -> Scenario:
    """Chat rooms, an instance each: Zipf-drawn keys, rooms evicted after 1 idle second."""
    return Scenario(
        name="rooms",
        seed=3,
        instances="per-key",
        routing="partition",
        idle_timeout=1.0,
        partitions=Partitions(keys=keys, zipf=1.1),
        arrivals=(Arrivals(process="poisson", rate=100.0, total=events),),
        service=Service(distribution="exponential", mean=0.005),
        **fields,  # type: ignore[arg-type]
    )


def test_a_per_key_pool_runs_an_instance_per_key_and_lists_those_used() -> None:
    result = run(rooms()).result
    assert result.passed, [check for check in result.invariants if not check.passed]
    assert result.succeeded == 1500
    (pool,) = result.pools
    assert pool.concurrency == PER_KEY
    assert not pool.every_instance
    used = [instance.index for instance in pool.instances]
    assert used == sorted(used)
    assert 100 < len(used) <= 300  # one per key drawn, never more than the keys
    assert sum(instance.succeeded for instance in pool.instances) == 1500
    assert all(instance.enqueued > 0 for instance in pool.instances)
    # Rooms idle for a second were evicted and started again by their next message.
    assert result.activations.started > len(used)
    assert result.activations.evicted > 0
    assert result.activations.peak < len(used)
    assert len(result.to_json_dict()["instances"]) == len(used)
    assert pool.to_json_dict()["instances"] == "per-key"  # (in "pools", with several)


def test_the_report_lists_the_busiest_instances_then_the_deepest_queues() -> None:
    """Of more than 20 instances, the report's table shows the 10 busiest and then the
    10 whose queues got deepest among the others, each by its key."""
    result = run(rooms()).result
    listed = result.instances
    hot = result.hottest(10)
    assert hot[:10] == result.busiest(10)
    rest = sorted(
        (i for n, i in enumerate(listed) if n not in hot[:10]), key=lambda i: -i.max_depth
    )
    assert [listed[n].max_depth for n in hot[10:]] == [i.max_depth for i in rest[:10]]
    assert len(set(hot)) == 20
    assert result.hottest(len(listed)) == list(range(len(listed)))  # few: all, as listed
    shown = invoke("simulate", "--scenario", "chat-rooms", "--events", "1500", "--seed", "1")
    assert "instances: the 10 busiest, then the 10 deepest queues of the others" in shown.output
    assert "more instances: see --json" in shown.output


def test_a_per_key_run_is_reproducible_to_the_byte() -> None:
    first, second = (json.dumps(run(rooms(events=400)).result.to_json_dict()) for _ in range(2))
    assert first == second


def test_a_pool_of_a_million_round_robin_instances_lists_those_its_run_used() -> None:
    scenario = Scenario(
        name="wide",
        seed=1,
        instances=1_000_000,
        arrivals=(Arrivals(process="poisson", rate=50.0, total=300),),
        service=Service(distribution="fixed", mean=0.01),
    )
    result = run(scenario).result
    assert result.passed
    (pool,) = result.pools
    assert [instance.index for instance in pool.instances] == list(range(300))  # round-robin


def test_a_small_pool_still_lists_every_instance_used_or_not() -> None:
    scenario = Scenario(
        name="few", seed=1, instances=8, arrivals=(Arrivals(process="steady", rate=1, total=3),)
    )
    (pool,) = run(scenario).result.pools
    assert pool.every_instance
    assert [instance.index for instance in pool.instances] == list(range(8))
    assert [instance.enqueued for instance in pool.instances] == [1, 1, 1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    ("fields", "path", "words"),
    [
        ({"instances": "per-key", "routing": "round-robin"}, "routing", '"partition"'),
        ({"instances": "lots"}, "instances", '"per-key"'),
        ({"instances": 2**32 + 1}, "instances", "<= 4294967296"),
        (
            {"instances": 2000, "pauses": (Pause(at=1.0, duration=1.0),)},
            "pauses[0].instance",
            "must name one instance",
        ),
        (
            {
                "instances": "per-key",
                "routing": "partition",
                "pauses": (Pause(at=1.0, duration=1.0),),
            },
            "pauses[0].instance",
            "must name one instance",
        ),
    ],
)
def test_what_a_large_or_per_key_pool_refuses_is_named(
    fields: dict[str, object], path: str, words: str
) -> None:
    with pytest.raises(ScenarioError) as caught:
        Scenario(name="bad", **fields)  # type: ignore[arg-type]
    assert caught.value.field == path
    assert words in str(caught.value)


def test_a_per_key_pool_may_pause_or_kill_a_named_instance() -> None:
    scenario = rooms(events=300, pauses=(Pause(at=1.0, duration=0.5, instance=2**63),))
    assert run(scenario).result.passed


def test_the_flag_and_the_builtin_take_per_key() -> None:
    scenario = sc.with_overrides(sc.builtin("hot-partition"), {"instances": "per-key"})
    assert scenario.instances == "per-key"
    assert sc.builtin("chat-rooms").instances == "per-key"
    out = invoke(
        "simulate", "--scenario", "hot-partition", "--instances", "per-key", "--events", "300"
    )
    assert out.exit_code == 0, out.output
    assert "instances used, partition routing" in out.output
