"""What one chaos scenario did: its :class:`Result`, failure report and replay command."""

from __future__ import annotations

from dataclasses import dataclass, field


def replay_command(seed: int, *, processes: bool = False) -> str:
    """The one-line command that runs ``seed`` again: exactly, or with ``processes`` (the
    multi-process mode) its plan again, not its interleavings."""
    return f"dopool chaos --processes --seed {seed}" if processes else f"dopool chaos --seed {seed}"


@dataclass
class Result:
    """What one scenario did and which invariants it broke."""

    seed: int
    violations: list[str]
    steps: int = 0
    enqueued: int = 0  # entries the engine stored: acknowledged, follow-ups, redriven
    acknowledged: int = 0
    scheduled: int = 0  # acknowledged enqueues due later than they were stored
    duplicates: int = 0  # enqueues answered with an event that holds their dedup key
    executions: int = 0
    crashes: int = 0
    restarts: int = 0
    succeeded: int = 0
    dead_lettered: int = 0
    drained: int = 0
    reopens: int = 0
    virtual_time: float = 0.0
    wall_time: float = 0.0
    idle: bool = False
    trace: bytes = b""  # the runtimes' JSON-lines traces, one incarnation after another
    log: list[str] = field(default_factory=list)  # the history, one record per line
    processes: bool = False  # a seed of the multi-process mode
    big: bool = False  # a seed of the multi-process mode's big family
    frozen_producers: int = 0  # frozen-writer faults that landed on a producer
    frozen_workers: int = 0  # and on a worker
    freezes_missed: int = 0  # planned freezes that found no holder of the writer lock
    refused: int = 0  # enqueues a producer gave up on (while a frozen writer held the lock)
    kept: str | None = None  # the directory a failing multi-process run left to inspect

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        """A failure report: the seed, the replay command, then each violation."""
        lines = [
            f"chaos seed {self.seed}: {len(self.violations)} invariant violation(s)",
            f"replay: {replay_command(self.seed, processes=self.processes)}",
        ]
        if self.kept:
            lines.append(f"kept: {self.kept} (the store, and every process's records)")
        lines += [f"  - {violation}" for violation in self.violations[:30]]
        if len(self.violations) > 30:
            lines.append(f"  ... and {len(self.violations) - 30} more")
        return "\n".join(lines)
