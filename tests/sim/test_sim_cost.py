"""The bill of a run (docs/simulate.md, "What a design costs"): the counts taken from
the trace, priced from the documented table, are the report's; ``[cost]`` overrides the
prices, ``cost.*`` figures gate and sweep, and a bad price is refused by name."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cli_support import assert_one_line_error, invoke
from dopool._sim.cost import Prices

ROOT = Path(__file__).parents[2]
CHAT = str(ROOT / "examples" / "chat-rooms" / "scenario.toml")
OUTCOMES = ("succeeded", "retry_scheduled", "dead_lettered")
ENDS = (*OUTCOMES, "crashed")  # what ends an attempt's busy time
MILLION = 1e6


def documented_prices() -> dict[str, Any]:
    """The ``[cost]`` table docs/simulate.md shows, read as TOML."""
    text = (ROOT / "docs" / "simulate.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```toml\n(\[cost\]\n.*?)```", text, re.DOTALL)
    table: dict[str, Any] = tomllib.loads(block)["cost"]
    return table


def run(tmp_path: Path, *flags: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run's JSON document and its trace's lines."""
    out, trace = tmp_path / "run.json", tmp_path / "run.jsonl"
    done = invoke("simulate", *flags, "-q", "--json", str(out), "--trace", str(trace))
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    return json.loads(out.read_text(encoding="utf-8")), lines


def usage_from_trace(lines: list[dict[str, Any]], end: float) -> dict[str, float]:
    """What the bill counts, reckoned from the trace alone (the docs' mapping)."""
    events = [line for line in lines if line["kind"] != "arrived"]
    due = {
        (e["pool"], e["instance_index"], e["sequence"])
        for e in events
        if e["kind"] == "enqueued" and "due" in e
    }
    started = [e for e in events if e["kind"] == "started"]
    alarms = sum(
        1
        for e in started
        if e["attempt"] > 1 or (e["pool"], e["instance_index"], e["sequence"]) in due
    )
    busy, since = 0.0, {}
    for e in events:
        where = (e["pool"], e["instance_index"])
        if e["kind"] == "started":
            since[where] = e["time"]
        elif e["kind"] in ENDS and where in since:
            busy += e["time"] - since.pop(where)
    busy += sum(end - time for time in since.values())
    outcomes = [e for e in events if e["kind"] in OUTCOMES]
    return {
        "enqueues": sum(1 for e in events if e["kind"] == "enqueued"),
        "alarms": alarms,
        "busy": busy,
        "rows_read": sum(e.get("rows_read", 0) for e in outcomes),
        "storage_rows_written": sum(e.get("rows_written", 0) for e in outcomes),
    }


def month_dollars(usage: dict[str, float], seconds: float, table: dict[str, Any]) -> float:
    """A month at the run's load, priced from the table as the docs say."""
    prices = {name: float(value) for name, value in table.items() if name != "duration"}
    scale = float(prices["month"]) / seconds
    gb_s = usage["busy"] * prices["memory_mb"] / 1024
    requests = usage["enqueues"] + usage["alarms"]
    written = usage["storage_rows_written"] + usage["alarms"]

    def past(count: float, included: str, price: str) -> float:
        return max(count * scale - prices[included], 0.0) / MILLION * prices[price]

    stored = max(usage["stored_bytes"] / 1e9 - prices["stored_gb_included"], 0.0)
    return (
        past(requests, "requests_included", "request_price")
        + past(gb_s, "gb_s_included", "gb_s_price")
        + past(usage["rows_read"], "rows_read_included", "rows_read_price")
        + past(written, "rows_written_included", "rows_written_price")
        + stored * prices["stored_gb_price"]
        + prices["plan"]
    )


def test_the_documented_price_table_is_the_codes() -> None:
    assert documented_prices() == Prices().to_dict()


