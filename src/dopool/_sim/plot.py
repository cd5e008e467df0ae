"""``--plot``: queue depth by instance over virtual time, and the latency tail.

Two panels, readable at many instances: the depth of each instance's queue as a
heatmap (a row per instance, ``pool:index`` with several pools, ``key …`` for an
instance of a per-key pool; the :data:`MAX_ROWS` busiest when more were used; a column
per bin of virtual time, coloured by the deepest the queue got in it; a colour bar),
and the latency as a complementary CDF, P[latency > x] against x on a log scale, so the
tail shows: a line per pool with several, and one end to end with follow-ups. A run
whose instances were evicted (started on demand, ``idle_timeout``) gets a third panel:
the instances running over virtual time.

:func:`build_figure` makes the figure, :func:`save_figure` writes it. matplotlib is
the optional ``dopool[plot]`` extra: it is imported only here, only when a plot is
asked for, and a missing install is a clear error. The binning and the CCDF are
plain functions (:func:`depth_grid`, :func:`ccdf`) that need no matplotlib.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from dopool._errors import ConfigurationError
from dopool._sim.latency import percentile
from dopool._sim.metrics import Result

COLUMNS = 200  # bins of virtual time in the depth heatmap
MAX_ROWS = 64  # rows of the heatmap at most: the busiest instances (the report's rule)
MAX_ROW_LABELS = 32  # more rows than this: label every k-th
REFERENCES = ((50, 0.5), (95, 0.05), (99, 0.01))  # a percentile, and where its CCDF is


class PlotUnavailableError(ConfigurationError):
    """matplotlib is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "--plot needs matplotlib, dopool's 'plot' extra "
            "(pip install '.[plot]' in dopool's source tree)"
        )


def check_available() -> None:
    """Raise :class:`PlotUnavailableError` now, before a long run, if matplotlib is missing."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise PlotUnavailableError from None


def _figure_class() -> Any:
    try:
        module = importlib.import_module("matplotlib.figure")
    except ImportError:
        raise PlotUnavailableError from None
    return module.Figure  # a Figure needs no pyplot, no backend, no global state


# -- what is drawn, without matplotlib ------------------------------------------------------
def depth_grid(
    series: Sequence[Sequence[tuple[float, int]]], end: float, columns: int = COLUMNS
) -> list[list[int]]:
    """Each step series (``(time, depth)`` in time order, from ``(0, 0)``) as ``columns``
    bins over ``[0, end]``: the deepest the queue was in each bin."""
    width = max(end, 1e-9) / columns
    grid = []
    for points in series:
        row = []
        position, level = 0, 0
        for column in range(columns):
            start, stop = column * width, (column + 1) * width
            while position < len(points) and points[position][0] <= start:
                level = points[position][1]  # the depth the bin starts with
                position += 1
            peak = level
            last = column == columns - 1
            while position < len(points) and (last or points[position][0] < stop):
                level = points[position][1]
                peak = max(peak, level)
                position += 1
            row.append(peak)
        grid.append(row)
    return grid


def ccdf(samples: Sequence[float]) -> tuple[list[float], list[float]]:
    """The points of P[sample > x] as a step function (drawn ``where="post"``).

    It starts at 1 at the smallest sample, steps down at each distinct value, and
    ends at the largest at its last level above 0 (a log scale cannot show 0).
    """
    ordered = sorted(samples)
    count = len(ordered)
    if not count:
        return [], []
    xs, ys = [ordered[0]], [1.0]
    for position, value in enumerate(ordered):
        if position + 1 < count and ordered[position + 1] == value:
            continue  # ties: one step, after the last of them
        above = (count - position - 1) / count
        if above > 0:
            xs.append(value)
            ys.append(above)
    xs.append(ordered[-1])
    ys.append(ys[-1])
    return xs, ys


def rows(result: Result) -> list[int]:
    """The heatmap's rows: positions in ``result.instances``, every instance listed, or the
    :data:`MAX_ROWS` busiest, busiest first."""
    return result.busiest(MAX_ROWS)


def row_labels(result: Result) -> list[str]:
    """Each row's instance: its index (its key, in a per-key pool), after its pool's name
    when there are several pools."""
    several = len(result.pools) > 1
    labels = []
    for position in rows(result):
        item = result.instances[position]
        named = str(item.index) if item.key is None else f"key {item.key}"
        labels.append(f"{item.pool}:{named}" if several else named)
    return labels


def latency_lines(result: Result) -> list[tuple[str, list[float]]]:
    """The CCDF's lines: each pool's latencies (or all events'), then end to end."""
    lines: list[tuple[str, list[float]]] = []
    if len(result.pools) > 1:
        lines.extend((f"pool {p.name}", p.latencies) for p in result.pools if p.latencies)
    elif result.latencies:
        lines.append(("all events", result.latencies))
    if result.requests is not None and result.requests.latencies:
        lines.append(("end to end (requests)", result.requests.latencies))
    return lines


# -- the figure -------------------------------------------------------------------------
def build_figure(result: Result, *, title: str) -> Any:
    """The two panels of ``result`` as a matplotlib ``Figure`` (not yet written)."""
    height = 4.5 + len(rows(result)) * 0.06
    running = result.running_series if result.activations.evicted else None
    ratios = [height, 4.0] + ([3.0] if running is not None else [])
    figure = _figure_class()(figsize=(11, sum(ratios)), layout="constrained")
    axes = figure.subplots(len(ratios), 1, gridspec_kw={"height_ratios": ratios})
    _depth_panel(figure, axes[0], result, title)
    _latency_panel(axes[1], result)
    if running is not None:
        _running_panel(axes[2], result, running)
    return figure


def save_figure(figure: Any, path: str | os.PathLike[str]) -> None:
    """Write ``figure`` as a PNG.

    Raises:
        ConfigurationError: it cannot be written (its directory went away, a full disk).
    """
    try:
        figure.savefig(os.fspath(path), dpi=100)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write plot {os.fspath(path)!r}: {exc.strerror or exc}"
        ) from None


