"""``dopool worker`` hears a signal whichever of its threads the kernel hands it to.

A process has many threads (the actors, the clock, the store's watcher); SIGTERM goes
to any one that does not block it. A handler written in Python runs only when the main
thread next runs Python code, and the worker's main thread waits in ``select`` for the
signal's byte: the byte must come from the interpreter's own handler.
"""

from __future__ import annotations

import signal
import threading
import time

from dopool._ops.worker import signals


def test_a_signal_taken_by_another_thread_reaches_the_waiting_main_thread() -> None:
    def signal_this_thread() -> None:
        # Not a wait for the engine: the main thread must be inside select() when the
        # signal lands here, the case that went wrong.
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    with signals() as wait:
        other = threading.Thread(target=signal_this_thread)
        started = time.monotonic()
        other.start()
        got = wait(started + 10.0)
        waited = time.monotonic() - started
        other.join()
        again = wait(time.monotonic())
    assert got == signal.SIGTERM, f"no signal after {waited:.1f} s"
    assert again is None  # one signal, one byte


def test_the_previous_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGINT)
    with signals():
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before
