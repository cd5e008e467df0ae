"""Pools across the nodes of a Ray cluster: ``deploy`` a shard host per node, ``connect``
producers from anywhere in the cluster (docs/deployment.md, "On a Ray cluster").

Ray is dopool's optional ``ray`` extra; it is imported when a deployment is made or
joined, never when this module is.
"""

from __future__ import annotations

from dopool._errors import DeploymentError, HostUnavailableError
from dopool._ray.deploy import Deployment, deploy
from dopool._ray.placement import HostPlace, Placement, PoolPlace
from dopool._ray.producer import RayConnection, RayPool, connect
from dopool._sim.executors import RayUnavailableError

__all__ = [
    "Deployment",
    "DeploymentError",
    "HostPlace",
    "HostUnavailableError",
    "Placement",
    "PoolPlace",
    "RayConnection",
    "RayPool",
    "RayUnavailableError",
    "connect",
    "deploy",
]
