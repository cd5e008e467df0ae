"""The results as a plain aligned table, the targets of issue 5 with a verdict each, and JSON."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import ceiling, engine, peers, raw
from benchmarks.harness import Key, Results, Series, Sizes

DASH = "\u2013"  # an en dash: a range, which a hyphen would make look like a minus sign
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "<": operator.lt,
}


@dataclass(frozen=True, slots=True)
class Target:
    """A median, or a ratio of two medians, held against a goal (no goal: for information)."""

    name: str
    label: str
    numerator: Key
    denominator: Key | None = None
    op: str = ">="
    goal: float | None = None
    unit: str = "x"

    @property
    def scenarios(self) -> set[str]:
        """The scenarios it needs."""
        keys = [self.numerator] if self.denominator is None else [self.numerator, self.denominator]
        return {key[0] for key in keys}

    def evaluate(self, results: Results) -> dict[str, Any]:
        """The value and the verdict: PASS, MISS, info, or n/a with the reason."""
        verdict: dict[str, Any] = {
            "name": self.name,
            "label": self.label,
            "op": self.op if self.goal is not None else None,
            "goal": self.goal,
            "unit": self.unit,
            "value": None,
        }
        keys = [self.numerator] if self.denominator is None else [self.numerator, self.denominator]
        for key in keys:
            if key not in results.series:
                return verdict | {"verdict": "n/a", "reason": _why_missing(key, results)}
        value = results.series[self.numerator].median
        if self.denominator is not None:
            value /= results.series[self.denominator].median
        verdict["value"] = value
        if self.goal is None:
            return verdict | {"verdict": "info"}
        passed = _COMPARE[self.op](value, self.goal)
        return verdict | {"verdict": "PASS" if passed else "MISS"}


def _why_missing(key: Key, results: Results) -> str:
    scenario, system, _ = key
    if (scenario, system) in results.failures:
        return f"{system} failed"
    for peer, reason in results.skipped.items():
        if system.startswith(peer):
            return f"{peer} {reason}"
    return f"{scenario}: {system} not run"


def targets(sizes: Sizes) -> list[Target]:
    """The targets of issue 5 (T1-T7), then a few ratios for information."""
    sync, fast = engine.system("sync"), engine.system("async")
    depth = engine.depth_system(sizes)
    raw_single = raw.system("1 put/txn", "sync")
    raw_step = raw.system("queue step", "sync")
    return [
        Target(
            "T1",
            f"{sync} e2e / {peers.HUEY_DURABLE} e2e",
            ("e2e", sync, "end-to-end"),
            ("e2e", peers.HUEY_DURABLE, "end-to-end"),
            goal=4,
        ),
        Target(
            "T1",
            f"{sync} e2e / {peers.PERSIST_QUEUE} e2e",
            ("e2e", sync, "end-to-end"),
            ("e2e", peers.PERSIST_QUEUE, "end-to-end"),
            goal=8,
        ),
        Target(
            "T2",
            f"{fast} e2e / {peers.HUEY_NO_FSYNC} e2e",
            ("e2e", fast, "end-to-end"),
            ("e2e", peers.HUEY_NO_FSYNC, "end-to-end"),
            goal=2,
        ),
        Target(
            "T3",
            f"{sync} sequential enqueue, paused pool / {raw_single}",
            ("sequential", sync, "enqueue, paused pool"),
            ("raw", raw_single, "put"),
            goal=0.8,
        ),
        Target(
            "T4",
            f"{sync} enqueue_many enqueue",
            ("enqueue_many", sync, "enqueue"),
            goal=300_000,
            unit="events/s",
        ),
        Target("T5", f"{sync} latency p50", ("latency", sync, "p50"), op="<=", goal=0.3, unit="ms"),
        Target("T5", f"{sync} latency p99", ("latency", sync, "p99"), op="<=", goal=2, unit="ms"),
        Target(
            "T6",
            f"enqueue cost at {sizes.depth:,} / at {sizes.shallow:,} pending",
            ("depth", depth, "deep / shallow"),
            op="<=",
            goal=1.2,
        ),
        Target(
            "T6",
            f"RSS growth with {sizes.depth:,} pending",
            ("depth", depth, "RSS growth"),
            op="<",
            goal=64,
            unit="MiB",
        ),
        Target(
            "T7",
            f"start {sizes.instances:,} instances",
            ("scale", engine.scale_system(sizes), "start (define)"),
            op="<",
            goal=3,
            unit="s",
        ),
        *_ceiling_targets(),
        Target(
            "info",
            f"{sync} sequential enqueue, running pool / {raw_single}",
            ("sequential", sync, "enqueue, running pool"),
            ("raw", raw_single, "put"),
        ),
        Target(
            "info",
            f"{fast} sequential enqueue, paused pool / {raw.system('1 put/txn', 'async')}",
            ("sequential", fast, "enqueue, paused pool"),
            ("raw", raw.system("1 put/txn", "async"), "put"),
        ),
        Target(
            "info",
            f"RSS growth with {sizes.depth:,} pending / raw LMDB, the same writes",
            ("depth", depth, "RSS growth"),
            ("depth", raw.deep_fill_system(sizes), "RSS growth"),
        ),
        Target(
            "info",
            f"{sync} e2e / {raw_step}",
            ("e2e", sync, "end-to-end"),
            ("raw", raw_step, "queue step"),
        ),
        Target(
            "info",
            f"{sync} enqueue_many / {raw.system(f'{sizes.batch_size:,} puts/txn', 'sync')}",
            ("enqueue_many", sync, "enqueue"),
            ("raw", raw.system(f"{sizes.batch_size:,} puts/txn", "sync"), "put"),
        ),
    ]


def _ceiling_targets() -> list[Target]:
    """How far dopool is from the least Python of its design, and that from huey."""
    found = []
    for mode, huey in (("sync", peers.HUEY_DURABLE), ("async", peers.HUEY_NO_FSYNC)):
        dopool = engine.system(mode)
        via, direct = (ceiling.system(shape, mode) for shape in ceiling.SHAPES)
        found.append(Target("info", f"{dopool} e2e / {via}", _e2e(dopool), _e2e(via)))
        for shape in (via, direct):
            found.append(Target("info", f"{shape} / {huey} e2e", _e2e(shape), _e2e(huey)))
    return found


def _e2e(system: str) -> Key:
    return ("e2e", system, "end-to-end")


# --- text ------------------------------------------------------------------------------


def number(value: float) -> str:
    """A value with as many digits as its size deserves."""
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def table(series: Sequence[Series]) -> str:
    """One row per metric: median, min-max over the repeats, unit and sample count."""
    header = ("scenario", "system", "metric", "median", f"min{DASH}max", "unit", "n")
    rows = [
        (
            s.scenario,
            s.system,
            s.metric,
            number(s.median),
            f"{number(s.low)}{DASH}{number(s.high)}" if len(s.samples) > 1 else "",
            s.unit,
            str(len(s.samples)),
        )
        for s in series
    ]
    return _align(header, rows, numeric={3, 4, 6})


def target_lines(verdicts: Sequence[dict[str, Any]]) -> str:
    header = ("target", "measure", "value", "goal", "verdict")
    rows = []
    for v in verdicts:
        unit = "" if v["unit"] == "x" else f" {v['unit']}"
        value = "" if v["value"] is None else f"{number(v['value'])}{unit}"
        if v["unit"] == "x" and v["value"] is not None:
            value = f"{v['value']:.2f}x"
        goal = "" if v["goal"] is None else f"{v['op']} {v['goal']:,g}{unit}"
        verdict = v["verdict"] if v["verdict"] != "n/a" else f"n/a ({v['reason']})"
        rows.append((v["name"], v["label"], value, goal, verdict))
    return _align(header, rows, numeric={2})


def _align(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(width) if i in numeric else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


# --- JSON ------------------------------------------------------------------------------


def document(
    config: dict[str, Any],
    env: dict[str, Any],
    results: Results,
    verdicts: Sequence[dict[str, Any]],
    elapsed: float,
) -> dict[str, Any]:
    """Everything of a run for ``--json``: config, environment, every sample, the targets."""
    return {
        "config": config,
        "environment": env,
        "elapsed_s": elapsed,
        "figures": [
            {
                "scenario": s.scenario,
                "system": s.system,
                "metric": s.metric,
                "unit": s.unit,
                "median": s.median,
                "min": s.low,
                "max": s.high,
                "samples": s.samples,
            }
            for s in results.series.values()
        ],
        "samples": results.samples,
        "targets": list(verdicts),
        "failures": [
            {"scenario": scenario, "system": system, "error": error}
            for (scenario, system), error in results.failures.items()
        ],
        "skipped": results.skipped,
    }
