"""``python -m benchmarks.deploy``: the shape users deploy, every part its own process.

Producers in ``--producers`` processes (4) enqueue ``--events`` events (20,000, shared)
one at a time; the handlers run in one more process. Each system, same disk, same run:

- **dopool**: ``dopool worker benchmarks.deploy:app --store S --durability MODE`` (one
  pool, ``Sizes.concurrency`` instances, a handler that does nothing), producers with
  ``dopool.connect(S, durability=MODE)``. The end is seen by reading the pool's
  ``succeeded`` from the store (``status()``) every millisecond. With ``--workers N``,
  N worker processes share the store (``--lease-ttl 1``), and the producers are
  released once every worker holds its share of the instances.
- **SqliteHuey**: its consumer process (``Consumer.run``, as ``huey_consumer`` runs it,
  ``Sizes.concurrency`` thread workers, the polling of :mod:`benchmarks.peers`),
  producers calling the task; ``fsync`` for sync, no fsync for async. The consumer
  prints when its last task ran.
- **persist-queue**: a consumer process doing ``get`` then ``ack`` on a
  ``SQLiteAckQueue`` (clearing acked rows every 1,000, as :mod:`benchmarks.peers`
  does), producers ``put``; SQLite's ``synchronous=FULL`` whatever the mode.

Every process starts, opens its store and waits before the clock starts: the
producers are released together, and the time runs until the last event has run.
It prints events per second and each system's ratio to SqliteHuey of the same
mode. Nothing here asserts on timings. Example::

    python -m benchmarks.deploy                       # sync and async, 20,000 events
    python -m benchmarks.deploy --events 2000 --modes async --rounds 3
    python -m benchmarks.deploy --workers 2 --systems dopool  # two dopool workers
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import dopool
from benchmarks.harness import TIMEOUT, Sizes, make_event, peer_missing, rate
from benchmarks.peers import HUEY_POLL, PERSIST_QUEUE_CLEAR_EVERY, PERSIST_QUEUE_GET_TIMEOUT
from dopool._store.layout import all_leases

POOL = "bench"
SYSTEMS = ("dopool", "SqliteHuey", "persist-queue")


# --- the processes ---------------------------------------------------------------------


def app(runtime: dopool.Runtime) -> None:
    """The worker's app: one pool whose handler does nothing."""
    runtime.define(POOL, execute=_nothing, concurrency=int(os.environ["DEPLOY_CONCURRENCY"]))


def _nothing(_ctx: dopool.EventContext) -> None:
    pass


def _huey(store: str, fsync: bool) -> tuple[Any, Callable[[Any], Any]]:
    """The SqliteHuey queue and its task, made alike in every process that uses them."""
    import huey  # noqa: PLC0415 - optional: the bench extra

    queue = huey.SqliteHuey("deploy", filename=store, fsync=fsync, results=False)
    count = [0, int(os.environ.get("DEPLOY_EXPECT", "0"))]

    @queue.task()  # type: ignore[untyped-decorator]  # huey ships no type hints
    def no_op(_event: dict[str, Any]) -> None:
        count[0] += 1  # one consumer process; its thread workers race on nothing else
        if count[0] == count[1]:
            print("done", flush=True)

    return queue, no_op


def produce(system: str, store: str, mode: str, first: int, step: int, events: int) -> None:
    """A producer process: open the queue, say ``ready``, wait for ``go`` on stdin, enqueue."""
    shares = [make_event(n) for n in range(first, events, step)]
    if system == "dopool":
        connection = dopool.connect(store, durability=mode)
        enqueue: Callable[[Any], Any] = connection.pool(POOL).enqueue
    elif system == "SqliteHuey":
        _, enqueue = _huey(store, fsync=mode == "sync")
    else:
        from persistqueue import SQLiteAckQueue  # noqa: PLC0415 - optional: the bench extra

        enqueue = SQLiteAckQueue(store, multithreading=True, auto_commit=True).put
    print("ready", flush=True)
    sys.stdin.readline()
    for event in shares:
        enqueue(event)
    print("done", flush=True)


