"""``python -m benchmarks.deploy``: the shape users deploy, every part its own process.

Producers in ``--producers`` processes (4) enqueue ``--events`` events (20,000, shared)
one at a time; the handlers run in one more process. Each system, same disk, same run:

- **dopool**: ``dopool worker benchmarks.deploy:app --store S --durability MODE`` (one
  pool, ``Sizes.concurrency`` instances, a handler that does nothing), producers with
  ``dopool.connect(S, durability=MODE)``: under ``sync`` their enqueues go to the worker,
  which stores them in its commits (``via_owner``'s default), under ``async`` each is
  the producer's own commit. **dopool-stored** is the same with ``via_owner=False``:
  every enqueue the producer's own commit. The end is seen by reading the pool's
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
- **RQ, arq, dramatiq, Celery** (Redis broker), each against a fresh ``redis-server``
  the run starts on loopback (:mod:`benchmarks.redis_peers`, which says how each
  consumer runs: RQ's worker pool of ``Sizes.concurrency`` ``SimpleWorker`` processes,
  one arq worker with ``max_jobs`` of that many, one dramatiq worker of that many
  threads, one Celery worker with a prefork pool of that many). Under ``sync`` Redis
  runs with ``appendfsync always``; under ``async`` with no persistence, and again with
  ``appendfsync everysec`` (a row each). The consumer runs a warm-up job before it says
  ``ready``, and prints when its last task ran. A peer whose package or
  ``redis-server`` is not installed is skipped with a line saying what installs it.

Every process starts, opens its store and waits before the clock starts: the
producers are released together, and the time runs until the last event has run.
It prints events per second, each system's ratio to SqliteHuey and to dopool of the
same mode, and the durability each row ran with. Nothing here asserts on timings.
Example::

    python -m benchmarks.deploy                       # sync and async, 20,000 events
    python -m benchmarks.deploy --events 2000 --modes async --rounds 3
    python -m benchmarks.deploy --workers 2 --systems dopool  # two dopool workers
    python -m benchmarks.deploy --systems dopool,RQ,arq,dramatiq,Celery
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import dopool
from benchmarks import redis_peers
from benchmarks.harness import INSTALL_HINT, TIMEOUT, Child, Sizes, make_event, peer_missing, rate
from benchmarks.peers import HUEY_POLL, PERSIST_QUEUE_CLEAR_EVERY, PERSIST_QUEUE_GET_TIMEOUT
from dopool._store.layout import all_leases

POOL = "bench"
SYSTEMS = ("dopool", "dopool-stored", "SqliteHuey", "persist-queue", *redis_peers.PEERS)
# dopool's two: producers as connect() makes them by default, and storing every enqueue.
_DOPOOLS = {"dopool": None, "dopool-stored": False}
# The module each of the other systems needs (dopool's are always there).
_MODULES = {"SqliteHuey": "huey", "persist-queue": "persistqueue"}
# What each row's durability is, by system and mode (the Redis peers': redis_peers).
_DURABILITY = {
    ("dopool", "sync"): "dopool sync: fsync per commit",
    ("dopool", "async"): "dopool async: no fsync",
    ("dopool-stored", "sync"): "dopool sync: fsync per commit",
    ("dopool-stored", "async"): "dopool async: no fsync",
    ("SqliteHuey", "sync"): "SQLite synchronous=FULL",
    ("SqliteHuey", "async"): "SQLite synchronous=OFF",
    ("persist-queue", "sync"): "SQLite synchronous=FULL",
    ("persist-queue", "async"): "SQLite synchronous=FULL",
}


# --- the processes ---------------------------------------------------------------------


def app(runtime: dopool.Runtime) -> None:
    """The worker's app: one pool whose handler does nothing."""
    runtime.define(POOL, execute=_nothing, concurrency=int(os.environ["DEPLOY_CONCURRENCY"]))


def _nothing(_ctx: dopool.EventContext) -> None:
    pass


