"""The simulator: scenarios and their validation, the driver on the real engine, metrics.

Runs are small (a few hundred events) so the whole file takes seconds; the built-in
scenarios themselves run at full size once each where their lesson needs it.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb
import pytest

from dopool import ConfigurationError, Runtime, SimulatedClock
from dopool._errors import ScenarioError, StoreNotFoundError
from dopool._handles.tools import ToolRuntime
from dopool._ops.storeview import open_view, purge, redrive
from dopool._sim import loading as sc
from dopool._sim.columns import Steps, Times
from dopool._sim.driver import run
from dopool._sim.figures import figures
from dopool._sim.latency import Latency, percentile
from dopool._sim.measure import _since_handed, _store_checks, _unaccounted
from dopool._sim.metrics import Collector
from dopool._sim.pools import PoolTable
from dopool._sim.scenario import (
    DEFAULT_TOTAL,
    Arrivals,
    Faults,
    Kill,
    Pause,
    Scenario,
    Service,
)
from dopool._sim.workload import POOL, Lineage, arrivals, make_handler, service_time
from dopool._store.layout import Namespace
from dopool._types import PoolEvent


def small(name: str, events: int = 200, **overrides: object) -> Scenario:
    """A built-in scenario cut down to ``events`` arrivals."""
    return sc.with_overrides(sc.builtin(name), {"arrivals.total": events, **overrides})


# -- scenarios -----------------------------------------------------------------------
@pytest.mark.parametrize("name", sc.BUILTINS)
def test_builtins_load_and_describe_themselves(name: str) -> None:
    scenario = sc.builtin(name)
    assert scenario.name == name
    assert len(scenario.description) > 80  # says what it teaches
    assert sc.resolve(name) == scenario


def test_at_least_five_builtins_named_as_the_issue_asks() -> None:
    assert {"steady", "burst", "hot-partition", "poison", "crash-storm"} <= set(sc.BUILTINS)


@pytest.mark.parametrize("name", sc.BUILTINS)
def test_to_toml_round_trips(name: str) -> None:
    scenario = sc.builtin(name)
    assert sc.loads(scenario.to_toml()) == scenario


def test_defaults_make_a_valid_scenario() -> None:
    scenario = Scenario()
    assert scenario.arrivals[0].total == DEFAULT_TOTAL
    assert scenario.arrivals[0].duration is None


def test_pauses_of_other_instances_or_times_may_come_in_any_order() -> None:
    text = (
        "[[pauses]]\nat = 5.0\nduration = 2.0\ninstance = 0\n"
        "[[pauses]]\nat = 1.0\nduration = 10.0\ninstance = 1\n"
        "[[pauses]]\nat = 1.0\nduration = 3.0\ninstance = 0"
    )
    assert len(sc.loads(text).pauses) == 3


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("instances = 0", "instances", ">= 1"),
        ("instances = 'four'", "instances", "an integer"),
        ("routing = 'random'", "routing", "'round-robin'"),
        ("[arrivals]\nrate = -3", "arrivals.rate", "> 0"),
        ("[arrivals]\nrate = 'fast'", "arrivals.rate", "a number"),
        ("[arrivals]\nprocess = 'uniform'", "arrivals.process", "'poisson'"),
        ("[arrivals]\ntotal = 10\nduration = 5.0", "arrivals.duration", "together"),
        ("[arrivals]\nrte = 3", "arrivals.rte", "did you mean 'rate'"),
        ("instanses = 3", "instanses", "did you mean 'instances'"),
        ("[service]\ndistribution = 'pareto'", "service.distribution", "'lognormal'"),
        ("[service]\nmean = -1", "service.mean", ">= 0"),
        ("[retry]\nmax_attempts = 0", "retry.max_attempts", ">= 1"),
        ("[retry]\ninitial_delay = 5\nmax_delay = 1", "retry.max_delay", ">= 5"),
        ("[faults]\ncrash_before_execute = 1.5", "faults.crash_before_execute", "<= 1"),
        ("[faults]\nstorage_error = 0.9", "faults.storage_error", "<= 0.5"),
        ("[partitions]\nkeys = 0", "partitions.keys", ">= 1"),
        ("poison_share = true", "poison_share", "a number"),
        ("payload_bytes = 1000000", "payload_bytes", "<= 100,000"),
        ("[[pauses]]\nat = 1.0", "pauses[0].duration", "required"),
        (
            "[[pauses]]\nat = 1.0\nduration = 2.0\n[[pauses]]\nat = -1\nduration = 1",
            "pauses[1].at",
            ">= 0",
        ),
        ("instances = 2\n[[kills]]\nat = 1.0\ninstance = 2", "kills[0].instance", "< instances"),
        # The first resume ended both pauses (or came after the other's pause at the same time).
        (
            "[[pauses]]\nat = 1.0\nduration = 10.0\n[[pauses]]\nat = 2.0\nduration = 1.0",
            "pauses[1]",
            "overlaps or touches pauses[0] (t=1 to 11)",
        ),
        (
            "[[pauses]]\nat = 3.0\nduration = 2.0\ninstance = 1\n"
            "[[pauses]]\nat = 1.0\nduration = 2.0",
            "pauses[1]",
            "touches pauses[0] (t=3 to 5)",
        ),
        ("[[kills]]\nat = 1.0\nwhen = 2", "kills[0].when", "not a scenario field"),
        ("arrivals = 3", "arrivals", "a table"),
        ("pauses = 3", "pauses", "array of tables"),
        # Times past 1e9 s: at 1e300 a kill made the report's run 300 digits long, and
        # a 50 ms service time vanished in the sums (every latency 0).
        ("[[kills]]\nat = 1e300", "kills[0].at", "<= 1e+09, got 1e+300"),
        ("[[pauses]]\nat = 1.0\nduration = 1e300", "pauses[0].duration", "<= 1e+09"),
        ("duration = 1e300", "duration", "<= 1e+09"),
        ("[arrivals]\nduration = 1e300", "arrivals.duration", "<= 1e+09"),
        (
            "[arrivals]\nprocess = 'daily'\npeak = 1.0\nperiod = 1e300",
            "arrivals.period",
            "<= 1e+09",
        ),
        (
            "[arrivals]\nprocess = 'phases'\n[[arrivals.phases]]\nrate = 1e308\nduration = 1e9",
            "arrivals.phases",
            "gives about 1.8e+308 events",  # not inf, nor 309 digits
        ),
        ("[arrivals]\nrate = 1e300\nduration = 1.0", "arrivals.duration", "about 1e+300 events"),
    ],
)
def test_bad_fields_are_named(text: str, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        sc.loads(text, source="my.toml")
    error = caught.value
    assert error.field == field
    assert words in str(error)
    assert str(error).startswith(f"my.toml: field '{field}'")


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("instances = = 3\n")
    with pytest.raises(ScenarioError, match=r"broken\.toml: scenario is not valid TOML"):
        sc.load_file(path)


def test_missing_file_and_unknown_name() -> None:
    with pytest.raises(ScenarioError, match="cannot be read"):
        sc.resolve("no/such/file.toml")
    with pytest.raises(ScenarioError, match="neither a built-in scenario"):
        sc.resolve("hot-partitions")


def test_scenario_errors_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        Scenario(instances=-1)


def test_sections_name_their_fields_when_built_directly() -> None:
    with pytest.raises(ScenarioError) as caught:
        Arrivals(rate=0)
    assert caught.value.field == "arrivals.rate"
    with pytest.raises(ScenarioError) as caught:
        Scenario(pauses=(Pause(at=1, duration=1, instance=9),))
    assert caught.value.field == "pauses[0].instance"


def test_overrides_parse_flag_text_and_name_the_field() -> None:
    base = sc.builtin("steady")
    changed = sc.with_overrides(
        base,
        {
            "instances": "16",
            "arrivals.rate": "80.5",
            "max_queue_depth": "100",
            "faults.crash_before_execute": "0.01",
        },
    )
    assert changed.instances == 16
    assert changed.arrivals[0].rate == 80.5
    assert changed.max_queue_depth == 100
    assert changed.faults.crash_before_execute == 0.01
    assert sc.with_overrides(changed, {"max_queue_depth": "none"}).max_queue_depth is None
    for path, value, words in [
        ("instances", "many", "an integer"),
        ("arrivals.rate", "x", "a number"),
        ("arrivals.rte", "1", "did you mean 'arrivals.rate'"),
        ("pauses", "1", "scenario file"),
        ("retry", "1", "is a table"),
    ]:
        with pytest.raises(ScenarioError, match=words) as caught:
            sc.with_overrides(base, {path: value})
        assert caught.value.field == path


def test_total_and_duration_replace_each_other() -> None:
    base = sc.builtin("steady")
    by_time = sc.with_overrides(base, {"arrivals.duration": "30"})
    assert (by_time.arrivals[0].total, by_time.arrivals[0].duration) == (None, 30.0)
    by_count = sc.with_overrides(by_time, {"arrivals.total": "40"})
    assert (by_count.arrivals[0].total, by_count.arrivals[0].duration) == (40, None)


def test_changes_list_what_overrides_changed_by_dotted_path() -> None:
    base = sc.builtin("steady")
    changed = sc.with_overrides(
        base, {"instances": "16", "arrivals.rate": "250", "seed": "9", "arrivals.duration": "5"}
    )
    assert [str(change) for change in sc.changes(base, changed)] == [
        "instances 4 → 16",
        "arrivals.rate 40 → 250",
        "arrivals.total 2000 → none",  # cleared by arrivals.duration
        "arrivals.duration none → 5",
    ]  # the seed is no change to the design: the report's title shows it
    assert sc.changes(base, base) == []
    assert sc.changes(base, sc.with_overrides(base, {"service.mean": "0.05"})) == []
    pooled = sc.loads(
        'instances = 2\n[[arrivals]]\npool = "a"\n[[arrivals]]\npool = "b"\n'
        '[[pools]]\nname = "a"\n[[pools]]\nname = "b"\n[pools.service]\nmean = 0.1\n'
    )
    moved = sc.with_overrides(
        pooled, {"pools.b.service.mean": "0.2", "arrivals[1].rate": "7", "pools.a.instances": "3"}
    )
    assert [str(change) for change in sc.changes(pooled, moved)] == [
        "arrivals[1].rate 50 → 7",
        "pools.a.instances 2 → 3",  # what the pool had, from the top level
        "pools.b.service.mean 0.1 → 0.2",
    ]


def test_numeric_fields_are_what_a_sweep_may_vary() -> None:
    numeric = sc.numeric_fields()
    assert {"instances", "arrivals.rate", "service.mean", "max_queue_depth"} <= set(numeric)
    assert "routing" not in numeric
    assert "service.distribution" not in numeric


# -- the workload ---------------------------------------------------------------------
def test_steady_arrivals_are_evenly_spaced() -> None:
    scenario = Scenario(arrivals=(Arrivals(process="steady", rate=4.0, total=8),))
    assert [a.time for a in arrivals(scenario)] == [n / 4 for n in range(8)]
    assert [a.event_id for a in arrivals(scenario)] == list(range(8))


def test_bursts_arrive_together_until_the_duration() -> None:
    spec = Arrivals(process="bursts", burst_size=3, burst_interval=5.0, duration=12.0)
    times = [a.time for a in arrivals(Scenario(arrivals=(spec,)))]
    assert times == [0.0] * 3 + [5.0] * 3 + [10.0] * 3


def test_poisson_arrivals_have_the_mean_rate_and_repeat_with_the_seed() -> None:
    scenario = Scenario(seed=3, arrivals=(Arrivals(rate=10.0, duration=200.0),))
    first = arrivals(scenario)
    assert 1800 < len(first) < 2200
    assert all(a.time < 200.0 for a in first)
    assert first == arrivals(scenario)
    assert first != arrivals(replace(scenario, seed=4))


def test_partition_keys_follow_the_hot_share_and_the_skew() -> None:
    hot = sc.with_overrides(
        Scenario(routing="partition"),
        {"arrivals.total": 4000, "partitions.keys": 10, "partitions.hot_key_share": 0.5},
    )
    keys = [a.partition_key for a in arrivals(hot)]
    assert 0.5 < keys.count("k0") / len(keys) < 0.6  # the hot half plus its uniform share
    zipf = sc.with_overrides(hot, {"partitions.hot_key_share": 0.0, "partitions.zipf": 1.0})
    keys = [a.partition_key for a in arrivals(zipf)]
    assert keys.count("k0") > 2 * keys.count("k1") * 0.8
    assert keys.count("k1") > keys.count("k9")
    assert all(a.partition_key is None for a in arrivals(Scenario()))


def test_poison_share_marks_events() -> None:
    scenario = Scenario(poison_share=0.1, arrivals=(Arrivals(total=2000),))
    share = sum(a.poison for a in arrivals(scenario)) / 2000
    assert 0.08 < share < 0.12


@pytest.mark.parametrize("distribution", ["fixed", "exponential", "lognormal"])
def test_service_time_distributions_have_the_mean(distribution: str) -> None:
    scenario = Scenario(service=Service(distribution=distribution, mean=0.2, sigma=0.5))
    rng = random.Random(1)
    draws = [service_time(scenario.service, rng) for _ in range(20_000)]
    assert math.isclose(sum(draws) / len(draws), 0.2, rel_tol=0.03)
    assert all(d >= 0 for d in draws)
    if distribution == "fixed":
        assert set(draws) == {0.2}


def test_the_handler_is_a_pure_function_of_seed_event_and_attempt(tmp_path: Path) -> None:
    scenario = Scenario(failure_probability=0.5, service=Service(distribution="fixed", mean=1.0))
    design = scenario.pool(None)
    handle = make_handler(scenario.seed, design, {design.name: design}, Lineage())
    outcomes: list[tuple[int, int, float, str | None]] = []
    with Runtime.simulated(tmp_path / "s") as runtime:
        clock = runtime.clock
        assert isinstance(clock, SimulatedClock)

        def execute(ctx):  # type: ignore[no-untyped-def]
            start = clock.now()
            try:
                handle(ctx)
                error = None
            except Exception as exc:
                error = type(exc).__name__
            outcomes.append((ctx.event["id"], ctx.attempt, clock.now() - start, error))

        pool = runtime.define("p", execute=execute)
        for number in range(6):
            pool.enqueue({"id": number})
        pool.enqueue({"id": 99, "poison": True})
        assert pool.join(timeout=10)
    assert all(seconds == 1.0 for _, _, seconds, _ in outcomes)
    assert outcomes[-1][3] == "PoisonEventError"
    assert {error for *_, error in outcomes[:-1]} == {None, "SimulatedFailure"}


# -- runs on the engine ------------------------------------------------------------------
def test_a_small_run_settles_every_event(tmp_path: Path) -> None:
    result = run(small("steady"), store=tmp_path / "store").result
    assert result.finished
    assert result.offered == result.acknowledged == result.succeeded == 200
    assert result.lost == result.pending == result.dead_lettered == 0
    assert result.passed, result.invariants
    assert [check.name for check in result.invariants] == [
        "no loss",
        "at-least-once",
        "order",
        "counters",
    ]
    assert sum(i.enqueued for i in result.instances) == 200
    assert all(0 < i.utilisation < 1 for i in result.instances)
    assert 0 < result.latency.p50 <= result.latency.p95 <= result.latency.p99 <= result.latency.max
    assert result.throughput == pytest.approx(200 / result.virtual_time)
    assert (tmp_path / "store" / "data").is_dir()  # kept: --store


def test_the_store_must_be_fresh(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "x").write_text("")
    with pytest.raises(ConfigurationError, match="not an empty directory"):
        run(small("steady"), store=tmp_path / "old")


def test_only_a_temporary_store_is_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store a run makes and deletes is opened with LMDB's writemap (a copy less per
    page and commit); one kept with --store is not (its data file would show the map's
    64 GiB). Both runs give the same bytes."""
    opened: dict[str, bool] = {}
    real = lmdb.open

    def spy(path: str, **options: Any) -> Any:
        opened[path] = options["writemap"]
        return real(path, **options)

    monkeypatch.setattr(lmdb, "open", spy)  # (as the store calls it: lmdb.open)
    scenario = small("crash-storm", 100)
    kept = tmp_path / "kept"
    documents = [
        json.dumps(run(scenario, store=where).result.to_json_dict()) for where in (None, kept)
    ]
    assert documents[0] == documents[1]
    assert opened.pop(str(kept / "data")) is False
    [(temporary, writemap)] = opened.items()
    assert writemap is True
    assert not Path(temporary).exists()  # deleted after the run
    assert (kept / "data" / "data.mdb").stat().st_size < 2**30