@pytest.mark.parametrize(
    "flags",
    [
        # Storage, timers (delayed follow-ups to itself) and per-key objects.
        ("--scenario", CHAT, "--events", "400"),
        # Retries after a backoff, with dead letters and crashes: alarms, and no storage.
        ("--scenario", "crash-storm", "--events", "300"),
        # Delayed arrivals, each started by its alarm.
        ("--events", "300", "--set", "delayed_share=0.5", "--set", "delay=5"),
    ],
    ids=["chat-rooms", "crash-storm", "delayed"],
)
def test_the_bill_is_the_traces_counts_at_the_documented_prices(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    document, lines = run(tmp_path, *flags)
    cost, seconds = document["cost"], document["virtual_time"]
    reckoned = usage_from_trace(lines, seconds)
    load = max(line["time"] for line in lines if line["kind"] == "arrived")
    assert cost["usage"]["load_seconds"] == pytest.approx(load, abs=1e-6)
    assert load < seconds  # the run's tail: timers, retries, queues draining
    usage = cost["usage"]
    for name in ("enqueues", "alarms", "rows_read", "storage_rows_written"):
        assert usage[name] == reckoned[name], name
    assert usage["busy_seconds"] == pytest.approx(reckoned["busy"], abs=1e-5)
    assert usage["requests"] == reckoned["enqueues"] + reckoned["alarms"]
    assert usage["rows_written"] == reckoned["storage_rows_written"] + reckoned["alarms"]
    reckoned["stored_bytes"] = usage["stored_bytes"]  # (checked below, from the store)
    expected = month_dollars(reckoned, load, documented_prices())
    assert cost["month"]["total"] == pytest.approx(expected, abs=1e-3)
    assert cost["month"]["plan"] == 5.0


def test_each_kind_of_count_is_there_to_be_billed(tmp_path: Path) -> None:
    """The parametrized runs between them meet every count (a test above that compared
    zeros would prove nothing)."""
    chat, _ = run(tmp_path, "--scenario", CHAT, "--events", "400")
    storm, _ = run(tmp_path, "--scenario", "crash-storm", "--events", "300")
    chat_usage, storm_usage = chat["cost"]["usage"], storm["cost"]["usage"]
    assert chat_usage["alarms"] > 0  # the rooms' timers
    assert chat_usage["rows_read"] > 0
    assert chat_usage["storage_rows_written"] > 0
    assert chat_usage["stored_bytes"] > 0
    assert storm_usage["alarms"] > 0  # retries after their backoff
    assert storm_usage["rows_read"] == 0  # its handlers keep nothing


def test_stored_bytes_are_the_keys_and_values_the_store_holds(tmp_path: Path) -> None:
    import dopool
    from dopool._store.layout import pack

    store = tmp_path / "store"
    document, _ = run(tmp_path, "--scenario", CHAT, "--events", "200", "--store", str(store))
    total = 0
    with dopool.connect(store) as connection:
        rooms = connection.pool("rooms")
        for instance in document["instances"]:
            values = rooms.storage(partition_key=instance["key"]).list()
            total += sum(len(key.encode()) + len(pack(value)) for key, value in values.items())
    assert document["cost"]["usage"]["stored_bytes"] == total > 0


def test_cost_overrides_change_the_bill_and_not_the_run(tmp_path: Path) -> None:
    plain, plain_trace = run(tmp_path, "--scenario", CHAT, "--events", "300")
    free = ("--set", "cost.rows_written_price=0", "--set", "cost.plan=0")
    cheaper, cheaper_trace = run(tmp_path, "--scenario", CHAT, "--events", "300", *free)
    assert plain_trace == cheaper_trace
    assert cheaper["scenario"]["cost"]["rows_written_price"] == 0
    assert cheaper["cost"]["month"]["rows_written"] == cheaper["cost"]["month"]["plan"] == 0
    assert plain["cost"]["month"]["rows_written"] > 0
    assert cheaper["cost"]["month"]["total"] < plain["cost"]["month"]["total"]


def test_resident_objects_are_billed_from_activation_to_eviction(tmp_path: Path) -> None:
    busy, _ = run(tmp_path, "--scenario", CHAT, "--events", "300")
    resident, _ = run(
        tmp_path, "--scenario", CHAT, "--events", "300", "--set", "cost.duration=resident"
    )
    usage = resident["cost"]["usage"]
    assert resident["cost"]["duration_billed"] == "resident"
    active = resident["activations"]["mean"] * resident["virtual_time"]
    assert usage["resident_seconds"] == pytest.approx(active, rel=1e-6)
    assert usage["gb_s"] == pytest.approx(usage["resident_seconds"] * 0.125, rel=1e-6)
    assert busy["cost"]["usage"]["gb_s"] < usage["gb_s"]


def test_a_gate_on_the_monthly_bill(tmp_path: Path) -> None:
    args = ("simulate", "--scenario", CHAT, "--events", "200", "-q")
    assert invoke(*args, "--assert", "cost.month >= 5").exit_code == 0
    failed = invoke(*args, "--assert", "cost.month <= 5")
    assert failed.exit_code == 1
    assert "cost.month" in failed.output


def test_a_sweep_shows_the_monthly_bill_by_default(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    sweep = ("--sweep", "app.timer=5,60", "-j", "1", "--json", str(out))
    slow = ("--set", "arrivals.rate=20")  # 30 s of messages: a room talks across ticks
    done = invoke("simulate", "--scenario", CHAT, "--events", "600", "-q", *slow, *sweep)
    assert done.exit_code == 0, done.output
    assert "cost.month" in done.output
    points = json.loads(out.read_text(encoding="utf-8"))["points"]
    months = [point["figures"]["cost.month"]["mean"] for point in points]
    alarms = [point["figures"]["cost.requests"]["mean"] for point in points]
    assert months[0] > months[1]  # a faster timer fires more alarms, and writes more
    assert alarms[0] > alarms[1]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("cost.duration=always", "'cost.duration' must be one of 'busy', 'resident'"),
        ("cost.request_price=-1", "'cost.request_price' must be >= 0"),
        ("cost.month=0", "'cost.month' must be above 0"),
        ("cost.memory_mb=1.5", "'cost.memory_mb' must be an integer"),
    ],
)
def test_a_bad_price_is_refused_by_name(setting: str, message: str) -> None:
    done = invoke("simulate", "--events", "10", "-q", "--set", setting)
    assert_one_line_error(done, 2, message)


def test_the_report_shows_the_bill() -> None:
    done = invoke("simulate", "--scenario", CHAT, "--events", "200")
    assert done.exit_code == 0, done.output
    assert re.search(r"^cost +\$[\d,.]+ a month at this load on Cloudflare", done.output, re.M)
    assert re.search(r"this run \$[\d.e-]+: [\d,]+ requests \([\d,]+ enqueues", done.output)


def test_usage_has_no_bill_for_a_run_that_took_no_time() -> None:
    from dopool._sim.cost import Bill, Usage

    bill = Bill(Prices(), Usage())
    assert bill.month() == {**dict.fromkeys(bill.month(), 0.0), "plan": 5.0}
    assert bill.figures()["cost.run"] == 0.0
