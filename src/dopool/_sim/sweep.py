"""Sweeps: a scenario run over a grid of field values, each point over several seeds.

A sweep is one or more :class:`Axis` (a numeric field and its values), their
cartesian product (the first axis varies slowest), and ``repeat`` seeds per
point: ``seed, seed + 1, ..., seed + repeat - 1`` where ``seed`` is the point's
own (the scenario's, unless ``seed`` itself is swept). Every point uses the same
seeds, so two designs meet the same arrivals and draws and their difference is
not noise of the draws. Each run is :func:`dopool._sim.driver.run` in a process
of its own when ``jobs > 1`` (the command line's default is :func:`usable_cpus`),
or a Ray task with a Ray executor (:mod:`dopool._sim.executors`); the outcomes are
put back in grid order, so the result is the same whatever ``jobs`` and the
executor are.

Each figure of :func:`dopool._sim.figures.figures` is summed up over a point's
seeds as an :class:`Estimate`: the mean and the half-width of its 95%
confidence interval (Student's t over the ``repeat`` values; none for one seed).
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dopool._errors import ConfigurationError, DopoolError, ScenarioError
from dopool._sim.driver import run
from dopool._sim.executors import LOCAL, Executor, ray_map
from dopool._sim.figures import NAMES, figures
from dopool._sim.ignored import ignored
from dopool._sim.interrupt import interrupt_workers, worker_setup
from dopool._sim.loading import numeric_fields, parse_value, with_overrides, with_seed
from dopool._sim.scenario import NO_APP, Scenario

#: The table's columns unless chosen: what compares two designs at a glance.
DEFAULT_FIGURES = (
    "utilisation",
    "mean",
    "p99",
    "throughput",
    "dead_lettered",
    "pending",
    "cost.month",
)
CONFIDENCE = 0.95
MAX_VALUES = 1000  # per axis: a range that expands further is refused
MAX_RUNS = 10_000  # points x seeds
MAX_REPEAT = 1000

#: The 0.975 quantile of Student's t for 1..30 degrees of freedom (two-sided 95%).
T_975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004,
    2.262157, 2.228139, 2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905,
    2.109816, 2.100922, 2.093024, 2.085963, 2.079614, 2.073873, 2.068658, 2.063899,
    2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)  # fmt: skip

#: ``progress(runs_done, runs_total)``, called in the calling process.
Progress = Callable[[int, int], None]


class SweepRunError(ConfigurationError):
    """A run of a sweep failed (its app raised, say): which one, and what went wrong.

    Attributes:
        point: the run's swept values (``"instances=2"``; ``""`` for ``--repeat`` alone).
        seed: the run's seed.
        problem: what the run raised, as its message.
    """

    def __init__(self, point: str, seed: int, problem: str) -> None:
        self.point = point
        self.seed = seed
        self.problem = problem
        super().__init__(f"{_where(point, seed)}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:  # back from a worker process, whole
        return (SweepRunError, (self.point, self.seed, self.problem))


class SweepError(ValueError):
    """A ``--sweep``, ``--repeat`` or figure name that cannot be used (a usage error)."""


# -- statistics ---------------------------------------------------------------------------
def t_quantile(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom.

    A table for 1..30; beyond, the Cornish-Fisher expansion around the normal
    quantile, within 1e-6 of the exact value.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = statistics.NormalDist().inv_cdf(0.975)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
    )
    return z + math.fsum(term / df ** (power + 1) for power, term in enumerate(terms))


@dataclass(frozen=True, slots=True)
class Estimate:
    """One figure over a point's seeds: the mean, the 95% half-width, each seed's value."""

    mean: float
    half_width: float | None  # None for a single seed
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Estimate:
        if not values:
            raise ValueError("an estimate needs at least one value")
        values = [float(value) for value in values]
        mean = statistics.fmean(values)
        if len(values) == 1:
            return cls(mean, None, tuple(values))
        spread = statistics.stdev(values, mean)
        half = t_quantile(len(values) - 1) * spread / math.sqrt(len(values))
        return cls(mean, half, tuple(values))

    def to_json_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "half_width": self.half_width, "values": list(self.values)}


# -- the grid -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Axis:
    """A swept field and its values, in the order given."""

    field: str
    values: tuple[Any, ...]


def parse_axis(spec: str, scenario: Scenario | None = None) -> Axis:
    """``FIELD=V1,V2,...``; each part a value or a range (see :func:`expand_range`).
    Given the ``scenario``, a field of one of its pools (``pools.NAME.instances``) too.
    A parameter of the app (``app.NAME``) takes any value a flag gives it
    (:func:`~dopool._sim.loading.parse_value`); a range, numbers."""
    field, sep, text = spec.partition("=")
    field = field.strip()
    parts = [part.strip() for part in text.split(",")]
    if not sep or not field or not any(parts):
        raise SweepError(f"--sweep expects FIELD=V1,V2,... or FIELD=START..STOP, got {spec!r}")
    numeric = numeric_fields(scenario)
    if field.startswith("app.") and scenario is not None and scenario.app is None:
        raise ScenarioError(field, NO_APP, source="--sweep")
    if field not in numeric and not field.startswith("app."):
        problem = f"is not a numeric scenario field{_hint(field, numeric)}"
        raise ScenarioError(field, problem, source="--sweep")
    values: list[Any] = []
    for part in parts:
        if not part:
            continue
        try:
            found = expand_range(field, part) if ".." in part else [parse_value(field, part)]
        except ScenarioError as exc:
            raise exc.from_source("--sweep") from None
        for value in found:
            if value in values:
                raise SweepError(f"--sweep {field}: the value {value_text(value)} is given twice")
            values.append(value)
    if len(values) > MAX_VALUES:
        raise SweepError(f"--sweep {field}: {len(values):,} values; at most {MAX_VALUES:,}")
    return Axis(field, tuple(values))


def _hint(field: str, numeric: list[str]) -> str:
    import difflib  # noqa: PLC0415 - only on this error path

    close = [path for path in numeric if path.endswith("." + field)]
    close = close or difflib.get_close_matches(field, numeric, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def expand_range(field: str, text: str) -> list[Any]:
    """``START..STOP`` (step 1, integer fields only), ``START..STOP+STEP``, ``START..STOPxFACTOR``.

    The stop is included when the steps land on it. Float values are rounded to
    12 significant digits, so ``0.1..0.3+0.1`` is 0.1, 0.2, 0.3.
    """
    start_text, _, rest = text.partition("..")
    stop_text, op, step_text = _split_step(rest)
    start, stop = parse_value(field, start_text), parse_value(field, stop_text)
    where = f"--sweep {field}={text}"
    if not (_numeric(start) and _numeric(stop)):
        raise SweepError(f"{where}: a range needs a number at each end")
    integer = isinstance(start, int)
    if op is None and not integer:
        raise SweepError(f"{where}: a range of a float field needs a step, START..STOP+STEP")
    step = parse_value(field, step_text) if op is not None else 1
    if not _numeric(step):
        raise SweepError(f"{where}: the step must be a number")
    if not all(math.isfinite(number) for number in (start, stop, step)):
        raise SweepError(f"{where}: a range needs finite numbers")  # nan: 1,000 values
    if stop < start:
        raise SweepError(f"{where}: the range ends below its start")
    if op == "x" and (step <= 1 or start <= 0):
        raise SweepError(f"{where}: a factor must be > 1 and the start > 0")
    if op != "x" and step <= 0:
        raise SweepError(f"{where}: the step must be > 0")
    values: list[Any] = []
    for index in itertools.count():
        value = start * step**index if op == "x" else start + step * index
        if isinstance(value, float):
            value = float(f"{value:.12g}")
        if value > stop * (1 + 1e-9) + (0 if op == "x" else abs(step) * 1e-9):
            return values
        if len(values) == MAX_VALUES:
            raise SweepError(f"{where}: more than {MAX_VALUES:,} values")
        values.append(value)
    raise AssertionError("unreachable")  # pragma: no cover


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _split_step(text: str) -> tuple[str, str | None, str]:
    """``"16x2"`` as ``("16", "x", "2")``; a ``+`` after ``e`` is an exponent's sign."""
    for position in range(len(text) - 1, 0, -1):
        char = text[position].lower()
        if char == "x" or (char == "+" and text[position - 1] not in "eE"):
            return text[:position], char, text[position + 1 :]
    return text, None, ""