def test_same_seed_same_bytes_other_seed_other_run(tmp_path: Path) -> None:
    scenario = small("crash-storm", 300)
    documents = []
    traces = []
    for attempt in range(2):
        trace = tmp_path / f"trace{attempt}.jsonl"
        result = run(scenario, trace=trace).result
        documents.append(json.dumps(result.to_json_dict(), indent=2))
        traces.append(trace.read_bytes())
    assert documents[0] == documents[1]
    assert traces[0] == traces[1]
    lines = [json.loads(line) for line in traces[0].splitlines()]
    arrived = [line for line in lines if line["kind"] == "arrived"]
    assert len(arrived) == json.loads(documents[0])["events"]["offered"]
    assert len(lines) - len(arrived) == json.loads(documents[0])["pool_events"]
    other = run(replace(scenario, seed=scenario.seed + 1)).result
    assert json.dumps(other.to_json_dict(), indent=2) != documents[0]


def recomputed(trace: Path) -> tuple[Latency, dict[str, int]]:
    """The latency the report gives, read from the trace alone, and the arrivals' outcomes."""
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    times = [line["time"] for line in lines]
    assert times == sorted(times)  # arrivals in time order with the pool events
    since: dict[tuple[str, int, int], float] = {}
    outcomes: dict[str, int] = {}
    latencies = []
    for line in lines:
        key = (line["pool"], line["instance_index"], line["sequence"])
        if line["kind"] == "arrived":
            outcomes[line["outcome"]] = outcomes.get(line["outcome"], 0) + 1
            if line["outcome"] == "enqueued":
                since[key] = line["time"]
        elif line["kind"] == "enqueued":
            since.setdefault(key, line["time"])  # a follow-up: from its being stored
        elif line["kind"] == "succeeded" and key in since:
            latencies.append(line["time"] - since.pop(key))
    return Latency.of(latencies), outcomes


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(small("crash-storm", 300), id="crashes"),
        pytest.param(
            sc.with_overrides(
                small("steady", 300, instances=2, duration=3.0),
                {"service.distribution": "fixed", "service.mean": 2.0},
            ),
            id="cut-short",
        ),
        pytest.param(small("burst", 300), id="rejections"),
    ],
)
def test_the_trace_gives_back_the_reports_latency(tmp_path: Path, scenario: Scenario) -> None:
    trace = tmp_path / "t.jsonl"
    result = run(scenario, trace=trace).result
    latency, outcomes = recomputed(trace)
    assert (latency.count, latency.p50, latency.p99, latency.max) == (
        result.latency.count,
        result.latency.p50,
        result.latency.p99,
        result.latency.max,
    )
    expected = {
        "enqueued": result.acknowledged,
        "rejected": result.rejected,
        "failed": result.failed,
        "waiting": result.waiting,
    }
    assert outcomes == {name: count for name, count in expected.items() if count}
    # (an ``activated`` line says the instance started: the arrival's own lines follow it)
    text = [line for line in trace.read_text().splitlines() if '"kind":"activated"' not in line]
    first, second = json.loads(text[0]), json.loads(text[1])
    assert first == {
        "kind": "arrived",
        "pool": POOL,
        "instance_index": first["instance_index"],
        "sequence": first["sequence"],
        "time": arrivals(scenario)[0].time,
        "event_id": 0,
        "partition_key": first["partition_key"],
        "outcome": first["outcome"],
        "error": None if first["outcome"] == "enqueued" else first["error"],
    }
    if first["outcome"] == "enqueued":  # stored at once: its pool event follows
        assert (second["kind"], second["sequence"]) == ("enqueued", first["sequence"])
    event = next(json.loads(line) for line in text if '"kind":"arrived"' not in line)
    line = json.dumps(PoolEvent(**event).to_json_dict(), separators=(",", ":"))
    assert line in text  # written as the runtime writes its own trace


