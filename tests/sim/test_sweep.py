"""Sweeps (``dopool._sim.sweep``): the grid, ranges, seeds, the t interval, the plot.

The runs are small (100 events, a few hundredths of a second each); the command
line's side of sweeps (the table, ``--jobs``, byte-identical JSON) is in test_cli.py.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import pytest

from dopool._errors import ScenarioError
from dopool._sim import loading as sc
from dopool._sim import sweep
from dopool._sim.figures import DESCRIPTIONS
from dopool._sim.sweep import (
    Axis,
    Estimate,
    Point,
    SweepError,
    SweepResult,
    check_axes,
    check_figures,
    grid,
    label,
    parse_axis,
    run_one,
    run_sweep,
    t_quantile,
    unit,
)


# -- the grid ------------------------------------------------------------------------------
def test_the_grid_varies_the_first_axis_slowest() -> None:
    axes = [parse_axis("instances=1,2"), parse_axis("arrivals.rate=10..30+10")]
    assert grid(axes) == [(1, 10.0), (1, 20.0), (1, 30.0), (2, 10.0), (2, 20.0), (2, 30.0)]
    assert label(axes, (2, 30.0)) == "instances=2,arrivals.rate=30"
    assert grid([]) == [()]  # --repeat alone: one point, the scenario itself


@pytest.mark.parametrize(
    ("spec", "values"),
    [
        ("instances=1,2,4", (1, 2, 4)),  # the syntax of one value list still works
        (" instances = 1, 2 ,4, ", (1, 2, 4)),
        ("instances=1..4", (1, 2, 3, 4)),
        ("instances=2..16x2", (2, 4, 8, 16)),
        ("instances=2..20x2", (2, 4, 8, 16)),  # the stop is kept only when landed on
        ("instances=1..7+3", (1, 4, 7)),
        ("instances=1,2..8x2,32", (1, 2, 4, 8, 32)),
        ("service.mean=0.1..0.3+0.1", (0.1, 0.2, 0.3)),  # no 0.30000000000000004
        ("arrivals.rate=1e+2..1e+3x10", (100.0, 1000.0)),  # an exponent's + is no step
        ("max_queue_depth=10,none", (10, None)),
        ("faults.crash_before_execute=0,0.01", (0.0, 0.01)),
    ],
)
def test_values_and_ranges(spec: str, values: tuple[Any, ...]) -> None:
    axis = parse_axis(spec)
    assert axis.values == values
    assert [type(v) for v in axis.values] == [type(v) for v in values]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("instances", "--sweep expects FIELD=V1,V2"),
        ("instances=", "--sweep expects FIELD=V1,V2"),
        ("=1,2", "--sweep expects FIELD=V1,V2"),
        ("routing=a,b", "field 'routing' is not a numeric"),
        ("rate=1,2", "did you mean 'arrivals.rate'"),
        ("instances=1,x", "must be an integer, got 'x'"),
        ("instances=1,1", "the value 1 is given twice"),
        ("instances=1..4,2", "the value 2 is given twice"),
        ("instances=4..1", "ends below its start"),
        ("instances=1..4+0", "the step must be > 0"),
        ("instances=0..8x2", "a factor must be > 1 and the start > 0"),
        ("instances=1..8x1", "a factor must be > 1"),
        ("instances=2..16x1.5", "must be an integer, got '1.5'"),
        ("service.mean=0.1..0.5", "a range of a float field needs a step"),
        ("max_queue_depth=none..5", "a number at each end"),
        ("instances=1..5000", "more than 1,000 values"),
        ("service.mean=0.1..nan+0.1", "a range needs finite numbers"),  # not "1,000 values"
        ("service.mean=0.1..0.5+inf", "a range needs finite numbers"),
    ],
)
def test_bad_sweeps_say_what_is_wrong(spec: str, words: str) -> None:
    with pytest.raises((SweepError, ScenarioError)) as caught:
        parse_axis(spec)
    assert words in str(caught.value)
    assert str(caught.value).startswith("--sweep")


def test_axes_and_figures_are_checked() -> None:
    with pytest.raises(SweepError, match="'instances' is swept twice"):
        check_axes([parse_axis("instances=1"), parse_axis("instances=2")], 1)
    with pytest.raises(SweepError, match="would make 20,000 runs"):
        check_axes([parse_axis("instances=1..1000")], 20)
    with pytest.raises(SweepError, match="--repeat must be between 1"):
        check_axes([], 0)
    assert check_figures(["p99", "utilisation"]) == ("p99", "utilisation")
    with pytest.raises(SweepError, match=r"--plot-figure: 'p98' is not a figure \(did you mean"):
        check_figures(["p98"], "--plot-figure")


def test_every_figure_has_a_unit_by_its_name() -> None:
    assert unit("p99") == unit("wait.mean") == unit("orders.p99") == unit("e2e.max") == "s"
    assert unit("utilisation") == unit("utilisation.max") == "%"
    assert unit("throughput") == "/s"
    assert unit("dead_lettered") == unit("max_queue_depth") == ""
    assert unit("cost.month") == unit("cost.rows_written") == "$"
    assert unit("active.mean") == unit("active.peak") == ""
    assert {unit(name) for name in DESCRIPTIONS} <= {"s", "%", "/s", "$", ""}


# -- statistics -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("df", "quantile"),
    # Published 0.975 quantiles of Student's t (two-sided 95%).
    [
        (1, 12.706),
        (2, 4.303),
        (4, 2.776),
        (9, 2.262),
        (19, 2.093),
        (29, 2.045),
        (30, 2.042),
        (31, 2.040),
        (40, 2.021),
        (60, 2.000),
        (120, 1.980),
        (1000, 1.962),
    ],
)
def test_t_quantiles(df: int, quantile: float) -> None:
    assert t_quantile(df) == pytest.approx(quantile, abs=6e-4)


def test_t_quantiles_fall_towards_the_normal() -> None:
    values = [t_quantile(df) for df in range(1, 300)]
    assert all(a > b for a, b in itertools.pairwise(values))
    assert values[-1] > 1.959964
    with pytest.raises(ValueError, match=">= 1"):
        t_quantile(0)


def test_an_estimate_is_the_mean_and_the_t_half_width() -> None:
    five = Estimate.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert five.mean == 3.0
    # stdev sqrt(2.5), t(4) = 2.776445: 2.776445 * sqrt(2.5) / sqrt(5)
    assert five.half_width == pytest.approx(1.963243, abs=1e-6)
    two = Estimate.of([10.0, 12.0])
    assert two.half_width == pytest.approx(12.706205)  # t(1) * sqrt(2) / sqrt(2)
    assert Estimate.of([4.0]) == Estimate(4.0, None, (4.0,))
    assert Estimate.of([0.5, 0.5, 0.5]).half_width == 0.0
    assert five.to_json_dict() == {
        "mean": 3.0,
        "half_width": five.half_width,
        "values": [1.0, 2.0, 3.0, 4.0, 5.0],
    }


# -- running -----------------------------------------------------------------------------------
def test_each_point_runs_with_the_same_seeds(tmp_path: Path) -> None:
    scenario = sc.with_overrides(sc.builtin("steady"), {"arrivals.total": 100, "seed": 5})
    seen: list[tuple[int, int]] = []
    result = run_sweep(
        scenario,
        [parse_axis("instances=1,3")],
        repeat=3,
        store=tmp_path / "stores",
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(n, 6) for n in range(7)]
    assert [point.values for point in result.points] == [(1,), (3,)]
    assert [point.seeds for point in result.points] == [(5, 6, 7), (5, 6, 7)]
    assert all(point.passed for point in result.points)
    alone = run_one(sc.with_overrides(scenario, {"instances": 3, "seed": 6}), None)
    p99 = result.points[1].figures["p99"]
    assert p99.values[1] == alone.figures["p99"]
    assert p99 == Estimate.of(p99.values)
    assert result.points[0].figures["p99"].mean > p99.mean  # one instance queues more
    assert (tmp_path / "stores" / "instances=3" / "seed=7" / "data").is_dir()
    document = result.to_json_dict()
    assert document["sweep"] == {
        "fields": ["instances"],
        "values": {"instances": [1, 3]},
        "repeat": 3,
        "confidence": 0.95,
    }
    point = document["points"][1]
    assert point["values"] == {"instances": 3}
    assert point["seeds"] == [5, 6, 7]
    assert point["invariants_failed"] == []
    assert list(point["figures"]) == list(DESCRIPTIONS)
    assert point["figures"]["p99"]["values"] == list(p99.values)


def test_the_usable_cpus_are_the_affinity_mask_else_the_machines() -> None:
    if hasattr(os, "sched_getaffinity"):
        assert sweep.usable_cpus() == len(os.sched_getaffinity(0))
    else:
        assert sweep.usable_cpus() == (os.cpu_count() or 1)


def test_without_an_affinity_mask_the_machines_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert sweep.usable_cpus() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # the count is unknown
    assert sweep.usable_cpus() == 1


class NoPool:
    """Stands in for ProcessPoolExecutor where a sweep must not start one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("a process pool was started")


