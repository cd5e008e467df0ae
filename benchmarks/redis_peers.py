"""The Redis-backed peers: RQ, arq, dramatiq and Celery, each against a redis-server of its own.

What :mod:`benchmarks.deploy` and ``python -m benchmarks.e2e MODE --peers`` run beside
dopool. Every run starts a fresh ``redis-server`` (Debian's package: ``apt-get install
redis-server``) on loopback, on a free port, with its data and a config file of its own
in a temporary directory, and stops it afterwards. Its persistence is the dopool mode's
counterpart (:data:`PERSISTENCE`):

- ``"sync"`` (fsync before ``enqueue`` returns): ``appendonly yes``, ``appendfsync
  always``, which fsyncs the AOF before the reply (Redis does one fsync per pass of its
  event loop, for every client served in that pass);
- ``"async"`` (survives a crash of the process, not of the OS): Redis with no
  persistence at all (a restart of Redis loses every queued job: weaker than dopool
  ``"async"``, the peers' ceiling), and as a second row ``appendfsync everysec`` (an OS
  crash loses about the last second).

RDB snapshots (``save ""``) and AOF rewrites are off in every mode, so no fork of the
server lands inside a timed run.

The consumers, each started as one process running the no-op task ``concurrency`` (4)
at a time, each with the defaults a user deploys but for polling:

- **RQ**: RQ's ``WorkerPool`` of ``concurrency`` ``SimpleWorker`` processes (``rq
  worker-pool --num-workers N --worker-class rq.worker.SimpleWorker``), forked from the
  consumer process. An RQ worker runs one job at a time, so RQ's concurrency is worker
  processes; and its default ``Worker`` forks a work horse per job, which with no-op jobs
  measures ``fork()`` (milliseconds each), not the queue, where ``SimpleWorker`` runs the
  job in the worker process, what RQ offers for short jobs. Under ``appendfsync always``
  four drained a full queue here about twice as fast as one (350 against 190 jobs/s),
  sharing Redis's fsyncs. Its dequeue blocks (``BLMOVE``): no polling.
- **arq**: one ``arq.worker.Worker`` (what ``arq Settings`` runs), ``max_jobs =
  concurrency`` jobs at once on its event loop. arq polls its queue every ``poll_delay``
  (0.5 s by default, which would measure the poll): :data:`ARQ_POLL_DELAY`.
- **dramatiq**: one ``dramatiq.Worker`` on a ``RedisBroker`` with ``concurrency``
  worker threads (``dramatiq --processes 1 --threads N`` without the forked process). Its
  Redis consumer polls an empty queue with a backoff up to ``worker_timeout`` (1 s by
  default): :data:`DRAMATIQ_WORKER_TIMEOUT_MS`. It also sleeps that backoff (5-10 ms)
  whenever its prefetch (2 messages a thread) is taken, so its rate here is about
  ``2 * N`` messages a sleep whatever Redis persists: about 1,050/s with 4 threads and
  2,050-2,100/s with dramatiq's default 8 (``--concurrency 8``), both measured here.
- **Celery**: one ``celery worker --pool prefork --concurrency N`` (``app.Worker``), its
  default pool: N child processes forked from the worker, which takes the tasks from
  Redis (``BRPOP``: no polling) and hands them out; Redis broker, results ignored.
  Mingle (a start-up exchange with the other workers, here none, which waits a second)
  is off. Not its threads pool: with it the worker stops taking messages while its
  prefetch is full and then waits out its poll (up to 2 s) before it takes more, so 200
  events took 0.3 s in one run and 1.5 s in the next; prefork ran as fast or faster.

The producers enqueue one job a call (``Queue.enqueue``, ``ArqRedis.enqueue_job``,
``Actor.send``, ``Task.delay``) through :func:`sender`, connected before the clock
starts. The consumer (:func:`consume`, ``python -m benchmarks.redis_peers --consume``)
first enqueues one warm-up job and says ``ready`` once its worker has run it, so the
worker is up and consuming before the producers are released; it says ``done`` when its
tasks have run the expected number of events (counted in the process, under a lock, as
the SqliteHuey consumer of :mod:`benchmarks.deploy` counts, in shared memory for the
processes RQ and Celery fork). The words go straight to file descriptor 1, which the
forked processes share.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from benchmarks.harness import (
    INSTALL_HINT,
    TIMEOUT,
    Child,
    Sizes,
    peer_missing,
    rate,
    run_producers,
)

PEERS = ("RQ", "arq", "dramatiq", "Celery")
# The module each peer imports; every one needs redis-py too.
MODULES = {"RQ": "rq", "arq": "arq", "dramatiq": "dramatiq", "Celery": "celery"}
SERVER = "redis-server"
SERVER_HINT = "apt-get install redis-server"
QUEUE = "bench"

# Redis's persistence set beside each dopool durability: the fair peer first.
PERSISTENCE: dict[str, tuple[str, ...]] = {"sync": ("always",), "async": ("none", "everysec")}
# The config lines of each persistence.
_CONFIG = {
    "always": ("appendonly yes", "appendfsync always"),
    "everysec": ("appendonly yes", "appendfsync everysec"),
    "none": ("appendonly no",),
}
DURABILITY = {
    "always": "Redis AOF, appendfsync always",
    "everysec": "Redis AOF, appendfsync everysec",
    "none": "Redis, no persistence",
}

# arq's poll of its queue (seconds), dramatiq's longest wait on an empty queue (ms): as
# :mod:`benchmarks.peers` polls SqliteHuey (1 ms, backing off to 10 ms).
ARQ_POLL_DELAY = 0.001
DRAMATIQ_WORKER_TIMEOUT_MS = 10
# Every consumer's first job, run before it says ``ready``; never counted.
WARM_UP: dict[str, Any] = {"n": -1, "body": ""}


def missing(system: str) -> str | None:
    """Why a Redis peer cannot run here, as the line to print; ``None`` when it can."""
    if peer_missing(MODULES[system]) or peer_missing("redis"):
        return f"{system}: skipped, its package is not installed: {INSTALL_HINT}"
    if shutil.which(SERVER) is None:
        return f"{system}: skipped, no {SERVER} on PATH: {SERVER_HINT}"
    return None


# --- the server ------------------------------------------------------------------------


class RedisServer:
    """A ``redis-server`` of its own, on 127.0.0.1, with its config and data in ``directory``.

    A context manager: entering starts it and waits until it answers (and checks that it
    runs with the persistence asked for), leaving stops it. ``url`` is what clients use.
    """

    def __init__(self, directory: Path, persistence: str) -> None:
        self.directory = directory
        self.persistence = persistence
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        binary = shutil.which(SERVER)
        if binary is None:
            raise RuntimeError(f"no {SERVER} on PATH: {SERVER_HINT}")
        for _ in range(5):  # the free port found may be taken before redis-server binds it
            self.port = _free_port()
            config = self.directory / "redis.conf"
            config.write_text(self._config(), encoding="utf-8")
            self._proc = subprocess.Popen(
                [binary, str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if self._answers():
                self._check()
                return self
            self._proc.wait()
        log = (self.directory / "redis.log").read_text(encoding="utf-8", errors="replace")
        raise RuntimeError(f"{SERVER} did not start: {log[-2000:]}")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _config(self) -> str:
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            f'dir "{self.directory}"',
            'logfile "redis.log"',
            "daemonize no",
            'save ""',  # no RDB snapshots
            "auto-aof-rewrite-percentage 0",  # no AOF rewrites in a run
            *_CONFIG[self.persistence],
        ]
        return "\n".join(lines) + "\n"

    def _answers(self) -> bool:
        """Whether it answers a PING before it exits (or the deadline)."""
        assert self._proc is not None
        deadline = time.perf_counter() + 10.0
        while time.perf_counter() < deadline and self._proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as link:
                    link.sendall(b"PING\r\n")
                    if link.recv(64).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.01)
        return False

    def _check(self) -> None:
        import redis  # noqa: PLC0415 - optional: the bench extra

        client = redis.Redis.from_url(self.url, decode_responses=True)
        try:
            found: dict[str, str] = {}
            for name in ("appendonly", "appendfsync"):
                found.update(cast(dict[str, str], client.config_get(name)))
        finally:
            client.close()
        wanted = dict(line.split() for line in _CONFIG[self.persistence])
        if any(found[name] != value for name, value in wanted.items()):
            raise RuntimeError(f"redis-server {self.persistence} runs with {found}")

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL after ``TIMEOUT``)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --- the tasks: every peer's no-op ends here --------------------------------------------


class _Tally:
    """The consumer's count of events run; says ``ready`` at the warm-up, ``done`` at the last.

    The count is in shared memory, made by :meth:`start` before the worker starts, so that
    the processes RQ and Celery fork from the consumer count together (threads alike).
    """

    def __init__(self) -> None:
        self.expected = 0
        self._count: Any = None  # a multiprocessing Value

    def start(self, expected: int) -> None:
        self.expected = expected
        self._count = multiprocessing.get_context("fork").Value("q", 0)

    def ran(self, event: dict[str, Any]) -> None:
        if event["n"] < 0:
            _say("ready")
            return
        with self._count.get_lock():
            self._count.value += 1
            last = self._count.value == self.expected
        if last:
            _say("done")


_TALLY = _Tally()


def _say(word: str) -> None:
    # Not print: the forked processes share descriptor 1, not sys.stdout's buffer.
    os.write(1, f"{word}\n".encode())


def rq_no_op(event: dict[str, Any]) -> None:
    _TALLY.ran(event)


async def arq_no_op(_ctx: dict[str, Any], event: dict[str, Any]) -> None:
    _TALLY.ran(event)


def dramatiq_no_op(event: dict[str, Any]) -> None:
    _TALLY.ran(event)


def celery_no_op(event: dict[str, Any]) -> None:
    _TALLY.ran(event)


def _dramatiq(url: str) -> tuple[Any, Any]:
    """The dramatiq broker and actor, made alike by the producers and the consumer."""
    import dramatiq  # noqa: PLC0415 - optional: the bench extra
    from dramatiq.brokers.redis import RedisBroker  # noqa: PLC0415

    broker = RedisBroker(url=url)  # type: ignore[no-untyped-call]  # its __init__ is not
    actor = dramatiq.actor(broker=broker, actor_name="dramatiq_no_op", queue_name=QUEUE)
    return broker, actor(dramatiq_no_op)


def _celery(url: str) -> tuple[Any, Any]:
    """The Celery app and task, made alike by the producers and the consumer."""
    from celery import Celery  # noqa: PLC0415 - optional: the bench extra

    app = Celery("bench", broker=url, set_as_current=False)
    app.conf.update(
        task_ignore_result=True,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    task = app.task(name="bench.no_op", shared=False)(celery_no_op)
    return app, task


# --- the producers' side -----------------------------------------------------------------


@dataclass(slots=True)
class Sender:
    """One peer's enqueue of one event (callable from any thread), and its ``close``."""

    enqueue: Callable[[dict[str, Any]], Any]
    closers: list[Callable[[], Any]] = field(default_factory=list)

    def close(self) -> None:
        for close in reversed(self.closers):
            close()
        self.closers.clear()


