"""The simulator's duplicate arrivals: ``duplicate_share`` repeats recent arrivals' dedup
keys (seeded), ``dedup_window`` is the pools', and the report counts the duplicates
(docs/simulate.md, "Duplicate arrivals")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dopool._errors import ScenarioError
from dopool._sim import loading as sc
from dopool._sim.driver import run
from dopool._sim.figures import figures
from dopool._sim.scenario import Scenario
from dopool._sim.workload import arrivals


def scenario(**overrides: object) -> Scenario:
    base = sc.with_overrides(sc.builtin("steady"), {"arrivals.total": 400})
    return sc.with_overrides(base, overrides)


def test_a_share_of_arrivals_repeats_a_recent_key_drawn_from_the_seed() -> None:
    chosen = scenario(duplicate_share=0.25)
    keys = [arrival.dedup_key for arrival in arrivals(chosen)]
    assert all(key is not None for key in keys)
    repeats = len(keys) - len(set(keys))
    assert 60 < repeats < 140  # about a quarter of 400
    assert keys == [arrival.dedup_key for arrival in arrivals(chosen)]
    plain = arrivals(scenario())
    assert all(arrival.dedup_key is None for arrival in plain)
    # The other draws are untouched by the share: the same times and keys.
    assert [a.time for a in plain] == [a.time for a in arrivals(chosen)]


def test_the_report_counts_the_duplicates_and_the_books_balance(tmp_path: Path) -> None:
    chosen = scenario(duplicate_share=0.25, dedup_window=30.0)
    result = run(chosen).result
    assert result.passed, result.invariants
    assert result.duplicates > 0
    assert result.offered == result.acknowledged + result.duplicates
    assert result.succeeded == result.acknowledged
    document = result.to_json_dict()
    assert document["events"]["duplicates"] == result.duplicates
    assert figures(result)["duplicates"] == result.duplicates
    # A window that outlasts the run: every repeat of a key is a duplicate.
    keys = [arrival.dedup_key for arrival in arrivals(chosen)]
    assert result.duplicates == len(keys) - len(set(keys))


def test_without_a_window_a_finished_key_is_stored_again() -> None:
    held = run(scenario(duplicate_share=0.25, dedup_window=1e6)).result
    free = run(scenario(duplicate_share=0.25)).result
    assert free.duplicates < held.duplicates
    assert free.passed


def test_runs_with_duplicates_are_byte_identical(tmp_path: Path) -> None:
    chosen = scenario(duplicate_share=0.3, dedup_window=5.0)
    documents, traces = [], []
    for n in range(2):
        trace = tmp_path / f"t{n}.jsonl"
        documents.append(json.dumps(run(chosen, trace=trace).result.to_json_dict()))
        traces.append(trace.read_bytes())
    assert documents[0] == documents[1]
    assert traces[0] == traces[1]
    lines = [json.loads(line) for line in traces[0].splitlines()]
    outcomes = [line["outcome"] for line in lines if line["kind"] == "arrived"]
    assert outcomes.count("duplicate") == json.loads(documents[0])["events"]["duplicates"]


@pytest.mark.parametrize(
    ("field", "value"), [("duplicate_share", 1.5), ("duplicate_share", -0.1), ("dedup_window", -1)]
)
def test_bad_values_are_named(field: str, value: object) -> None:
    with pytest.raises(ScenarioError, match=field):
        scenario(**{field: value})


def test_a_pool_table_may_set_its_own(tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text(
        "\n".join(
            [
                "duplicate_share = 0.0",
                "[arrivals]",
                'process = "steady"',
                "rate = 50.0",
                "total = 200",
                'pool = "orders"',
                "[service]",
                "mean = 0.01",
                "[[pools]]",
                'name = "orders"',
                "duplicate_share = 0.5",
                "dedup_window = 100.0",
            ]
        ),
        encoding="utf-8",
    )
    result = run(sc.load_file(path)).result
    assert result.passed
    assert result.duplicates > 50
