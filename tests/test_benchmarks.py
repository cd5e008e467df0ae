"""The benchmark harness runs end to end and reports every target it measured.

Only that each figure was measured is checked: timings are never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.__main__ import main

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
