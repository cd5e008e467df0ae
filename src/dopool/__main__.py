"""``python -m dopool``: a seeded simulation of a small pool, printed as a report.

It runs the real engine on a SimulatedClock: 4 instances, a burst of events
over skewed partition keys, handlers that take virtual time, transient
failures, one poison event, and one instance killed mid-run.
"""

from __future__ import annotations

import argparse
import random
import time

from dopool import EventContext, RetryPolicy, Runtime, SimulatedClock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dopool", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="seed for every random choice")
    parser.add_argument("--events", type=int, default=400, help="events to enqueue")
    parser.add_argument("--instances", type=int, default=4, help="pool concurrency")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    wall = time.perf_counter()
    latencies: list[float] = []

    with Runtime.simulated(seed=args.seed) as runtime:
        clock = runtime.clock
        assert isinstance(clock, SimulatedClock)

        def handle(ctx: EventContext) -> None:
            event = ctx.event
            ctx.sleep(event["cost"])
            if event["poison"]:
                raise ValueError("this event can never succeed")
            if ctx.attempt <= event["flaky"]:
                raise ConnectionError(f"transient failure {ctx.attempt}")
            latencies.append(clock.now() - ctx.enqueued_at)

        pool = runtime.define(
            "demo",
            execute=handle,
            concurrency=args.instances,
            retry=RetryPolicy(max_attempts=4, initial_delay=0.5, max_delay=5.0),
        )
        crashes: list[str] = []
        runtime.subscribe(lambda e: crashes.append(e.pool) if e.kind == "crashed" else None)
        keys = [f"customer-{n}" for n in range(20)]
        weights = [1 / (rank + 1) for rank in range(len(keys))]  # Zipf-like skew
        for n in range(args.events):
            event = {
                "n": n,
                "cost": round(rng.expovariate(1 / 0.05), 4),
                "flaky": 1 if rng.random() < 0.1 else 0,
                "poison": n == args.events // 2,
            }
            pool.enqueue(event, partition_key=rng.choices(keys, weights)[0])
        # Let the burst run for a second of virtual time, then crash one instance:
        # the attempt it was in is counted and retried, nothing is lost.
        clock.advance(1.0)
        runtime.kill("demo", 0)
        finished = pool.join(timeout=120)
        status = pool.status()
        dead = pool.dead_letters()
        virtual = clock.now()
    wall = time.perf_counter() - wall

    print(f"dopool simulation  seed={args.seed}  events={args.events}  instances={args.instances}")
    print(f"finished={finished}  virtual time={virtual:.2f} s  wall time={wall:.2f} s")
    print()
    header = (
        f"{'instance':<10}{'enqueued':>9}{'succeeded':>10}{'dead':>6}{'pending':>8}{'restarts':>9}"
    )
    print(header)
    print("-" * len(header))
    for s in status.instances:
        print(
            f"{s.instance_id:<10}{s.enqueued:>9}{s.succeeded:>10}{s.dead_lettered:>6}"
            f"{s.pending:>8}{s.restarts:>9}"
        )
    print("-" * len(header))
    print(
        f"{'total':<10}{status.enqueued:>9}{status.succeeded:>10}{status.dead_lettered:>6}"
        f"{status.pending:>8}{sum(s.restarts for s in status.instances):>9}"
    )
    print()
    if latencies:
        ordered = sorted(latencies)
        p50 = ordered[len(ordered) // 2]
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(f"enqueue-to-success latency (virtual s): p50={p50:.3f}  p99={p99:.3f}")
    print(f"crashes injected: {len(crashes)}")
    for letter in dead:
        where = f"{letter.instance_index}:{letter.sequence}"
        print(f"dead letter {where} after {letter.attempts} attempts: {letter.error}")
    balanced = all(
        s.enqueued == s.succeeded + s.dead_lettered + s.drained + s.pending
        for s in status.instances
    )
    print(f"counters balance (enqueued = succeeded + dead + drained + pending): {balanced}")
    return 0 if finished and balanced else 1


if __name__ == "__main__":
    raise SystemExit(main())