def test_one_job_runs_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "usable_cpus", lambda: 4)
    monkeypatch.setattr(sweep, "ProcessPoolExecutor", NoPool)
    scenario = sc.with_overrides(sc.builtin("steady"), {"arrivals.total": 100})
    result = run_sweep(scenario, [parse_axis("instances=1,2")], repeat=2, jobs=1)
    assert [point.seeds for point in result.points] == [(1, 2), (1, 2)]


def test_a_single_run_needs_no_process_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "usable_cpus", lambda: 4)
    monkeypatch.setattr(sweep, "ProcessPoolExecutor", NoPool)
    scenario = sc.with_overrides(sc.builtin("steady"), {"arrivals.total": 100})
    (point,) = run_sweep(scenario, [parse_axis("instances=2")], jobs=None).points
    assert point.figures["offered"].mean == 100
    with pytest.raises(AssertionError, match="a process pool was started"):
        run_sweep(scenario, [parse_axis("instances=2")], repeat=2, jobs=None)


def test_a_point_that_is_not_a_valid_scenario_is_refused_before_any_run() -> None:
    with pytest.raises(ScenarioError, match=r"--sweep instances=2,partitions.keys=0: field"):
        run_sweep(
            sc.builtin("steady"),
            [parse_axis("instances=2"), parse_axis("partitions.keys=0,1")],
        )


