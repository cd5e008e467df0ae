"""One seed of the multi-process mode: its processes started, driven and stopped, then checked.

The runner starts a ``dopool worker`` (the app :mod:`.app`), and with a plan of
several workers the others beside it (each a *chain*: a worker and its restarts; all
open the store shared, with a short ``--lease-ttl``), waits for them to define
the pool, starts the producers (:mod:`.producer`) and counts the run's progress as
they report it through pipes: acknowledged enqueues, and attempts started. When
progress reaches an action of the plan, it takes it (a SIGKILL, a SIGTERM, a
restart, ``dopool pause`` or ``resume``, a frozen writer: :mod:`.freeze`); once the
producers are done, if nothing moves for :data:`IDLE` seconds (a pause, no worker up,
nothing left to run), it takes the next one at once. At the
end it resumes, starts a last worker if none runs, waits until the store holds no
unfinished event, stops the workers with SIGTERM and hands everything to
:mod:`.checker`. Every process it started is continued (SIGCONT) and killed on the
way out, whatever happened.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from dopool._chaos.procs.app import DUMP, READY, SLOW, STARTED
from dopool._chaos.procs.freeze import NEVER, LockFile, catch, cont
from dopool._chaos.procs.plan import POOL, Action, Plan
from dopool._chaos.procs.records import Freeze, Record, faults_log, worker_log
from dopool._handles.connection import connect

APP = "dopool._chaos.procs.app:define"
IDLE = 0.25  # wall seconds without progress before the next action is taken anyway
WAIT = 30.0  # the longest any one wait takes before the run is reported stuck
DEADLINE = 120.0  # the longest a whole run takes
GRACE = 10.0  # a worker's --grace: far above any handler's time
POLL = 0.1  # a worker's --poll-interval: a lost wake-up costs this much
DUMP_TIME = 0.5  # seconds a stuck run's processes get to write their stacks
FREEZE_TRY = 8.0  # seconds a freeze looks for its target holding the writer lock
FREEZE_POLL = 0.0001  # seconds between two looks (the runner reads its pipes meanwhile)


class Stuck(Exception):
    """The run could not go on: a process did not start, answer or finish in time."""


@dataclass
class Generation:
    """One worker process and how it ended: ``"killed"`` (SIGKILL), ``"stopped"``
    (SIGTERM), or None while it runs; ``code`` its exit status."""

    number: int
    proc: subprocess.Popen[bytes]
    ready_after: int  # its chain's workers ready before it: it is ready once more are
    chain: int = 0
    ended: str | None = None
    code: int | None = None
    killed_at: int | None = None  # the system's monotonic clock (ns) once it was killed


@dataclass
class Progress:
    acknowledged: int = 0
    started: int = 0
    # By chain, its workers that defined the pool.
    ready: list[int] = field(default_factory=lambda: [0] * len(READY))
    slow_at: int = -1  # the progress when a slow attempt's start was last read

    @property
    def total(self) -> int:
        return self.acknowledged + self.started


class Processes:
    """The processes of one run, and what they report."""

    def __init__(self, plan: Plan, root: Path) -> None:
        self.plan = plan
        self.root = root
        self.store = root / "store"
        self.generations: list[Generation] = []
        self.producers: list[subprocess.Popen[bytes]] = []
        self.producer_codes: dict[int, int] = {}
        self.progress = Progress()
        self.paused = False
        self.done: list[str] = []  # what the runner did, in order: "kill@37", ...
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._read, selectors.EVENT_READ, -1)
        self._started = time.monotonic()

    # -- the workers -------------------------------------------------------------------
    def worker_of(self, chain: int) -> Generation | None:
        """The chain's worker still running, if any."""
        mine = [g for g in self.generations if g.chain == chain]
        last = mine[-1] if mine else None
        return last if last is not None and last.ended is None else None

    @property
    def workers(self) -> list[Generation]:
        """The workers running, one per chain at most, by chain."""
        up = (self.worker_of(chain) for chain in range(self.plan.chains))
        return [worker for worker in up if worker is not None]

    def ready_count(self, chain: int) -> int:
        return self.progress.ready[chain]

    def start_worker(self, chain: int = 0) -> None:
        number = len(self.generations)
        self._drain()  # the last worker's bytes: all in the pipe, as it exited
        log = worker_log(self.root, number)
        if self.paused:  # the checker holds this worker to the pause from its first line
            mark = Record(log)
            mark.line("M", "paused")
            mark.close()
        env = {
            **os.environ,
            "DOPOOL_CHAOS_SEED": str(self.plan.seed),
            "DOPOOL_CHAOS_RECORD": str(log),
            "DOPOOL_CHAOS_FD": str(self._write),
            "PYTHONUNBUFFERED": "1",  # its lines in its .out file even if it is killed
            "DOPOOL_CHAOS_PARENT": str(os.getpid()),
            "DOPOOL_CHAOS_CHAIN": str(chain),
        }
        command = [sys.executable, "-m", "dopool", "worker", APP, "--store", str(self.store)]
        options = ["--durability", self.plan.durability, "--poll-interval", str(POLL)]
        options += ["--lease-ttl", str(self.plan.lease_ttl)]
        if self.plan.max_active is not None:
            options += ["--max-active", str(self.plan.max_active)]
        # Warnings too: a live worker losing a lease logs one, and the checker reads them.
        options += ["--grace", str(GRACE), "--log-level", "warning"]
        with (
            (self.root / f"worker-{number}.out").open("wb") as out,
            (self.root / f"worker-{number}.err").open("wb") as err,
        ):
            proc = subprocess.Popen(
                [*command, *options],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                pass_fds=(self._write,),
            )
        self.generations.append(Generation(number, proc, self.ready_count(chain), chain))

    def stop_worker(self, how: str, chain: int = 0) -> None:
        """SIGKILL (``"killed"``) or SIGTERM (``"stopped"``) the chain's worker, and reap it."""
        worker = self.worker_of(chain)
        assert worker is not None
        if how == "stopped":  # SIGTERM before its handlers are set would kill it: wait
            self.wait_ready(worker.ready_after + 1, chain)
        worker.proc.send_signal(signal.SIGKILL if how == "killed" else signal.SIGTERM)
        worker.code = _wait(worker.proc, f"worker {worker.number} to exit")
        worker.ended = how
        if how == "killed":  # every attempt it started began before this
            worker.killed_at = time.monotonic_ns()

    def control(self, verb: str) -> None:
        """``dopool pause|resume STORE --pool POOL``, marked in the workers' records."""
        workers = self.workers
        if verb == "resume":
            self.paused = False
            for worker in workers:
                self._mark(worker, "resume")
        command = [sys.executable, "-m", "dopool", verb, str(self.store), "--pool", POOL]
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT, check=False
        )
        if done.returncode != 0:
            raise Stuck(f"dopool {verb} exited {done.returncode}: {done.stderr.decode()[-500:]}")
        if verb == "pause":
            self.paused = True
            for worker in workers:
                self._mark(worker, "pause")

    def _mark(self, worker: Generation, what: str) -> None:
        mark = Record(worker_log(self.root, worker.number))
        mark.line("M", what)
        mark.close()

    # -- the producers -----------------------------------------------------------------
    def start_producers(self) -> None:
        module = "dopool._chaos.procs.producer"
        env = {**os.environ, "DOPOOL_CHAOS_PARENT": str(os.getpid())}
        for p in range(self.plan.producers):
            args = [str(self.store), str(self.plan.seed), str(p), str(self.root)]
            with (self.root / f"producer-{p}.err").open("wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", module, *args],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=env,
                )
            assert proc.stdout is not None
            self._selector.register(proc.stdout, selectors.EVENT_READ, p)
            self.producers.append(proc)

    @property
    def producing(self) -> bool:
        return len(self.producer_codes) < len(self.producers)

    # -- frozen writers ----------------------------------------------------------------
    def freeze(self, action: Action) -> Freeze:
        """Stop the action's target while it holds the writer lock (:mod:`.freeze`), keep
        it stopped for ``action.seconds`` (reading the pipes meanwhile), continue it; or
        give up after :data:`FREEZE_TRY` seconds. A target that exits first is replaced
        by another of its kind still running. Recorded in ``faults.log``."""
        kind = "worker" if action.producer is None else "producer"
        lock = LockFile.of(self.store)
        until = time.monotonic() + FREEZE_TRY
        misses, tried = 0, 0
        while True:
            number, proc = self._target(action)
            if proc is None:
                why = "no such process running" if not tried else "it exited first"
                freeze = Freeze(kind, number, landed=False, misses=misses, why=why)
                break
            tried += 1
            caught = catch(
                proc.pid,
                lock,
                until=until,
                alive=partial(_running, proc),
                between=self._glance,
            )
            misses += caught.misses
            if caught.at is not None:
                try:
                    stop = time.monotonic() + action.seconds
                    while (left := stop - time.monotonic()) > 0:
                        self.pump(left)
                finally:
                    cont(proc.pid)
                continued = time.monotonic_ns()
                freeze = Freeze(kind, number, True, caught.at, continued, misses)
                break
            if time.monotonic() >= until:
                freeze = Freeze(kind, number, False, misses=misses, why="never seen holding it")
                break
        record = Record(faults_log(self.root))
        record.line(*freeze.line())
        record.close()
        return freeze

    def _glance(self) -> None:
        """What a freeze does between two looks at the lock table: read the pipes without
        waiting (a selector's timeout counts in milliseconds), then wait a little."""
        self.pump(0)
        NEVER.wait(FREEZE_POLL)

    def _target(self, action: Action) -> tuple[int, subprocess.Popen[bytes] | None]:
        """The process a freeze stops, and its number: the plan's, or if it is no longer
        running the first of its kind that is (a producer, or a worker by chain)."""
        if action.producer is not None:
            running = [p for p, proc in enumerate(self.producers) if proc.poll() is None]
            if not running:
                return action.producer, None
            p = action.producer if action.producer in running else running[0]
            return p, self.producers[p]
        worker = self.worker_of(action.chain) or next(iter(self.workers), None)
        if worker is None or worker.proc.poll() is not None:
            return -1, None
        return worker.number, worker.proc

    # -- progress ----------------------------------------------------------------------
    def pump(self, timeout: float) -> bool:
        """Read what the processes reported within ``timeout`` seconds; whether any did."""
        if time.monotonic() - self._started > DEADLINE:
            raise Stuck(f"the run took over {DEADLINE:g} s")
        moved = False
        for key, _ in self._selector.select(timeout):
            fd = key.fd
            chunk = os.read(fd, 65536)
            if key.data == -1:
                self._count(chunk)
            elif chunk:
                self.progress.acknowledged += len(chunk)
            else:  # a producer's stdout closed: it is done
                proc = self.producers[key.data]
                self._selector.unregister(key.fileobj)
                assert proc.stdout is not None
                proc.stdout.close()
                self.producer_codes[key.data] = _wait(proc, f"producer {key.data} to exit")
            moved = True
        return moved

    def _count(self, chunk: bytes) -> None:
        """What the workers wrote to the pipe."""
        self.progress.started += chunk.count(STARTED) + chunk.count(SLOW)
        for chain, ready in enumerate(READY):
            self.progress.ready[chain] += chunk.count(ready)
        if SLOW in chunk:
            self.progress.slow_at = self.progress.total

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._read, 65536)
            except BlockingIOError:
                return
            self._count(chunk)

    def wait_ready(self, count: int, chain: int = 0) -> None:
        """Until ``count`` workers of the chain have defined the pool (some killed before may
        not have)."""
        deadline = time.monotonic() + WAIT
        while self.ready_count(chain) < count:
            worker = self.worker_of(chain)
            if worker is not None and worker.proc.poll() is not None:
                raise Stuck(f"worker {worker.number} exited {worker.proc.returncode} at start")
            if time.monotonic() > deadline:
                raise Stuck("the worker did not define its pool")
            self.pump(IDLE)

    def close(self, *, dump: bool = False) -> None:
        """Continue and kill whatever still runs, and close the pipes; with ``dump``, first
        have each live process write its threads' stacks to its ``.err`` file (a stuck
        run)."""
        procs = [g.proc for g in self.generations] + self.producers
        for proc in procs:  # none should be stopped (a freeze continues its own): be sure
            if proc.poll() is None:
                cont(proc.pid)
        if dump:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(DUMP)
            deadline = time.monotonic() + DUMP_TIME
            for proc in procs:
                with suppress(subprocess.TimeoutExpired):  # it should not exit: it dumps
                    proc.wait(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        self._selector.close()
        os.close(self._read)
        os.close(self._write)


def _running(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def _wait(proc: subprocess.Popen[bytes], what: str) -> int:
    try:
        return proc.wait(WAIT)
    except subprocess.TimeoutExpired:
        raise Stuck(f"waited {WAIT:g} s for {what}") from None


def drive(processes: Processes) -> None:
    """Start the run, take the plan's actions as progress reaches them, let the producers
    finish."""
    for chain in range(processes.plan.workers):
        processes.start_worker(chain)
        processes.wait_ready(1, chain)
    processes.start_producers()
    actions = list(processes.plan.actions)
    while actions or processes.producing:
        while actions and _due(actions[0], processes.progress):
            take(processes, actions.pop(0))
        if not processes.pump(IDLE) and actions and not processes.producing:
            # Nothing moves, and only the worker could move it: paused, down, or idle.
            take(processes, actions.pop(0))


def _due(action: Action, progress: Progress) -> bool:
    if action.mid:  # a slow attempt started past its point, and runs as it is taken
        return progress.slow_at >= action.at
    return progress.total >= action.at


def take(processes: Processes, action: Action) -> None:
    """One action, skipped if it does not apply (a stop with no worker up, a start with one)."""
    up = processes.worker_of(action.chain) is not None
    if action.verb == "freeze":
        at = processes.progress.total
        freeze = processes.freeze(action)
        how = f"{freeze.kind}{freeze.number}" if freeze.landed else f"missed: {freeze.why}"
        processes.done.append(f"freeze-{action.seconds:g}s({how})@{at}")
        return
    if action.verb in ("kill", "term") and up:
        how = "killed" if action.verb == "kill" else "stopped"
        processes.stop_worker(how, action.chain)
    elif action.verb == "start" and not up:
        processes.start_worker(action.chain)
    elif action.verb in ("pause", "resume"):
        processes.control(action.verb)
    else:
        return
    mid = "-mid" if action.mid and processes.progress.slow_at >= action.at else ""
    chain = f"/{action.chain + 1}" if action.chain else ""
    processes.done.append(f"{action.verb}{mid}{chain}@{processes.progress.total}")


def finish(processes: Processes) -> None:
    """Resume, have a worker up, wait until the store holds no unfinished event (as long as
    progress goes on), and stop the workers with SIGTERM, the first chain's last."""
    if processes.paused:
        take(processes, Action(0, "resume"))
    if not processes.workers:
        take(processes, Action(0, "start"))
    with connect(processes.store, durability="async") as connection:
        pool = connection.pool(POOL)
        deadline = time.monotonic() + WAIT
        while True:
            status = pool.status()
            if not status.pending and all(i.current_sequence is None for i in status.instances):
                break
            for worker in processes.workers:
                if worker.proc.poll() is not None:
                    code = worker.proc.returncode
                    raise Stuck(f"worker {worker.number} exited {code} by itself")
            if processes.pump(POLL):
                deadline = time.monotonic() + WAIT
            elif time.monotonic() > deadline:
                raise Stuck(f"{status.pending} events still pending after {WAIT:g} s idle")
    *others, last = processes.workers[::-1]
    for worker in others:
        processes.stop_worker("stopped", chain=worker.chain)
        processes.done.append(f"stop (worker {worker.number}, chain {worker.chain + 1})")
    processes.stop_worker("stopped", chain=last.chain)
    processes.done.append("stop (the last worker)")
