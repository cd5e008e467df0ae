"""``python -m benchmarks.ray_pools``: pools across nodes (``dopool.ray``) on a simulated cluster.

A ``ray.cluster_utils.Cluster`` of ``--nodes`` nodes (3; every node a raylet of its own on
this one machine, one CPU each), a deployment of this module's ``app`` (one pool,
``--concurrency`` instances split over a shard host per node, a handler that only notes
when it started), and producers on the nodes. Measured, in one run:

- **a Ray call**: a no-op actor call from a producer on one node to an actor on another,
  one at a time: the floor under every call a producer makes to a host;
- **throughput**: a producer actor on every node, each enqueuing its share of
  ``--events`` one at a time on each of ``--threads`` threads (each call answered after
  the host's commit; a connection's threads' calls to one host go together while one is
  out), released together; from the release until the last event has started, and per
  producer the mean time a thread's call took;
- **enqueue-to-start latency**: one producer, one event at a time a random 5-15 ms apart
  (so each finds its instance idle), from the wall clock just before the call to the
  handler's ``ctx.started_at`` (one machine, one clock), as ``benchmarks.connect``
  measures it for a producer process beside one runtime.

The handlers write what they saw to files in a directory every node can read (one
machine), which the benchmark reads; nothing here asserts on timings. Absolute numbers
on one 2-core machine running every node are not the point: the per-call overhead
against the Ray call, and how the shape changes with the nodes, are. Example::

    python -m benchmarks.ray_pools                     # 3 nodes, sync
    python -m benchmarks.ray_pools --nodes 1           # the one-node shape, same code
    python -m benchmarks.ray_pools --threads 4         # four threads a producer, batched
    python -m benchmarks.ray_pools --durability async --events 4000
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dopool
import dopool.ray
from benchmarks.harness import latency_line, percentile

POOL = "bench"
TIMEOUT = 300.0
_RECORDS = "DOPOOL_RAY_BENCH_RECORDS"  # where the handlers write (set for the whole job)
_CONCURRENCY = "DOPOOL_RAY_BENCH_CONCURRENCY"


# --- what runs on the hosts --------------------------------------------------------------


def app(runtime: dopool.Runtime) -> None:
    """The hosts' app: one pool whose handler notes its start and the call's time."""
    runtime.define(POOL, execute=_note, concurrency=int(os.environ[_CONCURRENCY]))


def _note(ctx: dopool.EventContext) -> None:
    line = f"{ctx.started_at - ctx.event['called']:.6f}\n".encode()
    path = Path(os.environ[_RECORDS]) / f"{os.getpid()}.started"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, line)  # one write a line: whole lines, whoever reads
    finally:
        os.close(descriptor)


def started(records: Path) -> list[float]:
    """Every start noted so far: its latency from the producer's call, in seconds."""
    found: list[float] = []
    for path in records.glob("*.started"):
        found.extend(float(line) for line in path.read_text().split())
    return found


# --- the producers -----------------------------------------------------------------------