def test_the_trace_of_follow_ups_gives_back_the_reports_latency(tmp_path: Path) -> None:
    scenario = sc.loads(
        "seed = 3\ninstances = 2\n[arrivals]\nrate = 10.0\ntotal = 100\n"
        '[[pools]]\nname = "work"\n[[pools.follow_ups]]\nto = "work"\nprobability = 0.5\n'
    )
    trace = tmp_path / "t.jsonl"
    result = run(scenario, trace=trace).result
    assert result.follow_ups > 0
    latency, _ = recomputed(trace)
    # The report counts a follow-up from its parent's success, which the trace does not
    # link to it; from its being stored (the trace's view) it is never longer.
    assert latency.count == result.latency.count
    assert latency.mean <= result.latency.mean
    assert latency.p99 <= result.latency.p99


def test_json_has_no_wall_clock_figures() -> None:
    document = json.dumps(run(small("steady", 50)).result.to_json_dict())
    assert "wall" not in document


def test_hot_partition_piles_up_on_one_instance() -> None:
    scenario = sc.with_overrides(sc.builtin("hot-partition"), {"arrivals.duration": 20.0})
    result = run(scenario).result
    assert result.passed
    hot = max(result.instances, key=lambda i: i.max_depth)
    others = [i for i in result.instances if i is not hot]
    assert hot.max_depth > 150
    assert all(i.max_depth <= 10 for i in others)
    assert hot.utilisation > 0.9
    assert all(i.utilisation < 0.3 for i in others)


