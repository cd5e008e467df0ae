"""What every benchmark shares: sizes, cases, readings, rounds, events and the environment.

A *case* is one system in one scenario (``dopool sync`` in ``e2e``); running it on a
fresh directory returns *readings* (metric, unit, value). :func:`run_rounds` runs every
case once per round, round after round, so that a slow spell of the disk spreads over
all the cases instead of landing on one. A case that raises is recorded as failed and
left out of the later rounds; the others go on.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import platform
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, Any

import lmdb
import msgpack

SCENARIOS = ("e2e", "sequential", "enqueue_many", "latency", "raw", "depth", "scale")
# The peers' distributions, for the versions in the environment and the skip message.
PEER_PACKAGES = ("huey", "persist-queue", "redis", "rq", "arq", "dramatiq", "celery")
INSTALL_HINT = "pip install 'dopool[bench]'"
# Generous: a stalled system fails its case instead of hanging the run.
TIMEOUT = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizes:
    """How much work each scenario does; the defaults are the full run."""

    events: int = 20_000  # end-to-end, shared by the producers
    producers: int = 4
    concurrency: int = 4
    sequential: int = 5_000  # sequential enqueue, and the raw LMDB single puts
    batch_size: int = 1_000
    batches: int = 10
    latency: int = 1_000
    shallow: int = 1_000  # pending events before the shallow depth probe
    depth: int = 1_000_000  # pending events before the deep depth probe
    probe: int = 2_000  # timed enqueues (and processed events) at each depth
    depth_event_bytes: int = 200
    instances: int = 1_024
    scale_events: int = 10_240

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.depth < self.shallow:
            raise ValueError(f"depth ({self.depth}) must be >= shallow ({self.shallow})")


# A smoke run: every scenario, small enough for well under a minute.
QUICK = Sizes(
    events=2_000,
    sequential=1_000,
    batches=2,
    latency=200,
    depth=20_000,
    probe=500,
    scale_events=2_048,
)


@dataclass(frozen=True, slots=True)
class Reading:
    """One measured value of one run."""

    metric: str
    unit: str
    value: float


Run = Callable[[Path], list[Reading]]


@dataclass(frozen=True, slots=True)
class Case:
    """One system in one scenario; ``run(directory)`` measures it once on a fresh directory."""

    scenario: str
    system: str
    run: Run
    once: bool = False  # slow: measured in the first round only


Key = tuple[str, str, str]  # scenario, system, metric


@dataclass(slots=True)
class Series:
    """Every sample of one metric of one case, in round order."""

    scenario: str
    system: str
    metric: str
    unit: str
    samples: list[float] = field(default_factory=list)

    @property
    def key(self) -> Key:
        return (self.scenario, self.system, self.metric)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)


@dataclass(slots=True)
class Results:
    """Everything a run measured, in the order it was first measured."""

    series: dict[Key, Series] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[tuple[str, str], str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # peer -> why

    def record(self, round_: int, case: Case, seconds: float, readings: list[Reading]) -> None:
        for reading in readings:
            key = (case.scenario, case.system, reading.metric)
            series = self.series.setdefault(
                key, Series(case.scenario, case.system, reading.metric, reading.unit)
            )
            series.samples.append(reading.value)
            self.samples.append(
                {
                    "round": round_,
                    "scenario": case.scenario,
                    "system": case.system,
                    "metric": reading.metric,
                    "unit": reading.unit,
                    "value": reading.value,
                    "run_seconds": seconds,
                }
            )


def run_rounds(
    cases: Sequence[Case],
    rounds: int,
    root: Path,
    progress: Callable[[str], None],
    *,
    repeat_once: bool = False,
) -> Results:
    """Run every case once per round; ``once`` cases only in the first unless ``repeat_once``."""
    results = Results()
    for round_ in range(1, rounds + 1):
        for number, case in enumerate(cases):
            name = (case.scenario, case.system)
            if name in results.failures or (case.once and round_ > 1 and not repeat_once):
                continue
            store = root / f"r{round_}-{number}"
            gc.collect()
            started = time.perf_counter()
            try:
                readings = case.run(store)
            except Exception as exc:  # one broken case must not end the run
                error = f"{type(exc).__name__}: {exc}"
                results.failures[name] = error
                progress(
                    f"round {round_}/{rounds}  {case.scenario}: {case.system}: FAILED: {error}"
                )
                continue
            finally:
                shutil.rmtree(store, ignore_errors=True)
            seconds = time.perf_counter() - started
            results.record(round_, case, seconds, readings)
            progress(f"round {round_}/{rounds}  {case.scenario}: {case.system}  ({seconds:.1f} s)")
    return results


@contextmanager
def work_directory(parent: Path) -> Iterator[Path]:
    """A fresh temporary directory under ``parent``, removed afterwards."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="dopool-bench-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- events ----------------------------------------------------------------------------

