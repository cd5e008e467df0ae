"""A healthy worker keeps its leases (docs/deployment.md, "Several workers on one store").

A worker renews its leases every third of ``--lease-ttl``, so a lease it holds has about
two thirds of the ttl left at any moment: a stall shorter than that (a GC pause, a
moment of swap) costs it nothing. Here two live, idle ``dopool worker`` processes share
a store, and each in turn is frozen (SIGSTOP) for a third of the ttl, one renewal
period, at a moment aimed to cover the instant at which its lease, as ``dopool status
--json`` showed it just before, would expire if it were not renewed meanwhile. Read at
the end of each stall, before SIGCONT, every lease still names its holder with its epoch
and has time left (under renewals every ttl/3, at least about a third of the ttl); at the
end no instance counted a restart and neither worker logged anything (a worker logs at
WARNING a lease taken over from it, and a transaction fenced off).

Renewed only once per ttl, a lease is renewed just after the instant it expires, so a
stall that covers that instant finds it expired (and the other worker may take it
over). Each stall starts ``early`` seconds before that instant, drawn uniform over the
stall's length, so over a whole renewal period of the design: every phase. A stall
misses the instant only if the test's SIGSTOP comes more than ``early`` late, with a
probability of about that lateness over ``STALL``: some 10 ms over 500 ms on an idle
machine, so that the ``STALLS`` stalls all miss with a probability of about 0.02 ** 8,
3e-14; were the test 150 ms late each time, 0.3 ** 8, 7e-5.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli_support import invoke
from worker_support import Evidence, Worker, until

TTL = 1.5  # seconds; renewed every third
STALL = TTL / 3  # one renewal period: well inside the two thirds of a ttl a renewal leaves
STALLS = 8  # 4 per worker
SETTLE = 0.2  # seconds after a SIGCONT: the woken worker renews, if a renewal is due
# Renewals commit without an fsync: a disk busy with other work must not stall them (a
# second's fsync is a stall of the worker's own, beyond any margin). Leases do not
# depend on durability.
ARGS = ("--lease-ttl", str(TTL), "--durability", "async")

pytestmark = [pytest.mark.threaded, pytest.mark.slow]


def shown(store: Path) -> dict[str, Any]:
    """Pool ``jobs`` as ``dopool status --json`` shows it."""
    result = invoke("status", str(store), "--json")
    assert result.exit_code == 0, result.output
    (pool,) = json.loads(result.stdout)["pools"]
    assert isinstance(pool, dict)
    return pool


def holders(pool: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Each leased instance's holder (its pid) and the lease's epoch."""
    return {
        index: (lease["pid"], lease["epoch"])
        for index, lease in pool["leases"].items()
        if lease is not None
    }


def left(pool: dict[str, Any], pid: int | None = None) -> float:
    """The least time any lease (of worker ``pid``) has left, in seconds."""
    leases = [lease for lease in pool["leases"].values() if pid in (None, lease["pid"])]
    return float(min(lease["expires_in"] for lease in leases))


def test_two_idle_workers_keep_their_leases_through_stalls_within_the_margin(
    store_path: Path, evidence: Evidence, worker: Callable[..., Worker]
) -> None:
    pair = [worker(store_path, evidence, *ARGS, concurrency=4).ready() for _ in range(2)]
    pids = sorted(w.proc.pid for w in pair)
    until(
        lambda: sorted(pid for pid, _ in holders(shown(store_path)).values()) == sorted(pids * 2),
        "the two workers holding two instances each",
    )
    held = holders(shown(store_path))
    draw = random.Random()  # a new phase every run
    for n in range(STALLS):
        frozen = pair[n % 2]
        time.sleep(SETTLE)  # real-time: see SETTLE (the last stall's worker may renew)
        before = left(shown(store_path), frozen.proc.pid)
        early = draw.uniform(0, STALL)
        time.sleep(max(0.0, before - early))  # real-time: until `early` s before expiry
        frozen.signal(signal.SIGSTOP)
        try:
            time.sleep(STALL)  # real-time: the stall, a fault that lasts this long
            during = shown(store_path)
        finally:
            frozen.signal(signal.SIGCONT)
        where = f"stall {n} of pid {frozen.proc.pid}, {early:.3f} s before {before:.3f} s"
        assert holders(during) == held, f"{where}: {during['leases']}"
        assert left(during) > 0, f"{where}: {during['leases']}"
    after = shown(store_path)
    assert holders(after) == held
    assert all(instance["restarts"] == 0 for instance in after["instances"])  # (used ones)
    for each in pair:
        assert each.stop() == 0
        assert each.stderr == ""  # no lease taken over, no transaction fenced off