class Producer:
    """A producer on one node (a Ray actor): a connection to the deployment."""

    def __init__(self, deployment: str, durability: str) -> None:
        self._pool = dopool.ray.connect(deployment, durability=durability).pool(POOL)

    def ready(self) -> bool:
        return True

    def enqueue(self, first: int, count: int, step: int, threads: int) -> float:
        """Enqueue ``count`` events one at a time on each of ``threads`` threads (sharing
        the connection, whose calls to one host go together while one is out); the
        seconds it took."""

        def send(start: int) -> None:
            for n in range(start, first + count * step * threads, step * threads):
                self._pool.enqueue({"n": n, "called": time.time()})

        begun = time.perf_counter()
        workers = [threading.Thread(target=send, args=(first + t * step,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return time.perf_counter() - begun

    def trickle(self, count: int) -> None:
        """Enqueue ``count`` events one at a time, 5-15 ms apart."""
        pause = random.Random(1)
        for n in range(count):
            time.sleep(pause.uniform(0.005, 0.015))
            self._pool.enqueue({"n": n, "called": time.time()})


class Echo:
    """A no-op actor: the Ray call underneath every producer's call."""

    def echo(self, value: bytes) -> bytes:
        return value


def _pinned(node: str) -> Any:
    """Ray's scheduling onto ``node`` and nowhere else."""
    strategies: Any = importlib.import_module("ray.util.scheduling_strategies")
    return strategies.NodeAffinitySchedulingStrategy(node, soft=False)


def ray_call_seconds(ray: Any, nodes: list[str], calls: int) -> list[float]:
    """Round trips of a no-op actor call from a task on the first node to an actor on the
    last (the same node if there is one)."""
    echo = ray.remote(num_cpus=0)(Echo).options(scheduling_strategy=_pinned(nodes[-1]))
    actor = echo.remote()

    def time_calls(target: Any, count: int) -> list[float]:
        get: Any = importlib.import_module("ray").get
        seconds = []
        for _ in range(count):
            begun = time.perf_counter()
            get(target.echo.remote(b"x" * 64))
            seconds.append(time.perf_counter() - begun)
        return seconds

    task = ray.remote(num_cpus=0)(time_calls).options(scheduling_strategy=_pinned(nodes[0]))
    found: list[float] = ray.get(task.remote(actor, calls), timeout=TIMEOUT)
    ray.kill(actor)
    return found[calls // 10 :]  # the first calls warm the connection


def measure(args: argparse.Namespace, records: Path, ray: Any, nodes: list[str]) -> None:
    deployment = f"bench-{os.getpid()}"
    stores = str(records.parent / "stores" / "{host}")
    with dopool.ray.deploy(
        "benchmarks.ray_pools:app", stores, name=deployment, durability=args.durability
    ):
        producer = ray.remote(num_cpus=0)(Producer)
        producers = [
            producer.options(scheduling_strategy=_pinned(node)).remote(deployment, args.durability)
            for node in nodes
        ]
        ray.get([p.ready.remote() for p in producers], timeout=TIMEOUT)
        threads = args.threads
        share = args.events // (len(producers) * threads)
        begun = time.perf_counter()
        spent = [
            p.enqueue.remote(i, share, len(producers), threads) for i, p in enumerate(producers)
        ]
        expected = share * len(producers) * threads
        while len(started(records)) < expected:
            if time.perf_counter() - begun > TIMEOUT:
                raise RuntimeError(f"only {len(started(records))} of {expected} events started")
            time.sleep(0.01)
        elapsed = time.perf_counter() - begun
        per_call = [seconds / share for seconds in ray.get(spent, timeout=TIMEOUT)]  # a thread's
        print(
            f"throughput {len(producers)} producers (one a node) x {threads} thread(s) x "
            f"{share:,} events: {expected / elapsed:8,.0f} events/s; a call took "
            f"{min(per_call) * 1e3:.2f}-{max(per_call) * 1e3:.2f} ms on average",
            flush=True,
        )
        for path in records.glob("*.started"):
            path.unlink()
        ray.get(producers[0].trickle.remote(args.samples), timeout=TIMEOUT)
        while len(latencies := started(records)) < args.samples:
            if time.perf_counter() - begun > 2 * TIMEOUT:
                raise RuntimeError(f"only {len(latencies)} of {args.samples} events started")
            time.sleep(0.01)
        print(latency_line("enqueue-to-start", latencies), flush=True)
        for actor in producers:
            ray.kill(actor)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_pools", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3, help="simulated nodes, a host each")
    parser.add_argument("--events", type=int, default=3_000, help="throughput, all producers")
    parser.add_argument("--threads", type=int, default=1, help="threads a producer")
    parser.add_argument("--samples", type=int, default=200, help="latency events")
    parser.add_argument("--concurrency", type=int, default=12, help="the pool's instances")
    parser.add_argument("--durability", choices=("sync", "async"), default="sync")
    args = parser.parse_args(argv)
    try:  # the ray extra; typed as what it is here, untyped
        ray: Any = importlib.import_module("ray")
        cluster_utils: Any = importlib.import_module("ray.cluster_utils")
    except ImportError:
        print("Ray is not installed: pip install 'dopool[ray]'")
        return 1
    with tempfile.TemporaryDirectory(prefix="dopool-ray-bench-") as directory:
        records = Path(directory) / "records"
        records.mkdir()
        node_args = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
        cluster = cluster_utils.Cluster(initialize_head=True, head_node_args=node_args)
        try:
            for _ in range(args.nodes - 1):
                cluster.add_node(**node_args)
            root = Path(__file__).resolve().parent.parent  # where ``benchmarks`` is
            python_path = os.environ.get("PYTHONPATH", "")
            ray.init(
                address=cluster.address,
                logging_level="WARNING",
                runtime_env={
                    "env_vars": {
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), python_path])),
                        _RECORDS: str(records),
                        _CONCURRENCY: str(args.concurrency),
                    }
                },
            )
            nodes = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])
            print(
                f"Ray {ray.__version__}: {len(nodes)} simulated node(s) on one machine, a host "
                f"each; pool {POOL!r} of {args.concurrency} instances; {args.durability}",
                flush=True,
            )
            calls = ray_call_seconds(ray, nodes, 500)
            print(
                f"a Ray actor call, node to node: p50 {percentile(sorted(calls), 0.5) * 1e3:.2f} "
                f"ms   p99 {percentile(sorted(calls), 0.99) * 1e3:.2f} ms",
                flush=True,
            )
            measure(args, records, ray, nodes)
        finally:
            ray.shutdown()
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