BODY = "x" * 64


def make_event(number: int, body: str = BODY) -> dict[str, Any]:
    """The benchmark event: ``{"n": number, "body": body}``."""
    return {"n": number, "body": body}


def body_for(size: int) -> str:
    """A body that makes the msgpack encoding of an event exactly ``size`` bytes.

    Exact for ``n`` from 2**16 to 2**32 - 1; a smaller ``n`` encodes a few bytes shorter.
    """
    overhead = len(msgpack.packb(make_event(1 << 16, ""), use_bin_type=True))
    length = size - overhead
    for _ in range(3):  # the string header grows with the length
        encoded = len(msgpack.packb(make_event(1 << 16, "x" * length), use_bin_type=True))
        length += size - encoded
    if length < 0:
        raise ValueError(f"an event cannot be as small as {size} bytes")
    return "x" * length


def record_size(event: Any) -> int:
    """Bytes of dopool's stored record for ``event``: msgpack of (event, time, key, priority)."""
    encoded = msgpack.packb(event, use_bin_type=True)
    return len(msgpack.packb([encoded, time.time(), None, 0], use_bin_type=True))


# --- measuring -------------------------------------------------------------------------


def run_producers(enqueue: Callable[[Any], Any], events: int, threads: int) -> tuple[float, float]:
    """``threads`` threads share ``events`` single enqueues, released together.

    Returns the time of the release and the time the last producer finished.
    """
    shares = [[make_event(i) for i in range(first, events, threads)] for first in range(threads)]
    ready = threading.Barrier(threads + 1, timeout=TIMEOUT)  # every producer is waiting
    go = threading.Event()

    def produce(share: list[dict[str, Any]]) -> None:
        ready.wait()
        go.wait()
        for event in share:
            enqueue(event)

    with ThreadPoolExecutor(threads, thread_name_prefix="producer") as executor:
        futures = [executor.submit(produce, share) for share in shares]
        try:
            ready.wait()
        except BaseException:
            ready.abort()  # so that no producer waits for the release forever
            raise
        start = time.perf_counter()
        go.set()
        for future in futures:
            future.result()  # re-raises a producer's error
    return start, time.perf_counter()


def rate(count: int, seconds: float) -> float:
    """Events per second, refusing a zero-length interval rather than dividing by it."""
    if seconds <= 0:
        raise RuntimeError(f"{count} events took {seconds} s: the clock did not advance")
    return count / seconds


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile by the nearest-rank method (0 < fraction <= 1)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


def latency_line(name: str, seconds: Sequence[float], *, minimum: bool = False) -> str:
    """One line of a latency summary in milliseconds: p50, p99 and the maximum, and the
    minimum first if asked."""
    ordered = sorted(seconds)
    low = f"min {ordered[0] * 1e3:7.2f} ms   " if minimum else ""
    return (
        f"{name:<10} {len(ordered):>5} events   {low}"
        f"p50 {percentile(ordered, 0.50) * 1e3:8.2f} ms   "
        f"p99 {percentile(ordered, 0.99) * 1e3:8.2f} ms   max {ordered[-1] * 1e3:8.2f} ms"
    )


def memory_kib() -> dict[str, int]:
    """This process's resident memory in KiB, from /proc/self/status (Linux only)."""
    gc.collect()
    found = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in ("VmRSS", "RssAnon", "RssFile"):
                    found[name] = int(rest.split()[0])
    except OSError as exc:
        raise RuntimeError("resident memory needs /proc/self/status (Linux)") from exc
    return found


