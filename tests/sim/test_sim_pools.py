"""Scenarios with several pools, arrival streams and follow-ups (docs/simulate.md, "Pools")."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dopool._cli import cli
from dopool._errors import ScenarioError
from dopool._sim import loading
from dopool._sim.driver import run
from dopool._sim.figures import describe, figures
from dopool._sim.scenario import Scenario
from dopool._sim.workload import arrivals

TWO_POOLS = """
name = "two"
seed = 4
instances = 2

[service]
distribution = "fixed"
mean = 0.01

[[arrivals]]
pool = "front"
process = "steady"
rate = 10.0
total = 20

[[arrivals]]
pool = "back"
rate = 5.0
total = 10

[[pools]]
name = "front"
instances = 3

[pools.service]
mean = 0.02

[[pools]]
name = "back"
routing = "partition"

[pools.partitions]
keys = 8

[[kills]]
at = 0.5
pool = "back"
instance = 1
"""

FANOUT = """
name = "fanout"
seed = 3
instances = 2

[arrivals]
rate = 10.0
total = 200

[[pools]]
name = "work"

[pools.service]
mean = 0.02

[[pools.follow_ups]]
to = "work"
probability = 0.5
count = 1
"""


def test_pool_tables_override_the_top_level_settings_field_by_field() -> None:
    scenario = loading.loads(TWO_POOLS)
    front, back = scenario.resolved_pools
    assert (front.name, front.instances, front.routing) == ("front", 3, "round-robin")
    assert (front.service.distribution, front.service.mean) == ("fixed", 0.02)
    assert (back.name, back.instances, back.routing) == ("back", 2, "partition")
    assert (back.service.mean, back.partitions.keys) == (0.01, 8)


def test_a_scenario_without_pool_tables_has_one_pool_named_sim() -> None:
    (only,) = Scenario(instances=5).resolved_pools
    assert (only.name, only.instances) == ("sim", 5)


def test_pools_and_streams_round_trip_through_toml() -> None:
    for text in (TWO_POOLS, FANOUT):
        scenario = loading.loads(text)
        assert loading.loads(scenario.to_toml()) == scenario


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ('[[pools]]\nname = "a"\n[pools.service]\nmean = -1', "pools[0].service.mean", ">= 0"),
        ('[[pools]]\nname = "a"\ninstancs = 2', "pools[0].instancs", "did you mean 'instances'"),
        ('[[pools]]\nname = "a"\n[[pools]]\nname = "a"', "pools[1].name", "repeats"),
        ('[[pools]]\nname = "a b"', "pools[0].name", "name"),
        ('[[pools]]\nname = "e2e"', "pools[0].name", "names figures of the whole run"),
        ("[[pools]]\ninstances = 2", "pools[0].name", "is required"),
        (
            '[[pools]]\nname = "a"\n[[pools.follow_ups]]\nto = "b"',
            "pools[0].follow_ups[0].to",
            "names no pool",
        ),
        (
            '[[pools]]\nname = "a"\n[[pools.follow_ups]]\nto = "a"\ncount = 1.5',
            "pools[0].follow_ups[0].count",
            "whole number",
        ),
        (
            '[[pools]]\nname = "a"\n[[pools.follow_ups]]\nto = "a"\ncount = 2',
            "pools",
            "never ends",
        ),
        ('[arrivals]\npool = "nope"', "arrivals.pool", "names no pool"),
        ("[[arrivals]]\nrate = 1.0\n[[arrivals]]\nrate = -1.0", "arrivals[1].rate", "> 0"),
        ("[[kills]]\nat = 1.0\npool = 'x'", "kills[0].pool", "names no pool"),
    ],
)
def test_bad_pool_fields_are_named(change: str, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        loading.loads(change)
    assert caught.value.field == field
    assert words in str(caught.value)


def test_flags_reach_a_pool_and_a_stream() -> None:
    scenario = loading.loads(TWO_POOLS)
    changed = loading.with_overrides(
        scenario,
        {
            "pools.front.instances": "6",
            "pools.back.service.mean": "0.5",
            "arrivals[1].rate": "7",
            "instances": "4",
        },
    )
    front, back = changed.resolved_pools
    assert (front.instances, back.instances) == (6, 4)  # back takes the new default
    assert back.service.mean == 0.5
    assert changed.arrivals[1].rate == 7.0
    assert "pools.back.service.mean" in loading.numeric_fields(scenario)
    with pytest.raises(ScenarioError, match="2 arrival streams"):
        loading.with_overrides(scenario, {"arrivals.rate": "3"})
    with pytest.raises(ScenarioError, match="names no pool"):
        loading.with_overrides(scenario, {"pools.middle.instances": "3"})


def test_streams_merge_in_time_order_and_the_first_keeps_its_draws() -> None:
    scenario = loading.loads(TWO_POOLS)
    merged = arrivals(scenario)
    assert [a.event_id for a in merged] == list(range(30))
    assert [a.time for a in merged] == sorted(a.time for a in merged)
    assert {a.pool for a in merged} == {"front", "back"}
    assert all(a.partition_key is not None for a in merged if a.pool == "back")
    assert all(a.partition_key is None for a in merged if a.pool == "front")
    alone = dataclasses.replace(scenario, arrivals=scenario.arrivals[:1])
    assert [a.time for a in arrivals(alone)] == [a.time for a in merged if a.pool == "front"]


def test_two_pools_run_with_their_own_figures() -> None:
    result = run(loading.loads(TWO_POOLS)).result
    assert result.passed, [check.detail for check in result.invariants]
    front, back = result.pools
    assert (front.name, front.offered, front.succeeded) == ("front", 20, 20)
    assert (back.name, back.offered, back.succeeded) == ("back", 10, 10)
    assert len(front.instances) == 3
    assert len(back.instances) == 2
    assert result.restarts == 1  # the kill of back:1
    assert result.requests is None  # no follow-ups: no end-to-end figures
    named = figures(result)
    assert list(named) == list(describe(result))
    assert named["front.succeeded"] == 20.0
    assert named["back.offered"] == 10.0
    assert named["front.p50"] == pytest.approx(0.02)  # fixed service, never queued
    document = result.to_json_dict()
    assert [pool["name"] for pool in document["pools"]] == ["front", "back"]


def test_follow_ups_are_counted_and_every_request_ends() -> None:
    result = run(loading.loads(FANOUT)).result
    assert result.passed, [check.detail for check in result.invariants]
    assert result.follow_ups > 0
    assert result.succeeded == result.acknowledged + result.follow_ups
    requests = result.requests
    assert requests is not None
    assert (requests.completed, requests.failed, requests.unfinished) == (200, 0, 0)
    assert requests.latency.mean >= result.latency.mean  # a request's last event ends later
    named = figures(result)
    assert named["e2e.completed"] == 200.0
    assert named["e2e.p99"] == requests.latency.p99


def test_a_pipeline_run_is_byte_identical_for_the_same_seed() -> None:
    scenario = loading.loads(
        FANOUT.replace("[faults]", "") + "\n[faults]\ncrash_after_execute = 0.05\n"
    )
    first = json.dumps(run(scenario).result.to_json_dict(), sort_keys=True)
    again = json.dumps(run(scenario).result.to_json_dict(), sort_keys=True)
    assert first == again


def test_a_gate_may_name_a_pools_figure_and_the_end_to_end_ones(tmp_path: Path) -> None:
    scenario = tmp_path / "fanout.toml"
    scenario.write_text(FANOUT, encoding="utf-8")
    runner = CliRunner()
    gates = ["--assert", "e2e.completed == 200", "--assert", "e2e.p99 < 100"]
    done = runner.invoke(cli, ["simulate", "--scenario", str(scenario), "-q", *gates])
    assert done.exit_code == 0, done.output
    failing = ["--assert", "e2e.p99 < 0.001"]
    done = runner.invoke(cli, ["simulate", "--scenario", str(scenario), "-q", *failing])
    assert done.exit_code == 1
    assert "assertion failed: e2e.p99 < 0.001 (e2e.p99 = " in done.output
    two = tmp_path / "two.toml"
    two.write_text(TWO_POOLS, encoding="utf-8")
    done = runner.invoke(
        cli, ["simulate", "--scenario", str(two), "-q", "--assert", "front.succeeded == 20"]
    )
    assert done.exit_code == 0, done.output
    done = runner.invoke(
        cli, ["simulate", "--scenario", str(two), "-q", "--assert", "middle.p99 < 1"]
    )
    assert done.exit_code == 2
    assert "names no figure 'middle.p99'" in done.output


def test_a_sweep_may_vary_one_pools_setting(tmp_path: Path) -> None:
    two = tmp_path / "two.toml"
    two.write_text(TWO_POOLS, encoding="utf-8")
    out = tmp_path / "sweep.json"
    args = ["simulate", "--scenario", str(two), "-q", "--json", str(out)]
    done = CliRunner().invoke(cli, [*args, "--sweep", "pools.front.instances=1,3"])
    assert done.exit_code == 0, done.output
    points = json.loads(out.read_text(encoding="utf-8"))["points"]
    assert [point["values"] for point in points] == [
        {"pools.front.instances": 1},
        {"pools.front.instances": 3},
    ]
