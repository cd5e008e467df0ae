"""``dopool.ray.deploy``: a deployment's shard hosts started, one per node, and its
placement record written.

:func:`deploy` starts a :class:`~dopool._ray.host.ShardHost` on each node (every alive
node, or those named), pinned there and detached (it outlives the driver), waits until
each has opened its store and defined the app's pools, checks they all define the same
pools, splits each pool's instances over them (:func:`dopool._ray.placement.place`),
keeps that in the placement record (a detached named actor), and tells each host its
ranges. Any host that fails to start stops the whole deploy: every actor it made is
killed, and :class:`~dopool.ray.DeploymentError` says which host and why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from dopool._errors import ConfigurationError, DeploymentError
from dopool._ray.actors import NAMESPACE, host_name, import_ray, record_name
from dopool._ray.host import MAX_CONCURRENCY, ShardHost
from dopool._ray.placement import HostPlace, Placement, PlacementBook, place

#: Seconds each host gets to open its store and define the app's pools.
START_TIMEOUT = 120.0
#: Seconds running handlers get to finish when a deployment closes.
CLOSE_GRACE = 30.0
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


class Deployment:
    """A running deployment: its name, its placement, its hosts' actors.

    Close it (:meth:`close`, or leave a ``with`` block) to stop its hosts and forget its
    placement; its stores stay on their nodes' disks, and a later deploy of the same app
    on the same stores serves their events again.
    """

    def __init__(self, placement: Placement, hosts: list[Any], record: Any) -> None:
        self._placement = placement
        self._hosts = hosts
        self._record = record
        self._closed = False

    @property
    def name(self) -> str:
        return self._placement.name

    @property
    def placement(self) -> Placement:
        """Which host serves which instances of which pool."""
        return self._placement

    def host(self, index: int) -> Any:
        """Host ``index``'s Ray actor handle (in placement order)."""
        return self._hosts[index]

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Deployment {self.name!r} of {len(self._hosts)} hosts, {state}>"

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self, grace: float = CLOSE_GRACE) -> None:
        """Close every host's runtime (running handlers get ``grace`` seconds), then kill
        the hosts and the placement record. A host that does not answer is killed."""
        if self._closed:
            return
        self._closed = True
        ray = import_ray()
        closing = [host.close.remote(grace) for host in self._hosts]
        for ref in closing:
            try:
                ray.get(ref, timeout=grace + 10.0)
            except Exception:  # dead, or its node gone: killed below all the same
                continue
        _kill(ray, [*self._hosts, self._record])


def deploy(
    app: str,
    store: str,
    *,
    name: str = "default",
    nodes: Sequence[str] | None = None,
    durability: str = "sync",
) -> Deployment:
    """Start a deployment of ``app`` on the Ray cluster this process is connected to.

    ``store``: the store's directory on each node; ``{node_id}`` and ``{host}`` in it
    are replaced by the node's id and the host's index (several nodes on one machine,
    as in tests, need one directory each). ``nodes``: the node ids to run a host on
    (default: every alive node). ``durability``: the hosts' runtimes'.

    Raises:
        RayUnavailableError: Ray is not installed.
        DeploymentError: one of that name runs already, or a host could not start
            (nothing is left running).
        ConfigurationError: a bad name, node list or durability.
    """
    ray = import_ray()
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(f"a deployment's name is 1-100 of A-Z a-z 0-9 _ . -, got {name!r}")
    if durability not in ("sync", "async"):
        raise ConfigurationError(f"durability must be 'sync' or 'async', got {durability!r}")
    alive = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])
    chosen = alive if nodes is None else list(nodes)
    unknown = [node for node in chosen if node not in alive]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        raise ConfigurationError(f"no host can run on nodes {chosen!r} (alive: {alive!r})")
    if _exists(ray, record_name(name)):
        raise DeploymentError(name, "one of that name runs already: close it first")
    hosts: list[Any] = []
    made = hosts  # killed again if the deploy fails
    try:
        _start(ray, name, app, chosen, store, durability, hosts)
        pools = _started(ray, name, chosen, hosts)
        places = tuple(
            HostPlace(index, node, host_name(name, index)) for index, node in enumerate(chosen)
        )
        placement = place(name, 1, places, pools)
        record = (
            ray.remote(PlacementBook)
            .options(
                name=record_name(name),
                namespace=NAMESPACE,
                lifetime="detached",
                max_restarts=-1,
                num_cpus=0,
            )
            .remote(placement)
        )
        made = [*hosts, record]
        ray.get(
            [host.serve.remote(placement.served_by(index)) for index, host in enumerate(hosts)],
            timeout=START_TIMEOUT,
        )
    except BaseException:
        _kill(ray, made)
        raise
    return Deployment(placement, hosts, record)


def _start(
    ray: Any, name: str, app: str, nodes: list[str], store: str, durability: str, hosts: list[Any]
) -> None:
    """Start a host on each node, each appended to ``hosts`` once made."""
    from ray.util.scheduling_strategies import (  # noqa: PLC0415 - the optional extra
        NodeAffinitySchedulingStrategy,
    )

    actor = ray.remote(ShardHost)
    for index, node in enumerate(nodes):
        directory = store.replace("{node_id}", node).replace("{host}", str(index))
        hosts.append(
            actor.options(
                name=host_name(name, index),
                namespace=NAMESPACE,
                lifetime="detached",
                max_restarts=-1,
                max_task_retries=0,
                max_concurrency=MAX_CONCURRENCY,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(name, index, app, directory, durability)
        )


def _started(ray: Any, name: str, nodes: list[str], hosts: list[Any]) -> dict[str, int]:
    """Each host's pools, once all have started; the same for all of them.

    Raises:
        DeploymentError: a host failed to start, or defined other pools.
    """
    found: list[dict[str, int]] = []
    for index, (node, host) in enumerate(zip(nodes, hosts, strict=True)):
        try:
            found.append(ray.get(host.pools.remote(), timeout=START_TIMEOUT))
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            raise DeploymentError(
                name, f"host {index} on node {node} did not start: {_problem(cause)}"
            ) from exc
    first = found[0]
    for index, pools in enumerate(found):
        if pools != first:
            raise DeploymentError(
                name, f"host {index} defines pools {pools!r}, host 0 {first!r}: one app, one set"
            )
    return first


def _problem(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


def _exists(ray: Any, actor: str) -> bool:
    try:
        ray.get_actor(actor, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def _kill(ray: Any, actors: list[Any]) -> None:
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # gone already
            continue
