"""The ``dopool`` command line, end to end through click's test runner.

Each test checks the exit code and what reaches stdout and stderr: a report, a
table, or one ``Error: ...`` line that names what is wrong.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

import dopool
from cli_support import assert_one_line_error, held_by_child, invoke
from dopool import EventContext, Runtime
from dopool._chaos import harness, runner
from dopool._cli import simulate as simulate_command
from dopool._cli._values import _json_text, _short
from dopool._sim import loading as sc
from dopool._store.environment import Store
from dopool._store.layout import (
    MAX_CONCURRENCY,
    DeadRecord,
    Meta,
    Namespace,
    pack,
    pool_key,
    seal,
    seal_meta,
)
from dopool._store.txn import Txn
from worker_support import TESTS

SMALL = ("--events", "150")  # keeps each simulation to a fraction of a second


# -- simulate ----------------------------------------------------------------------------
def test_simulate_prints_a_report() -> None:
    result = invoke("simulate", "--scenario", "steady", "--seed", "7", *SMALL)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "dopool simulate · steady · seed 7" in out
    for heading in ("events", "throughput", "latency", "enqueue wait", "faults", "instances"):
        assert heading in out
    assert "150 offered · 150 enqueued · 150 succeeded" in out
    assert "0 lost" in out
    assert "invariants" in out
    assert "FAIL" not in out
    assert out.count("pass") >= 4
    assert "events per wall second" in out


def test_simulate_defaults_to_the_steady_scenario() -> None:
    result = invoke("simulate", *SMALL)
    assert result.exit_code == 0
    assert "· steady ·" in result.stdout


@pytest.mark.parametrize("name", sc.BUILTINS)
def test_every_builtin_runs_by_name(name: str) -> None:
    result = invoke("simulate", "-s", name, "-q", *SMALL)
    assert result.exit_code == 0, result.output
    assert f"· {name} ·" in result.stdout


def test_flags_change_the_scenario() -> None:
    result = invoke(
        "simulate",
        "--instances",
        "3",
        "--routing",
        "partition",
        "--keys",
        "5",
        "--service",
        "fixed",
        "--service-mean",
        "0.01",
        "--set",
        "faults.crash_before_execute=0.05",
        *SMALL,
    )
    assert result.exit_code == 0, result.output
    assert "3 instances, partition routing" in result.stdout
    assert "crashes" in result.stdout


def test_a_description_changed_by_flags_is_marked_as_the_base_scenarios(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        'name = "mine"\ndescription = "Two calm instances."\ninstances = 2\n'
        "[arrivals]\ntotal = 40\n"
    )
    plain = invoke("simulate", "-s", str(mine), "--seed", "3", "-q")
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.splitlines()[1] == "Two calm instances."  # a seed changes no design
    assert "changed by flags" not in plain.stdout
    json_path = tmp_path / "r.json"
    result = invoke(
        "simulate",
        *("-s", "steady", "--instances", "16", "--rate", "250", "--events", "60", "-q"),
        *("--json", str(json_path)),
    )
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())  # rich wraps long lines
    assert "base scenario 'steady', before the flags: Four instances at 50% utilisation" in out
    assert (
        "changed by flags: instances 4 → 16, arrivals.rate 40 → 250, arrivals.total 2000 → 60"
        in out
    )
    document = json.loads(json_path.read_text())
    assert document["changed_by_flags"] == [
        {"field": "instances", "from": 4, "to": 16},
        {"field": "arrivals.rate", "from": 40.0, "to": 250.0},
        {"field": "arrivals.total", "from": 2000, "to": 60},
    ]
    assert list(document)[:2] == ["scenario", "changed_by_flags"]
    printed = invoke("simulate", "-s", "steady", "--instances", "16", "--print-scenario")
    assert printed.stdout.startswith(
        "# built-in scenario 'steady' changed by flags: instances 4 → 16\n"
        "# (its description is of the scenario before the flags)\n"
    )
    assert sc.from_mapping(tomllib.loads(printed.stdout)).instances == 16
    result = invoke("simulate", "-s", str(mine), "--events", "30", "--instances", "3", "-q")
    out = " ".join(result.stdout.split())
    assert "base scenario 'mine', before the flags: Two calm instances." in out
    assert "changed by flags: instances 2 → 3, arrivals.total 40 → 30" in out
    printed = invoke("simulate", "-s", str(mine), "--instances", "3", "--print-scenario")
    assert printed.stdout.startswith(f"# scenario file {str(mine)!r} changed by flags: ")
    told = invoke("simulate", *SMALL, "-q", "--instances", "3", "--set", "description=Three now.")
    lines = told.stdout.splitlines()
    assert lines[1] == "Three now."  # a description the flags gave is the run's own
    assert lines[2] == "changed by flags: instances 4 → 3, arrivals.total 2000 → 150"


def test_a_run_cut_short_reports_its_unfinished_events(tmp_path: Path) -> None:
    json_path = tmp_path / "r.json"
    result = invoke(
        "simulate",
        *("--instances", "2", "--service", "fixed", "--service-mean", "2", "--duration", "3"),
        *(*SMALL, "-q", "--json", str(json_path)),
    )
    assert result.exit_code == 0, result.output
    document = json.loads(json_path.read_text())
    unfinished = document["unfinished"]
    out = " ".join(result.stdout.split())
    assert f"{document['latency']['count']} finished events only" in out
    assert (
        f"unfinished {unfinished['events']} events when the run stopped at 3.0 virtual s: "
        f"{unfinished['pending']} pending (2 in a handler), "
        f"{unfinished['waiting_enqueue']} enqueues waiting" in out
    )
    assert "a censored sample: the percentiles are optimistic" in out
    assert document["latency"]["censored"] is True


def test_print_scenario_gives_toml_that_loads_back() -> None:
    result = invoke("simulate", "-s", "crash-storm", "--instances", "6", "--print-scenario")
    assert result.exit_code == 0
    loaded = sc.from_mapping(tomllib.loads(result.stdout))
    assert loaded.instances == 6
    assert loaded.kills == sc.builtin("crash-storm").kills


def test_list_names_every_builtin() -> None:
    result = invoke("simulate", "--list")
    assert result.exit_code == 0
    for name in sc.BUILTINS:
        assert name in result.stdout


def test_a_scenario_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\ninstances = 2\n[arrivals]\nprocess = "steady"\nrate = 10.0\ntotal = 40\n'
    )
    result = invoke("simulate", "--scenario", str(path))
    assert result.exit_code == 0, result.output
    assert "· mine ·" in result.stdout
    assert "40 succeeded" in result.stdout


def test_json_and_trace_are_byte_identical_for_the_same_seed(tmp_path: Path) -> None:
    outputs = []
    for run in range(2):
        json_path = tmp_path / f"r{run}.json"
        trace_path = tmp_path / f"r{run}.jsonl"
        result = invoke(
            "simulate",
            "-s",
            "crash-storm",
            "--seed",
            "3",
            "--events",
            "200",
            "--json",
            str(json_path),
            "--trace",
            str(trace_path),
        )
        assert result.exit_code == 0, result.output
        assert f"wrote json {json_path}, trace {trace_path}" in result.stdout
        outputs.append((json_path.read_bytes(), trace_path.read_bytes()))
    assert outputs[0] == outputs[1]
    document = json.loads(outputs[0][0])
    assert document["scenario"]["seed"] == 3
    assert document["events"]["lost"] == 0
    assert document["invariants_passed"] is True
    assert "wall" not in outputs[0][0].decode()
    lines = [json.loads(line) for line in outputs[0][1].splitlines()]
    assert lines[0]["kind"] == "arrived"
    assert sum(line["kind"] == "arrived" for line in lines) == document["events"]["offered"]
    event = next(line for line in lines if line["kind"] != "arrived")
    assert list(event) == ["kind", "pool", "instance_index", "sequence", "attempt", "time", "error"]
    other = tmp_path / "other.json"
    invoke("simulate", "-s", "crash-storm", "--seed", "4", "--events", "200", "--json", str(other))
    assert other.read_bytes() != outputs[0][0]


def test_sweep_prints_one_row_per_value(tmp_path: Path) -> None:
    json_path = tmp_path / "sweep.json"
    result = invoke(
        "simulate", "--sweep", "instances=1,2,4", *SMALL, "--json", str(json_path), "-q"
    )
    assert result.exit_code == 0, result.output
    assert "dopool simulate · steady · sweep instances · seed 1" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines()]
    assert [row[0] for row in rows if row and row[0] in {"1", "2", "4"}] == ["1", "2", "4"]
    header = " ".join(result.stdout.splitlines()[1:3])
    for column in ("utilisation", "mean", "p99", "throughput", "dead_lettered", "pending"):
        assert column in header
    assert "±" not in result.stdout  # one seed: no interval
    assert "3 runs · wall time" in result.stdout
    document = json.loads(json_path.read_text())
    assert document["sweep"]["values"] == {"instances": [1, 2, 4]}
    assert [p["figures"]["offered"]["values"] for p in document["points"]] == [[150.0]] * 3
    assert document["points"][0]["figures"]["p99"]["half_width"] is None


def test_sweep_a_float_field() -> None:
    result = invoke("simulate", "--sweep", "service.mean=0.01,0.02", *SMALL)
    assert result.exit_code == 0, result.output
    assert "0.01" in result.stdout
    assert "0.02" in result.stdout


GRID = ("--sweep", "instances=1,2", "--sweep", "arrivals.rate=20,40", "--repeat", "2")


def _sweep_output(tmp_path: Path, name: str, *args: str) -> tuple[str, bytes]:
    """The table without its wall-time line, and the JSON's bytes."""
    json_path = tmp_path / f"{name}.json"
    result = invoke("simulate", *GRID, *SMALL, "--json", str(json_path), "-q", *args)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if "wall time" not in line]
    return "\n".join(lines).replace(name, "NAME"), json_path.read_bytes()