def check_axes(axes: Sequence[Axis], repeat: int) -> None:
    """Refuse a field swept twice, a bad ``repeat``, or too many runs in all."""
    seen: set[str] = set()
    for axis in axes:
        if axis.field in seen:
            raise SweepError(f"--sweep: the field '{axis.field}' is swept twice")
        seen.add(axis.field)
    if not 1 <= repeat <= MAX_REPEAT:
        raise SweepError(f"--repeat must be between 1 and {MAX_REPEAT}, got {repeat}")
    runs = math.prod(len(axis.values) for axis in axes) * repeat
    if runs > MAX_RUNS:
        raise SweepError(f"the sweep would make {runs:,} runs; at most {MAX_RUNS:,}")


def grid(axes: Sequence[Axis]) -> list[tuple[Any, ...]]:
    """Every point, the first axis varying slowest (as ``itertools.product``)."""
    return list(itertools.product(*(axis.values for axis in axes)))


def check_figures(names: Sequence[str], flag: str = "--sweep-figures") -> tuple[str, ...]:
    """The figure names as given, each one a name a figure may have
    (:data:`~dopool._sim.figures.NAMES`): a pool's (``orders.p99``) and the end-to-end
    ones (``e2e.p99``) too; whether a run measures it is known only after the run.
    """
    known = list(NAMES)
    for name in names:
        if name not in NAMES:
            hint = _close(name, known)
            raise SweepError(f"{flag}: '{name}' is not a figure{hint}; see docs/simulate.md")
    if not names:
        raise SweepError(f"{flag}: no figure named")
    return tuple(names)


