"""Arrival processes (dopool._sim.arrivals): phases, the daily cycle and replays.

The statistical checks use fixed seeds, so they are deterministic; their bounds
(four standard deviations of a Poisson count, per window) would fail by chance
for a correct generator less than once in ten thousand seeds.
"""

from __future__ import annotations

import json
import math
import random
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from dopool._cli import cli
from dopool._errors import ScenarioError
from dopool._sim import loading as sc
from dopool._sim.arrivals import (
    DailyCycle,
    Record,
    ReplayError,
    arrival_times,
    records,
    replay,
)
from dopool._sim.driver import run
from dopool._sim.pools import PoolTable
from dopool._sim.scenario import Arrivals, Scenario
from dopool._sim.sections import Phase
from dopool._sim.workload import arrivals

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"


def times(spec: Arrivals, seed: int = 1) -> list[float]:
    return list(arrival_times(spec, random.Random(f"{seed}/times")))


def assert_poisson_counts(
    observed: list[float], expected: Callable[[float], float], end: float, windows: int
) -> None:
    """Each window's count is within 4 standard deviations of its expected count."""
    width = end / windows
    counts = [0] * windows
    for at in observed:
        counts[min(int(at // width), windows - 1)] += 1
    for index, count in enumerate(counts):
        mean = expected((index + 1) * width) - expected(index * width)
        assert abs(count - mean) <= 4 * math.sqrt(mean) + 1, (index, count, mean)


# -- the processes of before draw as they always did ----------------------------------
def test_steady_poisson_and_bursts_draw_as_before() -> None:
    """The first Poisson times of seed 1, recorded before the arrivals module existed."""
    scenario = Scenario(seed=1, arrivals=(Arrivals(rate=10.0, total=5),))
    assert [a.time for a in arrivals(scenario)] == [
        0.09329719627611698,
        0.40854086382296123,
        0.43397412455143103,
        0.44296646020744745,
        0.5579105799889977,
    ]
    assert times(Arrivals(process="steady", rate=4.0, total=3)) == [0.0, 0.25, 0.5]
    assert times(Arrivals(process="bursts", burst_size=2, burst_interval=3.0, total=5)) == [
        0.0,
        0.0,
        3.0,
        3.0,
        6.0,
    ]


def test_the_scenarios_of_before_read_as_before() -> None:
    """The new fields are left out of to_dict (so of the JSON) and of the TOML while unset."""
    scenario = sc.builtin("steady")
    assert list(scenario.to_dict()["arrivals"][0]) == [
        "process",
        "rate",
        "total",
        "duration",
        "burst_size",
        "burst_interval",
    ]
    assert "phases" not in scenario.to_toml()


# -- phases ------------------------------------------------------------------------------
def phases(*items: Phase, **fields: object) -> Arrivals:
    return Arrivals(process="phases", phases=items, **fields)  # type: ignore[arg-type]


def test_steady_phases_step_exactly() -> None:
    spec = phases(
        Phase(rate=2.0, duration=2.0, process="steady"),
        Phase(rate=4.0, duration=1.0, process="steady"),
    )
    assert times(spec) == [0.25, 0.75, 1.25, 1.75, 2.125, 2.375, 2.625, 2.875]
    assert spec.expected_events() == 8.0


def test_a_steady_ramp_follows_its_expected_count() -> None:
    # From 0 to 10/s over 10 s: the expected count by u is u**2 / 2, and the k-th
    # arrival comes when it reaches k + 1/2.
    observed = times(phases(Phase(rate=0.0, ramp_to=10.0, duration=10.0, process="steady")))
    assert len(observed) == 50
    for number, at in enumerate(observed):
        assert at == pytest.approx(math.sqrt(2 * (number + 0.5)), rel=1e-12)
    down = times(phases(Phase(rate=10.0, ramp_to=0.0, duration=10.0, process="steady")))
    assert len(down) == 50
    assert down == sorted(down)
    assert all(0 < at < 10 for at in down)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_poisson_ramp_follows_its_rate(seed: int) -> None:
    spec = phases(
        Phase(rate=5.0, duration=20.0),
        Phase(rate=10.0, ramp_to=200.0, duration=100.0),
        Phase(rate=0.0, duration=10.0),  # a quiet spell
        Phase(rate=150.0, ramp_to=20.0, duration=20.0),
    )
    observed = times(spec, seed)
    assert observed == sorted(observed)
    assert not [at for at in observed if 120.0 <= at < 130.0]

    def expected(t: float) -> float:
        return replace(spec, duration=t).expected_events() if t > 0 else 0.0

    assert abs(len(observed) - spec.expected_events()) <= 4 * math.sqrt(spec.expected_events())
    assert_poisson_counts(observed, expected, 150.0, 30)


def test_one_unit_stream_serves_every_poisson_phase() -> None:
    """Changing a later phase leaves the earlier arrivals as they were, and a rate
    change moves arrivals instead of drawing new ones."""
    first = Phase(rate=20.0, duration=5.0)
    a = times(phases(first, Phase(rate=50.0, duration=5.0)))
    b = times(phases(first, Phase(rate=80.0, duration=5.0)))
    assert [t for t in a if t < 5] == [t for t in b if t < 5]
    flat = times(phases(Phase(rate=20.0, duration=10.0)))
    poisson = times(Arrivals(rate=20.0, duration=10.0))
    assert flat == pytest.approx(poisson, rel=1e-9)


def test_phases_caps_and_expected_events() -> None:
    spec = phases(Phase(rate=10.0, duration=10.0), Phase(rate=10.0, ramp_to=30.0, duration=10.0))
    assert spec.total is None
    assert spec.duration is None
    assert spec.expected_events() == 300.0
    assert replace(spec, duration=15.0).expected_events() == pytest.approx(
        100 + 75
    )  # 5 s from 10/s to 20/s
    assert replace(spec, total=7).expected_events() == 7.0
    assert len(times(replace(spec, total=7))) == 7
    assert max(times(replace(spec, duration=15.0))) < 15.0


# -- the daily cycle ---------------------------------------------------------------------
def test_the_daily_cycle_follows_its_rate() -> None:
    spec = Arrivals(process="daily", peak=100.0, trough=10.0, period=100.0, duration=300.0)
    observed = times(spec, 3)
    cycle = DailyCycle.of(spec)
    assert cycle.rate(50.0) == pytest.approx(100.0)  # peak_at: half a period by default
    assert cycle.rate(0.0) == pytest.approx(10.0)
    assert_poisson_counts(observed, cycle.expected, 300.0, 30)
    busiest = max(
        range(10), key=lambda w: sum(1 for t in observed if w * 10 <= t % 100 < w * 10 + 10)
    )
    assert busiest in (4, 5)  # the windows either side of the peak
    assert spec.expected_events() == cycle.expected(300.0) == pytest.approx(16_500)


def test_the_daily_inverse_is_exact_even_where_the_rate_is_zero() -> None:
    cycle = DailyCycle(peak=40.0, trough=0.0, period=60.0, peak_at=15.0)
    at = 0.0
    for count in [0.001, 0.5, 3.0, 3.0, 299.9, 1200.0, 1200.5, 12_345.6]:
        at = cycle.inverse(count, at)
        assert cycle.expected(at) == pytest.approx(count, rel=1e-9, abs=1e-9)
    flat = Arrivals(process="daily", peak=20.0, trough=20.0, duration=10.0)
    assert times(flat) == pytest.approx(times(Arrivals(rate=20.0, duration=10.0)), rel=1e-9)


# -- validation, TOML and flags ----------------------------------------------------------
DAILY = "[arrivals]\nprocess = 'daily'\npeak = 10\ntrough = 2\n"
PHASE = "[[arrivals.phases]]\nrate = 1\nduration = 1\n"


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("[arrivals]\nprocess = 'phases'", "arrivals.phases", "required with process = 'phases'"),
        (
            "[arrivals]\nprocess = 'phases'\n" + PHASE * 2 + "[[arrivals.phases]]\nrate = 1\n"
            "duration = -2",
            "arrivals.phases[2].duration",
            "> 0",
        ),
        (PHASE + "[[arrivals.phases]]\nrate = 1", "arrivals.phases[1].duration", "required"),
        (PHASE.replace("rate", "rte"), "arrivals.phases[0].rte", "did you mean 'rate'"),
        (PHASE + "process = 'bursts'", "arrivals.phases[0].process", "'steady'"),
        (PHASE + "ramp_to = -1", "arrivals.phases[0].ramp_to", ">= 0"),
        (PHASE.replace("rate = 1", "rate = -1"), "arrivals.phases[0].rate", ">= 0"),
        ("[arrivals]\nphases = 3", "arrivals.phases", "array of tables ([[arrivals.phases]])"),
        (
            "[arrivals]\nprocess = 'phases'\n[[arrivals.phases]]\nrate = 1e6\nduration = 100",
            "arrivals.phases",
            "over the limit",
        ),
        ("[arrivals]\nprocess = 'daily'\ntrough = 1", "arrivals.peak", "required"),
        ("[arrivals]\nprocess = 'daily'\npeak = 1", "arrivals.trough", "required"),
        (DAILY.replace("2", "20"), "arrivals.trough", "<= peak (10.0)"),
        (DAILY + "period = 0", "arrivals.period", "> 0"),
        (DAILY.replace("10", "0"), "arrivals.peak", "> 0"),
        (DAILY + "duration = 1e7", "arrivals.duration", "over the limit"),
        ("[arrivals]\npeak_at = 'noon'", "arrivals.peak_at", "a number"),
        ("[arrivals]\nprocess = 'replay'", "arrivals.file", "required with process = 'replay'"),
        ("[arrivals]\nfile = 'log.txt'", "arrivals.file", "must end in .csv, .jsonl or .ndjson"),
        ("[arrivals]\nfile = 3", "arrivals.file", "a string"),
        ("[arrivals]\ntime_scale = 0", "arrivals.time_scale", "> 0"),
    ],
)
def test_bad_arrival_fields_are_named(text: str, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        sc.loads(text, source="my.toml")
    assert caught.value.field == field
    assert words in str(caught.value)
    assert str(caught.value).startswith(f"my.toml: field '{field}'")


def test_daily_and_replay_defaults() -> None:
    (daily,) = sc.loads(DAILY).arrivals
    assert daily.total == 1000  # endless: a total by default, as for poisson
    cycle = DailyCycle.of(daily)
    assert (cycle.period, cycle.peak_at) == (86_400.0, 43_200.0)
    (replayed,) = sc.loads("[arrivals]\nprocess = 'replay'\nfile = 'a.CSV'").arrivals
    assert (replayed.total, replayed.duration, replayed.time_scale) == (None, None, None)
    assert math.isnan(replayed.expected_events())


@pytest.mark.parametrize(
    "path", [EXAMPLES / "phases.toml", EXAMPLES / "replay.toml", "daily-cycle"]
)
def test_the_new_processes_round_trip_through_toml(path: Path | str) -> None:
    scenario = sc.resolve(str(path))
    assert sc.loads(scenario.to_toml()) == scenario
    printed = CliRunner().invoke(cli, ["simulate", "-s", str(path), "--print-scenario"])
    assert printed.exit_code == 0, printed.output
    assert sc.from_mapping(tomllib.loads(printed.stdout)) == scenario


def test_a_phases_scenario_as_toml_has_its_array_of_tables() -> None:
    scenario = Scenario(
        arrivals=(
            phases(
                Phase(rate=1.0, ramp_to=3.0, duration=2.0),
                Phase(rate=0.5, duration=1.0, process="steady"),
            ),
        )
    )
    text = scenario.to_toml()
    assert text.count("[[arrivals.phases]]") == 2
    assert "ramp_to = 3.0" in text
    assert text.index("[arrivals]") < text.index("[[arrivals.phases]]") < text.index("[partitions]")
    assert sc.loads(text) == scenario


def test_flags_set_what_makes_sense() -> None:
    daily = sc.builtin("daily-cycle")
    faster = sc.with_overrides(daily, {"arrivals.period": "60", "arrivals.peak": "150"})
    assert (faster.arrivals[0].period, faster.arrivals[0].peak) == (60.0, 150.0)
    assert {"arrivals.peak", "arrivals.time_scale"} <= set(sc.numeric_fields())
    assert "arrivals.phases" not in sc.settable_fields()
    with pytest.raises(ScenarioError, match="can only be set in a scenario file") as caught:
        sc.with_overrides(daily, {"arrivals.phases": "3"})
    assert caught.value.field == "arrivals.phases"
    constant = sc.with_overrides(daily, {"arrivals.process": "poisson", "arrivals.rate": "60"})
    assert constant.arrivals[0].peak == 100.0  # kept, and ignored by poisson
    assert sc.loads(constant.to_toml()) == constant
    capped = sc.with_overrides(sc.load_file(EXAMPLES / "phases.toml"), {"arrivals.total": "40"})
    assert len(arrivals(capped)) == 40


# -- replay ------------------------------------------------------------------------------
def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_replay_reads_csv_and_json_lines(tmp_path: Path) -> None:
    csv_path = write(
        tmp_path,
        "log.csv",
        "\ufeff time , partition_key,pool\n0,k1,ingest\n\n1.5,,\n1.5, k2 ,emails\n3,k1,\n",
    )
    expected = [
        Record(0.0, "k1", "ingest"),
        Record(1.5, None, None),
        Record(1.5, "k2", "emails"),
        Record(3.0, "k1", None),
    ]
    assert list(replay(csv_path)) == expected
    lines = [
        '{"time": 0, "partition_key": "k1", "pool": "ingest"}',
        "",
        '{"time": 1.5}',
        '{"time": 1.5, "partition_key": "k2", "pool": "emails"}',
        '{"time": 3, "partition_key": "k1", "pool": null}',
    ]
    for suffix in ("jsonl", "ndjson"):
        assert list(replay(write(tmp_path, f"log.{suffix}", "\n".join(lines) + "\n"))) == expected
    assert [r.time for r in replay(csv_path, time_scale=0.5)] == [0.0, 0.75, 0.75, 1.5]
    too_late = r"log\.csv:4: time 1\.5 \(x time_scale 1e\+300\) is past 1e\+09 s"
    with pytest.raises(ReplayError, match=too_late):  # every latency was 0 at such times
        list(replay(csv_path, time_scale=1e300))


@pytest.mark.parametrize(
    ("name", "text", "where", "words"),
    [
        ("a.csv", "time\n1\n0.5\n", "a.csv:3", "before the previous record's 1.0"),
        ("a.csv", "time,partition\n", "a.csv:1", "did you mean 'partition_key'"),
        ("a.csv", "partition_key\nk1\n", "a.csv:1", "no 'time' column"),
        ("a.csv", "time,pool\n1,a,b\n", "a.csv:2", "has 3 cells, the header 2"),
        ("a.csv", "time\nsoon\n", "a.csv:2", "time must be a number, got 'soon'"),
        ("a.csv", "time\n\n-1\n", "a.csv:3", "finite and >= 0"),
        ("a.csv", "time\ninf\n", "a.csv:2", "finite and >= 0"),
        ("a.csv", "time,partition_key\n,k1\n", "a.csv:2", "has no time"),
        ("a.csv", "time,pool\n1,no spaces\n", "a.csv:2", "pool name must be"),
        ("a.csv", "time,partition_key\n1," + "k" * 3000 + "\n", "a.csv:2", "over 2,048"),
        ("a.csv", "\n\n", "a.csv", "is empty"),
        ("a.csv", b"time\n\xff\n", "a.csv", "not UTF-8"),
        ("a.jsonl", '{"time": 1}\n{"time": NaN}\n', "a.jsonl:2", "finite"),
        ("a.jsonl", '{"time": 1}\n{"time": 2,}\n', "a.jsonl:2", "not valid JSON"),
        ("a.jsonl", "[1, 2]\n", "a.jsonl:1", "a JSON object"),
        ("a.jsonl", '{"time": true}\n', "a.jsonl:1", "a number"),
        ("a.jsonl", '{"tme": 1}\n', "a.jsonl:1", "did you mean 'time'"),
        ("a.ndjson", '{"time": 1, "partition_key": 7}\n', "a.ndjson:1", "must be a string"),
        ("a.txt", "time\n1\n", "a.txt", "must end in"),
    ],
)
def test_replay_errors_name_the_file_and_line(
    tmp_path: Path, name: str, text: str | bytes, where: str, words: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ReplayError) as caught:
        list(replay(path))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / where}: "), message
    assert words in message, message
    assert caught.value.field == "arrivals.file"
    assert isinstance(caught.value, ScenarioError)  # the CLI: a bad scenario, exit 2


def test_replay_missing_file_and_caps(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match=r"none\.csv: cannot be read"):
        list(replay(tmp_path / "none.csv"))
    path = write(tmp_path, "a.csv", "time\n" + "".join(f"{n}\n" for n in range(10)) + "x\n")
    spec = Arrivals(process="replay", file=str(path), total=4)
    assert [r.time for r in records(spec, random.Random(0))] == [0, 1, 2, 3]  # x: never read
    spec = replace(spec, total=None, duration=2.5, time_scale=0.5)
    assert [r.time for r in records(spec, random.Random(0))] == [0, 0.5, 1, 1.5, 2]


def test_replayed_keys_and_pools_reach_the_arrivals(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "time,partition_key,pool\n0,hot,\n1,,p2\n2,hot,\n3,,\n")
    spec = Arrivals(process="replay", file=str(path))
    two = (PoolTable("sim", {}), PoolTable("p2", {}))
    keyed = Scenario(routing="partition", arrivals=(spec,), pools=two)
    result = arrivals(keyed)
    assert [a.partition_key for a in result][::2] == ["hot", "hot"]
    picked = arrivals(
        replace(keyed, arrivals=(replace(spec, file=None, process="steady", total=4),))
    )
    # A record without a key gets the key that arrival would have had anyway; one
    # replayed into another pool gets one of that pool's keys.
    assert result[3].partition_key == picked[3].partition_key
    assert result[1].partition_key in {f"k{n}" for n in range(64)}
    assert [a.pool for a in result] == ["sim", "p2", "sim", "sim"]
    assert [a.partition_key for a in arrivals(replace(keyed, routing="round-robin"))] == [None] * 4
    with pytest.raises(ScenarioError, match="names pool 'p2', which the scenario does not have"):
        arrivals(replace(keyed, pools=two[:1]))


def test_a_replay_file_is_relative_to_its_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "design"
    folder.mkdir()
    write(folder, "log.jsonl", '{"time": 0.5}\n{"time": 1.0}\n')
    write(folder, "s.toml", "[arrivals]\nprocess = 'replay'\nfile = 'log.jsonl'\n")
    monkeypatch.chdir(tmp_path)
    scenario = sc.resolve("design/s.toml")
    assert scenario.arrivals[0].file == "design/log.jsonl"
    assert [a.time for a in arrivals(scenario)] == [0.5, 1.0]
    monkeypatch.chdir(folder)
    assert sc.loads(scenario.to_toml()).arrivals[0].file == "design/log.jsonl"  # as printed


def test_a_bad_replay_fails_before_the_store_is_made(tmp_path: Path) -> None:
    scenario = Scenario(arrivals=(Arrivals(process="replay", file=str(tmp_path / "none.csv")),))
    with pytest.raises(ReplayError):
        run(scenario, store=tmp_path / "store")
    assert not (tmp_path / "store").exists()
    result = CliRunner().invoke(
        cli,
        [
            "simulate",
            "--set",
            "arrivals.process=replay",
            "--set",
            f"arrivals.file={tmp_path}/x.csv",
        ],
    )
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        == f"Error: {tmp_path}/x.csv: cannot be read: No such file or directory"
    )