def test_a_grid_with_repeats_shows_mean_and_interval(tmp_path: Path) -> None:
    table, raw = _sweep_output(tmp_path, "grid")
    assert "sweep instances, arrivals.rate · seeds 1..2, mean ± 95% interval" in table
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert [row[:2] for row in rows] == [["1", "20"], ["1", "40"], ["2", "20"], ["2", "40"]]
    assert all("±" in " ".join(row) for row in rows)
    assert all(row[-1] == "pass" for row in rows)
    document = json.loads(raw)
    point = document["points"][3]
    assert point["values"] == {"instances": 2, "arrivals.rate": 40.0}
    assert point["seeds"] == [1, 2]
    p99 = point["figures"]["p99"]
    values = p99["values"]
    assert p99["mean"] == pytest.approx(sum(values) / 2)
    # two seeds: t(1) * stdev / sqrt(2), and the stdev of two values is |a - b| / sqrt(2)
    assert p99["half_width"] == pytest.approx(12.706205 * abs(values[0] - values[1]) / 2)


def test_jobs_change_nothing_in_the_output_and_json_repeats_byte_for_byte(
    tmp_path: Path,
) -> None:
    one = _sweep_output(tmp_path, "one", "--jobs", "1")
    again = _sweep_output(tmp_path, "again", "--jobs", "1")
    two = _sweep_output(tmp_path, "two", "--jobs", "2")
    assert one == again
    assert two == one


def test_jobs_default_to_the_usable_cpus_and_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dopool._sim import sweep

    monkeypatch.setattr(sweep, "usable_cpus", lambda: 3)
    execute = sweep._execute
    asked: list[int] = []

    def counting(work: Any, jobs: int, progress: Any) -> list[sweep.Outcome]:
        asked.append(jobs)
        return execute(work, jobs, progress)

    monkeypatch.setattr(sweep, "_execute", counting)
    spread = _sweep_output(tmp_path, "spread")
    alone = _sweep_output(tmp_path, "alone", "--jobs", "1")
    assert asked == [3, 1]
    assert spread == alone


def test_repeat_alone_is_a_one_point_sweep() -> None:
    result = invoke("simulate", "--repeat", "3", *SMALL, "--sweep-figures", "p50,retries")
    assert result.exit_code == 0, result.output
    assert "dopool simulate · steady · seeds 1..3, mean ± 95% interval" in result.stdout
    assert "p50" in result.stdout
    assert "retries" in result.stdout
    assert "p99" not in result.stdout
    assert "3 runs" in result.stdout


def test_a_sweep_with_a_broken_invariant_prints_its_table_then_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dopool._sim import sweep

    honest = sweep.run_one

    def broken(scenario: Any, store: str | None, point: str = "") -> sweep.Outcome:
        outcome = honest(scenario, store, point)
        if scenario.instances == 2 and scenario.seed == 2:
            return sweep.Outcome({**outcome.figures, "invariants_passed": 0.0}, ("no loss",))
        return outcome

    monkeypatch.setattr(sweep, "run_one", broken)
    json_path = tmp_path / "broken.json"
    result = invoke(
        "simulate", "--sweep", "instances=1,2", "--repeat", "2", *SMALL, "--json", str(json_path),
        "--sweep-figures", "p99,invariants_passed", "--jobs", "1",  # the patch is this process's
    )  # fmt: skip
    assert result.exit_code == 1
    assert "FAIL 1/2" in result.stdout
    assert "0.5 ± 6.4" in result.stdout  # invariants_passed: the share of seeds that passed
    assert result.stderr.strip() == (
        "Error: invariants failed at instances=2 (seed 2); see the table above"
    )
    document = json.loads(json_path.read_text())
    assert document["points"][1]["invariants_failed"] == [{"seed": 2, "checks": ["no loss"]}]


