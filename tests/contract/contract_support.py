"""What the contract tests share: a :class:`Target` (a deployment of ``contract_app.py``
and its producers' handles), the app's records read back, and waits bounded by
:data:`WAIT`, never sleeps for the engine.

Three targets run the same tests (``test_contract.py``'s ``target`` fixture makes
them): ``local``, a real-clock ``Runtime`` in the test process, fed through
``runtime.pools[name]``; ``processes``, a ``dopool worker`` process, fed through
``dopool.connect(store).pool(name)``; ``ray``, a ``dopool.ray`` deployment on a local
Ray, fed through ``dopool.ray.connect(name).pool(name)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from contract_app import CONCURRENCY, POOL

from dopool import EnqueueResult
from worker_support import until

HERE = Path(__file__).parent
#: Seconds any wait here takes before its test fails.
WAIT = 30.0


class Producer(Protocol):
    """What every target's pool handle offers a producer (``WorkerPool``,
    ``ProducerPool`` and ``dopool.ray.RayPool`` alike)."""

    def enqueue(
        self,
        event: Any,
        *,
        partition_key: str | None = None,
        priority: int = 0,
        delay: float | None = None,
        dedup_key: str | None = None,
    ) -> EnqueueResult: ...

    def enqueue_many(
        self, events: Iterable[Any], *, partition_key: str | None = None
    ) -> list[EnqueueResult]: ...


def instance_of(partition_key: str, concurrency: int = CONCURRENCY) -> int:
    """The instance docs/api.md routes ``partition_key`` to: BLAKE2b (8 bytes) of its
    UTF-8, read big-endian, modulo the concurrency."""
    digest = hashlib.blake2b(partition_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % concurrency


@dataclass
class Target:
    """One deployment of ``contract_app.py`` as a test sees it.

    ``pool(name)``: a producer's handle on pool ``name``; ``ran``: the directory of the
    app's records. ``tag``: this test's own, put in every event it enqueues, so that its
    records are its own file (the worker process and the Ray deployment serve a whole
    module) and its partition keys are new to the store.
    """

    name: str
    pool: Callable[[str], Producer]
    ran: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)

    def event(self, n: int, **fields: Any) -> dict[str, Any]:
        return {"tag": self.tag, "n": n, **fields}

    def key(self, name: str) -> str:
        """A partition key of this test's own."""
        return f"{self.tag}-{name}"

    def runs(self) -> list[dict[str, Any]]:
        """Each attempt the app recorded for this test's events, in the order they
        started (the barrier's left out)."""
        log = self.ran / f"{self.tag}.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [run for run in map(json.loads, lines) if "barrier" not in run["event"]]

    def wait_for(self, ns: Iterable[int]) -> list[dict[str, Any]]:
        """The runs, once an event of each ``n`` of ``ns`` has run (within :data:`WAIT`)."""
        expected = set(ns)
        until(lambda: expected <= {run["event"]["n"] for run in self.runs()}, f"runs {expected}")
        return self.runs()

    def settle(self) -> list[dict[str, Any]]:
        """The runs, once everything this test stored and due by now has run.

        A barrier event goes to every instance of the pool (a partition key of each,
        by :func:`instance_of`); an instance runs its due events one at a time, in
        enqueue order, so once each barrier has run, so has everything enqueued before
        it, and a second run of any of them would have been recorded.
        """
        pool = self.pool(POOL)
        keys: dict[int, str] = {}
        for n in range(1000):
            keys.setdefault(instance_of(self.key(f"barrier-{n}")), self.key(f"barrier-{n}"))
            if len(keys) == CONCURRENCY:
                break
        for index, key in sorted(keys.items()):
            pool.enqueue({"tag": self.tag, "barrier": index}, partition_key=key)

        def barriers() -> int:
            log = self.ran / f"{self.tag}.log"
            lines = log.read_text().splitlines() if log.exists() else []
            return sum("barrier" in json.loads(line)["event"] for line in lines)

        until(lambda: barriers() == CONCURRENCY, "the barrier on every instance")
        return self.runs()


@contextmanager
def worker_process(store: Path) -> Iterator[subprocess.Popen[str]]:
    """A ``dopool worker contract_app:build --store STORE`` process, once it serves;
    stopped (SIGTERM, then SIGKILL) at the end."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "dopool", "worker", "contract_app:build"]
    proc = subprocess.Popen(
        [*command, "--store", str(store), "--log-level", "warning"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read, args=(proc.stdout, lines), daemon=True)
    reader.start()
    try:
        seen: list[str] = []
        while not any("dopool worker: store" in line for line in seen):
            try:
                seen.append(lines.get(timeout=WAIT))
            except queue.Empty:
                raise AssertionError(f"the worker did not start; it said {seen}") from None
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(WAIT)
        if proc.stdout is not None:
            proc.stdout.close()


def _read(stream: IO[str] | None, lines: queue.Queue[str]) -> None:
    assert stream is not None
    for line in stream:
        lines.put(line.rstrip("\n"))
