"""A queue machine driven directly, a transaction per step (tests/machine/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dopool._engine.options import PoolOptions
from dopool._machine.followups import FollowUp
from dopool._machine.invariants import index_violations, read_instance, violations
from dopool._machine.machine import QueueMachine
from dopool._machine.types import Effects, Item
from dopool._store.environment import Store
from dopool._store.layout import Meta, pack
from dopool._store.txn import Txn
from dopool.chaos import FaultInjector, FaultPlan


class Rig:
    """A machine for instance 0 of pool ``p``, its meta, and a transaction per step."""

    def __init__(
        self,
        store: Store,
        *,
        route: Callable[[str | None], int] = lambda key: 0,
        plan: FaultPlan | None = None,
        **options: Any,
    ) -> None:
        self.store = store
        self.points: list[str] = []
        self.machine = QueueMachine(
            pool="p",
            index=0,
            rules=PoolOptions(execute=lambda ctx: None, **options).rules,
            seed=0,
            route=route,
            faults=FaultInjector(plan, "p", 0),
            fault_point=lambda point, fault: self.points.append(point),
            listening=lambda: True,
        )
        self.meta = Meta()

    def step(self, transition: Callable[[Txn, Meta, Effects], Any]) -> tuple[Any, Effects]:
        """Run one transition in one committed transaction; (its result, its effects)."""
        fx = Effects()
        with self.store.write() as txn:
            result = transition(txn, self.meta, fx)
            self.machine.namespace.save_meta(txn, self.meta)
        return result, fx

    def enqueue(self, *events: Any, priority: int = 0, now: float = 0.0) -> Any:
        """Accept one batch and re-arm, as the shell's enqueue transaction does."""
        items = tuple(Item(pack(event), None, priority) for event in events)

        def accept(txn: Txn, meta: Meta, fx: Effects) -> None:
            self.machine.accept(txn, meta, [("t", items)], now, fx)
            self.machine.rearm(meta, now)

        _, fx = self.step(accept)
        [(token, answer)] = fx.answers
        assert token == "t"
        return answer

    def start(self, now: float) -> Any:
        started, _ = self.step(lambda txn, meta, fx: self.machine.take_alarm(txn, meta, now, fx))
        return started

    def fail(self, failure: BaseException, now: float) -> Effects:
        key = self.meta.current
        assert key is not None

        def failed(txn: Txn, meta: Meta, fx: Effects) -> None:
            record = self.machine.namespace.get_event(txn, key)
            assert record is not None
            self.machine.finish_attempt(meta)
            self.machine.fail(txn, meta, key, record, failure, now, fx)
            self.machine.rearm(meta, now)

        return self.step(failed)[1]

    def succeed(self, now: float, follow_ups: list[FollowUp] | None = None) -> Effects:
        key = self.meta.current
        assert key is not None

        def done(txn: Txn, meta: Meta, fx: Effects) -> None:
            self.machine.finish_attempt(meta)
            self.machine.succeed(txn, meta, key, meta.attempt, follow_ups or [], now, fx)
            self.machine.rearm(meta, now)

        return self.step(done)[1]

    def broken(self) -> list[str]:
        """What the store breaks of guarantee 4 (docs/guarantees.md), its alarm and work
        indexes included; [] if it balances."""
        with self.store.read() as txn:
            stored = read_instance(txn, "p", 0)
            indexes = index_violations(txn, {"p": 1})
        assert stored.meta == self.meta, "each step commits the rig's meta"
        return [*violations(stored), *indexes]
