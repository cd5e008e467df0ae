"""A deployment's Ray actors by name, and Ray itself, imported only when asked.

Every actor of a deployment lives in the Ray namespace :data:`NAMESPACE`, named after
the deployment, so that a producer on any node and in any job finds them by name:
the placement record ``dopool/<name>/placement`` and the hosts
``dopool/<name>/host/<index>``. Refusals travel back from a host as data
(:func:`refusal`), since dopool's errors take keyword arguments that pickling's default
for exceptions does not pass back.
"""

from __future__ import annotations

from typing import Any

from dopool._errors import DopoolError
from dopool._sim.executors import RayUnavailableError

#: The Ray namespace of every deployment's actors.
NAMESPACE = "dopool"

#: A refused call's error as it travels: its class, ``args`` and attributes.
Refusal = tuple[type[DopoolError], tuple[Any, ...], dict[str, Any]]


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        RayUnavailableError: Ray (the ``ray`` extra) is not installed.
    """
    try:
        import ray  # noqa: PLC0415 - the optional extra, only for dopool.ray
    except ImportError as exc:
        raise RayUnavailableError(exc.name or "ray") from None
    return ray


def record_name(deployment: str) -> str:
    """The placement record's actor name."""
    return f"dopool/{deployment}/placement"


def host_name(deployment: str, index: int) -> str:
    """Host ``index``'s actor name."""
    return f"dopool/{deployment}/host/{index}"


def refusal(error: DopoolError) -> Refusal:
    """``error`` as data that pickles whatever its ``__init__`` takes."""
    return type(error), error.args, dict(vars(error))


def refused(travelled: Refusal) -> DopoolError:
    """The error :func:`refusal` made data of, made again (its ``__init__`` not called)."""
    kind, args, attributes = travelled
    error = kind.__new__(kind, *args)
    error.args = args
    vars(error).update(attributes)
    return error