def test_a_sweep_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "sweep.png"
    result = invoke(
        "simulate", "--sweep", "instances=1..3", *SMALL, "--plot", str(target), "-q",
        "--plot-figure", "mean",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"wrote plot {target}" in result.stdout
    assert target.read_bytes().startswith(b"\x89PNG")
    refused = invoke("simulate", "--repeat", "2", *SMALL, "--plot", str(tmp_path / "p.png"))
    assert_one_line_error(refused, 2, "--plot with --repeat needs a --sweep")


def test_store_keeps_the_simulated_store_for_status(tmp_path: Path) -> None:
    store = tmp_path / "sim-store"
    result = invoke(
        "simulate", "-s", "poison", "--store", str(store), "--poison-share", "0.1", *SMALL
    )
    assert result.exit_code == 0, result.output
    status = invoke("status", str(store))
    assert status.exit_code == 0
    assert "pool sim · 4 instances · 150 enqueued" in status.stdout
    letters = invoke("dead-letters", str(store))
    assert letters.exit_code == 0
    assert "PoisonEventError" in letters.stdout


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "plot.png"
    result = invoke("simulate", "-s", "maintenance", *SMALL, "--plot", str(target))
    assert result.exit_code == 0, result.output
    assert target.read_bytes().startswith(b"\x89PNG")


def test_plot_without_matplotlib_fails_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = invoke("simulate", "--plot", str(tmp_path / "p.png"))
    assert_one_line_error(result, 1, "--plot needs matplotlib", "'plot' extra", "'.[plot]'")
    assert not (tmp_path / "p.png").exists()


# -- simulate: errors ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--rate", "-5"), ("--rate", "field 'arrivals.rate'", "> 0")),
        (("--instances", "0"), ("--instances", "field 'instances'", ">= 1")),
        (("--instances", "many"), ("--instances", "an integer")),
        (("--max-queue-depth", "-1"), ("--max-queue-depth", "max_queue_depth")),
        (("--set", "arrivals.rte=3"), ("arrivals.rte", "did you mean 'arrivals.rate'")),
        (("--set", "faults.storage_error=0.9"), ("faults.storage_error", "<= 0.5")),
        (("--set", "nonsense"), ("--set expects FIELD=VALUE",)),
        (("--set", "pauses=1"), ("pauses", "scenario file")),
        (("--sweep", "routing=a,b"), ("--sweep", "'routing'", "not a numeric")),
        (("--sweep", "instances=1,x"), ("instances", "an integer")),
        (("--sweep", "instances"), ("--sweep expects FIELD=V1,V2",)),
        (("--sweep", "instances=1", "--sweep", "instances=2"), ("swept twice",)),
        (("--sweep", "instances=8..2x2"), ("--sweep instances=8..2x2", "ends below")),
        (("--sweep", "service.mean=0.1..0.3"), ("needs a step",)),
        (("--sweep", "instances=0,1"), ("--sweep instances=0", "field 'instances'", ">= 1")),
        (("--repeat", "0"), ("--repeat", "1<=x<=1000")),
        (("--jobs", "2"), ("--jobs needs --sweep or --repeat",)),
        (("--plot-figure", "p99"), ("--plot-figure needs --sweep or --repeat",)),
        (("--repeat", "2", "--sweep-figures", "p98"), ("'p98'", "did you mean 'p99'")),
        (("--repeat", "2", "--sweep-figures", ","), ("--sweep-figures: no figure",)),
        (("--scenario", "hot-partitions"), ("hot-partitions", "neither a built-in")),
        (("--scenario", "missing.toml"), ("missing.toml", "cannot be read")),
        (("--routing", "random"), ("--routing", "random")),
        (("--bogus",), ("No such option", "--bogus")),
    ],
)
def test_bad_flags_are_one_line_naming_the_field(args: tuple[str, ...], words: tuple[str]) -> None:
    assert_one_line_error(invoke("simulate", *args), 2, *words)


def test_a_bad_scenario_file_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[service]\ndistribution = "exponential"\nmean = "slow"\n')
    assert_one_line_error(
        invoke("simulate", "-s", str(path)), 2, "bad.toml", "field 'service.mean'", "a number"
    )
    path.write_text("[arrivals\n")
    assert_one_line_error(invoke("simulate", "-s", str(path)), 2, "bad.toml", "not valid TOML")
    path.write_bytes(b"name = '\xff'\n")
    assert_one_line_error(
        invoke("simulate", "-s", str(path)), 2, "bad.toml", "not UTF-8 text", "at byte 8"
    )


