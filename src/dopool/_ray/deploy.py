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
from typing import Any, NamedTuple

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
    resources: Sequence[str] | None = None,
    durability: str = "sync",
) -> Deployment:
    """Start a deployment of ``app`` on the Ray cluster this process is connected to.

    ``store``: the store's directory on each node; ``{node_id}`` and ``{host}`` in it
    are replaced by the node's id and the host's index (several nodes on one machine,
    as in tests, need one directory each). ``nodes``: the node ids to run a host on
    (default: every alive node), each host pinned to its node for good. ``resources``
    instead: a Ray resource per host (``node:<ip>``, which every node has for its
    address, or one given with ``ray start --resources``), each host run on a node that
    has it, and restarted there when such a node joins again after its node left (its
    store's directory then must not name the node's id). ``durability``: the hosts'
    runtimes'.

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
    chosen = _chosen(ray, nodes, resources, store)
    if _exists(ray, record_name(name)):
        raise DeploymentError(name, "one of that name runs already: close it first")
    hosts: list[Any] = []
    made = hosts  # killed again if the deploy fails
    try:
        _start(ray, name, app, chosen, store, durability, hosts)
        pools = _started(ray, name, chosen, hosts)
        found = [ray.get(host.node_id.remote(), timeout=START_TIMEOUT) for host in hosts]
        places = tuple(
            HostPlace(index, node, host_name(name, index)) for index, node in enumerate(found)
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


class _Where(NamedTuple):
    """Where a host runs: pinned to a node by its id, or on a node with a resource."""

    node: str | None
    resource: str | None

    def __str__(self) -> str:
        return f"node {self.node}" if self.node is not None else f"resource {self.resource!r}"


def _chosen(
    ray: Any, nodes: Sequence[str] | None, resources: Sequence[str] | None, store: str
) -> list[_Where]:
    """Where each host runs, checked.

    Raises:
        ConfigurationError: both given, an unknown or repeated node or resource, or a
            store that names the node's id beside resources.
    """
    if resources is not None:
        if nodes is not None:
            raise ConfigurationError("give nodes or resources, not both")
        named = list(resources)
        have = ray.cluster_resources()
        unknown = [r for r in named if not isinstance(r, str) or r not in have]
        if not named or unknown or len(set(named)) != len(named):
            raise ConfigurationError(
                f"no host can run on resources {named!r}: each must be a distinct resource "
                f"some node has (the cluster has {sorted(have)!r})"
            )
        if "{node_id}" in store:
            raise ConfigurationError(
                "a host run by resource may come back on a node of another id: name its "
                "store by {host}, not {node_id}"
            )
        return [_Where(None, resource) for resource in named]
    alive = sorted(node["NodeID"] for node in ray.nodes() if node["Alive"])
    chosen = alive if nodes is None else list(nodes)
    unknown = [node for node in chosen if node not in alive]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        raise ConfigurationError(f"no host can run on nodes {chosen!r} (alive: {alive!r})")
    return [_Where(node, None) for node in chosen]


def _start(
    ray: Any,
    name: str,
    app: str,
    where: list[_Where],
    store: str,
    durability: str,
    hosts: list[Any],
) -> None:
    """Start a host on each node, each appended to ``hosts`` once made."""
    from ray.util.scheduling_strategies import (  # noqa: PLC0415 - the optional extra
        NodeAffinitySchedulingStrategy,
    )

    actor = ray.remote(ShardHost)
    for index, spot in enumerate(where):
        directory = store.replace("{host}", str(index))
        if spot.node is not None:
            directory = directory.replace("{node_id}", spot.node)
            scheduling: dict[str, Any] = {
                "scheduling_strategy": NodeAffinitySchedulingStrategy(spot.node, soft=False)
            }
        else:  # a sliver of it: hosts of several deployments may share a node
            scheduling = {"resources": {spot.resource: 0.001}}
        hosts.append(
            actor.options(
                name=host_name(name, index),
                namespace=NAMESPACE,
                lifetime="detached",
                max_restarts=-1,
                max_task_retries=0,
                max_concurrency=MAX_CONCURRENCY,
                num_cpus=0,
                **scheduling,
            ).remote(name, index, app, directory, durability)
        )


def _started(ray: Any, name: str, where: list[_Where], hosts: list[Any]) -> dict[str, int]:
    """Each host's pools, once all have started; the same for all of them.

    Raises:
        DeploymentError: a host failed to start, or defined other pools.
    """
    found: list[dict[str, int]] = []
    for index, (spot, host) in enumerate(zip(where, hosts, strict=True)):
        try:
            found.append(ray.get(host.pools.remote(), timeout=START_TIMEOUT))
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            raise DeploymentError(
                name, f"host {index} on {spot} did not start: {_problem(cause)}"
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