def sender(system: str, url: str) -> Sender:
    """``system``'s enqueue, connected to ``url`` before it returns."""
    if system == "RQ":
        from redis import Redis  # noqa: PLC0415 - optional: the bench extra
        from rq import Queue  # noqa: PLC0415

        connection = Redis.from_url(url)
        connection.ping()
        queue = Queue(QUEUE, connection=connection)
        return Sender(lambda event: queue.enqueue(rq_no_op, event), [connection.close])
    if system == "arq":
        return _arq_sender(url)
    if system == "dramatiq":
        broker, actor = _dramatiq(url)
        broker.client.ping()
        return Sender(actor.send, [broker.close])
    if system == "Celery":
        app, task = _celery(url)
        with app.producer_or_acquire() as producer:  # connects the pooled producer
            producer.connection.ensure_connection(max_retries=3)
        return Sender(task.delay, [app.close])
    raise ValueError(f"not a Redis peer: {system!r}")


def _arq_sender(url: str) -> Sender:
    """arq's client is asyncio's: an event loop and a pool per calling thread, made at the
    thread's first call (the producer process's, before it says ``ready``)."""
    from arq import create_pool  # noqa: PLC0415 - optional: the bench extra
    from arq.connections import RedisSettings  # noqa: PLC0415

    settings = RedisSettings.from_dsn(url)
    local = threading.local()
    made: list[tuple[asyncio.AbstractEventLoop, Any]] = []
    lock = threading.Lock()

    def connected() -> tuple[asyncio.AbstractEventLoop, Any]:
        try:
            return local.client  # type: ignore[no-any-return]
        except AttributeError:
            loop = asyncio.new_event_loop()
            local.client = loop, loop.run_until_complete(create_pool(settings))
            with lock:
                made.append(local.client)
            return local.client  # type: ignore[no-any-return]

    def enqueue(event: dict[str, Any]) -> Any:
        loop, pool = connected()
        return loop.run_until_complete(pool.enqueue_job("arq_no_op", event))

    def close() -> None:
        for loop, pool in made:
            loop.run_until_complete(pool.aclose())
            loop.close()
        made.clear()

    connected()  # this thread's, now (a producer process has no other)
    return Sender(enqueue, [close])


