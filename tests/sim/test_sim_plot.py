"""``--plot``: what the figure shows, read from the figure itself (docs/simulate.md, "Plots")."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from dopool import ConfigurationError
from dopool._sim import loading as sc
from dopool._sim.driver import run
from dopool._sim.metrics import Result
from dopool._sim.plot import (
    COLUMNS,
    MAX_ROWS,
    build_figure,
    ccdf,
    depth_grid,
    row_labels,
    save_figure,
)

# The figure tests need matplotlib (dopool[plot]); the binning and the CCDF do not.
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib"
)

PIPELINE = """
seed = 5
instances = 2

[service]
distribution = "fixed"
mean = 0.02

[[arrivals]]
pool = "front"
rate = 40.0
total = 120

[[arrivals]]
pool = "back"
rate = 20.0
total = 60

[[pools]]
name = "front"
instances = 3

[[pools.follow_ups]]
to = "front"
probability = 0.3

[[pools]]
name = "back"
"""


def test_depth_grid_keeps_the_deepest_of_each_bin() -> None:
    series = [(0.0, 0), (1.0, 3), (2.0, 1), (5.0, 0), (10.0, 2)]
    # Bins of 2 s: a change at a bin's start belongs to that bin, not the one before.
    assert depth_grid([series], 10.0, columns=5) == [[3, 1, 1, 0, 2]]
    assert depth_grid([[(0.0, 0)]], 0.0, columns=3) == [[0, 0, 0]]


def test_ccdf_steps_down_at_each_distinct_value_and_stops_above_zero() -> None:
    assert ccdf([3.0, 1.0, 2.0, 2.0]) == ([1.0, 1.0, 2.0, 3.0], [1.0, 0.75, 0.25, 0.25])
    assert ccdf([]) == ([], [])
    assert ccdf([4.0]) == ([4.0, 4.0], [1.0, 1.0])


def panels(figure: Any) -> tuple[Any, Any, Any]:
    """The heatmap, the CCDF and the colour bar axes, by what they show."""
    (depth,) = [axis for axis in figure.axes if axis.images]
    (latency,) = [axis for axis in figure.axes if axis.get_ylabel() == "P[latency > x]"]
    (bar,) = [axis for axis in figure.axes if axis.get_ylabel().startswith("queue depth")]
    return depth, latency, bar


def drawn(axis: Any) -> list[str]:
    return [line.get_label() for line in axis.get_lines() if not line.get_label().startswith("_")]


@pytest.fixture(scope="module")
def sixteen() -> Result:
    scenario = sc.with_overrides(
        sc.builtin("steady"), {"instances": 16, "arrivals.rate": 150, "arrivals.total": 300}
    )
    return run(scenario).result


@needs_matplotlib
def test_sixteen_instances_make_a_heatmap_and_a_log_scale_tail(
    sixteen: Result, tmp_path: Path
) -> None:
    figure = build_figure(sixteen, title="steady")
    depth, latency, bar = panels(figure)
    assert depth.get_title().startswith("steady: queue depth by instance over virtual time")
    assert depth.images[0].get_array().shape == (16, COLUMNS)
    assert depth.images[0].get_array().max() == sixteen.max_depth
    assert [label.get_text() for label in depth.get_yticklabels()] == [str(i) for i in range(16)]
    assert depth.get_xlabel() == "virtual time (s)"
    assert bar.get_ylabel() == "queue depth (pending events)"
    assert latency.get_yscale() == "log"
    assert latency.get_xlabel().startswith("latency x")
    assert drawn(latency) == [f"all events: 300 events, p99 {sixteen.latency.p99:.3g} s"]
    (line,) = [line for line in latency.get_lines() if line.get_label().startswith("all")]
    assert max(line.get_xdata()) == sixteen.latency.max
    assert "finished events only" not in latency.get_title()
    save_figure(figure, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The folder checked before the run is gone when it ends: one line, not a traceback.
    with pytest.raises(ConfigurationError, match=r"cannot write plot '.*gone/p\.png': No such"):
        save_figure(figure, tmp_path / "gone" / "p.png")


@needs_matplotlib
def test_several_pools_label_rows_pool_index_and_draw_a_line_each_and_end_to_end() -> None:
    result = run(sc.loads(PIPELINE)).result
    assert result.requests is not None
    depth, latency, _ = panels(build_figure(result, title="pipeline"))
    assert depth.images[0].get_array().shape == (5, COLUMNS)
    assert [label.get_text() for label in depth.get_yticklabels()] == [
        "front:0",
        "front:1",
        "front:2",
        "back:0",
        "back:1",
    ]
    assert depth.get_ylabel() == "pool:instance"
    assert [label.split(":")[0] for label in drawn(latency)] == [
        "pool front",
        "pool back",
        "end to end (requests)",
    ]


@needs_matplotlib
def test_a_run_cut_short_says_its_tail_is_optimistic() -> None:
    scenario = sc.with_overrides(
        sc.builtin("steady"),
        {"arrivals.total": 200, "duration": 2.0, "instances": 1, "service.mean": 0.5},
    )
    result = run(scenario).result
    assert result.latency.censored
    _, latency, _ = panels(build_figure(result, title="cut"))
    assert "finished events only" in latency.get_title()
    assert "optimistic" in latency.get_title()


@needs_matplotlib
def test_many_rows_label_every_kth() -> None:
    scenario = sc.with_overrides(
        sc.builtin("steady"), {"instances": 48, "arrivals.rate": 400, "arrivals.total": 200}
    )
    depth, _, _ = panels(build_figure(run(scenario).result, title="wide"))
    assert depth.images[0].get_array().shape == (48, COLUMNS)
    labels = [label.get_text() for label in depth.get_yticklabels()]
    assert labels[:3] == ["0", "2", "4"]
    assert len(labels) == 24
    assert "busiest" not in depth.get_title()


@needs_matplotlib
def test_more_instances_than_rows_plot_the_busiest_by_key_and_those_running() -> None:
    """A per-key design: the heatmap keeps the 64 busiest instances (Result.busiest), each
    named by its key, and a third panel shows the instances running."""
    scenario = sc.with_overrides(
        sc.builtin("chat-rooms"),
        {"arrivals.total": 1500, "partitions.keys": 400, "idle_timeout": 1.0},
    )
    result = run(scenario).result
    assert len(result.instances) > MAX_ROWS
    figure = build_figure(result, title="rooms")
    depth, _, _ = panels(figure)
    assert depth.images[0].get_array().shape == (MAX_ROWS, COLUMNS)
    listed = f"the {MAX_ROWS} busiest of {len(result.instances):,} instances"
    assert depth.get_title().endswith(listed)
    shown = [result.instances[position] for position in result.busiest(MAX_ROWS)]
    assert shown[0].utilisation == max(i.utilisation for i in result.instances)
    assert row_labels(result) == [f"key {item.key}" for item in shown]
    grid = depth.images[0].get_array()
    assert [int(row.max()) for row in grid] == [item.max_depth for item in shown]
    (running,) = [axis for axis in figure.axes if axis.get_ylabel() == "instances running"]
    (line,) = running.get_lines()
    assert max(line.get_ydata()) == result.activations.peak
    assert line.get_ydata()[0] == 0
    assert f"at most {result.activations.peak:,}" in running.get_title()
    assert result.activations.evicted > 0


@needs_matplotlib
def test_a_run_without_evictions_has_no_panel_of_instances_running(sixteen: Result) -> None:
    figure = build_figure(sixteen, title="steady")
    assert [axis for axis in figure.axes if axis.get_ylabel() == "instances running"] == []