def _close(name: str, known: list[str]) -> str:
    import difflib  # noqa: PLC0415 - only on this error path

    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def value_text(value: Any) -> str:
    """A swept value as the table and store directories show it: ``none``, ``20``, ``0.05``."""
    if value is None:
        return "none"
    if isinstance(value, bool):  # an app's parameter, as TOML and a flag write it
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def unit(name: str) -> str:
    """How a figure reads: ``"s"`` (seconds), ``"%"`` (a share), ``"/s"`` (a rate), ``"$"``
    (US dollars), or ``""``."""
    parts = name.split(".")
    if parts[0] == "cost":
        return "$"
    if parts[0] == "active":  # instances running: a count
        return ""
    if "utilisation" in parts:
        return "%"
    if parts[-1] in {"mean", "p50", "p95", "p99", "max", "virtual_time"}:
        return "s"
    if parts[-1] == "throughput":
        return "/s"
    return ""


def label(axes: Sequence[Axis], values: Sequence[Any]) -> str:
    """``instances=2,arrivals.rate=100``: a point by its swept values."""
    return ",".join(f"{axis.field}={value_text(v)}" for axis, v in zip(axes, values, strict=True))


# -- running ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run of a sweep brings back: its figures and the checks that failed."""

    figures: dict[str, float]
    failed: tuple[str, ...]


def run_one(scenario: Scenario, store: str | None, point: str = "") -> Outcome:
    """One run, reduced to what a sweep keeps (the worker processes run this).

    Raises:
        ScenarioError, SweepRunError: the run failed; the error names the run's
            ``point`` and seed (and survives the way back from a worker process).
    """
    try:
        finished = run(scenario, store=store)
    except ScenarioError as exc:
        where = f"--sweep {point}" if point else "--repeat"
        raise exc.from_source(f"{where}, seed {scenario.seed}") from None
    except DopoolError as exc:
        raise SweepRunError(point, scenario.seed, str(exc)) from None
    failed = tuple(check.name for check in finished.result.invariants if not check.passed)
    return Outcome(figures(finished.result), failed)


