"""The benchmark harness runs end to end and reports every target it measured.

Only that each figure was measured is checked: timings are never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import ceiling, e2e, phases, records
from benchmarks.__main__ import main
from benchmarks.harness import Sizes

from dopool._storage import Store

pytestmark = pytest.mark.threaded


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


def test_the_e2e_case_runs_alone(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert e2e.main(["async", "--events", "200", "--dir", str(tmp_path)]) == 0
    assert "events/s" in capsys.readouterr().out


def test_the_phases_benchmark_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert phases.main(["--events", "100", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "enqueue" in out
    assert "process" in out