def _huey(store: str, fsync: bool) -> tuple[Any, Callable[[Any], Any]]:
    """The SqliteHuey queue and its task, made alike in every process that uses them."""
    import huey  # noqa: PLC0415 - optional: the bench extra

    # SQLite's busy timeout at TIMEOUT, not huey's 5 s: with 4 producers and the consumer
    # each taking the database's lock (begin exclusive) on a busy disk, a producer waited
    # longer than 5 s and failed ("database is locked"), ending the run.
    queue = huey.SqliteHuey("deploy", filename=store, fsync=fsync, results=False, timeout=TIMEOUT)
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
    sender = None
    if system in _DOPOOLS:
        connection = dopool.connect(store, durability=mode, via_owner=_DOPOOLS[system])
        enqueue: Callable[[Any], Any] = connection.pool(POOL).enqueue
    elif system == "SqliteHuey":
        _, enqueue = _huey(store, fsync=mode == "sync")
    elif system in redis_peers.PEERS:  # the store is the server's URL
        sender = redis_peers.sender(system, store)
        enqueue = sender.enqueue
    else:
        from persistqueue import SQLiteAckQueue  # noqa: PLC0415 - optional: the bench extra

        enqueue = SQLiteAckQueue(store, multithreading=True, auto_commit=True).put
    print("ready", flush=True)
    sys.stdin.readline()
    for event in shares:
        enqueue(event)
    if sender is not None:
        sender.close()
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


def _module(*args: object) -> list[str]:
    return [sys.executable, "-m", "benchmarks.deploy", *map(str, args)]


def run_once(
    system: str,
    mode: str,
    sizes: Sizes,
    directory: Path,
    workers: int = 1,
    persistence: str = "",
) -> float:
    """Events per second from the producers' release to the last event's run.

    ``persistence`` is a Redis peer's (one of :data:`benchmarks.redis_peers.PERSISTENCE`).
    """
    env = {"DEPLOY_EXPECT": str(sizes.events), "DEPLOY_CONCURRENCY": str(sizes.concurrency)}
    store = directory / f"{system}-{mode}"
    target = str(store)  # what the producers open: the store, or a Redis peer's server
    others: list[Child] = []  # dopool's workers beside the first
    with ExitStack() as stack:
        if system in redis_peers.PEERS:
            where = directory / f"redis-{persistence}"
            target = stack.enter_context(redis_peers.RedisServer(where, persistence)).url
            owner = Child(
                redis_peers.consumer_command(system, target, sizes.concurrency, sizes.events), env
            )
            stack.callback(owner.stop)  # before the server stops; a no-op once stopped below
            owner.wait_for("ready")
        elif system in _DOPOOLS:
            command = [sys.executable, "-m", "dopool", "worker", "benchmarks.deploy:app"]
            command += ["--store", target, "--durability", mode, "--log-level", "warning"]
            command += ["--lease-ttl", "1"]
            owner = Child(command, env)
            owner.wait_for("dopool worker: store")
            others = [Child(command, env) for _ in range(workers - 1)]
            for other in others:
                other.wait_for("dopool worker: store")
            _wait_split(store, 1 + len(others), sizes.concurrency)
        else:
            target = str(store.with_suffix(".db"))
            owner = Child(_module("--consume", system, target, mode, sizes.concurrency), env)
            owner.wait_for("ready")
        producers = [
            Child(_module("--produce", system, target, mode, p, sizes.producers, sizes.events), env)
            for p in range(sizes.producers)
        ]
        failed = True  # then every process is sent SIGTERM; else those that end, end
        try:
            for producer in producers:
                producer.wait_for("ready")
            start = time.perf_counter()
            for producer in producers:
                producer.go()
            if system in _DOPOOLS:
                finished = _wait_succeeded(store, sizes.events, producers)
            else:
                finished = owner.wait_for("done", unless=producers)
            for producer in producers:
                producer.wait_for("done")
            failed = False
        finally:
            codes = [child.stop(signalled=failed) for child in producers]
            codes += [other.stop() for other in others]
            codes.append(owner.stop(signalled=failed or system != "persist-queue"))
    if any(codes):
        children = zip([*producers, *others, owner], codes, strict=True)
        errors = "".join(child.errors()[-2000:] for child, code in children if code)
        raise RuntimeError(f"{system} {mode}: a process exited with {codes}: {errors}")
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