@dataclass(frozen=True, slots=True)
class Point:
    """One point of a sweep: its swept values, its seeds, each figure over them."""

    values: tuple[Any, ...]
    seeds: tuple[int, ...]
    figures: dict[str, Estimate]
    failed: tuple[tuple[int, tuple[str, ...]], ...]  # (seed, checks that failed), if any

    @property
    def passed(self) -> bool:
        return not self.failed


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Every point of a sweep, in grid order."""

    scenario: Scenario
    axes: tuple[Axis, ...]
    repeat: int
    points: tuple[Point, ...]

    def to_json_dict(self) -> dict[str, Any]:
        """The same sweep gives the same document (no wall time is kept)."""
        return {
            "scenario": self.scenario.to_dict(),
            "sweep": {
                "fields": [axis.field for axis in self.axes],
                "values": {axis.field: list(axis.values) for axis in self.axes},
                "repeat": self.repeat,
                "confidence": CONFIDENCE,
            },
            "points": [
                {
                    "values": {
                        axis.field: value
                        for axis, value in zip(self.axes, point.values, strict=True)
                    },
                    "seeds": list(point.seeds),
                    "invariants_failed": [
                        {"seed": seed, "checks": list(checks)} for seed, checks in point.failed
                    ],
                    "figures": {name: est.to_json_dict() for name, est in point.figures.items()},
                }
                for point in self.points
            ],
        }


def run_sweep(
    scenario: Scenario,
    axes: Sequence[Axis],
    *,
    repeat: int = 1,
    jobs: int | None = 1,
    store: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    executor: Executor = LOCAL,
) -> SweepResult:
    """Run every point of the grid ``repeat`` times; each run stands alone.

    ``jobs`` runs at a time, each in a worker process (None: one per CPU this process
    may use, :func:`usable_cpus`); with ``jobs = 1``, or a single run, every run is
    made in this process. With a Ray ``executor`` each run is a Ray task instead, at
    most ``jobs`` out at once (None: all; the cluster schedules them). With ``store``,
    each run keeps its store in ``<store>/<field>=<value>[,<field>=<value>...]/seed=<seed>``.
    Every point's scenario is built (and checked) before the first run.

    Raises:
        ScenarioError: with an address, the scenario names a file that cannot travel.
        ConfigurationError: ``store`` with an address (its runs' stores would be on the
            cluster's nodes), or a used ``store``.
    """
    axes = tuple(axes)
    check_axes(axes, repeat)
    if jobs is None and not executor.ray:
        jobs = usable_cpus()
    if jobs is not None and jobs < 1:
        raise SweepError(f"--jobs must be >= 1, got {jobs}")
    if executor.ships:
        if store is not None:
            raise ConfigurationError(
                f"--store cannot be used with --executor {executor}: each run's store would "
                "be written on the cluster's node that ran it"
            )
        refuse_unshipped(scenario)
    plans: list[tuple[int, int, Scenario, str | None]] = []  # (point, seed, scenario, store)
    points = grid(axes)
    variants = []
    for index, values in enumerate(points):
        overrides = {axis.field: value for axis, value in zip(axes, values, strict=True)}
        try:
            variant = with_overrides(scenario, overrides) if overrides else scenario
        except ScenarioError as exc:
            raise exc.from_source(f"--sweep {label(axes, values)}") from None
        variants.append(variant)
        for seed in range(variant.seed, variant.seed + repeat):
            where = None
            if store is not None:
                base = Path(store) / label(axes, values) if axes else Path(store)
                where = os.fspath(base / f"seed={seed}")
            try:
                seeded = with_seed(variant, seed)
            except ScenarioError as exc:  # seed + repeat - 1 past the largest seed
                raise exc.from_source(f"--repeat {repeat}") from None
            plans.append((index, seed, seeded, where))
    refuse_ignored(axes, variants)
    for _, _, _, where in plans:  # refuse a used store before the first run, not midway
        if where is not None and Path(where).exists() and _used(Path(where)):
            raise ConfigurationError(
                f"--store {where!r} is not an empty directory; a simulation needs a fresh store"
            )
    work = [(plan[2], plan[3], label(axes, points[plan[0]])) for plan in plans]
    if executor.ray:
        outcomes = list(
            ray_map(
                run_one,
                work,
                executor=executor,
                describe=lambda position: _where(work[position][2], work[position][0].seed),
                limit=jobs,
                progress=progress,
                directory=bool(files(scenario)) or scenario.app is not None,
            )
        )
    else:
        assert jobs is not None
        outcomes = _execute(work, jobs, progress)
    by_point: list[list[tuple[int, Outcome]]] = [[] for _ in points]
    for (index, seed, _, _), outcome in zip(plans, outcomes, strict=True):
        by_point[index].append((seed, outcome))
    return SweepResult(
        scenario,
        axes,
        repeat,
        tuple(_point(values, runs) for values, runs in zip(points, by_point, strict=True)),
    )


def refuse_ignored(axes: Sequence[Axis], variants: Sequence[Scenario]) -> None:
    """Refuse a swept field that no point's run reads (:func:`~dopool._sim.ignored.ignored`):
    every value would give the same run, and the table would not say so."""
    found: list[dict[str, str]] = []  # each variant's, as far as a field needed them
    for axis in axes:
        for position, variant in enumerate(variants):
            if position == len(found):
                found.append(ignored(variant))
            if axis.field not in found[position]:
                break  # this point reads it
        else:
            problem = f"changes nothing in this sweep's runs: {found[0][axis.field]}"
            raise ScenarioError(axis.field, problem, source="--sweep")


def files(scenario: Scenario) -> list[tuple[str, str]]:
    """The files a run of ``scenario`` reads, each with its field: the app's (when it
    names a file), each replay's, each ``partitions.file``."""
    found: list[tuple[str, str]] = []
    if scenario.app is not None:
        target, _, _ = scenario.app.rpartition(":")
        if target.endswith(".py") or "/" in target:  # as load_app tells a file
            found.append(("app", target))
    for position, stream in enumerate(scenario.arrivals):
        if stream.file is not None:
            where = "arrivals" if len(scenario.arrivals) == 1 else f"arrivals[{position}]"
            found.append((f"{where}.file", stream.file))
    for pool in scenario.resolved_pools:
        if pool.partitions.file is not None:
            where = f"pools.{pool.name}." if scenario.pools else ""
            found.append((f"{where}partitions.file", pool.partitions.file))
    return found