def test_a_scenario_name_is_text_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The progress bar read it as rich markup ("[/bold]" raised MarkupError, a traceback
    # on every terminal), and the title printed its control characters raw.
    terminal = io.StringIO()
    monkeypatch.setattr(
        simulate_command,
        "_console",
        lambda *, stderr=False: Console(file=terminal, force_terminal=True, width=100),
    )
    path = tmp_path / "named.toml"
    path.write_text('name = "x[/bold]y\\u001b[2J"\n', encoding="utf-8")
    for sweep in ((), ("--sweep", "instances=1,2", "--jobs", "1")):
        result = invoke("simulate", "-s", str(path), "--events", "5", *sweep)
        assert result.exit_code == 0, result.output
        assert "dopool simulate · x[/bold]y\\x1b[2J ·" in terminal.getvalue()


def test_bad_output_paths(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "r.json"
    assert_one_line_error(
        invoke("simulate", "--json", str(missing)), 2, "--json", str(missing), "does not exist"
    )
    assert_one_line_error(
        invoke("simulate", "--sweep", "instances=1,2", "--trace", str(tmp_path / "t")),
        2,
        "--trace cannot be used with --sweep",
    )
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("")
    assert_one_line_error(
        invoke("simulate", "--store", str(full), *SMALL), 1, "not an empty directory"
    )


@pytest.mark.parametrize("flag", ["--json", "--trace", "--plot"])
def test_an_output_path_that_cannot_be_written_is_a_usage_error_before_the_run(
    tmp_path: Path, flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "file"
    file.write_text("")
    for target, words in (
        (tmp_path / "missing" / "out", "does not exist"),
        (file / "out", "is not a directory"),
    ):
        # Checked before the run: a run of this size would take minutes.
        result = invoke("simulate", flag, str(target), "--events", "1000000")
        assert_one_line_error(result, 2, flag, str(target), words)
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    existing = read_only / "old"
    existing.write_text("")
    # As root, permissions do not refuse anything: ask os.access to say what they would.
    real_access = os.access
    refused = {str(read_only), str(existing)}
    monkeypatch.setattr(
        os,
        "access",
        lambda path, mode, **kw: (
            not (mode & os.W_OK and str(path) in refused) and real_access(path, mode, **kw)
        ),
    )
    for target in (read_only / "new", existing):
        result = invoke("simulate", flag, str(target), "--events", "1000000")
        assert_one_line_error(result, 2, flag, str(target), "not writable")


# -- status and dead-letters --------------------------------------------------------------------
@pytest.fixture
def real_store(tmp_path: Path) -> Path:
    """A real-clock store with dead letters, and a paused pool with pending events."""
    store = tmp_path / "store"

    def execute(ctx):  # type: ignore[no-untyped-def]
        if ctx.event.get("bad"):
            raise ValueError(f"bad event {ctx.event['n']}")

    with Runtime(store) as runtime:
        pool = runtime.define("emails", execute=execute, concurrency=2)
        for n in range(6):
            pool.enqueue({"n": n, "bad": n % 3 == 0}, partition_key=f"user-{n}")
        assert pool.join(timeout=10)
        pool.pause()
        pool.enqueue({"n": 100})
        pool.enqueue({"n": 101})
        other = runtime.define("reports", execute=lambda ctx: None)
        other.enqueue("r")
        assert other.join(timeout=10)
    return store


@pytest.mark.threaded
def test_status_prints_every_pool(real_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe's width: each line whole
    result = invoke("status", str(real_store))
    assert result.exit_code == 0, result.output
    out = result.stdout
    title = "pool emails · 2 instances · 8 enqueued · 2 pending"
    assert f"{title} · 4 succeeded · 2 dead-lettered" in out
    assert "paused as a whole" in out
    assert "pool reports · 1 instance" in out
    assert "emails:1" in out
    assert "paused" in out


def test_status_lists_the_instances_used_a_page_at_a_time(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("rooms", execute=lambda ctx: None, concurrency=1_000_000)
        used = sorted({pool.enqueue(n, partition_key=f"room-{n}").instance_index for n in range(5)})
        assert pool.join()
    whole = json.loads(invoke("status", str(store), "--json").stdout)["pools"][0]
    assert [s["index"] for s in whole["instances"]] == used
    assert (whole["concurrency"], whole["used"], whole["succeeded"]) == (1_000_000, 5, 5)
    page = json.loads(invoke("status", str(store), "--json", "--limit", "2").stdout)["pools"][0]
    assert [s["index"] for s in page["instances"]] == used[:2]
    after = ["--from", str(used[1] + 1), "--limit", "2"]
    rest = json.loads(invoke("status", str(store), "--json", *after).stdout)["pools"][0]
    assert [s["index"] for s in rest["instances"]] == used[2:4]
    assert rest["succeeded"] == 5  # the sums stay the whole pool's
    text = invoke("status", str(store), "--limit", "2").stdout
    assert "1,000,000 instances ·" in text
    assert "5 of the 1,000,000 instances used, 2 listed" in text
    assert invoke("status", str(store), "--limit", "-1").exit_code == 2  # refused by name


def test_status_counts_scheduled_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe's width: each line whole
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        pool = runtime.define("later", execute=lambda ctx: None, concurrency=2)
        pool.enqueue_many(["a", "b", "c"], delay=60)
        pool.enqueue("now", partition_key="k")
    result = invoke("status", str(store))
    assert result.exit_code == 0, result.output
    assert "4 enqueued · 4 pending (3 scheduled) · 0 succeeded" in result.stdout
    assert "scheduled" in result.stdout.splitlines()[1]  # the column
    document = json.loads(invoke("status", str(store), "--json").stdout)
    (pool_status,) = document["pools"]
    assert (pool_status["pending"], pool_status["scheduled"]) == (4, 3)
    assert [i["scheduled"] for i in pool_status["instances"]] == [2, 1]
    assert [i["next_alarm_at"] for i in pool_status["instances"]] == [60.0, 0.0]  # "k": 1


@pytest.mark.threaded
def test_status_json_and_one_pool(real_store: Path) -> None:
    result = invoke("status", str(real_store), "--pool", "emails", "--json")
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    (pool,) = document["pools"]
    assert pool["name"] == "emails"
    assert pool["pending"] == 2
    assert [i["state"] for i in pool["instances"]] == ["paused", "paused"]


@pytest.mark.threaded
def test_status_errors(tmp_path: Path, real_store: Path) -> None:
    assert_one_line_error(invoke("status", str(tmp_path / "nope")), 1, "no dopool store", "nope")
    assert_one_line_error(invoke("status", str(tmp_path)), 1, "no dopool store", "data/data.mdb")
    assert_one_line_error(
        invoke("status", str(real_store), "--pool", "sms"),
        1,
        "no pool named 'sms'",
        "emails, reports",
    )


@pytest.mark.threaded
def test_dead_letters_list_redrive_purge(real_store: Path) -> None:
    listed = invoke("dead-letters", str(real_store))
    assert listed.exit_code == 0, listed.output
    assert "2 dead letters" in listed.stdout
    assert "ValueError: bad event 0" in listed.stdout
    as_json = json.loads(invoke("dead-letters", str(real_store), "--json").stdout)["dead_letters"]
    assert [(d["pool"], d["event"]["n"]) for d in as_json] == [("emails", 0), ("emails", 3)] or [
        (d["pool"], d["event"]["n"]) for d in as_json
    ] == [("emails", 3), ("emails", 0)]
    redriven = invoke("dead-letters", str(real_store), "--pool", "emails", "--redrive")
    assert redriven.exit_code == 0, redriven.output
    assert "redrove 2 dead letters of pool 'emails'" in redriven.stdout
    assert (
        json.loads(invoke("status", str(real_store), "--json").stdout)["pools"][0]["pending"] == 4
    )
    assert "no dead letters" in invoke("dead-letters", str(real_store)).stdout
    purged = invoke("dead-letters", str(real_store), "--purge")
    assert purged.exit_code == 0
    assert "purged 0 dead letters of pool 'emails'" in purged.stdout
    assert_one_line_error(
        invoke("dead-letters", str(real_store), "--redrive", "--purge"), 2, "exclude each other"
    )


@pytest.mark.threaded
def test_dead_letters_limit(real_store: Path) -> None:
    result = invoke("dead-letters", str(real_store), "--limit", "1")
    assert result.exit_code == 0
    assert "1 more: raise --limit" in result.stdout


@pytest.mark.threaded
@pytest.mark.parametrize("limit", ["-1", "-100"])
@pytest.mark.parametrize("json_flag", [(), ("--json",)], ids=["table", "json"])
def test_dead_letters_a_negative_limit_is_a_usage_error(
    real_store: Path, limit: str, json_flag: tuple[str, ...]
) -> None:
    """It was taken silently: the table listed no dead letter, the JSON an empty list."""
    result = invoke("dead-letters", str(real_store), "--limit", limit, *json_flag)
    assert_one_line_error(result, 2, "'--limit'", limit, "x>=0")


@pytest.mark.threaded
def test_dead_letters_a_limit_of_zero_lists_only_the_counts(real_store: Path) -> None:
    table = invoke("dead-letters", str(real_store), "--limit", "0")
    assert table.exit_code == 0, table.output
    assert table.stdout.startswith("2 dead letters in")
    assert "2 more: raise --limit" in table.stdout
    document = json.loads(invoke("dead-letters", str(real_store), "--limit", "0", "--json").stdout)
    assert (document["matched"], document["total"], document["dead_letters"]) == (2, 2, [])


@pytest.fixture
def aged_store(tmp_path: Path) -> Path:
    """Dead letters that failed two hours ago and one hour ago, by the wall clock.

    Pool ``jobs`` (2 instances): 0 (key a, TimeoutError) and 1 (key b, ValueError) two
    hours ago, 2 (key a, TimeoutError) and 3 (no key, ValueError) one hour ago; pool
    ``other``: 4 (key a, TimeoutError) two hours ago.
    """
    store = tmp_path / "store"

    def execute(ctx: EventContext) -> None:
        kind = TimeoutError if ctx.event["timeout"] else ValueError
        raise kind(f"event {ctx.event['n']}")

    plan = [(0, True, "a", 0), (1, False, "b", 0), (2, True, "a", 3600), (3, False, None, 3600)]
    start = time.time() - 7200
    with Runtime.simulated(store, start=start) as runtime:
        jobs = runtime.define("jobs", execute=execute, concurrency=2)
        other = runtime.define("other", execute=execute)
        other.enqueue({"n": 4, "timeout": True}, partition_key="a")
        for n, timeout, key, at in plan:
            runtime.clock.run_until(start + at)  # type: ignore[attr-defined]
            jobs.enqueue({"n": n, "timeout": timeout}, partition_key=key)
            assert jobs.join(timeout=10)
        assert other.join(timeout=10)
    return store


def listed_numbers(store: Path, *args: str) -> tuple[int, int, list[int]]:
    """``dead-letters --json``'s matched and total counts, and the events' numbers."""
    result = invoke("dead-letters", str(store), "--json", *args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    numbers = sorted(letter["event"]["n"] for letter in document["dead_letters"])
    return document["matched"], document["total"], numbers


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), (5, 5, [0, 1, 2, 3, 4])),
        (("--error", "TimeoutError"), (3, 5, [0, 2, 4])),
        (("--error", "event 1"), (1, 5, [1])),
        (("--partition-key", "a"), (3, 5, [0, 2, 4])),
        (("--older-than", "90m"), (3, 5, [0, 1, 4])),
        (("--older-than", "5400"), (3, 5, [0, 1, 4])),
        (("--older-than", "1.5h"), (3, 5, [0, 1, 4])),
        (("--older-than", "0.05d"), (3, 5, [0, 1, 4])),  # 72 minutes
        (("--older-than", "30 s"), (5, 5, [0, 1, 2, 3, 4])),
        (("--older-than", "3h"), (0, 5, [])),
        (("--pool", "jobs", "--instance", "0"), None),
        (("--pool", "jobs", "--error", "Timeout", "--older-than", "1d"), (0, 4, [])),
        (("--pool", "jobs", "--error", "Timeout", "--partition-key", "a"), (2, 4, [0, 2])),
        (("--pool", "jobs", "--partition-key", "a", "--older-than", "90m"), (1, 4, [0])),
    ],
)
def test_dead_letters_filters_choose_what_is_listed(
    aged_store: Path, args: tuple[str, ...], expected: tuple[int, int, list[int]] | None
) -> None:
    if expected is None:  # one instance: whichever the events were routed to
        with Runtime.simulated(aged_store) as runtime:
            pool = runtime.define("jobs", execute=lambda ctx: None, concurrency=2)
            on_zero = sorted(letter.event["n"] for letter in pool.dead_letters(0))
        expected = (len(on_zero), len(on_zero), on_zero)
    assert listed_numbers(aged_store, *args) == expected


def test_dead_letters_filtered_listing_says_how_many_match(aged_store: Path) -> None:
    out = invoke("dead-letters", str(aged_store), "--error", "TimeoutError").stdout
    assert out.startswith(f"3 of 5 dead letters in {aged_store} match")
    assert out.count("  error: TimeoutError: event") == 3  # (and each traceback ends with it)
    out = invoke("dead-letters", str(aged_store), "--partition-key", "zzz").stdout
    assert out.startswith(f"store {aged_store}: none of its 5 dead letters match")
    assert invoke("dead-letters", str(aged_store)).stdout.startswith("5 dead letters in")


def test_dead_letters_act_only_on_what_matches(aged_store: Path) -> None:
    def dead_lettered() -> dict[str, tuple[int, int]]:
        document = json.loads(invoke("status", str(aged_store), "--json").stdout)
        return {
            pool["name"]: (pool["dead_lettered"], pool["pending"]) for pool in document["pools"]
        }

    assert dead_lettered() == {"jobs": (4, 0), "other": (1, 0)}
    redriven = invoke(
        "dead-letters", str(aged_store), "--pool", "jobs", "--error", "Timeout", "--redrive"
    )
    assert redriven.exit_code == 0, redriven.output
    assert redriven.stdout == (
        "redrove 2 dead letters of pool 'jobs' (2 matched; a worker serving their instances "
        "runs them)\n"
    )
    assert listed_numbers(aged_store) == (3, 3, [1, 3, 4])
    assert dead_lettered() == {"jobs": (4, 2), "other": (1, 0)}  # redriven: pending again

    purged = invoke("dead-letters", str(aged_store), "--older-than", "90m", "--purge", "--json")
    assert purged.exit_code == 0, purged.output
    assert json.loads(purged.stdout) == {
        "action": "purge",
        "pools": [
            {"pool": "jobs", "matched": 1, "purged": 1},
            {"pool": "other", "matched": 1, "purged": 1},
        ],
    }
    assert listed_numbers(aged_store) == (1, 1, [3])
    assert dead_lettered() == {"jobs": (4, 2), "other": (1, 0)}  # a purge changes no counter
    nothing = invoke("dead-letters", str(aged_store), "--partition-key", "a", "--purge")
    assert nothing.stdout == (
        "purged 0 dead letters of pool 'jobs' (0 matched)\n"
        "purged 0 dead letters of pool 'other' (0 matched)\n"
    )


@pytest.mark.parametrize("command", ["pause", "resume", "drain"])
@pytest.mark.parametrize("index", ["-1", "-5"])
def test_control_a_negative_instance_is_a_usage_error(
    tmp_path: Path, command: str, index: str
) -> None:
    """It was an error of the store (exit 1, 'no instance -1'), found after opening it."""
    store = tmp_path / "store"
    with Runtime.simulated(store) as runtime:
        runtime.define("jobs", execute=lambda ctx: None, concurrency=2)
    result = invoke(command, str(store), "--pool", "jobs", "--instance", index)
    assert_one_line_error(result, 2, "'--instance'", index, "x>=0")
    result = invoke(command, str(tmp_path / "missing"), "--pool", "jobs", "--instance", index)
    assert_one_line_error(result, 2, "'--instance'")  # before the store is opened


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("--instance", "0"), 2, ("--instance needs --pool",)),
        (("--pool", "jobs", "--instance", "2"), 1, ("pool 'jobs' has no instance 2",)),
        (("--pool", "jobs", "--instance", "-1"), 2, ("--instance",)),
        (("--older-than", "5x"), 2, ("--older-than", "'5x' is no age", "90s, 5m, 2h or 1d")),
        (("--older-than", "-1"), 2, ("--older-than", "is no age")),
        (("--older-than", "9" * 400), 2, ("--older-than", "is no age")),
        (("--older-than", ""), 2, ("--older-than", "is no age")),
        (("--older-than", "1h", "--redrive", "--purge"), 2, ("exclude each other",)),
    ],
)
def test_dead_letters_filter_errors_are_one_line(
    aged_store: Path, args: tuple[str, ...], code: int, words: tuple[str, ...]
) -> None:
    for action in ((), ("--redrive",), ("--purge",)):
        if action and "--redrive" in args:
            continue
        assert_one_line_error(invoke("dead-letters", str(aged_store), *args, *action), code, *words)
    assert listed_numbers(aged_store)[0] == 5  # nothing changed