def test_crash_storm_crashes_and_restarts_without_loss() -> None:
    result = run(sc.builtin("crash-storm")).result
    assert result.crashes > 50
    assert result.restarts > 50
    assert result.failed > 0  # crashes during enqueue: refused, never acknowledged
    assert result.lost == 0
    assert result.acknowledged == result.succeeded + result.dead_lettered
    assert result.passed, result.invariants


def test_poison_is_dead_lettered_and_the_queue_moves_on() -> None:
    result = run(sc.builtin("poison")).result
    assert result.dead_lettered >= 1
    assert result.passed
    assert result.pending == 0
    for letter in result.dead_letters:
        assert letter["attempts"] == 4
        assert letter["error"].startswith("PoisonEventError")
        later = result.instances[letter["instance"]]
        assert later.enqueued > letter["sequence"] + 1  # events behind it on its instance...
    assert result.succeeded == result.acknowledged - result.dead_lettered  # ...all succeeded
    assert result.retries == 3 * result.dead_lettered


def test_bursts_over_the_queue_limit_are_rejected() -> None:
    result = run(sc.builtin("burst")).result
    assert result.rejected > 0
    assert result.max_depth == 40
    assert result.acknowledged + result.rejected == result.offered
    assert result.passed


def test_pauses_grow_the_paused_queue_and_it_catches_up() -> None:
    result = run(sc.builtin("maintenance")).result
    assert result.pauses == 1 + 4
    paused = result.instances[1]
    assert paused.max_depth > 2 * max(i.max_depth for i in result.instances if i.index != 1)
    assert result.finished
    assert result.passed


