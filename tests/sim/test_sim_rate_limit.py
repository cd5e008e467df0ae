"""A pool's ``rate_limit`` in the simulator (docs/simulate.md, "A rate limit and its knee"):
set at the top level, per pool, by a flag, swept, refused by name when bad."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from cli_support import assert_one_line_error, invoke
from dopool._errors import ScenarioError
from dopool._rates import RateLimit
from dopool._sim import loading
from dopool._sim.driver import run
from dopool._sim.pools import PoolTable
from dopool._sim.scenario import Scenario
from dopool._sim.sweep import parse_axis, run_sweep

EPSILON = 1e-9  # float sums of token intervals

#: Poisson arrivals at 8/s, starts limited to 5/s: the limit, not the instances, is the
#: bottleneck, so every start after the first few waits for its token.
LIMITED = """
name = "limited"
seed = 3
instances = 4
rate_limit = {limit}

[arrivals]
process = "poisson"
rate = 8.0
total = 120

[service]
distribution = "exponential"
mean = 0.05
"""


def starts(trace: Path) -> dict[str, list[float]]:
    """Every attempt's start time in a trace, by pool, in time order."""
    found: dict[str, list[float]] = {}
    for line in trace.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event["kind"] == "started":
            found.setdefault(event["pool"], []).append(event["time"])
    return {pool: sorted(times) for pool, times in found.items()}


def assert_within(times: list[float], limit: RateLimit) -> None:
    """No window of ``times`` (both ends included) holds more starts than ``limit`` allows."""
    for first in range(len(times)):
        for last in range(first, len(times)):
            count = last - first + 1
            allowed = limit.allows(times[last] - times[first])
            assert count <= allowed + EPSILON, (times[first], times[last], count, allowed)


@pytest.mark.parametrize("written", ["5", "5.0", '"5/s"', '"300/m"', '"10/2s"'])
def test_a_limited_run_keeps_the_limit_and_its_invariants(written: str, tmp_path: Path) -> None:
    scenario = loading.loads(LIMITED.format(limit=written))
    (pool,) = scenario.resolved_pools
    assert pool.limit is not None
    assert pool.limit.interval == pytest.approx(0.2)
    trace = tmp_path / "trace.jsonl"
    result = run(scenario, trace=trace).result
    assert result.passed
    assert result.finished
    assert result.succeeded == 120
    (times,) = starts(trace).values()
    assert len(times) == 120
    assert_within(times, pool.limit)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) == pytest.approx(0.2)  # the limit bound: starts waited for tokens
    assert result.virtual_time >= 119 * 0.2
    unlimited = run(loading.loads(LIMITED.format(limit='"none"'))).result
    assert unlimited.virtual_time < 119 * 0.2 < result.virtual_time
    assert result.latency.mean > unlimited.latency.mean