HOLDER = """
import sys
from dopool import Runtime
runtime = Runtime(sys.argv[1])
print("holding", flush=True)
sys.stdin.readline()
runtime.close()
"""


@pytest.fixture
def held(real_store: Path) -> Iterator[tuple[Path, int]]:
    """The store, held open by a runtime in another process; yields (path, its pid)."""
    with held_by_child(HOLDER, real_store) as child:
        yield real_store, child.pid


@pytest.mark.threaded
def test_status_and_listing_work_beside_a_live_runtime(held: tuple[Path, int]) -> None:
    store, _ = held
    result = invoke("status", str(store))
    assert result.exit_code == 0, result.output
    assert "pool emails" in result.stdout
    assert invoke("dead-letters", str(store)).exit_code == 0


@pytest.mark.threaded
def test_acting_on_dead_letters_works_beside_the_runtime_holding_the_store(
    held: tuple[Path, int],
) -> None:
    """Live, as pause is: one write per instance through the store, its owner woken (the
    owner here defined no pool, so the redriven events wait in the store)."""
    store, _ = held
    with dopool.connect(store) as connection:
        pending = connection.pool("emails").status().pending
    redriven = invoke("dead-letters", str(store), "--pool", "emails", "--redrive")
    assert redriven.exit_code == 0, redriven.output
    assert "redrove 2 dead letters of pool 'emails'" in redriven.stdout
    with dopool.connect(store) as connection:
        emails = connection.pool("emails")
        assert (emails.status().pending, emails.dead_letters()) == (pending + 2, [])
    purged = invoke("dead-letters", str(store), "--purge")
    assert purged.exit_code == 0, purged.output


