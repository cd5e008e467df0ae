"""The store's writer lock held from outside: by another open file, or by a stopped process."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dopool._store.writerlock import WRITER_LOCK

TIMEOUT = 60.0


@contextmanager
def held(store: Path) -> Iterator[None]:
    """The store's writer lock, held as another process would hold it."""
    fd = os.open(store / WRITER_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases it


@contextmanager
def frozen_writer(store: Path, *, killed: bool = False) -> Iterator[int]:
    """A process that takes the store's writer lock as dopool does and is stopped (SIGSTOP)
    while it holds it: its pid. Continued at the end, or, ``killed``, SIGKILLed while
    stopped (the kernel releases its lock)."""
    script = """
import os, signal, sys
from pathlib import Path
from dopool._store.writerlock import WriterLock
with WriterLock(Path(sys.argv[1])):
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
"""
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(store)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "holding\n"
        _, status = os.waitpid(child.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        yield child.pid
        os.kill(child.pid, signal.SIGKILL if killed else signal.SIGCONT)
        assert child.wait(TIMEOUT) == (-signal.SIGKILL if killed else 0)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