PIPELINE = str(Path(__file__).parents[2] / "examples" / "pipeline.toml")


@pytest.mark.parametrize(
    ("scenario", "spec", "words"),
    [
        ("steady", "partitions.keys=4,8", "keys are drawn only with routing = 'partition'"),
        ("burst", "arrivals.rate=10,20", "process 'bursts' does not read it (steady and"),
        ("steady", "arrivals.burst_size=5,10", "process 'poisson' does not read it (bursts do)"),
        ("steady", "arrivals.time_scale=1,2", "(replay do)"),
        ("steady", "service.sigma=0.5,1", "the distribution is 'exponential'"),
        ("steady", "delay=1,2", "no arrival is delayed (delayed_share is 0)"),
        ("steady", "dedup_window=1,2", "no arrival carries a dedup key (duplicate_share is 0)"),
        (PIPELINE, "instances=1,2", "every [[pools]] table sets its own"),
        (PIPELINE, "service.mean=0.1,0.2", "every [[pools]] table sets its own"),
        (PIPELINE, "pools.fraud.partitions.zipf=0,1", "keys are drawn only with routing"),
    ],
)
def test_a_field_no_run_reads_is_refused_by_name_before_any_run(
    scenario: str, spec: str, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep, "_execute", lambda *args: pytest.fail("a point ran"))
    loaded = sc.resolve(scenario)
    axis = parse_axis(spec, loaded)
    with pytest.raises(ScenarioError) as caught:
        run_sweep(loaded, [parse_axis("seed=1,2"), axis])
    assert (caught.value.field, caught.value.source) == (axis.field, "--sweep")
    assert str(caught.value).startswith(
        f"--sweep: field '{axis.field}' changes nothing in this sweep's runs: "
    )
    assert words in str(caught.value)


