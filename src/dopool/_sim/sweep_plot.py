"""A sweep's plot: one figure against the swept field, with its confidence intervals."""

from __future__ import annotations

import os
from typing import Any

from dopool._sim.figures import DESCRIPTIONS
from dopool._sim.plot import _figure_class, save_figure
from dopool._sim.sweep import Point, SweepResult, label, unit, value_text

MAX_TICKS = 20  # a sweep's values each get a tick up to this many


def sweep_figure(result: SweepResult, name: str) -> Any:
    """The matplotlib figure of ``name`` against the first swept field.

    One line per combination of the other swept fields' values (one line if
    there are none), each point the mean over its seeds with the 95% confidence
    interval as an error bar (no bar for a single seed). The caller closes it.
    """
    if not result.axes:
        raise ValueError("a sweep plot needs a swept field")
    x_axis, others = result.axes[0], result.axes[1:]
    symbol = unit(name)
    scale = 100.0 if symbol == "%" else 1.0
    categorical = any(isinstance(v, bool) or not isinstance(v, int | float) for v in x_axis.values)
    lines: dict[tuple[Any, ...], list[Point]] = {}
    for point in result.points:
        lines.setdefault(point.values[1:], []).append(point)
    figure = _figure_class()(figsize=(9, 5.5), layout="constrained")
    axis = figure.subplots()
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
    return figure


def plot_sweep(result: SweepResult, name: str, path: str | os.PathLike[str]) -> None:
    """Write :func:`sweep_figure` as a PNG."""
    save_figure(sweep_figure(result, name), path)
