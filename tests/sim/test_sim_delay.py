"""The simulator's delayed arrivals: ``delayed_share`` enqueues a seeded share of a pool's
arrivals with its ``delay``; no event starts before it is due, instances start their
events by due time, latency runs from the end of the delay, and the report counts them
(docs/simulate.md, "Delayed arrivals")."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from cli_support import invoke
from dopool._errors import ScenarioError
from dopool._sim import loading as sc
from dopool._sim.columns import Times
from dopool._sim.driver import run
from dopool._sim.figures import figures
from dopool._sim.metrics import Collector
from dopool._sim.order import check_delayed_order
from dopool._sim.scenario import Scenario
from dopool._sim.workload import arrivals


def scenario(base: str = "steady", /, **overrides: object) -> Scenario:
    chosen = sc.with_overrides(sc.builtin(base), {"arrivals.total": 400})
    return sc.with_overrides(chosen, overrides)


def test_a_seeded_share_of_arrivals_is_delayed_and_the_other_draws_stay() -> None:
    chosen = scenario(delayed_share=0.25, delay=30.0)
    delays = [arrival.delay for arrival in arrivals(chosen)]
    assert set(delays) == {None, 30.0}
    assert 60 < delays.count(30.0) < 140  # about a quarter of 400
    assert delays == [arrival.delay for arrival in arrivals(chosen)]
    plain = arrivals(scenario())
    assert all(arrival.delay is None for arrival in plain)
    assert [(a.time, a.partition_key) for a in plain] == [
        (a.time, a.partition_key) for a in arrivals(chosen)
    ]


@pytest.mark.parametrize("base", ["steady", "hot-partition"])
def test_no_event_starts_before_it_is_due_and_starts_follow_due_times(
    base: str, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    result = run(scenario(base, delayed_share=0.5, delay=0.5), trace=trace).result
    assert result.passed, result.invariants
    assert result.delayed > 0
    due: dict[tuple[int, int], float] = {}
    first_start: dict[tuple[int, int], float] = {}
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        slot = (record["instance_index"], record["sequence"])
        if record["kind"] == "arrived" and "delay" in record:
            due[slot] = record["time"] + record["delay"]
        elif record["kind"] == "started":
            first_start.setdefault(slot, record["time"])
    assert len(due) == result.delayed
    assert all(first_start[slot] >= at for slot, at in due.items())


def test_latency_runs_from_the_end_of_the_delay() -> None:
    quiet = {"arrivals.rate": 1.0, "arrivals.total": 100}
    delayed = run(scenario(delayed_share=1.0, delay=100.0, **quiet)).result
    plain = run(scenario(**quiet)).result
    assert delayed.delayed == 100
    # Hardly any queueing at this rate: the latency is about the service time either way.
    assert delayed.latency.mean < 1.0
    assert delayed.latency.mean == pytest.approx(plain.latency.mean, rel=0.5)
    assert delayed.virtual_time > plain.virtual_time + 99  # the delays took virtual time


def test_the_report_json_and_figures_count_the_delayed(tmp_path: Path) -> None:
    chosen = scenario(delayed_share=0.25, delay=5.0)
    result = run(chosen).result
    expected = sum(arrival.delay is not None for arrival in arrivals(chosen))
    assert result.delayed == expected
    assert result.to_json_dict()["events"]["delayed"] == expected
    assert result.pools[0].to_json_dict()["delayed"] == expected
    assert figures(result)["delayed"] == expected
    assert "delayed" not in run(scenario()).result.to_json_dict()["events"]


def test_runs_with_delays_are_byte_identical(tmp_path: Path) -> None:
    outputs = []
    for attempt in range(2):
        path = tmp_path / f"run{attempt}.json"
        args = ["simulate", "--events", "300", "--delayed-share", "0.3", "--delay", "2"]
        done = invoke(*args, "--seed", "5", "--json", str(path))
        assert done.exit_code == 0, done.output
        assert "delayed)" in done.output
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"delayed_share": 0.5}, "delay"),
        ({"delayed_share": 0.5, "delay": 0.0}, "delay"),
        ({"delayed_share": 1.5, "delay": 1.0}, "delayed_share"),
        ({"delayed_share": 0.5, "delay": -1.0}, "delay"),
        ({"delayed_share": 0.5, "delay": 4e7}, "delay"),
    ],
)
def test_a_bad_delay_names_its_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario(**overrides)
    assert caught.value.field.endswith(field)


def test_the_end_of_run_check_finds_an_early_start_and_an_out_of_order_one() -> None:
    collector = Collector("p", delays=True)
    collector.enqueued_at.put((0, 0), 0.0)
    collector.enqueued_at.put((0, 1), 0.0)
    collector.enqueued_at.put((0, 2), 0.0)
    due = Times()
    due.put((0, 0), 10.0)  # #0 delayed to 10, #1 and #2 due at once
    track = collector.tracks[0]
    track.first_starts = array("q", [0, 2, 1])
    track.first_started_at = array("d", [5.0, 11.0, 12.0])
    check_delayed_order(collector, due)
    found = " | ".join(collector.order_violations)
    assert "started #0 at 5, before it was due at 10" in found
    assert "started #2 (due 0) after #0 (due 10)" in found
    assert "started #1 (due 0) after #2 (due 0)" in found