def consume(system: str, store: str, mode: str, concurrency: int) -> None:
    """The peers' consumer process: prints ``ready``, then ``done`` when the last event ran."""
    if system == "SqliteHuey":
        queue, _ = _huey(store, fsync=mode == "sync")
        consumer = queue.create_consumer(
            workers=concurrency,
            worker_type="thread",
            periodic=False,
            check_worker_health=False,
            **HUEY_POLL,
        )
        print("ready", flush=True)
        consumer.run()  # until SIGTERM
        return
    from persistqueue import SQLiteAckQueue  # noqa: PLC0415 - optional: the bench extra
    from persistqueue.exceptions import Empty  # noqa: PLC0415

    queue = SQLiteAckQueue(store, multithreading=True, auto_commit=True)
    expected, count = int(os.environ["DEPLOY_EXPECT"]), 0
    print("ready", flush=True)
    while count < expected:
        try:
            item = queue.get(raw=True, timeout=PERSIST_QUEUE_GET_TIMEOUT)
        except Empty:
            continue
        queue.ack(id=item["pqid"])
        count += 1
        if PERSIST_QUEUE_CLEAR_EVERY and count % PERSIST_QUEUE_CLEAR_EVERY == 0:
            queue.clear_acked_data(max_delete=None, keep_latest=None)
    print("done", flush=True)
    queue.close()


# --- one run ---------------------------------------------------------------------------


class _Child:
    """A process of this module (or ``dopool worker``), its stdout read line by line."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self.at: dict[str, float] = {}  # when each line was first read
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            with self._seen:
                self.at.setdefault(line.strip(), time.perf_counter())
                self.lines.append(line.strip())
                self._seen.notify_all()

    def wait_for(self, prefix: str) -> float:
        with self._seen:
            found = self._seen.wait_for(
                lambda: any(x.startswith(prefix) for x in self.lines) or self.proc.poll(), TIMEOUT
            )
        if not found or not any(x.startswith(prefix) for x in self.lines):
            assert self.proc.stderr is not None
            raise RuntimeError(f"{self.proc.args!r}: no {prefix!r}: {self.proc.stderr.read()}")
        return next(at for line, at in self.at.items() if line.startswith(prefix))

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
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code


def _module(*args: object) -> list[str]:
    return [sys.executable, "-m", "benchmarks.deploy", *map(str, args)]


def run_once(system: str, mode: str, sizes: Sizes, directory: Path, workers: int = 1) -> float:
    """Events per second from the producers' release to the last event's run."""
    env = {"DEPLOY_EXPECT": str(sizes.events), "DEPLOY_CONCURRENCY": str(sizes.concurrency)}
    store = directory / f"{system}-{mode}"
    others: list[_Child] = []  # dopool's workers beside the first
    if system == "dopool":
        command = [sys.executable, "-m", "dopool", "worker", "benchmarks.deploy:app"]
        command += ["--store", str(store), "--durability", mode, "--log-level", "warning"]
        command += ["--lease-ttl", "1"]
        owner = _Child(command, env)
        owner.wait_for("dopool worker: store")
        others = [_Child(command, env) for _ in range(workers - 1)]
        for other in others:
            other.wait_for("dopool worker: store")
        _wait_split(store, 1 + len(others), sizes.concurrency)
    else:
        store = store.with_suffix(".db")
        owner = _Child(_module("--consume", system, store, mode, sizes.concurrency), env)
        owner.wait_for("ready")
    producers = [
        _Child(_module("--produce", system, store, mode, p, sizes.producers, sizes.events), env)
        for p in range(sizes.producers)
    ]
    failed = True  # then every process is sent SIGTERM; else those that end, end
    try:
        for producer in producers:
            producer.wait_for("ready")
        start = time.perf_counter()
        for producer in producers:
            producer.go()
        if system == "dopool":
            finished = _wait_succeeded(store, sizes.events)
        else:
            finished = owner.wait_for("done")
        for producer in producers:
            producer.wait_for("done")
        failed = False
    finally:
        codes = [child.stop(signalled=failed) for child in producers]
        codes += [other.stop() for other in others]
        codes.append(owner.stop(signalled=failed or system != "persist-queue"))
    if any(codes):
        raise RuntimeError(f"{system} {mode}: a process exited with {codes}")
    return rate(sizes.events, finished - start)


def _wait_split(store: Path, workers: int, concurrency: int) -> None:
    """Until ``workers`` worker processes each hold a lease (one holds them all at first)."""
    deadline = time.perf_counter() + TIMEOUT
    with dopool.connect(store, durability="async") as connection:
        while time.perf_counter() < deadline:
            with connection.reading(POOL) as txn:
                leases = [record for _, _, record in all_leases(txn)]
            if len(leases) == concurrency and len({r.owner for r in leases}) == workers:
                return
            time.sleep(0.01)
    raise RuntimeError(f"{workers} dopool workers did not share the instances in {TIMEOUT:g} s")


def _wait_succeeded(store: Path, events: int) -> float:
    """The time the store first showed every event succeeded (read every millisecond)."""
    deadline = time.perf_counter() + TIMEOUT
    with dopool.connect(store, durability="async") as connection:
        pool = connection.pool(POOL)
        while time.perf_counter() < deadline:
            if pool.status().succeeded >= events:
                return time.perf_counter()
            time.sleep(0.001)
    raise RuntimeError(f"dopool ran fewer than {events:,} events in {TIMEOUT:g} s")


# --- the command -----------------------------------------------------------------------


def measure(
    sizes: Sizes,
    modes: Sequence[str],
    rounds: int,
    directory: Path,
    workers: int = 1,
    only: Sequence[str] = SYSTEMS,
) -> dict[tuple[str, str], list[float]]:
    """Each installed system's events/s per mode, ``rounds`` runs each, interleaved."""
    systems = [
        s
        for s in SYSTEMS
        if s in only
        and not peer_missing({"SqliteHuey": "huey", "persist-queue": "persistqueue"}.get(s, "os"))
    ]
    figures: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for mode in modes:
            for system in systems:
                with tempfile.TemporaryDirectory(prefix="deploy-", dir=directory) as work:
                    value = run_once(system, mode, sizes, Path(work), workers)
                figures.setdefault((system, mode), []).append(value)
    return figures