# -- runs ----------------------------------------------------------------------------------
def simulate_json(tmp_path: Path, name: str, *args: str) -> bytes:
    path = tmp_path / f"{name}.json"
    result = CliRunner().invoke(cli, ["simulate", *args, "-q", "--json", str(path)])
    assert result.exit_code == 0, result.output
    return path.read_bytes()


@pytest.mark.parametrize(
    "args",
    [
        ("-s", "daily-cycle", "--events", "300"),
        ("-s", str(EXAMPLES / "phases.toml"), "--events", "300"),
        ("-s", str(EXAMPLES / "replay.toml"), "--events", "300"),
    ],
    ids=["daily", "phases", "replay"],
)
def test_same_seed_same_bytes(tmp_path: Path, args: Iterable[str]) -> None:
    first = simulate_json(tmp_path, "a", *args)
    assert first == simulate_json(tmp_path, "b", *args)
    document = json.loads(first)
    assert document["events"]["offered"] == 300
    assert document["invariants_passed"] is True
    other = json.loads(simulate_json(tmp_path, "c", *args, "--seed", "2"))
    # The replay's log fixes times and keys, and its service time is fixed: no draw is left.
    assert (other["latency"] == document["latency"]) == ("replay.toml" in " ".join(args))


def test_daily_cycle_falls_behind_at_the_peak_where_the_mean_would_not() -> None:
    """The built-in's lesson on a smaller pool: one instance (20/s) for a 5-25/s cycle,
    over four cycles (one alone is at the mercy of its draws)."""
    small = {
        "instances": 1,
        "arrivals.trough": 5.0,
        "arrivals.peak": 25.0,
        "arrivals.period": 40.0,
        "arrivals.duration": 160.0,
    }
    daily = run(sc.with_overrides(sc.builtin("daily-cycle"), small)).result
    steady = sc.with_overrides(
        sc.builtin("daily-cycle"), {**small, "arrivals.process": "poisson", "arrivals.rate": 15.0}
    )
    constant = run(steady).result
    assert daily.passed
    assert daily.offered == constant.offered  # the same unit draws: the same events, moved
    assert daily.max_depth > 2 * constant.max_depth
    assert daily.latency.p50 > 3 * constant.latency.p50
    assert daily.latency.p99 > 2 * constant.latency.p99


def test_the_replay_example_drowns_one_instance() -> None:
    result = run(sc.load_file(EXAMPLES / "replay.toml")).result
    assert result.offered == result.succeeded == 457
    assert result.passed
    depths = sorted(i.max_depth for i in result.instances)
    assert depths[-1] > 80
    assert depths[-2] <= 5