def test_a_field_some_point_reads_may_be_swept() -> None:
    # The delay is read where delayed_share > 0: at half the points.
    scenario = sc.with_overrides(sc.builtin("steady"), {"arrivals.total": 50})
    axes = [parse_axis("delayed_share=0,0.5"), parse_axis("delay=1,2")]
    result = run_sweep(scenario, axes)
    ends = [point.figures["virtual_time"].mean for point in result.points]
    assert ends[0] == ends[1] < ends[2] < ends[3]  # the last delayed arrival is due later
    keyed = sc.with_overrides(scenario, {"routing": "partition"})
    assert len(run_sweep(keyed, [parse_axis("partitions.keys=1,8")]).points) == 2


def test_seeds_past_the_largest_are_refused_naming_the_repeat_and_the_bound() -> None:
    last = 2**63 - 1
    with pytest.raises(ScenarioError) as caught:
        run_sweep(sc.with_seed(sc.builtin("steady"), last - 1), [], repeat=3)
    assert str(caught.value) == f"--repeat 3: field 'seed' must be <= {last}, got {last + 1}"


# -- the plot ---------------------------------------------------------------------------------
def _synthetic(repeat: int, *axes: Axis) -> SweepResult:
    """A sweep result made up without running: p99 = first value + position / 10."""
    points = []
    for position, values in enumerate(grid(axes)):
        base = float(values[0] or 0) + position / 10
        samples = [base + k for k in range(repeat)]
        figures = {"p99": Estimate.of(samples), "utilisation": Estimate.of([0.5] * repeat)}
        points.append(Point(values, tuple(range(1, repeat + 1)), figures, ()))
    return SweepResult(sc.builtin("steady"), tuple(axes), repeat, tuple(points))


def test_the_plot_draws_one_line_per_value_of_the_second_field() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.container import ErrorbarContainer

    from dopool._sim.sweep_plot import sweep_figure

    result = _synthetic(3, Axis("instances", (1, 2, 4)), Axis("arrivals.rate", (10.0, 20.0)))
    figure = sweep_figure(result, "p99")
    (axis,) = figure.axes
    assert axis.get_xlabel() == "instances"
    assert axis.get_ylabel() == "p99 (s)"
    assert "99th percentile latency" in axis.get_title()
    assert "over 3 seeds" in axis.get_title()
    bars = [c for c in axis.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2
    assert all(bar.has_yerr for bar in bars)
    assert [t.get_text() for t in axis.get_legend().get_texts()] == [
        "arrivals.rate=10",
        "arrivals.rate=20",
    ]
    line, _, (segments,) = bars[1]  # arrivals.rate=20: points 1, 3, 5 of the grid
    assert list(line.get_xdata()) == [1, 2, 4]
    means = [result.points[i].figures["p99"] for i in (1, 3, 5)]
    assert list(line.get_ydata()) == [e.mean for e in means]
    spans = [path[1][1] - path[0][1] for path in segments.get_segments()]
    assert spans == pytest.approx([2 * (e.half_width or 0) for e in means])
    assert [t.get_text() for t in axis.get_xticklabels()] == ["1", "2", "4"]


def test_the_plot_of_one_field_one_seed_and_a_share() -> None:
    pytest.importorskip("matplotlib")
    from dopool._sim.sweep_plot import sweep_figure

    result = _synthetic(1, Axis("max_queue_depth", (10, 20, None)))
    figure = sweep_figure(result, "utilisation")
    (axis,) = figure.axes
    assert axis.get_ylabel() == "utilisation (%)"
    assert axis.get_legend() is None
    (bar,) = axis.containers
    assert not bar.has_yerr  # one seed: no interval
    assert list(bar[0].get_ydata()) == [50.0, 50.0, 50.0]  # a share drawn as a percentage
    assert [t.get_text() for t in axis.get_xticklabels()] == ["10", "20", "none"]
    assert math.isclose(axis.get_ylim()[0], 50.0, abs_tol=10)


def test_a_pools_figures_and_the_end_to_end_ones_may_be_chosen() -> None:
    """Per-pool figures (``<pool>.p99``) are chosen by the pool's name, which may hold dots."""
    chosen = ["orders.p99", "a.b.succeeded", "p99", "e2e.p99", "cost.month"]
    assert check_figures(chosen) == tuple(chosen)
    with pytest.raises(SweepError, match=r"'orders\.p98' is not a figure"):
        check_figures(["orders.p98"])
    with pytest.raises(SweepError, match=r"'e2e\.nope' is not a figure"):
        check_figures(["e2e.nope"])