def test_each_pool_takes_its_own_limit(tmp_path: Path) -> None:
    """The top level's limit is every pool's default; a [[pools]] table sets its own,
    or none."""
    text = """
seed = 2
rate_limit = "4/s"

[service]
distribution = "fixed"
mean = 0.01

[[arrivals]]
pool = "slow"
process = "steady"
rate = 20.0
total = 40

[[arrivals]]
pool = "free"
process = "steady"
rate = 20.0
total = 40

[[arrivals]]
pool = "fast"
process = "steady"
rate = 20.0
total = 40

[[pools]]
name = "slow"

[[pools]]
name = "free"
rate_limit = "none"

[[pools]]
name = "fast"
rate_limit = 10
"""
    scenario = loading.loads(text)
    limits = {pool.name: pool.limit for pool in scenario.resolved_pools}
    assert limits == {"slow": RateLimit(rate=4.0), "free": None, "fast": RateLimit(rate=10.0)}
    trace = tmp_path / "trace.jsonl"
    result = run(scenario, trace=trace).result
    assert result.passed
    assert result.succeeded == 120
    times = starts(trace)
    assert_within(times["slow"], RateLimit(rate=4.0))
    assert_within(times["fast"], RateLimit(rate=10.0))
    assert times["slow"][-1] >= 39 / 4.0
    assert times["fast"][-1] >= 39 / 10.0
    assert times["free"][-1] < 39 / 20.0 + 1.0  # as they arrive, 0.05 s apart
    assert loading.with_overrides(scenario, {"pools.free.rate_limit": "2"}).pool("free").limit
    # A sweep names a pool's limit too.
    axis = parse_axis("pools.fast.rate_limit=5,none", scenario)
    assert axis.values == (5.0, None)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "must be > 0, got 0.0"),
        (-2.5, "must be > 0"),
        (float("inf"), "must be finite"),
        (True, "must be starts per second (a number > 0), text such as '8/s'"),
        ([8], "must be starts per second"),
        ("fast", "must read '<count>/<unit>'"),
        ("8/ms", "must read '<count>/<unit>'"),
        ("0/s", "cannot be '0/s': a rate limit's rate must be a finite number > 0"),
        (1e7, "spaces its starts 1e-07 s apart"),
    ],
)
def test_a_bad_limit_is_a_scenario_error_naming_it(value: Any, words: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        Scenario(rate_limit=value)
    assert caught.value.field == "rate_limit"
    assert words in caught.value.problem
    with pytest.raises(ScenarioError) as caught:
        Scenario(pools=(PoolTable("a", {"rate_limit": value}),))
    assert caught.value.field == "pools[0].rate_limit"


def test_a_bad_limit_names_its_file_and_flag(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('rate_limit = "often"\n', encoding="utf-8")
    assert_one_line_error(
        invoke("simulate", "-q", "--scenario", str(path)),
        2,
        f"{path}: field 'rate_limit' must read '<count>/<unit>'",
    )
    assert_one_line_error(
        invoke("simulate", "-q", "--rate-limit", "0"),
        2,
        "--rate-limit: field 'rate_limit' must be > 0, got 0.0",
    )
    assert_one_line_error(
        invoke("simulate", "-q", "--sweep", "rate_limit=8,often"),
        2,
        "field 'rate_limit' must read '<count>/<unit>'",
    )


def test_a_limit_reads_back_as_written() -> None:
    """A number is kept as a float, text as it is, ``"none"`` as no limit; each comes
    back from ``--print-scenario``'s TOML the same."""
    for given, kept in ((10, 10.0), ("30/m", "30/m"), ("none", None), (None, None)):
        scenario = Scenario(rate_limit=given)
        assert scenario.rate_limit == kept
        assert scenario.to_dict()["rate_limit"] == kept
        assert loading.loads(scenario.to_toml()).rate_limit == kept
    assert loading.parse_value("rate_limit", "8") == 8.0
    assert loading.parse_value("rate_limit", "8/s") == "8/s"
    assert loading.parse_value("rate_limit", "none") is None
    assert "rate_limit" in loading.numeric_fields()


def test_a_flag_sets_the_limit(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    args = ("simulate", "-q", "--events", "30", "--rate", "20", "--seed", "1")
    done = invoke(*args, "--rate-limit", "30/m", "--json", str(out))
    assert done.exit_code == 0, done.output
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["scenario"]["rate_limit"] == "30/m"
    assert {"field": "rate_limit", "from": None, "to": "30/m"} in document["changed_by_flags"]
    assert document["virtual_time"] >= 29 * 2.0  # a start every 2 s


def test_a_sweep_of_the_limit_gives_a_point_per_value() -> None:
    scenario = loading.loads(LIMITED.format(limit=10))
    axis = parse_axis("rate_limit=4,8,16,none", scenario)
    assert axis.values == (4.0, 8.0, 16.0, None)
    swept = run_sweep(scenario, [axis])
    assert [point.values for point in swept.points] == [(4.0,), (8.0,), (16.0,), (None,)]
    assert all(point.passed for point in swept.points)
    times = [point.figures["virtual_time"].mean for point in swept.points]
    means = [point.figures["mean"].mean for point in swept.points]
    assert times[0] >= 119 / 4.0  # the limit under the arrival rate sets the run's length
    assert times == sorted(times, reverse=True)
    assert means == sorted(means, reverse=True)  # the wait falls as the limit rises
    assert means[0] > 10 * means[-1]
    text = parse_axis("rate_limit=5/s,300/m", scenario)  # text sweeps too
    assert text.values == ("5/s", "300/m")


def test_the_same_seed_gives_the_same_bytes(tmp_path: Path) -> None:
    outputs = []
    for name in ("first", "second"):
        json_path, trace_path = tmp_path / f"{name}.json", tmp_path / f"{name}.jsonl"
        scenario = tmp_path / "limited.toml"
        scenario.write_text(LIMITED.format(limit='"5/s"'), encoding="utf-8")
        args = ("simulate", "-q", "--scenario", str(scenario), "--seed", "9")
        done = invoke(*args, "--json", str(json_path), "--trace", str(trace_path))
        assert done.exit_code == 0, done.output
        outputs.append((json_path.read_bytes(), trace_path.read_bytes()))
    assert outputs[0] == outputs[1]
    swept = []
    for name in ("first", "second"):
        out = tmp_path / f"sweep-{name}.json"
        args = ("simulate", "-q", "--scenario", str(tmp_path / "limited.toml"), "-j", "2")
        done = invoke(*args, "--sweep", "rate_limit=4,6", "--repeat", "2", "--json", str(out))
        assert done.exit_code == 0, done.output
        swept.append(out.read_bytes())
    assert swept[0] == swept[1]


def test_the_example_shows_the_knee() -> None:
    """examples/rate-limit.toml, shortened: the wait is small with the limit well above
    the arrival rate, and grows without bound once it falls below it."""
    scenario = loading.with_overrides(
        loading.load_file(Path(__file__).parents[2] / "examples" / "rate-limit.toml"),
        {"arrivals.total": 800},
    )
    assert scenario.rate_limit == 10.0
    swept = run_sweep(scenario, [parse_axis("rate_limit=6,10,32", scenario)])
    low, middle, high = (point.figures for point in swept.points)
    assert high["mean"].mean < 0.1 < middle["mean"].mean < 1.0  # 10/s: rho = 0.8
    assert low["mean"].mean > 10.0  # 6/s: under the arrival rate, the backlog grows
    assert low["throughput"].mean == pytest.approx(6.0, rel=0.05)  # the limit's rate
