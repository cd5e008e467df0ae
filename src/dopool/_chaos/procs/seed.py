"""One seed of the multi-process mode, start to end: :func:`run_seed`.

The run lives in a temporary directory: the store, every process's records and
output. It is removed when the seed passes, and kept, its path in the result,
when it fails.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

from dopool._chaos.procs import checker, records
from dopool._chaos.procs.plan import POOL, Plan, draw
from dopool._chaos.procs.runner import Processes, Stuck, drive, finish
from dopool._chaos.result import Result
from dopool._errors import DopoolError
from dopool._handles.connection import connect
from dopool._machine.invariants import SUCCESS_COUNTER
from dopool._ops.storeview import open_view

#: A line a worker logged at WARNING or above (``dopool worker --log-level warning``).
WARNED = re.compile(r"^\S+ \S+ (?:WARNING|ERROR|CRITICAL) .*$", re.MULTILINE)


def run_seed(seed: int, *, root: Path | None = None, keep: bool = False) -> Result:
    """Run ``seed``'s plan with real processes and check it; ``keep`` keeps the directory
    even when the seed passes."""
    plan = draw(seed)
    where = root or Path(tempfile.mkdtemp(prefix=f"dopool-chaos-{seed}-"))
    where.mkdir(parents=True, exist_ok=True)
    result = Result(seed=seed, violations=[], processes=True, big=plan.big)
    started = time.perf_counter()
    processes = Processes(plan, where)
    try:
        drive(processes)
        finish(processes)
    except Stuck as exc:
        result.violations.append(f"stuck: {exc}; done: {' '.join(processes.done)}")
        result.violations += _stderr(where)
        processes.close(dump=True)
        result.violations.append("the stacks of the processes left running: *.err")
    except BaseException:
        processes.close()
        raise
    else:
        processes.close()
        found = records.read(where, plan.producers, len(processes.generations))
        try:
            ending = _ending(processes)
        except DopoolError as exc:  # the store cannot even be read: that is the finding
            result.violations.append(f"the store at the end: {type(exc).__name__}: {exc}")
        else:
            result.violations += checker.check(plan, found, ending)
            _tally(result, plan, found, ending)
    result.steps = len(processes.done)
    result.log = processes.done
    result.wall_time = time.perf_counter() - started
    if result.ok and not keep:
        shutil.rmtree(where, ignore_errors=True)
    else:
        result.kept = str(where)
    return result


def _ending(processes: Processes) -> checker.Ending:
    # One environment at a time: LMDB must not be opened twice by one process.
    with connect(processes.store, durability="async") as connection:
        pool = connection.pool(POOL)
        status, dead_letters = pool.status(), pool.dead_letters()
        counted = {  # each handler's success counter (guarantee 6)
            i.index: pool.storage(instance=i.index).get(SUCCESS_COUNTER, 0)
            for i in status.instances
        }
    with open_view(processes.store) as view:
        report = view.check()
    problems = [f"{p.instance or 'store'}: {p.what}" for p in report.problems]
    errors = {  # from the last traceback on: the workers' warnings may come before
        path.name: text[text.rindex("Traceback") :][:2000]
        for path in sorted(processes.root.glob("*.err"))
        if "Traceback" in (text := path.read_text(errors="replace"))
    }
    logged = {
        path.name: found
        for path in sorted(processes.root.glob("worker-*.err"))
        if (found := [m.group(0) for m in WARNED.finditer(path.read_text(errors="replace"))])
    }
    gens = processes.generations
    return checker.Ending(
        status=status,
        dead_letters=dead_letters,
        counted=counted,
        problems=problems,
        killed={g.number for g in gens if g.ended == "killed"},
        kill_times={g.number: g.killed_at for g in gens if g.killed_at is not None},
        worker_codes={g.number: g.code for g in gens if g.code is not None},
        producer_codes=dict(processes.producer_codes),
        errors=errors,
        warnings=logged,
    )


def _stderr(where: Path) -> list[str]:
    """The last lines each process wrote to stderr, if any."""
    tails = []
    for path in sorted(where.glob("*.err")):
        lines = path.read_text(errors="replace").strip().splitlines()
        if lines:
            tails.append(f"{path.name}: {' | '.join(lines[-3:])}")
    return tails


def _tally(result: Result, plan: Plan, found: records.Records, ending: checker.Ending) -> None:
    delayed = {i for stream in plan.streams for s in stream if s.delay is not None for i in s.ids}
    answers = found.answers.values()
    result.scheduled = sum(1 for i, a in found.answers.items() if i in delayed and not a.duplicate)
    result.acknowledged = sum(1 for a in answers if not a.duplicate)
    result.duplicates = sum(1 for a in answers if a.duplicate)
    result.enqueued = ending.status.enqueued
    result.executions = len(found.attempts)
    result.crashes = len(ending.killed)
    result.restarts = len(found.timelines) - 1
    result.succeeded = ending.status.succeeded
    result.dead_lettered = ending.status.dead_lettered
    result.frozen_producers = sum(1 for f in found.landed if f.kind == "producer")
    result.frozen_workers = sum(1 for f in found.landed if f.kind == "worker")
    result.freezes_missed = len(found.freezes) - len(found.landed)
    result.refused = len(found.refused)
