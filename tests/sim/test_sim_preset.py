"""``preset = "cloudflare"``: Cloudflare's alarm rule, simulated (docs/simulate.md)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dopool._cli import cli
from dopool._sim import loading
from dopool._sim.driver import run
from dopool._sim.figures import figures
from dopool._sim.metrics import Stall
from dopool.chaos import FaultInjector

# Two bursts of five events, 200 s apart, into one instance whose alarm fails.
DESIGN = """
name = "alarms-fail"
preset = "cloudflare"
seed = 1
instances = 1

[arrivals]
process = "bursts"
burst_size = 5
burst_interval = 200.0
duration = 201.0

[service]
distribution = "fixed"
mean = 0.1

[faults]
alarm_error = 0.01
"""


@pytest.fixture
def failing_alarms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every alarm delivery fails up to t=150 (virtual); every one lands after."""
    fires = FaultInjector.fires

    def fail_early(injector: FaultInjector, point: str) -> bool:
        if point == "alarm_error":
            return bool(clock_now[0] < 150.0)
        return fires(injector, point)

    clock_now = [0.0]
    monkeypatch.setattr(FaultInjector, "fires", fail_early)
    from dopool._clock.clocks import SimulatedClock

    now = SimulatedClock.now

    def watched(clock: SimulatedClock) -> float:
        clock_now[0] = now(clock)
        return clock_now[0]

    monkeypatch.setattr(SimulatedClock, "now", watched)


def test_the_preset_fills_in_cloudflares_rules_and_the_file_wins() -> None:
    scenario = loading.loads(DESIGN)
    (pool,) = scenario.resolved_pools
    assert pool.alarm_retries == 6
    retry = pool.retry
    assert (retry.max_attempts, retry.initial_delay, retry.multiplier) == (7, 2.0, 2.0)
    assert (retry.max_delay, retry.jitter) == (64.0, 0.0)
    mine = loading.loads(DESIGN + "\n[retry]\nmax_attempts = 2\n")
    assert mine.resolved_pools[0].retry.max_attempts == 2
    assert mine.resolved_pools[0].retry.initial_delay == 2.0
    assert loading.loads(mine.to_toml()) == mine
    plain = loading.loads(DESIGN.replace('preset = "cloudflare"\n', ""))
    assert plain.resolved_pools[0].alarm_retries is None


@pytest.mark.usefixtures("failing_alarms")
def test_an_alarm_failing_seven_times_stalls_its_events_until_the_next_enqueue() -> None:
    result = run(loading.loads(DESIGN)).result
    assert result.passed, [check.detail for check in result.invariants]
    # Deliveries at 0, 2, 6, 14, 30, 62 and 126 s fail: the seventh gives the alarm up.
    # The five events wait until the next burst's enqueue sets the alarm at 200 s.
    assert result.stalls == [Stall("sim", 0, 126.0, 200.0, 5)]
    assert result.succeeded == 10
    assert result.latency.max == pytest.approx(200.0 + 5 * 0.1)
    named = figures(result)
    assert (named["stalls"], named["stall.max"], named["stalled"]) == (1.0, 74.0, 0.0)
    assert "Cloudflare's" in result.alarm_policy


@pytest.mark.usefixtures("failing_alarms")
def test_without_a_next_write_the_events_stay_and_the_report_names_the_instance() -> None:
    scenario = loading.loads(DESIGN.replace("duration = 201.0", "duration = 1.0"))
    result = run(scenario).result
    assert result.passed  # no loss: the events are held, pending, not lost
    assert result.stalls == [Stall("sim", 0, 126.0, None, 5)]
    assert (result.pending, result.succeeded) == (5, 0)
    named = figures(result)
    assert (named["stalled"], named["stalled_events"]) == (1.0, 5.0)


@pytest.mark.usefixtures("failing_alarms")
def test_the_report_says_which_alarm_policy_ran_and_who_stalled(tmp_path: object) -> None:
    path = f"{tmp_path}/design.toml"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(DESIGN.replace("duration = 201.0", "duration = 1.0"))
    done = CliRunner().invoke(cli, ["simulate", "--scenario", path, "-q"])
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    assert "alarm policy Cloudflare's: a failed alarm is retried 6 times" in text
    assert "1 still stalled at the end (instance 0), holding 5 events" in text


def test_dopools_own_policy_is_the_default_and_says_so() -> None:
    result = run(loading.loads(DESIGN.replace('preset = "cloudflare"\n', ""))).result
    assert result.stalls == []
    assert result.alarm_policy.startswith("dopool's: a failed alarm is retried until it lands")