def plot(result: Result, path: str | os.PathLike[str], *, title: str) -> None:
    """Write ``result``'s figure to ``path`` (a PNG)."""
    save_figure(build_figure(result, title=title), path)


def _depth_panel(figure: Any, axis: Any, result: Result, title: str) -> None:
    end = max(result.virtual_time, 1e-9)
    grid = depth_grid([result.depth_series[position] for position in rows(result)], end)
    labels = row_labels(result)
    image = axis.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        vmin=0,
        vmax=max(1, result.max_depth),
        extent=(0.0, end, len(labels) - 0.5, -0.5),
    )
    every = max(1, -(-len(labels) // MAX_ROW_LABELS))
    axis.set_yticks(range(0, len(labels), every))
    axis.set_yticklabels(labels[::every], fontsize="small")
    axis.set_xlabel("virtual time (s)")
    axis.set_ylabel("pool:instance" if len(result.pools) > 1 else "instance")
    heading = (
        f"{title}: queue depth by instance over virtual time "
        f"(deepest in each {end / COLUMNS:.3g} s)"
    )
    listed = len(result.instances)
    if listed > len(labels):
        heading += f"\nthe {len(labels)} busiest of {listed:,} instances"
    axis.set_title(heading)
    figure.colorbar(image, ax=axis, label="queue depth (pending events)")


def _latency_panel(axis: Any, result: Result) -> None:
    lines = latency_lines(result)
    axis.set_yscale("log")
    axis.set_xlabel("latency x, arrival to success (virtual s)")
    axis.set_ylabel("P[latency > x]")
    note = ""
    if result.latency.censored:
        note = (
            f"\nfinished events only ({result.latency.unfinished:,} unfinished when the run "
            "stopped): the tail is optimistic"
        )
    axis.set_title("latency tail (complementary CDF, log scale)" + note)
    axis.grid(alpha=0.3, which="both")
    if not lines:
        axis.text(0.5, 0.5, "no event succeeded", ha="center", va="center")
        axis.set_ylim(1e-3, 1.5)
        return
    for name, samples in lines:
        xs, ys = ccdf(samples)
        p99 = percentile(sorted(samples), 99)
        style = "--" if name.startswith("end to end") else "-"
        axis.step(
            xs,
            ys,
            where="post",
            linestyle=style,
            linewidth=1.4,
            marker="o",
            markersize=3,
            markevery=[len(xs) - 1],  # the largest, seen even when every sample is equal
            label=f"{name}: {len(samples):,} events, p99 {p99:.3g} s",
        )
    smallest = 1.0 / max(len(samples) for _, samples in lines)
    for pct, level in REFERENCES:
        if level >= smallest:
            axis.axhline(level, color="0.55", linewidth=0.8, linestyle=":")
            axis.text(1.0, level, f" p{pct}", transform=axis.get_yaxis_transform(), va="center")
    axis.set_ylim(smallest / 2, 1.5)
    axis.set_xlim(left=0)
    axis.legend(loc="upper right", fontsize="small")


def _running_panel(axis: Any, result: Result, running: Sequence[tuple[float, int]]) -> None:
    """The instances running (every pool's) over virtual time, as steps."""
    activity = result.activations
    times = [time for time, _ in running] + [result.virtual_time]
    counts = [count for _, count in running]
    axis.step(times, [*counts, counts[-1]], where="post", linewidth=1.2)
    axis.set_xlim(0, max(result.virtual_time, 1e-9))
    axis.set_ylim(bottom=0)
    axis.set_xlabel("virtual time (s)")
    axis.set_ylabel("instances running")
    axis.set_title(
        f"instances running: at most {activity.peak:,}, {activity.mean:,.1f} on average; "
        f"{activity.started:,} started, {activity.per_second:,.2f} per virtual second"
    )
    axis.grid(alpha=0.3)
