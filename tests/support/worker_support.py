"""What the tests of ``dopool worker`` and live control share: a worker process and the
evidence its handlers write (``tests/support/_worker_app.py``), waited on, never slept for."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from dopool import EnqueueResult, EventContext, RetryAfter

TESTS = Path(__file__).parent
WAIT = 30.0  # the longest any wait here takes before the test fails


def until(predicate: Callable[[], bool], what: str, every: float = 0.02) -> None:
    """Wait for ``predicate`` (checked every ``every`` seconds), at most ``WAIT`` seconds."""
    pause = threading.Event()
    for _ in range(int(WAIT / every)):
        if predicate():
            return
        pause.wait(every)
    raise AssertionError(f"waited {WAIT} s for {what}")


class Evidence:
    """The JSON lines the worker's handlers and subscriber write to a pipe, in order.

    The test holds the pipe's write end too, to put its own marks among them.
    """

    def __init__(self) -> None:
        self._read, self.fd = os.pipe()
        self.gate_read, self._gate_write = os.pipe()
        self.lines: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        with os.fdopen(self._read, "rb") as pipe:
            for raw in pipe:
                with self._cond:
                    self.lines.append(json.loads(raw))
                    self._cond.notify_all()

    def mark(self, what: str) -> None:
        os.write(self.fd, (json.dumps({"e": "mark", "what": what}) + "\n").encode())

    def release(self, count: int = 1) -> None:
        """Let ``count`` gated handlers return."""
        os.write(self._gate_write, b"x" * count)

    def wait(self, predicate: Callable[[list[dict[str, Any]]], bool], what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.lines), WAIT):
                raise AssertionError(f"waited {WAIT} s for {what}; saw {self.lines[-20:]}")

    def wait_for(self, what: str, **fields: Any) -> dict[str, Any]:
        """The first line with ``fields``, once it came."""
        found: list[dict[str, Any]] = []

        def seen(lines: list[dict[str, Any]]) -> bool:
            found[:] = [line for line in lines if _matches(line, fields)][:1]
            return bool(found)

        self.wait(seen, what)
        return found[0]

    def snapshot(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self.lines)

    def close(self) -> None:
        for fd in (self.fd, self.gate_read, self._gate_write):
            os.close(fd)
        self._thread.join(WAIT)


def _matches(line: dict[str, Any], fields: dict[str, Any]) -> bool:
    return all(line.get(name) == value for name, value in fields.items())


def starts(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["e"] == "start"]


class Worker:
    """A ``dopool worker _worker_app:APP`` process, its stdout read line by line."""

    def __init__(
        self,
        store: Path,
        evidence: Evidence,
        *args: str,
        app: str = "app",
        concurrency: int | str = 2,
        work: float = 0.0,
        idle_timeout: float | None = None,
        spec: str | None = None,
        log: Path | None = None,
    ) -> None:
        """``work``: the seconds each attempt of the app's handler takes; ``idle_timeout``: its
        pool's (60 s by default); ``spec``: another
        APP than ``_worker_app:<app>``; ``log``: a file for its stderr (a pipe otherwise,
        read when it has exited: a worker that logs much would fill it and block)."""
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "WORKER_LOG_FD": str(evidence.fd),
            "WORKER_GATE_FD": str(evidence.gate_read),
            "WORKER_CONCURRENCY": str(concurrency),
            "WORKER_HANDLER_SECONDS": str(work),
            **({} if idle_timeout is None else {"WORKER_IDLE_TIMEOUT": str(idle_timeout)}),
        }
        command = [sys.executable, "-m", "dopool", "worker", spec or f"_worker_app:{app}"]
        sink = None if log is None else log.open("w")
        try:
            self.proc = subprocess.Popen(
                [*command, "--store", str(store), "--log-level", "warning", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE if sink is None else sink,
                text=True,
                env=env,
                pass_fds=(evidence.fd, evidence.gate_read),
            )
        finally:
            if sink is not None:
                sink.close()  # the worker has its own copy
        self.stdout: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self.stdout.put(line.rstrip("\n"))

    def line(self, containing: str) -> str:
        """The next stdout line that contains ``containing`` (earlier ones are kept)."""
        while True:
            try:
                line = self.stdout.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"no line with {containing!r}; saw {self.out}") from None
            self.out.append(line)
            if containing in line:
                return line

    def ready(self) -> Worker:
        self.line("dopool worker: store")
        return self

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def wait(self) -> int:
        """Its exit status (the test fails if it does not exit within ``WAIT``)."""
        try:
            code = self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the worker did not exit") from None
        self._reader.join(WAIT)
        while not self.stdout.empty():
            self.out.append(self.stdout.get())
        return code

    def stop(self) -> int:
        """SIGTERM, and its exit status."""
        self.signal()
        return self.wait()

    @property
    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def workers() -> Iterator[Callable[..., Worker]]:
    """A fixture's body: start workers; every one is killed at the end if still running."""
    started: list[Worker] = []

    def start(*args: Any, **kwargs: Any) -> Worker:
        worker = Worker(*args, **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


def produce(store: Path, producer: int, count: int) -> subprocess.Popen[str]:
    """A producer process (``_connect_child.py produce``) enqueueing ``count`` events
    into pool ``jobs``."""
    child = [sys.executable, str(TESTS / "_connect_child.py")]
    return subprocess.Popen(
        [*child, "produce", str(store), "jobs", str(producer), str(count)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def acknowledged(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """A producer's acknowledged events, once it has finished (it must succeed)."""
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[-1] == "done"
    return [json.loads(line) for line in lines[:-1]]


class Ran:
    """What in-process runtimes' handlers ran, in order: (runtime, index, sequence). An
    event ``{"stuck": True}`` waits in backoff, holding up its instance's next event."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, int, int]] = []

    def handler(self, who: str) -> Callable[[EventContext], None]:
        def run(ctx: EventContext) -> None:
            with self.lock:
                self.log.append((who, ctx.instance_index, ctx.sequence))
            if ctx.event == {"stuck": True}:
                raise RetryAfter(3600)

        return run

    def who_ran(self, result: EnqueueResult) -> set[str]:
        """The runtimes that ran the event ``result`` names."""
        with self.lock:
            return {
                who
                for who, index, sequence in self.log
                if (index, sequence) == (result.instance_index, result.sequence)
            }


@contextmanager
def parent_of_a_lingering_child(before: str, after: str, *args: str) -> Iterator[str]:
    """Run a parent process: ``before``, then a fork whose child lives on (until this
    context ends), then ``after``, which prints one line and exits. Yields that line
    once the parent has exited (status 0), the child still alive.

    The parent goes on only once the child's fork hooks have run, or what the test then
    checks (a lock the child should have let go) would race them.
    """
    fork = """
        import os
        ready, started = os.pipe()
        if os.fork() == 0:
            os.write(started, b"!")  # fork's hooks ran before fork() returned here
            os.read(0, 1)  # lives on until the test closes its stdin
            os._exit(0)
        os.read(ready, 1)
        """
    script = "\n".join(textwrap.dedent(part) for part in (before, fork, after))
    with subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as parent:
        assert parent.stdout is not None
        assert parent.stdin is not None
        try:
            line = parent.stdout.readline()
            assert parent.wait(timeout=WAIT) == 0
            yield line
        finally:
            parent.stdin.close()  # the child ends
