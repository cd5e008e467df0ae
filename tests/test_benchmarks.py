"""The benchmark harness runs end to end and reports every target it measured.

Only that each figure was measured is checked: timings are never asserted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmarks import (
    async_handlers,
    ceiling,
    connect,
    dedup,
    deploy,
    e2e,
    events,
    lateness,
    phases,
    ray_pools,
    records,
    redis_peers,
    simpy_model,
    simulate,
)
from benchmarks.__main__ import main
from benchmarks.harness import Sizes

from dopool._sim.driver import run
from dopool._sim.scenario import Scenario
from dopool._sim.sections import Partitions, Pause
from dopool._store.environment import Store

# Real processes and real time: run on CI's first Python only (.ci/run).
pytestmark = [pytest.mark.threaded, pytest.mark.slow]


def test_a_quick_run_measures_each_target_of_its_scenarios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "bench.json"
    scenarios = "sequential,enqueue_many,latency,raw,depth,scale"

    status = main(["--quick", "--only", scenarios, "--dir", str(tmp_path), "--json", str(report)])

    assert status == 0, capsys.readouterr().out
    document = json.loads(report.read_text(encoding="utf-8"))
    assert not document["failures"]
    measured = {(t["name"], t["label"]): t["value"] for t in document["targets"]}
    assert {name for name, _ in measured} == {"T3", "T4", "T5", "T6", "T7", "info"}
    assert [label for label, value in measured.items() if value is None] == []
    figures = {(f["scenario"], f["system"], f["metric"]) for f in document["figures"]}
    assert any(
        scenario == "depth" and system.startswith("LMDB") and metric == "RSS growth"
        for scenario, system, metric in figures
    )  # plain LMDB's memory for the same writes, which T6's verdict is read against
    assert ("sequential", "dopool sync", "enqueue, paused pool") in figures


@pytest.mark.parametrize("mode", ceiling.MODES)
@pytest.mark.parametrize("shape", ceiling.SHAPES)
def test_the_python_ceiling_runs_every_event_and_leaves_its_queues_empty(
    tmp_path: Path, shape: str, mode: str
) -> None:
    case = ceiling.end_to_end(shape, mode, Sizes(events=300, producers=3, concurrency=2))

    readings = case.run(tmp_path / "store")  # raises if a queue is not drained exactly

    assert [reading.metric for reading in readings] == ["end-to-end"]


def test_the_python_ceiling_check_finds_an_event_left_in_a_queue(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", durability="async")
    try:
        queue = ceiling._Queue(store, 0, 1, direct=True)
        queue.enqueue(b"record")  # committed; its thread never started, so never run
        with store.read() as txn, pytest.raises(RuntimeError, match="head 0, tail 1, done 0"):
            queue.check(txn)
    finally:
        store.close()


def test_the_record_benchmark_times_both_encodings(capsys: pytest.CaptureFixture[str]) -> None:
    assert records.main(["--rounds", "1", "--number", "10", "--e2e-us", "50"]) == 0
    out = capsys.readouterr().out
    for case in ("event write", "event read", "meta write", "meta read"):
        assert case in out
    assert "per event end to end" in out
    assert "of 50 µs per event" in out


def test_the_peers_run_beside_dopool_in_the_end_to_end_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SqliteHuey (with and without fsync) and persist-queue, from the dev extra, run the
    same end-to-end events as dopool; the targets compare them in the same run."""
    report = tmp_path / "bench.json"
    status = main(["--quick", "--only", "e2e", "--dir", str(tmp_path), "--json", str(report)])
    assert status == 0, capsys.readouterr().out
    document = json.loads(report.read_text(encoding="utf-8"))
    assert not document["failures"]
    assert not document["skipped"]
    systems = {f["system"] for f in document["figures"] if f["scenario"] == "e2e"}
    assert {"SqliteHuey fsync", "SqliteHuey no fsync", "persist-queue ack"} <= systems
    assert {"dopool sync", "dopool async"} <= systems
    compared = {t["label"]: t["value"] for t in document["targets"] if t["name"] in ("T1", "T2")}
    assert set(compared) == {
        "dopool sync e2e / SqliteHuey fsync e2e",
        "dopool sync e2e / persist-queue ack e2e",
        "dopool async e2e / SqliteHuey no fsync e2e",
    }
    assert all(value is not None and value > 0 for value in compared.values())