def test_kills_at_given_times() -> None:
    scenario = replace(small("steady", 100), kills=(Kill(at=0.5, instance=0), Kill(at=1.0)))
    result = run(scenario).result
    assert result.crashes == 2
    assert result.instances[0].restarts == 2
    assert result.passed


def test_a_duration_stops_the_run_and_counts_what_is_left(tmp_path: Path) -> None:
    scenario = replace(
        small("steady", 400),
        duration=3.0,
        pauses=(Pause(at=1.0, duration=100.0, instance=2),),
    )
    trace = tmp_path / "t.jsonl"
    result = run(scenario, trace=trace).result
    assert not result.finished
    assert result.virtual_time == 3.0
    assert result.offered < 400
    assert result.pending > 0
    assert result.lost == 0
    assert result.passed, result.invariants
    again = run(scenario, trace=tmp_path / "u.jsonl").result
    assert again.to_json_dict() == result.to_json_dict()
    assert trace.read_bytes() == (tmp_path / "u.jsonl").read_bytes()


def test_a_run_cut_short_says_its_latency_covers_finished_events_only() -> None:
    # Two instances, each in a 2 s handler at t=3: arrivals since t=2 wait to be stored.
    scenario = small("steady", 400, instances=2, duration=3.0, **{"service.distribution": "fixed"})
    scenario = sc.with_overrides(scenario, {"service.mean": 2.0})
    result = run(scenario).result
    assert (result.in_progress, result.waiting) == (2, result.offered - result.acknowledged)
    assert result.waiting > 0
    assert result.pending >= result.in_progress
    assert result.unfinished == result.pending + result.waiting + result.outbox
    assert result.not_arrived == 400 - result.offered > 0
    latency = result.latency
    assert latency.censored
    assert (latency.count, latency.unfinished) == (result.succeeded, result.unfinished)
    assert result.enqueue_wait.unfinished == result.waiting
    document = result.to_json_dict()
    assert document["unfinished"] == {
        "events": result.unfinished,
        "pending": result.pending,
        "in_progress": 2,
        "waiting_enqueue": result.waiting,
        "follow_ups_in_flight": 0,
        "not_arrived": result.not_arrived,
    }
    assert document["latency"]["censored"] is True
    assert document["latency"]["unfinished"] == result.unfinished
    named = figures(result)
    assert (named["censored"], named["unfinished"]) == (1.0, float(result.unfinished))
    assert named["waiting_enqueue"] == float(result.waiting)

    done = run(small("steady", 40)).result
    assert not done.latency.censored
    assert done.unfinished == done.not_arrived == 0
    assert done.to_json_dict()["latency"]["censored"] is False
    assert figures(done)["censored"] == 0.0