# --- the consumer process --------------------------------------------------------------


def consume(system: str, url: str, concurrency: int, events: int) -> None:
    """Run ``system``'s worker until SIGTERM: ``ready`` once it ran the warm-up job,
    ``done`` once it ran ``events`` more."""
    _TALLY.start(events)
    warm = sender(system, url)
    warm.enqueue(dict(WARM_UP))
    warm.close()
    if system == "RQ":
        from redis import Redis  # noqa: PLC0415 - optional: the bench extra
        from rq import SimpleWorker  # noqa: PLC0415
        from rq.worker_pool import WorkerPool  # noqa: PLC0415

        connection = Redis.from_url(url)
        pool = WorkerPool(
            [QUEUE], connection=connection, num_workers=concurrency, worker_class=SimpleWorker
        )
        pool.start(logging_level="WARNING")  # SIGTERM: it stops its workers, then returns
        connection.close()
    elif system == "arq":
        from arq.connections import RedisSettings  # noqa: PLC0415
        from arq.worker import Worker, func  # noqa: PLC0415

        asyncio.set_event_loop(asyncio.new_event_loop())  # the Worker takes the current one
        Worker(
            functions=[func(arq_no_op, name="arq_no_op")],  # type: ignore[arg-type]  # *args
            redis_settings=RedisSettings.from_dsn(url),
            max_jobs=concurrency,
            poll_delay=ARQ_POLL_DELAY,
            # On SIGTERM, let the jobs finish (their results are stored after the task
            # ran), then end run(); without it the jobs are cancelled and run() raises.
            job_completion_wait=int(TIMEOUT),
        ).run()
    elif system == "dramatiq":
        import dramatiq  # noqa: PLC0415

        broker, _ = _dramatiq(url)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda _number, _frame: stop.set())
        threads = dramatiq.Worker(
            broker, worker_threads=concurrency, worker_timeout=DRAMATIQ_WORKER_TIMEOUT_MS
        )
        threads.start()
        stop.wait()
        threads.stop()
        broker.close()
    elif system == "Celery":
        app, _ = _celery(url)
        celery_worker = app.Worker(
            pool="prefork",
            concurrency=concurrency,
            loglevel="WARNING",
            quiet=True,
            without_mingle=True,
        )
        celery_worker.start()  # a SIGTERM is its warm shutdown, after which start returns
    else:
        raise ValueError(f"not a Redis peer: {system!r}")