def test_the_e2e_case_runs_alone(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert e2e.main(["async", "--events", "200", "--dir", str(tmp_path)]) == 0
    assert "events/s" in capsys.readouterr().out


def test_the_dedup_benchmark_compares_each_keyed_variant_with_its_plain_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert dedup.main(["--events", "60", "--rounds", "1", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "60 events, 1 rounds, durability=async" in lines[0]
    rows = {line[2:36].strip(): line for line in lines[1:]}  # names padded to 34
    assert set(rows) == {name for name, _ in dedup.VARIANTS}
    assert rows["enqueue, dedup_key"].count("ratio") == 2  # enqueue and process
    assert rows["enqueue, duplicate"].count("ratio") == 1  # nothing to process
    assert "ratio" not in rows["enqueue"]
    assert "(wall)" in lines[0]


def test_the_dedup_benchmark_counts_cpu_time_if_told(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert dedup.main(["--events", "20", "--rounds", "1", "--dir", str(tmp_path), "--cpu"]) == 0
    assert "(CPU)" in capsys.readouterr().out.splitlines()[0]


def test_the_events_benchmark_measures_the_current_tree_and_a_baseline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    src = Path(events.__file__).resolve().parent.parent / "src"
    argv = ["--events", "20", "--rounds", "1", "--dir", str(tmp_path), "--baseline", str(src)]
    assert events.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "20 events, 1 rounds, durability=async" in lines[0]
    rows = {line[2:30].strip(): line for line in lines[1:]}
    assert set(rows) == {*events.SHARED, *events.MINE}
    assert all("ratio" in rows[name] for name in events.SHARED)
    assert not any("ratio" in rows[name] for name in events.MINE)


def test_the_phases_benchmark_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert phases.main(["--events", "100", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "enqueue" in out
    assert "process" in out


def test_the_deployment_benchmark_runs_each_system_in_processes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Producer processes, a dopool worker process, the peers' consumer processes: tiny."""
    options = ["--events", "40", "--producers", "2", "--concurrency", "2"]
    systems = ["dopool", "SqliteHuey", "persist-queue"]  # the Redis peers: below
    argv = [*options, "--modes", "async", "--systems", ",".join(systems), "--dir", str(tmp_path)]
    assert deploy.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[1] for line in lines] == systems
    assert all("events/s" in line and "x SqliteHuey" in line for line in lines)
    assert all(line.endswith("]") for line in lines)  # each row's durability
    assert list(tmp_path.iterdir()) == []  # every store removed


def _rates(lines: list[str]) -> list[float]:
    return [float(line.split("events/s")[0].split()[-1].replace(",", "")) for line in lines]


# CI installs redis-server and sets this: the Redis peers' tests then fail, naming it, if
# it is missing; elsewhere (the README's test command on a fresh machine) they skip.
REQUIRE_REDIS = "DOPOOL_REQUIRE_REDIS"


@pytest.fixture
def redis_server() -> None:
    """Skip (or, under ``DOPOOL_REQUIRE_REDIS=1``, fail) without ``redis-server``."""
    if shutil.which("redis-server") is None:
        why = "no redis-server on PATH: apt-get install redis-server"
        if os.environ.get(REQUIRE_REDIS) == "1":
            pytest.fail(f"{why} ({REQUIRE_REDIS}=1)")
        pytest.skip(why)


@pytest.mark.usefixtures("redis_server")
@pytest.mark.parametrize("peer", redis_peers.PEERS)
def test_the_deployment_benchmark_runs_each_redis_peer_against_its_own_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, peer: str
) -> None:
    """Its consumer process and producer processes, a fresh redis-server for each row:
    AOF always beside sync; no persistence and AOF everysec beside async."""
    options = ["--events", "200", "--producers", "2", "--concurrency", "2", "--modes", "sync,async"]
    assert deploy.main([*options, "--systems", peer, "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[:2] for line in lines] == [[m, peer] for m in ("sync", "async", "async")]
    assert [line.split("[")[-1] for line in lines] == [
        "Redis AOF, appendfsync always]",
        "Redis, no persistence]",
        "Redis AOF, appendfsync everysec]",
    ]
    assert all(rate > 0 for rate in _rates(lines))
    assert list(tmp_path.iterdir()) == []  # every server's directory removed


@pytest.mark.usefixtures("redis_server")
def test_the_e2e_case_runs_the_redis_peers_beside_dopool(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["sync", "--events", "200", "--concurrency", "2", "--dir", str(tmp_path), "--peers"]
    assert e2e.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("sync: ")
    assert [line.split()[1] for line in lines[1:]] == list(redis_peers.PEERS)
    assert all("x dopool  [Redis AOF, appendfsync always]" in line for line in lines[1:])
    assert all(rate > 0 for rate in _rates(lines))
    assert list(tmp_path.iterdir()) == []


def test_the_redis_peers_are_skipped_without_redis_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no redis-server on PATH, each peer says so and what installs it; dopool runs."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory
    options = ["--events", "40", "--producers", "1", "--modes", "async", "--dir", str(tmp_path)]

    assert deploy.main([*options, "--systems", ",".join(redis_peers.PEERS)]) == 0
    assert e2e.main(["async", "--events", "40", "--dir", str(tmp_path), "--peers"]) == 0

    deployed, alone = capsys.readouterr().out.split("async: ")
    for out in (deployed, alone):
        skipped = [line for line in out.splitlines() if "skipped" in line]
        assert [line.split(":")[0] for line in skipped] == list(redis_peers.PEERS)
        assert all("apt-get install redis-server" in line for line in skipped)
    assert "events/s" not in deployed
    assert "events/s" in alone  # dopool's own line


def test_a_redis_peer_whose_package_is_missing_is_skipped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "celery", None)  # as if not installed

    assert deploy.main(["--systems", "Celery", "--modes", "async", "--dir", str(tmp_path)]) == 0

    lines = capsys.readouterr().out.splitlines()[1:]
    assert lines == ["Celery: skipped, its package is not installed: pip install 'dopool[bench]'"]


def test_the_deployment_benchmark_refuses_an_unknown_system(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        deploy.main(["--systems", "dopool,Kafka", "--dir", str(tmp_path)])


def test_the_connect_benchmark_measures_wake_ups_and_polls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = ["--samples", "3", "--poll-samples", "2", "--poll-interval", "0.05"]
    assert connect.main([*options, "--durability", "async"]) == 0
    out = capsys.readouterr().out
    assert "through the owner     3 events" in out
    assert "stored, wake-up     3 events" in out
    assert "poll only      2 events" in out


@pytest.mark.ray
def test_the_ray_pools_benchmark_measures_a_call_throughput_and_latency_across_nodes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_pools.main(["--nodes", "2", "--events", "40", "--samples", "10"]) == 0
    out = capsys.readouterr().out
    assert "2 simulated node(s)" in out
    assert "a Ray actor call, node to node: p50" in out
    assert "throughput 2 producers (one a node) x 1 thread(s) x 20 events:" in out
    assert "enqueue-to-start    10 events" in out


def test_the_lateness_benchmark_measures_delayed_and_immediate_events(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = ["--samples", "5", "--low", "0.01", "--high", "0.02", "--durability", "async"]
    assert lateness.main(options) == 0
    out = capsys.readouterr().out
    assert "delayed        5 events" in out
    assert "immediate      5 events" in out


def test_the_async_handler_benchmark_measures_each_variant_beside_the_serial_reference(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Instances awaiting asyncio.sleep, awaiting ctx.sleep_async, blocking in time.sleep,
    and not sleeping: each measured, and each ratio of the wall times computed."""
    report = tmp_path / "async.json"

    status = async_handlers.main(["--quick", "--dir", str(tmp_path), "--json", str(report)])

    assert status == 0, capsys.readouterr().out
    document = json.loads(report.read_text(encoding="utf-8"))
    assert not document["failures"]
    figures = {(f["system"], f["metric"]) for f in document["figures"]}
    for variant in async_handlers.VARIANTS:
        assert (variant, async_handlers.WALL) in figures
        assert (variant, async_handlers.THREADS) in figures
        assert (variant, async_handlers.MEMORY) in figures
        assert ((variant, async_handlers.SLEEPS) in figures) == (variant in async_handlers.SLEEPING)
    ratios = {t["label"]: t["value"] for t in document["targets"]}
    assert len(ratios) == 5
    assert "serial 100 x 0.1 s (computed) / async def, asyncio.sleep" in ratios
    assert all(value is not None and value > 0 for value in ratios.values())
    assert [path.name for path in tmp_path.iterdir()] == ["async.json"]  # stores removed


def _benchmark(routing: str) -> Scenario:
    """Small and at 75% utilisation, so servers fall idle as well as queue."""
    chosen = simulate.scenario(events=2_000, instances=4, rate=60.0, seed=3)
    if routing == "round-robin":
        return chosen
    return dataclasses.replace(
        chosen, routing="partition", partitions=Partitions(keys=500, zipf=0.8)
    )


@pytest.mark.parametrize("routing", ["round-robin", "partition"])
def test_the_simpy_model_gives_each_event_dopools_latency(routing: str) -> None:
    chosen = _benchmark(routing)
    result = run(chosen).result

    model = simpy_model.run(chosen)

    assert result.passed
    assert len(result.latencies) == len(model.in_system) == 2_000
    assert sorted(model.in_system) == pytest.approx(sorted(result.latencies), rel=1e-9)
    mine, theirs = result.latency, model.latency
    for name in ("mean", "p50", "p99", "max"):
        assert getattr(theirs, name) == pytest.approx(getattr(mine, name), rel=1e-9), name


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"failure_probability": 0.1}, "failures"),
        ({"duration": 5.0, "max_queue_depth": 10}, "a max_queue_depth, a duration"),
        ({"pauses": (Pause(at=1.0, duration=1.0),)}, "pauses"),
    ],
)
def test_the_simpy_model_refuses_what_it_does_not_model(change: dict[str, Any], named: str) -> None:
    chosen = dataclasses.replace(_benchmark("round-robin"), **change)

    with pytest.raises(ValueError, match=f"scenario 'benchmark' has {named}$"):
        simpy_model.run(chosen)


def test_the_simulator_benchmark_reports_simpy_beside_dopool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, alone = tmp_path / "sim.json", tmp_path / "alone.json"

    status = simulate.main(["--events", "2000", "--instances", "4", "--json", str(report)])
    simulate.main(["--events", "200", "--instances", "4", "--no-simpy", "--json", str(alone)])

    assert status == 0, capsys.readouterr().out
    document = json.loads(report.read_text(encoding="utf-8"))
    assert document["simpy_events_per_wall_second"] > 0
    assert document["ratio_to_simpy"] > 0
    agreement = document["latency_agreement"]
    assert agreement["agree"] is True
    assert agreement["dopool"]["count"] == agreement["simpy"]["count"] == 2_000
    assert "SimPy" in capsys.readouterr().out
    assert "simpy_events_per_wall_second" not in json.loads(alone.read_text(encoding="utf-8"))


def test_the_deployment_benchmark_runs_two_dopool_workers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    options = ["--events", "40", "--producers", "2", "--concurrency", "2", "--workers", "2"]
    argv = [*options, "--systems", "dopool", "--modes", "async", "--dir", str(tmp_path)]
    assert deploy.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert "2 dopool worker process(es)" in out[0]
    assert [line.split()[1] for line in out[1:]] == ["dopool"]
    assert list(tmp_path.iterdir()) == []