# -- stores that cannot be written, or were crafted --------------------------------------------
def make_store(
    path: Path, error: str = "boom", partition_key: str | None = None, event: Any = "e"
) -> Path:
    """A simulated store: pool ``jobs`` (2 instances) with one dead letter, ``event``."""

    def execute(ctx: EventContext) -> None:
        raise ValueError(error)

    with Runtime.simulated(path) as runtime:
        pool = runtime.define("jobs", execute=execute, concurrency=2)
        pool.enqueue(event, partition_key=partition_key)
        assert pool.join()
    return path


@pytest.mark.parametrize("action", ["--purge", "--redrive"])
def test_acting_on_dead_letters_needs_no_store_lock(tmp_path: Path, action: str) -> None:
    """A producer's write: the store lock (a runtime's) is neither taken nor needed."""
    store = make_store(tmp_path / "store")
    (store / "lock").unlink()
    (store / "lock").mkdir()  # no runtime could take it
    done = invoke("dead-letters", str(store), action)
    assert done.exit_code == 0, done.output
    assert "1 dead letters of pool 'jobs'" in done.stdout


@pytest.mark.parametrize("action", ["--purge", "--redrive"])
def test_acting_on_a_read_only_store_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    store = make_store(tmp_path / "store")
    real_open = os.open

    def read_only(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert_one_line_error(
        invoke("dead-letters", str(store), action), 1, "Read-only file system", "lock"
    )


def craft(store: Path, *changes: Callable[[Store, Txn], None]) -> Path:
    """Write records the engine never would, through the storage layer."""
    opened = Store(store)
    try:
        with opened.write() as txn:
            for change in changes:
                change(opened, txn)
    finally:
        opened.close()
    return store


JOBS = pool_key("jobs")  # the pool record of make_store's pool


def put_pool(body: Any) -> Callable[[Store, Txn], None]:
    """A pool record for ``jobs`` sealed as the engine would, around any body."""
    return lambda store, txn: txn.put(JOBS, seal(JOBS, pack(body)))


def copy_pool_to(key: bytes) -> Callable[[Store, Txn], None]:
    """The pool record of ``jobs`` under another key, sealed for that key."""
    return lambda store, txn: txn.put(key, seal(key, txn.get(JOBS)[4:]))


def meta_of(index: int) -> bytes:
    return Namespace("jobs", index).meta_key


def dead_key(index: int, sequence: int) -> bytes:
    return Namespace("jobs", index).dead_letter_key(sequence)


def first_dead_letter(store: Store, txn: Txn) -> tuple[int, int, DeadRecord]:
    for index in range(2):
        for sequence, record in Namespace("jobs", index).iter_dead_letters(txn):
            return index, sequence, record
    raise AssertionError("the store has no dead letter")


def replace_dead_letter(**fields: Any) -> Callable[[Store, Txn], None]:
    def change(store: Store, txn: Txn) -> None:
        index, sequence, record = first_dead_letter(store, txn)
        Namespace("jobs", index).put_dead_letter(txn, sequence, record._replace(**fields))

    return change


def set_meta(**fields: Any) -> Callable[[Store, Txn], None]:
    """The meta of jobs:0 with ``fields`` changed, sealed as it is (a save would also
    index it, and a crafted field may be of no type the indexes take)."""

    def change(store: Store, txn: Txn) -> None:
        namespace = Namespace("jobs", 0)
        meta = namespace.load_meta(txn)
        for name, value in fields.items():
            setattr(meta, name, value)
        txn.put(namespace.meta_key, seal_meta(namespace.meta_key, meta))

    return change


BAD_POOL_RECORDS: list[tuple[str, Callable[[Store, Txn], None], tuple[str, ...]]] = [
    ("a-map", put_pool({"concurrency": 2}), ("pool record 'jobs'", "not an array of 2")),
    ("format-8", put_pool([2]), ("pool record 'jobs'", "not an array of 2")),
    ("str-concurrency", put_pool(["2", False]), ("pool record 'jobs'", "concurrency' is '2'")),
    ("float-concurrency", put_pool([2.5, False]), ("jobs", "concurrency' is 2.5")),
    ("zero-concurrency", put_pool([0, False]), ("jobs", "concurrency' is 0")),
    ("negative-concurrency", put_pool([-3, False]), ("jobs", "concurrency' is -3")),
    ("over-the-maximum", put_pool([MAX_CONCURRENCY + 1, False]), ("jobs", "4294967297")),
    ("paused-not-a-flag", put_pool([2, "yes"]), ("jobs", "paused' is 'yes'")),
    (
        "undecodable",
        lambda store, txn: txn.put(JOBS, seal(JOBS, b"\xc1")),
        ("pool record 'jobs'", "does not decode"),
    ),
    (
        "unsealed",
        lambda store, txn: txn.put(JOBS, b"\xc1"),
        ("pool record 'jobs'", "shorter than its checksum"),
    ),
    ("name-not-utf8", copy_pool_to(b"P\xff\xfejobs"), ("pool record", "UTF-8", "xff")),
]


@pytest.mark.parametrize(
    ("change", "words"),
    [(change, words) for _, change, words in BAD_POOL_RECORDS],
    ids=[name for name, _, _ in BAD_POOL_RECORDS],
)
@pytest.mark.parametrize("command", ["status", "dead-letters"])
def test_a_crafted_pool_record_is_one_line_naming_it(
    tmp_path: Path, command: str, change: Callable[[Store, Txn], None], words: tuple[str, ...]
) -> None:
    store = craft(make_store(tmp_path / "store"), change)
    assert_one_line_error(invoke(command, str(store)), 1, *words)
    assert_one_line_error(invoke(command, str(store), "--json"), 1, *words)


BAD_INSTANCE_RECORDS: list[tuple[str, str, Callable[[Store, Txn], None], tuple[str, ...]]] = [
    (
        "meta-undecodable",
        "status",
        lambda store, txn: txn.put(meta_of(1), b"\xc1"),
        ("meta record", "jobs:1"),
    ),
    (
        "meta-too-long",
        "status",
        lambda store, txn: txn.put(meta_of(0), pack(list(range(99)))),
        ("meta record", "jobs:0"),
    ),
    ("meta-str-counter", "status", set_meta(pending="many"), ("meta record", "jobs:0", "pending")),
    ("meta-bad-current", "status", set_meta(current=b"x"), ("meta record", "jobs:0")),
    ("meta-str-alarm", "status", set_meta(alarm="soon"), ("meta record", "jobs:0", "alarm")),
]


DAMAGED_DEAD_LETTERS: list[tuple[str, Callable[[Store, Txn], None], str]] = [
    ("unsealed", lambda store, txn: txn.put(dead_key(1, 7), b"\xc1"), "shorter than its checksum"),
    ("str-time", replace_dead_letter(failed_at="yesterday"), "field 'failed_at' is 'yesterday'"),
    ("int-error", replace_dead_letter(error=17), "field 'error' is 17"),
]


@pytest.mark.parametrize(
    ("change", "reason"),
    [(change, reason) for _, change, reason in DAMAGED_DEAD_LETTERS],
    ids=[name for name, _, _ in DAMAGED_DEAD_LETTERS],
)
def test_a_damaged_dead_letter_is_listed_as_damaged(
    tmp_path: Path, change: Callable[[Store, Txn], None], reason: str
) -> None:
    store = craft(make_store(tmp_path / "store"), change)
    result = invoke("dead-letters", str(store))
    assert result.exit_code == 0, result.output
    assert f"DamagedRecordError: {reason}" in result.stdout
    assert "damaged record: never redriven" in result.stdout
    letters = json.loads(invoke("dead-letters", str(store), "--json").stdout)["dead_letters"]
    assert [letter["damaged"] for letter in letters].count(True) == 1


def test_a_dead_letter_whose_event_does_not_decode_is_listed_with_its_bytes(
    tmp_path: Path,
) -> None:
    store = craft(make_store(tmp_path / "store"), replace_dead_letter(event=b"\xc1"))
    result = invoke("dead-letters", str(store))
    assert result.exit_code == 0, result.output
    assert "event: b'\\xc1'" in result.stdout


def test_a_stray_key_among_dead_letters_is_left_to_dopool_check(tmp_path: Path) -> None:
    stray = Namespace("jobs", 0).dead_letter_key(0)[:-8] + b"1"  # too short for a sequence
    store = craft(make_store(tmp_path / "store"), lambda store, txn: txn.put(stray, b"\xc0"))
    assert invoke("dead-letters", str(store)).exit_code == 0
    checked = invoke("check", str(store))
    assert checked.exit_code == 1
    assert "a key of no known kind" in checked.stdout


@pytest.mark.parametrize(
    ("command", "change", "words"),
    [(command, change, words) for _, command, change, words in BAD_INSTANCE_RECORDS],
    ids=[name for name, _, _, _ in BAD_INSTANCE_RECORDS],
)
def test_a_crafted_instance_record_is_one_line_naming_it(
    tmp_path: Path, command: str, change: Callable[[Store, Txn], None], words: tuple[str, ...]
) -> None:
    store = craft(make_store(tmp_path / "store"), change)
    assert_one_line_error(invoke(command, str(store)), 1, *words)
    assert_one_line_error(invoke(command, str(store), "--json"), 1, *words)


def test_acting_on_a_store_with_a_crafted_meta_record_is_one_line(tmp_path: Path) -> None:
    store = craft(make_store(tmp_path / "store"), lambda s, txn: txn.put(meta_of(1), b"\xc1"))
    for action in ("--purge", "--redrive"):
        assert_one_line_error(
            invoke("dead-letters", str(store), action), 1, "meta record", "jobs:1"
        )


@pytest.mark.parametrize("alarm", [1e300, -1e300, 1e15, 2.0**63])
def test_status_prints_an_alarm_time_out_of_the_calendar(tmp_path: Path, alarm: float) -> None:
    store = craft(make_store(tmp_path / "store"), set_meta(alarm=alarm))
    result = invoke("status", str(store))
    assert result.exit_code == 0, result.output
    assert "jobs:0" in result.stdout


HOSTILE = "\x1b[2J\x1b]0;pwned\x07 [bold red]loud[/] \x9b31m \x7f\r\nnext line\x00"


BIDI_CONTROLS = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}


