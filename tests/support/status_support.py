"""What tests of dead letters compare of a pool's status: its counters, not the dead
letters it holds now (a purge or a redrive changes ``dead_letters_held``, no counter)."""

from __future__ import annotations

from dataclasses import replace

from dopool import PoolStatus


def counters(status: PoolStatus) -> PoolStatus:
    """``status`` with every ``dead_letters_held`` (the pool's, its instances') set to 0."""
    instances = [replace(instance, dead_letters_held=0) for instance in status.instances]
    return replace(status, dead_letters_held=0, instances=instances)