def test_faults_every_point_small_run() -> None:
    scenario = replace(
        small("steady", 300, failure_probability=0.1),
        faults=Faults(
            crash_before_execute=0.05,
            crash_after_execute=0.05,
            crash_during_enqueue=0.05,
            alarm_error=0.05,
            storage_error=0.05,
        ),
    )
    result = run(scenario).result
    assert result.crashes > 0
    assert result.lost == 0
    assert result.passed, result.invariants


# -- metrics ---------------------------------------------------------------------------------
def test_percentiles_are_nearest_rank() -> None:
    ordered = [float(n) for n in range(1, 101)]
    assert percentile(ordered, 50) == 50.0
    assert percentile(ordered, 99) == 99.0
    assert percentile([], 50) == 0.0
    assert Latency.of([3.0, 1.0, 2.0]).max == 3.0


def test_the_collector_flags_out_of_order_and_repeated_starts() -> None:
    collector = Collector("p")
    for kind, sequence, time in [
        ("enqueued", 0, 0.0),
        ("enqueued", 1, 0.0),
        ("started", 1, 0.0),  # before 0
        ("succeeded", 1, 1.0),
        ("started", 1, 1.0),  # again after its success
        ("succeeded", 1, 2.0),
    ]:
        collector(PoolEvent(kind, "p", 0, sequence, 1, time))  # type: ignore[arg-type]
    collector(PoolEvent("started", "other", 0, 5, 1, 0.0))  # other pools are ignored
    assert collector.order_violations[0] == "p:0 started #1 before #0"
    assert len(collector.repeat_violations) == 2