def _wait_succeeded(store: Path, events: int, producers: Sequence[Child]) -> float:
    """The time the store first showed every event succeeded (read every millisecond)."""
    deadline = time.perf_counter() + TIMEOUT
    with dopool.connect(store, durability="async") as connection:
        pool = connection.pool(POOL)
        while time.perf_counter() < deadline:
            if pool.status().succeeded >= events:
                return time.perf_counter()
            for producer in producers:
                if producer.proc.poll():
                    raise RuntimeError(f"a producer failed: {producer.errors()[-4000:]}")
            time.sleep(0.001)
    raise RuntimeError(f"dopool ran fewer than {events:,} events in {TIMEOUT:g} s")


# --- the command -----------------------------------------------------------------------


Row = tuple[str, str, str]  # system, mode, a Redis peer's persistence ("" for the others)


def available(requested: Sequence[str]) -> tuple[list[str], list[str]]:
    """The requested systems that can run here, and a line for each that cannot."""
    systems, skipped = [], []
    for system in (s for s in SYSTEMS if s in requested):
        if system in redis_peers.PEERS:
            why = redis_peers.missing(system)
        elif peer_missing(_MODULES.get(system, "dopool")):
            why = f"{system}: skipped, its package is not installed: {INSTALL_HINT}"
        else:
            why = None
        if why is None:
            systems.append(system)
        else:
            skipped.append(why)
    return systems, skipped


def durability(row: Row) -> str:
    """What a row's system keeps on a crash, as the run configured it."""
    system, mode, persistence = row
    if persistence:
        return redis_peers.DURABILITY[persistence]
    return _DURABILITY[system, mode]


def measure(
    sizes: Sizes,
    modes: Sequence[str],
    rounds: int,
    directory: Path,
    workers: int = 1,
    only: Sequence[str] = SYSTEMS,
) -> tuple[dict[Row, list[float]], set[Row]]:
    """Each installed system's events/s per mode (and Redis persistence), ``rounds`` runs
    each, interleaved; and the rows that failed. A run that fails is said on stderr, and
    its row left out of the later rounds; the others go on."""
    systems, _ = available(only)
    figures: dict[Row, list[float]] = {}
    failed: set[Row] = set()
    for _ in range(rounds):
        for mode in modes:
            for system in systems:
                kinds = redis_peers.PERSISTENCE[mode] if system in redis_peers.PEERS else ("",)
                for row in ((system, mode, persistence) for persistence in kinds):
                    if row in failed:
                        continue
                    try:
                        with tempfile.TemporaryDirectory(prefix="deploy-", dir=directory) as work:
                            value = run_once(system, mode, sizes, Path(work), workers, row[2])
                    except Exception as error:  # one broken run must not end the others
                        print(
                            f"{' '.join(filter(None, row))}: FAILED: {error}",
                            file=sys.stderr,
                            flush=True,
                        )
                        failed.add(row)
                        continue
                    figures.setdefault(row, []).append(value)
    return figures, failed


def report(figures: dict[Row, list[float]]) -> list[str]:
    """A line a row: mode, system, median events/s (min-max), its ratios to SqliteHuey and
    to dopool of the same mode, and its durability."""
    lines = []
    for row, values in figures.items():
        system, mode, _ = row
        median = statistics.median(values)
        spread = f" ({min(values):,.0f}-{max(values):,.0f})" if len(values) > 1 else ""
        ratios = ""
        for other in ("SqliteHuey", "dopool"):
            theirs = figures.get((other, mode, ""))
            if theirs is not None and (other == "SqliteHuey" or system != other):
                ratios += f"  {median / statistics.median(theirs):.2f}x {other}"
        lines.append(
            f"{mode:5}  {system:13}  {median:9,.0f} events/s{spread}{ratios}  [{durability(row)}]"
        )
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
    requested = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(requested) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    print(
        f"{sizes.events:,} events, {sizes.producers} producer processes, {args.workers} dopool "
        f"worker process(es) and 1 of each peer ({sizes.concurrency} instances or threads), "
        f"{args.rounds} round(s)"
    )
    systems, skipped = available(requested)
    for line in skipped:
        print(line)
    where = args.dir or Path(tempfile.gettempdir())
    figures, failed = measure(sizes, modes, args.rounds, where, args.workers, systems)
    for line in report(figures):
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