def consumer_command(system: str, url: str, concurrency: int, events: int) -> list[str]:
    """The command line of :func:`consume` in a process of its own."""
    args = ["--consume", system, url, str(concurrency), str(events)]
    return [sys.executable, "-m", "benchmarks.redis_peers", *args]


# --- in the benchmark's process: producer threads ----------------------------------------


def end_to_end(system: str, persistence: str, sizes: Sizes, directory: Path) -> float:
    """Events/s of ``system``: ``sizes.producers`` producer threads in this process share
    ``sizes.events`` single enqueues, released together, timed until its consumer process
    (``sizes.concurrency``) has run the last one; on a fresh server in ``directory``."""
    with RedisServer(directory, persistence) as server:
        consumer = Child(consumer_command(system, server.url, sizes.concurrency, sizes.events))
        failed = True
        try:
            consumer.wait_for("ready")
            send = sender(system, server.url)
            try:
                start, _ = run_producers(send.enqueue, sizes.events, sizes.producers)
                finished = consumer.wait_for("done")
            finally:
                send.close()
            failed = False
        finally:
            code = consumer.stop()
        if code and not failed:
            raise RuntimeError(f"{system}'s consumer exited with {code}: {consumer.errors()}")
    return rate(sizes.events, finished - start)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.redis_peers --consume SYSTEM URL CONCURRENCY EVENTS``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_peers", description=__doc__)
    parser.add_argument("--consume", nargs=4, required=True, help="SYSTEM URL CONCURRENCY EVENTS")
    args = parser.parse_args(argv)
    system, url, concurrency, events = args.consume
    consume(system, url, int(concurrency), int(events))
    return 0


if __name__ == "__main__":
    # Run as benchmarks.redis_peers, not __main__: RQ names its jobs' function by module
    # path, and the tasks must count in the module that consume() set up.
    sys.exit(importlib.import_module("benchmarks.redis_peers").main())