def refuse_unshipped(scenario: Scenario) -> None:
    """Refuse a file a shipped job cannot take: only the directory dopool runs in travels
    to a Ray cluster (as its ``working_dir``), so each file must be named by a path
    inside it, relative to it."""
    here = os.getcwd()
    for field, path in files(scenario):
        if os.path.isabs(path):
            problem = (
                f"is an absolute path, {path!r}, which the Ray cluster's nodes need not "
                f"have: only the directory dopool runs in ({here!r}) travels, so name the "
                "file (or the scenario file, whose folder its paths are joined to) by a "
                "path relative to it"
            )
        elif os.path.normpath(path).split(os.sep)[0] == os.pardir:
            problem = (
                f"names {path!r}, outside the directory dopool runs in ({here!r}), the one "
                "that travels to the Ray cluster: run dopool from a directory that holds it"
            )
        else:
            continue
        raise ScenarioError(field, problem, source="--executor")


def _where(point: str, seed: int) -> str:
    """A run as an error names it: ``--sweep instances=2, seed 3``."""
    return f"{'--sweep ' + point if point else '--repeat'}, seed {seed}"


def _used(path: Path) -> bool:
    return not path.is_dir() or any(path.iterdir())


def _point(values: tuple[Any, ...], runs: list[tuple[int, Outcome]]) -> Point:
    names = [name for name in runs[0][1].figures if all(name in o.figures for _, o in runs)]
    return Point(
        values,
        tuple(seed for seed, _ in runs),
        {name: Estimate.of([outcome.figures[name] for _, outcome in runs]) for name in names},
        tuple((seed, outcome.failed) for seed, outcome in runs if outcome.failed),
    )


def usable_cpus() -> int:
    """How many CPUs this process may run on: its affinity mask where the system keeps
    one (``taskset`` or a container may allow fewer than the machine has), else the
    machine's count, else 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _execute(
    work: list[tuple[Scenario, str | None, str]], jobs: int, progress: Progress | None
) -> list[Outcome]:
    """Every run's outcome, in the order of ``work``, whatever order they finish in.

    One job, or one run, needs no worker: it runs here, without a process pool's start.
    """
    total = len(work)
    if progress is not None:
        progress(0, total)
    if jobs == 1 or total <= 1:
        outcomes = []
        for scenario, store, point in work:
            outcomes.append(run_one(scenario, store, point))
            if progress is not None:
                progress(len(outcomes), total)
        return outcomes
    results: list[Outcome | None] = [None] * total
    done = 0
    executor = ProcessPoolExecutor(
        max_workers=min(jobs, total), mp_context=_context(), initializer=worker_setup
    )
    try:
        futures: dict[Future[Outcome], int] = {
            executor.submit(run_one, scenario, store, point): position
            for position, (scenario, store, point) in enumerate(work)
        }
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            done += 1
            if progress is not None:
                progress(done, total)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):  # the workers' runs stop too
            interrupt_workers(executor)
        executor.shutdown(wait=True, cancel_futures=True)
        raise
    executor.shutdown(wait=True)
    return [outcome for outcome in results if outcome is not None]


def _context() -> multiprocessing.context.BaseContext:
    """Fresh worker processes: the engine runs threads, so never ``fork`` a live parent."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