def peer_missing(module: str) -> bool:
    """Whether an optional peer is not installed (its cases are then skipped)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a broken install, or a None in sys.modules
        return True


# --- processes -------------------------------------------------------------------------


class Child:
    """A process of the benchmarks (or ``dopool worker``), its stdout read line by line.

    ``env`` is added to this process's environment. Its stderr is kept (the last 64 KiB)
    for the error that names it, read as it comes so that the child never blocks on it.
    """

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.command = command
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self.at: dict[str, float] = {}  # when each line was first read
        self._ended = False  # its stdout closed: no more lines
        self._errors: list[str] = []
        self._seen = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self._keep, args=(self.proc.stderr,), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        with stream:  # closed by its reader, at its end
            for line in stream:
                with self._seen:
                    self.at.setdefault(line.strip(), time.perf_counter())
                    self.lines.append(line.strip())
                    self._seen.notify_all()
        with self._seen:
            self._ended = True
            self._seen.notify_all()

    def _keep(self, stream: IO[str] | None) -> None:
        assert stream is not None
        with stream:
            for line in stream:
                with self._seen:
                    self._errors.append(line)
                    while len(self._errors) > 1 and sum(map(len, self._errors)) > 65_536:
                        del self._errors[0]

    def _has(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for line in self.lines)

    def wait_for(self, prefix: str, *, unless: Sequence[Child] = ()) -> float:
        """The time its first line starting with ``prefix`` was read (waits for it).

        Fails if it ends without that line, if ``TIMEOUT`` passes, or as soon as one of
        ``unless`` (the processes feeding it) has exited with an error.
        """
        deadline = time.perf_counter() + TIMEOUT
        failed: list[Child] = []
        with self._seen:
            while not (self._has(prefix) or self._ended):
                failed = [child for child in unless if child.proc.poll()]
                left = deadline - time.perf_counter()
                if failed or left <= 0:
                    break
                self._seen.wait(min(left, 0.1) if unless else left)
            if self._has(prefix):
                return next(at for line, at in self.at.items() if line.startswith(prefix))
        if failed:
            raise RuntimeError(
                f"{failed[0].command!r} exited with {failed[0].proc.returncode} before "
                f"{self.command!r} said {prefix!r}: {failed[0].errors()[-4000:]}"
            )
        self.proc.poll()
        raise RuntimeError(
            f"{self.command!r} (exit status {self.proc.returncode}): no {prefix!r}: "
            f"{self.errors()[-4000:]}"
        )

    def errors(self) -> str:
        """What it wrote to stderr so far (the last 64 KiB)."""
        with self._seen:
            return "".join(self._errors)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self, *, signalled: bool = True) -> int:
        """Its exit status, after a SIGTERM (or none: it ends by itself)."""
        if signalled and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        for reader in self._readers:  # each closes its stream at its end
            reader.join(TIMEOUT)
        return code


# --- environment -----------------------------------------------------------------------


def environment(directory: Path) -> dict[str, Any]:
    """What the numbers depend on: interpreter, libraries, CPUs, and the directory's disk."""
    return {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "lmdb": ".".join(str(part) for part in lmdb.version()),
        "sqlite": sqlite3.sqlite_version,
        "packages": {
            name: _version(name) for name in ("dopool", "pykka", "lmdb", "msgpack", *PEER_PACKAGES)
        },
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "filesystem": filesystem(directory),
        "argv": sys.argv,
    }


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


def filesystem(directory: Path) -> dict[str, str] | None:
    """The mount holding ``directory`` (device, mount point, type, options), if Linux says."""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            lines = mounts.read().splitlines()
    except OSError:
        return None
    target = directory.resolve()
    best: dict[str, str] | None = None
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        device, point, kind, options = (_unescape(part) for part in parts[:4])
        if target.is_relative_to(point) and (best is None or len(point) > len(best["mount"])):
            best = {"device": device, "mount": point, "type": kind, "options": options}
    return best


def _unescape(text: str) -> str:
    """Undo the octal escapes of /proc/self/mounts (a space is ``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), text)