def report(figures: dict[tuple[str, str], list[float]]) -> list[str]:
    lines = []
    for (system, mode), values in figures.items():
        median = statistics.median(values)
        huey = figures.get(("SqliteHuey", mode))
        ratio = "" if huey is None else f"  {median / statistics.median(huey):.2f}x SqliteHuey"
        spread = f" ({min(values):,.0f}-{max(values):,.0f})" if len(values) > 1 else ""
        lines.append(f"{mode:5}  {system:13}  {median:9,.0f} events/s{spread}{ratio}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deploy", description=__doc__)
    parser.add_argument("--events", type=int, default=Sizes().events)
    parser.add_argument("--producers", type=int, default=Sizes().producers)
    parser.add_argument("--concurrency", type=int, default=Sizes().concurrency)
    parser.add_argument("--modes", default="sync,async", help="sync, async or both")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="dopool worker processes")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="which systems to run")
    parser.add_argument("--dir", type=Path, default=None, help="where to make the stores")
    parser.add_argument("--produce", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--consume", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.produce:
        system, store, mode, first, step, events = args.produce
        produce(system, store, mode, int(first), int(step), int(events))
        return 0
    if args.consume:
        system, store, mode, concurrency = args.consume
        consume(system, store, mode, int(concurrency))
        return 0
    sizes = Sizes(events=args.events, producers=args.producers, concurrency=args.concurrency)
    modes = [mode for mode in args.modes.split(",") if mode]
    print(
        f"{sizes.events:,} events, {sizes.producers} producer processes, {args.workers} dopool "
        f"worker process(es) and 1 of each peer ({sizes.concurrency} instances or threads), "
        f"{args.rounds} round(s)"
    )
    where = args.dir or Path(tempfile.gettempdir())
    systems = [s for s in args.systems.split(",") if s]
    for line in report(measure(sizes, modes, args.rounds, where, args.workers, systems)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