def test_the_collector_follows_crashes_dead_letters_drains_and_stalls() -> None:
    collector = Collector("p")
    for kind, sequence, time in [
        ("enqueued", 0, 0.0),
        ("enqueued", 1, 0.0),
        ("started", 0, 1.0),
        ("crashed", None, 2.0),  # busy from 1 to 2
        ("alarm_given_up", None, 2.0),  # two events held
        ("resumed", None, 3.0),  # a write: the stall ends
        ("started", 0, 3.0),
        ("dead_lettered", 0, 4.0),  # busy from 3 to 4
        ("alarm_given_up", None, 5.0),  # one held
        ("alarm_given_up", None, 5.5),  # the same stall
        ("drained", None, 6.0),  # a write: it ends, and the queue empties
        ("empty", None, 6.0),  # only counted
        ("alarm_given_up", None, 6.5),  # none held
        ("enqueued", 2, 7.0),  # a write: it ends
    ]:
        collector(PoolEvent(kind, "p", 0, sequence, None, time))  # type: ignore[arg-type]
    track = collector.tracks[0]
    assert [stall.to_json_dict() for stall in collector.stalls] == [
        {"pool": "p", "instance": 0, "since": 2.0, "until": 3.0, "held": 2},
        {"pool": "p", "instance": 0, "since": 5.0, "until": 6.0, "held": 1},
        {"pool": "p", "instance": 0, "since": 6.5, "until": 7.0, "held": 0},
    ]
    assert collector.open_stalls() == []
    assert (track.crashes, track.busy, track.started, track.max_depth) == (1, 2.0, 2, 2)
    assert list(Steps(track.changed_at, track.depths)) == [
        (0.0, 0),
        (0.0, 1),
        (0.0, 2),
        (4.0, 1),
        (6.0, 0),
        (7.0, 1),
    ]
    assert list(track.queue) == [2]
    assert list(collector.dead) == [(0, 0)]
    assert dict(collector.succeeded_at) == {}
    assert collector.counts["alarm_given_up"] == 4
    assert collector.counts["empty"] == 1
    assert sum(collector.counts.values()) == 14


def test_the_end_of_a_run_reads_latencies_and_unsettled_events_column_by_column() -> None:
    collector = Collector("p")
    for kind, index, sequence, time in [
        ("enqueued", 0, 0, 1.0),
        ("enqueued", 0, 1, 1.0),
        ("enqueued", 0, 2, 1.0),
        ("enqueued", 0, 3, 1.0),
        ("enqueued", 1, 0, 1.0),
        ("started", 1, 0, 1.0),
        ("succeeded", 1, 0, 4.0),  # told first
        ("started", 0, 0, 1.0),
        ("succeeded", 0, 0, 3.0),
        ("started", 0, 1, 3.0),
        ("dead_lettered", 0, 1, 3.5),
        ("enqueued", 0, 6, 1.0),  # a follow-up, say: its success leaves a gap before it
        ("started", 0, 6, 5.0),
        ("succeeded", 0, 6, 5.0),
    ]:
        collector(PoolEvent(kind, "p", index, sequence, 1, time))  # type: ignore[arg-type]
    arrived = Times()
    for key in [(0, 0), (0, 1), (0, 3), (0, 5)]:  # (0, 2) unknown, (1, 0) not an arrival
        arrived.put(key, 0.5)
    # (0, 2) and (0, 3) are still queued; (0, 5) the collector never saw
    assert list(_unaccounted(arrived, collector)) == [(0, 5)]
    handed: list[tuple[int, int]] = []

    def handing(key: tuple[int, int]) -> float:
        handed.append(key)
        return 2.0

    latencies = _since_handed(collector, arrived, handing)
    assert latencies == [4.0 - 2.0, 3.0 - 0.5, 5.0 - 2.0]  # in the order told
    assert handed == [(1, 0), (0, 6)]  # not arrivals: from their handing