def assert_inert(text: str) -> None:
    """No control character but line ends reached the terminal, and no markup was applied."""
    controls = {char for char in text if unicodedata.category(char) == "Cc"} - {"\n"}
    controls |= {char for char in text if unicodedata.bidirectional(char) in BIDI_CONTROLS}
    assert not controls, controls


def test_dead_letters_escape_control_characters_and_markup(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store", error=HOSTILE, partition_key="key\x1b[1m\x85\u202e")
    result = invoke("dead-letters", str(store))
    assert result.exit_code == 0, result.output
    assert_inert(result.stdout)
    assert "\\x1b[2J\\x1b]0;pwned\\x07 [bold red]loud[/] \\x9b31m \\x7f" in result.stdout
    assert "\\r\\nnext line\\x00" in result.stdout
    assert "key key\\x1b[1m\\x85\\u202e" in result.stdout
    document = json.loads(invoke("dead-letters", str(store), "--json").stdout)
    assert document["dead_letters"][0]["error"] == (f"ValueError: {HOSTILE}")


def test_status_escapes_a_crafted_pool_name(tmp_path: Path) -> None:
    name = "jobs\x1b]0;t\x07[bold]x[/bold]\n"

    def used(store: Store, txn: Txn) -> None:  # an instance of it used, so listed
        Namespace(name, 1).save_meta(txn, Meta())

    store = craft(make_store(tmp_path / "store"), copy_pool_to(pool_key(name)), used)
    result = invoke("status", str(store))
    assert result.exit_code == 0, result.output
    assert_inert(result.stdout)
    assert "pool jobs\\x1b]0;t\\x07[bold]x[/bold]\\n · 2 instances" in result.stdout
    assert "jobs\\x1b]0;t\\x07[bold]x[/bold]\\n:1" in result.stdout
    missing = invoke("status", str(store), "--pool", "nope")
    assert_one_line_error(missing, 1, "no pool named 'nope'", "jobs\\x1b]0;t\\x07[bold]x")
    assert_inert(missing.stderr)


@pytest.mark.parametrize(
    "args", [("status",), ("dead-letters",), ("dead-letters", "--purge")], ids=" ".join
)
def test_a_path_the_system_refuses_is_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    too_long = str(tmp_path / ("x" * 5000))  # ENAMETOOLONG, for root too
    assert_one_line_error(invoke(*args, too_long), 1, "File name too long")


def test_a_crafted_lock_holder_is_one_inert_line(tmp_path: Path) -> None:
    store = make_store(tmp_path / "store")
    with (store / "lock").open("r+") as lock:  # a holder that names itself with escapes
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("pid 1\x1b]0;pwned\x07\nError: fake second line")
        lock.flush()
        worker = [sys.executable, "-m", "dopool", "worker", "_worker_app:app"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS / "support"), *sys.path])}
        result = subprocess.run(
            [*worker, "--store", str(store)],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    # One holder per line of the file: shown joined by "; ", each escaped.
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: ")
    assert "is locked by pid 1\\x1b]0;pwned\\x07; Error: fake" in line
    assert_inert(result.stderr)


def strict_json(text: str) -> Any:
    """Parse JSON as a strict parser would: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not valid JSON")

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))  # the deep-nesting test's 1,000 levels
    try:
        document = json.loads(text, parse_constant=refuse)
        json.dumps(document, allow_nan=False)
    finally:
        sys.setrecursionlimit(limit)
    return document


def test_dead_letters_json_maps_what_json_cannot_hold(tmp_path: Path) -> None:
    event = {
        b"k": 1,
        "bytes": b"\x00\xff",
        "floats": [math.nan, math.inf, -math.inf, 1.5],
        3: {"nested": {None: True, 2.5: [b""]}},
    }
    store = make_store(tmp_path / "store", event=event)
    result = invoke("dead-letters", str(store), "--json")
    assert result.exit_code == 0, result.output
    (letter,) = strict_json(result.stdout)["dead_letters"]
    assert letter["event"] == {
        "$map": [
            [{"$base64": "aw=="}, 1],
            ["bytes", {"$base64": "AP8="}],
            ["floats", [{"$float": "NaN"}, {"$float": "Infinity"}, {"$float": "-Infinity"}, 1.5]],
            [3, {"nested": {"$map": [[None, True], [2.5, [{"$base64": ""}]]]}}],
        ]
    }
    assert "dead letter" in invoke("dead-letters", str(store)).stdout


def test_non_finite_stored_times_are_damage_not_output(tmp_path: Path) -> None:
    store = craft(make_store(tmp_path / "store"), set_meta(alarm=math.nan))
    assert_one_line_error(invoke("status", str(store), "--json"), 1, "field 'alarm' is nan")
    store = craft(make_store(tmp_path / "other"), replace_dead_letter(failed_at=math.inf))
    (letter,) = strict_json(invoke("dead-letters", str(store), "--json").stdout)["dead_letters"]
    assert letter["damaged"]
    assert letter["error"] == "DamagedRecordError: field 'failed_at' is inf"


def test_a_deeply_nested_event_is_listed_and_written_as_json(tmp_path: Path) -> None:
    event: Any = "bottom"
    for _ in range(1_000):  # msgpack encodes about 1,000 levels, Python's repr fewer
        event = [event]
    store = make_store(tmp_path / "store", event=event)
    listed = invoke("dead-letters", str(store))
    assert listed.exit_code == 0, listed.output
    assert "event: [[[[" in listed.stdout
    as_json = invoke("dead-letters", str(store), "--json")
    assert as_json.exit_code == 0, as_json.output
    (letter,) = strict_json(as_json.stdout)["dead_letters"]
    depth, inner = 0, letter["event"]
    while isinstance(inner, list):
        depth, inner = depth + 1, inner[0]
    assert (depth, inner) == (1_000, "bottom")


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
EVENT_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner)
        | st.dictionaries(st.text() | st.integers() | st.binary(), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_json_text_is_json_dumps_where_json_holds_the_value(value: Any) -> None:
    assert _json_text(value) == json.dumps(value, indent=2)


@given(EVENT_VALUES)
def test_short_is_repr_cut_to_width(value: Any) -> None:
    text = repr(value)
    assert _short(value, 10**9) == text
    width = max(1, len(text) // 2)
    assert _short(value, width) == (text if len(text) <= width else text[: width - 1] + "…")


# -- the command itself ----------------------------------------------------------------------------
@pytest.mark.parametrize("command", [(), ("simulate",), ("status",), ("dead-letters",)])
def test_help(command: tuple[str, ...]) -> None:
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert "Usage: " in result.stdout


def test_unknown_command_is_one_line() -> None:
    assert_one_line_error(invoke("simulat"), 2, "No such command 'simulat'")


def test_the_console_script_runs() -> None:
    script = shutil.which("dopool")
    if script is None:
        pytest.skip("the dopool console script is not installed (pip install -e '.[dev]')")
    done = subprocess.run(
        [script, "simulate", "-s", "steady", "--events", "50", "--seed", "1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "dopool simulate · steady · seed 1" in done.stdout
    missing = subprocess.run(
        [script, "status", "/nonexistent/dopool-store"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("Error: no dopool store")
    assert "Traceback" not in missing.stderr


# -- chaos ------------------------------------------------------------------------------


def test_chaos_runs_seeded_scenarios_and_reports_no_violation() -> None:
    result = invoke("chaos", "--seeds", "3", "--start", "10")
    assert result.exit_code == 0, result.output
    assert "3 scenarios" in result.output
    assert "0 violations" in result.output


def test_chaos_replays_one_seed() -> None:
    result = invoke("chaos", "--seed", "11")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("seed 11:")
    assert result.output.rstrip().endswith("ok")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--seeds", "0"), ("--seeds and --jobs must be at least 1", "chaos --help')")),
        (("--jobs", "x"), ("Invalid value for '--jobs'", "'x' is not a valid integer")),
        (("--seed", "3", "--trace", "no/such/t.bin"), ("--trace 'no/such/t.bin'",)),
    ],
)
def test_chaos_rejects_a_bad_flag_with_one_line_and_usage_exit(
    args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    # A usage block, then the error, would be three lines; a bad --trace was a traceback.
    assert_one_line_error(invoke("chaos", *args), 2, *words)


def test_chaos_starts_no_more_processes_than_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def long(seeds: range, jobs: int, *, processes: bool, executor: object) -> int:
        asked.append(jobs)
        return 0

    monkeypatch.setattr(harness, "_long", long)
    assert invoke("chaos", "--seeds", "2", "--jobs", "100000").exit_code == 0
    assert asked == [2]  # not 100,000 spawned interpreters


def test_chaos_stops_at_ctrl_c_with_one_line_and_no_store_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: list[int] = []

    def interrupted(seed: int) -> Any:
        seen.append(seed)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C during the seed
        return runner.run_seed(seed)

    monkeypatch.setattr(harness, "run_seed", interrupted)
    result = invoke("chaos", "--seeds", "5")
    assert result.exit_code == 130
    assert result.stderr == "Error: interrupted: the chaos run stopped before its end\n"
    assert seen == [0]  # the seed in hand ends, then the run
    assert list(tmp_path.iterdir()) == []
    # A run stopped by an exception removes its store too (Ctrl-C inside the engine).
    monkeypatch.setattr(runner.Runner, "_run", lambda self: signal.raise_signal(signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        runner.run_seed(1)
    assert list(tmp_path.iterdir()) == []


def test_simulate_takes_a_pools_idle_timeout_from_a_flag(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    args = ("simulate", "--scenario", "steady", "--events", "40", "--rate", "0.05", "-q")
    result = invoke(*args, "--idle-timeout", "1", "--json", str(out))
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["scenario"]["idle_timeout"] == 1.0
    assert document["activations"]["evicted"] > 0
    refused = invoke(*args, "--idle-timeout", "0")
    assert refused.exit_code == 2
    assert "--idle-timeout" in refused.output
