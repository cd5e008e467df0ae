"""``--plot``: one run's queue depths and latencies, or a sweep's figure against its field.

matplotlib is the optional ``dopool[plot]`` extra: it is imported only here, only
when a plot is asked for, and a missing install is a clear error.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from dopool._errors import ConfigurationError
from dopool._sim.figures import DESCRIPTIONS
from dopool._sim.metrics import Result, percentile
from dopool._sim.sweep import Point, SweepResult, label, unit, value_text

MAX_LEGEND = 16  # instances named in the legend; more would hide the plot
MAX_TICKS = 20  # a sweep's values each get a tick up to this many
MAX_POINTS = 4000  # per instance: a depth series is thinned to about this many steps


class PlotUnavailableError(ConfigurationError):
    """matplotlib is not installed."""

    def __init__(self) -> None:
        super().__init__("--plot needs matplotlib: pip install 'dopool[plot]'")


def check_available() -> None:
    """Raise :class:`PlotUnavailableError` now, before a long run, if matplotlib is missing."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise PlotUnavailableError from None


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotUnavailableError from None
    matplotlib.use("Agg")  # files only: no display needed
    return importlib.import_module("matplotlib.pyplot")


def thin(series: list[tuple[float, int]], limit: int = MAX_POINTS) -> list[tuple[float, int]]:
    """At most about ``limit`` points of a step series, keeping each bucket's peak."""
    if len(series) <= limit:
        return series
    step = len(series) / limit
    result = []
    for bucket in range(limit):
        chunk = series[int(bucket * step) : int((bucket + 1) * step)]
        if chunk:
            result.append(max(chunk, key=lambda point: point[1]))
    result.append(series[-1])
    return result


def plot(result: Result, path: str | os.PathLike[str], *, title: str) -> None:
    """Write a PNG with two panels: depth per instance, and the latency histogram."""
    plt = _pyplot()
    figure, (depth_axis, latency_axis) = plt.subplots(
        2, 1, figsize=(10, 7.5), gridspec_kw={"height_ratios": [3, 2]}
    )
    try:
        for index, series in enumerate(result.depth_series):
            points = [*thin(series), (result.virtual_time, series[-1][1])]
            times = [t for t, _ in points]
            depths = [d for _, d in points]
            label = f"instance {index}" if index < MAX_LEGEND else None
            depth_axis.step(times, depths, where="post", linewidth=1.0, label=label)
        depth_axis.set_xlabel("virtual time (s)")
        depth_axis.set_ylabel("queue depth (pending events)")
        depth_axis.set_title(f"{title}: queue depth per instance")
        depth_axis.set_xlim(0, max(result.virtual_time, 1e-9))
        depth_axis.set_ylim(bottom=0)
        if result.depth_series:
            depth_axis.legend(loc="upper right", fontsize="small", ncol=2)
        depth_axis.grid(alpha=0.3)

        ordered = sorted(result.latencies)
        if ordered:
            latency_axis.hist(ordered, bins=60, color="tab:blue", alpha=0.8)
            for pct, style in ((50, "-"), (95, "--"), (99, ":")):
                value = percentile(ordered, pct)
                latency_axis.axvline(
                    value, color="black", linestyle=style, label=f"p{pct} = {value:.3g} s"
                )
            latency_axis.legend(loc="upper right", fontsize="small")
        else:
            latency_axis.text(0.5, 0.5, "no event succeeded", ha="center", va="center")
        latency_axis.set_xlabel("latency, arrival to success (virtual s)")
        latency_axis.set_ylabel("events")
        latency_axis.set_title("latency distribution")
        latency_axis.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(os.fspath(path), dpi=100)
    finally:
        plt.close(figure)


# -- sweeps -------------------------------------------------------------------------------
def sweep_figure(result: SweepResult, name: str) -> Any:
    """The matplotlib figure of ``name`` against the first swept field.

    One line per combination of the other swept fields' values (one line if
    there are none), each point the mean over its seeds with the 95% confidence
    interval as an error bar (no bar for a single seed). The caller closes it.
    """
    if not result.axes:
        raise ValueError("a sweep plot needs a swept field")
    plt = _pyplot()
    x_axis, others = result.axes[0], result.axes[1:]
    symbol = unit(name)
    scale = 100.0 if symbol == "%" else 1.0
    categorical = any(isinstance(v, bool) or not isinstance(v, int | float) for v in x_axis.values)
    lines: dict[tuple[Any, ...], list[Point]] = {}
    for point in result.points:
        lines.setdefault(point.values[1:], []).append(point)
    figure, axis = plt.subplots(figsize=(9, 5.5))
    for rest, points in lines.items():
        xs = [x_axis.values.index(p.values[0]) if categorical else p.values[0] for p in points]
        estimates = [p.figures[name] for p in points]
        errors = None
        if result.repeat > 1:
            errors = [(e.half_width or 0.0) * scale for e in estimates]
        axis.errorbar(
            xs,
            [e.mean * scale for e in estimates],
            yerr=errors,
            marker="o",
            capsize=4,
            label=label(others, rest) if others else None,
        )
    if not categorical and len(x_axis.values) <= MAX_TICKS:
        axis.set_xticks(list(x_axis.values), [value_text(v) for v in x_axis.values])
    elif categorical:
        axis.set_xticks(range(len(x_axis.values)), [value_text(v) for v in x_axis.values])
    axis.set_xlabel(x_axis.field)
    axis.set_ylabel(f"{name} ({symbol})" if symbol else name)
    spread = (
        f"mean and 95% confidence interval over {result.repeat} seeds"
        if result.repeat > 1
        else "one seed per point"
    )
    described = DESCRIPTIONS.get(name, name)
    axis.set_title(f"{result.scenario.name}: {described}\n{spread}", fontsize="medium")
    if others:
        axis.legend(fontsize="small")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def plot_sweep(result: SweepResult, name: str, path: str | os.PathLike[str]) -> None:
    """Write :func:`sweep_figure` as a PNG."""
    figure = sweep_figure(result, name)
    try:
        figure.savefig(os.fspath(path), dpi=100)
    finally:
        _pyplot().close(figure)