def test_the_counters_invariant_reports_the_stores_broken_invariants() -> None:
    """The report's "counters" check is dopool._machine.invariants' plus the stream's depth."""
    with ToolRuntime.simulated(seed=0) as runtime:
        collector = Collector(POOL)
        runtime.subscribe(collector)
        pool = runtime.define(POOL, execute=lambda ctx: None, concurrency=2)
        pool.pause()
        pool.enqueue_many(range(4))
        assert _store_checks(runtime, pool, collector) == (0, [], 0)
        with runtime._store.write() as txn:
            namespace = Namespace(POOL, 1)
            meta = namespace.load_meta(txn)
            meta.enqueued += 1
            namespace.save_meta(txn, meta)
        _, problems, _ = _store_checks(runtime, pool, collector)
    assert problems == [
        "sim:1: enqueued 3 != succeeded + dead_lettered + drained + cancelled + pending = 2"
    ]


# -- stores from outside --------------------------------------------------------------------
def test_storeview_reads_status_and_dead_letters_and_acts(tmp_path: Path) -> None:
    store = tmp_path / "store"
    run(small("poison", 400, poison_share=0.05), store=store)
    with open_view(store) as view:
        pools = view.pools()
        assert pools == {"sim": 4}
        status = view.status("sim", 4)
        letters = view.dead_letters("sim")
    assert status.dead_lettered == len(letters) > 0
    assert status.enqueued == status.succeeded + status.dead_lettered
    assert redrive(store, pools) == {"sim": (len(letters), len(letters))}
    with open_view(store) as view:
        assert view.dead_letters("sim") == []
        assert view.status("sim", 4).pending == len(letters)
    assert purge(store, pools) == {"sim": (0, 0)}


def test_storeview_refuses_what_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="no such directory"), open_view(tmp_path / "x"):
        pass
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreNotFoundError, match="not a directory"), open_view(tmp_path / "file"):
        pass
    with pytest.raises(StoreNotFoundError, match=r"no data/data\.mdb"), open_view(tmp_path):
        pass


def test_acting_leaves_an_interrupted_attempt_to_the_next_runtime(tmp_path: Path) -> None:
    """A redrive is a producer's write: an attempt a crash interrupted is no business of
    it; the next runtime's recovery settles that by the pool's own retry policy."""
    store = tmp_path / "store"
    clock = SimulatedClock()
    with Runtime(store, clock=clock) as runtime:
        pool = runtime.define("p", execute=lambda ctx: ctx.sleep(100))
        pool.enqueue("x")
        clock.advance(1)  # the attempt has started and sleeps: its outcome is not committed
        # What a process killed now would leave behind (sync durability: on disk).
        crashed = tmp_path / "crashed"
        shutil.copytree(store / "data", crashed / "data")
        clock.run_until_idle()
    assert redrive(crashed, {"p": 1}) == {"p": (0, 0)}
    with open_view(crashed) as view:
        assert view.status("p", 1).instance(0).state == "processing"  # the runtime's to settle


# -- the core stays free of the CLI's dependencies ----------------------------------------------
def test_import_dopool_does_not_load_the_simulator_or_the_cli() -> None:
    code = (
        "import sys, dopool\n"
        "assert 'dopool._sim' not in sys.modules and 'dopool._cli' not in sys.modules\n"
        "sys.modules['click'] = None\n"
        "sys.modules['rich'] = None\n"
        "sys.modules['matplotlib'] = None\n"
        "import dopool._sim.driver, dopool._ops.storeview, dopool._sim.plot\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_report_counts_instances_started_and_evicted_and_how_many_ran() -> None:
    """Arrivals 100 virtual s apart on average: instances idle past the default
    idle_timeout (60 s) are evicted between them, and started again by the next."""
    scenario = Scenario(
        instances=4, arrivals=(Arrivals(process="steady", rate=0.01, total=12),), seed=5
    )
    result = run(scenario).result
    active = result.activations
    assert active.started > 4  # more starts than instances: some started again
    assert active.evicted >= active.started - 4  # each start again followed an eviction
    assert 1 <= active.peak <= 4
    assert 0 < active.mean < active.peak
    assert active.per_second == pytest.approx(active.started / result.virtual_time)
    named = figures(result)
    assert (named["activations"], named["evictions"]) == (active.started, active.evicted)
    assert result.to_json_dict()["activations"]["peak"] == active.peak
    assert result.passed


def test_a_pools_idle_timeout_decides_its_evictions() -> None:
    arrivals = (Arrivals(process="steady", rate=0.01, total=12),)
    kept = run(Scenario(instances=4, arrivals=arrivals, seed=5, idle_timeout=1000.0)).result
    assert (kept.activations.started, kept.activations.evicted) == (4, 0)
    tables = (PoolTable("sim", {"idle_timeout": 1000.0}),)
    assert run(Scenario(arrivals=arrivals, seed=5, pools=tables)).result.activations.evicted == 0
    with pytest.raises(ScenarioError, match="idle_timeout"):
        Scenario(idle_timeout=0)
